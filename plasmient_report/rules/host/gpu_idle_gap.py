"""PR504 gpu-idle-gap: the largest stretches with no kernel on a GPU, and what its host was doing meanwhile — the op,
the range that covers the gap (a DataLoader step, a `late_rank_sleep`), the sync before it, how the waterfall
classed it. One-time start-up gaps are named as such, apart from the gaps a steady state would repeat."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from ...vocab import (
    DATALOADER_RE,
    LAUNCH_API_RE,
    PROFILER_PREFIX,
    STREAM_WAIT_API_RE,
    SYNC_API_RE,
    SYNC_TOLERANCE_NS,
)
from ..advice import warm_up_profile
from ..base import Explanation, Finding, Thresholds, rule
from ..context import IDLE_CATEGORIES, RuleContext, range_joins, residual
from ..text import fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        Stretches of at least `min_gap_ms` with no kernel or copy on a GPU inside the analysed window (the
        measurement library's `idle_gaps`, the same gaps the waterfall names), the largest `max_gaps` listed with
        what the host was doing: the top-level op running on the host during the gap, else the range that covers
        most of it (at least `range_cover` of the gap) and is not much longer than it (a `late_rank_sleep`, a
        DataLoader step), else the ranges inside it that cover at least a tenth of it (`host in range MPI_Recv,
        MPI_Send for 30% of it, the rest not traced`), a runtime call that takes most of it (a blocking free: `in
        cudaFree for 100% of it`, with the caching allocator's advice when most gaps are in the allocator), the op it
        had just finished, and how the waterfall classed the idle time (start-up, sync stall, input-bound,
        launch-bound, host other). "Nothing traced on the host" means the host ran code
        outside any traced op, call or range — a `sleep`, I/O, logging, a Python-side pipeline. Gaps the waterfall
        calls `startup` (context creation, module loading, `cudaFree`, first allocations, the profiler's own set-up:
        CUPTI's activity buffer requests, named `profiler: …`), and gaps spent in launch
        calls longer than `slow_launch_ms` (a kernel's first launch loads its module: lazy loading, JIT), are
        reported apart, as the one-time cost they are — never as launch overhead or gaps to fill. A gap whose next
        kernel was already queued (its launch had returned more than a launch's latency before it ran) is said to be
        a wait on work the trace does not hold — another process, an uncaptured stream or event — not host time.
        The innermost op under most of a gap is named after the top-level one (`aten::linear → aten::addmm`); when
        it is that op's first call with its input shapes and took many times its later calls' median, the gap is
        its first-call cost (a library choosing and loading a kernel for a new shape: one-time, profile after
        warm-up).""",
    why_is_this_bad="""
        An idle GPU achieves nothing; long gaps add directly to the step time. Utilization shows them, but not
        their cause. One-time start-up is not a steady-state cost: it only says the profiled region began too
        early.""",
    example="""
        `GPU idle 204 ms in 10 gaps ≥ 1 ms (largest 20.5 ms, after aten::item; nothing traced on the host)`.""",
    how_to_fix="""
        Keep work queued on the GPU while the host is busy: move host work (logging, checkpointing, metrics,
        evaluation) off the training step or into another thread/process, prefetch the next batch, avoid syncs
        before long host work (see PR502), and overlap I/O with compute. Start-up gaps: profile after warm-up, or
        analyse a `--range` that excludes set-up. First calls with new shapes: warm up every shape before the
        profiled (or served) region.""",
)

# The measurement library's idle gaps (the sweep's maximal stretches with nothing resident, sql/stretches.sql)
# that are long enough; a gap that opens the window (before its first kernel) counts too.
GAPS_SQL = """
SELECT rank, device, start_ns, end_ns, pending_ns FROM rule_idle_gaps WHERE end_ns - start_ns >= $min_gap"""
# Device-allocator calls (a free synchronizes the device; an allocation may too).
ALLOCATOR_CALL_RE = r"(?i)(free|malloc|memalloc|memcreate)"
# A runtime call covering at least this share of a gap is named as what the host was in.
CALL_SHARE = 0.3
# Ranges inside a gap that cover at least this share of it, though none covers `range_cover`, are named for that
# share ("host in range MPI_Recv, MPI_Send for 30% of it, the rest not traced"), not "nothing traced".
PARTIAL_SHARE = 0.1
# Where a gap's idle time is start-up for at least this share, the gap is a start-up gap.
STARTUP_SHARE = 0.5
# The innermost op that covers at least this share of a gap is named with the top-level one ("aten::linear →
# aten::addmm"). It is its first call, a one-time cost (a library's heuristics, workspace and kernel loading for a
# new shape), when it is the first of its name and input shapes (recorded) on its rank, at least FIRST_CALL_LATER later calls
# exist, and it took at least FIRST_CALL_RATIO times their median.
INNER_OP_SHARE = 0.5
FIRST_CALL_LATER = 2
FIRST_CALL_RATIO = 5.0
# The innermost op under at least INNER_OP_SHARE of each gap (not an annotation: ProfilerStep#N is no op to
# name; of equally deep ones on several threads the one under more of the gap, then the first recorded), with how
# its call compares with the later calls of the same name and shapes on its rank (the whole trace's ops: a
# --range's first call may not be the trace's).
INNER_OPS_SQL = """
WITH c AS (
    SELECT g.i, arg_max(o.op_id, (o.depth, least(o.end_ns, g.end_ns) - greatest(o.start_ns, g.start_ns), -o.op_id))
               AS op_id
    FROM (SELECT * FROM _gaps WHERE i IN (SELECT unnest($ids::BIGINT[]))) g
    JOIN rule_ops o ON o.rank IS NOT DISTINCT FROM g.rank AND o.start_ns < g.end_ns AND o.end_ns > g.start_ns
    WHERE least(o.end_ns, g.end_ns) - greatest(o.start_ns, g.start_ns) >= $share * (g.end_ns - g.start_ns)
      AND o.name IS NOT NULL AND NOT is_annotation_op(o.name)
    GROUP BY g.i
), me AS (SELECT c.i, o.* FROM c JOIN ops o USING (op_id))
SELECT me.i, me.name, me.end_ns - me.start_ns AS ns, me.input_dims IS NOT NULL AS shaped,
       count(p.op_id) FILTER (WHERE p.start_ns < me.start_ns) AS earlier,
       count(p.op_id) FILTER (WHERE p.start_ns > me.start_ns) AS later,
       median(p.end_ns - p.start_ns) FILTER (WHERE p.start_ns > me.start_ns) AS later_ns
FROM me LEFT JOIN ops p ON p.rank IS NOT DISTINCT FROM me.rank AND p.name = me.name
 AND p.input_dims IS NOT DISTINCT FROM me.input_dims AND p.op_id <> me.op_id
GROUP BY me.i, me.name, me.start_ns, me.end_ns, me.input_dims"""


@rule(
    title="The GPU sits idle in long gaps",
    category=None,
    thresholds={"min_gap_ms": 1.0, "max_gaps": 5, "range_cover": 0.5, "slow_launch_ms": 1.0},
    explanation=EXPLANATION,
)
def gpu_idle_gap(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    params = {"min_gap": t.min_gap_ms * 1e6}
    gaps = ctx.rows(f"SELECT * FROM ({GAPS_SQL}) ORDER BY end_ns - start_ns DESC, start_ns", params)
    if not gaps:
        return
    ctx.con.execute(
        "CREATE TABLE _gaps AS SELECT row_number() OVER () - 1 AS i, * FROM (SELECT * FROM "
        f"({GAPS_SQL}) ORDER BY end_ns - start_ns DESC, start_ns)",
        params,
    )
    cats: dict[int, dict[str, float]] = {}
    # every gap against the losses it overlaps: a range join, the GPU a filter (both grow with the trace)
    with range_joins(ctx.con):
        overlaps = ctx.rows(f"""
            SELECT g.i, l.category, sum(l.lost_ns * (least(l.end_ns, g.end_ns) - greatest(l.start_ns, g.start_ns))
                                        / (l.end_ns - l.start_ns)) AS ns
            FROM _gaps g JOIN (SELECT * FROM rule_losses WHERE end_ns > start_ns) l
              ON l.start_ns < g.end_ns AND l.end_ns > g.start_ns
             AND {residual("l.rank IS NOT DISTINCT FROM g.rank AND l.device = g.device")}
            GROUP BY g.i, l.category ORDER BY ns DESC, l.category""")
    for r in overlaps:
        cats.setdefault(r["i"], {})[r["category"]] = r["ns"]

    # A launch call far longer than a launch, while the GPU idles, is the driver loading the kernel's module (lazy
    # loading, JIT) at its first use: a one-time cost, whatever the waterfall's launch_bound says of it.
    slow: dict[int, float] = {
        r["i"]: r["ns"]
        for r in ctx.rows(
            """
            SELECT g.i, sum(least(a.end_ns, g.end_ns) - greatest(a.start_ns, g.start_ns)) AS ns
            FROM _gaps g JOIN rule_api_calls a ON a.rank IS NOT DISTINCT FROM g.rank
             AND a.start_ns < g.end_ns AND a.end_ns > g.start_ns AND a.end_ns - a.start_ns >= ?
             AND regexp_matches(a.name, ?)
            GROUP BY g.i""",
            [t.slow_launch_ms * 1e6, LAUNCH_API_RE],
        )
    }

    def is_startup(i: int) -> bool:
        c = cats.get(i, {})
        total = sum(c.values())
        g = gaps[i]
        # a gap whose next kernel was queued for most of it waited on work the trace does not hold, whatever the
        # host was setting up meanwhile: the steady finding says so ("profile after warm-up" would not remove it)
        if g["pending_ns"] and g["pending_ns"] >= 0.5 * (g["end_ns"] - g["start_ns"]):
            return False
        return total > 0 and c.get("startup", 0.0) + min(slow.get(i, 0.0), c.get("launch_bound", 0.0)) >= STARTUP_SHARE * total

    startup = [dict(g, i=i) for i, g in enumerate(gaps) if is_startup(i)]
    steady = [dict(g, i=i) for i, g in enumerate(gaps) if not is_startup(i)]
    listed = _describe(ctx, t, steady[: int(t.max_gaps)] + startup[: int(t.max_gaps)], cats, {g["i"] for g in startup}, slow)
    if steady:
        yield _steady_finding(ctx, t, steady, [x for x in listed if not x["startup"]], startup)
    if startup:
        yield _startup_finding(ctx, t, startup, [x for x in listed if x["startup"]])


def _describe(
    ctx: RuleContext,
    t: Thresholds,
    top: list[dict[str, Any]],
    cats: dict[int, dict[str, float]],
    startup: set[int],
    slow: dict[int, float],
) -> list[dict[str, Any]]:
    """What the host did in each listed gap: ops, the covering range, the op before, set-up calls, categories."""
    if not top:
        return []
    ids = [g["i"] for g in top]
    # the host's top-level ops: outermost, annotations (ProfilerStep#N, compiled regions, `## … ##`) looked through —
    # an op that is no annotation and has no parent that is none either. The pattern is tested once per distinct op
    # name (a trace has tens of names for 100 k ops), not per op.
    ctx.con.execute(
        """
        CREATE TABLE _top_ops AS
        WITH n AS (SELECT name, is_annotation_op(name) AS ann FROM (SELECT DISTINCT name FROM rule_ops))
        SELECT o.rank, o.name, o.start_ns, o.end_ns
        FROM rule_ops o JOIN n ON n.name = o.name AND NOT n.ann
        ANTI JOIN (SELECT p.op_id FROM rule_ops p LEFT JOIN n ON n.name = p.name WHERE n.ann IS NOT TRUE) p
          ON p.op_id = o.parent_op_id"""
    )
    during: dict[int, list[dict[str, Any]]] = {}
    for r in ctx.rows(
        """
            SELECT g.i, o.name, sum(least(o.end_ns, g.end_ns) - greatest(o.start_ns, g.start_ns)) AS ns
            FROM _gaps g JOIN _top_ops o ON o.rank IS NOT DISTINCT FROM g.rank
             AND o.start_ns < g.end_ns AND o.end_ns > g.start_ns
            WHERE g.i IN (SELECT unnest(?::BIGINT[]))
            GROUP BY g.i, o.name ORDER BY ns DESC, o.name""",
        [ids],
    ):
        during.setdefault(r["i"], []).append(r)
    # The range that covers most of the gap (at least `range_cover` of it) names what the host was doing when it
    # is not much longer than the gap (at most twice: a `late_rank_sleep`, a DataLoader step); a longer range that
    # encloses the gap is only where it happened (a phase).
    covering = {
        r["i"]: r
        for r in ctx.rows(
            """
            WITH x AS (
                SELECT g.i, x.name, x.start_ns AS xs, x.end_ns - x.start_ns AS x_ns, g.end_ns - g.start_ns AS g_ns,
                       least(x.end_ns, g.end_ns) - greatest(x.start_ns, g.start_ns) AS ov,
                       x.start_ns <= g.start_ns AND x.end_ns >= g.end_ns AS encloses
                FROM _gaps g JOIN (
                    SELECT rank, name, start_ns, end_ns, on_gpu, domain FROM rule_ranges
                    -- (torch <= 1.9 records the DataLoader's __next__ as an op)
                    UNION ALL SELECT rank, name, start_ns, end_ns, false, NULL FROM rule_ops
                    WHERE regexp_matches(name, ?)) x
                  ON x.rank IS NOT DISTINCT FROM g.rank AND NOT x.on_gpu AND x.name NOT LIKE 'ProfilerStep#%'
                 AND x.domain IS DISTINCT FROM 'python' AND x.start_ns < g.end_ns AND x.end_ns > g.start_ns
                WHERE g.i IN (SELECT unnest(?::BIGINT[]))
            )
            SELECT i, arg_max(name, xs) FILTER (WHERE encloses) AS enclosing,
                   arg_max(name, ov * 1e6 - x_ns / 1e6)
                       FILTER (WHERE ov >= ? * g_ns AND x_ns <= 2 * g_ns) AS tight,
                   max(ov / g_ns) FILTER (WHERE ov >= ? * g_ns AND x_ns <= 2 * g_ns) AS tight_cover
            FROM x GROUP BY i""",
            [DATALOADER_RE, ids, t.range_cover, t.range_cover],
        )
    }
    # Ranges no longer than a gap that cover part of it (an MPI_Recv, an MPI_Send) name what the host did for that
    # part; longer ones (a phase, a step, an optimizer range that began in the gap) say nothing of it.
    partial: dict[int, list[dict[str, Any]]] = {}
    for r in ctx.rows(
        """
            SELECT g.i, x.name, sum(least(x.end_ns, g.end_ns) - greatest(x.start_ns, g.start_ns)) AS ns
            FROM (SELECT * FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[]))) g
            JOIN rule_ranges x ON x.rank IS NOT DISTINCT FROM g.rank AND NOT x.on_gpu
             AND x.name NOT LIKE 'ProfilerStep#%' AND x.domain IS DISTINCT FROM 'python'
             AND x.start_ns < g.end_ns AND x.end_ns > g.start_ns AND x.end_ns - x.start_ns <= g.end_ns - g.start_ns
            GROUP BY g.i, x.name ORDER BY ns DESC, x.name""",
        [ids],
    ):
        partial.setdefault(r["i"], []).append(r)
    before = {
        r["i"]: r["name"]
        for r in ctx.rows(
            """
            SELECT g.i, o.name FROM (SELECT * FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[]))) g
            ASOF JOIN _top_ops o ON o.rank IS NOT DISTINCT FROM g.rank AND o.start_ns <= g.start_ns""",
            [ids],
        )
    }
    # a gap whose next kernel had been launched long before it ended: the GPU idled with work queued (waiting on
    # another process, an uncaptured stream or event) — what the host did meanwhile is not the cause
    queued = {g["i"]: g["pending_ns"] for g in top if g["pending_ns"]}
    # ... and a stream-wait call made in the gap before that kernel was queued names what it waited behind
    waits = {
        r["i"]: r["name"]
        for r in ctx.rows(
            """
            SELECT g.i, arg_max(a.name, a.end_ns) AS name
            FROM (SELECT * FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[])) AND pending_ns > 0) g
            JOIN rule_api_calls a ON a.rank IS NOT DISTINCT FROM g.rank AND regexp_matches(a.name, ?)
             AND a.end_ns >= g.start_ns - ? AND a.end_ns <= g.end_ns - g.pending_ns
            GROUP BY g.i""",
            [ids, STREAM_WAIT_API_RE, SYNC_TOLERANCE_NS],
        )
    }
    # a runtime call that takes most of the gap (a blocking free, a device query) is what the host was in; or the
    # profiler's own overhead record (CUPTI requesting an activity buffer mid-run), named `profiler: NAME`
    calls: dict[int, tuple[str, float]] = {}
    for r in ctx.rows(
        """
            SELECT g.i, a.name, sum(least(a.end_ns, g.end_ns) - greatest(a.start_ns, g.start_ns)) AS ns
            FROM (SELECT * FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[]))) g
            JOIN (SELECT rank, name, start_ns, end_ns FROM rule_api_calls a
                  -- OS calls only of the threads that call CUDA / HIP (a driver helper thread's poll is not what
                  -- the program was doing)
                  WHERE kind IS DISTINCT FROM 'osrt' OR EXISTS (
                      SELECT 1 FROM rule_api_calls c WHERE c.kind IS DISTINCT FROM 'osrt'
                      AND c.rank IS NOT DISTINCT FROM a.rank AND c.pid IS NOT DISTINCT FROM a.pid AND c.thread = a.thread)
                  UNION ALL SELECT rank, ? || name, start_ns, end_ns FROM profiler_overhead) a
              ON a.rank IS NOT DISTINCT FROM g.rank AND a.start_ns < g.end_ns AND a.end_ns > g.start_ns
            GROUP BY g.i, a.name ORDER BY ns DESC, a.name""",
        [ids, PROFILER_PREFIX],
    ):
        calls.setdefault(r["i"], (r["name"], r["ns"]))
    inner = {r["i"]: r for r in ctx.rows(INNER_OPS_SQL, {"ids": ids, "share": INNER_OP_SHARE})}
    setup: dict[int, list[str]] = {}
    for r in ctx.rows(
        """
            SELECT g.i, h.name, sum(least(h.end_ns, g.end_ns) - greatest(h.start_ns, g.start_ns)) AS ns
            FROM _gaps g JOIN host_activity h ON h.rank IS NOT DISTINCT FROM g.rank AND h.kind = 'startup'
             AND h.start_ns < g.end_ns AND h.end_ns > g.start_ns
            WHERE g.i IN (SELECT unnest(?::BIGINT[]))
            GROUP BY g.i, h.name ORDER BY ns DESC, h.name""",
        [ids],
    ):
        setup.setdefault(r["i"], []).append(r["name"])
    out = []
    for g in top:
        i = g["i"]
        dur = g["end_ns"] - g["start_ns"]
        busy_ops = [d["name"] for d in during.get(i, []) if d["ns"] >= 0.1 * dur][:2]
        cov = covering.get(i, {})
        rng = cov.get("tight")
        call, call_ns = calls.get(i, (None, 0.0))
        blocked = bool(call and call_ns >= CALL_SHARE * dur and re.search(SYNC_API_RE, call))
        op = inner.get(i)
        first = bool(
            op
            and op["shaped"]  # (without shapes the later calls may be other, cheaper work)
            and op["earlier"] == 0
            and op["later"] >= FIRST_CALL_LATER
            and op["later_ns"]
            and op["ns"] >= FIRST_CALL_RATIO * op["later_ns"]
            # (an op slow because it waited on the GPU — a blocking copy, the next kernel queued — is not set-up)
            and not blocked
            and queued.get(i, 0.0) < 0.5 * dur
        )
        if op and busy_ops and op["name"] not in busy_ops:
            busy_ops = [f"{busy_ops[0]} → {op['name']}", *busy_ops[1:]]
        host = f"host in {', '.join(busy_ops)}" if busy_ops else f"host in range {rng}" if rng else "nothing traced on the host"
        part = partial.get(i, [])
        part_ns = min(float(sum(p["ns"] for p in part)), float(dur))  # (ranges of one thread may nest: at most all)
        if not busy_ops and not rng and part_ns >= PARTIAL_SHARE * dur:
            names = ", ".join(dict.fromkeys(p["name"] for p in part[:3]))
            host = f"host in range {names} for {pct(part_ns / dur)} of it, the rest not traced"
        if first and op:
            host += (
                f", its first call with these shapes ({fmt_ns(op['ns'])}; {op['later']:,} later: {fmt_ns(op['later_ns'])} median)"
            )
        if call and call_ns >= CALL_SHARE * dur:
            host = (f"{host}, " if busy_ops or rng else "host ") + f"in {call} for {pct(call_ns / dur)} of it"
        if queued.get(i, 0.0) >= 0.5 * dur:
            behind = f", behind a {waits[i]}" if i in waits else ""
            host = (
                f"its next kernel queued {fmt_ns(queued[i])} before it ran{behind}: the GPU waited on work the trace "
                f"does not hold ({host})"
            )
        c = cats.get(i, {})
        out.append(
            {
                "rank": g["rank"],
                "device": g["device"],
                "start_ns": g["start_ns"],
                "duration_ns": dur,
                "host_ops": busy_ops,
                "after_op": before.get(i),
                "range": rng or cov.get("enclosing"),
                "covering_range": rng,
                "range_cover": cov.get("tight_cover") if rng else None,
                "categories": c,
                "main_category": max(c, key=lambda k: c[k]) if c else None,
                "startup_calls": setup.get(i, [])[:3],
                "slow_launch_ns": slow.get(i, 0.0),
                "startup": i in startup,
                "host": host,
                "queued_ns": queued.get(i),
                "host_call": call if call and call_ns >= CALL_SHARE * dur else None,
                "first_call": op["name"] if first and op else None,
            }
        )
    return out


def _line(ctx: RuleContext, x: dict[str, Any]) -> str:
    return (
        f"{fmt_ns(x['duration_ns'])}"
        + (f" on rank {x['rank']}" if len(ctx.rank_window_ns) > 1 else "")
        + (f" in {x['range']}" if x["range"] and x["range"] != x["covering_range"] else "")
        + (f" after {x['after_op']}" if x["after_op"] else "")
        + f" ({x['host']})"
    )


SEE = {"sync_stall": "after host syncs", "input_bound": "waiting for data", "launch_bound": "while the host launches"}


def _steady_finding(
    ctx: RuleContext, t: Thresholds, gaps: list[dict[str, Any]], listed: list[dict[str, Any]], startup: list[dict[str, Any]]
) -> Finding:
    total = sum(g["end_ns"] - g["start_ns"] for g in gaps)
    ids = [g["i"] for g in gaps]
    # their idle time in the waterfall (the start-up gaps are the other finding's; start-up stretches within these,
    # as before a queued kernel at the profile's start, are theirs)
    lost = ctx.lost_fraction(
        "SELECT rank, device, start_ns, end_ns FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[]))",
        list(IDLE_CATEGORIES),
        params=[ids],
    )
    big = listed[0]
    by_cat: dict[str, float] = {}
    for x in listed:
        for c, ns in x["categories"].items():
            by_cat[c] = by_cat.get(c, 0.0) + ns
    main = max(by_cat, key=lambda c: by_cat[c]) if by_cat else None
    ctx_text = (f", after {big['after_op']}" if big["after_op"] else "") + f"; {big['host']}"
    lines = "; ".join(_line(ctx, x) for x in listed)
    apart = ""
    if startup:
        s_ns = sum(g["end_ns"] - g["start_ns"] for g in startup)
        apart = f" (Besides these, {fmt_ns(s_ns)} of one-time start-up: reported apart.)"

    def is_named(x: dict[str, Any]) -> bool:
        return bool(x["host"] != "nothing traced on the host")

    named = [x for x in listed if is_named(x)]
    half = 0.5 * sum(x["duration_ns"] for x in listed)

    def mostly(keep: Callable[[dict[str, Any]], Any]) -> bool:
        """Whether the listed gaps that `keep` holds are at least half of the listed time."""
        return sum(x["duration_ns"] for x in listed if keep(x)) >= half

    waiting = sum(min(x["queued_ns"] or 0, x["duration_ns"]) for x in listed) >= half
    n_gaps = f"{len(gaps)} idle gap{'s' if len(gaps) != 1 else ''} ({fmt_ns(total)})"
    by_profiler = not waiting and mostly(lambda x: (x["host_call"] or "").startswith(PROFILER_PREFIX))
    first_calls = not waiting and not by_profiler and mostly(lambda x: x["first_call"])
    if by_profiler:
        fix = f"{n_gaps}, most in the profiler's own overhead: not paid unprofiled"
    elif waiting:
        fix = f"{n_gaps} with the next kernel queued: find what the GPU waited on"
    elif first_calls:
        fix = f"{n_gaps}, mostly ops' first calls with new shapes: one-time, profile after warm-up"
    elif main in SEE:
        fix = f"{n_gaps}, mostly {SEE[main]}"
    elif named and (named[0] is big or mostly(is_named)):
        # what the host did is known for the listed gaps only: said of the largest named one, not of them all (and
        # only when it is the largest or the named ones hold most of the listed time: a 1 ms gap named beside an 80 ms
        # untraced one would read as the cause)
        first = (
            ": " if len(gaps) == 1 else "; the largest: " if named[0] is big else f"; a {fmt_ns(named[0]['duration_ns'])} one: "
        )
        fix = f"{n_gaps}{first}{named[0]['host']}"
    elif named:
        fix = f"{n_gaps}, most with nothing traced on the host: profile the host side"
    else:
        fix = f"{n_gaps} with nothing traced on the host: profile the host side"
    in_them = "in most of them" if len(listed) > 1 else "in it"
    most = in_them[0].upper() + in_them[1:]
    advice = (
        f"{most} the next kernel was already queued: the GPU waited on something the trace does not "
        f"hold — an event of another stream or process ({ctx.program.prefix}StreamWaitEvent), another process "
        "on the GPU, or streams not captured. Profile the whole system (all processes and streams) to see it; the "
        "host's work meanwhile is not the cause."
        if waiting
        else "Keep work queued while the host is busy: move logging / checkpointing / evaluation off the step or to "
        "another thread, prefetch inputs, and avoid host syncs right before long host work (PR502)."
    )
    if first_calls:
        advice = (
            f"{most} the host is in an op's first call with new input shapes, many times slower than its "
            "later calls: a library choosing and loading its kernel for the shape (GEMM heuristics, workspaces, "
            f"module loading) — a one-time cost, not the loop's: {warm_up_profile(ctx.program)}. In serving, warm up "
            "every batch / sequence shape before taking traffic."
        )
    elif by_profiler:
        advice = (
            f"{most} the host was in the profiler's own overhead (CUPTI's records: requesting activity "
            "buffers while it records), which the program does not pay when it is not profiled: not a loss of the "
            "program. Record fewer activities or a shorter schedule to shrink it."
        )
    elif not waiting and mostly(lambda x: re.search(ALLOCATOR_CALL_RE, x["host_call"] or "")):
        advice = (
            f"The host is in the device allocator {in_them} (frees and allocations inside the loop, each "
            "synchronizing the device): keep the framework's caching allocator on (PyTorch: "
            "PYTORCH_NO_CUDA_MEMORY_CACHING / PYTORCH_NO_HIP_MEMORY_CACHING unset), or allocate once, outside the "
            "loop. " + advice
        )
    rec = (
        f"{len(gaps)} gap{'s' if len(gaps) != 1 else ''} of at least {t.min_gap_ms:g} ms "
        f"{'leave' if len(gaps) != 1 else 'leaves'} the GPU idle "
        f"{fmt_ns(total)} ({pct(ctx.fraction(total))} of the window). Largest: {lines}. {advice}" + apart
    )
    return Finding(
        title=f"GPU idle {fmt_ns(total)} in {len(gaps)} gap{'s' if len(gaps) != 1 else ''} ≥ {t.min_gap_ms:g} ms "
        f"(largest {fmt_ns(big['duration_ns'])}{ctx_text})",
        recommendation=rec,
        lost_fraction=lost,
        fix=fix,
        key="gaps",
        evidence={
            "gaps": listed,
            "gap_count": len(gaps),
            "idle_ns": total,
            "min_gap_ns": t.min_gap_ms * 1e6,
            "main_category": main,
            "startup_gap_count": len(startup),
            "startup_idle_ns": sum(g["end_ns"] - g["start_ns"] for g in startup),
        },
    )


def _startup_finding(ctx: RuleContext, t: Thresholds, gaps: list[dict[str, Any]], listed: list[dict[str, Any]]) -> Finding:
    total = sum(g["end_ns"] - g["start_ns"] for g in gaps)
    ids = [g["i"] for g in gaps]
    lost = ctx.lost_fraction(
        "SELECT rank, device, start_ns, end_ns FROM _gaps WHERE i IN (SELECT unnest(?::BIGINT[]))", ["startup"], params=[ids]
    )
    calls = list(dict.fromkeys(c for x in listed for c in x["startup_calls"]))[:4]
    if any(x["slow_launch_ns"] for x in listed):
        calls.append("first launches of kernels: module loading")
    what = f" ({', '.join(calls)})" if calls else ""
    big = listed[0]
    rec = (
        f"{len(gaps)} idle gap{'s' if len(gaps) != 1 else ''} ({fmt_ns(total)}, {pct(ctx.fraction(total))} of the "
        f"window; largest {_line(ctx, big)}) are one-time start-up: the host is setting up{what} — context "
        "creation, module loading, library handles, first allocations. A one-time cost, not a steady-state loss "
        f"and not launch overhead: {warm_up_profile(ctx.program)}."
    )
    if any(c.startswith(PROFILER_PREFIX) for c in calls):
        rec += (
            " Some of it is the profiler's own set-up (CUPTI asking for its activity buffers), which the program does "
            "not pay when it is not profiled."
        )
    # a gap after its GPU's last activity is the program tearing down (frees, shutdown): one-time too, said so
    last = {
        (r["rank"], r["device"]): r["e"] for r in ctx.rows("SELECT rank, device, max(end_ns) AS e FROM rule_kernels GROUP BY ALL")
    }
    tail = [g for g in gaps if g["start_ns"] >= last.get((g["rank"], g["device"]), g["end_ns"])]
    if tail:
        tail_ns = sum(g["end_ns"] - g["start_ns"] for g in tail)
        rec += (
            f" {fmt_ns(tail_ns)} of it ({len(tail)} gap{'s' if len(tail) != 1 else ''}) comes after the GPU's last "
            "activity: the program tearing down (frees, shutdown), not setting up — nothing to gain in the loop."
        )
    return Finding(
        title=f"one-time start-up: the GPU idles {fmt_ns(total)} in {len(gaps)} gap{'s' if len(gaps) != 1 else ''} "
        f"while the host sets up{what}",
        recommendation=rec,
        lost_fraction=lost,
        category="startup",
        fix=f"one-time start-up ({fmt_ns(total)}): profile after warm-up",
        key="startup",
        evidence={
            "gaps": listed,
            "gap_count": len(gaps),
            "idle_ns": total,
            "startup_calls": calls,
            "min_gap_ns": t.min_gap_ms * 1e6,
        },
    )
