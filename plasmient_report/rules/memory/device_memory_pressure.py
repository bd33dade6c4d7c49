"""PR701 device-memory-pressure: a GPU whose caching allocator held (reserved) close to all of the device's memory,
from the allocation records (memory_events → the library's memory_timeline: Kineto `profile_memory=True`, or the
CUDA driver's allocations of Nsight Systems `--cuda-memory-usage=true`) against the device's memory. A risk, not
lost time: it claims no share of the waterfall."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_bytes, fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        Reads the allocator's timeline (`[memory]` events of a PyTorch profile with `profile_memory=True`): per GPU the
        peak reserved memory (what the caching allocator holds from the driver) and the peak allocated memory (what
        live tensors hold), when each was first reached, and the op and step that allocated at the allocated peak. An
        Nsight Systems report recorded with `--cuda-memory-usage=true` gives the same timeline from the driver's side:
        every `cudaMalloc` / `cudaFree`, mapped page and memory-pool allocation of the process, so reserved is the
        device memory the process held (the caching allocator's segments plus what libraries such as cuBLAS allocated
        themselves) and allocated is unknown (the driver does not see tensors); when the capture began after the
        process did, the total is unknown and the rule says nothing. Fires when the peak reserved memory (the allocated
        one when reserved is not recorded) reaches `warn_reserved_fraction` of the device's memory, `high` from
        `high_reserved_fraction` on. The device's memory is the trace's own (`devices.memory_bytes`, Kineto's
        `totalGlobalMem`); when the trace does not carry it, the peak table's nominal size of the matched GPU is used
        and the finding says so; with neither the rule says nothing. It also counts `cudaMalloc` / `cudaFree` calls
        inside the steps after the first, when the steps are marked: a warm caching allocator makes none. The finding
        claims no lost time — it is a risk, not a loss — so it has no loss category and no lost fraction, and the
        waterfall never counts it. In a trace of an inference server that fills the GPU on purpose (vLLM sizes its KV
        cache by `gpu_memory_utilization`, SGLang by `mem_fraction_static`; recognised by their kernels, ops or
        Python frames) the finding is `low` and says so.""",
    why_is_this_bad="""
        A rank with a few percent of its memory left fails with an out-of-memory error on the first longer
        sequence, bigger batch, extra bucket or fragmented block. Before it fails, the caching allocator works
        against it: when a `cudaMalloc` fails it frees its cached blocks (`cudaFree`, which synchronises the
        device) and retries, and every step then pays `cudaMalloc` / `cudaFree` storms. Reserved memory far above
        allocated memory is fragmentation: memory held but not usable for the next large tensor.""",
    example="""
        `device memory 92% reserved on GPU 0: 138.1 of 150.1 GB (allocated peak 138.1 GB)` — severity medium, no
        lost fraction.""",
    how_to_fix="""
        Free memory where it goes: activation checkpointing (`torch.utils.checkpoint`, FSDP / DeepSpeed
        activation checkpointing), a smaller micro-batch with gradient accumulation, sharding of parameters,
        gradients and optimizer state across ranks (FSDP / ZeRO), CPU offload of optimizer state or parameters,
        and dropping references that keep tensors alive (stored losses with their graphs, caches, lists of
        outputs). Against fragmentation: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Check with
        `torch.cuda.memory_summary()` and `torch.cuda.memory_stats()['num_alloc_retries']` (non-zero: the allocator
        already had to free its cache to satisfy a request).""",
)

# Per analysed GPU: the peaks of its allocator timeline inside its window, when they were first reached, and the
# device's memory from the trace. One pass of window functions over the (columnar) timeline.
PEAKS_SQL = """
WITH w AS (SELECT rank, device, min(start_ns) AS a, max(end_ns) AS b FROM rule_windows GROUP BY ALL),
t AS (
    SELECT m.rank, m.device, m.ts_ns, m.allocated_bytes, m.reserved_bytes, m.absolute, m.origin, w.a AS window_start_ns,
           max(m.allocated_bytes) OVER g AS pa, max(m.reserved_bytes) OVER g AS pr
    FROM memory_timeline m JOIN w ON w.rank IS NOT DISTINCT FROM m.rank AND w.device = m.device
     AND m.ts_ns >= w.a AND m.ts_ns <= w.b
    WINDOW g AS (PARTITION BY m.rank, m.device)
), pk AS (
    SELECT rank, device, count(*) AS events, bool_and(absolute) AS absolute, any_value(window_start_ns) AS window_start_ns,
           min(ts_ns) AS first_event_ns, min(origin) AS origin,
           any_value(pa) AS peak_allocated_bytes, min(ts_ns) FILTER (WHERE allocated_bytes = pa) AS peak_allocated_ns,
           any_value(pr) AS peak_reserved_bytes, min(ts_ns) FILTER (WHERE reserved_bytes = pr) AS peak_reserved_ns,
           min_by(reserved_bytes, ts_ns) FILTER (WHERE allocated_bytes = pa) AS reserved_at_allocated_peak_bytes
    FROM t GROUP BY rank, device
), dev AS (SELECT rank, device, max(memory_bytes) AS memory_bytes FROM devices GROUP BY ALL)
SELECT pk.*, dev.memory_bytes AS device_memory_bytes
FROM pk LEFT JOIN dev ON dev.rank IS NOT DISTINCT FROM pk.rank AND dev.device = pk.device
ORDER BY pk.rank, pk.device"""

# The ops on the allocating thread that enclose the allocator event at the allocated peak, innermost first.
PEAK_OP_SQL = """
WITH e AS (SELECT rank, thread, ts_ns, bytes_delta FROM memory_events
           WHERE rank IS NOT DISTINCT FROM $rank AND device = $device AND ts_ns = $ts ORDER BY bytes_delta DESC LIMIT 1)
SELECT e.bytes_delta, o.name, o.depth,
       (SELECT s.name FROM rule_steps s WHERE s.rank IS NOT DISTINCT FROM e.rank AND s.start_ns <= e.ts_ns
          AND s.end_ns >= e.ts_ns ORDER BY s.start_ns DESC LIMIT 1) AS step
FROM e LEFT JOIN rule_ops o ON o.rank IS NOT DISTINCT FROM e.rank AND o.thread = e.thread
  AND o.start_ns <= e.ts_ns AND o.end_ns >= e.ts_ns
ORDER BY o.depth DESC NULLS LAST, o.start_ns DESC LIMIT 4"""

# Device allocations and frees by the runtime inside the steps after the first (a warm caching allocator makes none).
# Steps: ProfilerStep#N (rule_steps), else the CPU intervals of the run's steps (an nsys `train_step`).
CHURN_SQL = """
WITH s0 AS ({steps}),
s AS (SELECT rank, start_ns, end_ns, row_number() OVER (PARTITION BY rank, label ORDER BY start_ns) AS i FROM s0),
a AS (SELECT rank, name, start_ns, end_ns FROM rule_api_calls
      WHERE regexp_matches(name, '^(cuda|hip)(Malloc|Free)$|^cuMem(Alloc|Free)(_v2)?$'))
SELECT a.rank, count(*) FILTER (WHERE regexp_matches(a.name, 'Malloc|Alloc')) AS mallocs,
       count(*) FILTER (WHERE regexp_matches(a.name, 'Free')) AS frees, sum(a.end_ns - a.start_ns) AS call_ns,
       count(DISTINCT s.i) AS steps_with_calls
FROM a JOIN s ON s.rank IS NOT DISTINCT FROM a.rank AND a.start_ns >= s.start_ns AND a.start_ns < s.end_ns
WHERE s.i > 1
GROUP BY a.rank"""


@rule(
    title="A GPU's memory is nearly full (risk of out-of-memory errors)",
    claims_loss=False,
    thresholds={"warn_reserved_fraction": 0.90, "high_reserved_fraction": 0.95},
    explanation=EXPLANATION,
)
def device_memory_pressure(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    if not ctx.rows("SELECT count(*) AS n FROM memory_events")[0]["n"]:
        return  # no allocation records (profile_memory=False; nsys without --cuda-memory-usage): nothing to judge
    gpus = [_judge(ctx, g) for g in ctx.rows(PEAKS_SQL)]
    hit = [g for g in gpus if g["fraction"] is not None and g["fraction"] >= t.warn_reserved_fraction]
    if not hit:
        return
    churn = {r["rank"]: r for r in ctx.rows(CHURN_SQL.format(steps=_steps_sql(ctx)))}
    worst = max(hit, key=lambda g: g["fraction"])
    ranks = len(ctx.rank_window_ns) > 1
    where = f"GPU {worst['device']}" + (f" (rank {worst['rank']})" if ranks else "")
    ops = (
        ctx.rows(PEAK_OP_SQL, {"rank": worst["rank"], "device": worst["device"], "ts": worst["peak_allocated_ns"]})
        if worst["peak_allocated_ns"] is not None
        else []
    )
    op_names = [o["name"] for o in ops if o["name"]]
    # the innermost op that says what the memory is for (aten::empty / empty_strided only say that it is memory)
    op = next((n for n in op_names if not n.startswith(("aten::empty", "aten::new_empty"))), op_names[0] if op_names else None)
    step = ops[0]["step"] if ops else None
    what = "reserved" if worst["measure"] == "reserved" else "allocated"
    table = worst["capacity_source"] == "peak_table"
    cap = f"nominal {worst['nominal_gb']:g} GB" if table else fmt_bytes(worst["capacity_bytes"])
    nominal = " (the peak table's size for this GPU, read as GiB: the trace does not give the device's memory)" if table else ""
    at_least = "at least " if worst["lower_bound"] else ""
    peak_ns = worst["peak_reserved_ns"] if what == "reserved" else worst["peak_allocated_ns"]
    when = (
        ""
        if peak_ns is None
        else ", held from the first allocator event on"
        if peak_ns == worst["first_event_ns"]
        else f", first reached {fmt_ns(peak_ns - worst['window_start_ns'])} into the window"
    )
    alloc = (
        (
            f"; allocated peak {fmt_bytes(worst['peak_allocated_bytes'])}"
            + (f" ({pct(worst['allocated_fraction'])})" if worst["allocated_fraction"] is not None else "")
            + (f" in {step}" if step else "")
            + (f", allocating in {op}" if op else "")
        )
        if what == "reserved" and worst["peak_allocated_bytes"] is not None
        else ""
    )
    frag = worst["cached_at_allocated_peak_bytes"]
    frag_text = (
        (f" At the allocated peak the allocator held {fmt_bytes(frag)} more than live tensors used (cached or fragmented).")
        if frag and frag >= 0.02 * worst["capacity_bytes"]
        else ""
    )
    ch = churn.get(worst["rank"])
    api = ctx.program.prefix
    churn_text = (
        (
            f" {ch['mallocs']} {api}Malloc and {ch['frees']} {api}Free calls ran inside the steps after the "
            f"first ({fmt_ns(ch['call_ns'])} of host time): the caching allocator is still returning and "
            "requesting device memory — near the limit, a failed allocation frees the cache and retries."
        )
        if ch
        else ""
    )
    others = [g for g in hit if g is not worst]
    more = (
        f" {len(others)} more GPU{'s' if len(others) > 1 else ''} at or above {pct(t.warn_reserved_fraction)}." if others else ""
    )
    server = ctx.program.server
    if server is not None:
        # by design: the server sizes its KV cache to fill what it is allowed (vLLM gpu_memory_utilization,
        # SGLang mem_fraction_static); only out-of-memory errors or preempted requests would make it a problem
        knob = "gpu_memory_utilization" if server == "vLLM" else "mem_fraction_static"
        advice = (
            f"This is {server}, which reserves that memory on purpose: it sizes its KV cache to fill the share of "
            f"the GPU that {knob} allows. It is a risk only if the run also hit out-of-memory errors or preempted "
            f"requests; then lower {knob} or the batch / sequence limits."
        )
        fix = f"expected for {server}: its KV cache fills the share {knob} allows"
    elif ctx.program.pytorch:
        advice = (
            "Make room before a longer sequence or a bigger batch meets an out-of-memory error: activation "
            "checkpointing, a smaller micro-batch with gradient accumulation, FSDP / ZeRO sharding of "
            "parameters, gradients and optimizer state, CPU offload, and dropping references that keep tensors "
            "alive; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation. "
            "torch.cuda.memory_stats()['num_alloc_retries'] > 0 means the allocator already had to free its "
            "cache."
        )
        fix = "free GPU memory: activation checkpointing, smaller micro-batch, FSDP/ZeRO, expandable_segments"
    else:
        advice = (
            "Make room before a bigger input meets an out-of-memory error: smaller batches, recomputing "
            "instead of storing intermediates, sharding across GPUs, offloading to host memory, and a memory "
            "pool that fragments less."
        )
        fix = "free GPU memory: smaller batches, recompute, shard, offload"
    driver = (
        " Reserved here is the device memory the process held as the CUDA driver saw it (Nsight Systems' "
        "allocation records): the caching allocator's segments plus what libraries allocated themselves; how much "
        "of it live tensors used is not in these records."
        if worst.get("origin") == "driver"
        else ""
    )
    rec = (
        f"{where} {what} {at_least}{fmt_bytes(worst['peak_bytes'])} of its {cap}{nominal} at peak "
        f"({pct(worst['fraction'])}{when}){alloc}.{driver}{frag_text}{churn_text}{more} {advice}"
    )
    severity = "low" if server is not None else "high" if worst["fraction"] >= t.high_reserved_fraction else "medium"
    yield Finding(
        title=f"device memory {at_least}{pct(worst['fraction'])} {what} on {where}: "
        f"{fmt_bytes(worst['peak_bytes'])} of {cap}"
        + (f" (allocated peak {fmt_bytes(worst['peak_allocated_bytes'])})" if alloc else ""),
        recommendation=rec,
        fix=fix,
        lost_fraction=None,
        severity=severity,
        rank=worst["rank"] if ranks else None,
        key="device-memory",
        evidence={
            "gpus": gpus,
            "worst": {"rank": worst["rank"], "device": worst["device"]},
            "peak_op": op,
            "peak_ops": op_names,
            "peak_step": step,
            "allocator_calls_after_first_step": list(churn.values()),
        },
    )


def _steps_sql(ctx: RuleContext) -> str:
    """The steps whose allocator calls count: ProfilerStep#N ranges, else (none) the CPU intervals of the steps the
    measure stage found (the repeating top-level range of an nsys report), when it ran; counted per label."""
    has_steps = ctx.rows("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'steps'")[0]["n"]
    fallback = (
        " UNION ALL SELECT DISTINCT label, rank, cpu_start_ns, cpu_end_ns FROM steps WHERE NOT EXISTS (SELECT 1 FROM rule_steps)"
        if has_steps
        else ""
    )
    return "SELECT 'ProfilerStep#*' AS label, rank, start_ns, end_ns FROM rule_steps" + fallback


def _judge(ctx: RuleContext, g: dict[str, Any]) -> dict[str, Any]:
    """One GPU's peaks against its memory: which measure (reserved, else the allocator's allocated total), the
    capacity and where it comes from, the fraction (None: unknown)."""
    cap = g["device_memory_bytes"]
    source: str | None = "trace"
    if not cap:
        info = ctx.gpus.get((g["rank"], g["device"]))
        gb = info.table_entry.memory_gb if info is not None and info.table_entry is not None else None
        # The table's sizes are nominal ("141 GB" H200: 150.1e9 B = 139.8 GiB; "80 GB" H100: 79.2 GiB): read as
        # GiB they are within ~1% above the real size, so a fraction from them errs low, never high.
        cap, source = (gb * 2**30, "peak_table") if gb else (None, None)
    else:
        gb = None
    reserved, allocated = g["peak_reserved_bytes"], g["peak_allocated_bytes"]
    if reserved is not None:
        measure, peak, lower = "reserved", reserved, False
    else:  # without the allocator's totals (torch < 1.10) allocated is a running sum from the profile's start
        measure, peak, lower = "allocated", allocated, not g["absolute"]
    frac = peak / cap if cap and peak is not None else None
    cached = (
        g["reserved_at_allocated_peak_bytes"] - allocated
        if g["absolute"] and g["reserved_at_allocated_peak_bytes"] is not None and allocated is not None
        else None
    )
    return {
        **g,
        "capacity_bytes": cap,
        "capacity_source": source,
        "nominal_gb": gb,
        "measure": measure,
        "peak_bytes": peak,
        "lower_bound": lower,
        "fraction": frac,
        "reserved_fraction": reserved / cap if cap and reserved is not None else None,
        "allocated_fraction": allocated / cap if cap and allocated is not None and g["absolute"] else None,
        "cached_at_allocated_peak_bytes": cached,
    }
