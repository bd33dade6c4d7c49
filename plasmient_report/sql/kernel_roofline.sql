-- Module: kernel_roofline
-- The kernel roofline, computed once in the window scope: kernels grouped by name (or by op: the op that owns
-- the kernel's FLOPs, else the op that launched it) over an analysed window, kernels cut by the window counted
-- pro rata, with FLOPs, bytes, arithmetic intensity, achieved FLOP/s and bandwidth, the peak-time-equivalent
-- fraction of peak (each kernel against the peak of its own precision) and the group's class (the class its
-- time was spent in most). Bandwidth above the HBM peak is flagged, never taken as fact.
-- Depends: vocab, window_kernels, kernel_class

CREATE OR REPLACE MACRO kernel_roofline(scope_, range_name_, by_) AS TABLE
WITH k AS (
    SELECT CASE WHEN by_ = 'op' THEN coalesce(fo.name, lo.name, '(no op)') ELSE k.name END AS key,
           kc.class, k.kind, k.flops, k.bytes, wk.share, (wk.end_ns - wk.start_ns)::DOUBLE AS ov,
           coalesce(k.flops_op_id, k.op_id) AS op, kc.peak_flop_s, kc.bandwidth_bytes_s, kc.ridge_flop_per_byte
    FROM window_kernels wk JOIN kernels k USING (kernel_id) JOIN kernel_class kc USING (kernel_id)
    -- (the ops' names only when grouping by op: by kernel name the join would still build a hash table of every op,
    -- +400 MiB over a 2 GiB trace's ops)
    LEFT JOIN (SELECT op_id, name FROM ops WHERE by_ = 'op') fo ON fo.op_id = k.flops_op_id
    LEFT JOIN (SELECT op_id, name FROM ops WHERE by_ = 'op') lo ON lo.op_id = k.op_id
    WHERE wk.scope = scope_ AND wk.range_name IS NOT DISTINCT FROM range_name_ AND wk.end_ns > wk.start_ns
), cls AS (
    -- the class (and the kind) the group's time was spent in most
    SELECT key, arg_max(class, (ns, class)) AS class FROM (SELECT key, class, sum(ov) AS ns FROM k GROUP BY key, class) GROUP BY key
), knd AS (
    SELECT key, arg_max(kind, (ns, kind)) AS kind FROM (SELECT key, kind, sum(ov) AS ns FROM k GROUP BY key, kind) GROUP BY key
), g0 AS (
    SELECT key AS name, count(*) AS count,
           -- (FLOPs, bytes and peak time in fixed point, vocab's share_* macros: the same to the last digit in
           -- every run; the times are whole ns already)
           sum(ov) AS time_ns,
           share_flops(flops, share) AS flops, share_peak_ns(flops, share, peak_flop_s) AS peak_ns,
           exact_sum(CASE WHEN flops > 0 AND bytes > 0 THEN flops * share END, {{AMOUNT_FIXED_SCALE}})
               / exact_sum(CASE WHEN flops > 0 AND bytes > 0 THEN bytes * share END, {{AMOUNT_FIXED_SCALE}})
               AS arithmetic_intensity,
           share_bytes(bytes, share) AS bytes,
           sum(ov) FILTER (WHERE bytes > 0) AS time_with_bytes_ns,
           max(bandwidth_bytes_s) AS hbm_bytes_s, max(ridge_flop_per_byte) AS ridge_flop_per_byte,
           count(DISTINCT op) AS calls
    FROM k GROUP BY key
), g AS (
    SELECT g0.*, cls.class, knd.kind FROM g0 JOIN cls ON cls.key IS NOT DISTINCT FROM g0.name
    JOIN knd ON knd.key IS NOT DISTINCT FROM g0.name
)
SELECT name, class, kind, count, time_ns, time_ns / sum(time_ns) OVER () AS time_share, flops, bytes,
       flops / (time_ns / 1e9) AS achieved_flop_s, peak_ns / time_ns AS achieved_fraction_of_peak,
       arithmetic_intensity, ridge_flop_per_byte,
       CASE WHEN class IN ('compute', 'memory') AND arithmetic_intensity IS NOT NULL AND ridge_flop_per_byte IS NOT NULL
            THEN CASE WHEN arithmetic_intensity < ridge_flop_per_byte THEN 'memory' ELSE 'compute' END
            ELSE class END AS bound,
       bytes / (time_with_bytes_ns / 1e9) AS achieved_bandwidth_bytes_s,
       bytes / (time_with_bytes_ns / 1e9) / hbm_bytes_s AS bandwidth_fraction_of_hbm,
       coalesce(bytes / (time_with_bytes_ns / 1e9) > hbm_bytes_s, false) AS bandwidth_above_hbm_peak,
       calls
FROM g ORDER BY time_ns DESC, name;
COMMENT ON MACRO TABLE kernel_roofline IS 'kernel_roofline(scope, range_name, ''kernel'' | ''op''): one row per kernel name (or op) over that window — name, class, kind, count, time_ns, time_share, flops, bytes, achieved_flop_s, achieved_fraction_of_peak (peak-time equivalent over its time), arithmetic_intensity, ridge_flop_per_byte, bound (compute / memory against the ridge, else the class), achieved_bandwidth_bytes_s, bandwidth_fraction_of_hbm, bandwidth_above_hbm_peak, calls (distinct ops)';
