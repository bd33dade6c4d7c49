-- Module: window_kernels
-- Every GPU activity cut to every analysed window it overlaps: the one place the window scope is applied to
-- kernels (the sweep, the roofline, the verdict's coverage and communication share read it).
-- Depends: windows

CREATE OR REPLACE TABLE window_kernels AS
SELECT w.scope, w.range_name, w.rank, w.device, w.start_ns AS window_start_ns, k.kernel_id,
       greatest(k.start_ns, w.start_ns) AS start_ns, least(k.end_ns, w.end_ns) AS end_ns,
       (least(k.end_ns, w.end_ns) - greatest(k.start_ns, w.start_ns))::DOUBLE / (k.end_ns - k.start_ns) AS share
FROM windows w JOIN kernels k
  ON k.rank IS NOT DISTINCT FROM w.rank AND k.device = w.device AND k.start_ns < w.end_ns AND k.end_ns > w.start_ns
WHERE w.end_ns > w.start_ns AND k.end_ns > k.start_ns;
COMMENT ON TABLE window_kernels IS 'One row per (analysed window, GPU activity overlapping it)';
COMMENT ON COLUMN window_kernels.scope IS 'windows.scope';
COMMENT ON COLUMN window_kernels.range_name IS 'windows.range_name';
COMMENT ON COLUMN window_kernels.rank IS 'the rank';
COMMENT ON COLUMN window_kernels.device IS 'the GPU';
COMMENT ON COLUMN window_kernels.window_start_ns IS 'start of the window interval (windows.start_ns) it falls in';
COMMENT ON COLUMN window_kernels.kernel_id IS 'kernels.kernel_id';
COMMENT ON COLUMN window_kernels.start_ns IS 'the activity''s start, cut to the window';
COMMENT ON COLUMN window_kernels.end_ns IS 'its end, cut to the window';
COMMENT ON COLUMN window_kernels.share IS 'the part of the activity inside the window (its FLOPs and bytes count pro rata)';
