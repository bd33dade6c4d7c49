"""`dcgmi dmon` output (DCGM 2.x and 3.x layouts) → `counters`.

Header `#Entity  SMACT …` (3.x) or `# Entity  GRACT …` (2.x), a unit/`Id` line, then one row per entity and
iteration (`GPU 0`, `GPU-I 1`, …), `N/A` when blank; the header repeats. Columns are mapped by DCGM short
name or numeric field id. dcgmi prints no time: a leading epoch (s/ms/µs/ns) or ISO timestamp per line is
used when present ('prefixed'), else iteration k is placed at file mtime − (n−1−k)·--dcgm-period
('synthesized', low confidence until aligned to a trace).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from ..errors import BadInput
from . import _counters as C
from ._polars import pl
from .base import Format, ParseOptions, Sniff, SourceInfo

MIB = float(1 << 20)
# DCGM field id → (short name, metric, factor) — dcgm_fields.h. Ratios are already 0–1; GPUTL/MCUTL are %.
FIELDS: dict[int, tuple[str, str, float]] = {
    100: ("SMCLK", "sm_clock_mhz", 1.0),
    101: ("MMCLK", "mem_clock_mhz", 1.0),
    140: ("MMTMP", "mem_temp_c", 1.0),
    150: ("TMPTR", "temp_c", 1.0),
    155: ("POWER", "power_w", 1.0),
    156: ("TOTEC", "energy_j", 1e-3),
    203: ("GPUTL", "gpu_util", 0.01),
    204: ("MCUTL", "mem_util", 0.01),
    206: ("ENCUT", "enc_util", 0.01),
    207: ("DECUT", "dec_util", 0.01),
    251: ("FBFRE", "fb_free_bytes", MIB),
    252: ("FBUSD", "fb_used_bytes", MIB),
    1001: ("GRACT", "gr_engine_active", 1.0),
    1002: ("SMACT", "sm_active", 1.0),
    1003: ("SMOCC", "sm_occupancy", 1.0),
    1004: ("TENSO", "tensor_active", 1.0),
    1005: ("DRAMA", "dram_active", 1.0),
    1006: ("FP64A", "fp64_active", 1.0),
    1007: ("FP32A", "fp32_active", 1.0),
    1008: ("FP16A", "fp16_active", 1.0),
    1009: ("PCITX", "pcie_tx_bytes_s", 1.0),
    1010: ("PCIRX", "pcie_rx_bytes_s", 1.0),
    1011: ("NVLTX", "nvlink_tx_bytes_s", 1.0),
    1012: ("NVLRX", "nvlink_rx_bytes_s", 1.0),
    1013: ("TIMMA", "tensor_imma_active", 1.0),
    1014: ("THMMA", "tensor_hmma_active", 1.0),
    1015: ("TDFMA", "tensor_dfma_active", 1.0),
    1016: ("INTAC", "int_active", 1.0),
}
BY_SHORT = {short: (metric, f) for short, metric, f in FIELDS.values()}

ENTITY_RE = re.compile(r"^(GPU-CI|GPU-I|GPU|vGPU|Switch|Link|CPU|Core|NvSwitch)\s+(\d+)\s*(.*)$")
EPOCH_RE = re.compile(r"^(\d{9,19})(?:\.(\d+))?(?:\s+(.*))?$")
ISO_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(Z|[+-]\d{2}:?\d{2})?\s+(.*)$")
TS_RE = re.compile(r"^([A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2})\s+(.*)$")  # moreutils `ts` default


def looks_like_dcgmi(first_line: str) -> bool:
    _, rest = _strip_prefix(first_line.strip())
    return rest.replace(" ", "").startswith("#Entity")


def _strip_prefix(s: str) -> tuple[tuple[str, str, str | None] | None, str]:
    """(timestamp, rest): timestamp = (kind, text, zone-suffix) when the line starts with one."""
    m = EPOCH_RE.match(s)
    if m and not ENTITY_RE.match(s):
        frac = m.group(2) or ""
        return ("epoch", m.group(1) + ("." + frac if frac else ""), None), m.group(3) or ""
    m = ISO_RE.match(s)
    if m:
        return ("iso", m.group(1).replace(",", "."), m.group(2)), m.group(3)
    m = TS_RE.match(s)
    if m:
        return ("ts", m.group(1), None), m.group(2)
    return None, s


def _epoch_ns(text: str) -> int:
    whole, _, frac = text.partition(".")
    digits = len(whole)
    scale = 10 ** {10: 9, 9: 9, 13: 6, 16: 3, 19: 0}.get(digits, 9)
    if digits > 11:
        return int(whole) * scale
    return int(whole) * 10**9 + int((frac + "000000000")[:9])


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    opts = options or ParseOptions()
    text = C.read_text(path)
    fields: list[tuple[str, float] | None] | None = None
    names: list[str] = []
    version = None
    rows: list[tuple] = []  # (lineno, iteration, ts, entity, index, values)
    bad_lines: list[int] = []
    iteration, after_header = -1, True
    seen_in_iter: set[tuple[str, int]] = set()
    stopped = False
    unknown: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        ts, rest = _strip_prefix(s)
        rest = rest.strip()
        if not rest:
            continue
        if rest.startswith("#"):
            toks = rest.lstrip("#").split()
            if toks and toks[0] == "Entity":
                version = version or ("DCGM 2.x layout" if rest.startswith("# ") else "DCGM 3.x layout")
                hdr = toks[1:]
                if fields is not None and hdr != names:
                    raise BadInput(path, "dcgmi dmon log whose fields change midway: split it into one file per run")
                names = hdr
                fields = []
                for h in hdr:
                    key = int(h) if h.isdigit() else None
                    if key is not None and key in FIELDS:
                        fields.append(FIELDS[key][1:])
                    elif h.upper() in BY_SHORT:
                        fields.append(BY_SHORT[h.upper()])
                    else:
                        fields.append(None)
                        unknown.add(h)
                after_header = True
            continue
        if fields is None:
            if re.match(r"(?i)^(error|usage|dcgmi)", rest):
                raise BadInput(path, f"dcgmi printed an error, not samples: {rest[:120]}")
            bad_lines.append(lineno)
            continue
        if rest.upper().startswith(("ID", "ID ")) and not ENTITY_RE.match(rest):
            continue  # the unit / Id line under the header
        if rest.lower().startswith(("dmon was stopped", "ctrl", "^c")):
            stopped = True
            continue
        m = ENTITY_RE.match(rest)
        if not m:
            bad_lines.append(lineno)
            continue
        etype, eid, vals = m.group(1), int(m.group(2)), m.group(3).split()
        if len(vals) != len(fields) or eid >= 2**31:
            bad_lines.append(lineno)
            continue
        ekey = (etype, eid)
        if after_header or ekey in seen_in_iter:
            if not (after_header and rows and ekey not in seen_in_iter):
                iteration += 1
                seen_in_iter = set()
        after_header = False
        seen_in_iter.add(ekey)
        rows.append((lineno, iteration, ts, etype, eid, vals))
    if fields is None:
        raise BadInput(path, "dcgmi dmon log without its '#Entity …' header")
    if not rows:
        raise BadInput(path, "dcgmi dmon log has no sample rows")
    notes = C.skipped_note(len(bad_lines), bad_lines[0] if bad_lines else None)
    if unknown:
        notes.append(f"fields not read: {', '.join(sorted(unknown))}")
    if stopped:
        notes.append("log ends with 'dmon was stopped' (Ctrl-C)")
    zone_name, given = C.resolve_zone(opts.tz)
    zone: str | None = zone_name
    stamped = [r for r in rows if r[2] is not None]
    period_ns = None
    if stamped and len(stamped) < len(rows):
        notes += C.skipped_note(
            len(rows) - len(stamped), next(r[0] for r in rows if r[2] is None), "rows without the timestamp the other rows have"
        )
        rows = stamped
    if stamped:
        t_ns, local_used = _prefix_times(rows, zone_name, path)
        anchor = "prefixed"
        if local_used:
            notes.append(C.zone_note("timestamp prefix", zone_name, given))
        else:
            zone = None
    else:
        period_ns = int(round(opts.dcgm_period_s * 1e9))
        last = max(r[1] for r in rows)
        end = C.file_mtime_ns(path)
        t_ns = [end - (last - r[1]) * period_ns for r in rows]
        anchor, zone = "synthesized", None
        notes.append(
            f"no timestamps: iteration k placed at file mtime − (n−1−k)·{opts.dcgm_period_s:g} s "
            "(--dcgm-period); low confidence until aligned to a trace"
        )
    cols: dict[str, list[float | None]] = {}
    for j, f in enumerate(fields):
        if f is None or f[0] in cols:
            continue
        metric, factor = f
        cols[metric] = [_value(r[5][j], factor) for r in rows]
    wide = pl.DataFrame(
        {
            "t_ns": pl.Series(t_ns, dtype=pl.Int64),
            "raw_time": pl.Series([r[2][1] if r[2] else None for r in rows], dtype=pl.Utf8),
            # A MIG instance id is not a GPU index: those rows keep only their entity.
            "gpu_index": pl.Series([r[4] if r[3] == "GPU" else None for r in rows], dtype=pl.Int32),
            "gpu_uuid": pl.Series([None] * len(rows), dtype=pl.Utf8),
            "entity": pl.Series([f"{r[3]} {r[4]}" for r in rows], dtype=pl.Utf8),
            **{m: pl.Series(v, dtype=pl.Float64) for m, v in cols.items()},
        }
    )
    w = C.emit(con, source_id, wide, anchor, period_ns)
    notes += w.notes
    if any(r[3] != "GPU" for r in rows):
        notes.append("rows of non-GPU entities (GPU-I, GPU-CI, …) are kept with their entity, not matched to a GPU")
    return SourceInfo(
        format="dcgmi-dmon",
        format_version=version,
        rank=None,
        rank_method="counters",
        clock_anchor=anchor,
        events=w.rows,
        notes=notes,
        time_zone=zone,
        sample_period_ns=w.effective_period_ns,
    )


def _value(s: str, factor: float) -> float | None:
    if s.upper() in ("N/A", "NA", "-"):
        return None
    try:
        return float(s) * factor
    except ValueError:
        return None


def _prefix_times(rows: list[tuple], zone: str, path: Path) -> tuple[list[int], bool]:
    """UTC ns of each row's prefix; local (zone-less) ISO / `ts` stamps are read in `zone`."""
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    year = dt.datetime.fromtimestamp(C.file_mtime_ns(path) / 1e9, tz).year
    out: list[int] = []
    local = False
    for lineno, _it, (kind, txt, off), *_ in rows:
        try:
            if kind == "epoch":
                out.append(_epoch_ns(txt))
                if not -(2**62) < out[-1] < 2**62:
                    raise ValueError
                continue
            if kind == "iso":
                d = dt.datetime.fromisoformat(txt.replace(" ", "T") + (off.replace("Z", "+00:00") if off else ""))
            else:
                d = dt.datetime.strptime(f"{year} {' '.join(txt.split())}", "%Y %b %d %H:%M:%S")
        except ValueError:
            raise BadInput(path, f"line {lineno}: unreadable timestamp {txt!r}") from None
        if d.tzinfo is None:
            local = True
            d = d.replace(tzinfo=tz)
        out.append((d - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1) * 1000)
    return out, local


def sniff(s: Sniff) -> str | None:
    first = s.first_line
    if first.startswith("#Entity") or first.startswith("# Entity") or looks_like_dcgmi(first):
        return "dcgmi-dmon"
    return None


FORMATS = (Format("dcgmi-dmon", "dcgmi dmon log", ingest, auxiliary=True),)
