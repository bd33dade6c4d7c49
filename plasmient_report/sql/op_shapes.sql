-- Module: op_shapes
-- The problem shapes of matmul-class ops (filled by the measure stage from flops.op_shape, the FLOP models' own
-- reading of an op's inputs): each distinct (op name, input dims, input types, concrete inputs) of a GEMM, attention
-- or convolution op once — GEMM M, N, K (and batch), attention batch, heads, query / key length, head dim, causal
-- and pass, convolution input, weight, stride, padding, groups.

CREATE OR REPLACE TABLE op_shapes (
    name            VARCHAR,
    input_dims      VARCHAR,
    input_types     VARCHAR,
    concrete_inputs VARCHAR,
    family          VARCHAR,
    shape           VARCHAR,
    dtype           VARCHAR,
    pass            VARCHAR,
    batch           BIGINT,
    m               BIGINT,
    n               BIGINT,
    k               BIGINT,
    heads           BIGINT,
    kv_heads        BIGINT,
    q_len           BIGINT,
    kv_len          BIGINT,
    head_dim        BIGINT,
    causal          BOOLEAN,
    conv_input      VARCHAR,
    conv_weight     VARCHAR,
    stride          VARCHAR,
    padding         VARCHAR,
    dilation        VARCHAR,
    groups          BIGINT,
    transposed      BOOLEAN
);
COMMENT ON TABLE op_shapes IS 'One row per distinct shape of a matmul-class op that owns kernel FLOPs (ops.name, input_dims, input_types, concrete_inputs)';
COMMENT ON COLUMN op_shapes.name IS 'ops.name (aten::mm, aten::linear, aten::scaled_dot_product_attention, aten::conv2d, …)';
COMMENT ON COLUMN op_shapes.input_dims IS 'ops.input_dims';
COMMENT ON COLUMN op_shapes.input_types IS 'ops.input_types';
COMMENT ON COLUMN op_shapes.concrete_inputs IS 'ops.concrete_inputs';
COMMENT ON COLUMN op_shapes.family IS 'gemm, attention or conv';
COMMENT ON COLUMN op_shapes.shape IS 'the shape in one line (M=… N=… K=…; B=… H=…/kv L=… S=… D=… causal; in … w … stride … pad … groups …)';
COMMENT ON COLUMN op_shapes.dtype IS 'the dtype of its first matrix operand as the trace spells it, c10:: dropped (BFloat16, Float8_e4m3fn, float)';
COMMENT ON COLUMN op_shapes.pass IS 'attention: forward or backward';
COMMENT ON COLUMN op_shapes.batch IS 'GEMM: batch of a batched matmul (1 otherwise); attention: batch; conv: N';
COMMENT ON COLUMN op_shapes.m IS 'GEMM: rows of the output (a linear''s leading dims folded)';
COMMENT ON COLUMN op_shapes.n IS 'GEMM: columns of the output (a linear''s out_features)';
COMMENT ON COLUMN op_shapes.k IS 'GEMM: the reduction dimension';
COMMENT ON COLUMN op_shapes.heads IS 'attention: query heads';
COMMENT ON COLUMN op_shapes.kv_heads IS 'attention: key / value heads (fewer than heads: GQA / MQA)';
COMMENT ON COLUMN op_shapes.q_len IS 'attention: query length L';
COMMENT ON COLUMN op_shapes.kv_len IS 'attention: key / value length S';
COMMENT ON COLUMN op_shapes.head_dim IS 'attention: head dimension E';
COMMENT ON COLUMN op_shapes.causal IS 'attention: causal masking (its FLOPs halved for L = S)';
COMMENT ON COLUMN op_shapes.conv_input IS 'conv: input dims N×C×spatial';
COMMENT ON COLUMN op_shapes.conv_weight IS 'conv: weight dims';
COMMENT ON COLUMN op_shapes.stride IS 'conv: stride per spatial dim';
COMMENT ON COLUMN op_shapes.padding IS 'conv: padding per spatial dim';
COMMENT ON COLUMN op_shapes.dilation IS 'conv: dilation per spatial dim';
COMMENT ON COLUMN op_shapes.groups IS 'conv: groups';
COMMENT ON COLUMN op_shapes.transposed IS 'conv: a transposed convolution';
