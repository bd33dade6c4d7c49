-- Module: shapes
-- Per shape (TraceLens's view): the matmul-class work of a window grouped by the op that owns its kernels and that
-- op's problem shape (op_shapes), with its dtype, the kernels' count and time, FLOP/s and bytes/s, the fraction of
-- the peak of each kernel's own precision, and whether it is compute- or memory-bound (kernel_class: arithmetic
-- intensity against the ridge of its precision). A kernel's shape op is the outermost op with a shape (op_shapes)
-- among the op that launched it and that op's callers — the op that owns its FLOPs when the shape model gave them
-- (kernels.flops_op_id), and the same op when Nsight Compute or --model-flops did. Kernels cut by the window count
-- pro rata; an op's helper kernels (those without FLOPs) count in its time, as they count in its cost; its copies and
-- memsets (cuBLAS workspace) do not. FLOPs spread by --model-flops say nothing of a shape and are left out.
-- Depends: vocab, op_shapes, kernel_launch, window_kernels, kernel_class

-- Each launching op's outermost op with a shape among itself and its callers (also computed level by level, whose
-- joins spill, where the walk is large against DuckDB's memory limit: sql/native.py shape_owners).
CREATE OR REPLACE TEMP TABLE _ks_shaped AS
SELECT o.op_id FROM ops o JOIN op_shapes s
  ON s.name = o.name AND s.input_dims IS NOT DISTINCT FROM o.input_dims
 AND s.input_types IS NOT DISTINCT FROM o.input_types AND s.concrete_inputs IS NOT DISTINCT FROM o.concrete_inputs;
-- native: shape_owners {
CREATE OR REPLACE TEMP TABLE _ks_owner AS
WITH RECURSIVE chain(launch_op, cur, lvl) AS (
    SELECT DISTINCT op_id, op_id, 0 FROM kernel_launch WHERE op_id IS NOT NULL
    UNION ALL
    SELECT c.launch_op, o.parent_op_id, c.lvl + 1 FROM chain c JOIN ops o ON o.op_id = c.cur
    WHERE o.parent_op_id IS NOT NULL AND c.lvl < 64
)
SELECT c.launch_op, arg_max(c.cur, c.lvl) AS op_id FROM chain c JOIN _ks_shaped s ON s.op_id = c.cur GROUP BY c.launch_op;
-- }

CREATE OR REPLACE TABLE kernel_shapes AS
WITH RECURSIVE ks AS MATERIALIZED (
    SELECT l.kernel_id, coalesce(sk.op_id, ow.op_id) AS op_id
    FROM kernel_launch l JOIN kernels kk ON kk.kernel_id = l.kernel_id AND kk.kind = 'compute'
    LEFT JOIN _ks_owner ow ON ow.launch_op = l.op_id
    LEFT JOIN (SELECT k.kernel_id, k.flops_op_id AS op_id FROM kernels k JOIN _ks_shaped s ON s.op_id = k.flops_op_id) sk
      ON sk.kernel_id = l.kernel_id
    WHERE coalesce(sk.op_id, ow.op_id) IS NOT NULL
), ann AS (
    -- annotations (a profiler step, a compiled region, a `## name ##` range) mark where an op ran, they do not call it
    SELECT op_id, parent_op_id FROM ops WHERE is_annotation_op(name)
), up(op_id, cur, lvl) AS (
    -- a shape op's callers, up through annotations
    SELECT o.op_id, o.parent_op_id, 1 FROM (SELECT DISTINCT op_id FROM ks) d JOIN ops o USING (op_id)
    UNION ALL
    SELECT u.op_id, a.parent_op_id, u.lvl + 1 FROM up u JOIN ann a ON a.op_id = u.cur WHERE u.lvl < 64
), caller AS (
    -- the first that is no annotation (none when only annotations are above it): the chain stops there
    SELECT op_id, min(cur) AS caller_op_id FROM up ANTI JOIN ann ON ann.op_id = up.cur WHERE cur IS NOT NULL GROUP BY op_id
)
SELECT ks.kernel_id, ks.op_id, c.caller_op_id FROM ks LEFT JOIN caller c USING (op_id);
DROP TABLE _ks_owner;
DROP TABLE _ks_shaped;
COMMENT ON TABLE kernel_shapes IS 'One row per kernel (copies and memsets aside) that ran for a matmul-class op with a shape: that op';
COMMENT ON COLUMN kernel_shapes.kernel_id IS 'kernels.kernel_id';
COMMENT ON COLUMN kernel_shapes.op_id IS 'its shape op (ops.op_id): the FLOP owner when it has a shape, else the outermost op with a shape among the launching op and its callers';
COMMENT ON COLUMN kernel_shapes.caller_op_id IS 'the op that called its shape op (ops.op_id), annotations passed over (is_annotation_op: profiler steps, compiled regions, `## name ##` ranges); NULL when none';

CREATE OR REPLACE MACRO shape_roofline(scope_, range_name_) AS TABLE
WITH k AS MATERIALIZED (
    SELECT s.family, fo.name AS op, s.shape, s.dtype, s.pass, s.batch, s.m, s.n, s.k, s.heads, s.kv_heads, s.q_len,
           s.kv_len, s.head_dim, s.causal, s.conv_input, s.conv_weight, s.stride, s.padding, s.dilation, s.groups,
           s.transposed, kc.class, kc.peak_precision, kc.bound, kc.peak_flop_s,
           CASE WHEN kk.flops_source IS DISTINCT FROM 'user' THEN kk.flops END AS flops, kk.bytes, wk.share,
           (wk.end_ns - wk.start_ns)::DOUBLE AS ov, fo.op_id, po.name AS parent, kk.name AS kernel,
           -- the operands' transposes as cuBLAS / CUTLASS / nvjet kernel names spell them (_tn, _NTN)
           nullif(regexp_extract(kk.name, '_([NTnt]{2,3})(_align[0-9]+)?($|[>(])', 1), '') AS layout
    FROM window_kernels wk JOIN kernels kk USING (kernel_id) JOIN kernel_class kc USING (kernel_id)
    JOIN kernel_shapes ks USING (kernel_id) JOIN ops fo ON fo.op_id = ks.op_id
    JOIN op_shapes s ON s.name = fo.name AND s.input_dims IS NOT DISTINCT FROM fo.input_dims
                    AND s.input_types IS NOT DISTINCT FROM fo.input_types
                    AND s.concrete_inputs IS NOT DISTINCT FROM fo.concrete_inputs
    LEFT JOIN ops po ON po.op_id = ks.caller_op_id
    WHERE wk.scope = scope_ AND wk.range_name IS NOT DISTINCT FROM range_name_ AND wk.end_ns > wk.start_ns
), tot AS (
    SELECT sum(end_ns - start_ns)::DOUBLE AS all_ns FROM window_kernels
    WHERE scope = scope_ AND range_name IS NOT DISTINCT FROM range_name_ AND end_ns > start_ns
), votes AS (
    -- what a shape's kernels mostly are: each attribute's value with the most time (precision: the most FLOPs),
    -- weights summed in fixed point and ties broken on the value, so every run picks the same
    SELECT family, op, shape, dtype, attr, value, exact_sum(w, {{AMOUNT_FIXED_SCALE}}) AS w FROM (
        SELECT family, op, shape, dtype, 'pass' AS attr, pass AS value, ov AS w FROM k
        UNION ALL SELECT family, op, shape, dtype, 'precision', peak_precision, flops * share FROM k WHERE flops > 0
        -- (the bound of its math: the kernels with its FLOPs; helper kernels, a layout transpose, have no ridge)
        UNION ALL SELECT family, op, shape, dtype, 'bound', bound, ov FROM k WHERE flops > 0
        UNION ALL SELECT family, op, shape, dtype, 'class', class, ov FROM k
        UNION ALL SELECT family, op, shape, dtype, 'layout', layout, ov FROM k WHERE family = 'gemm'
        UNION ALL SELECT family, op, shape, dtype, 'kernel', kernel, ov FROM k
        UNION ALL SELECT family, op, shape, dtype, 'parent', parent, ov FROM k
    ) WHERE value IS NOT NULL GROUP BY ALL
), picks AS (
    SELECT family, op, shape, dtype,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'pass') AS pass,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'precision') AS precision,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'bound') AS bound,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'class') AS class,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'layout') AS layout,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'kernel') AS kernel,
           arg_max(value, (w, value)) FILTER (WHERE attr = 'parent') AS parent_op
    FROM votes GROUP BY ALL
), g AS (
    SELECT family, op, shape, dtype, any_value(batch) AS batch, any_value(m) AS m,
           any_value(n) AS n, any_value(k) AS k, any_value(heads) AS heads, any_value(kv_heads) AS kv_heads,
           any_value(q_len) AS q_len, any_value(kv_len) AS kv_len, any_value(head_dim) AS head_dim,
           any_value(causal) AS causal, any_value(conv_input) AS conv_input, any_value(conv_weight) AS conv_weight,
           any_value(stride) AS stride, any_value(padding) AS padding, any_value(dilation) AS dilation,
           any_value(groups) AS groups, any_value(transposed) AS transposed,
           -- (sums in fixed point, vocab's share_* macros: the same in every run)
           count(*) AS kernels, count(DISTINCT op_id) AS calls, sum(ov) AS time_ns,
           share_flops(flops, share) AS flops, share_bytes(bytes, share) AS bytes,
           share_peak_ns(flops, share, peak_flop_s) AS peak_ns,
           count(DISTINCT kernel) AS kernel_names
    FROM k GROUP BY family, op, shape, dtype
)
SELECT g.family, g.op, g.shape, g.dtype, p.pass, g.batch, g.m, g.n, g.k, g.heads, g.kv_heads, g.q_len, g.kv_len,
       g.head_dim, g.causal, g.conv_input, g.conv_weight, g.stride, g.padding, g.dilation, g.groups, g.transposed,
       p.precision, g.kernels, g.calls, g.time_ns, g.flops, g.bytes, g.peak_ns, p.bound, p.class, p.layout, p.kernel,
       g.kernel_names, p.parent_op, g.time_ns / nullif(tot.all_ns, 0) AS time_share,
       g.flops / (g.time_ns / 1e9) AS achieved_flop_s, g.bytes / (g.time_ns / 1e9) AS achieved_bandwidth_bytes_s,
       g.peak_ns / g.time_ns AS fraction_of_peak, g.flops / g.bytes AS arithmetic_intensity,
       g.time_ns / g.calls AS time_per_call_ns
FROM g JOIN picks p ON p.family = g.family AND p.op = g.op AND p.shape IS NOT DISTINCT FROM g.shape
                    AND p.dtype IS NOT DISTINCT FROM g.dtype, tot
ORDER BY g.time_ns DESC, g.op, g.shape;
COMMENT ON MACRO TABLE shape_roofline IS 'shape_roofline(scope, range_name): one row per (family, op, shape, dtype) over that window — family, op, shape and its fields (op_shapes), pass (of most of its time), precision (of most of its FLOPs), kernels, calls (distinct op calls), time_ns, time_share (of all activity time in the window), flops, bytes, achieved_flop_s, achieved_bandwidth_bytes_s, fraction_of_peak (peak-time equivalent over its time, each kernel at the peak of its own precision), arithmetic_intensity, bound (compute / memory against the ridge of its precision, kernel_class.bound, of the kernels with its FLOPs for most of their time), class (of most of its time), layout (the transposes its GEMM kernel names spell), kernel (the kernel of most of its time), kernel_names, parent_op (the op that called it for most of its time, annotations passed over: kernel_shapes.caller_op_id), time_per_call_ns';
