-- Module: program
-- What program the trace comes from, so that advice fits it: PyTorch (framework ops `aten::` / `autograd::` …,
-- PyTorch's own or Inductor's kernels, or its profiler's ranges), TensorRT (its NVTX domain, engine ranges, kernel
-- names), the runtime (HIP on AMD GPUs or HIP calls, else CUDA), and whether it already replays graphs. A trace of
-- a C++ / CUDA program, TensorRT or Julia is not told to use torch.compile. And whether it is an inference server
-- that reserves most of the GPU's memory on purpose (vLLM, SGLang: by their kernels, ops or Python frames).
-- Depends: vocab

CREATE OR REPLACE VIEW program AS
WITH k AS (SELECT DISTINCT name FROM kernels)
SELECT
    EXISTS (SELECT 1 FROM ops WHERE regexp_matches(name, {{KNOWN_OP_RE}}))
      OR EXISTS (SELECT 1 FROM k WHERE regexp_matches(name, {{PYTORCH_KERNEL_RE}}))
      OR EXISTS (SELECT 1 FROM ranges WHERE regexp_matches(name, {{PYTORCH_RANGE_RE}})) AS pytorch,
    EXISTS (SELECT 1 FROM ranges WHERE regexp_matches(coalesce(domain, ''), {{TENSORRT_RE}})
                                    OR regexp_matches(name, {{TENSORRT_RE}}))
      OR EXISTS (SELECT 1 FROM k WHERE regexp_matches(name, {{TENSORRT_RE}})) AS tensorrt,
    CASE WHEN EXISTS (SELECT 1 FROM devices WHERE vendor = 'AMD')
           OR EXISTS (SELECT 1 FROM api_calls WHERE regexp_matches(name, {{HIP_API_RE}})) THEN 'hip'
         ELSE 'cuda' END AS runtime,
    EXISTS (SELECT 1 FROM api_calls WHERE regexp_matches(name, {{GRAPH_LAUNCH_API_RE}})) AS graphs,
    (WITH n AS (SELECT name FROM k UNION SELECT DISTINCT name FROM ops UNION SELECT DISTINCT name FROM ranges)
     SELECT CASE WHEN bool_or(regexp_matches(lower(name), {{VLLM_RE}})) THEN 'vLLM'
                 WHEN bool_or(regexp_matches(lower(name), {{SGLANG_RE}})) THEN 'SGLang' END FROM n) AS server;
COMMENT ON VIEW program IS 'One row: what program the trace comes from';
COMMENT ON COLUMN program.pytorch IS 'true when PyTorch ran it: framework ops (aten::, autograd::, c10d:: …), PyTorch''s or Inductor''s kernels, or its profiler''s ranges';
COMMENT ON COLUMN program.tensorrt IS 'true when TensorRT ran engines (its NVTX domain, ExecutionContext ranges, *_trt kernels)';
COMMENT ON COLUMN program.runtime IS 'hip (an AMD GPU or HIP runtime calls) or cuda';
COMMENT ON COLUMN program.graphs IS 'true when the program launches captured graphs (cudaGraphLaunch / hipGraphLaunch)';
COMMENT ON COLUMN program.server IS 'vLLM or SGLang when the trace is of that inference server (its kernels, ops or Python frames name it), else NULL';
