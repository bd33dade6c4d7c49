"""The kernel roofline (SPEC §4), as the verdict and report.html read it: the SQL library's `kernel_roofline` table
macro (sql/kernel_roofline.sql — kernels grouped per kernel name or per op over an analysed window, each kernel
against the peak of its own precision, the group's class and bound from `kernel_class`) as records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import duckdb


@dataclass(frozen=True)
class KernelGroup:
    name: str
    kind: str
    count: int
    time_ns: float
    time_share: float
    flops: float | None
    bytes: float | None
    achieved_flop_s: float | None
    achieved_fraction_of_peak: float | None
    arithmetic_intensity: float | None
    bound: str
    achieved_bandwidth_bytes_s: float | None = None
    calls: int | None = None  # per op: distinct op calls whose kernels ran in the window
    kernel_class: str | None = None
    bandwidth_fraction_of_hbm: float | None = None
    bandwidth_above_hbm_peak: bool = False


def kernel_groups(
    con: duckdb.DuckDBPyConnection,
    scope: str,
    range_name: str | None,
    peak_flop_s: float | None = None,
    bandwidth_bytes_s: float | None = None,
    by: Literal["kernel", "op"] = "kernel",
) -> list[KernelGroup]:
    """Kernels grouped by name (or by op) over the analysed windows (clipped to them, FLOPs and bytes pro rata).
    The peak and bandwidth arguments are not used: every kernel is measured against its own GPU and precision."""
    rows = con.execute(
        """
        SELECT name, kind, count, time_ns, time_share, flops, bytes, achieved_flop_s, achieved_fraction_of_peak,
               arithmetic_intensity, bound, achieved_bandwidth_bytes_s, calls, class, bandwidth_fraction_of_hbm,
               bandwidth_above_hbm_peak
        FROM kernel_roofline($scope, $rn, $by)""",
        {"scope": scope, "rn": range_name, "by": by},
    ).fetchall()
    return [
        KernelGroup(
            name,
            kind,
            int(count),
            float(t),
            float(share or 0.0),
            flops,
            nbytes,
            rate,
            frac,
            ai,
            bound,
            bw,
            int(calls) if by == "op" else None,
            cls,
            bw_frac,
            bool(above),
        )
        for (name, kind, count, t, share, flops, nbytes, rate, frac, ai, bound, bw, calls, cls, bw_frac, above) in rows
    ]


def as_records(groups: list[KernelGroup], limit: int, by: Literal["kernel", "op"]) -> list[dict[str, Any]]:
    """The verdict's `top_kernels` / `top_ops` rows: the first `limit` groups by time."""
    out = []
    for g in groups[:limit]:
        d = asdict(g)
        if by == "kernel":
            d.pop("calls")
        else:
            d["op"] = d.pop("name")
            d["kernels"] = d.pop("count")
        out.append(d)
    return out
