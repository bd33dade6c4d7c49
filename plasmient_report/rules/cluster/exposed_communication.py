"""PR102 exposed-communication: communication-kernel time with no compute beside it, and the comm/compute overlap
per GPU."""

from __future__ import annotations

from collections.abc import Iterator

from ..advice import overlap_communication
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_bytes, fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        Per GPU, the time a communication kernel is resident (class `communication` of the measurement library's
        `kernel_class`: NCCL / RCCL, NVSHMEM, DeepEP, symmetric-memory, custom all-reduce kernels), and the share of
        it during which a compute kernel or copy runs too (the comm/compute *overlap*). The exposed part —
        communication alone, data moving — is the waterfall's `collective_transfer`. Fires when the overlap is below
        `max_overlap`. The evidence lists the collectives with the most transfer time, their sizes and bandwidth.""",
    why_is_this_bad="""
        While only communication runs, the SMs do no useful math. Data-parallel and sharded training can hide
        almost all gradient / parameter traffic behind the backward / forward pass; what is not hidden adds
        straight to the step time.""",
    example="""
        `exposed communication: only 12% of communication time overlaps compute` — the all-reduces run after the
        backward instead of during it.""",
    how_to_fix="""
        PyTorch DDP: let the backward start all-reduces early (smaller `bucket_cap_mb`,
        `gradient_as_bucket_view=True`), and keep the optimizer from waiting on the last bucket. FSDP:
        `forward_prefetch` / `backward_prefetch`, `limit_all_gathers`. Megatron / DeepSpeed: overlap options for
        grad-reduce and param-gather. Outside a framework: issue communication on its own stream and give the GPU
        independent work meanwhile. Compress or shrink what is sent (16-bit gradients, fewer, larger buckets), or
        use a faster interconnect path (NVLink, `NCCL_ALGO` / `NCCL_PROTO` checks). Inference (framework ops and
        no backward in the trace): the forward's tensor- or expert-parallel collectives have no gradients to bucket —
        overlap them with the GEMMs (async tensor parallelism, fused GEMM + collective kernels, sequence
        parallelism), or shard over fewer GPUs.""",
)

# Per GPU: time with an NCCL kernel resident, and the part of it with a compute kernel or copy resident too.
OVERLAP_SQL = """
WITH k AS (
    SELECT k.rank, k.device, greatest(k.start_ns, w.start_ns) AS s, least(k.end_ns, w.end_ns) AS e,
           (k.class = 'communication')::INT AS is_nccl
    FROM rule_kernels k JOIN rule_windows w
      ON w.rank IS NOT DISTINCT FROM k.rank AND w.device = k.device AND k.start_ns < w.end_ns AND k.end_ns > w.start_ns
), ev AS (
    SELECT rank, device, s AS t, is_nccl AS dn, 1 - is_nccl AS dc FROM k WHERE e > s
    UNION ALL SELECT rank, device, e, -is_nccl, is_nccl - 1 FROM k WHERE e > s
), agg AS (SELECT rank, device, t, sum(dn) AS dn, sum(dc) AS dc FROM ev GROUP BY rank, device, t
), run AS (
    SELECT rank, device, t, lead(t) OVER (PARTITION BY rank, device ORDER BY t) AS t_next,
           sum(dn) OVER c AS n_nccl, sum(dc) OVER c AS n_other
    FROM agg WINDOW c AS (PARTITION BY rank, device ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT rank, device, coalesce(sum(t_next - t) FILTER (WHERE n_nccl > 0), 0) AS nccl_ns,
       coalesce(sum(t_next - t) FILTER (WHERE n_nccl > 0 AND n_other > 0), 0) AS overlap_ns
FROM run WHERE t_next IS NOT NULL GROUP BY rank, device ORDER BY rank, device"""


@rule(
    title="Communication is exposed: it runs with no compute beside it",
    category="collective_transfer",
    thresholds={"max_overlap": 0.8},
    explanation=EXPLANATION,
)
def exposed_communication(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    # No communication kernel: no communication time (the sweep below would find none, over every kernel).
    if not ctx.rows("SELECT 1 AS x FROM rule_kernels WHERE class = 'communication' LIMIT 1"):
        return
    per_gpu = ctx.rows(OVERLAP_SQL)
    nccl = sum(r["nccl_ns"] for r in per_gpu)
    if not nccl:
        return
    overlap = sum(r["overlap_ns"] for r in per_gpu)
    share = overlap / nccl
    if share >= t.max_overlap:
        return
    lost = ctx.lost_fraction(
        "SELECT rank, device, start_ns, end_ns FROM rule_kernels WHERE class = 'communication'", ["collective_transfer"]
    )
    top = ctx.rows("""
        WITH i AS (SELECT key, collective, seq, min(dur_ns) AS transfer_ns, max(bytes) AS bytes,
                          count(DISTINCT rank) AS n FROM rule_collective_members GROUP BY ALL)
        SELECT collective, count(*) AS count, sum(transfer_ns) AS transfer_ns, median(bytes) AS bytes,
               sum(bytes) / nullif(sum(transfer_ns), 0) AS algbw_gbs
        FROM i GROUP BY collective ORDER BY transfer_ns DESC, collective LIMIT 5""")
    exposed = nccl - overlap
    ranks = [
        {
            "rank": r["rank"],
            "device": r["device"],
            "nccl_ns": r["nccl_ns"],
            "overlap_ns": r["overlap_ns"],
            "overlap": r["overlap_ns"] / r["nccl_ns"] if r["nccl_ns"] else None,
        }
        for r in per_gpu
    ]
    per = f" ({fmt_ns(ctx.per_step(exposed / max(len(per_gpu), 1)))} per GPU {ctx.per_step_text()})" if ctx.step_unit else ""
    biggest = (
        (
            f"; the largest is {top[0]['collective']} ({top[0]['count']}×"
            + (
                f", {fmt_bytes(top[0]['bytes'])} each, {top[0]['algbw_gbs']:.1f} GB/s)"
                if top[0]["bytes"] and top[0]["algbw_gbs"] is not None
                else ", its size not in the trace)"
            )
        )
        if top
        else ""
    )
    rec = (
        f"{pct(1 - share)} of the {fmt_ns(nccl)} of communication-kernel time has no compute beside it: "
        f"{fmt_ns(exposed)} exposed{per}{biggest}. {overlap_communication(ctx.program)}"
    )
    yield Finding(
        title=f"exposed communication: only {pct(share)} of communication time overlaps compute",
        recommendation=rec,
        fix=f"overlap comm with compute ({pct(share)} overlapped now)",
        lost_fraction=lost,
        key="nccl",
        evidence={
            "nccl_ns": nccl,
            "overlap_ns": overlap,
            "exposed_ns": exposed,
            "overlap": share,
            "ranks": ranks,
            "top_collectives": top,
        },
    )
