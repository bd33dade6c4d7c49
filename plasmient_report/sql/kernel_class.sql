-- Module: kernel_class
-- One class per GPU activity, decided here and nowhere else (the sweep, the rules, the verdict and every renderer
-- read it): `compute` (a FLOP estimate at or above the ridge point P(precision) / bandwidth of its GPU), `memory`
-- (a FLOP estimate below the ridge, or known to do ~0 useful FLOPs: the helper kernels of an op whose FLOPs other
-- kernels carry, Inductor pointwise / reduction kernels, PyTorch / cub / thrust elementwise, norm, reduction, copy
-- and optimizer kernels, kernels of known non-matmul ops), `unknown` (may do matmul-class work and nothing
-- estimates it: GEMM / attention / convolution / grouped-GEMM kernels without an estimate, kernels of matmul ops
-- without shapes, custom and compiled kernels; also FLOPs at a precision the GPU has no peak figure for),
-- `communication` and `copy`. Each kernel is measured against the peak of its own precision: the dtype of the
-- op that launched it (the innermost: under autocast the outer op still sees fp32; fp32 with a TF32 kernel is
-- tf32), else its FLOP owner's, else the kernel name's hint, else the run's headline precision.
-- Depends: vocab, device_peaks, collectives

CREATE OR REPLACE TABLE kernel_class AS
WITH hp AS (
    SELECT rank, device, precision AS headline_precision, peak_flop_s AS headline_peak FROM device_peaks WHERE headline
), np AS (
    SELECT name, kernel_name_precision(name) AS name_precision FROM (SELECT DISTINCT name FROM kernels)
), k AS (
    SELECT k.kernel_id, k.rank, k.device, k.kind, k.name, k.flops, k.bytes, k.flops_source, k.flops_op_id,
           greatest(k.end_ns - k.start_ns, 0) AS dur_ns, coalesce(lo.precision, fo.precision) AS op_precision,
           lo.name AS op_name,
           np.name_precision, hp.headline_precision, hp.headline_peak,
           ck.kind AS comm_kind, cw.wait_ns AS member_wait_ns
    FROM kernels k
    LEFT JOIN np ON np.name IS NOT DISTINCT FROM k.name
    -- (only the ops that launched or own a kernel: a hash table of every op held 1.6 GB for the 4 GiB Kineto
    -- trace's 4.1 M ops, where these hold 0.5 GB, and DuckDB ran out of its memory limit there)
    LEFT JOIN (SELECT op_id, precision FROM ops WHERE op_id IN (SELECT flops_op_id FROM kernels)) fo
           ON fo.op_id = k.flops_op_id
    LEFT JOIN (SELECT op_id, precision, name FROM ops WHERE op_id IN (SELECT op_id FROM kernels)) lo
           ON lo.op_id = k.op_id
    LEFT JOIN hp ON hp.rank IS NOT DISTINCT FROM k.rank AND hp.device = k.device
    LEFT JOIN comm_kernels ck USING (kernel_id)
    LEFT JOIN (SELECT kernel_id, max(wait_ns) AS wait_ns FROM collective_members GROUP BY kernel_id) cw USING (kernel_id)
), p AS (
    SELECT k.*,
           CASE WHEN k.op_precision = 'fp32' AND k.name_precision = 'tf32' THEN 'tf32'
                WHEN k.op_precision IS NOT NULL THEN k.op_precision
                ELSE coalesce(k.name_precision, k.headline_precision) END AS precision,
           CASE WHEN k.op_precision = 'fp32' AND k.name_precision = 'tf32' THEN 'op+name'
                WHEN k.op_precision IS NOT NULL THEN 'op'
                WHEN k.name_precision IS NOT NULL THEN 'name'
                ELSE 'headline' END AS precision_source
    FROM k
), nm AS (
    -- the patterns, matched once per distinct (kind, kernel name, op name): a long trace repeats a few thousand
    SELECT kind, name, op_name, kind IN ('memcpy', 'memset') AS is_copy, is_communication_kernel(kind, name) AS is_comm,
           regexp_matches(name, {{COMPILED_NO_MATMUL_KERNEL_RE}}) AS is_compiled_known,
           regexp_matches(name, {{AUX_ATTENTION_KERNEL_RE}}) AS is_aux,
           is_matmul_class_kernel(name) AS is_matmul_name,
           regexp_matches(name, {{KNOWN_NO_MATMUL_KERNEL_RE}}) OR regexp_matches(name, {{NO_MATMUL_KERNEL_RE}})
               AS is_known_name,
           coalesce(regexp_matches(op_name, {{MATMUL_CLASS_OP_RE}}), false) AS is_matmul_op,
           coalesce(regexp_matches(op_name, {{KNOWN_OP_RE}}), false) AS is_known_op
    FROM (SELECT DISTINCT kind, name, op_name FROM p)
), j AS (
    SELECT p.*, dp.peak_precision, dp.peak_flop_s, dp.bandwidth_bytes_s,
           dp.peak_flop_s / nullif(dp.bandwidth_bytes_s, 0) AS ridge,
           CASE WHEN p.flops > 0 AND p.bytes > 0 THEN p.flops / p.bytes END AS ai,
           nm.is_copy, nm.is_comm, nm.is_compiled_known, nm.is_aux, nm.is_matmul_name, nm.is_known_name,
           nm.is_matmul_op, nm.is_known_op
    FROM p JOIN nm ON nm.kind IS NOT DISTINCT FROM p.kind AND nm.name IS NOT DISTINCT FROM p.name
                  AND nm.op_name IS NOT DISTINCT FROM p.op_name
    LEFT JOIN device_peaks dp
      ON dp.rank IS NOT DISTINCT FROM p.rank AND dp.device = p.device AND dp.precision = p.precision
), c AS (
    SELECT j.*,
        CASE
            WHEN is_copy THEN 'copy'
            WHEN is_comm THEN 'communication'
            WHEN flops > 0 AND peak_flop_s IS NULL AND headline_peak IS NOT NULL THEN 'unknown'
            WHEN flops > 0 AND flops_source = 'user' THEN 'compute'
            WHEN flops > 0 THEN CASE WHEN ai IS NOT NULL AND ridge IS NOT NULL AND ai < ridge THEN 'memory'
                                     ELSE 'compute' END
            WHEN flops_op_id IS NOT NULL OR is_compiled_known OR is_aux THEN 'memory'
            WHEN is_matmul_name THEN 'unknown'
            WHEN is_known_name THEN 'memory'
            WHEN is_matmul_op THEN 'unknown'
            WHEN is_known_op THEN 'memory'
            ELSE 'unknown' END AS class,
        CASE
            WHEN is_copy THEN 'copy'
            WHEN is_comm THEN 'communication'
            WHEN flops > 0 AND peak_flop_s IS NULL AND headline_peak IS NOT NULL THEN 'no peak for its precision'
            WHEN flops > 0 AND flops_source = 'user' THEN '--model-flops'
            WHEN flops > 0 AND ai IS NOT NULL AND ridge IS NOT NULL THEN
                CASE WHEN ai < ridge THEN 'below the ridge point' ELSE 'at or above the ridge point' END
            WHEN flops > 0 THEN 'FLOP estimate' || CASE WHEN ridge IS NULL THEN ', no ridge point' ELSE ', no bytes' END
            WHEN flops_op_id IS NOT NULL THEN 'helper kernel of an op whose FLOPs its other kernels carry'
            WHEN is_compiled_known THEN 'compiled pointwise / reduction kernel'
            WHEN is_aux THEN 'attention helper kernel'
            WHEN is_matmul_name THEN 'matmul-class kernel without an estimate'
            WHEN is_known_name THEN 'library kernel with no matmul work'
            WHEN is_matmul_op THEN 'matmul op without shapes'
            WHEN is_known_op THEN 'kernel of a non-matmul op'
            ELSE 'custom or compiled kernel without an estimate' END AS reason
    FROM j
)
SELECT kernel_id, rank, device, class, reason, precision, precision_source, peak_precision, peak_flop_s,
       bandwidth_bytes_s, ridge AS ridge_flop_per_byte, ai AS arithmetic_intensity,
       CASE WHEN class IN ('compute', 'memory') AND flops > 0 AND dur_ns > 0 AND peak_flop_s > 0
            THEN flops / dur_ns / (peak_flop_s / 1e9) END AS fraction_of_peak,
       CASE WHEN class = 'compute' AND flops_source IS DISTINCT FROM 'user'
                 AND ai IS NOT NULL AND ridge IS NOT NULL THEN 'compute'
            WHEN class = 'memory' THEN 'memory' END AS bound,
       CASE WHEN bytes > 0 AND dur_ns > 0 THEN bytes / (dur_ns / 1e9) END AS bandwidth_bytes_per_s,
       CASE WHEN bytes > 0 AND dur_ns > 0 AND bandwidth_bytes_s > 0 THEN bytes / (dur_ns / 1e9) > bandwidth_bytes_s
            END AS above_hbm_peak,
       CASE WHEN class = 'communication' THEN coalesce(comm_kind, 'collective') END AS comm_kind,
       class = 'communication' AND comm_kind = 'p2p' AND (SELECT found FROM pipeline_schedule) AS pipeline,
       CASE WHEN class = 'communication' THEN least(coalesce(member_wait_ns, 0), dur_ns) ELSE 0 END AS wait_ns
FROM c;
COMMENT ON TABLE kernel_class IS 'One row per GPU activity: its class, precision and peak, and where it sits on the roofline';
COMMENT ON COLUMN kernel_class.kernel_id IS 'kernels.kernel_id';
COMMENT ON COLUMN kernel_class.rank IS 'the rank';
COMMENT ON COLUMN kernel_class.device IS 'the GPU';
COMMENT ON COLUMN kernel_class.class IS 'compute, memory, unknown, communication or copy';
COMMENT ON COLUMN kernel_class.reason IS 'why it has that class, in words';
COMMENT ON COLUMN kernel_class.precision IS 'its precision: the op''s dtype (fp32 on a TF32 kernel: tf32), else the kernel name''s hint, else the run''s headline precision';
COMMENT ON COLUMN kernel_class.precision_source IS 'op, op+name, name or headline (also for --model-flops: each kernel at its own precision)';
COMMENT ON COLUMN kernel_class.peak_precision IS 'the precision whose peak it is measured against (device_peaks.peak_precision)';
COMMENT ON COLUMN kernel_class.peak_flop_s IS 'P(precision) of its GPU, FLOP/s (NULL: no figure)';
COMMENT ON COLUMN kernel_class.bandwidth_bytes_s IS 'HBM bandwidth of its GPU, bytes/s';
COMMENT ON COLUMN kernel_class.ridge_flop_per_byte IS 'the ridge point P(precision) / bandwidth, FLOP per byte';
COMMENT ON COLUMN kernel_class.arithmetic_intensity IS 'FLOPs / bytes (both estimated), when it has both';
COMMENT ON COLUMN kernel_class.fraction_of_peak IS 'its FLOP rate over P(precision) while it runs (may exceed 1: an estimate or the peak is wrong; the sweep caps it)';
COMMENT ON COLUMN kernel_class.bound IS 'compute or memory against the ridge point (NULL when that cannot be said)';
COMMENT ON COLUMN kernel_class.bandwidth_bytes_per_s IS 'its estimated bytes over its duration';
COMMENT ON COLUMN kernel_class.above_hbm_peak IS 'true when that bandwidth exceeds the GPU''s HBM peak: L2-resident reuse or a byte model that over-counts, never a fact';
COMMENT ON COLUMN kernel_class.comm_kind IS 'communication kernels: all_to_all, p2p or collective';
COMMENT ON COLUMN kernel_class.pipeline IS 'true for P2P kernels of a pipeline schedule (pipeline_schedule.found): their time is pipeline_bubble';
COMMENT ON COLUMN kernel_class.wait_ns IS 'communication kernels: the part spent waiting for peers (collective_members.wait_ns), from its start';
