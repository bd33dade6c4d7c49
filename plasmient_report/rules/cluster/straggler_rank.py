"""PR101 straggler-rank: which rank arrives last to collectives, how late, to which share, and what its
peers lose waiting (the waterfall's `collective_wait`)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from ..advice import warm_up_profile
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        For every collective seen on two or more ranks (same process group, collective and sequence number), the
        rank that arrives last — the one whose kernel waits least — and how long the first to arrive waits for it (its
        *lateness*: the longest member's duration above the shortest, the waterfall's own measure of the wait, from
        the measurement library's `collective_members`). Per rank: the share of collectives it is last to (by at least
        `min_lateness_us`), its mean / worst lateness, the worst lateness per step, and the time its peers spend
        waiting for it. Point-to-point traffic is left to PR201.""",
    why_is_this_bad="""
        A collective cannot finish before its last rank joins: every other rank's communication kernel spins, doing
        no useful work, until then. One slow rank therefore costs its lateness on *every* other rank — the
        waterfall's `collective_wait`. At scale it is often the largest loss of all.""",
    example="""
        `rank 1 is late to 100% of all-reduces (20 of 20), by 8.4 ms on average (worst 30.1 ms)` — rank 0 waits
        33.5 ms per step (rank 1 sleeps 30 ms before each backward).""",
    how_to_fix="""
        Look at what the late rank does just before the collective: uneven work (bigger batch, longer sequences,
        more experts), host work only it does (logging, checkpointing, evaluation, a `sleep`), a slow data
        loader, or a slower / throttled GPU. Balance the work, move rank-specific work off the step, or fix the
        GPU. A single huge lateness at the very first collective (more than `startup_skew_share` of the rank's
        lateness) is start-up skew, not a straggler: profile after a warm-up step, or start the profiled region
        after a barrier.""",
)

# One row per collective instance (the measure stage's collective_members: same key, collective, sequence number)
# seen on ≥ 2 ranks, and one row per punctual rank's wait in it — the waterfall's own definition of the wait:
# its duration above the instance's shortest, from its kernel start. The last rank is the one that waited least.
WAITS_SQL = """
WITH c AS (
    SELECT rank, device, kernel_id, key AS pg, collective, seq, start_ns, end_ns, bytes, dur_ns, wait_ns
    FROM rule_collective_members
    WHERE collective IS NOT NULL AND kind <> 'p2p'
), inst AS (
    SELECT pg, collective, seq, count(DISTINCT rank) AS n, arg_min(rank, dur_ns) AS last_rank,
           max(start_ns) AS last_start, min(start_ns) AS first_start, max(wait_ns) AS lateness_ns
    FROM c GROUP BY pg, collective, seq HAVING count(DISTINCT rank) > 1
), waits AS (
    SELECT i.*, c.rank AS waiter, c.device, c.start_ns AS w_start, c.start_ns + c.wait_ns AS w_end
    FROM inst i JOIN c USING (pg, collective, seq) WHERE c.rank IS DISTINCT FROM i.last_rank AND c.wait_ns > 0
)"""

PLURAL = {
    "allreduce": "all-reduces",
    "all_reduce": "all-reduces",
    "all_gather": "all-gathers",
    "_allgather_base": "all-gathers",
    "allgather_into_tensor_coalesced": "all-gathers",
    "all_gather_into_tensor": "all-gathers",
    "reduce_scatter": "reduce-scatters",
    "_reduce_scatter_base": "reduce-scatters",
    "reduce_scatter_tensor": "reduce-scatters",
    "broadcast": "broadcasts",
    "all_to_all": "all-to-alls",
    "alltoall": "all-to-alls",
    "alltoall_base": "all-to-alls",
    "reduce": "reduces",
    "barrier": "barriers",
}


@rule(
    title="A rank arrives late to collectives",
    category="collective_wait",
    explanation=EXPLANATION,
    thresholds={"min_lateness_us": 20.0, "startup_skew_share": 0.8},
)
def straggler_rank(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    min_late = t.min_lateness_us * 1e3
    per_rank = ctx.rows(
        f"""{WAITS_SQL}
        , mine AS (
            SELECT c.rank, count(*) AS n_total FROM c JOIN inst USING (pg, collective, seq) GROUP BY c.rank
        )
        SELECT i.last_rank AS rank, min(m.n_total) AS n_total, count(*) AS n_late,
               avg(lateness_ns) AS mean_ns, median(lateness_ns) AS median_ns, max(lateness_ns) AS max_ns,
               -- (the worst instance: of equally late ones the first; its collective and seq from one row)
               sum(lateness_ns) AS sum_ns, arg_max(collective, (lateness_ns, -last_start, seq)) AS worst_collective,
               arg_max(seq, (lateness_ns, -last_start, seq)) AS worst_seq,
               list(DISTINCT collective ORDER BY collective) AS collectives,
               arg_max(collective || '#' || seq, (lateness_ns, -last_start, seq)) AS worst_id,
               arg_min(collective || '#' || seq, (last_start, collective, seq)) AS first_id
        FROM inst i JOIN mine m ON m.rank IS NOT DISTINCT FROM i.last_rank
        WHERE lateness_ns >= ?
        GROUP BY i.last_rank ORDER BY sum(lateness_ns) DESC, i.last_rank""",
        [min_late],
    )
    if not per_rank:
        return
    intervals = f"""{WAITS_SQL}
        SELECT last_rank AS key, waiter AS rank, device, w_start AS start_ns, w_end AS end_ns FROM waits
        WHERE lateness_ns >= ?"""
    lost = ctx.lost_ns(intervals, ["collective_wait"], params=[min_late])
    waiters: dict[int | None, list[dict[str, Any]]] = {}
    for w in ctx.rows(
        f"""{WAITS_SQL}
            SELECT last_rank, waiter, sum(w_end - w_start) AS wait_ns FROM waits WHERE lateness_ns >= ?
            GROUP BY ALL ORDER BY wait_ns DESC, last_rank, waiter""",
        [min_late],
    ):
        waiters.setdefault(w["last_rank"], []).append(w)
    # Worst lateness per step on the late rank, the step found from the kernel's launch time (CPU side).
    steps: dict[int | None, list[float]] = {}
    for s in ctx.rows(
        f"""{WAITS_SQL}
            , late AS (
                SELECT DISTINCT i.last_rank, i.lateness_ns, coalesce(a.launch_start_ns, c.start_ns) AS launch_ns
                FROM inst i JOIN c ON c.pg = i.pg AND c.collective = i.collective AND c.seq = i.seq
                                  AND c.rank IS NOT DISTINCT FROM i.last_rank
                LEFT JOIN kernel_launch a ON a.kernel_id = c.kernel_id
                WHERE i.lateness_ns >= ?
            )
            SELECT l.last_rank, s.name AS step, max(l.lateness_ns) AS worst_ns
            FROM late l ASOF JOIN rule_steps s ON s.rank IS NOT DISTINCT FROM l.last_rank AND s.start_ns <= l.launch_ns
            WHERE l.launch_ns <= s.end_ns
            GROUP BY ALL""",
        [min_late],
    ):
        steps.setdefault(s["last_rank"], []).append(s["worst_ns"])
    for r in per_rank:
        rank = r["rank"]
        lost_ns = lost.get(rank, 0.0)
        share = r["n_late"] / r["n_total"] if r["n_total"] else 0.0
        colls = sorted(r["collectives"] or [])
        label = PLURAL.get(colls[0], f"{colls[0]}s") if len(colls) == 1 else "collectives"
        waits = waiters.get(rank, [])
        wait_total = sum(w["wait_ns"] for w in waits)
        step_worst = steps.get(rank, [])
        per_step_worst = statistics.median(step_worst) if step_worst else None
        # One huge lateness at the rank's first late collective: the ranks started apart.
        startup = r["max_ns"] >= t.startup_skew_share * r["sum_ns"] and r["worst_id"] == r["first_id"]
        who = [w["waiter"] for w in waits]
        others = (
            f"rank {who[0]} waits"
            if len(who) == 1
            else f"ranks {', '.join(map(str, who[:6]))}{'…' if len(who) > 6 else ''} wait"
            if who
            else "its peers wait"
        )
        evidence = {
            "late_rank": rank,
            "collectives_total": r["n_total"],
            "collectives_late": r["n_late"],
            "late_share": share,
            "collectives": colls,
            "mean_lateness_ns": r["mean_ns"],
            "median_lateness_ns": r["median_ns"],
            "max_lateness_ns": r["max_ns"],
            "worst_collective": {"collective": r["worst_collective"], "seq": r["worst_seq"]},
            "lateness_per_step_ns": per_step_worst,
            "steps_seen": len(step_worst),
            "wait_caused_ns": wait_total,
            "wait_caused_per_step_ns": ctx.per_step(wait_total) if ctx.step_unit else None,
            "waiting_ranks": [
                {
                    "rank": w["waiter"],
                    "wait_ns": w["wait_ns"],
                    "collective_wait_fraction_of_rank_window": w["wait_ns"] / ctx.rank_window_ns[w["waiter"]]
                    if ctx.rank_window_ns.get(w["waiter"])
                    else None,
                }
                for w in waits
            ],
            "startup_skew": startup,
            "min_lateness_ns": min_late,
        }
        how_late = f"by {fmt_ns(r['mean_ns'])} on average (worst {fmt_ns(r['max_ns'])})"
        if per_step_worst is not None and ctx.step_unit == "step":
            how_late += f", {fmt_ns(per_step_worst)} per step at its worst collective"
        title = f"rank {rank} is late to {pct(share)} of {label} ({r['n_late']} of {r['n_total']}), {how_late}"
        if startup:
            fix = f"start-up skew: rank {rank} joined the first collective {fmt_ns(r['max_ns'])} late"
            rec = (
                f"Almost all of rank {rank}'s lateness ({fmt_ns(r['max_ns'])} of {fmt_ns(r['sum_ns'])}) is its "
                f"first {r['worst_collective']}: the ranks started apart ({others} {fmt_ns(wait_total)} in all). "
                f"That is start-up skew, not a recurring straggler: {warm_up_profile(ctx.program)} — or start "
                "the profiled region after a barrier — then look again."
            )
        else:
            fix = f"rank {rank} is late to {pct(share)} of {label}" + (
                f" ({fmt_ns(per_step_worst)}/step)" if per_step_worst is not None and ctx.step_unit == "step" else ""
            )
            per = f" ({fmt_ns(ctx.per_step(wait_total))} {ctx.per_step_text()})" if ctx.step_unit else ""
            rec = (
                f"Rank {rank} reaches {pct(share)} of its {label} late, {how_late}; {others} "
                f"{fmt_ns(wait_total)} for it in all{per}. The cause runs on rank {rank} before those "
                "collectives: look at its host timeline for work the others don't do (data loading, logging, "
                "checkpointing, a sleep), uneven batch or sequence sizes, or a slower / throttled GPU; balance "
                f"the work or move rank-{rank}-only work off the step."
            )
        yield Finding(
            title=title,
            recommendation=rec,
            fix=fix,
            lost_fraction=ctx.fraction(lost_ns),
            rank=rank,
            key=f"rank {rank}",
            evidence=evidence,
        )
