-- Module: losses
-- The loss waterfall's intervals (SPEC §2 `losses`): the stretches that lost peak-time, with their category. A
-- category's share of a window is the sum of its lost_ns over the window's length; with the achieved fraction
-- the shares sum to 1.
-- Depends: stretches, device_peaks

CREATE OR REPLACE VIEW losses AS
SELECT s.scope, s.range_name, s.rank, s.device, s.start_ns, s.end_ns, s.category, s.layer,
       s.lost_ns / 1e9 * hp.peak_flop_s AS lost_flop_seconds, s.lost_ns
FROM stretches s
LEFT JOIN (SELECT * FROM device_peaks WHERE headline) hp ON hp.rank IS NOT DISTINCT FROM s.rank AND hp.device = s.device
WHERE s.category IS NOT NULL AND s.lost_ns > 0;
COMMENT ON VIEW losses IS 'Lost-peak intervals: the stretches that lost peak-time';
COMMENT ON COLUMN losses.scope IS 'windows.scope';
COMMENT ON COLUMN losses.range_name IS 'windows.range_name';
COMMENT ON COLUMN losses.rank IS 'the rank';
COMMENT ON COLUMN losses.device IS 'the GPU';
COMMENT ON COLUMN losses.start_ns IS 'start of the merged stretch';
COMMENT ON COLUMN losses.end_ns IS 'its end';
COMMENT ON COLUMN losses.category IS 'collective_wait, collective_transfer, pipeline_bubble, memory_bound, unknown_flops, compute_inefficiency, memcpy, launch_bound, sync_stall, input_bound, startup, host_other';
COMMENT ON COLUMN losses.layer IS 'cluster, pipeline, op, kernel, host, device';
COMMENT ON COLUMN losses.lost_flop_seconds IS 'the FLOPs not done: lost_ns / 1e9 x the GPU''s headline peak (NULL: no peak)';
COMMENT ON COLUMN losses.lost_ns IS 'peak-time lost in the stretch';
