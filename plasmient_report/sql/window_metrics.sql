-- Module: window_metrics
-- The numbers per analysed window and GPU, and per window for the run (the GPUs combined), into the store's
-- `metrics`, with the achieved fraction broken down by precision in `metrics_by_precision`. Utilization is the
-- share of the window with a kernel or copy resident; the achieved fraction is the peak-time equivalent
-- sum over kernels of FLOPs / P(precision), capped stretch by stretch at the peak, over the window. Coverage:
-- compute time (classes compute, memory, unknown) with a FLOP estimate, and the unknown part of it; the
-- communication share is of all activity time in the window.
-- Depends: vocab, stretches, window_kernels, kernel_class, device_peaks

DELETE FROM metrics;
CREATE OR REPLACE TEMP TABLE _wm_k AS
SELECT wk.scope, wk.range_name, wk.rank, wk.device, kc.peak_precision, any_value(kc.peak_flop_s) AS p_flop_s,
       sum(wk.end_ns - wk.start_ns) FILTER (WHERE kc.class IN ('compute', 'memory', 'unknown')) AS kernel_ns,
       sum(wk.end_ns - wk.start_ns) FILTER (WHERE kc.class IN ('compute', 'memory', 'unknown') AND k.flops > 0)
           AS kernel_ns_with_flops,
       sum(wk.end_ns - wk.start_ns) FILTER (WHERE kc.class = 'unknown') AS unknown_ns,
       sum(wk.end_ns - wk.start_ns) FILTER (WHERE kc.class = 'communication') AS communication_ns,
       sum(wk.end_ns - wk.start_ns) AS activity_ns,
       exact_sum(CASE WHEN kc.class IN ('compute', 'memory') AND k.flops > 0 AND kc.peak_flop_s > 0
                      THEN k.flops * wk.share END, 1.0) AS flops,
       exact_sum(CASE WHEN kc.class IN ('compute', 'memory') AND k.flops > 0 AND kc.peak_flop_s > 0
                      THEN k.flops * wk.share / kc.peak_flop_s * 1e9 END, {{NS_FIXED_SCALE}}) AS peak_ns
FROM window_kernels wk JOIN kernel_class kc USING (kernel_id) JOIN kernels k USING (kernel_id)
GROUP BY ALL;
CREATE OR REPLACE TEMP TABLE _wm_gpu AS
WITH w AS (
    SELECT scope, range_name, rank, device, sum(end_ns - start_ns) AS window_ns, sum(occurrences) AS occurrences
    FROM windows WHERE end_ns > start_ns GROUP BY ALL
), s AS (
    SELECT scope, range_name, rank, device, sum(end_ns - start_ns) FILTER (WHERE busy) AS busy_ns,
           exact_sum(achieved_ns, {{NS_FIXED_SCALE}}) AS achieved_ns, sum(capped_ns) AS capped_ns,
           exact_sum(uncapped_ns, {{NS_FIXED_SCALE}}) AS uncapped_ns,
           sum(end_ns - start_ns) FILTER (WHERE category IS NULL) AS unmeasured_ns
    FROM stretches GROUP BY ALL
), k AS (
    SELECT scope, range_name, rank, device, sum(kernel_ns) AS kernel_ns, sum(kernel_ns_with_flops) AS kernel_ns_with_flops,
           sum(unknown_ns) AS unknown_ns, sum(communication_ns) AS communication_ns, sum(activity_ns) AS activity_ns,
           exact_sum(flops, 1.0) AS flops
    FROM _wm_k GROUP BY ALL
)
SELECT w.scope, w.range_name, w.rank, w.device, w.window_ns, w.occurrences, coalesce(s.busy_ns, 0) AS busy_ns, coalesce(s.achieved_ns, 0) AS achieved_ns,
       coalesce(s.capped_ns, 0) AS capped_ns, coalesce(s.unmeasured_ns, 0) AS unmeasured_ns,
       -- capping scales every kernel's contribution alike: the FLOPs done, and each precision's share
       CASE WHEN s.uncapped_ns > 0 THEN least(s.achieved_ns / s.uncapped_ns, 1.0) ELSE 1.0 END AS scale,
       coalesce(k.kernel_ns, 0) AS kernel_ns, coalesce(k.kernel_ns_with_flops, 0) AS kernel_ns_with_flops,
       coalesce(k.unknown_ns, 0) AS unknown_ns, coalesce(k.communication_ns, 0) AS communication_ns,
       coalesce(k.activity_ns, 0) AS activity_ns, k.flops AS flops_uncapped, hp.peak_flop_s
FROM w
LEFT JOIN s ON s.scope = w.scope AND s.range_name IS NOT DISTINCT FROM w.range_name
           AND s.rank IS NOT DISTINCT FROM w.rank AND s.device = w.device
LEFT JOIN k ON k.scope = w.scope AND k.range_name IS NOT DISTINCT FROM w.range_name
           AND k.rank IS NOT DISTINCT FROM w.rank AND k.device = w.device
LEFT JOIN (SELECT * FROM device_peaks WHERE headline) hp ON hp.rank IS NOT DISTINCT FROM w.rank AND hp.device = w.device;
INSERT INTO metrics (scope, range_name, rank, device, window_ns, occurrences, busy_ns, utilization, flops,
                     achieved_flop_s, achieved_fraction_of_peak, capped_ns, kernel_ns, kernel_ns_with_flops,
                     peak_flop_s, achieved_ns, unknown_ns, unmeasured_ns, communication_ns, activity_ns)
SELECT scope, range_name, rank, device, window_ns, occurrences, busy_ns, busy_ns / window_ns,
       coalesce(flops_uncapped, 0) * scale, coalesce(flops_uncapped, 0) * scale / (window_ns / 1e9),
       CASE WHEN peak_flop_s IS NOT NULL THEN achieved_ns / window_ns END, capped_ns, kernel_ns, kernel_ns_with_flops,
       peak_flop_s, achieved_ns, unknown_ns, unmeasured_ns, communication_ns, activity_ns
FROM _wm_gpu;
-- Run level: the GPUs' windows combined (a window-weighted mean of the per-GPU fractions).
INSERT INTO metrics (scope, range_name, rank, device, window_ns, occurrences, busy_ns, utilization, flops,
                     achieved_flop_s, achieved_fraction_of_peak, capped_ns, kernel_ns, kernel_ns_with_flops,
                     peak_flop_s, achieved_ns, unknown_ns, unmeasured_ns, communication_ns, activity_ns)
SELECT scope, range_name, NULL, NULL, sum(window_ns), sum(occurrences), sum(busy_ns), sum(busy_ns) / sum(window_ns),
       exact_sum(flops, 1.0), exact_sum(flops, 1.0) / (sum(window_ns) / 1e9),
       CASE WHEN bool_and(peak_flop_s IS NOT NULL) THEN exact_sum(achieved_ns, {{NS_FIXED_SCALE}}) / sum(window_ns) END,
       sum(capped_ns), sum(kernel_ns), sum(kernel_ns_with_flops),
       CASE WHEN bool_and(peak_flop_s IS NOT NULL) THEN exact_sum(window_ns * peak_flop_s, 1.0) / sum(window_ns) END,
       exact_sum(achieved_ns, {{NS_FIXED_SCALE}}), sum(unknown_ns), sum(unmeasured_ns), sum(communication_ns),
       sum(activity_ns)
FROM metrics WHERE rank IS NOT NULL OR device IS NOT NULL GROUP BY scope, range_name;

CREATE OR REPLACE TABLE metrics_by_precision AS
WITH g AS (
    SELECT k.scope, k.range_name, k.rank, k.device, k.peak_precision AS precision, k.flops * m.scale AS flops,
           k.p_flop_s AS peak_flop_s, k.peak_ns * m.scale / m.window_ns AS achieved_fraction_of_peak, m.window_ns
    FROM _wm_k k JOIN _wm_gpu m ON m.scope = k.scope AND m.range_name IS NOT DISTINCT FROM k.range_name
                               AND m.rank IS NOT DISTINCT FROM k.rank AND m.device = k.device
    WHERE k.flops > 0 AND m.peak_flop_s IS NOT NULL
), tot AS (
    SELECT scope, range_name, sum(window_ns) AS window_ns, bool_and(peak_flop_s IS NOT NULL) AS all_peaks
    FROM _wm_gpu GROUP BY ALL
)
SELECT scope, range_name, rank, device, precision, flops, peak_flop_s, achieved_fraction_of_peak FROM g
UNION ALL
SELECT g.scope, g.range_name, NULL, NULL, g.precision, exact_sum(g.flops, 1.0),
       exact_sum(g.window_ns * g.peak_flop_s, 1.0) / sum(g.window_ns),
       exact_sum(g.achieved_fraction_of_peak * g.window_ns, {{NS_FIXED_SCALE}}) / any_value(t.window_ns)
FROM g JOIN tot t ON t.scope = g.scope AND t.range_name IS NOT DISTINCT FROM g.range_name
WHERE t.all_peaks GROUP BY g.scope, g.range_name, g.precision;
DROP TABLE _wm_k;
DROP TABLE _wm_gpu;
COMMENT ON TABLE metrics_by_precision IS 'The achieved fraction per analysed window and GPU (and run level: rank and device NULL) broken down by the precision of the peak each kernel is measured against; the fractions of a window sum to its achieved_fraction_of_peak';
COMMENT ON COLUMN metrics_by_precision.scope IS 'windows.scope';
COMMENT ON COLUMN metrics_by_precision.range_name IS 'windows.range_name';
COMMENT ON COLUMN metrics_by_precision.rank IS 'the rank (NULL: run level)';
COMMENT ON COLUMN metrics_by_precision.device IS 'the GPU (NULL: run level)';
COMMENT ON COLUMN metrics_by_precision.precision IS 'kernel_class.peak_precision';
COMMENT ON COLUMN metrics_by_precision.flops IS 'FLOPs done at that precision in the window (capping applied)';
COMMENT ON COLUMN metrics_by_precision.peak_flop_s IS 'P(precision) (run level: window-weighted over the GPUs)';
COMMENT ON COLUMN metrics_by_precision.achieved_fraction_of_peak IS 'the peak-time equivalent of those FLOPs over the window: FLOPs / P(precision) / window';
