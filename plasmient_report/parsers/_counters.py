"""Shared by the device-counter parsers (NVML CSV, nvidia-smi, dcgmi, dcgm-exporter): the fixed metric
vocabulary, local time → UTC, and one writer that turns a wide frame of samples into `counters` intervals.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from ..errors import BadInput
from ._polars import pl

# The vocabulary of `counters.metric` (docs/schema.md lists it). Utilisations are fractions 0–1.
METRICS: dict[str, str] = {
    "gpu_util": "fraction of the sample period a kernel was running (NVML utilization.gpu, dmon sm, DCGM GPUTL)",
    "mem_util": "fraction of the period device memory was read or written (NVML utilization.memory, DCGM MCUTL)",
    "gr_engine_active": "graphics/compute engine active ratio (DCGM GRACT)",
    "sm_active": "ratio of cycles an SM had at least one warp resident (DCGM SMACT)",
    "sm_occupancy": "resident warps / maximum warps, averaged over SMs (DCGM SMOCC)",
    "tensor_active": "tensor pipe active ratio (DCGM TENSO)",
    "tensor_imma_active": "integer tensor pipe active ratio (DCGM TIMMA)",
    "tensor_hmma_active": "half-precision tensor pipe active ratio (DCGM THMMA)",
    "tensor_dfma_active": "FP64 tensor pipe active ratio (DCGM TDFMA)",
    "dram_active": "ratio of cycles the memory interface was busy (DCGM DRAMA)",
    "fp16_active": "FP16 pipe active ratio (DCGM FP16A)",
    "fp32_active": "FP32 pipe active ratio (DCGM FP32A)",
    "fp64_active": "FP64 pipe active ratio (DCGM FP64A)",
    "int_active": "integer pipe active ratio (DCGM INTAC)",
    "enc_util": "video encoder utilisation",
    "dec_util": "video decoder utilisation",
    "jpg_util": "JPEG decoder utilisation",
    "ofa_util": "optical-flow accelerator utilisation",
    "pcie_tx_bytes_s": "PCIe transmit throughput, bytes/s",
    "pcie_rx_bytes_s": "PCIe receive throughput, bytes/s",
    "nvlink_tx_bytes_s": "NVLink transmit throughput, bytes/s",
    "nvlink_rx_bytes_s": "NVLink receive throughput, bytes/s",
    "power_w": "board power draw, W",
    "energy_j": "total energy since driver load, J (a counter)",
    "sm_clock_mhz": "SM clock, MHz",
    "mem_clock_mhz": "memory clock, MHz",
    "graphics_clock_mhz": "graphics clock, MHz",
    "temp_c": "GPU temperature, °C",
    "mem_temp_c": "memory (HBM) temperature, °C",
    "fb_used_bytes": "device memory used, bytes",
    "fb_free_bytes": "device memory free, bytes",
    "bar1_used_bytes": "BAR1 memory used, bytes",
    "power_violation": "fraction of the period clocks were held down by the power cap (dmon pviol)",
    "thermal_violation": "1 when clocks were held down thermally in the period (dmon tviol)",
    "fan_speed": "fan speed, fraction of maximum",
    "ecc_sbe_errors": "single-bit ECC errors in the period",
    "ecc_dbe_errors": "double-bit ECC errors in the period",
    "pcie_replay_errors": "PCIe replay errors in the period",
}
FRACTION_METRICS = frozenset(m for m in METRICS if m.endswith(("_util", "_active", "_occupancy"))) | {
    "power_violation",
    "fan_speed",
}
# What a sample of each kind of metric can be (a value outside is a logging glitch or a corrupt line: left out and
# counted, never passed on — a utilization of 2.5 would read as 250% busy). Units are the vocabulary's.
_PLAUSIBLE_BY_SUFFIX: tuple[tuple[str, tuple[float, float]], ...] = (
    ("_bytes_s", (0.0, 1e13)),
    ("_bytes", (0.0, 1e15)),
    ("_mhz", (0.0, 1e4)),
    ("_c", (-60.0, 200.0)),
    ("_w", (0.0, 1e4)),
    ("_j", (0.0, 1e15)),
    ("_errors", (0.0, 1e12)),
)


def plausible_range(metric: str) -> tuple[float, float]:
    if metric in FRACTION_METRICS or metric == "thermal_violation":
        return (0.0, 1.0 + 1e-9)
    return next((r for suf, r in _PLAUSIBLE_BY_SUFFIX if metric.endswith(suf)), (-1e15, 1e15))


# Which metric, in order of preference, stands for "utilization" when aligning a log to a trace.
UTIL_PREFERENCE = ("gpu_util", "gr_engine_active", "sm_active")

# Columns of a parser's wide frame besides the metric columns.
ID_COLUMNS = ("t_ns", "raw_time", "gpu_index", "gpu_uuid", "entity")


def local_zone() -> str:
    """This machine's IANA time zone (TZ, /etc/localtime, /etc/timezone), UTC when it cannot be told."""
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz and _valid_zone(tz):
        return tz
    with contextlib.suppress(OSError):
        target = os.path.realpath("/etc/localtime")
        if "zoneinfo/" in target:
            name = target.split("zoneinfo/", 1)[1]
            if _valid_zone(name):
                return name
    with contextlib.suppress(OSError):
        name = Path("/etc/timezone").read_text().strip()
        if name and _valid_zone(name):
            return name
    return "UTC"


def _valid_zone(name: str) -> bool:
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(name)
        return True
    except Exception:
        return False


def resolve_zone(tz: str | None) -> tuple[str, bool]:
    """(zone, given): the zone to read local times in, and whether the user chose it."""
    if tz:
        if not _valid_zone(tz):
            raise BadInput(None, f"unknown time zone {tz!r} for --tz (use an IANA name such as Europe/Berlin or UTC)")
        return tz, True
    return local_zone(), False


def local_to_utc_ns(naive: pl.Series, zone: str) -> pl.Series:
    """Naive local datetimes → UTC epoch ns in `zone` (DST-aware; an ambiguous hour takes the earlier)."""
    return naive.dt.replace_time_zone(zone, ambiguous="earliest", non_existent="null").dt.epoch("ns").cast(pl.Int64)


def zone_note(what: str, zone: str, given: bool) -> str:
    how = "given with --tz" if given else "this machine's zone, pass --tz if the log was written elsewhere"
    return f"{what} times are local time, read as {zone} ({how})"


@dataclass
class Written:
    rows: int
    period_ns: int | None
    effective_period_ns: int | None
    gpus: int
    notes: list[str] = field(default_factory=list)  # samples left out (implausible values), to add to the source


def median_period_ns(t_ns: np.ndarray) -> int | None:
    u = np.unique(t_ns)
    if len(u) < 2:
        return None
    d = np.diff(u)
    d = d[d > 0]
    return int(np.median(d)) if len(d) else None


def effective_period_ns(t_ns: np.ndarray, values: np.ndarray, period_ns: int) -> int:
    """How often the values actually change. NVML updates utilization every ~1/6–1 s, so a logger sampling
    every 10 ms repeats each value ~20 times: the lower quartile of the held runs' durations, when runs
    of several samples are the rule; else the sampling period."""
    ok = ~np.isnan(values)
    t, v = t_ns[ok], values[ok]
    if len(v) < 8:
        return period_ns
    change = np.flatnonzero(np.diff(v) != 0) + 1
    if len(change) < 4:
        return period_ns
    run_samples = np.diff(change)
    run_ns = np.diff(t[change])
    if np.median(run_samples) < 2:
        return period_ns
    return int(max(period_ns, np.quantile(run_ns, 0.25)))


def emit(
    con: duckdb.DuckDBPyConnection, source_id: int, wide: pl.DataFrame, time_source: str, period_ns: int | None = None
) -> Written:
    """Write a wide frame (ID_COLUMNS + vocabulary metric columns, values already in base units) into
    `counters` as intervals [t − period, t]. The period is each GPU's median sample spacing unless given."""
    metric_cols = [c for c in wide.columns if c in METRICS]
    unknown = [c for c in wide.columns if c not in METRICS and c not in ID_COLUMNS]
    if unknown:
        raise AssertionError(f"parser produced columns outside the vocabulary: {unknown}")
    notes: list[str] = []
    bad: dict[str, int] = {}
    for c in metric_cols:
        lo, hi = plausible_range(c)
        col = pl.col(c).cast(pl.Float64)
        n = wide.select((col.is_not_null() & (~col.is_finite() | (col < lo) | (col > hi))).sum()).item()
        if n:
            bad[c] = int(n)
            wide = wide.with_columns(pl.when(col.is_finite() & (col >= lo) & (col <= hi)).then(col).otherwise(None).alias(c))
    if bad:
        notes.append("implausible samples left out: " + ", ".join(f"{n} of {m} (outside {_span(m)})" for m, n in bad.items()))
    for c in ID_COLUMNS:
        if c not in wide.columns:
            wide = wide.with_columns(
                pl.lit(None, dtype=pl.Int32 if c == "gpu_index" else pl.Int64 if c == "t_ns" else pl.Utf8).alias(c)
            )
    # a time before 1970 (UTC epoch ns below 0) or after 2116 (2**62 ns) is no time of a sample: differences of
    # two must fit in int64, and a negative epoch time is a corrupt line or a clock that was never set
    before = wide.height
    wide = wide.filter(pl.col("t_ns").is_not_null() & pl.col("t_ns").is_between(0, 2**62))
    if wide.height < before:
        notes.append(f"{before - wide.height} samples left out: no time, or a time before 1970 or after 2116")
    if wide.height == 0 or not metric_cols:
        return Written(0, period_ns, period_ns, 0, notes)
    key = pl.concat_str(
        [pl.col("gpu_index").cast(pl.Utf8).fill_null(""), pl.col("entity").fill_null(""), pl.col("gpu_uuid").fill_null("")],
        separator="|",
    )
    wide = wide.with_columns(key.alias("_gpu"))
    periods: dict[str, int] = {}
    effective: list[int] = []
    util_col = next((m for m in UTIL_PREFERENCE if m in metric_cols), None)
    for (g,), part in wide.sort("t_ns").group_by(["_gpu"], maintain_order=True):
        t = part["t_ns"].to_numpy()
        p = period_ns or median_period_ns(t) or 1_000_000_000
        periods[str(g)] = p
        if util_col is not None:
            effective.append(effective_period_ns(t, part[util_col].cast(pl.Float64).fill_null(np.nan).to_numpy(), p))
    per = pl.DataFrame({"_gpu": list(periods), "_period": list(periods.values())}, schema={"_gpu": pl.Utf8, "_period": pl.Int64})
    long = (
        wide.join(per, on="_gpu", how="left")
        .select(
            ["t_ns", "raw_time", "gpu_index", "gpu_uuid", "entity", "_period", *[pl.col(c).cast(pl.Float64) for c in metric_cols]]
        )
        .unpivot(
            index=["t_ns", "raw_time", "gpu_index", "gpu_uuid", "entity", "_period"],
            on=metric_cols,
            variable_name="metric",
            value_name="value",
        )
        .filter(pl.col("value").is_not_null() & pl.col("value").is_finite())
        .with_columns((pl.col("t_ns") - pl.col("_period")).alias("start_ns"))
        .sort(["gpu_index", "metric", "t_ns"])
    )
    tbl = long.to_arrow()
    con.register("_counter_rows", tbl)
    con.execute(f"""
        INSERT INTO counters (source_id, rank, device, gpu_index, gpu_uuid, entity, metric, start_ns, end_ns,
                              value, time_source, raw_time)
        SELECT {int(source_id)}, NULL, gpu_index, gpu_index, gpu_uuid, entity, metric, start_ns, t_ns, value,
               '{time_source}', raw_time
        FROM _counter_rows""")
    con.unregister("_counter_rows")
    nominal = int(np.median(list(periods.values()))) if periods else period_ns
    eff = int(np.median(effective)) if effective else nominal
    return Written(long.height, nominal, eff, len(periods), notes)


def _span(metric: str) -> str:
    lo, hi = plausible_range(metric)
    if metric in FRACTION_METRICS or metric == "thermal_violation":
        return "0–100%"
    return f"{lo:g}–{hi:g}"


def add_devices(con: duckdb.DuckDBPyConnection, source_id: int, rows: Sequence[tuple]) -> None:
    """`devices` rows for the GPUs a log names: (index, uuid, bus_id, name, memory_bytes)."""
    seen: set[tuple] = set()
    for idx, uuid, bus, name, mem in rows:
        key = (idx, uuid, bus)
        if key in seen or (uuid is None and bus is None and name is None):
            continue
        seen.add(key)
        vendor = "NVIDIA" if name and "NVIDIA" in name else None
        con.execute(
            "INSERT INTO devices (source_id, rank, device, gpu_uuid, bus_id, name, memory_bytes, vendor) "
            "VALUES (?, NULL, ?, ?, ?, ?, ?, ?)",
            [source_id, idx, uuid, bus, name, mem, vendor],
        )


def number(s: str | None) -> float | None:
    """A logged value: '79.29', '79.29 W', '-', 'N/A', '[N/A]', '[Not Supported]' → float or None."""
    if s is None:
        return None
    s = s.strip()
    if not s or s[0] in "[-" and (len(s) == 1 or s.startswith("[")) or s.upper() in ("N/A", "NA", "NAN"):
        return None
    head = s.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


def skipped_note(n_bad: int, first_line: int | None, what: str = "lines") -> list[str]:
    if not n_bad:
        return []
    return [f"{n_bad} malformed {what} skipped (first at line {first_line})"]


def read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        from ._io import read_maybe_gzip

        raw = bytes(read_maybe_gzip(path))
    return raw.decode("utf-8", "replace")


def lines_frame(text: str) -> pl.DataFrame:
    """The file's lines with their 1-based numbers, as columns (the parsers filter and split them in polars)."""
    lines = text.splitlines()
    return pl.DataFrame(
        {"lineno": np.arange(1, len(lines) + 1, dtype=np.int64), "line": lines}, schema={"lineno": pl.Int64, "line": pl.Utf8}
    )


def file_mtime_ns(path: Path) -> int:
    return path.stat().st_mtime_ns
