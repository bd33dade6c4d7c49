"""PR504 gpu-idle-gap: the largest stretches with no kernel on a GPU, and what its host was doing meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Finding, Thresholds, rule
from .context import IDLE_CATEGORIES, RuleContext
from .sqlutil import fmt_ns, pct

# The measure stage's idle gaps (the sweep's maximal stretches with nothing resident, sql/stretches.sql) that are
# long enough; a gap that opens the window (before its first kernel) counts too.
GAPS_SQL = """
SELECT rank, device, start_ns, end_ns FROM rule_idle_gaps WHERE end_ns - start_ns >= $min_gap"""


@rule("PR504", name="gpu-idle-gap", layer="host", title="The GPU sits idle in long gaps", category=None,
      thresholds={"min_gap_ms": 1.0, "max_gaps": 5})
def gpu_idle_gap(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    """
    ## What it detects
    Stretches of at least `min_gap_ms` with no kernel or copy on a GPU inside the analysed window (the measure
    stage's `idle_gaps`, the same gaps the waterfall names), the largest listed with what the host was doing: the
    op running on the host during the gap, or a range that covers it and is not much longer (a `late_rank_sleep`,
    a DataLoader step), the op it had just finished, and how the waterfall classed the idle time (start-up, sync
    stall, input-bound, launch-bound, host other). "Nothing traced" means Python code outside PyTorch ops and
    ranges — a `sleep`, I/O, logging, checkpointing, a Python-side data pipeline.

    ## Why it costs peak
    An idle GPU achieves nothing; long gaps add directly to the step time. Utilization shows them, but not
    their cause.

    ## How to fix
    Keep work queued on the GPU while the host is busy: move host work (logging, checkpointing, metrics,
    evaluation) off the training step or into another thread/process, prefetch the next batch, avoid syncs
    before long host work (see PR502), and overlap I/O with compute.

    ## Example
    `GPU idle 204 ms in 10 gaps ≥ 1 ms (largest 20.5 ms, after aten::item; nothing traced on the host)`.
    """
    params = {"min_gap": t.min_gap_ms * 1e6}
    gaps = ctx.rows(f"SELECT * FROM ({GAPS_SQL}) ORDER BY end_ns - start_ns DESC, start_ns", params)
    if not gaps:
        return
    total = sum(g["end_ns"] - g["start_ns"] for g in gaps)
    lost = ctx.lost_fraction(f"SELECT rank, device, start_ns, end_ns FROM ({GAPS_SQL})", IDLE_CATEGORIES,
                             params=params)
    top = gaps[: int(t.max_gaps)]
    values = ", ".join(f"({i}, {'NULL' if g['rank'] is None else int(g['rank'])}::INTEGER, {int(g['device'])}, "
                       f"{int(g['start_ns'])}::BIGINT, {int(g['end_ns'])}::BIGINT)" for i, g in enumerate(top))
    gv = f"(SELECT * FROM (VALUES {values}) v(i, rank, device, start_ns, end_ns))"
    during: dict[int, list[dict[str, Any]]] = {}
    for r in ctx.rows(f"""
            SELECT g.i, o.name, sum(least(o.end_ns, g.end_ns) - greatest(o.start_ns, g.start_ns)) AS ns
            FROM {gv} g JOIN rule_ops o ON o.rank IS NOT DISTINCT FROM g.rank AND o.depth = 0
             AND o.start_ns < g.end_ns AND o.end_ns > g.start_ns
            GROUP BY g.i, o.name ORDER BY ns DESC"""):
        during.setdefault(r["i"], []).append(r)
    # The innermost range covering each gap; one not much longer than the gap (at most twice) names what the host
    # was doing (a `late_rank_sleep`, a DataLoader step), an enclosing phase does not.
    covering = ctx.rows(f"""
            SELECT g.i, arg_max(x.name, x.start_ns) AS name,
                   arg_max(x.name, x.start_ns) FILTER (WHERE x.end_ns - x.start_ns <= 2 * (g.end_ns - g.start_ns))
                       AS tight
            FROM {gv} g JOIN rule_ranges x
              ON x.rank IS NOT DISTINCT FROM g.rank AND NOT x.on_gpu AND x.name NOT LIKE 'ProfilerStep#%'
             AND x.domain IS DISTINCT FROM 'python'
             AND x.start_ns <= g.start_ns AND x.end_ns >= g.end_ns
            GROUP BY g.i""")
    ranges = {r["i"]: r["name"] for r in covering}
    naming = {r["i"]: r["tight"] for r in covering if r["tight"]}
    before = {r["i"]: r["name"] for r in ctx.rows(f"""
            SELECT g.i, o.name FROM {gv} g ASOF JOIN (SELECT * FROM rule_ops WHERE depth = 0) o
              ON o.rank IS NOT DISTINCT FROM g.rank AND o.start_ns <= g.start_ns""")}
    cats: dict[int, dict[str, float]] = {}
    for r in ctx.rows(f"""
            SELECT g.i, l.category, sum(l.lost_ns * (least(l.end_ns, g.end_ns) - greatest(l.start_ns, g.start_ns))
                                        / (l.end_ns - l.start_ns)) AS ns
            FROM {gv} g JOIN rule_losses l ON l.rank IS NOT DISTINCT FROM g.rank AND l.device = g.device
             AND l.start_ns < g.end_ns AND l.end_ns > g.start_ns AND l.end_ns > l.start_ns
            GROUP BY g.i, l.category ORDER BY ns DESC"""):
        cats.setdefault(r["i"], {})[r["category"]] = r["ns"]
    listed = []
    for i, g in enumerate(top):
        dur = g["end_ns"] - g["start_ns"]
        busy_ops = [d["name"] for d in during.get(i, []) if d["ns"] >= 0.1 * dur][:2]
        rng = naming.get(i)
        host = (f"host in {', '.join(busy_ops)}" if busy_ops else f"host in range {rng}" if rng
                else "nothing traced on the host")
        listed.append({"rank": g["rank"], "device": g["device"], "start_ns": g["start_ns"], "duration_ns": dur,
                       "host_ops": busy_ops, "after_op": before.get(i), "range": ranges.get(i),
                       "categories": cats.get(i, {}), "host": host})
    big = listed[0]
    ctx_text = (f", after {big['after_op']}" if big["after_op"] else "") + f"; {big['host']}"
    lines = "; ".join(f"{fmt_ns(x['duration_ns'])}" + (f" on rank {x['rank']}" if len(ctx.rank_window_ns) > 1 else "")
                      + (f" in {x['range']}" if x["range"] else "") + (f" after {x['after_op']}" if x["after_op"] else "")
                      + f" ({x['host']})" for x in listed)
    rec = (f"{len(gaps)} gaps of at least {t.min_gap_ms:g} ms leave the GPU idle {fmt_ns(total)} "
           f"({pct(ctx.fraction(total))} of the window). Largest: {lines}. Keep work queued while the host is busy: "
           "move logging / checkpointing / evaluation off the step or to another thread, prefetch inputs, and avoid "
           "host syncs right before long host work (PR502).")
    yield Finding(
        title=f"GPU idle {fmt_ns(total)} in {len(gaps)} gap{'s' if len(gaps) != 1 else ''} ≥ {t.min_gap_ms:g} ms "
              f"(largest {fmt_ns(big['duration_ns'])}{ctx_text})",
        recommendation=rec, lost_fraction=lost,
        fix=f"fill {len(gaps)} idle gap{'s' if len(gaps) != 1 else ''} ({fmt_ns(total)}): keep the GPU fed",
        key="gaps", evidence={"gaps": listed, "gap_count": len(gaps), "idle_ns": total, "min_gap_ns": params["min_gap"]})
