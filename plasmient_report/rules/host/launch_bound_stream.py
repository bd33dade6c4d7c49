"""PR501 launch-bound-stream: streams of short kernels separated by gaps about one launch long — the GPU
finishes each kernel before the host has launched the next."""

from __future__ import annotations

from collections.abc import Iterator

from ...vocab import LAUNCH_API_RE, SYNC_API_RE, SYNC_TOLERANCE_NS
from ..advice import fuse_small, graph_capture
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_ns, short_kernel

EXPLANATION = Explanation(
    what_it_does="""
        Per stream: the median kernel duration and the median idle gap between consecutive kernels. A stream is
        launch-bound when its kernels are short (median below `short_kernel_us`) and the gaps between them are
        longer than the kernels themselves and below `max_gap_us` — the size of a launch plus the framework's
        per-op overhead, not host work. Its lost time is the waterfall's `launch_bound` inside those gaps (one-time
        start-up, syncs and data loading are their own categories and never counted here). The finding counts the
        launches per step (or per range occurrence), the median launch-call time on the host, the ops that
        launch the most kernels, and the host-blocking syncs among them.""",
    why_is_this_bad="""
        A kernel of 2 µs behind a 10 µs launch keeps the GPU busy 2 µs in 12: the host's launch rate, not the
        GPU, sets the speed. Faster GPUs make it worse.""",
    example="""
        `launch-bound: 3000 kernels of 0.9 µs (median) with 13.7 µs gaps` — 3000 launches per occurrence; a graph
        replaces them with one.""",
    how_to_fix="""
        Capture the steady-state loop in a graph: PyTorch — `torch.cuda.CUDAGraph` /
        `torch.cuda.make_graphed_callables` or `torch.compile(mode="reduce-overhead")`; CUDA / HIP directly — stream
        capture (`cudaStreamBeginCapture` … `cudaStreamEndCapture`, then one `cudaGraphLaunch` per iteration);
        TensorRT — capture `enqueueV3` the same way. Thousands of launches become one. A graph is not captured
        across a host sync: a step that syncs several times (`.item()`, `nonzero`, boolean masks — data-dependent
        shapes, such as a mixture of experts' loop over the experts it routed tokens to) needs those syncs gone
        first (PR502 says where they are), or graphs of the stretches between them: when the syncs inside the
        launch gaps leave runs of fewer than `graph_run_launches` launches on average, the fix says so. Fuse small ops
        (`torch.compile`, foreach / fused optimizers, or hand-fused kernels) and batch small tensors into larger
        ones.""",
)

KERNELS_SQL = """
SELECT rank, device, stream, name, kind, op_id, start_ns, end_ns, end_ns - start_ns AS dur,
       start_ns - lag(end_ns) OVER (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns) AS gap,
       lag(end_ns) OVER (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns) AS prev_end
FROM rule_kernels WHERE end_ns > start_ns"""


@rule(
    title="Streams are launch-bound (short kernels, launch-sized gaps)",
    category="launch_bound",
    # graph_run_launches: launches per run between the host syncs inside the gaps below which the syncs go first
    thresholds={"short_kernel_us": 20.0, "max_gap_us": 100.0, "graph_run_launches": 50.0},
    explanation=EXPLANATION,
)
def launch_bound_stream(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    max_gap = t.max_gap_us * 1e3
    streams = ctx.rows(
        f"""
        WITH k AS ({KERNELS_SQL})
        SELECT rank, device, stream, count(*) AS kernels, median(dur) AS median_kernel_ns,
               median(gap) FILTER (WHERE gap > 0) AS median_gap_ns, sum(dur) AS busy_ns,
               count(*) FILTER (WHERE gap > 0 AND gap <= ?) AS short_gaps
        FROM k GROUP BY rank, device, stream
        HAVING median(dur) <= ? AND median(gap) FILTER (WHERE gap > 0) > median(dur)
           AND median(gap) FILTER (WHERE gap > 0) <= ?
        ORDER BY kernels DESC, rank NULLS FIRST, device, stream""",
        [max_gap, t.short_kernel_us * 1e3, max_gap],
    )
    if not streams:
        return
    keys = [[s["rank"], s["device"], s["stream"]] for s in streams]
    sel = " OR ".join("(rank IS NOT DISTINCT FROM ? AND device = ? AND stream = ?)" for _ in keys)
    flat = [x for k in keys for x in k]
    lost = ctx.lost_fraction(
        f"""
        SELECT rank, device, prev_end AS start_ns, start_ns AS end_ns FROM ({KERNELS_SQL})
        WHERE ({sel}) AND gap > 0 AND gap <= ?""",
        ["launch_bound"],
        params=[*flat, max_gap],
    )
    kernels = sum(s["kernels"] for s in streams)
    launch = ctx.rows(f"""
        SELECT median(end_ns - start_ns) AS median_ns, count(*) AS n FROM rule_api_calls
        WHERE regexp_matches(name, '{LAUNCH_API_RE}')""")[0]
    top = ctx.rows(
        f"""
        SELECT o.name AS op, count(*) AS kernels, median(o.end_ns - o.start_ns) AS median_op_ns,
               -- (the op's own kernel, not the workspace memset launched beside it)
               -- (of kernels launched as often, the first by name)
               coalesce(mode(k.name ORDER BY k.name) FILTER (WHERE k.kind <> 'memset'), mode(k.name ORDER BY k.name)) AS kernel
        FROM (SELECT * FROM ({KERNELS_SQL}) WHERE {sel}) k JOIN rule_ops o ON o.op_id = k.op_id
        GROUP BY o.name ORDER BY kernels DESC, o.name LIMIT 3""",
        flat,
    )
    med_k = sorted(s["median_kernel_ns"] for s in streams)[len(streams) // 2]
    med_g = sorted(s["median_gap_ns"] for s in streams)[len(streams) // 2]
    # (the streams' kernels over their GPUs: launches per step on each GPU)
    n_gpus = len({(s["rank"], s["device"]) for s in streams})
    per = ctx.per_step(kernels / n_gpus)
    unit = ("per GPU " if n_gpus > 1 else "") + ctx.per_step_text()
    where = ", ".join(
        f"stream {s['stream']}" + (f" (rank {s['rank']})" if len(ctx.rank_window_ns) > 1 else "") for s in streams[:4]
    )
    ops = "; ".join(
        f"{o['op']} {o['kernels']}× ({fmt_ns(o['median_op_ns'])} on the host each, kernel {short_kernel(o['kernel'], 40)})"
        for o in top
    )
    # Host-blocking syncs inside these streams' launch-sized gaps (.item(), nonzero, boolean masks, stream
    # synchronizes: the call returns as the GPU finishes the kernel before the gap): a graph is not captured across
    # one, so launches cut into short runs by them are not a few graphs until the syncs go. (Syncs between phases
    # or at a step's end leave long runs: a graph per run is still the fix.)
    # (a sync ends inside some gap [prev_end - tolerance, start] of its rank when the gaps starting at or before its
    # end reach it: the last of them by start (an ASOF join) carries the furthest end of all of them, `reach` — one
    # sort of each side instead of a range join of every sync with every gap)
    n_syncs = ctx.rows(
        f"""
        WITH g AS (
            SELECT rank, prev_end - ? AS lo,
                   max(start_ns) OVER (PARTITION BY rank ORDER BY prev_end - ? RANGE UNBOUNDED PRECEDING) AS reach
            FROM ({KERNELS_SQL}) WHERE ({sel}) AND gap > 0 AND gap <= ?
        ), a AS (SELECT rank, end_ns FROM rule_api_calls WHERE regexp_matches(name, ?))
        SELECT count(DISTINCT (a.rank, a.end_ns)) AS n
        FROM a ASOF JOIN g ON g.rank IS NOT DISTINCT FROM a.rank AND g.lo <= a.end_ns
        WHERE a.end_ns <= g.reach""",
        [SYNC_TOLERANCE_NS, SYNC_TOLERANCE_NS, *flat, max_gap, SYNC_API_RE],
    )[0]["n"]
    syncs = ctx.per_step(n_syncs / n_gpus)
    split = n_syncs > 0 and kernels / (n_syncs + 1) < t.graph_run_launches
    p = ctx.program
    launch_call = f"{p.prefix}LaunchKernel"
    rec = (
        f"{kernels} kernels on {where}: median {fmt_ns(med_k)} each, with {fmt_ns(med_g)} idle between them — the "
        f"host needs longer to launch a kernel ({launch_call} median {fmt_ns(launch['median_ns'])}"
        + (", plus the op's own overhead" if p.pytorch else "")
        + ") than the GPU to run it. That is "
        f"{per:,.0f} launches {unit}"
        + (f"; most from {ops}" if ops else "")
        + ". "
        + (
            f"The host also waits for the GPU {syncs:,.0f} times {unit} between them ("
            + (".item(), nonzero, boolean masks — data-dependent shapes — or " if p.pytorch else "")
            + f"{p.prefix}StreamSynchronize / blocking copies): a graph is not captured across a sync, so remove them "
            "first (PR502 says where they are) or capture the stretches between them. Then "
            f"{graph_capture(p)}; and {fuse_small(p)}."
            if split
            else f"{graph_capture(p)[0].upper() + graph_capture(p)[1:]}, so one graph launch replaces them; and {fuse_small(p)}."
        )
    )
    how = f"{p.api} graphs / torch.compile" if p.pytorch else f"{p.api} graph (stream capture)"
    yield Finding(
        title=f"launch-bound: {kernels} kernels of {fmt_ns(med_k)} (median) with {fmt_ns(med_g)} gaps",
        recommendation=rec,
        # (per step: the step's launches are one graph; without steps the window may hold many iterations)
        fix=f"{per:,.0f} launches {unit} cut by {syncs:,.0f} host syncs: remove the syncs, then {how}"
        if split and ctx.step_unit
        else f"{per:,.0f} launches in the window cut by {n_syncs:,} host syncs: remove the syncs, then {how}"
        if split
        else f"{how}: {per:,.0f} launches {unit} → 1 graph"
        if ctx.step_unit
        else f"{how}: {per:,.0f} launches in the window; capture the repeated part as one graph",
        lost_fraction=lost,
        key="launch",
        rank=streams[0]["rank"] if len({s["rank"] for s in streams}) == 1 and len(ctx.rank_window_ns) > 1 else None,
        evidence={
            "streams": streams,
            "kernels": kernels,
            "launches_per_step": per,
            "step_unit": ctx.step_unit,
            "median_kernel_ns": med_k,
            "median_gap_ns": med_g,
            "median_launch_call_ns": launch["median_ns"],
            "host_syncs": n_syncs,
            "top_ops": top,
        },
    )
