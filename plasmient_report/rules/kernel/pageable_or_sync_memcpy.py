"""PR403 pageable-or-sync-memcpy: copies from / to pageable host memory and synchronous `cudaMemcpy` calls —
slow, staged through a bounce buffer, and blocking the host or the stream."""

from __future__ import annotations

from collections.abc import Iterator

from ..advice import async_readback, pinned_copies
from ..base import Explanation, Finding, Thresholds, rule
from ..context import IDLE_CATEGORIES, RuleContext
from ..text import fmt_bytes, fmt_ns

EXPLANATION = Explanation(
    what_it_does="""
        Host↔device copies whose host side is *pageable* memory (kernel names `Memcpy HtoD (Pageable -> Device)`,
        `Memcpy DtoH (Device -> Pageable)`), and synchronous copy calls (`cudaMemcpy`, `cuMemcpyHtoD`, `hipMemcpy`,
        … — not the `Async` variants). The evidence gives counts, bytes, time and bandwidth per direction and the
        ops that issued them.""",
    why_is_this_bad="""
        The driver copies pageable memory through a pinned bounce buffer: the transfer runs at a fraction of the
        link's bandwidth and, from the host's point of view, synchronously — it cannot overlap compute. A
        synchronous `cudaMemcpy` also blocks the host until the GPU has drained, so nothing new is launched
        meanwhile: the GPU idles (waterfall `memcpy`, and host categories around the call).""",
    example="""
        `16 copies use pageable host memory (4.4 GB/s)` — pinned copies typically reach 20–50 GB/s over
        PCIe 4/5.""",
    how_to_fix="""
        Pin the host buffers — PyTorch: `DataLoader(pin_memory=True)`, `tensor.pin_memory()`; CUDA / HIP:
        `cudaHostAlloc` / `cudaMallocHost` or `cudaHostRegister` (`hip…` likewise) — and copy asynchronously
        (`.to(device, non_blocking=True)`, `cudaMemcpyAsync` on a side stream), so transfers overlap compute. Read
        results back asynchronously (pinned destination + an event) instead of a blocking copy in the hot loop.
        `pinned_gbs` is the bandwidth quoted for pinned copies.""",
)

SYNC_MEMCPY_RE = (
    r"^(cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cuMemcpy|"
    r"cuMemcpyHtoD|cuMemcpyDtoH|cuMemcpyDtoD|hipMemcpy|hipMemcpy2D|hipMemcpy3D|hipMemcpyToSymbol|"
    r"hipMemcpyFromSymbol|hipMemcpyWithStream|hipMemcpyHtoD|hipMemcpyDtoH|hipMemcpyDtoD)(_v[0-9]+)?$"
)
PAGEABLE_SQL = "SELECT * FROM rule_kernels WHERE kind = 'memcpy' AND name ILIKE '%pageable%'"
SYNC_SQL = f"SELECT * FROM rule_api_calls WHERE regexp_matches(name, '{SYNC_MEMCPY_RE}')"


@rule(
    title="Copies use pageable host memory or synchronous cudaMemcpy",
    category="memcpy",
    thresholds={"pinned_gbs": 20.0},
    explanation=EXPLANATION,
)
def pageable_or_sync_memcpy(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    copies = ctx.rows(f"""
        SELECT coalesce(copy_kind, regexp_extract(name, 'Memcpy (\\w+)', 1)) AS direction, name,
               count(*) AS count, sum(bytes) AS bytes, sum(end_ns - start_ns) AS time_ns,
               list(DISTINCT rank ORDER BY rank) AS ranks
        FROM ({PAGEABLE_SQL}) GROUP BY ALL ORDER BY time_ns DESC, direction, name""")
    syncs = ctx.rows(f"""
        SELECT name, count(*) AS count, sum(end_ns - start_ns) AS time_ns, list(DISTINCT rank ORDER BY rank) AS ranks
        FROM ({SYNC_SQL}) GROUP BY name ORDER BY time_ns DESC, name""")
    if not copies and not syncs:
        return
    ops = [
        r["op"]
        for r in ctx.rows(f"""
        SELECT o.name AS op, sum(k.end_ns - k.start_ns) AS ns FROM ({PAGEABLE_SQL}) k JOIN rule_ops o USING (op_id)
        GROUP BY o.name ORDER BY ns DESC, o.name LIMIT 3""")
    ]
    lost = ctx.lost_fraction(
        f"""
        SELECT rank, device, start_ns, end_ns FROM ({PAGEABLE_SQL})
        UNION ALL SELECT rank, NULL::INTEGER AS device, start_ns, end_ns FROM ({SYNC_SQL})""",
        ["memcpy", *IDLE_CATEGORIES],
    )
    parts = []
    for c in copies:
        bw = c["bytes"] / (c["time_ns"] / 1e9) / 1e9 if c["bytes"] and c["time_ns"] else None
        c["gb_s"] = bw
        parts.append(
            f"{c['count']} {c['direction']} cop{'ies' if c['count'] != 1 else 'y'} from pageable memory "
            f"({fmt_bytes(c['bytes'])} in {fmt_ns(c['time_ns'])}" + (f", {bw:.1f} GB/s)" if bw else ")")
        )
    for sc in syncs:
        parts.append(
            f"{sc['count']} synchronous {sc['name']} call{'s' if sc['count'] != 1 else ''} (host blocked {fmt_ns(sc['time_ns'])})"
        )
    by = f", issued by {', '.join(ops)}" if ops else ""
    p = ctx.program
    rec = (
        "; ".join(parts) + by + f". {pinned_copies(p)[0].upper() + pinned_copies(p)[1:]}; pinned copies typically "
        f"reach {t.pinned_gbs:g}–50 GB/s over PCIe 4/5. {async_readback(p)[0].upper() + async_readback(p)[1:]} in "
        "the loop."
    )
    n_pageable = sum(c["count"] for c in copies)
    # the pageable copies' bandwidth together (bytes over time): a few small, latency-bound copies in one direction
    # do not stand for the bulk of the bytes in another
    timed = [c for c in copies if c["bytes"] and c["time_ns"]]
    worst_bw = sum(c["bytes"] for c in timed) / (sum(c["time_ns"] for c in timed) / 1e9) / 1e9 if timed else None
    if copies:
        title = (
            f"{n_pageable} cop{'ies' if n_pageable != 1 else 'y'} use pageable host memory"
            + (f" ({worst_bw:.1f} GB/s)" if worst_bw else "")
            + (f"; {sum(sc['count'] for sc in syncs)} synchronous memcpy calls" if syncs else "")
        )
        fix = f"pin memory + {'non_blocking' if p.pytorch else 'async'} copies ({n_pageable} pageable" + (
            f", {worst_bw:.1f} GB/s)" if worst_bw else ")"
        )
    else:
        title = f"{sum(sc['count'] for sc in syncs)} synchronous memcpy calls block the host"
        fix = f"use {p.prefix}MemcpyAsync" + (" / non_blocking copies" if p.pytorch else "") + " from pinned memory"
    yield Finding(
        title=title,
        recommendation=rec,
        fix=fix,
        lost_fraction=lost,
        key="memcpy",
        evidence={"pageable_copies": copies, "synchronous_calls": syncs, "ops": ops},
    )
