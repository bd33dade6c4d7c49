-- Module: vocab
-- Macros generated from plasmient_report/vocab.py, the one home of the name patterns: a kernel name's precision,
-- a dtype's precision, a category's layer, and what a communication kernel is.

CREATE OR REPLACE MACRO kernel_name_precision(n) AS CASE {{PRECISION_HINT_CASES}} END;
COMMENT ON MACRO kernel_name_precision IS 'kernel_name_precision(name): the precision a kernel name gives away (vocab.PRECISION_HINTS, first match), else NULL';
CREATE OR REPLACE MACRO dtype_precision(t) AS CASE lower(t) {{DTYPE_PRECISION_CASES}} END;
COMMENT ON MACRO dtype_precision IS 'dtype_precision(type): the precision of a dtype as traces spell it (vocab.DTYPE_PRECISION), else NULL';
CREATE OR REPLACE MACRO exact_sum(x, scale) AS sum(round(x * scale)::HUGEINT) / scale;
COMMENT ON MACRO exact_sum IS 'exact_sum(x, scale): a sum of doubles in fixed point (round(x * scale) summed as HUGEINT, then / scale): the same to the last digit whatever order the rows arrive in';
CREATE OR REPLACE MACRO share_flops(flops_, share_) AS exact_sum(CASE WHEN flops_ > 0 THEN flops_ * share_ END, {{AMOUNT_FIXED_SCALE}});
COMMENT ON MACRO share_flops IS 'share_flops(flops, share): the FLOPs of kernels cut by a window, each pro rata (its share), summed in fixed point (exact_sum at vocab.AMOUNT_FIXED_SCALE); kernels without FLOPs left out';
CREATE OR REPLACE MACRO share_bytes(bytes_, share_) AS exact_sum(CASE WHEN bytes_ > 0 THEN bytes_ * share_ END, {{AMOUNT_FIXED_SCALE}});
COMMENT ON MACRO share_bytes IS 'share_bytes(bytes, share): share_flops for the bytes kernels moved';
CREATE OR REPLACE MACRO share_peak_ns(flops_, share_, peak_flop_s_) AS
    exact_sum(CASE WHEN flops_ > 0 AND peak_flop_s_ > 0 THEN flops_ * share_ / peak_flop_s_ * 1e9 END, {{AMOUNT_FIXED_SCALE}});
COMMENT ON MACRO share_peak_ns IS 'share_peak_ns(flops, share, peak_flop_s): the time the FLOPs of share_flops would take at the peak of each kernel''s own precision (ns, fixed point)';
CREATE OR REPLACE MACRO category_layer(c) AS CASE c {{CATEGORY_LAYER_CASES}} END;
COMMENT ON MACRO category_layer IS 'category_layer(category): the layer of a loss category (vocab.CATEGORIES)';
CREATE OR REPLACE MACRO is_annotation_op(n) AS regexp_matches(coalesce(n, ''), {{ANNOTATION_OP_RE}});
COMMENT ON MACRO is_annotation_op IS 'is_annotation_op(name): a CPU op that marks where work ran rather than doing it (vocab.ANNOTATION_OP_RE: profiler steps, compiled regions, `## name ##` ranges, Python frames, optimizer steps); never a kernel''s op to name or fuse';
CREATE OR REPLACE MACRO names_matching(tbl, pattern) AS TABLE
    SELECT n FROM (SELECT any_value(name) AS n FROM query_table(tbl) GROUP BY name) WHERE regexp_matches(n, pattern);
COMMENT ON MACRO TABLE names_matching IS 'names_matching(''table'', pattern): the distinct `name`s of the table that match the pattern, each read once (`WHERE name IN (SELECT n FROM names_matching(…))` instead of the pattern on every row: a trace repeats a few thousand names over 100 k''s of rows)';
CREATE OR REPLACE MACRO is_communication_kernel(kind, n) AS kind = 'nccl' OR regexp_matches(coalesce(n, ''), {{COMM_KERNEL_RE}});
COMMENT ON MACRO is_communication_kernel IS 'is_communication_kernel(kind, name): NCCL / RCCL kernels (kind nccl) and, by name, NVSHMEM, DeepEP, symmetric-memory, custom all-reduce and MSCCL++ kernels';
CREATE OR REPLACE MACRO kernel_base_name(n) AS
    regexp_replace(replace(coalesce(n, ''), '(anonymous namespace)', ''), {{BASE_NAME_CUT_RE}}, '');
COMMENT ON MACRO kernel_base_name IS 'kernel_base_name(name): a kernel''s own name, `(anonymous namespace)` dropped, then everything from its template arguments or parameter list on (vocab.kernel_base_name): the matmul pattern is read on it';
CREATE OR REPLACE MACRO is_matmul_class_kernel(n) AS
    NOT regexp_matches(coalesce(n, ''), {{NO_MATMUL_KERNEL_RE}})
    AND regexp_matches(kernel_base_name(n), {{MATMUL_CLASS_KERNEL_RE}});
COMMENT ON MACRO is_matmul_class_kernel IS 'is_matmul_class_kernel(name): a kernel that may do matmul-class work by its name (vocab.MATMUL_CLASS_KERNEL_RE on its base name), kernels known to do no matmul work although their names hold a matmul word (vocab.NO_MATMUL_KERNEL_RE: inference servers'' helpers, cuDNN''s batch norm) left out';
CREATE OR REPLACE MACRO known_no_matmul_kernel(n, op) AS
    regexp_matches(coalesce(n, ''), {{COMPILED_NO_MATMUL_KERNEL_RE}})
    OR regexp_matches(coalesce(n, ''), {{AUX_ATTENTION_KERNEL_RE}})
    OR regexp_matches(coalesce(n, ''), {{NO_MATMUL_KERNEL_RE}})
    OR (NOT is_matmul_class_kernel(n)
        AND (regexp_matches(coalesce(n, ''), {{KNOWN_NO_MATMUL_KERNEL_RE}})
             OR (NOT coalesce(regexp_matches(op, {{MATMUL_CLASS_OP_RE}}), false)
                 AND coalesce(regexp_matches(op, {{KNOWN_OP_RE}}), false))));
COMMENT ON MACRO known_no_matmul_kernel IS 'known_no_matmul_kernel(name, op name): a kernel known to do no matmul-class work, by the names kernel_class reads (compiled pointwise / reduction, attention helpers, elementwise / norm / reduction / copy / optimizer library kernels, kernels of known non-matmul ops); such a kernel takes no share of --model-flops';
