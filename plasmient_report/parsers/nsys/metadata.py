"""An nsys export's self-description: export metadata (product and schema version, time normalisation), the
captured environment of each process, the session start in UTC and how event times are anchored to it (SPEC §3),
and what nsys says it lost (DIAGNOSTIC_EVENT)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import duckdb

from ...store import one
from ..base import SourceInfo
from .reader import Export, text

# NVTX event types (ENUM_NSYS_EVENT_TYPE; stable since 2021).
NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75
EPOCH_NS_THRESHOLD = 10**18  # event times above this are already UTC epoch ns (a time-normalised export)


@dataclass
class NsysSource(SourceInfo):
    """What an export says about itself beyond SourceInfo (kept for tests and notes)."""

    processes: dict[int, int | None] = field(default_factory=dict)  # GPU process pid → rank (None: by order)
    tables: set[str] = field(default_factory=set)


@dataclass
class Meta:
    version: str | None
    schema: str | None
    normalized: bool
    shift_ns: int
    utc_epoch_ns: int | None
    utc_time: str | None
    host: str | None
    capture: list[tuple[str, str]]
    device_env: str | None
    gpu_metrics_hz: float | None


def kv(ex: Export, table: str | None, key: str = "name", value: str = "value") -> list[tuple[str, str]]:
    if table is None or not ex.has(table, key) or not ex.has(table, value):
        return []
    return [(text(k), text(v)) for k, v in ex.rows(f'SELECT "{key}", "{value}" FROM "{table}"')]


def read_meta(ex: Export) -> Meta:
    export = dict(kv(ex, ex.table("META_DATA_EXPORT") or ex.table("EXPORT_META_DATA")))
    capture = kv(ex, ex.table("META_DATA_CAPTURE"))
    env = dict(kv(ex, ex.table("TARGET_INFO_SYSTEM_ENV")))
    start = ex.table("TARGET_INFO_SESSION_START_TIME")
    utc_ns, utc_time = None, None
    if ex.has(start, "utcEpochNs"):
        cols = "utcEpochNs, utcTime" if ex.has(start, "utcTime") else "utcEpochNs, NULL"
        r = ex.rows(f'SELECT {cols} FROM "{start}" LIMIT 1')
        if r and r[0][0] is not None:
            utc_ns, utc_time = _int(text(r[0][0])), text(r[0][1]) if r[0][1] is not None else None
    norm = export.get("EXPORT_PARAM_TIME_NORMALIZE", export.get("EXPORT_TIME_NORMALIZE", "false"))
    shift = export.get("EXPORT_PARAM_TIME_SHIFT", export.get("EXPORT_TIME_SHIFT", "0"))
    hz = dict(capture).get("GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY")
    return Meta(
        version=export.get("EXPORT_PRODUCT_VERSION"),
        schema=export.get("EXPORT_SCHEMA_VERSION"),
        normalized=norm.strip().lower() in ("true", "1", "yes"),
        shift_ns=_int(shift) or 0,
        utc_epoch_ns=utc_ns,
        utc_time=utc_time,
        host=env.get("Hostname") or export.get("EXPORT_HOST"),
        capture=capture,
        device_env=env.get("DeviceEnvironment"),
        gpu_metrics_hz=float(hz) if hz and _int(hz) else None,
    )


def _int(s: str | None) -> int | None:
    try:
        return int(str(s).strip())
    except (TypeError, ValueError):
        return None


def env_vars(meta: Meta) -> dict[int, dict[str, str]]:
    """PROCESS_n environment variables from META_DATA_CAPTURE, else the 2022-era NUL-separated
    DeviceEnvironment (taken as process 0). Values lose their quotes."""
    out: dict[int, dict[str, str]] = {}
    for k, v in meta.capture:
        m = re.fullmatch(r"PROCESS_(\d+):(ENVIRONMENT_VARIABLE|PID)", k)
        if not m:
            continue
        n = int(m.group(1))
        if m.group(2) == "PID":
            out.setdefault(n, {})["__PID__"] = v
        elif kv := re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", v, re.S):
            out.setdefault(n, {})[kv.group(1)] = kv.group(2).strip().strip('"')
    if not any(len(d) > 1 for d in out.values()) and meta.device_env and "=" in meta.device_env:
        d = out.setdefault(0, {})
        for item in meta.device_env.split("\x00"):
            if kv := re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", item, re.S):
                d.setdefault(kv.group(1), kv.group(2))
    return out


_LOST = re.compile(r"(?i)not all .*events might have been collected|dropped|lost|overflow|buffers? (?:is |are )?full")
_LOST_COUNT = re.compile(r"(?i)(\d+)\s+(?:\w+\s+)?(?:events?|records?)\s+(?:were\s+|have been\s+)?(?:dropped|lost)")


def diagnostics(ex: Export) -> tuple[list[str], int | None]:
    """What nsys says it lost, from its warnings in DIAGNOSTIC_EVENT ("Not all CUDA events might have been
    collected.", dropped records, buffer overflows); the number of events lost when it gives one."""
    t = ex.table("DIAGNOSTIC_EVENT")
    if not ex.has(t, "text"):
        return [], None
    severity = '"severity"' if ex.has(t, "severity") else "2"
    out: list[str] = []
    dropped: int | None = None
    for raw, sev in ex.rows(f'SELECT "text", {severity} FROM "{t}"'):
        msg = " ".join(text(raw).split())[:200]
        if not isinstance(sev, int) or sev < 2 or not _LOST.search(msg):
            continue
        if (m := _LOST_COUNT.search(msg)) and msg not in out:
            dropped = (dropped or 0) + int(m.group(1))
        out.append(msg)
    return list(dict.fromkeys(out)), dropped


def choose_clock(con: duckdb.DuckDBPyConnection, meta: Meta, info: NsysSource) -> None:
    """SPEC §3: utc = utcEpochNs + t, unless the export was time-normalised (then t is UTC already)."""
    # the median, not the max: one corrupt row must not decide how every time is read
    row = one(
        con,
        """SELECT max(m) FROM (SELECT median(start) m FROM _ns_kernel UNION ALL SELECT median(start)
                      FROM _ns_runtime UNION ALL SELECT median(start) FROM _ns_memcpy)""",
    )
    tmax = row[0] if row else None
    shift = meta.shift_ns
    if meta.normalized or (tmax is not None and tmax > EPOCH_NS_THRESHOLD):
        info.base_time_ns = -shift
        info.clock_anchor = "native"
        info.notes.append("time-normalised export: event times are UTC epoch ns already")
    elif meta.utc_epoch_ns is not None:
        info.base_time_ns = meta.utc_epoch_ns - shift
        info.clock_anchor = "native"
        if meta.utc_time:
            with contextlib.suppress(ValueError):
                t = datetime.fromisoformat(meta.utc_time).replace(tzinfo=timezone.utc).timestamp()
                if abs(t - meta.utc_epoch_ns / 1e9) > 2:
                    info.notes.append(
                        f"utcEpochNs disagrees with utcTime ({meta.utc_time}) by "
                        f"{meta.utc_epoch_ns / 1e9 - t:+.0f} s: the host clock may be misconfigured"
                    )
    else:
        info.base_time_ns = 0
        info.clock_anchor = "relative"
        info.notes.append("no TARGET_INFO_SESSION_START_TIME: times are ns since capture start, not UTC")
    if shift:
        info.notes.append(f"export time shift of {shift} ns undone")
