"""PR301 memory-bound-kernel: where the waterfall's `memory_bound` time goes — the hot kernels of class `memory`,
with the bandwidth the measurement library's roofline says they reach, and advice that fits what the kernel is
(an elementwise kernel, an already-fused compiled kernel, a GEMM or attention below the ridge, the optimizer)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ...flops import GEMV_OPS
from ...vocab import (
    ANNOTATION_OP_RE,
    COMPILED_NO_MATMUL_KERNEL_RE,
    KNOWN_NO_MATMUL_KERNEL_RE,
    MATMUL_CLASS_KERNEL_RE,
    MATMUL_CLASS_OP_RE,
    NO_MATMUL_KERNEL_RE,
    kernel_base_name,
    kernel_word,
)
from ..advice import fuse_memory, half_precision
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext, grid_blocks_sql, grid_unit_sql
from ..text import fmt_bytes, fmt_ns, pct, short_kernel

EXPLANATION = Explanation(
    what_it_does="""
        The kernels that carry the waterfall's `memory_bound` time: kernels of class `memory` (the measurement
        library's `kernel_class`) — a FLOP estimate whose arithmetic intensity (FLOPs per DRAM byte) is below the
        ridge point P(precision) / bandwidth of their GPU, or known to do ~0 useful FLOPs (elementwise,
        normalisation, softmax, reductions, copies, optimizer). For each of the hottest (by lost time) it gives its
        time, the framework ops that launched it, and the DRAM bandwidth it reaches against the HBM peak, read from
        the library's `kernel_roofline` (bytes estimated from the op's input shapes). A byte estimate above the HBM
        peak is flagged (L2-resident reuse or an over-count), never stated as reached; a kernel with no byte
        estimate says its bandwidth is unknown. Kernels that may do matmul-class work without an estimate are
        `unknown` and communication kernels are `communication`: neither is ever called memory-bound here.""",
    why_is_this_bad="""
        A memory-bound kernel keeps the GPU 100% *utilized* while its tensor cores idle: its speed is set by HBM,
        not by FLOP/s. Near the bandwidth roofline it cannot go faster — only moving fewer bytes helps. Far below
        it, the kernel wastes even the bandwidth it has.""",
    example="""
        `memory-bound kernel vectorized_elementwise_kernel [MulFunctor] (aten::mul_): 50% of the window at
        ≈4.2 TB/s (89% of HBM)` — the kernel streams at the roofline: fuse it, don't tune it.""",
    how_to_fix="""
        Near the roofline (at least `roofline_fraction` of HBM): move fewer bytes — fuse the kernel with its
        neighbours (PR302; `torch.compile` fuses elementwise chains and normalisations in PyTorch; a fused kernel
        or a GEMM epilogue elsewhere), keep activations in 16 or 8 bits, use fused optimizers. Far below it (under
        `poor_bandwidth`): too little parallelism or uncoalesced / strided access — larger tensors, contiguous
        layouts, vectorised kernels. A kernel that is already a fusion (an Inductor `triton_*` kernel) is not fused
        further: shrink its bytes. A GEMM or attention kernel below the ridge (small M, decode) is limited by
        reading its operands: batch more rows or queries, or store the weights / KV cache in fewer bits — unless it
        reaches under `poor_bandwidth` of HBM too: then it lacks parallel work or a kernel made for its shape, and
        fewer bytes would not help. A matrix-vector or dot product (`mv`, `addmv`, `dot`) is memory-bound at any
        size: batch its vectors into one matmul, or read fewer bytes. Kernels
        whose median is shorter than `min_median_kernel_us` are left to PR501: their cost is the launch.""",
)

OPTIMIZER_RE = r"(?i)(adam|adagrad|\bsgd|lamb\b|lion\b|rmsprop|optimizer|_foreach_)"
ATTENTION_RE = r"(?i)(flash|fmha|attn|attention|sdpa)"

# The memory-class kernels of the window, with the op that launched them (kernel_launch's checked link).
MEMORY_KERNELS_SQL = """
SELECT k.kernel_id, k.rank, k.device, k.name, k.start_ns, k.end_ns, k.end_ns - k.start_ns AS dur,
       o.name AS op_name, o.input_types
FROM rule_kernels k LEFT JOIN rule_ops o ON o.op_id = k.op_id
WHERE k.class = 'memory' AND k.end_ns > k.start_ns"""
# The same kernels without their ops, for what reads none of the op's columns (op_id is unique: the join above adds
# no rows, but DuckDB cannot know that and joins anyway).
MEMORY_KERNELS_ONLY_SQL = """
SELECT k.kernel_id, k.rank, k.device, k.name, k.start_ns, k.end_ns, k.end_ns - k.start_ns AS dur
FROM rule_kernels k WHERE k.class = 'memory' AND k.end_ns > k.start_ns"""
# The fewest blocks (workgroups) a memory kernel of each name ran with per SM (CU) of its own GPU, the grid in its
# unit (context.grid_unit_sql, grid_blocks_sql; NULL where that is not known), with that GPU's SM count.
BLOCKS_SQL = """
WITH gp AS {gpus}, g AS (
    SELECT k.name, gp.sm_count AS sm, {blocks} AS blocks
    FROM rule_kernels k LEFT JOIN kernel_launch kl ON kl.kernel_id = k.kernel_id
    LEFT JOIN gp ON gp.rank IS NOT DISTINCT FROM k.rank AND gp.device = k.device
    WHERE k.class = 'memory' AND k.name IN (SELECT unnest(?::VARCHAR[]))
)
SELECT name, coalesce(arg_min(blocks, blocks / sm) FILTER (WHERE sm > 0), min(blocks))::BIGINT AS blocks,
       arg_min(sm, blocks / sm) FILTER (WHERE sm > 0) AS sm_count
FROM g GROUP BY name"""


def _framework_op(name: str | None) -> bool:
    """An op a user can name and fuse (`aten::mul_`, `vllm::rms_norm`): not an annotation, a compiled region or a
    Python frame."""
    return bool(name) and "::" in str(name) and not re.search(ANNOTATION_OP_RE, str(name))


@rule(
    title="Hot kernels run below the ridge point (memory-bound)",
    category="memory_bound",
    thresholds={"max_findings": 3, "roofline_fraction": 0.6, "poor_bandwidth": 0.3, "min_median_kernel_us": 5.0},
    explanation=EXPLANATION,
)
def memory_bound_kernel(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    lost = ctx.lost_ns(f"SELECT name AS key, rank, device, start_ns, end_ns FROM ({MEMORY_KERNELS_ONLY_SQL})", ["memory_bound"])
    if not lost:
        return
    names = list(lost)
    stats = {
        r["name"]: r
        for r in ctx.rows(
            f"""
        SELECT name, count(*) AS count, sum(dur) AS time_ns, median(dur) AS median_ns,
               list(DISTINCT rank ORDER BY rank) AS ranks
        FROM ({MEMORY_KERNELS_ONLY_SQL}) WHERE name IN (SELECT unnest(?::VARCHAR[])) GROUP BY name
        HAVING median(dur) >= ?""",
            [names, t.min_median_kernel_us * 1e3],
        )
    }
    top = sorted(((k, v) for k, v in lost.items() if k in stats), key=lambda kv: -kv[1])[: int(t.max_findings)]
    names = [k for k, _ in top]
    if not names:
        return
    # the precision of each one's data: its name's hint, else the dtype its ops were called with (the top names only)
    for r in ctx.rows(
        f"""
        WITH t AS (
            SELECT name, input_types, count(*) AS n FROM ({MEMORY_KERNELS_SQL})
            WHERE name IN (SELECT unnest(?::VARCHAR[])) GROUP BY name, input_types
        )
        SELECT name, coalesce(kernel_name_precision(name),
                              arg_max(dtype_precision(json_extract_string(input_types, '$[0]')), n)
                                  FILTER (WHERE dtype_precision(json_extract_string(input_types, '$[0]')) IS NOT NULL))
                   AS data_precision
        FROM t GROUP BY name""",
        [names],
    ):
        stats[r["name"]]["data_precision"] = r["data_precision"]
    for r in ctx.rows(BLOCKS_SQL.format(gpus=ctx.gpus_sql(), blocks=grid_blocks_sql(grid_unit_sql(ctx.hip))), [names]):
        stats[r["name"]].update(blocks=r["blocks"], sm_count=r["sm_count"])
    # bytes, bandwidth and its fraction of HBM: the library's roofline of this window, not a copy of it
    roof = {
        r["name"]: r
        for r in ctx.rows(
            """
        SELECT name, bytes, achieved_bandwidth_bytes_s, bandwidth_fraction_of_hbm, bandwidth_above_hbm_peak,
               arithmetic_intensity, ridge_flop_per_byte
        FROM kernel_roofline(?, ?, 'kernel') WHERE name IN (SELECT unnest(?::VARCHAR[]))""",
            [ctx.scope, ctx.range_name, names],
        )
    }
    peak_bw = {
        r["name"]: r["bw"]
        for r in ctx.rows(
            f"""
        WITH g AS {ctx.gpus_sql()}
        SELECT k.name, max(g.bw) AS bw FROM ({MEMORY_KERNELS_ONLY_SQL}) k
        JOIN g ON g.rank IS NOT DISTINCT FROM k.rank AND g.device = k.device
        WHERE k.name IN (SELECT unnest(?::VARCHAR[])) GROUP BY k.name""",
            [names],
        )
    }
    ops: dict[str, list[str]] = {}
    for r in ctx.rows(
        f"""
            SELECT name, op_name, sum(dur) AS time_ns FROM ({MEMORY_KERNELS_SQL})
            WHERE name IN (SELECT unnest(?::VARCHAR[])) AND op_name IS NOT NULL
            GROUP BY name, op_name ORDER BY time_ns DESC, op_name""",
        [names],
    ):
        ops.setdefault(r["name"], []).append(r["op_name"])
    for name, lost_ns in top:
        yield _finding(ctx, t, name, lost_ns, stats[name], roof.get(name, {}), peak_bw.get(name), ops.get(name, []))


def _few_blocks(ctx: RuleContext, s: dict[str, Any]) -> str:
    """Why a memory-bound kernel reaches little of the bandwidth, as far as its grid tells: fewer blocks than the
    GPU has SMs (CUs) leave part of it idle; with more, too few loads in flight per SM, or strided access. (`blocks`
    and `sm_count`: its launch with the fewest blocks per SM of its own GPU, BLOCKS_SQL.)"""
    blocks, sms, unit = s.get("blocks"), s.get("sm_count"), "CU" if ctx.hip else "SM"
    if not blocks or not sms:
        return "too few blocks or strided / uncoalesced access"
    if blocks < sms:
        return f"too few blocks ({blocks:,} for {sms} {unit}s: part of the GPU idles)"
    per = blocks / sms
    per_text = f"{per:,.0f}" if per >= 100 else f"{per:.3g}"  # (2,282, not 2.28e+03)
    return f"too few loads in flight per {unit} ({blocks:,} blocks, {per_text} per {unit}) or strided / uncoalesced access"


def _finding(
    ctx: RuleContext,
    t: Thresholds,
    name: str,
    lost_ns: float,
    s: dict[str, Any],
    roof: dict[str, Any],
    hbm: float | None,
    launched_by: list[str],
) -> Finding:
    short = short_kernel(name)
    op_names = [o for o in launched_by if _framework_op(o)][:3]
    # an annotation or compiled region (never the kernel's own name again): where it ran, not what to fuse
    regions = [o for o in launched_by if not _framework_op(o) and o != name][:1]
    bw, frac = roof.get("achieved_bandwidth_bytes_s"), roof.get("bandwidth_fraction_of_hbm")
    nbytes = roof.get("bytes")
    above = bool(roof.get("bandwidth_above_hbm_peak"))
    share = ctx.fraction(s["time_ns"])
    by = f" ({', '.join(op_names)})" if op_names else (f" (in {regions[0]})" if regions else "")
    what = op_names[0] if op_names else kernel_word(short)
    # A byte estimate implying more than the HBM peak (L2-resident reuse, or a model that over-counts) is flagged
    # as an estimate problem, like FLOPs above peak: never stated as a bandwidth reached.
    if above:
        bw_text = f" (its byte estimate implies {pct(frac)} of HBM: an estimate problem — L2 reuse or an over-count)"
        stream = (
            f"; its byte estimate (≈{fmt_bytes(nbytes)}) would mean ≈{(bw or 0) / 1e12:.2f} TB/s, above the "
            f"{(hbm or 0) / 1e12:.1f} TB/s HBM peak — the data is reused from L2, or the byte model "
            "over-counts, so its real bandwidth is not known"
        )
    elif bw and frac:
        bw_text = f" at ≈{bw / 1e12:.2f} TB/s ({pct(frac)} of HBM)"
        stream = (
            f", streaming ≈{fmt_bytes(nbytes)} at ≈{bw / 1e12:.2f} TB/s, {pct(frac)} of the {(hbm or 0) / 1e12:.1f} TB/s HBM peak"
        )
    else:
        bw_text = " (bandwidth unknown: no byte estimate)"
        stream = "; the trace gives no shapes for it, so how close it runs to the HBM roofline is not known"
    known = None if above else frac
    # matmul-class work: by the kernel's name, or an unnamed kernel of a matmul op (a layout transform or a
    # reduction launched by a convolution is not a GEMM)
    matmul = bool(
        (not re.search(NO_MATMUL_KERNEL_RE, name) and re.search(MATMUL_CLASS_KERNEL_RE, kernel_base_name(name)))
        or (not re.search(KNOWN_NO_MATMUL_KERNEL_RE, name) and any(re.search(MATMUL_CLASS_OP_RE, o) for o in op_names))
    )
    # (a GEMM or attention kernel below the ridge may well run on tensor cores: its own text says what bounds it)
    head = (
        f"{short}{by} ran {s['count']}× for {fmt_ns(s['time_ns'])} (median {fmt_ns(s['median_ns'])})"
        f"{'' if matmul else ' with no tensor-core work'}{stream}. "
    )
    p = ctx.program
    # fewer bytes: fused, and in fewer bits unless its data is already 8-bit (an fp8 cast)
    fewer = [x for x in (fuse_memory(p), half_precision(p, s["data_precision"])) if x]
    if any(re.search(OPTIMIZER_RE, x) for x in [short, *op_names]):
        kind = "optimizer"
        rec = head + (
            "It is the optimizer step: memory-bound by nature (it streams parameters, gradients and "
            "optimizer states once per step). Make it rarer or smaller — more tokens per step (larger "
            "batch, gradient accumulation), 8-bit / low-precision optimizer states, or shard it across "
            "data-parallel ranks (ZeRO / FSDP)."
        )
        fix = f"optimizer step ({what}): fewer steps or smaller states"
    elif matmul:
        kind = "attention" if re.search(ATTENTION_RE, name) else "matmul"
        ai, ridge = roof.get("arithmetic_intensity"), roof.get("ridge_flop_per_byte")
        why = f" (≈{ai:.0f} FLOP/B against a ridge of ≈{ridge:.0f})" if ai and ridge else ""
        if known is not None and known < t.poor_bandwidth:
            # below the ridge, but far below the bandwidth roof too: reading its operands does not set its
            # speed, so fewer bytes would not help — it has too little parallel work for the GPU, or a kernel
            # that is not made for this shape
            kind += "_underfed"
            shape = "batch × heads × query blocks" if kind.startswith("attention") else "output tiles"
            rec = head + (
                f"Its arithmetic intensity is below the ridge point{why}, but it reaches only {pct(frac)} of the "
                "HBM bandwidth: neither the tensor cores nor the memory set its speed. It is latency- or "
                f"occupancy-bound — too few {shape} to fill the GPU, or a kernel not tuned for this shape. "
                "Give each launch more work (larger batches, several heads or sequences in one call), use a "
                "kernel specialised for the shape (split-KV / flash-decoding for long K/V, a grouped GEMM for "
                "many small ones), or autotune it; fewer bytes alone would not make it faster."
            )
            fix = f"{what}: only {pct(frac)} of HBM bandwidth — more work per launch, or a kernel for this shape"
        elif kind == "matmul" and op_names and all(o in GEMV_OPS for o in op_names):
            kind = "gemv"
            rec = head + (
                f"It is a matrix-vector (or dot) product{why}: memory-bound at any size — each matrix element is "
                "read for one multiply-add. Fusing does not apply: batch the vectors into one matmul (several "
                "tokens or requests per call), or store the matrix in fewer bits (fp8 / int8 / int4 weight-only)."
            )
            fix = f"{what}: matrix-vector product — batch vectors into one matmul, fewer bytes"
        elif kind == "attention":
            rec = head + (
                f"It is an attention kernel below the ridge point{why}: limited by reading K/V, as decode "
                "or short-query attention is. Fusing does not apply: batch more queries per K/V read "
                "(larger decode batches, grouped-query sharing), keep the KV cache in fewer bits (fp8), or "
                "use a split-KV / decode-specialised kernel."
            )
            fix = f"{what}: attention below the ridge — batch queries, fewer KV bytes"
        else:
            rec = head + (
                f"It is a GEMM below the ridge point{why}: one of its dimensions is small (GEMV-like), so "
                "reading its operands sets its speed. Fusing does not apply: make the small dimension "
                "larger (batch more rows / tokens per call), or store the weights in fewer bits "
                "(fp8 / int8 / int4 weight-only)."
            )
            fix = f"{what}: GEMM below the ridge — batch more rows, fewer weight bytes"
    elif re.search(COMPILED_NO_MATMUL_KERNEL_RE, name):
        kind = "compiled"
        rec = head + (
            "It is already a fused kernel (Inductor's Triton code): fusing further is up to the compiler. "
            "Move fewer bytes — keep activations in 16 bits or less — and, if it reaches little of the "
            "HBM bandwidth, check its shapes (small or strided tensors) or autotune it "
            "(torch.compile mode='max-autotune')."
        )
        fix = f"{kernel_word(short)}: already fused — fewer bytes" + (f" ({pct(frac)} of HBM)" if known else "")
    elif known is not None and known >= t.roofline_fraction:
        kind = "at_roofline"
        rec = head + (
            f"It already runs at the bandwidth roofline: it cannot get faster, only move fewer bytes — "
            f"{', '.join(fewer)}, or fold it into the producing GEMM's epilogue."
        )
        fix = f"fuse {what}: already at {pct(frac)} of HBM bandwidth"
    elif known is not None and known < t.poor_bandwidth:
        kind = "poor_bandwidth"
        rec = head + (
            f"That is far below the roofline ({pct(frac)}): {_few_blocks(ctx, s)} — use larger, contiguous tensors "
            f"and vectorised kernels, or {fuse_memory(p)}."
        )
        fix = f"{kernel_word(short)} reaches only {pct(frac)} of HBM BW"
    elif known is None:
        kind = "bandwidth_unknown"
        rec = head + (
            f"If it streams near the roofline only fewer bytes help ({', '.join(fewer)}); record shapes (or an "
            "Nsight Compute CSV) to know which it is."
        )
        fix = f"{what}: memory-bound, bandwidth unknown — fuse or shrink its bytes"
    else:
        kind = "below_roofline"
        rec = head + (
            f"{fuse_memory(p)[0].upper() + fuse_memory(p)[1:]}, or raise its arithmetic intensity "
            "(bigger tiles, 16-bit data) to move fewer bytes per FLOP."
        )
        fix = f"fuse {what}; raise arithmetic intensity"
    return Finding(
        title=f"memory-bound kernel {short}{by}: {pct(share)} of the window{bw_text}",
        recommendation=rec,
        fix=fix,
        lost_fraction=ctx.fraction(lost_ns),
        key=name,
        rank=s["ranks"][0] if len(s["ranks"] or []) == 1 and len(ctx.rank_window_ns) > 1 else None,
        evidence={
            "kernel": name,
            "kernel_short": short,
            "ops": op_names,
            "launched_in": regions,
            "count": s["count"],
            "time_ns": s["time_ns"],
            "median_ns": s["median_ns"],
            "window_share": share,
            "bytes_estimate": nbytes,
            "bandwidth_bytes_s": bw,
            "hbm_fraction": frac,
            "hbm_peak_bytes_s": hbm,
            "ranks": s["ranks"],
            "blocks": s.get("blocks"),
            "data_precision": s["data_precision"],
            "bandwidth_above_hbm_peak": above,
            "kernel_kind": kind,
        },
    )
