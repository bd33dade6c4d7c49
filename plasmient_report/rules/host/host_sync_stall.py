"""PR502 host-sync-stall: the host syncs that leave the GPU idle — the sync call, the op that made it
(`.item()`, `.cpu()`, `nonzero()`…), the copy before it, and the Python site when the trace has stacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..advice import sync_fix, warm_up_profile
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext, range_joins, residual
from ..text import fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        Every stretch the waterfall calls `sync_stall` (the GPU idle right after a host-blocking call returned)
        is traced back to the sync the measurement library found at the start of its idle gap (`idle_gaps.sync_*`):
        the runtime call (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, a synchronous `cudaMemcpy`, their HIP
        twins), the PyTorch op that made it (`aten::item` → `aten::_local_scalar_dense` is `.item()`; `aten::to` /
        `_to_copy` with a device→host copy is `.cpu()`; `aten::nonzero` has a data-dependent size), the
        device→host copy it waited for, the enclosing range, and the Python line when the trace was recorded with
        stacks (`with_stack=True`). Grouped by call site, largest idle time first; a site whose syncs lie in several
        ranges says how many, naming the one with the most idle time after them. A sync seen once in the window is
        said to be once — not "in the loop" — and one that comes before almost all of the window's GPU work
        (`before_work_share`) is named as the set-up wait it likely is. Stall time after the gap's next kernel was
        already queued is not counted: the GPU then had work and waited on something else (PR504 says so).""",
    why_is_this_bad="""
        A sync makes the host wait until the GPU has drained its queue; when the host resumes, the GPU has nothing
        queued and idles until the host launches again — the whole host-side time after the sync (Python, data
        preparation, logging) becomes GPU idle time. One `.item()` per step for a loss print can cost more than a
        layer's worth of compute.""",
    example="""
        `host sync .item() (aten::item → aten::_local_scalar_dense → cudaStreamSynchronize) leaves the GPU idle
        10×, 20.5 ms each`.""",
    how_to_fix="""
        Take the sync out of the hot loop. PyTorch: keep values on the GPU (accumulate the loss as a tensor, log
        every N steps), replace `if tensor:` / `.item()` control flow by tensor ops (`torch.where`, masks), avoid
        data-dependent shapes (`nonzero`, `masked_select`, `unique`) or give them a static size, and read results
        back asynchronously (`.to('cpu', non_blocking=True)` into pinned memory plus a CUDA event). CUDA / HIP
        programs: order streams with events (`cudaEventRecord` + `cudaStreamWaitEvent`) instead of host syncs,
        queue the next iteration before waiting, copy back with `cudaMemcpyAsync`. Make sure the host has work
        queued before any unavoidable sync. A one-time wait before the work is set-up: profile after it. When
        the syncs hardly wait (under a quarter of the idle time after them: the GPU had almost nothing left to
        do), the idle time is the host's own work after them — a sleep, preprocessing, I/O — and dropping the sync
        would recover at most its wait: the finding then names that host work; run it while the GPU computes (a
        background thread or process, prefetching) or take it off the loop.""",
)

PYTHON_FRAME_RE = r"\.py\([0-9]+\)"
# Frames of libraries and the standard library: the Python site is the innermost frame that is none of these.
LIBRARY_FRAME_RE = (
    r"^(<built-in|<frozen|torch/|numpy/|typing\.py|contextlib\.py|functools\.py|threading\.py|"
    r"abc\.py|enum\.py|weakref\.py|copy\.py|logging/|collections/|importlib/)|site-packages/|"
    r"dist-packages/|/lib/python3"
)

# What a user wrote, from the op that issued the sync (innermost first).
FRIENDLY = {
    "aten::item": ".item()",
    "aten::_local_scalar_dense": ".item()",
    "aten::is_nonzero": "bool(tensor) / `if tensor:`",
    "aten::nonzero": ".nonzero() (data-dependent size)",
    "aten::masked_select": "masked_select (data-dependent size)",
    "aten::unique": "unique() (data-dependent size)",
    "aten::_unique2": "unique() (data-dependent size)",
    "aten::repeat_interleave": "repeat_interleave (data-dependent size)",
    "aten::tolist": ".tolist()",
    "aten::to": ".to('cpu') / .cpu()",
    "aten::_to_copy": ".to('cpu') / .cpu()",
    "aten::cpu": ".cpu()",
    "aten::copy_": "a device→host copy_",
    "aten::equal": "torch.equal",
    "aten::allclose": "torch.allclose",
}
BARE = {
    "cudaDeviceSynchronize": "torch.cuda.synchronize()",
    "cudaStreamSynchronize": "stream.synchronize()",
    "cudaEventSynchronize": "event.synchronize()",
    "cudaStreamWaitEvent": "stream.wait_event()",
}


# The stall stretches, each with the sync the waterfall blames: the one whose return began the idle gap (the
# measure stage's idle_gaps).
# A stall stretch is cut where the gap's next kernel was queued (its launch had returned) more than a launch's latency
# before it ran (idle_gaps.pending_ns): from then on the GPU had work and did not run it — it waited on something
# the trace does not hold, not on the host after the sync.
SYNCS_SQL = """
WITH st AS (
    SELECT rank, device, start_ns, end_ns, lost_ns FROM rule_losses WHERE category = 'sync_stall'
), g AS (
    SELECT *, CASE WHEN pending_ns > 0 THEN end_ns - pending_ns END AS queued_at FROM rule_idle_gaps WHERE after_sync
)
SELECT st.rank, st.device, st.start_ns, least(st.end_ns, coalesce(g.queued_at, st.end_ns)) AS end_ns,
       st.lost_ns * (least(st.end_ns, coalesce(g.queued_at, st.end_ns)) - st.start_ns) / (st.end_ns - st.start_ns)
           AS lost_ns,
       g.sync_name, g.sync_thread AS thread, g.sync_start_ns AS sync_start, g.sync_end_ns AS sync_end
FROM st ASOF LEFT JOIN g
  ON g.rank IS NOT DISTINCT FROM st.rank AND g.device = st.device AND g.start_ns <= st.start_ns
WHERE st.end_ns > st.start_ns AND (g.queued_at IS NULL OR g.queued_at > st.start_ns)"""


# An op or frame open around a sync lasts at least as long as the sync: those shorter than every sync (most of a
# with_stack trace's hundreds of thousands of frames and ops) are left out before the join, which sorts what it gets.
LONG_ENOUGH = "end_ns - start_ns >= (SELECT min(sync_end - sync_start) FROM _syncs WHERE sync_start IS NOT NULL)"


# What was open around each sync (`_syncs`): the ops and Python frames of its thread, the ranges of its rank. Each
# its own statement over the stored syncs, so that each is a range join on the times (`residual`: the rank and
# thread a filter): with_stack traces hold hundreds of thousands of frames on the syncing thread, and as one query
# with the syncs a CTE the planner chose a merge join on one time that tested half of them per sync.
def around_sql(same: Callable[[str], str] = residual) -> dict[str, str]:
    """The statements, with `same` making the rank / thread condition (`residual`; a plain condition in tests)."""
    return {
        "_sync_ops": f"""
        SELECT j.rank, j.sync_start, j.thread,
               arg_max(o.name, o.depth) FILTER (WHERE NOT regexp_matches(o.name, '{PYTHON_FRAME_RE}')) AS inner_op,
               arg_min(o.name, o.depth) FILTER (WHERE NOT regexp_matches(o.name, '{PYTHON_FRAME_RE}')) AS outer_op,
               arg_max(o.name, o.depth) FILTER (WHERE regexp_matches(o.name, '{PYTHON_FRAME_RE}')) AS python_site,
               arg_max(o.op_id, o.depth) FILTER (WHERE NOT regexp_matches(o.name, '{PYTHON_FRAME_RE}')) AS inner_op_id
        FROM (SELECT DISTINCT rank, thread, sync_start, sync_end FROM _syncs WHERE sync_start IS NOT NULL) j
        JOIN (SELECT * FROM rule_ops WHERE {LONG_ENOUGH}) o ON o.start_ns <= j.sync_start AND o.end_ns >= j.sync_end
         AND {same("o.rank IS NOT DISTINCT FROM j.rank AND o.thread = j.thread")}
        GROUP BY j.rank, j.sync_start, j.thread""",
        "_sync_ranges": f"""
        SELECT j.rank, j.sync_start, arg_max(r.name, r.start_ns) AS range_name
        FROM (SELECT DISTINCT rank, sync_start, sync_end FROM _syncs WHERE sync_start IS NOT NULL) j
        JOIN (SELECT * FROM rule_ranges
              WHERE NOT on_gpu AND name NOT LIKE 'ProfilerStep#%' AND domain IS DISTINCT FROM 'python') r
          ON r.start_ns <= j.sync_start AND r.end_ns >= j.sync_end AND {same("r.rank IS NOT DISTINCT FROM j.rank")}
        GROUP BY j.rank, j.sync_start""",
        # with_stack=True: the innermost Python frame of the user's code open on the syncing thread
        "_sync_frames": f"""
        SELECT j.rank, j.sync_start, j.thread,
               coalesce(arg_max(r.name, r.start_ns) FILTER (WHERE regexp_matches(r.name, '{PYTHON_FRAME_RE}')
                                                              AND NOT regexp_matches(r.name, '{LIBRARY_FRAME_RE}')),
                        arg_max(r.name, r.start_ns) FILTER (WHERE regexp_matches(r.name, '{PYTHON_FRAME_RE}')))
                   AS python_site
        FROM (SELECT DISTINCT rank, thread, sync_start, sync_end FROM _syncs WHERE sync_start IS NOT NULL) j
        JOIN (SELECT * FROM rule_ranges WHERE domain = 'python' AND {LONG_ENOUGH}) r
          ON r.start_ns <= j.sync_start AND r.end_ns >= j.sync_end
         AND {same("r.rank IS NOT DISTINCT FROM j.rank AND r.thread = j.thread")}
        GROUP BY j.rank, j.sync_start, j.thread""",
    }


AROUND_SQL = around_sql()
STALLS_SQL = """
WITH d2h AS (
    SELECT op_id, count(*) AS copies, sum(bytes) AS bytes FROM rule_kernels
    WHERE kind = 'memcpy' AND copy_kind = 'DtoH' GROUP BY op_id
)
SELECT j.*, c.inner_op, c.outer_op, coalesce(p.python_site, c.python_site) AS python_site, a.range_name,
       d.copies AS d2h_copies, d.bytes AS d2h_bytes
FROM _syncs j LEFT JOIN _sync_ops c
  ON c.rank IS NOT DISTINCT FROM j.rank AND c.sync_start = j.sync_start AND c.thread = j.thread
LEFT JOIN _sync_frames p ON p.rank IS NOT DISTINCT FROM j.rank AND p.sync_start = j.sync_start AND p.thread = j.thread
LEFT JOIN _sync_ranges a ON a.rank IS NOT DISTINCT FROM j.rank AND a.sync_start = j.sync_start
LEFT JOIN d2h d ON d.op_id = c.inner_op_id"""


def stalls(ctx: RuleContext) -> str:
    """`STALLS_SQL` made ready: the syncs and what was open around them stored (in the rule's own database)."""
    ctx.con.execute(f"CREATE OR REPLACE TABLE _syncs AS {SYNCS_SQL}")
    with range_joins(ctx.con):
        for name, sql in AROUND_SQL.items():
            ctx.con.execute(f"CREATE OR REPLACE TABLE {name} AS {sql}")
    return STALLS_SQL


# A sync whose wait is under this share of the idle time after it did not cause that idle time.
SHORT_WAIT_SHARE = 0.25


def friendly(sync: str | None, inner: str | None, outer: str | None, pytorch: bool = True) -> str:
    """What the user wrote: the PyTorch call for a PyTorch program, else the runtime call itself."""
    for op in (inner, outer):
        if op in FRIENDLY:
            return FRIENDLY[op]
    if inner is None and outer is None:
        bare = (sync or "").split("_v")[0]
        return (BARE.get(bare) if pytorch else None) or sync or "an unknown sync"
    return outer or inner or sync or "?"


@rule(
    title="Host syncs leave the GPU idle",
    category="sync_stall",
    thresholds={"max_findings": 3, "min_lost_fraction": 0.01, "before_work_share": 0.9},
    explanation=EXPLANATION,
)
def host_sync_stall(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    groups = ctx.rows(f"""
        WITH s AS ({stalls(ctx)}),
        per_sync AS (  -- one row per sync call: the idle stretches that followed it
            SELECT rank, sync_start, min(sync_name) AS sync_name, min(inner_op) AS inner_op,
                   min(outer_op) AS outer_op, min(python_site) AS python_site,
                   min(range_name) AS range_name, sum(lost_ns) AS lost_ns, sum(end_ns - start_ns) AS idle_ns,
                   min(d2h_copies) AS d2h_copies, min(d2h_bytes) AS d2h_bytes, max(end_ns) AS idle_end,
                   least(min(sync_end) - sync_start, sum(end_ns - start_ns)) AS waited_ns
            FROM s GROUP BY rank, sync_start
        )
        SELECT sync_name, inner_op, outer_op, python_site,
               arg_max(range_name, lost_ns) FILTER (WHERE range_name IS NOT NULL) AS range_name,
               list(DISTINCT range_name ORDER BY range_name) FILTER (WHERE range_name IS NOT NULL) AS range_names,
               count(*) AS syncs, sum(lost_ns) AS lost_ns, sum(idle_ns) AS idle_ns, max(idle_ns) AS max_idle_ns,
               sum(d2h_copies) AS d2h_copies, max(d2h_bytes) AS d2h_bytes, list(DISTINCT rank ORDER BY rank) AS ranks,
               min(rank) AS first_rank, max(idle_end) AS idle_end, sum(waited_ns) AS waited_ns
        FROM per_sync GROUP BY sync_name, inner_op, outer_op, python_site
        ORDER BY lost_ns DESC, sync_name, inner_op, outer_op, python_site""")
    p = ctx.program
    for g in groups[: int(t.max_findings)]:
        what = friendly(g["sync_name"], g["inner_op"], g["outer_op"], p.pytorch)
        chain = " → ".join(x for x in dict.fromkeys([g["outer_op"], g["inner_op"], g["sync_name"]]) if x)
        said = f"{what} ({chain})" if chain != what else what
        n = g["syncs"]
        each = g["idle_ns"] / max(n, 1)
        site = g["python_site"]
        # the range it was called in; one site called in several ranges is said to be, with the costliest named
        ranges = g["range_names"] or []
        inside = (
            f" inside {len(ranges)} ranges (most idle time after it in {g['range_name']})"
            if len(ranges) > 1
            else f" inside {g['range_name']}"
            if g["range_name"]
            else ""
        )
        where = (f" at {site}" if site else "") + inside
        copy = " after a device→host copy" if g["d2h_copies"] else ""
        # (summed over its ranks: per step on each of them)
        n_ranks = max(len(g["ranks"] or []), 1)
        per = (
            f", {fmt_ns(ctx.per_step(g['idle_ns'] / n_ranks))}{' per rank' if n_ranks > 1 else ''} {ctx.per_step_text()}"
            if ctx.step_unit and n > 1
            else ""
        )
        # A sync seen once: the share of its rank's GPU work in the window that comes after the idle it caused
        # (nearly all of it: the wait came before the work — set-up, not the loop)
        after = None
        if n == 1:
            after = ctx.rows(
                """
                SELECT sum(end_ns - start_ns) FILTER (WHERE start_ns >= ?) / nullif(sum(end_ns - start_ns), 0) AS f
                FROM rule_kernels WHERE rank IS NOT DISTINCT FROM ? AND end_ns > start_ns""",
                [g["idle_end"], g["first_rank"]],
            )[0]["f"]
        before_work = after is not None and after >= t.before_work_share
        waited = g["waited_ns"]
        # The sync returned almost at once: what kept the GPU idle was the host's own work after it (a sleep,
        # preprocessing, I/O). Dropping the sync recovers at most its wait; overlapping that work is the fix.
        short_wait = waited is not None and g["idle_ns"] and waited < SHORT_WAIT_SHARE * g["idle_ns"]
        # "each" only when the gaps are alike: one long outlier makes the mean no gap's length
        spread = g["max_idle_ns"] > 2 * each
        per_gap = f"{fmt_ns(each)} on average, worst {fmt_ns(g['max_idle_ns'])}" if spread else f"{fmt_ns(each)} each"
        idle_each = f"{fmt_ns(each)} idle on average, worst {fmt_ns(g['max_idle_ns'])}" if spread else f"{fmt_ns(each)} idle each"
        if n > 1 and short_wait:
            w_each = waited / n
            rec = (
                f"{said}{where} synchronizes the host with the GPU{copy} {n}×, but each sync waited only "
                f"{fmt_ns(w_each)} on average: the GPU then sat idle {fmt_ns(each)} (worst {fmt_ns(g['max_idle_ns'])}; "
                f"{fmt_ns(g['idle_ns'])} in all{per}) while the host did its own work before launching again. "
                "Dropping the sync recovers at most its wait; the idle time is that host work — run it while the GPU "
                "computes (a background thread or process, prefetching, async I/O) or take it off the loop."
            )
            title = (
                f"host work after {said}{f' at {site}' if site else ''} leaves the GPU idle {n}×, {per_gap} "
                f"(the sync itself waits {fmt_ns(w_each)})"
            )
            fix = f"host work after {what}: {n}×, {idle_each} (the sync waits {fmt_ns(w_each)})"
        elif n > 1:
            rec = (
                f"{said}{where} synchronizes the host with the GPU{copy} {n}×; each time the GPU then "
                f"sat idle {fmt_ns(each)} on average (worst {fmt_ns(g['max_idle_ns'])}; {fmt_ns(g['idle_ns'])} in "
                f"all{per}) until the host launched again. Take it out of the hot loop: {sync_fix(p)}."
            )
            title = f"host sync {said}{f' at {site}' if site else ''} leaves the GPU idle {n}×, {per_gap}"
            fix = f"drop {what}{f' ({site})' if site else ''} from the loop: {n} syncs, {idle_each}"
        elif before_work:
            # One window cannot tell set-up from a per-iteration wait when it holds one iteration: both are said.
            rec = (
                f"{said}{where} synchronized the host with the GPU{copy} once, and the GPU then sat idle "
                f"{fmt_ns(each)} before {pct(after)} of the window's GPU work began: a wait before the work — "
                "set-up (loading, building, warm-up) if it happens once; if this window is one iteration of a "
                f"loop it may recur every iteration, which a longer profile shows. Set-up: "
                f"{warm_up_profile(p)}. Per iteration: {sync_fix(p)}."
            )
            title = (
                f"host sync {said}{f' at {site}' if site else ''}: the GPU idles {fmt_ns(each)} after it, once, before the work"
            )
            fix = f"one {fmt_ns(each)} wait after {what} before the work: set-up, or once per iteration?"
        else:
            rec = (
                f"{said}{where} synchronized the host with the GPU{copy} once in this window, and the "
                f"GPU then sat idle {fmt_ns(each)} until the host launched again. One window cannot tell whether "
                f"it recurs: if it does (every iteration), {sync_fix(p)}."
            )
            title = f"host sync {said}{f' at {site}' if site else ''} leaves the GPU idle {fmt_ns(each)} (once)"
            fix = f"{what}{f' ({site})' if site else ''}: 1 sync, {fmt_ns(each)} idle after it"
        if p.pytorch and not site:
            rec += " (Record with with_stack=True to see the Python line.)"
        yield Finding(
            title=title,
            recommendation=rec,
            fix=fix,
            lost_fraction=ctx.fraction(g["lost_ns"]),
            key=f"{chain} @ {site}" if site else chain,
            rank=g["ranks"][0] if len(g["ranks"] or []) == 1 and len(ctx.rank_window_ns) > 1 else None,
            evidence={
                "sync_call": g["sync_name"],
                "op": g["inner_op"],
                "outer_op": g["outer_op"],
                "as_written": what,
                "python_site": site,
                "range": g["range_name"],
                "ranges": ranges,
                "syncs": n,
                "idle_ns": g["idle_ns"],
                "mean_idle_ns": each,
                "mean_wait_ns": waited / n if waited is not None and n else None,
                "max_idle_ns": g["max_idle_ns"],
                "d2h_copies": g["d2h_copies"],
                "d2h_bytes": g["d2h_bytes"],
                "ranks": g["ranks"],
                "once": n == 1,
                "gpu_work_after_share": after,
                "before_the_work": before_work,
            },
        )
