"""`nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits] -lms N` → `counters` (and `devices`).

Times are local `YYYY/MM/DD HH:MM:SS.mmm` without a zone: read in --tz (default: this machine's zone).
Values carry units unless `nounits`; `[N/A]` / `[Not Supported]` are missing. The header names the fields in the
order they were asked for (`timestamp` anywhere among them) and may repeat in the body (a loop of nvidia-smi
calls appending to one file). Without a header the columns are guessed from the first row's units (a header-less,
unit-less file cannot be read and is refused). Without an index, uuid or pci.bus_id column, the GPUs of a sample
are told apart by their order: nvidia-smi prints one row per GPU per sample, by index.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import BadInput
from . import _counters as C
from ._polars import pl
from .base import Format, ParseOptions, Sniff, SourceInfo

TIME_RE = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?$")
BUS_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
MIB = float(1 << 20)
# Query field → (metric, factor). nvidia-smi normalises some names (clocks.sm → clocks.current.sm).
FIELDS: dict[str, tuple[str, float]] = {
    "utilization.gpu": ("gpu_util", 0.01),
    "utilization.memory": ("mem_util", 0.01),
    "utilization.encoder": ("enc_util", 0.01),
    "utilization.decoder": ("dec_util", 0.01),
    "utilization.jpeg": ("jpg_util", 0.01),
    "utilization.ofa": ("ofa_util", 0.01),
    "clocks.current.sm": ("sm_clock_mhz", 1.0),
    "clocks.sm": ("sm_clock_mhz", 1.0),
    "clocks.current.memory": ("mem_clock_mhz", 1.0),
    "clocks.mem": ("mem_clock_mhz", 1.0),
    "clocks.current.graphics": ("graphics_clock_mhz", 1.0),
    "clocks.gr": ("graphics_clock_mhz", 1.0),
    "power.draw": ("power_w", 1.0),
    "power.draw.average": ("power_w", 1.0),
    "power.draw.instant": ("power_w", 1.0),
    "temperature.gpu": ("temp_c", 1.0),
    "temperature.memory": ("mem_temp_c", 1.0),
    "memory.used": ("fb_used_bytes", MIB),
    "memory.free": ("fb_free_bytes", MIB),
    "fan.speed": ("fan_speed", 0.01),
}
IDENTITY = {
    "timestamp": "time",
    "index": "gpu_index",
    "uuid": "gpu_uuid",
    "gpu_uuid": "gpu_uuid",
    "name": "name",
    "gpu_name": "name",
    "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id",
    "memory.total": "memory_total",
}


FIELD_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*$")


def field_name(header_item: str) -> str:
    """A header's field without its unit: 'utilization.gpu [%]' → 'utilization.gpu'."""
    return re.sub(r"\s*\[.*\]$", "", header_item).strip().lower()


def header_fields(line: str) -> list[str] | None:
    """The header's items (as written) when `line` is a --query-gpu header: query field names, one of them
    `timestamp` and another one this parser knows; else None."""
    raw = [h.strip() for h in line.split(",")]
    names = [field_name(h) for h in raw]
    if len(names) < 2 or "timestamp" not in names or not all(FIELD_NAME_RE.match(n) for n in names):
        return None
    if not any(n in FIELDS or (n in IDENTITY and n != "timestamp") for n in names):
        return None
    return raw


def looks_headerless(first_line: str) -> bool:
    parts = [p.strip() for p in first_line.split(",")]
    return len(parts) >= 2 and bool(TIME_RE.match(parts[0]))


def _guess_header(row: list[str], path: Path) -> tuple[list[str], str]:
    """Column names for a header-less file, from the first row's values and units."""
    names: list[str] = []
    pct = ["utilization.gpu", "utilization.memory", "utilization.encoder", "utilization.decoder"]
    mhz = ["clocks.current.sm", "clocks.current.memory"]
    mib = ["memory.used", "memory.total"]
    plain_int_seen = False
    for i, v in enumerate(row):
        v = v.strip()
        if i == 0 and TIME_RE.match(v):
            names.append("timestamp")
        elif v.startswith("GPU-"):
            names.append("uuid")
        elif BUS_RE.match(v):
            names.append("pci.bus_id")
        elif v.endswith(" %") and pct:
            names.append(pct.pop(0))
        elif v.endswith(" MHz") and mhz:
            names.append(mhz.pop(0))
        elif v.endswith(" MiB") and mib:
            names.append(mib.pop(0))
        elif v.endswith(" W"):
            names.append("power.draw")
        elif re.fullmatch(r"\d{1,2}", v) and not plain_int_seen and i == 1:
            names.append("index")
            plain_int_seen = True
        elif re.search(r"[A-Za-z]", v) and " " in v and not re.search(r"\d+ [A-Za-z%]+$", v):
            names.append("name")
        else:
            names.append(f"unknown{i}")
    known = [n for n in names if not n.startswith("unknown") and n != "timestamp"]
    if not any(n.startswith(("utilization", "clocks", "power", "memory")) for n in known):
        raise BadInput(
            path,
            "nvidia-smi --query-gpu CSV without a header and without units: the columns cannot "
            "be told apart; record it without 'noheader' (or keep the units)",
        )
    return names, f"no header: columns guessed from units as {', '.join(names)}"


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    opts = options or ParseOptions()
    zone, given = C.resolve_zone(opts.tz)
    lines = C.lines_frame(C.read_text(path)).filter(pl.col("line").str.strip_chars() != "")
    if lines.height == 0:
        raise BadInput(path, "empty file")
    notes: list[str] = []
    first = lines["line"][0]
    header = header_fields(first)
    if header is not None:
        raw_header = header
        # the header again wherever a loop of nvidia-smi calls appended it
        body = lines.filter(pl.col("line").str.replace_all(r"\s", "") != re.sub(r"\s", "", first))
    else:
        raw_header, note = _guess_header(first.split(","), path)
        notes.append(note)
        body = lines
    names = [field_name(h) for h in raw_header]
    if "timestamp" not in names:
        raise BadInput(
            path,
            "nvidia-smi --query-gpu CSV without a 'timestamp' column: samples cannot be placed "
            "in time (add timestamp to --query-gpu)",
        )
    n = len(names)
    body = body.with_columns((pl.col("line").str.count_matches(",") + 1).alias("_n"))
    bad = body.filter(pl.col("_n") != n)
    fields = [f"c{i}" for i in range(n)]
    frame = (
        body.filter(pl.col("_n") == n)
        .with_columns(
            pl.col("line").str.split(",").list.eval(pl.element().str.strip_chars()).list.to_struct(fields=fields).alias("_s")
        )
        .unnest("_s")
    )
    ti = names.index("timestamp")
    naive = frame[f"c{ti}"].str.strptime(pl.Datetime("ns"), "%Y/%m/%d %H:%M:%S%.f", strict=False)
    frame = frame.with_columns(C.local_to_utc_ns(naive, zone).alias("t_ns"))
    bad_t = frame.filter(pl.col("t_ns").is_null())
    frame = frame.filter(pl.col("t_ns").is_not_null())
    notes += C.skipped_note(
        bad.height + bad_t.height, min([*bad["lineno"].to_list()[:1], *bad_t["lineno"].to_list()[:1]], default=None)
    )

    def num(i: int) -> pl.Expr:
        # '79.29 W' → 79.29; '[N/A]', '[Not Supported]', 'N/A' → null
        return pl.col(f"c{i}").str.extract(r"^(-?[0-9]+(?:\.[0-9]+)?)", 1).cast(pl.Float64, strict=False)

    metrics: dict[str, pl.Expr] = {}
    ident: dict[str, int] = {}
    ignored = []
    for i, name in enumerate(names):
        if name in IDENTITY:
            ident[IDENTITY[name]] = i
        elif name in FIELDS and FIELDS[name][0] not in metrics:
            m, f = FIELDS[name]
            metrics[m] = num(i) * f
        else:
            ignored.append(raw_header[i])
    if not metrics:
        raise BadInput(path, "nvidia-smi --query-gpu CSV has no field we read (utilization.gpu, clocks.sm, …)")
    if ignored:
        notes.append(f"fields not read: {', '.join(ignored)}")
    gi = ident.get("gpu_index")
    ui = ident.get("gpu_uuid")
    bi = ident.get("bus_id")
    if frame.height == 0:
        raise BadInput(path, "nvidia-smi --query-gpu CSV has no sample rows")
    if gi is not None:
        index = pl.col(f"c{gi}").cast(pl.Int32, strict=False)
    elif ui is None and bi is None:
        gpus = _gpus_per_sample(frame)
        index = (pl.int_range(pl.len(), dtype=pl.Int32) % gpus) if gpus > 1 else pl.lit(0, pl.Int32)
        notes.append(
            f"no index/uuid/pci.bus_id column: {gpus} rows per sample, taken as GPUs 0–{gpus - 1} in the order "
            "nvidia-smi prints them (by index)"
            if gpus > 1
            else "no index/uuid/pci.bus_id column: samples taken to be of GPU 0"
        )
    else:
        index = pl.lit(None, pl.Int32)
    frame = frame.with_columns(index.alias("_gpu"))
    wide = frame.select(
        pl.col("t_ns"),
        pl.col(f"c{ti}").alias("raw_time"),
        pl.col("_gpu").alias("gpu_index"),
        (pl.col(f"c{ui}") if ui is not None else pl.lit(None, pl.Utf8)).alias("gpu_uuid"),
        pl.lit(None, pl.Utf8).alias("entity"),
        *[e.alias(m) for m, e in metrics.items()],
    )
    w = C.emit(con, source_id, wide, "anchored")
    notes += w.notes
    dev_cols = [
        pl.col("_gpu"),
        pl.col(f"c{ui}") if ui is not None else pl.lit(None, pl.Utf8),
        pl.col(f"c{bi}") if bi is not None else pl.lit(None, pl.Utf8),
        pl.col(f"c{ident['name']}") if "name" in ident else pl.lit(None, pl.Utf8),
        (num(ident["memory_total"]) * MIB).cast(pl.Int64) if "memory_total" in ident else pl.lit(None, pl.Int64),
    ]
    dev = frame.select([c.alias(f"d{k}") for k, c in enumerate(dev_cols)]).unique(maintain_order=True)
    C.add_devices(con, source_id, list(dev.iter_rows()))
    notes.append(C.zone_note("nvidia-smi", zone, given))
    return SourceInfo(
        format="nvidia-smi-query",
        format_version=f"fields: {', '.join(names)}",
        rank=None,
        rank_method="counters",
        clock_anchor="anchored",
        events=w.rows,
        notes=notes,
        time_zone=zone,
        sample_period_ns=w.effective_period_ns,
    )


MAX_GPUS_BY_ORDER = 16
SAMPLE_GAP_RATIO = 2.0


def _gpus_per_sample(frame: pl.DataFrame) -> int:
    """How many GPUs a log without an identity column holds. nvidia-smi prints one row per GPU per sample, GPU
    after GPU: the rows of a sample come within a few ms of each other (stamped alike, or each as it was
    queried), the samples a period apart. So the count is the smallest n (up to MAX_GPUS_BY_ORDER) for which the
    file cut into runs of n rows from its first row (three runs at least) has every step between runs more than
    SAMPLE_GAP_RATIO times the longest step inside a run; 1 when none has (one GPU, its samples evenly spaced or
    jittering: no cut separates them so)."""
    t = frame["t_ns"].to_numpy()
    step = np.diff(t)  # step[i - 1]: from row i - 1 to row i
    pos = np.arange(1, len(t))
    for n in range(2, MAX_GPUS_BY_ORDER + 1):
        if len(t) < 3 * n:
            break
        between = step[pos % n == 0]
        inside = step[pos % n != 0]
        if between.min() > SAMPLE_GAP_RATIO * max(int(inside.max()), 0):
            return n
    return 1


def sniff(s: Sniff) -> str | None:
    first = s.first_line
    if header_fields(first) is not None or looks_headerless(first):
        return "nvidia-smi-query"
    return None


FORMATS = (Format("nvidia-smi-query", "nvidia-smi --query-gpu CSV", ingest, auxiliary=True),)
