"""A plain CSV of NVML samples (`wall_ns,` + metric columns, as a small pynvml logger writes it) → `counters`.

`wall_ns` is UTC epoch ns (time.time_ns()). Metric columns are matched by name with an optional unit suffix
(`gpu_util_pct`, `power_mw`, `mem_used_bytes`); a utilisation without a suffix is percent, NVML's own unit.
Optional identity columns: `gpu`/`index`/`gpu_index`, `uuid`/`gpu_uuid`, `bus_id`/`pci_bus_id`, `name`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from . import _counters as C
from ._polars import pl
from .base import Format, ParseOptions, Sniff, SourceInfo

# Unit suffix → (unit, factor to the vocabulary's unit). Checked longest first.
SUFFIXES = {
    "_pct": ("%", 0.01),
    "_percent": ("%", 0.01),
    "_frac": ("1", 1.0),
    "_ratio": ("1", 1.0),
    "_mw": ("W", 1e-3),
    "_w": ("W", 1.0),
    "_watts": ("W", 1.0),
    "_mhz": ("MHz", 1.0),
    "_bytes": ("B", 1.0),
    "_mib": ("B", float(1 << 20)),
    "_mb": ("B", float(1 << 20)),
    "_c": ("C", 1.0),
    "_mj": ("J", 1e-3),
    "_j": ("J", 1.0),
    "_bytes_s": ("B/s", 1.0),
    "_kb_s": ("B/s", 1024.0),
}
ALIASES = {
    "gpu_util": "gpu_util",
    "util_gpu": "gpu_util",
    "utilization_gpu": "gpu_util",
    "gpu_utilization": "gpu_util",
    "mem_util": "mem_util",
    "util_mem": "mem_util",
    "utilization_memory": "mem_util",
    "memory_util": "mem_util",
    "sm_clock": "sm_clock_mhz",
    "clock_sm": "sm_clock_mhz",
    "clocks_sm": "sm_clock_mhz",
    "mem_clock": "mem_clock_mhz",
    "clock_mem": "mem_clock_mhz",
    "clocks_mem": "mem_clock_mhz",
    "gr_clock": "graphics_clock_mhz",
    "graphics_clock": "graphics_clock_mhz",
    "power": "power_w",
    "power_draw": "power_w",
    "power_usage": "power_w",
    "mem_used": "fb_used_bytes",
    "memory_used": "fb_used_bytes",
    "fb_used": "fb_used_bytes",
    "mem_free": "fb_free_bytes",
    "memory_free": "fb_free_bytes",
    "fb_free": "fb_free_bytes",
    "temp": "temp_c",
    "temperature": "temp_c",
    "gpu_temp": "temp_c",
    "mem_temp": "mem_temp_c",
    "energy": "energy_j",
    "total_energy": "energy_j",
    "pcie_tx": "pcie_tx_bytes_s",
    "pcie_rx": "pcie_rx_bytes_s",
    "enc_util": "enc_util",
    "dec_util": "dec_util",
}
DEFAULT_FACTOR = {"power_w": 1.0, "energy_j": 1e-3}  # NVML gives mJ for energy
IDENTITY = {
    "gpu": "gpu_index",
    "index": "gpu_index",
    "gpu_index": "gpu_index",
    "device": "gpu_index",
    "uuid": "gpu_uuid",
    "gpu_uuid": "gpu_uuid",
    "bus_id": "bus_id",
    "pci_bus_id": "bus_id",
    "name": "name",
}


def metric_of(column: str) -> tuple[str, float] | None:
    """('gpu_util', 0.01) for 'gpu_util_pct'; None for a column we do not know."""
    c = column.strip().lower().replace(".", "_").replace("-", "_")
    if c in C.METRICS and not c.endswith(("_util", "_active", "_occupancy")):
        return c, 1.0
    for suf in sorted(SUFFIXES, key=len, reverse=True):
        if c.endswith(suf) and c[: -len(suf)] in ALIASES:
            return ALIASES[c[: -len(suf)]], SUFFIXES[suf][1]
    if c in ALIASES:
        m = ALIASES[c]
        return m, 0.01 if m in C.FRACTION_METRICS else DEFAULT_FACTOR.get(m, 1.0)
    if c in C.METRICS:  # a utilisation named by the vocabulary, no unit: percent (NVML's unit)
        return c, 0.01
    return None


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    lines = C.lines_frame(C.read_text(path))
    if lines.height == 0:
        raise BadInput(path, "empty file")
    header = [h.strip() for h in lines["line"][0].split(",")]
    if not header or header[0] != "wall_ns":
        raise BadInput(path, "NVML CSV must start with a 'wall_ns,' header")
    body = lines.slice(1).filter(pl.col("line").str.strip_chars() != "")
    body = body.filter(pl.col("line").str.strip_chars() != lines["line"][0].strip())  # appended runs repeat it
    ncols = len(header)
    body = body.with_columns((pl.col("line").str.count_matches(",") + 1).alias("_n"))
    bad = body.filter(pl.col("_n") != ncols)
    good = body.filter(pl.col("_n") == ncols)
    fields = [f"c{i}" for i in range(ncols)]
    frame = good.with_columns(pl.col("line").str.split(",").list.to_struct(fields=fields).alias("_s")).unnest("_s")
    wall = frame["c0"].str.strip_chars().cast(pl.Int64, strict=False)
    frame = frame.with_columns(wall.alias("t_ns"))
    # A truncated last line can still parse: keep times within a day of the median (a log is not longer).
    med = frame["t_ns"].median()
    ok = pl.col("t_ns").is_not_null()
    if med is not None:
        ok = ok & ((pl.col("t_ns") - int(float(med))).abs() < 86_400 * 10**9 * 30)  # type: ignore[arg-type]
    bad_times = frame.filter(~ok)
    frame = frame.filter(ok)
    notes = C.skipped_note(
        bad.height + bad_times.height, min([*bad["lineno"].to_list()[:1], *bad_times["lineno"].to_list()[:1]], default=None)
    )
    cols: dict[str, pl.Expr] = {}
    ident: dict[str, pl.Expr] = {}
    ignored = []
    for i, h in enumerate(header[1:], start=1):
        key = h.strip().lower()
        if key in IDENTITY:
            ident[IDENTITY[key]] = pl.col(f"c{i}").str.strip_chars()
            continue
        m = metric_of(h)
        if m is None or m[0] in cols:
            ignored.append(h)
            continue
        metric, factor = m
        cols[metric] = pl.col(f"c{i}").str.strip_chars().cast(pl.Float64, strict=False) * factor
    if not cols:
        raise BadInput(path, f"NVML CSV has no metric column we know (columns: {', '.join(header[1:])})")
    if ignored:
        notes.append(f"columns not read: {', '.join(ignored)}")
    wide = frame.select(
        pl.col("t_ns"),
        pl.col("c0").alias("raw_time"),
        (ident["gpu_index"].cast(pl.Int32, strict=False) if "gpu_index" in ident else pl.lit(0, pl.Int32)).alias("gpu_index"),
        (ident["gpu_uuid"] if "gpu_uuid" in ident else pl.lit(None, pl.Utf8)).alias("gpu_uuid"),
        pl.lit(None, pl.Utf8).alias("entity"),
        *[e.alias(m) for m, e in cols.items()],
    )
    if wide.height == 0:
        raise BadInput(path, "NVML CSV has no sample rows")
    w = C.emit(con, source_id, wide, "native")
    notes += w.notes
    if "gpu_index" not in ident:
        notes.append("no GPU column: samples taken to be of GPU 0")
    if "gpu_uuid" in ident or "bus_id" in ident or "name" in ident:
        dev = frame.select(
            (ident.get("gpu_index", pl.lit("0"))).alias("i"),
            (ident.get("gpu_uuid", pl.lit(None))).alias("u"),
            (ident.get("bus_id", pl.lit(None))).alias("b"),
            (ident.get("name", pl.lit(None))).alias("n"),
        ).unique()
        C.add_devices(
            con,
            source_id,
            [(int(i) if i is not None and str(i).isdigit() else None, u, b, n, None) for i, u, b, n in dev.iter_rows()],
        )
    return SourceInfo(
        format="nvml-csv",
        format_version=f"columns: {', '.join(header)}",
        rank=None,
        rank_method="counters",
        clock_anchor="native",
        events=w.rows,
        notes=notes,
        sample_period_ns=w.effective_period_ns,
    )


def sniff(s: Sniff) -> str | None:
    return "nvml-csv" if s.first_line.startswith("wall_ns,") else None


FORMATS = (Format("nvml-csv", "NVML samples CSV", ingest, auxiliary=True),)
