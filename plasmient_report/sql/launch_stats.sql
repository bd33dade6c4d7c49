-- Module: launch_stats
-- How each stream's kernels were launched, per analysed window: the launch delay (the launching call's start, from
-- kernel_launch, to the kernel's start: small when the GPU waits for the host, large when the host runs ahead of a
-- busy GPU), the CPU cost of a launch (the launching call's duration, once per call: one graph launch starts many
-- kernels) and the kernels' durations — as p50 / p99 / max, and as a histogram of durations in log2 buckets from
-- 1 µs (the evidence of launch-bound streams: many kernels shorter than a launch). Every GPU activity but copies
-- counts (kernels and memsets, communication included), each once per window it overlaps; a kernel whose launch the
-- trace does not hold has no delay.
-- Depends: kernel_launch, window_kernels

CREATE OR REPLACE MACRO duration_bucket(dur_ns) AS
    CASE WHEN dur_ns < {{HISTOGRAM_BASE_NS}} THEN 0
         ELSE least({{HISTOGRAM_BUCKETS}} - 1, floor(log2(dur_ns / {{HISTOGRAM_BASE_NS}}))::INTEGER + 1) END;
COMMENT ON MACRO duration_bucket IS 'duration_bucket(dur_ns): the histogram bucket of a duration — 0 under 1 µs, b ≥ 1 for [2^(b-1), 2^b) µs, the last one open-ended';

-- Each GPU activity but copies, once per window it overlaps, with its launch (what both forms below read).
CREATE OR REPLACE TEMP VIEW _ls_kernels AS
SELECT k.scope, k.range_name, k.rank, k.device, kr.stream, kr.end_ns - kr.start_ns AS dur_ns,
       kl.launch_thread, kl.launch_start_ns, kl.launch_end_ns, kl.launch_name,
       kr.start_ns - kl.launch_start_ns AS delay_ns
FROM (SELECT DISTINCT scope, range_name, rank, device, kernel_id FROM window_kernels) k
JOIN kernels kr USING (kernel_id) LEFT JOIN kernel_launch kl USING (kernel_id)
WHERE kr.kind IS DISTINCT FROM 'memcpy';

-- The p50 and p99 of each figure come from one quantile state (its values, held until the group ends: DuckDB
-- cannot spill them). Where the run's kernels are many against DuckDB's memory limit, the same table is computed
-- from sorted values instead, which spill (sql/native.py launch_stats).
-- native: launch_stats {
CREATE OR REPLACE TABLE launch_stats AS
WITH a AS (
    SELECT * FROM _ls_kernels
), calls AS (
    SELECT DISTINCT scope, range_name, rank, device, stream, launch_thread, launch_start_ns, launch_end_ns
    FROM a WHERE launch_start_ns IS NOT NULL
), cost AS (
    SELECT scope, range_name, rank, device, stream, count(*) AS launch_calls,
           quantile_disc(launch_end_ns - launch_start_ns, [0.5, 0.99]) AS launch_cost_q,
           max(launch_end_ns - launch_start_ns) AS launch_cost_max_ns,
           sum(launch_end_ns - launch_start_ns) AS launch_cost_ns
    FROM calls GROUP BY ALL
), s AS (
    SELECT a.scope, a.range_name, a.rank, a.device, a.stream, count(*) AS kernels, count(a.delay_ns) AS launched,
           count(*) FILTER (WHERE regexp_matches(coalesce(a.launch_name, ''), {{GRAPH_LAUNCH_API_RE}})) AS graph_kernels,
           any_value(c.launch_calls) AS launch_calls,
           quantile_disc(a.delay_ns, [0.5, 0.99]) AS launch_delay_q, max(a.delay_ns) AS launch_delay_max_ns,
           any_value(c.launch_cost_q) AS launch_cost_q,
           any_value(c.launch_cost_max_ns) AS launch_cost_max_ns, any_value(c.launch_cost_ns) AS launch_cost_ns,
           quantile_disc(a.dur_ns, [0.5, 0.99]) AS kernel_q, max(a.dur_ns) AS kernel_max_ns, sum(a.dur_ns) AS kernel_ns
    FROM a LEFT JOIN cost c
      ON c.scope = a.scope AND c.range_name IS NOT DISTINCT FROM a.range_name AND c.rank IS NOT DISTINCT FROM a.rank
     AND c.device = a.device AND c.stream IS NOT DISTINCT FROM a.stream
    GROUP BY a.scope, a.range_name, a.rank, a.device, a.stream
)
SELECT scope, range_name, rank, device, stream, kernels, launched, graph_kernels, launch_calls,
       launch_delay_q[1] AS launch_delay_p50_ns, launch_delay_q[2] AS launch_delay_p99_ns, launch_delay_max_ns,
       launch_cost_q[1] AS launch_cost_p50_ns, launch_cost_q[2] AS launch_cost_p99_ns, launch_cost_max_ns,
       launch_cost_ns, kernel_q[1] AS kernel_p50_ns, kernel_q[2] AS kernel_p99_ns, kernel_max_ns, kernel_ns
FROM s;
-- }
DROP VIEW _ls_kernels;
COMMENT ON TABLE launch_stats IS 'Per analysed window and stream: launch delay, CPU launch cost and kernel durations (p50 / p99 / max)';
COMMENT ON COLUMN launch_stats.scope IS 'windows.scope';
COMMENT ON COLUMN launch_stats.range_name IS 'windows.range_name';
COMMENT ON COLUMN launch_stats.rank IS 'the rank';
COMMENT ON COLUMN launch_stats.device IS 'the GPU';
COMMENT ON COLUMN launch_stats.stream IS 'the stream';
COMMENT ON COLUMN launch_stats.kernels IS 'GPU activities on it (kernels and memsets; copies aside) overlapping the window';
COMMENT ON COLUMN launch_stats.launched IS 'those whose launching call is in the trace';
COMMENT ON COLUMN launch_stats.graph_kernels IS 'those launched by a CUDA graph launch';
COMMENT ON COLUMN launch_stats.launch_calls IS 'distinct launching calls (a graph launch once)';
COMMENT ON COLUMN launch_stats.launch_delay_p50_ns IS 'median launch delay: the launching call''s start to the kernel''s start';
COMMENT ON COLUMN launch_stats.launch_delay_p99_ns IS '99th percentile launch delay';
COMMENT ON COLUMN launch_stats.launch_delay_max_ns IS 'longest launch delay';
COMMENT ON COLUMN launch_stats.launch_cost_p50_ns IS 'median CPU cost of a launch: the launching call''s duration';
COMMENT ON COLUMN launch_stats.launch_cost_p99_ns IS '99th percentile launch cost';
COMMENT ON COLUMN launch_stats.launch_cost_max_ns IS 'longest launching call';
COMMENT ON COLUMN launch_stats.launch_cost_ns IS 'host time in launching calls, summed';
COMMENT ON COLUMN launch_stats.kernel_p50_ns IS 'median kernel duration';
COMMENT ON COLUMN launch_stats.kernel_p99_ns IS '99th percentile kernel duration';
COMMENT ON COLUMN launch_stats.kernel_max_ns IS 'longest kernel';
COMMENT ON COLUMN launch_stats.kernel_ns IS 'kernel time, summed';

CREATE OR REPLACE TABLE kernel_duration_histogram AS
WITH k AS (
    SELECT DISTINCT scope, range_name, rank, device, kernel_id FROM window_kernels
)
SELECT k.scope, k.range_name, k.rank, k.device, kr.stream, duration_bucket(kr.end_ns - kr.start_ns) AS bucket,
       count(*) AS kernels, sum(kr.end_ns - kr.start_ns) AS time_ns
FROM k JOIN kernels kr USING (kernel_id)
WHERE kr.kind IS DISTINCT FROM 'memcpy'
GROUP BY ALL;
COMMENT ON TABLE kernel_duration_histogram IS 'Per analysed window, stream and duration bucket: how many kernels, and their time (the short-kernel histogram)';
COMMENT ON COLUMN kernel_duration_histogram.scope IS 'windows.scope';
COMMENT ON COLUMN kernel_duration_histogram.range_name IS 'windows.range_name';
COMMENT ON COLUMN kernel_duration_histogram.rank IS 'the rank';
COMMENT ON COLUMN kernel_duration_histogram.device IS 'the GPU';
COMMENT ON COLUMN kernel_duration_histogram.stream IS 'the stream';
COMMENT ON COLUMN kernel_duration_histogram.bucket IS 'duration_bucket: 0 under 1 µs, b for [2^(b-1), 2^b) µs';
COMMENT ON COLUMN kernel_duration_histogram.kernels IS 'kernels in the bucket';
COMMENT ON COLUMN kernel_duration_histogram.time_ns IS 'their time';
