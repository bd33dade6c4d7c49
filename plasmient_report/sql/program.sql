-- Module: program
-- What program the trace comes from, so that advice fits it: PyTorch (framework ops `aten::` / `autograd::` …,
-- PyTorch's own or Inductor's kernels, or its profiler's ranges), TensorRT (its NVTX domain, engine ranges, kernel
-- names), the runtime (HIP on AMD GPUs or HIP calls, else CUDA), and whether it already replays graphs. A trace of
-- a C++ / CUDA program, TensorRT or Julia is not told to use torch.compile. And whether it is an inference server
-- that reserves most of the GPU's memory on purpose (vLLM, SGLang: by their kernels, ops or Python frames).
-- Depends: vocab

CREATE OR REPLACE VIEW program AS
-- Each table's distinct names once (a with_stack trace repeats a few thousand names over 100 k's of rows): every
-- test below is a regexp over these.
WITH n AS (
    SELECT 'kernel' AS src, name, NULL::VARCHAR AS domain FROM (SELECT DISTINCT name FROM kernels)
    UNION ALL SELECT 'op', name, NULL FROM (SELECT DISTINCT name FROM ops)
    UNION ALL SELECT 'range', name, domain FROM (SELECT DISTINCT name, domain FROM ranges)
    UNION ALL SELECT 'api', name, NULL FROM (SELECT DISTINCT name FROM api_calls)
)
SELECT
    coalesce(bool_or(src = 'op' AND regexp_matches(name, {{KNOWN_OP_RE}}))
               OR bool_or(src = 'kernel' AND regexp_matches(name, {{PYTORCH_KERNEL_RE}}))
               OR bool_or(src = 'range' AND regexp_matches(name, {{PYTORCH_RANGE_RE}})), false) AS pytorch,
    coalesce(bool_or(src = 'range' AND (regexp_matches(coalesce(domain, ''), {{TENSORRT_RE}})
                                        OR regexp_matches(name, {{TENSORRT_RE}})))
               OR bool_or(src = 'kernel' AND regexp_matches(name, {{TENSORRT_RE}})), false) AS tensorrt,
    CASE WHEN EXISTS (SELECT 1 FROM devices WHERE vendor = 'AMD')
           OR bool_or(src = 'api' AND regexp_matches(name, {{HIP_API_RE}})) THEN 'hip'
         ELSE 'cuda' END AS runtime,
    coalesce(bool_or(src = 'api' AND regexp_matches(name, {{GRAPH_LAUNCH_API_RE}})), false) AS graphs,
    CASE WHEN bool_or(src IN ('op', 'range') AND regexp_matches(name, {{BACKWARD_RE}})) THEN true
         WHEN bool_or(src = 'op') THEN false END AS training,
    CASE WHEN bool_or(src <> 'api' AND regexp_matches(lower(name), {{VLLM_RE}})) THEN 'vLLM'
         WHEN bool_or(src <> 'api' AND regexp_matches(lower(name), {{SGLANG_RE}})) THEN 'SGLang' END AS server
FROM n;
COMMENT ON VIEW program IS 'One row: what program the trace comes from';
COMMENT ON COLUMN program.pytorch IS 'true when PyTorch ran it: framework ops (aten::, autograd::, c10d:: …), PyTorch''s or Inductor''s kernels, or its profiler''s ranges';
COMMENT ON COLUMN program.tensorrt IS 'true when TensorRT ran engines (its NVTX domain, ExecutionContext ranges, *_trt kernels)';
COMMENT ON COLUMN program.runtime IS 'hip (an AMD GPU or HIP runtime calls) or cuda';
COMMENT ON COLUMN program.graphs IS 'true when the program launches captured graphs (cudaGraphLaunch / hipGraphLaunch)';
COMMENT ON COLUMN program.training IS 'true when a training step is traced (backward ops or ranges, an optimizer step); false when framework ops are traced and none is (inference); NULL without ops (cannot tell)';
COMMENT ON COLUMN program.server IS 'vLLM or SGLang when the trace is of that inference server (its kernels, ops or Python frames name it), else NULL';
