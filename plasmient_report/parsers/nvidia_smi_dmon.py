"""`nvidia-smi dmon` (`-o DT`, `-o T`, or no time) → `counters`.

Two `#` header lines (names, units) that repeat; rows of whitespace-separated values, `-` when missing.
Columns are read by header name. Times are local (read in --tz); `-o T` has no date (taken from the file's
mtime); without a time column samples are placed at mtime − k·period (--dcgm-period), low confidence.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from ..errors import BadInput
from . import _counters as C
from ._polars import pl
from .base import Format, ParseOptions, Sniff, SourceInfo

MIB = float(1 << 20)
# dmon column → (metric, factor). `sm` is NVML utilization.gpu; `pclk` the SM (processor) clock.
COLUMNS: dict[str, tuple[str, float]] = {
    "pwr": ("power_w", 1.0),
    "gtemp": ("temp_c", 1.0),
    "mtemp": ("mem_temp_c", 1.0),
    "sm": ("gpu_util", 0.01),
    "mem": ("mem_util", 0.01),
    "enc": ("enc_util", 0.01),
    "dec": ("dec_util", 0.01),
    "jpg": ("jpg_util", 0.01),
    "ofa": ("ofa_util", 0.01),
    "mclk": ("mem_clock_mhz", 1.0),
    "pclk": ("sm_clock_mhz", 1.0),
    "pviol": ("power_violation", 0.01),
    "tviol": ("thermal_violation", 1.0),
    "fb": ("fb_used_bytes", MIB),
    "bar1": ("bar1_used_bytes", MIB),
    "sbecc": ("ecc_sbe_errors", 1.0),
    "dbecc": ("ecc_dbe_errors", 1.0),
    "pci": ("pcie_replay_errors", 1.0),
    "rxpci": ("pcie_rx_bytes_s", MIB),
    "txpci": ("pcie_tx_bytes_s", MIB),
}


def looks_like_dmon(first_line: str) -> bool:
    toks = first_line.lstrip("#").replace(",", " ").split()
    return first_line.startswith("#") and "gpu" in toks and any(t in COLUMNS for t in toks)


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    opts = options or ParseOptions()
    lines = C.lines_frame(C.read_text(path))
    # `--format csv` variants separate with commas; blank lines and Ctrl-C leftovers are not data.
    lines = lines.with_columns(pl.col("line").str.replace_all(",", " ").str.strip_chars().alias("line"))
    lines = lines.filter(pl.col("line") != "")
    headers = lines.filter(pl.col("line").str.starts_with("#"))
    names_rows = [r for r in headers["line"].to_list() if "gpu" in r.lstrip("#").split()]
    if not names_rows:
        raise BadInput(path, "nvidia-smi dmon log without its '# gpu …' header line")
    names = [t.lower() for t in names_rows[0].lstrip("#").split()]
    if any(r.lstrip("#").split() != names_rows[0].lstrip("#").split() for r in names_rows[1:]):
        raise BadInput(
            path,
            "nvidia-smi dmon log whose header changes midway (several runs appended with other "
            "-s options?): split it into one file per run",
        )
    data = lines.filter(~pl.col("line").str.starts_with("#"))
    data = data.with_columns(pl.col("line").str.split(by=" ").list.eval(pl.element().filter(pl.element() != "")).alias("tok"))
    n = len(names)
    data = data.with_columns(pl.col("tok").list.len().alias("_n"))
    bad = data.filter(pl.col("_n") != n)
    fields = [f"c{i}" for i in range(n)]
    frame = data.filter(pl.col("_n") == n).with_columns(pl.col("tok").list.to_struct(fields=fields).alias("_s")).unnest("_s")
    gi = names.index("gpu")
    frame = frame.with_columns(pl.col(f"c{gi}").cast(pl.Int32, strict=False).alias("gpu_index"))
    bad_gpu = frame.filter(pl.col("gpu_index").is_null())
    frame = frame.filter(pl.col("gpu_index").is_not_null())
    notes = C.skipped_note(
        bad.height + bad_gpu.height, min([*bad["lineno"].to_list()[:1], *bad_gpu["lineno"].to_list()[:1]], default=None)
    )
    if frame.height == 0:
        raise BadInput(path, "nvidia-smi dmon log has no sample rows")
    zone_name, given = C.resolve_zone(opts.tz)
    zone: str | None = zone_name
    period_ns = None
    if "date" in names and "time" in names:
        di, ti = names.index("date"), names.index("time")
        raw = pl.concat_str([pl.col(f"c{di}"), pl.col(f"c{ti}")], separator=" ")
        frame = frame.with_columns(raw.alias("raw_time"))
        naive = frame["raw_time"].str.strptime(pl.Datetime("ns"), "%Y%m%d %H:%M:%S", strict=False)
        frame = frame.with_columns(C.local_to_utc_ns(naive, zone_name).alias("t_ns"))
        anchor, version = "anchored", "-o DT"
        notes.append(C.zone_note("nvidia-smi dmon", zone_name, given))
    elif "time" in names:
        ti = names.index("time")
        frame = frame.with_columns(pl.col(f"c{ti}").alias("raw_time"))
        frame = frame.with_columns(_dated_from_mtime(frame["raw_time"], path, zone_name).alias("t_ns"))
        anchor, version = "anchored", "-o T"
        notes.append(C.zone_note("nvidia-smi dmon", zone_name, given))
        notes.append("-o T log has no date: the date was taken from the file's modification time")
    else:
        period_ns = int(round(opts.dcgm_period_s * 1e9))
        it = _iterations(frame["gpu_index"].to_numpy())
        end = C.file_mtime_ns(path)
        t = end - (it.max() - it) * period_ns
        frame = frame.with_columns(pl.Series("t_ns", t, dtype=pl.Int64), pl.lit(None, pl.Utf8).alias("raw_time"))
        anchor, version, zone = "synthesized", "no time column", None
        notes.append(
            f"no time column: sample k placed at file mtime − (n−1−k)·{opts.dcgm_period_s:g} s "
            "(--dcgm-period); low confidence until aligned to a trace"
        )
    bad_t = frame.filter(pl.col("t_ns").is_null())
    if bad_t.height:
        notes += C.skipped_note(bad_t.height, bad_t["lineno"][0], "timestamps")
        frame = frame.filter(pl.col("t_ns").is_not_null())
    metrics: dict[str, pl.Expr] = {}
    ignored = []
    for i, name in enumerate(names):
        if name in ("date", "time", "gpu"):
            continue
        if name in COLUMNS and COLUMNS[name][0] not in metrics:
            m, f = COLUMNS[name]
            metrics[m] = pl.col(f"c{i}").cast(pl.Float64, strict=False) * f
        else:
            ignored.append(name)
    if ignored:
        notes.append(f"columns not read: {', '.join(ignored)}")
    wide = frame.select(
        pl.col("t_ns"),
        pl.col("raw_time"),
        pl.col("gpu_index"),
        pl.lit(None, pl.Utf8).alias("gpu_uuid"),
        pl.lit(None, pl.Utf8).alias("entity"),
        *[e.alias(m) for m, e in metrics.items()],
    )
    w = C.emit(con, source_id, wide, anchor, period_ns)
    notes += w.notes
    return SourceInfo(
        format="nvidia-smi-dmon",
        format_version=version,
        rank=None,
        rank_method="counters",
        clock_anchor=anchor,
        events=w.rows,
        notes=notes,
        time_zone=zone,
        sample_period_ns=w.effective_period_ns,
    )


def _iterations(gpu_index: np.ndarray) -> np.ndarray:
    """Iteration number of each row: dmon prints every GPU once per iteration, in index order."""
    new = np.ones(len(gpu_index), dtype=bool)
    new[1:] = gpu_index[1:] <= gpu_index[:-1]
    return np.cumsum(new) - 1


def _dated_from_mtime(times: pl.Series, path: Path, zone: str) -> pl.Series:
    """HH:MM:SS rows → UTC ns: the last row is on the mtime's local date (or the day before when its time is
    later than the mtime's), and each backwards jump in the time of day is midnight passing."""
    from zoneinfo import ZoneInfo

    tod = times.str.strptime(pl.Time, "%H:%M:%S", strict=False)
    s = (tod.cast(pl.Int64) // 1_000_000_000).fill_null(-1).to_numpy().astype(np.int64)
    valid = s >= 0
    day = np.concatenate([[0], np.cumsum(np.diff(s) < -3600)]) if len(s) else np.zeros(0, dtype=np.int64)
    mtime = dt.datetime.fromtimestamp(C.file_mtime_ns(path) / 1e9, ZoneInfo(zone))
    last_date = mtime.date()
    if len(s) and s[-1] > mtime.hour * 3600 + mtime.minute * 60 + mtime.second + 60:
        last_date -= dt.timedelta(days=1)
    first_date = last_date - dt.timedelta(days=int(day[-1]) if len(day) else 0)
    base_ns = (dt.datetime.combine(first_date, dt.time()) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1) * 1000
    naive_ns = np.where(valid, base_ns + (day * 86_400 + s) * 1_000_000_000, 0)
    naive = pl.Series(naive_ns, dtype=pl.Int64).cast(pl.Datetime("ns"))
    naive = pl.select(pl.when(pl.Series(valid)).then(naive).otherwise(None)).to_series()
    return C.local_to_utc_ns(naive, zone)


def sniff(s: Sniff) -> str | None:
    first = s.first_line
    if (first.startswith("#") and " gpu " in f" {first} " and ("pwr" in first or " sm " in first)) or looks_like_dmon(first):
        return "nvidia-smi-dmon"
    return None


FORMATS = (Format("nvidia-smi-dmon", "nvidia-smi dmon log", ingest, auxiliary=True),)
