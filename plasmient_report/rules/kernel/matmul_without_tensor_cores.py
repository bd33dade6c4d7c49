"""PR401 matmul-without-tensor-cores: fp32 matmuls on CUDA cores (no TF32), found from the op's input dtype
and the kernel's name (sgemm / simt / ffma, or no tensor-core marker)."""

from __future__ import annotations

from collections.abc import Iterator

from ...flops import GEMV_OPS
from ...vocab import AMOUNT_FIXED_SCALE, GEMV_KERNEL_RE, NON_TENSOR_CORE_RE, TENSOR_CORE_RE
from ..advice import tensor_cores
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_ns, short_kernel

EXPLANATION = Explanation(
    what_it_does="""
        Matrix-multiply kernels that do not use tensor cores: kernels named like CUDA-core GEMMs (`sgemm`,
        `simt`, `ffma`, `f32f32_f32f32_f32`), and kernels of fp32 matmul ops (the precision the measurement
        library's `kernel_class` gives them, from the launching op's dtype) whose names carry no tensor-core marker
        (`tf32`, `bf16`, `f16`, `tensorop`, `wgmma`, `nvjet`, …). Matrix-vector and dot products (`mv`, `addmv`,
        `dot`, and cuBLAS's `gemv` / `dot_kernel` kernels) are left out: they have no tensor-core path at any
        precision. The evidence gives the kernels, the ops
        and shapes, the time and the FLOP rate reached, and the GPU's FP32 / TF32 / BF16 peaks.""",
    why_is_this_bad="""
        CUDA-core FP32 math reaches a small fraction of the tensor cores' rate: on an H100/H200 67 TFLOP/s FP32
        against 495 TF32 and 989 BF16 (dense). A model left in fp32 without TF32 runs its matmuls 7–15× below
        what the GPU can do — the waterfall counts it as `compute_inefficiency`.""",
    example="""
        `fp32 matmuls on CUDA cores (no TF32): ampere_sgemm_128x64_nn (aten::mm), 2.1 ms` — TF32 would raise the
        ceiling 7.4×.""",
    how_to_fix="""
        PyTorch: allow TF32 for fp32 matmuls — `torch.set_float32_matmul_precision("high")` (or
        `torch.backends.cuda.matmul.allow_tf32 = True`; `torch.backends.cudnn.allow_tf32 = True` for convs) — or,
        better, run under `torch.autocast("cuda", dtype=torch.bfloat16)` or in bf16 outright. cuBLAS directly:
        `cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH)` or the compute type `CUBLAS_COMPUTE_32F_FAST_TF32`.
        TensorRT: build with TF32 / FP16 enabled. On a GPU without TF32 (Volta, Turing) use 16-bit inputs. Keep
        fp32 only where accuracy needs it (reductions, the loss, optimizer state).""",
)

# The patterns tested once per kernel name (a trace has tens of names for tens of thousands of kernels), in a table
# of their own: in the query below DuckDB would push them down to every kernel again.
NAMES_SQL = f"""
CREATE OR REPLACE TABLE _kernel_names AS
SELECT name, regexp_matches(name, '{NON_TENSOR_CORE_RE}') AS cuda_core, regexp_matches(name, '{TENSOR_CORE_RE}') AS tensor_core
FROM (SELECT DISTINCT name FROM rule_kernels WHERE kind = 'compute')"""
FLAGGED_SQL = f"""
SELECT k.*, k.end_ns - k.start_ns AS dur, o.name AS op_name, o.input_dims
FROM rule_kernels k LEFT JOIN _kernel_names n ON n.name = k.name
LEFT JOIN rule_ops o ON o.op_id = coalesce(k.flops_op_id, k.op_id)
WHERE k.kind = 'compute' AND k.end_ns > k.start_ns
  -- matrix-vector and dot products have no tensor-core path at any precision: TF32 would not change them (by the
  -- op, or by cuBLAS's gemv / dot kernels, which a matmul of a matrix and a vector runs too)
  AND coalesce(o.name, '') NOT IN ({", ".join(f"'{n}'" for n in GEMV_OPS)})
  AND NOT regexp_matches(k.name, '{GEMV_KERNEL_RE}')
  AND (n.cuda_core
       -- the kernel's precision as the measure stage decided it (kernel_class: the launching op's dtype first)
       -- (with a FLOP estimate: a precision guessed from a name alone does not make a kernel fp32)
       OR (k.precision = 'fp32' AND coalesce(k.flops, 0) > 0 AND NOT n.tensor_core))"""


@rule(
    title="Matmuls run on CUDA cores (fp32 without TF32)",
    category="compute_inefficiency",
    thresholds={"max_findings": 5},
    explanation=EXPLANATION,
)
def matmul_without_tensor_cores(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    ctx.con.execute(NAMES_SQL)
    rows = ctx.rows(f"""
        SELECT name, min(op_name) AS op_name, min(input_dims) AS dims, min(precision) AS precision,
               count(*) AS count, sum(dur) AS time_ns, exact_sum(flops, {AMOUNT_FIXED_SCALE!r}) AS flops,
               list(DISTINCT rank ORDER BY rank) AS ranks
        FROM ({FLAGGED_SQL}) GROUP BY name ORDER BY time_ns DESC, name""")
    if not rows:
        return
    # Their lost time: compute inefficiency or memory-bound where they have FLOPs. Without a FLOP estimate (no shapes)
    # their time is the waterfall's unknown FLOPs: how much of it is lost is not measured, so none is claimed (the
    # finding is then information: a CUDA-core GEMM is what that unknown work is).
    lost = ctx.lost_fraction(
        f"SELECT rank, device, start_ns, end_ns FROM ({FLAGGED_SQL})", ["compute_inefficiency", "memory_bound"]
    )
    measured = any(r["flops"] for r in rows)
    g = ctx.gpu()
    tf = g.table_entry.tflops if g and g.table_entry else {}
    time_ns = sum(r["time_ns"] for r in rows)
    flops = sum(r["flops"] or 0 for r in rows)
    rate = flops / (time_ns / 1e9) if time_ns and flops else None
    top = rows[0]
    what = f"{short_kernel(top['name'])}" + (f" ({top['op_name']} {top['dims'] or ''})".rstrip() if top["op_name"] else "")
    peaks = ""
    has_tf32 = bool(tf.get("tf32")) or not tf  # unknown GPU: assume a current one
    half = "bf16" if tf.get("bf16") or not tf else "fp16"
    if tf.get("fp32") and tf.get("tf32"):
        peaks = (
            f" On this GPU FP32 peaks at {tf['fp32']:g} TFLOP/s, TF32 at {tf['tf32']:g} "
            f"({tf['tf32'] / tf['fp32']:.1f}×)" + (f" and BF16 at {tf['bf16']:g}" if tf.get("bf16") else "") + "."
        )
    elif tf.get("fp32") and tf.get(half):
        peaks = (
            f" This GPU has no TF32; FP32 peaks at {tf['fp32']:g} TFLOP/s, {half.upper()} tensor cores at "
            f"{tf[half]:g} ({tf[half] / tf['fp32']:.0f}×)."
        )
    advice = tensor_cores(ctx.program, has_tf32, half)
    rec = (
        f"{sum(r['count'] for r in rows)} matmul kernels ran on CUDA cores for {fmt_ns(time_ns)}"
        + (
            f" at {rate / 1e12:.1f} TFLOP/s"
            if rate
            else " (the trace gives no shapes: their FLOP rate, and so what they lose, is not measured)"
        )
        + f"; the largest: {what}.{peaks} "
        + advice
    )
    yield Finding(
        title=f"fp32 matmuls on CUDA cores{' (no TF32)' if has_tf32 else ''}: {what}, {fmt_ns(time_ns)}",
        recommendation=rec,
        fix=(
            f"enable TF32 or {half}{' autocast' if ctx.program.pytorch else ''}: fp32 GEMMs use CUDA cores"
            if has_tf32
            else f"{half}{' autocast' if ctx.program.pytorch else ' inputs'}: fp32 GEMMs use CUDA cores"
        ),
        lost_fraction=lost if measured else None,
        key="fp32-matmul",
        evidence={
            "kernels": [
                {
                    "kernel": r["name"],
                    "op": r["op_name"],
                    "input_dims": r["dims"],
                    "precision": r["precision"],
                    "count": r["count"],
                    "time_ns": r["time_ns"],
                    "tflop_s": (r["flops"] / (r["time_ns"] / 1e9) / 1e12) if r["flops"] else None,
                }
                for r in rows[: int(t.max_findings)]
            ],
            "time_ns": time_ns,
            "tflop_s": rate / 1e12 if rate else None,
            "peak_tflops": {p: tf.get(p) for p in ("fp32", "tf32", "bf16") if tf.get(p)},
        },
    )
