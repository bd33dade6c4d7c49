"""PR602 utilization-vs-achieved-gap: the headline — the GPU looks busy on the dashboard, but most of that busy
time does no useful work. Lists the busy-time categories that make up the gap."""

from __future__ import annotations

from collections.abc import Iterator

from ..base import Explanation, Finding, Thresholds, rule
from ..context import BUSY_CATEGORIES, RuleContext
from ..text import pct

EXPLANATION = Explanation(
    what_it_does="""
        The distance between the two headline numbers: utilization (the share of the window with a kernel
        resident — what `nvidia-smi` shows) and the achieved fraction of peak. Fires when utilization is at least
        `min_utilization` and exceeds the achieved fraction by `min_gap` or more. The gap is the waterfall's
        busy-time categories (memory-bound, compute inefficiency, communication, copies), listed with their shares.
        Silent when the achieved fraction is unknown or only a lower bound (unknown-FLOP work is material): unknown
        work may have been useful, so nothing here calls it waste.""",
    why_is_this_bad="""
        Utilization counts a kernel stalled on memory or spinning in a collective as 100% busy. A team that
        watches utilization sees a saturated GPU and buys more of them; the achieved fraction shows how much of
        each GPU is actually doing math.""",
    example="""
        `busy 99% of the time, useful 46%: 53% of the window was busy without useful work` — memory-bound 36%,
        compute inefficiency 16%.""",
    how_to_fix="""
        Work on the largest busy-time category: memory-bound kernels (fuse, raise arithmetic intensity — PR301,
        PR302), compute inefficiency (tensor-core precisions, GEMM shapes — PR401, PR402), communication (PR101,
        PR102), pipeline bubbles (PR201). Track the achieved fraction, not utilization, in dashboards and CI
        (`plasmient-report diff --fail-if-drop`).""",
)

SEE = {
    "memory_bound": "PR301/PR302",
    "compute_inefficiency": "PR401/PR402",
    "collective_wait": "PR101",
    "collective_transfer": "PR102",
    "pipeline_bubble": "PR201",
    "memcpy": "PR403",
}


@rule(
    title="The GPU is busy but not useful (utilization far above achieved fraction of peak)",
    category=None,
    thresholds={"min_utilization": 0.5, "min_gap": 0.25},
    explanation=EXPLANATION,
)
def utilization_vs_achieved_gap(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    util, ach = ctx.utilization, ctx.achieved
    # A lower-bound achieved (unknown work is material) cannot say the busy time was not useful.
    if util is None or ach is None or ctx.achieved_is_lower_bound or util < t.min_utilization or util - ach < t.min_gap:
        return
    # Unknown-FLOP time may have been useful: it is not part of the gap.
    parts = sorted(((c, ctx.category_fraction(c)) for c in BUSY_CATEGORIES if c != "unknown_flops"), key=lambda x: -x[1])
    parts = [(c, f) for c, f in parts if f > 0]
    lost = sum(f for _, f in parts)
    listing = ", ".join(f"{c.replace('_', ' ')} {pct(f)}" + (f" ({SEE[c]})" if c in SEE else "") for c, f in parts[:4])
    rec = (
        f"The GPU had a kernel resident {pct(util)} of the window — what the dashboard shows — but achieved "
        f"{pct(ach)} of peak: {pct(util - ach)} of the window was busy without useful work. It went to {listing}. "
        "Start with the largest; track the achieved fraction, not utilization."
    )
    yield Finding(
        title=f"busy {pct(util)} of the time, useful {pct(ach)}: {pct(util - ach)} of the window was busy without useful work",
        recommendation=rec,
        fix=f"{pct(util)} busy but {pct(ach)} useful: see the busy-time losses",
        lost_fraction=lost,
        key="headline",
        evidence={"utilization": util, "achieved_fraction_of_peak": ach, "gap": util - ach, "busy_losses": dict(parts)},
    )
