"""The kernel roofline (SPEC §4): kernels aggregated per kernel name and per op over the analysed windows, with
FLOPs, bytes, arithmetic intensity, achieved FLOP/s and bandwidth, fraction of peak, and memory- or compute-bound
against the ridge point P / bandwidth. Read by the verdict (`top_kernels`, `top_ops`) and report.html."""

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


# Per op: the op that owns the kernel's FLOPs (the outermost with a FLOP model), else the op that launched it.
_KEYS = {"kernel": "k.name", "op": "coalesce(fo.name, lo.name, '(no op)')"}


def kernel_groups(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, peak_flop_s: float | None,
                  bandwidth_bytes_s: float | None, by: Literal["kernel", "op"] = "kernel") -> list[KernelGroup]:
    """Kernels grouped by name (or by op) over the analysed windows (clipped to them, FLOPs and bytes pro rata)."""
    rows = con.execute(f"""
        WITH w AS (
            SELECT rank, device, start_ns AS ws, end_ns AS we FROM windows
            WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND end_ns > start_ns
        ), k AS (
            SELECT {_KEYS[by]} AS key, k.kind, k.flops, k.bytes, k.start_ns, k.end_ns,
                   coalesce(k.flops_op_id, k.op_id) AS op,
                   greatest(0, least(k.end_ns, w.we) - greatest(k.start_ns, w.ws)) AS ov
            FROM kernels k ASOF JOIN w
              ON k.rank IS NOT DISTINCT FROM w.rank AND k.device = w.device AND k.end_ns > w.ws
            LEFT JOIN ops fo ON fo.op_id = k.flops_op_id LEFT JOIN ops lo ON lo.op_id = k.op_id
        ), c AS (
            SELECT *, CASE WHEN end_ns > start_ns THEN ov / (end_ns - start_ns) ELSE 1.0 END AS share,
                   sum(ov) OVER (PARTITION BY key, kind) AS kind_ns FROM k
            WHERE ov > 0
        )
        -- the group's kind: the kind of kernel it spent most time in (an op's GEMMs, not its workspace memsets)
        SELECT key, arg_max(kind, kind_ns), count(*), sum(ov)::DOUBLE,
               sum(flops * share) FILTER (WHERE flops > 0),
               sum(flops * share) FILTER (WHERE flops > 0 AND bytes > 0),
               sum(bytes * share) FILTER (WHERE flops > 0 AND bytes > 0),
               sum(bytes * share) FILTER (WHERE bytes > 0),
               sum(ov) FILTER (WHERE bytes > 0)::DOUBLE, count(DISTINCT op)
        FROM c GROUP BY key ORDER BY sum(ov) DESC, key""", {"scope": scope, "rn": range_name}).fetchall()
    total = sum(r[3] for r in rows) or 1.0
    ridge = peak_flop_s / bandwidth_bytes_s if peak_flop_s and bandwidth_bytes_s else None
    out = []
    for name, kind, count, t, flops, f_ai, b_ai, nbytes, t_bytes, calls in rows:
        rate = flops / (t / 1e9) if flops and t else None
        ai = f_ai / b_ai if f_ai and b_ai else None
        if kind == "nccl":
            bound = "communication"
        elif kind in ("memcpy", "memset"):
            bound = "copy"
        elif not flops:
            bound = "memory (no FLOPs)" if nbytes else "no FLOP estimate"
        elif ai is None or ridge is None:
            bound = "compute (no bytes)" if ai is None else "unknown"
        else:
            bound = "memory" if ai < ridge else "compute"
        out.append(KernelGroup(name, kind, count, t, t / total, flops, nbytes, rate,
                               rate / peak_flop_s if rate and peak_flop_s else None, ai, bound,
                               nbytes / (t_bytes / 1e9) if nbytes and t_bytes else None,
                               calls if by == "op" else None))
    return out


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
