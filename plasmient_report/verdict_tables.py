"""The verdict's tables beside the headline: the collectives (with the lateness per step and rank), device memory per
GPU and launch statistics per stream — typed entries of `verdict_model`, read from the measurement library's tables
(sql/collective_stats.sql, sql/memory.sql, sql/launch_stats.sql), never recomputed here."""

from __future__ import annotations

import math
from typing import Any

import duckdb

from .store import has_table
from .verdict_model import (
    CollectiveGroup,
    CollectiveStats,
    DurationBucket,
    MemoryPeak,
    Quantiles,
    RankLateness,
    StreamLaunchStats,
)
from .vocab import HISTOGRAM_BASE_NS, HISTOGRAM_BUCKETS

MAX_GROUPS = 50
MAX_LATENESS_CELLS = 4096
MAX_STREAMS = 64


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def collective_stats(
    con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, step_label: str | None
) -> CollectiveStats | None:
    """The collectives of the analysed window by (collective, process group, group size, message size), largest
    time first, and the lateness of every rank to every step's collectives — the steps of `step_label` (the run's
    steps, judge.step_labels), else the whole profile per rank (null when the run has no collectives)."""
    if not has_table(con, "collective_stats"):
        return None
    rows = _rows(
        con,
        """SELECT * FROM collective_stats WHERE scope = ? AND range_name IS NOT DISTINCT FROM ?
                         ORDER BY time_ns DESC, collective, bytes""",
        [scope, range_name],
    )
    if not rows:
        return None
    groups = []
    for r in rows[:MAX_GROUPS]:
        busbw, link = _num(r["busbw_bytes_s"]), _num(r["link_bytes_s"])
        groups.append(
            CollectiveGroup(
                collective=r["collective"],
                kind=r["kind"],
                process_group=r["process_group"],
                group_size=_int(r["group_size"]),
                group_size_source=r["group_size_source"],
                bytes=_int(r["bytes"]),
                ops=int(r["ops"]),
                instances=int(r["instances"]),
                ranks=int(r["ranks"]),
                time_ns=int(r["time_ns"]),
                mean_ns=float(r["mean_ns"]),
                wait_ns=int(r["wait_ns"]),
                transfer_ns=int(r["transfer_ns"]),
                mean_transfer_ns=float(r["mean_transfer_ns"]),
                wait_known=bool(r["wait_known"]),
                algbw_bytes_s=_num(r["algbw_bytes_s"]),
                busbw_factor=_num(r["busbw_factor"]),
                busbw_bytes_s=busbw,
                link=r["link"],
                placement=r["placement"],
                link_bytes_s=link,
                busbw_fraction_of_link=busbw / link if busbw is not None and link else None,
                link_source=r["link_source"] if link else None,
            )
        )
    query = """SELECT * FROM collective_lateness WHERE label IS NOT DISTINCT FROM ?
               ORDER BY step_occurrence NULLS LAST, step, rank"""
    cells = _rows(con, query, [step_label]) if step_label is not None else []
    per_step = bool(cells) and len(cells) <= MAX_LATENESS_CELLS
    if not per_step:
        cells = _rows(con, query, [None])
    lateness = [
        RankLateness(
            step=c["step"],
            step_occurrence=_int(c["step_occurrence"]),
            rank=_int(c["rank"]),
            ops=int(c["ops"]),
            lateness_ns=int(c["lateness_ns"] or 0),
            max_lateness_ns=int(c["max_lateness_ns"] or 0),
            wait_ns=int(c["wait_ns"] or 0),
            last_arrivals=int(c["last_arrivals"]),
        )
        for c in cells
    ]
    return CollectiveStats(
        groups=groups,
        groups_total=len(rows),
        lateness=lateness,
        lateness_per_step=per_step,
        steps_label=step_label if per_step else None,
    )


def memory(con: duckdb.DuckDBPyConnection) -> list[MemoryPeak]:
    """Per GPU with allocator events (or nsys CUDA allocation records): its peak allocated and reserved memory, when,
    and against the device."""
    if not has_table(con, "memory_peaks"):
        return []
    return [
        MemoryPeak(
            rank=_int(r["rank"]),
            device=_int(r["device"]),
            source=str(r.get("origin") or "allocator"),
            events=int(r["events"]),
            first_ns=int(r["first_ns"]),
            last_ns=int(r["last_ns"]),
            absolute=bool(r["absolute"]),
            peak_allocated_bytes=_int(r["peak_allocated_bytes"]),
            peak_allocated_ns=_int(r["peak_allocated_ns"]),
            peak_reserved_bytes=_int(r["peak_reserved_bytes"]),
            peak_reserved_ns=_int(r["peak_reserved_ns"]),
            allocated_at_start_bytes=_int(r["allocated_at_start_bytes"]),
            reserved_at_start_bytes=_int(r["reserved_at_start_bytes"]),
            allocated_at_end_bytes=_int(r["allocated_at_end_bytes"]),
            device_memory_bytes=_int(r["device_memory_bytes"]),
            peak_allocated_fraction=_num(r["peak_allocated_fraction"]),
            peak_reserved_fraction=_num(r["peak_reserved_fraction"]),
        )
        for r in _rows(con, "SELECT * FROM memory_peaks ORDER BY rank, device")
    ]


def bucket_edges(bucket: int) -> tuple[int, int | None]:
    """The [lower, upper) edges in ns of a kernel-duration bucket (sql/launch_stats.sql duration_bucket)."""
    lower = 0 if bucket == 0 else HISTOGRAM_BASE_NS * 2 ** (bucket - 1)
    upper = None if bucket >= HISTOGRAM_BUCKETS - 1 else HISTOGRAM_BASE_NS * 2**bucket
    return lower, upper


def launch_stats(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None) -> list[StreamLaunchStats]:
    """Per stream of the analysed window, most kernels first: launch delay, launch cost, kernel durations and the
    kernel-duration histogram."""
    if not has_table(con, "launch_stats"):
        return []
    streams = _rows(
        con,
        """SELECT * FROM launch_stats WHERE scope = ? AND range_name IS NOT DISTINCT FROM ?
                            ORDER BY kernels DESC, rank, device, stream LIMIT ?""",
        [scope, range_name, MAX_STREAMS],
    )
    hist: dict[tuple[Any, Any, Any], list[DurationBucket]] = {}
    for h in _rows(
        con,
        """SELECT rank, device, stream, bucket, kernels, time_ns FROM kernel_duration_histogram
                           WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? ORDER BY bucket""",
        [scope, range_name],
    ):
        lo, hi = bucket_edges(int(h["bucket"]))
        hist.setdefault((h["rank"], h["device"], h["stream"]), []).append(
            DurationBucket(lower_ns=lo, upper_ns=hi, kernels=int(h["kernels"]), time_ns=int(h["time_ns"]))
        )

    def q(r: dict[str, Any], what: str) -> Quantiles:
        return Quantiles(p50=_int(r[f"{what}_p50_ns"]), p99=_int(r[f"{what}_p99_ns"]), max=_int(r[f"{what}_max_ns"]))

    return [
        StreamLaunchStats(
            rank=_int(s["rank"]),
            device=_int(s["device"]),
            stream=_int(s["stream"]),
            kernels=int(s["kernels"]),
            launched=int(s["launched"]),
            graph_kernels=int(s["graph_kernels"]),
            launch_calls=_int(s["launch_calls"]),
            launch_delay_ns=q(s, "launch_delay"),
            launch_cost_ns=q(s, "launch_cost"),
            kernel_ns=q(s, "kernel"),
            kernel_time_ns=int(s["kernel_ns"]),
            launch_time_ns=_int(s["launch_cost_ns"]),
            histogram=hist.get((s["rank"], s["device"], s["stream"]), []),
        )
        for s in streams
    ]
