"""Nsight Systems SQLite export (`nsys export --type sqlite`, 2022.2 → 2026.x) → the store's tables.

Small tables (metadata, GPUs, enums) are read with the standard `sqlite3` module; the event tables stream
through the ADBC SQLite driver as Arrow batches straight into DuckDB, which decodes the packed ids, converts
times to UTC, parses the NVTX op text and splits rows into the store's tables. No Python loop touches rows.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import adbc_driver_manager
import duckdb
import pyarrow as pa

from ..errors import BadInput
from ..store import one
from .base import SourceInfo

ID_STRIDE = 10**12  # kernel_id / op_id = source_id * ID_STRIDE + n, as the Kineto parser does
PID_SHIFT = 2**32  # multi-process reports: correlation = pid * 2**32 + correlationId (ids repeat across processes)
EPOCH_NS_THRESHOLD = 10**18  # event times above this are already UTC epoch ns (a time-normalised export)
# |UTC ns| beyond this is no time (after 2116 or before 1823): the difference of two times must fit in int64.
TIME_LIMIT_NS = 2**62
MAX_RANKS = 1 << 20  # a rank or world size beyond this in the captured environment is no rank
NOT_APPLICABLE = 0xFFFFFFFF  # streamId / eventId "not applicable"
BATCH_ROWS = 65_536
COUNTER_CHUNK_ROWS = 1_000_000  # GPU_METRICS rows per insert; a checkpoint after each compresses them

# NVTX event types (ENUM_NSYS_EVENT_TYPE; stable since 2021).
NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75

# Built-in fallbacks for exports without the ENUM tables (2022.2 has none for these).
COPY_KIND = {0: "unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
             8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
            6: "Managed Static", 7: "Unknown"}
# Kineto's words for CUPTI synchronization types, so `syncs.kind` reads the same for both formats.
SYNC_KIND = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

# Environment variables that carry the job rank, most specific first; LOCAL_RANK only as the last resort.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "PALS_RANKID",
             "MV2_COMM_WORLD_RANK", "LOCAL_RANK")
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")

# GPU_METRICS names (2023.4+ carry a `[unit]` suffix; older ones none) → counters.metric, matched by prefix,
# in the counter parsers' vocabulary (parsers/_counters.py) where the quantity is the same (GR Active = DCGM GRACT).
METRIC_NAMES = (
    ("SMs Active", "sm_active"), ("SM Active", "sm_active"), ("SM Issue", "sm_issue"),
    ("Tensor Active", "tensor_active"), ("DRAM Read Bandwidth", "dram_read"),
    ("DRAM Write Bandwidth", "dram_write"), ("GR Active", "gr_engine_active"), ("GPC Clock Frequency", "sm_clock_mhz"),
    ("SYS Clock Frequency", "sys_clock_mhz"), ("PCIe RX Throughput", "pcie_rx"), ("PCIe TX Throughput", "pcie_tx"),
    ("NVLink RX Responses User Data", "nvlink_rx_user"), ("NVLink TX Responses User Data", "nvlink_tx_user"),
)
PERCENT_METRICS = {"sm_active", "sm_issue", "tensor_active", "dram_read", "dram_write", "gr_engine_active",
                   "pcie_rx", "pcie_tx"}

# Names the collective comes from in NCCL kernel names (ncclDevKernel_AllReduce_Sum_bf16_RING_LL …), the
# same fallback the Kineto parser uses, so ranks from both formats pair on (collective, seq).
NCCL_KERNEL_RE = r"(?i)^(void )?(nccl|ncclDevKernel|ncclKernel)"
NCCL_COLLECTIVE_RE = r"(?i)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)"
NCCL_DTYPE_RE = r"_(bf16|f16|f32|f64|f8e4m3|f8e5m2|i8|u8|i32|u32|i64|u64)(_|$|\()"
# emit_nvtx text: `aten::mm, seq = 12, op_id = 345, sizes = [[8192, 8192], [8192, 8192]], input_op_ids = …`.
OP_TEXT_RE = r", op_id = [0-9]+"


@dataclass
class NsysSource(SourceInfo):
    """What an export says about itself beyond SourceInfo (kept for tests and notes)."""

    processes: dict[int, int | None] = field(default_factory=dict)  # GPU process pid → rank (None: by order)
    tables: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Col:
    """One column to read: the output name, the source column(s) tried in order, and its type (i, s, f, b: blob)."""

    out: str
    src: tuple[str, ...]
    typ: str = "i"


def _c(out: str, *src: str, typ: str = "i") -> Col:
    return Col(out, src or (out,), typ)


class Export:
    """A read-only view of one export: which tables and columns exist, and the two readers (`rows` for small
    tables, `scan` for event tables as Arrow batches). `_nsys_arrow.ArrowExport` serves parquetdir / arrow
    exports through the same interface."""

    is_sqlite = True
    format = "nsys-sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
        try:
            self.sq = sqlite3.connect(self.uri, uri=True)
            self.sq.text_factory = bytes  # TARGET_INFO_SYSTEM_ENV values can be invalid UTF-8
            names = [_text(n) for (n,) in self.sq.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()]
            self.columns: dict[str, list[str]] = {}
            for n in names:
                cols = self.sq.execute(f'PRAGMA table_info("{n.replace(chr(34), chr(34) * 2)}")').fetchall()
                self.columns[n] = [_text(c[1]) for c in cols]
        except sqlite3.DatabaseError as e:
            raise BadInput(path, f"not a readable SQLite database ({e})") from None
        self._adbc: Any = None

    def table(self, name: str) -> str | None:
        """The table's name as exported: exact, else the highest `_V<n>` variant (never `…_MEMCPY2` for MEMCPY)."""
        if name in self.columns:
            return name
        variants = [(int(m.group(1)), t) for t in self.columns if (m := re.fullmatch(re.escape(name) + r"_V(\d+)", t))]
        return max(variants)[1] if variants else None

    def has(self, table: str | None, column: str) -> bool:
        return table is not None and column in self.columns.get(table, ())

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        return self.sq.execute(sql, params).fetchall()

    def scan(self, table: str, cols: Sequence[Col], where: str | None = None) -> tuple[Any, pa.RecordBatchReader]:
        """The table's `cols` as Arrow batches (absent columns NULL) with a column `_s`: keep `_s = 1` rows only.
        Returns (a handle to close after reading, the reader)."""
        return _reader(self, _select_sql(self, table, cols, where))

    def adbc(self) -> Any:
        if self._adbc is None:
            import adbc_driver_sqlite.dbapi as adbc

            self._adbc = adbc.connect(self.uri)
        return self._adbc

    def close(self) -> None:
        self.sq.close()
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None


def _text(v: object) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


_SENTINEL = {"i": "0", "s": "''", "f": "0.0", "b": "x''"}
_CAST = {"i": "INTEGER", "s": "TEXT", "f": "REAL", "b": "BLOB"}


def _select_sql(ex: Export, table: str, cols: Sequence[Col], where: str | None = None) -> str:
    """SQLite SELECT of the columns that exist (NULL for absent ones), typed by CAST. A number column holding
    text or a blob reads NULL, not CAST's 0 (a kernel "starting" at 0 would fill the whole capture).

    A first sentinel row (_s = 0) fixes every Arrow type: the ADBC driver infers types from the first rows and
    fails when a column that starts NULL later holds text. The reader drops it (_s = 1 only)."""
    head = ", ".join(f"{_SENTINEL[c.typ]} AS \"{c.out}\"" for c in cols)
    body = []
    for c in cols:
        src = next((s for s in c.src if ex.has(table, s)), None)
        body.append(f"{_typed(src, c.typ)} AS \"{c.out}\"" if src else f"NULL AS \"{c.out}\"")
    sql = f"SELECT 0 AS _s, {head} UNION ALL SELECT 1, {', '.join(body)} FROM \"{table}\""
    return sql + (f" WHERE {where}" if where else "")


def _typed(col: str, typ: str) -> str:
    if typ == "i":
        return f"CASE typeof(\"{col}\") WHEN 'integer' THEN \"{col}\" WHEN 'real' THEN CAST(\"{col}\" AS INTEGER) END"
    if typ == "f":
        return f"CASE typeof(\"{col}\") WHEN 'real' THEN \"{col}\" WHEN 'integer' THEN CAST(\"{col}\" AS REAL) END"
    if typ == "b":
        return f"CASE typeof(\"{col}\") WHEN 'blob' THEN \"{col}\" WHEN 'text' THEN CAST(\"{col}\" AS BLOB) END"
    return f"CAST(\"{col}\" AS TEXT)"


def _valid_utf8(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Replace invalid UTF-8 in string columns (rare: only then is a column decoded in Python)."""
    arrays = []
    changed = False
    for a in batch.columns:
        if pa.types.is_string(a.type):
            try:
                a.validate(full=True)
            except pa.ArrowInvalid:
                raw = a.view(pa.binary()).to_pylist()
                a = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw], pa.string())
                changed = True
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema) if changed else batch


def _reader(ex: Export, sql: str) -> tuple[Any, pa.RecordBatchReader]:
    cur = ex.adbc().cursor()
    with contextlib.suppress(Exception):  # older drivers: default batch size
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
    cur.execute(sql)
    rdr = cur.fetch_record_batch()
    if any(pa.types.is_string(f.type) for f in rdr.schema):
        src = rdr

        def batches() -> Iterator[pa.RecordBatch]:
            for b in src:
                yield _valid_utf8(b)

        rdr = pa.RecordBatchReader.from_batches(src.schema, batches())
    return cur, rdr


def _stage(con: duckdb.DuckDBPyConnection, ex: Export, name: str, table: str | None, cols: Sequence[Col],
           where: str | None = None) -> int:
    """Stream one export table into a DuckDB temp table `name` (empty, same columns, when the table is absent)."""
    types = {"i": "BIGINT", "s": "VARCHAR", "f": "DOUBLE", "b": "BLOB"}
    if table is None:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT "
                    + ", ".join(f"NULL::{types[c.typ]} AS \"{c.out}\"" for c in cols) + " WHERE false")
        return 0
    cur, rdr = ex.scan(table, cols, where)
    try:
        con.register("_nsys_in", rdr)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * EXCLUDE (_s) FROM _nsys_in WHERE _s = 1")
        con.unregister("_nsys_in")
    except (duckdb.Error, OSError, pa.ArrowException) as e:
        raise BadInput(ex.path, f"cannot read table {table} ({e})") from None
    finally:
        if cur is not None:
            cur.close()
    row = one(con, f"SELECT count(*) FROM {name}")
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------------------------------- metadata


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


def _kv(ex: Export, table: str | None, key: str = "name", value: str = "value") -> list[tuple[str, str]]:
    if table is None or not ex.has(table, key) or not ex.has(table, value):
        return []
    return [(_text(k), _text(v)) for k, v in ex.rows(f'SELECT "{key}", "{value}" FROM "{table}"')]


def _read_meta(ex: Export) -> Meta:
    export = dict(_kv(ex, ex.table("META_DATA_EXPORT") or ex.table("EXPORT_META_DATA")))
    capture = _kv(ex, ex.table("META_DATA_CAPTURE"))
    env = dict(_kv(ex, ex.table("TARGET_INFO_SYSTEM_ENV")))
    start = ex.table("TARGET_INFO_SESSION_START_TIME")
    utc_ns, utc_time = None, None
    if ex.has(start, "utcEpochNs"):
        cols = "utcEpochNs, utcTime" if ex.has(start, "utcTime") else "utcEpochNs, NULL"
        r = ex.rows(f"SELECT {cols} FROM \"{start}\" LIMIT 1")
        if r and r[0][0] is not None:
            utc_ns, utc_time = _int(_text(r[0][0])), _text(r[0][1]) if r[0][1] is not None else None
    norm = export.get("EXPORT_PARAM_TIME_NORMALIZE", export.get("EXPORT_TIME_NORMALIZE", "false"))
    shift = export.get("EXPORT_PARAM_TIME_SHIFT", export.get("EXPORT_TIME_SHIFT", "0"))
    hz = dict(capture).get("GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY")
    return Meta(
        version=export.get("EXPORT_PRODUCT_VERSION"), schema=export.get("EXPORT_SCHEMA_VERSION"),
        normalized=norm.strip().lower() in ("true", "1", "yes"), shift_ns=_int(shift) or 0,
        utc_epoch_ns=utc_ns, utc_time=utc_time, host=env.get("Hostname") or export.get("EXPORT_HOST"),
        capture=capture, device_env=env.get("DeviceEnvironment"),
        gpu_metrics_hz=float(hz) if hz and _int(hz) else None)


def _int(s: str | None) -> int | None:
    try:
        return int(str(s).strip())
    except (TypeError, ValueError):
        return None


def _env_vars(meta: Meta) -> dict[int, dict[str, str]]:
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
        elif (kv := re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", v, re.S)):
            out.setdefault(n, {})[kv.group(1)] = kv.group(2).strip().strip('"')
    if not any(len(d) > 1 for d in out.values()) and meta.device_env and "=" in meta.device_env:
        d = out.setdefault(0, {})
        for item in meta.device_env.split("\x00"):
            if (kv := re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", item, re.S)):
                d.setdefault(kv.group(1), kv.group(2))
    return out


def _env_rank(env: dict[str, str]) -> tuple[int, str] | None:
    for var in RANK_VARS:
        r = _int(env.get(var))
        if r is not None and 0 <= r < MAX_RANKS:
            return r, var
    return None


# ------------------------------------------------------------------------------------------------ ingest


def open_export(path: Path) -> Export:
    """The export at `path`: a SQLite file, or a parquetdir / arrowdir folder or `.arrows` stream."""
    from ._nsys_arrow import ArrowExport, export_kind

    kind = export_kind(path)
    return ArrowExport(path, kind) if kind else Export(path)


def ingest(path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> NsysSource:
    """Read one nsys export (SQLite, parquetdir or arrow) into the store. Several GPU processes = several ranks
    (rank per row)."""
    ex = open_export(path)
    try:
        return _ingest(ex, con, source_id)
    except pa.ArrowException as e:
        raise BadInput(path, f"corrupt {ex.format.removeprefix('nsys-')} export ({str(e).strip().splitlines()[0]})") from None
    except (sqlite3.DatabaseError, adbc_driver_manager.Error) as e:
        # a page the header promised is corrupt or missing: found only when a query reaches it
        raise BadInput(path, f"corrupt SQLite export ({str(e).strip().splitlines()[0] if str(e).strip() else e})") from None
    finally:
        ex.close()
        for t in _TEMP:
            con.execute(f"DROP TABLE IF EXISTS {t}")


_TEMP = ("_ns_str", "_ns_kernel", "_ns_memcpy", "_ns_memset", "_ns_runtime", "_ns_sync", "_ns_nvtx", "_ns_rank",
         "_ns_gpu", "_ns_devmap", "_ns_metric", "_ns_copykind", "_ns_memkind", "_ns_domain", "_ns_gpuacts",
         "_ns_cudadev", "_ns_nvtx_r", "_ns_gpumetric_dev", "_ns_pl_entries", "_ns_pl_enums", "_ns_pl_enum_entries",
         "_ns_pl_values", "_ns_nccl_calls", "_ns_comms", "_ns_nccl_match", "_ns_osrt")


def _ingest(ex: Export, con: duckdb.DuckDBPyConnection, sid: int) -> NsysSource:
    if not any(ex.table(t) for t in ("StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA")):
        what = "SQLite database" if ex.is_sqlite else "Arrow tables"
        raise BadInput(ex.path, f"{what} but not an Nsight Systems export (no StringIds / META_DATA_EXPORT)")
    meta = _read_meta(ex)
    info = NsysSource(format=ex.format, tables=set(ex.columns))
    info.format_version = f"nsys {meta.version or '?'} (schema {meta.schema or '?'})"
    info.host = meta.host
    info.incomplete, info.dropped_events = _diagnostics(ex)
    events = _stage_all(con, ex)
    info.events = events
    _choose_clock(con, meta, info)
    _drop_impossible_times(con, ex.path, info)
    _assign_ranks(con, ex, meta, info)
    _build_enums(con, ex)
    _emit(con, ex, sid, info)
    info.events += _emit_counters(con, ex, sid, meta, info)
    row = one(con, "SELECT count(*) FROM kernels WHERE source_id = ?", [sid])
    info.gpu_events = int(row[0]) if row else 0
    if ex.table("CUPTI_ACTIVITY_KIND_KERNEL") is None:
        info.notes.append("no CUPTI_ACTIVITY_KIND_KERNEL table (captured without --trace=cuda, or no kernel ran)")
    return info


_LOST = re.compile(r"(?i)not all .*events might have been collected|dropped|lost|overflow|buffers? (?:is |are )?full")
_LOST_COUNT = re.compile(r"(?i)(\d+)\s+(?:\w+\s+)?(?:events?|records?)\s+(?:were\s+|have been\s+)?(?:dropped|lost)")


def _diagnostics(ex: Export) -> tuple[list[str], int | None]:
    """What nsys says it lost, from its warnings in DIAGNOSTIC_EVENT ("Not all CUDA events might have been
    collected.", dropped records, buffer overflows); the number of events lost when it gives one."""
    t = ex.table("DIAGNOSTIC_EVENT")
    if not ex.has(t, "text"):
        return [], None
    severity = '"severity"' if ex.has(t, "severity") else "2"
    out: list[str] = []
    dropped: int | None = None
    for text, sev in ex.rows(f'SELECT "text", {severity} FROM "{t}"'):
        msg = " ".join(_text(text).split())[:200]
        if not isinstance(sev, int) or sev < 2 or not _LOST.search(msg):
            continue
        if (m := _LOST_COUNT.search(msg)) and msg not in out:
            dropped = (dropped or 0) + int(m.group(1))
        out.append(msg)
    return list(dict.fromkeys(out)), dropped


def _stage_all(con: duckdb.DuckDBPyConnection, ex: Export) -> int:
    """Every event table into DuckDB temp tables, with only the columns the store needs."""
    n = 0
    _stage(con, ex, "_ns_str", ex.table("StringIds"), [_c("id"), _c("value", typ="s")])
    act = [_c("start"), _c("end"), _c("deviceId"), _c("contextId"), _c("streamId"), _c("correlationId"),
           _c("globalPid")]
    n += _stage(con, ex, "_ns_kernel", ex.table("CUPTI_ACTIVITY_KIND_KERNEL"), [
        *act, _c("demangledName"), _c("shortName"), _c("registersPerThread"),
        _c("gridX"), _c("gridY"), _c("gridZ"), _c("blockX"), _c("blockY"), _c("blockZ"),
        _c("staticSharedMemory"), _c("dynamicSharedMemory")])
    n += _stage(con, ex, "_ns_memcpy", ex.table("CUPTI_ACTIVITY_KIND_MEMCPY"),
                [*act, _c("bytes"), _c("copyKind"), _c("srcKind"), _c("dstKind")])
    n += _stage(con, ex, "_ns_memset", ex.table("CUPTI_ACTIVITY_KIND_MEMSET"), [*act, _c("bytes"), _c("memKind")])
    n += _stage(con, ex, "_ns_runtime", ex.table("CUPTI_ACTIVITY_KIND_RUNTIME"), [
        _c("start"), _c("end"), _c("eventClass"), _c("globalTid"), _c("correlationId"), _c("nameId")])
    n += _stage(con, ex, "_ns_sync", ex.table("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
                [*act, _c("syncType")])
    # OS runtime calls (--trace=osrt): pthread_cond_wait, read, poll, ioctl, … Nested calls (fopen → open) are
    # left out: only the outermost call of each stack, so time is not counted twice.
    osrt = ex.table("OSRT_API")
    n += _stage(con, ex, "_ns_osrt", osrt, [_c("start"), _c("end"), _c("globalTid"), _c("nameId"),
                                            _c("returnValue"), _c("nestingLevel")])
    nvtx = ex.table("NVTX_EVENTS")
    n += _stage(con, ex, "_ns_nvtx", nvtx, [
        _c("start"), _c("end"), _c("eventType"), _c("text", typ="s"), _c("globalTid"), _c("endGlobalTid"),
        _c("textId"), _c("domainId"), _c("binaryData", typ="b")],
        where=f"eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}, {NVTX_DOMAIN_CREATE})" if ex.has(nvtx, "eventType")
        else None)
    # globalPid absent (very old exports): the process is then unknown, one process assumed.
    return n


def _choose_clock(con: duckdb.DuckDBPyConnection, meta: Meta, info: NsysSource) -> None:
    """SPEC §3: utc = utcEpochNs + t, unless the export was time-normalised (then t is UTC already)."""
    # the median, not the max: one corrupt row must not decide how every time is read
    row = one(con, """SELECT max(m) FROM (SELECT median(start) m FROM _ns_kernel UNION ALL SELECT median(start)
                      FROM _ns_runtime UNION ALL SELECT median(start) FROM _ns_memcpy)""")
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
                    info.notes.append(f"utcEpochNs disagrees with utcTime ({meta.utc_time}) by "
                                      f"{meta.utc_epoch_ns / 1e9 - t:+.0f} s: the host clock may be misconfigured")
    else:
        info.base_time_ns = 0
        info.clock_anchor = "relative"
        info.notes.append("no TARGET_INFO_SESSION_START_TIME: times are ns since capture start, not UTC")
    if shift:
        info.notes.append(f"export time shift of {shift} ns undone")


def _drop_impossible_times(con: duckdb.DuckDBPyConnection, path: Path, info: NsysSource) -> None:
    """Rows that cannot be placed are left out and counted in the notes: a time that would be no UTC time (int64
    overflow, before 1823 or after 2116), an end before the start, a GPU activity without a start, an end or a
    device (a column missing, text in a number column)."""
    base = int(info.base_time_ns or 0)
    if abs(base) >= TIME_LIMIT_NS:
        raise BadInput(path, f"session start / time shift of {base} ns is no time (utcEpochNs or EXPORT_PARAM_TIME_SHIFT)")
    lo, hi = -TIME_LIMIT_NS - base, TIME_LIMIT_NS - base
    reasons = {
        "impossible times": " OR ".join(f"NOT coalesce({c} BETWEEN {lo} AND {hi}, true)" for c in ("start", '"end"')),
        "an end before the start": '"end" < start',
        "no start, end or device": 'start IS NULL OR "end" IS NULL OR deviceId IS NULL',
        "a device id beyond int32": "NOT coalesce(deviceId BETWEEN 0 AND 2147483647, true)",
    }
    gpu = ("_ns_kernel", "_ns_memcpy", "_ns_memset")
    counts: dict[str, int] = {}
    for reason, cond in reasons.items():
        tables = gpu + ("_ns_sync",) if "device" in reason else gpu if "no start" in reason else \
            gpu + ("_ns_runtime", "_ns_sync", "_ns_nvtx", "_ns_osrt")
        for t in tables:
            row = one(con, f"SELECT count(*) FROM {t} WHERE {cond}")
            if row and row[0]:
                counts[reason] = counts.get(reason, 0) + int(row[0])
                con.execute(f"DELETE FROM {t} WHERE {cond}")
    if counts:
        info.notes.append("events left out: " + ", ".join(f"{n} with {r}" for r, n in counts.items()))
    # Descriptive ids out of their type's range (CUPTI's are 32-bit) are unknown, not errors.
    for t, cols in (("_ns_kernel", ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                                    "correlationId")), ("_ns_memcpy", ("correlationId",)),
                    ("_ns_memset", ("correlationId",)), ("_ns_sync", ("correlationId",)),
                    ("_ns_runtime", ("correlationId",))):
        sets = ", ".join(f'"{c}" = CASE WHEN "{c}" BETWEEN 0 AND {4294967295 if c == "correlationId" else 2147483647} '
                         f'THEN "{c}" END' for c in cols)
        con.execute(f"UPDATE {t} SET {sets}")


def _gpu_processes(con: duckdb.DuckDBPyConnection) -> list[tuple[int, list[int]]]:
    """Processes with GPU activity, by their first kernel / copy, with the CUDA ordinals each used."""
    rows = con.execute("""
        SELECT (globalPid >> 24) & 16777215 AS pid, min(start), list(DISTINCT deviceId ORDER BY deviceId) FROM (
            SELECT globalPid, start, deviceId FROM _ns_kernel UNION ALL SELECT globalPid, start, deviceId FROM _ns_memcpy
            UNION ALL SELECT globalPid, start, deviceId FROM _ns_memset) WHERE globalPid IS NOT NULL
        GROUP BY pid ORDER BY min(start), pid""").fetchall()
    return [(int(p) if p is not None else -1, [d for d in devs if d is not None]) for p, _, devs in rows]


def _assign_ranks(con: duckdb.DuckDBPyConnection, ex: Export, meta: Meta, info: NsysSource) -> None:
    """Processes with GPU activity are ranks: from the captured environment when it names them, else in
    order of first GPU activity. One GPU process: the source's rank (None → the aligner's input order)."""
    found_procs = _gpu_processes(con)
    procs = [p for p, _ in found_procs]
    env = _env_vars(meta)
    ranks: dict[int, int | None] = {}
    how = "order"
    if len(procs) == 1:
        found = [r for d in env.values() if (r := _env_rank(d))]
        if found and len({r for r, _ in found}) == 1:
            info.rank, how = found[0][0], f"env:{found[0][1]}"
            for d in env.values():
                ws = next((_int(d.get(v)) for v in WORLD_VARS if _int(d.get(v))), None)
                if ws and 0 < ws <= MAX_RANKS:
                    info.world_size = ws
                    break
        ranks[procs[0]] = info.rank
    elif len(procs) > 1:
        hits: dict[int, tuple[int, str]] = {}
        for d in env.values():
            p, r = _int(d.get("__PID__")), _env_rank(d)
            if p and r and p in procs:
                hits[p] = r
        if len(hits) == len(procs) and len({r for r, _ in hits.values()}) == len(procs):
            ranks = {p: hits[p][0] for p in procs}
            how = f"env:{next(iter(hits.values()))[1]}"
        elif all(len(d) == 1 for _, d in found_procs) and len({d[0] for _, d in found_procs}) == len(procs):
            # One process per GPU (torchrun, mpirun on one node): rank r drives cuda:r by convention.
            order = sorted(found_procs, key=lambda pd: pd[1][0])
            ranks = {p: i for i, (p, _) in enumerate(order)}
            how = "device"
            info.notes.append(f"{len(procs)} GPU processes in one report, one GPU each: ranks numbered by CUDA "
                              f"device ordinal (pids {', '.join(str(p) for p, _ in order)})")
        else:
            ranks = {p: i for i, p in enumerate(procs)}
            info.notes.append(f"{len(procs)} GPU processes in one report: ranks numbered by first GPU activity "
                              f"(pids {', '.join(str(p) for p in procs)})")
        info.multi_rank = True
        info.world_size = len(procs)
    info.rank_method = how
    info.processes = ranks
    tbl = pa.table({"pid": pa.array(list(ranks), pa.int64()), "rank": pa.array(list(ranks.values()), pa.int32())})
    con.register("_ns_rank_in", tbl)
    con.execute("CREATE OR REPLACE TEMP TABLE _ns_rank AS SELECT * FROM _ns_rank_in")
    con.unregister("_ns_rank_in")
    # Activities of no known process (globalPid missing): the one GPU process's; in a report of several, nobody's
    # (a rank cannot be guessed): left out and counted.
    owners = (("_ns_kernel", "globalPid"), ("_ns_memcpy", "globalPid"), ("_ns_memset", "globalPid"),
              ("_ns_sync", "globalPid"), ("_ns_runtime", "globalTid"))
    if len(procs) == 1:
        for t, col in owners:
            con.execute(f"UPDATE {t} SET {col} = {procs[0]}::BIGINT << 24 WHERE {col} IS NULL")
    elif len(procs) > 1:
        orphans = 0
        for t, col in owners[:4]:
            cond = f"{col} IS NULL OR (({col} >> 24) & 16777215) NOT IN (SELECT pid FROM _ns_rank)"
            row = one(con, f"SELECT count(*) FROM {t} WHERE {cond}")
            if row and row[0]:
                orphans += int(row[0])
                con.execute(f"DELETE FROM {t} WHERE {cond}")
        if orphans:
            info.notes.append(f"events left out: {orphans} GPU activities of no known process (no globalPid)")
    if info.multi_rank:
        # CUPTI correlation ids are per process: make them unique in the source (kernels ↔ api_calls join on it).
        for t, col in (("_ns_kernel", "globalPid"), ("_ns_memcpy", "globalPid"), ("_ns_memset", "globalPid"),
                       ("_ns_sync", "globalPid"), ("_ns_runtime", "globalTid")):
            con.execute(f"UPDATE {t} SET correlationId = (({col} >> 24) & 16777215) * {PID_SHIFT} + correlationId "
                        "WHERE correlationId IS NOT NULL")


def _build_enums(con: duckdb.DuckDBPyConnection, ex: Export) -> None:
    """copyKind / memory-kind words: the export's ENUM tables when present, the built-in maps otherwise."""
    def table_of(enum: str, fallback: dict[int, str], rename: bool) -> pa.Table:
        words = dict(fallback)
        t = ex.table(enum)
        if ex.has(t, "id") and ex.has(t, "name"):
            for i, name in ex.rows(f'SELECT id, name FROM "{t}"'):
                w = _enum_word(_text(name), rename) if rename else None
                if i is not None and w:
                    words[int(i)] = w
        if ex.has(t, "id") and ex.has(t, "label") and not rename:
            for i, label in ex.rows(f'SELECT id, label FROM "{t}"'):
                if i is not None and label:
                    words[int(i)] = _text(label)
        return pa.table({"id": pa.array(list(words), pa.int64()), "word": pa.array(list(words.values()), pa.string())})

    for name, enum, fallback, rename in (("_ns_copykind", "ENUM_CUDA_MEMCPY_OPER", COPY_KIND, True),
                                         ("_ns_memkind", "ENUM_CUDA_MEM_KIND", MEM_KIND, False)):
        con.register("_ns_enum_in", table_of(enum, fallback, rename))
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM _ns_enum_in")
        con.unregister("_ns_enum_in")


def _enum_word(name: str, rename: bool) -> str | None:
    """CUDA_MEMCPY_KIND_HTOD → HtoD, CUDA_MEMCPY_KIND_UVM_DTOH → UVM DtoH (the words Kineto uses)."""
    m = re.fullmatch(r"CUDA_MEMCPY_KIND_(UVM_)?([A-Z])TO([A-Z])", name)
    if m:
        return ("UVM " if m.group(1) else "") + f"{m.group(2)}to{m.group(3)}"
    return "unknown" if name.endswith("UNKNOWN") else None


def _emit(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource) -> None:
    base = int(info.base_time_ns or 0)
    pid = "((y.globalPid >> 24) & 16777215)"
    tpid = "((x.globalTid >> 24) & 16777215)"
    tid = "(x.globalTid & 16777215)"
    stride = f"{sid}::BIGINT * {ID_STRIDE}"
    # One row per GPU activity; names: demangled kernel names (as Kineto), Kineto-style memcpy/memset names.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_gpuacts AS
        SELECT k.start, k."end", k.deviceId, k.contextId, k.streamId, k.correlationId, k.globalPid,
               coalesce(d.value, s.value) AS name,
               CASE WHEN regexp_matches(coalesce(d.value, s.value, ''), '{NCCL_KERNEL_RE}') THEN 'nccl'
                    ELSE 'compute' END AS kind,
               gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread AS regs,
               coalesce(staticSharedMemory, 0) + coalesce(dynamicSharedMemory, 0) AS smem,
               NULL::VARCHAR AS copy_kind, NULL::DOUBLE AS bytes
        FROM _ns_kernel k LEFT JOIN _ns_str d ON d.id = k.demangledName LEFT JOIN _ns_str s ON s.id = k.shortName
        UNION ALL
        SELECT m.start, m."end", m.deviceId, m.contextId, m.streamId, m.correlationId, m.globalPid,
               'Memcpy ' || coalesce(ck.word, 'unknown') || ' (' || coalesce(sk.word, '?') || ' -> '
                   || coalesce(dk.word, '?') || ')',
               'memcpy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               coalesce(ck.word, 'unknown') || CASE
                   WHEN starts_with(coalesce(ck.word, ''), 'H') AND sk.word IS NOT NULL THEN ' (' || sk.word || ')'
                   WHEN regexp_matches(coalesce(ck.word, ''), 'toH$') AND dk.word IS NOT NULL
                       THEN ' (' || dk.word || ')'
                   ELSE '' END,
               m.bytes::DOUBLE
        FROM _ns_memcpy m LEFT JOIN _ns_copykind ck ON ck.id = m.copyKind
        LEFT JOIN _ns_memkind sk ON sk.id = m.srcKind LEFT JOIN _ns_memkind dk ON dk.id = m.dstKind
        UNION ALL
        SELECT z.start, z."end", z.deviceId, z.contextId, z.streamId, z.correlationId, z.globalPid,
               'Memset (' || coalesce(mk.word, 'Device') || ')', 'memset',
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, z.bytes::DOUBLE
        FROM _ns_memset z LEFT JOIN _ns_memkind mk ON mk.id = z.memKind""")
    con.execute(f"""
        INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, raw_start, name, kind,
                             correlation, grid_x, grid_y, grid_z, block_x, block_y, block_z, regs, smem,
                             copy_kind, bytes)
        SELECT row_number() OVER (ORDER BY a.start, a."end", a.streamId, a.correlationId) + {stride},
               {sid}, r.rank, a.deviceId, a.streamId, {base}::BIGINT + a.start, {base}::BIGINT + a."end",
               a.start::DOUBLE, a.name, a.kind, a.correlationId, gridX, gridY, gridZ, blockX, blockY, blockZ,
               regs, smem, copy_kind, bytes
        FROM _ns_gpuacts a LEFT JOIN _ns_rank r ON r.pid = (a.globalPid >> 24) & 16777215
        WHERE a.start IS NOT NULL AND a."end" IS NOT NULL""")
    con.execute(f"""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind, correlation)
        SELECT {sid}, r.rank, {tpid}, {tid}, {base}::BIGINT + x.start, {base}::BIGINT + x."end",
               regexp_replace(coalesce(s.value, 'unknown'), '_v[0-9]+$', ''),
               CASE x.eventClass WHEN 1 THEN 'driver' ELSE 'runtime' END, x.correlationId
        FROM _ns_runtime x LEFT JOIN _ns_str s ON s.id = x.nameId LEFT JOIN _ns_rank r ON r.pid = {tpid}
        WHERE x.start IS NOT NULL""")
    # OS runtime calls of the GPU processes (the ranks): api_calls of kind 'osrt', no correlation. Only those
    # inside the span of the process's CUDA calls and GPU work: start-up and shutdown hold no GPU gap to explain,
    # and would stretch the profiled window (taken from all api_calls) over time the CUDA trace never saw.
    con.execute(f"""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind)
        WITH span AS (
            SELECT pid, min(s) AS s, max(e) AS e FROM (
                SELECT (globalTid >> 24) & 16777215 AS pid, start AS s, "end" AS e FROM _ns_runtime UNION ALL
                SELECT (globalPid >> 24) & 16777215, start, "end" FROM _ns_gpuacts) GROUP BY pid
        )
        SELECT {sid}, r.rank, {tpid}, {tid}, {base}::BIGINT + x.start, {base}::BIGINT + x."end",
               coalesce(s.value, 'unknown'), 'osrt'
        FROM _ns_osrt x JOIN _ns_rank r ON r.pid = {tpid} JOIN span ON span.pid = {tpid}
        LEFT JOIN _ns_str s ON s.id = x.nameId
        WHERE x.start >= span.s AND x."end" <= span.e AND x."end" >= x.start AND coalesce(x.nestingLevel, 0) = 0""")
    sync_kinds = ", ".join(f"({k}, '{v}')" for k, v in SYNC_KIND.items())
    con.execute(f"""
        INSERT INTO syncs (source_id, rank, device, stream, start_ns, end_ns, kind, correlation)
        SELECT {sid}, r.rank, y.deviceId, CASE WHEN y.streamId = {NOT_APPLICABLE} THEN NULL ELSE y.streamId END,
               {base}::BIGINT + y.start, {base}::BIGINT + y."end", coalesce(k.word, 'Unknown Sync'), y.correlationId
        FROM _ns_sync y LEFT JOIN (VALUES {sync_kinds}) k(id, word) ON k.id = y.syncType
        LEFT JOIN _ns_rank r ON r.pid = {pid}
        WHERE y.start IS NOT NULL""")
    _emit_nvtx(con, sid, base, info)
    _emit_collectives(con, sid)
    _emit_nccl_payloads(con, ex, sid, base, info)
    _emit_devices(con, ex, sid, info)


def _emit_nvtx(con: duckdb.DuckDBPyConnection, sid: int, base: int, info: NsysSource) -> None:
    """NVTX ranges → `ranges`; emit_nvtx op ranges (`…, op_id = N`) of the default domain → `ops`."""
    tpid = "((n.globalTid >> 24) & 16777215)"
    # Domain ids are per process: (pid, domainId) → the name its DomainCreate (75) row gives.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_domain AS
        SELECT {tpid} AS pid, n.domainId, any_value(n.text) AS domain FROM _ns_nvtx n
        WHERE n.eventType = {NVTX_DOMAIN_CREATE} AND n.text IS NOT NULL GROUP BY ALL""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_nvtx_r AS
        SELECT n.start, n."end", n.globalTid, coalesce(n.domainId, 0) AS domainId, {tpid} AS pid,
               n.globalTid & 16777215 AS tid, coalesce(n.text, s.value) AS name
        FROM _ns_nvtx n LEFT JOIN _ns_str s ON s.id = n.textId
        WHERE n.eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}) AND n."end" IS NOT NULL""")
    unfinished = one(con, f"""SELECT count(*) FROM _ns_nvtx WHERE eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND})
                              AND "end" IS NULL""")
    if unfinished and unfinished[0]:
        info.notes.append(f"{unfinished[0]} NVTX ranges never ended (left out)")
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu)
        SELECT {sid}, r.rank, n.pid, n.tid, NULL,
               CASE WHEN n.domainId = 0 THEN 'default'
                    ELSE coalesce(d.domain, CASE WHEN starts_with(n.name, 'nccl') THEN 'NCCL' END,
                                  'domain ' || n.domainId) END,
               n.name, {base}::BIGINT + n.start, {base}::BIGINT + n."end", false
        FROM _ns_nvtx_r n LEFT JOIN _ns_domain d ON d.pid = n.pid AND d.domainId = n.domainId
        LEFT JOIN _ns_rank r ON r.pid = n.pid
        WHERE n.name IS NOT NULL AND NOT (n.domainId = 0 AND regexp_matches(n.name, '{OP_TEXT_RE}'))""")
    # emit_nvtx(record_shapes=True): `aten::mm, seq = 12, op_id = 345, sizes = [[8192, 8192], [8192, 8192]], …`.
    # `sizes` is the same JSON as Kineto's `Input Dims`; emit_nvtx records no dtypes (input_types NULL).
    con.execute(f"""
        INSERT INTO ops (source_id, rank, pid, thread, start_ns, end_ns, raw_start, name, op_id, seq, input_dims)
        SELECT {sid}, r.rank, n.pid, n.tid, {base}::BIGINT + n.start, {base}::BIGINT + n."end", n.start::DOUBLE,
               regexp_extract(n.name, '^(.*?), (?:seq|op_id) = [0-9]', 1),
               row_number() OVER (ORDER BY n.start, n."end" DESC, n.tid) + {sid}::BIGINT * {ID_STRIDE},
               TRY_CAST(nullif(regexp_extract(n.name, ', seq = ([0-9]+)', 1), '') AS BIGINT),
               nullif(regexp_extract(n.name, ', sizes = (\\[[\\[\\]0-9, -]*\\])', 1), '')
        FROM _ns_nvtx_r n LEFT JOIN _ns_rank r ON r.pid = n.pid
        WHERE n.domainId = 0 AND n.name IS NOT NULL AND regexp_matches(n.name, '{OP_TEXT_RE}')""")
    con.execute("DROP TABLE _ns_nvtx_r")


def _emit_collectives(con: duckdb.DuckDBPyConnection, sid: int) -> None:
    """One row per NCCL kernel: collective from the kernel name, seq = its occurrence per rank and collective."""
    con.execute(f"""
        INSERT INTO collectives (source_id, rank, device, stream, kernel_correlation, start_ns, end_ns, collective,
                                 seq, dtype)
        WITH k AS (
            SELECT *, lower(nullif(regexp_extract(name, '{NCCL_COLLECTIVE_RE}', 1), '')) AS coll
            FROM kernels WHERE source_id = {sid} AND kind = 'nccl'
        )
        SELECT {sid}, rank, device, stream, correlation, start_ns, end_ns, coll,
               (row_number() OVER (PARTITION BY rank, coll ORDER BY start_ns, kernel_id) - 1)::INTEGER,
               nullif(regexp_extract(name, '{NCCL_DTYPE_RE}', 1), '')
        FROM k""")


# NVTX extended-payload entry types (nvToolsExtPayload.h NVTX_PAYLOAD_ENTRY_TYPE_*) → (bytes, signed).
# Types from 2**24 up name an enum schema (its size from NVTX_PAYLOAD_ENUMS, else 4 bytes).
PAYLOAD_TYPES = {1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False), 7: (8, True),
                 8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False), 13: (2, True),
                 14: (2, False), 15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False), 22: (8, False),
                 23: (8, False)}
# NCCL's payload entry names (NCCL 2.19+), as the schema tables give them.
NCCL_PAYLOAD_FIELDS = {"comm": "NCCL communicator ID", "nranks": "No. of ranks", "comm_rank": "Rank",
                       "bytes": "Message size [bytes]", "peer": "Peer rank", "root": "Root",
                       "redop": "Reduction operation"}


def _le_uint(hexcol: str, byte_off: str, n: int) -> str:
    """SQL: the little-endian unsigned integer of `n` bytes at `byte_off` in the hex string `hexcol`."""
    pairs = " || ".join(f"substring({hexcol}, 2 * ({byte_off}) + {2 * i + 1}, 2)" for i in reversed(range(n)))
    return f"TRY_CAST('0x' || {pairs} AS UBIGINT)"


def _emit_nccl_payloads(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, base: int, info: NsysSource) -> None:
    """NCCL's NVTX payloads (exported with `--include-blobs true`) → `collectives`: message size, communicator,
    its size and this rank's place in it, peer. Each `binaryData` is a 32-byte header (count, schemaId,
    payload size, payload offset; u64 little-endian) and the payload, laid out by NVTX_PAYLOAD_SCHEMA_ENTRIES.
    An NCCL call range is matched to the kernel whose launch (runtime/driver call, same thread) it contains."""
    entries = ex.table("NVTX_PAYLOAD_SCHEMA_ENTRIES")
    has_blobs = one(con, "SELECT count(*) FROM _ns_nvtx WHERE binaryData IS NOT NULL")
    if entries is None or not has_blobs or not has_blobs[0]:
        if ex.table("NVTX_PAYLOAD_SCHEMAS") is not None and one(con, "SELECT count(*) FROM collectives WHERE "
                                                                      f"source_id = {sid}") != (0,):
            info.notes.append("NCCL NVTX payloads not exported (export with --include-blobs true for message sizes "
                              "and communicators)")
        return
    _stage(con, ex, "_ns_pl_entries", entries, [_c("domainId"), _c("schemaId"), _c("idx"), _c("type"),
                                                _c("name", typ="s"), _c("offset")])
    _stage(con, ex, "_ns_pl_enums", ex.table("NVTX_PAYLOAD_ENUMS"), [_c("domainId"), _c("schemaId"), _c("size")])
    _stage(con, ex, "_ns_pl_enum_entries", ex.table("NVTX_PAYLOAD_ENUM_ENTRIES"),
           [_c("domainId"), _c("schemaId"), _c("idx"), _c("name", typ="s"), _c("value")])
    sizes = ", ".join(f"({t}, {n}, {str(sg).lower()})" for t, (n, sg) in PAYLOAD_TYPES.items())
    value = " ".join(f"WHEN {n} THEN {_le_uint('p.hex', 'p.payload_off + coalesce(e.offset, 0)', n)}"
                     for n in (1, 2, 4, 8))
    tpid = "((n.globalTid >> 24) & 16777215)"
    # One row per (payload event, schema entry). Domain and schema ids repeat per process with the same layout.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_pl_values AS
        WITH p AS (
            SELECT n.start, n."end", {tpid} AS pid, n.globalTid & 16777215 AS tid, n.domainId,
                   coalesce(n.text, s.value) AS name, hex(n.binaryData) AS hex,
                   {_le_uint('hex(n.binaryData)', '8', 8)} AS schema_id,
                   TRY_CAST({_le_uint('hex(n.binaryData)', '24', 8)} AS BIGINT) AS payload_off
            FROM _ns_nvtx n LEFT JOIN _ns_str s ON s.id = n.textId
            WHERE n.binaryData IS NOT NULL AND octet_length(n.binaryData) >= 32
              AND n.eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND})
        ), e AS (
            SELECT DISTINCT e.domainId, e.schemaId, e.name, e.offset, e.type,
                   coalesce(t.n, CASE WHEN e.type >= 16777216 THEN coalesce(en.size, 4) END) AS n,
                   coalesce(t.signed, false) AS signed
            FROM _ns_pl_entries e LEFT JOIN (VALUES {sizes}) t(type, n, signed) ON t.type = e.type
            LEFT JOIN (SELECT DISTINCT domainId, schemaId, size FROM _ns_pl_enums) en
                   ON en.domainId = e.domainId AND en.schemaId = e.type
        )
        SELECT p.start, p."end", p.pid, p.tid, p.name, e.name AS field, e.type,
               CASE WHEN 2 * (p.payload_off + coalesce(e.offset, 0) + e.n) <= length(p.hex)
                    THEN CASE e.n {value} END END AS raw, e.n, e.signed
        FROM p JOIN e ON e.domainId = p.domainId AND e.schemaId = p.schema_id
        WHERE e.n IN (1, 2, 4, 8)""")
    f = NCCL_PAYLOAD_FIELDS

    def pick(key: str, signed: bool = True) -> str:
        val = "CASE WHEN signed AND n < 8 AND raw >= (1::UBIGINT << (8 * n - 1)) THEN raw::HUGEINT - (1::HUGEINT << (8 * n)) " \
              "ELSE raw::HUGEINT END"
        return f"TRY_CAST(max({val}) FILTER (WHERE field = '{f[key]}') AS BIGINT)"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_nccl_calls AS
        SELECT start, "end", pid, tid, name,
               lower(printf('%016x', max(raw) FILTER (WHERE field = '{f["comm"]}'))) AS comm,
               {pick("nranks")} AS nranks, {pick("comm_rank")} AS comm_rank, {pick("bytes")} AS bytes,
               {pick("peer")} AS peer, {pick("root")} AS root
        FROM _ns_pl_values GROUP BY start, "end", pid, tid, name""")
    # Communicators: (pid, comm) → this process's rank in it and its size (ncclCommInitRank* payloads); the
    # store ranks of its members when they are all in this report, in communicator-rank order.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _ns_comms AS
        WITH m AS (
            SELECT DISTINCT c.pid, c.comm, c.comm_rank, c.nranks, r.rank FROM _ns_nccl_calls c
            LEFT JOIN _ns_rank r ON r.pid = c.pid
            WHERE starts_with(c.name, 'ncclCommInit') AND c.comm IS NOT NULL AND c.comm_rank IS NOT NULL
        ), g AS (
            SELECT comm, '[' || string_agg(rank::VARCHAR, ', ' ORDER BY comm_rank) || ']' AS ranks,
                   count(*) AS members, any_value(nranks) AS nranks, count(rank) AS known
            FROM m GROUP BY comm
        )
        SELECT m.pid, m.comm, m.comm_rank, m.nranks,
               CASE WHEN g.members = g.nranks AND g.known = g.members THEN g.ranks END AS group_ranks
        FROM m JOIN g USING (comm)""")
    # The NCCL call that launched each collective's kernel: the innermost payload range on the launching thread
    # around the launch call (ncclAllReduce … → cudaLaunchKernelExC / cuLaunchKernelEx inside it).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_nccl_match AS
        SELECT c.rank, c.kernel_correlation, arg_max(x.bytes, x.start) AS bytes, arg_max(x.comm, x.start) AS comm,
               arg_max(x.peer, x.start) AS peer, arg_max(x.pid, x.start) AS pid
        FROM collectives c JOIN api_calls a ON a.source_id = {sid} AND a.correlation = c.kernel_correlation
                                            AND a.rank IS NOT DISTINCT FROM c.rank
        JOIN _ns_nccl_calls x ON x.pid = a.pid AND x.tid = a.thread
                             AND {base}::BIGINT + x.start <= a.start_ns AND {base}::BIGINT + x."end" >= a.end_ns
        WHERE c.source_id = {sid} AND NOT starts_with(x.name, 'ncclCommInit') AND x.name NOT LIKE 'ncclGroup%'
        GROUP BY c.rank, c.kernel_correlation""")
    matched = one(con, "SELECT count(*) FROM _ns_nccl_match")
    total = one(con, f"SELECT count(*) FROM collectives WHERE source_id = {sid}")
    n_matched, n_total = (int(matched[0]) if matched else 0), (int(total[0]) if total else 0)
    con.execute(f"""
        UPDATE collectives SET bytes = m.bytes, peer = m.peer, group_size = cm.nranks, group_ranks = cm.group_ranks
        FROM _ns_nccl_match m LEFT JOIN _ns_comms cm ON cm.pid = m.pid AND cm.comm = m.comm
        WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM m.rank
          AND collectives.kernel_correlation = m.kernel_correlation""")
    if n_total and n_matched == n_total:
        # Every collective knows its communicator: it is the process group, and seq counts within it.
        con.execute(f"""
            UPDATE collectives SET process_group = 'nccl:' || m.comm FROM _ns_nccl_match m
            WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM m.rank
              AND collectives.kernel_correlation = m.kernel_correlation AND m.comm IS NOT NULL""")
        con.execute(f"""
            UPDATE collectives SET seq = s.seq FROM (
                SELECT rank, kernel_correlation, (row_number() OVER (PARTITION BY rank, process_group, collective
                                                                      ORDER BY start_ns, kernel_correlation) - 1)::INTEGER AS seq
                FROM collectives WHERE source_id = {sid}) s
            WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM s.rank
              AND collectives.kernel_correlation = s.kernel_correlation""")
    if n_total:
        info.notes.append(f"NCCL NVTX payloads: message size and communicator of {n_matched} of {n_total} collectives")
    con.execute("DROP TABLE IF EXISTS _ns_comms")
    con.execute("DROP TABLE IF EXISTS _ns_nccl_match")


def _emit_devices(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource) -> None:
    """`devices`: per GPU process and CUDA ordinal (kernels.device), the physical GPU behind it:
    TARGET_INFO_CUDA_DEVICE(pid, cudaId → gpuId), else TARGET_INFO_GPU.cuDevice = the ordinal."""
    gpu = ex.table("TARGET_INFO_GPU")
    gcols = [_c("id"), _c("name", typ="s"), _c("busLocation", typ="s"), _c("uuid", typ="s"), _c("smCount"),
             _c("totalMemory"), _c("computeMajor"), _c("computeMinor"), _c("cuDevice"), _c("vmId")]
    _stage(con, ex, "_ns_gpu", gpu if ex.has(gpu, "id") else None, gcols)
    cdev = ex.table("TARGET_INFO_CUDA_DEVICE")
    _stage(con, ex, "_ns_cudadev", cdev if ex.has(cdev, "cudaId") else None,
           [_c("gpuId"), _c("cudaId"), _c("pid"), _c("uuid", typ="s"), _c("numMultiprocessors")])
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _ns_devmap AS
        WITH used AS (
            SELECT DISTINCT (globalPid >> 24) & 16777215 AS pid, deviceId AS device FROM _ns_gpuacts
            WHERE deviceId IS NOT NULL
        ), byproc AS (
            SELECT u.pid, u.device, any_value(c.gpuId) AS gpu_id, any_value(c.uuid) AS cuda_uuid,
                   any_value(c.numMultiprocessors) AS sms
            FROM used u LEFT JOIN _ns_cudadev c ON c.pid = u.pid AND c.cudaId = u.device GROUP BY ALL
        ), bycu AS (
            SELECT cuDevice, min(id) AS gpu_id, count(*) AS n FROM _ns_gpu GROUP BY cuDevice
        )
        SELECT b.pid, r.rank, b.device, coalesce(b.gpu_id, CASE WHEN cu.n = 1 THEN cu.gpu_id END) AS gpu_id,
               b.cuda_uuid, b.sms
        FROM byproc b LEFT JOIN bycu cu ON cu.cuDevice = b.device LEFT JOIN _ns_rank r ON r.pid = b.pid""")
    con.execute(f"""
        INSERT INTO devices (source_id, rank, device, gpu_uuid, bus_id, name, sm_count, memory_bytes,
                             compute_capability, vendor)
        SELECT {sid}, m.rank, m.device,
               CASE WHEN coalesce(g.uuid, m.cuda_uuid, '') = '' THEN NULL
                    WHEN starts_with(lower(coalesce(nullif(g.uuid, ''), m.cuda_uuid)), 'gpu-')
                        THEN coalesce(nullif(g.uuid, ''), m.cuda_uuid)
                    ELSE 'GPU-' || coalesce(nullif(g.uuid, ''), m.cuda_uuid) END,
               nullif(g.busLocation, ''), g.name, coalesce(g.smCount, m.sms), g.totalMemory,
               CASE WHEN g.computeMajor IS NOT NULL THEN g.computeMajor || '.' || coalesce(g.computeMinor, 0) END,
               CASE WHEN g.name LIKE '%NVIDIA%' OR g.name IS NULL THEN 'NVIDIA' END
        FROM _ns_devmap m LEFT JOIN _ns_gpu g ON g.id = m.gpu_id
        ORDER BY m.rank, m.device""")
    missing = one(con, "SELECT count(*) FROM _ns_devmap WHERE gpu_id IS NULL")
    if missing and missing[0]:
        info.notes.append("GPU model not in the export (no TARGET_INFO_GPU row for the device): give --gpu")
    con.execute("DROP TABLE IF EXISTS _ns_cudadev")


def _rowid_chunks(ex: Export, table: str) -> list[tuple[int, int] | None]:
    """rowid ranges of about COUNTER_CHUNK_ROWS rows (a rowid range is a b-tree range in SQLite: no full scan);
    one unbounded chunk for small tables or tables without rowid, and for Arrow-family exports (streamed)."""
    if not ex.is_sqlite:
        return [None]
    try:
        (lo,), = ex.rows(f'SELECT min(rowid) FROM "{table}"')
        (hi,), = ex.rows(f'SELECT max(rowid) FROM "{table}"')
    except sqlite3.DatabaseError:
        return [None]
    if lo is None or hi is None or hi - lo < COUNTER_CHUNK_ROWS:
        return [None]
    n_chunks = (hi - lo) // COUNTER_CHUNK_ROWS + 1
    if n_chunks > 64:  # sparse rowids (an edited or hostile file): no more chunks than the rows need
        (count,), = ex.rows(f'SELECT count(*) FROM "{table}"')
        n_chunks = min(n_chunks, count // COUNTER_CHUNK_ROWS + 1)
    stride = -(-(hi - lo + 1) // n_chunks)
    return [(a, min(a + stride - 1, hi)) for a in range(lo, hi + 1, stride)]


def metric_name(raw: str) -> str:
    """`SMs Active [Throughput %]` → sm_active; unknown names snake_cased (`[Throughput %]` dropped)."""
    base, _, suffix = raw.partition(" [")
    for prefix, name in METRIC_NAMES:
        if base.startswith(prefix):
            return name
    suffix = suffix.rstrip("]")
    words = re.sub(r"[^0-9a-zA-Z]+", "_", base).strip("_").lower()
    if suffix and suffix != "Throughput %":
        words += "_" + re.sub(r"[^0-9a-zA-Z]+", "_", suffix).strip("_").lower()
    return words or "metric"


def _emit_counters(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, meta: Meta, info: NsysSource) -> int:
    """GPU_METRICS → `counters` as intervals [t − period, t], joined to their names on (typeId, metricId) and
    to the GPU through typeId & 0xFF (TARGET_INFO_GPU.id) → the process's CUDA ordinal. Streams, never held."""
    gm, names = ex.table("GPU_METRICS"), ex.table("TARGET_INFO_GPU_METRICS")
    if gm is None or not all(ex.has(names, c) for c in ("typeId", "metricId", "metricName")):
        return 0
    rows = ex.rows(f'SELECT DISTINCT typeId, metricId, metricName FROM "{names}"')
    tbl: dict[str, list[Any]] = {"typeId": [], "metricId": [], "metric": [], "scale": [], "hz_to_mhz": []}
    for type_id, metric_id, raw in rows:
        raw_name = _text(raw)
        m = metric_name(raw_name)
        pct = "%" in raw_name or (m in PERCENT_METRICS and "[" not in raw_name)
        tbl["typeId"].append(int(type_id))
        tbl["metricId"].append(int(metric_id))
        tbl["metric"].append(m)
        tbl["scale"].append(0.01 if pct else 1.0)
        # Clock metrics are named [MHz] but some versions store Hz (1.98e9 on an H200): no clock is 100 GHz.
        tbl["hz_to_mhz"].append("MHz" in raw_name)
    con.register("_ns_metric_in", pa.table({
        "typeId": pa.array(tbl["typeId"], pa.int64()), "metricId": pa.array(tbl["metricId"], pa.int64()),
        "metric": pa.array(tbl["metric"], pa.string()), "scale": pa.array(tbl["scale"], pa.float64()),
        "hz_to_mhz": pa.array(tbl["hz_to_mhz"], pa.bool_())}))
    con.execute("CREATE OR REPLACE TEMP TABLE _ns_metric AS SELECT * FROM _ns_metric_in")
    con.unregister("_ns_metric_in")
    # GPU id (typeId & 0xFF) → the rank and CUDA ordinal of the process that used it; GPUs no GPU process used
    # are left out (their ordinal would collide with a used one's).
    # Each row names its GPU by UUID (as counter logs do): the aligner matches counters to trace GPUs by it.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_gpumetric_dev AS
        SELECT m.gpu_id, arg_min(m.rank, coalesce(m.rank, 1 << 30)) AS rank,
               arg_min(m.device, coalesce(m.rank, 1 << 30)) AS device, any_value(d.gpu_uuid) AS gpu_uuid
        FROM _ns_devmap m LEFT JOIN devices d ON d.source_id = {sid} AND d.rank IS NOT DISTINCT FROM m.rank
                                              AND d.device = m.device
        WHERE m.gpu_id IS NOT NULL GROUP BY m.gpu_id""")
    single = one(con, "SELECT count(*), count(gpu_id) FROM _ns_devmap")
    if single and single[0] == 1 and single[1] == 0:
        # one GPU used and no TARGET_INFO_GPU to name it: the metrics' GPUs can only be that one
        con.execute("""INSERT INTO _ns_gpumetric_dev SELECT DISTINCT m.typeId & 255, d.rank, d.device, NULL
                       FROM _ns_metric m, _ns_devmap d""")
    period = f"{round(1e9 / meta.gpu_metrics_hz)}::BIGINT" if meta.gpu_metrics_hz else "NULL::BIGINT"
    base = int(info.base_time_ns or 0)
    cols = [_c("timestamp"), _c("typeId"), _c("metricId"), _c("value", typ="f")]
    before = one(con, "SELECT count(*) FROM counters")
    for chunk in _rowid_chunks(ex, gm):
        where = '"timestamp" >= 0' + (f" AND rowid BETWEEN {chunk[0]} AND {chunk[1]}" if chunk else "")
        cur, rdr = ex.scan(gm, cols, where=where)
        try:
            con.register("_nsys_in", rdr)
            con.execute(f"""
                INSERT INTO counters (source_id, rank, device, gpu_index, gpu_uuid, metric, start_ns, end_ns, value,
                                      time_source)
                SELECT {sid}, d.rank, d.device, d.device, d.gpu_uuid, m.metric,
                       {base}::BIGINT + g.timestamp - {period}, {base}::BIGINT + g.timestamp,
                       CASE WHEN m.hz_to_mhz AND g.value > 1e5 THEN g.value / 1e6 ELSE g.value * m.scale END,
                       'native'
                FROM _nsys_in g JOIN _ns_metric m ON m.typeId = g.typeId AND m.metricId = g.metricId
                JOIN _ns_gpumetric_dev d ON d.gpu_id = g.typeId & 255
                WHERE g._s = 1""")
            con.unregister("_nsys_in")
        except (duckdb.Error, OSError, pa.ArrowException) as e:
            raise BadInput(ex.path, f"cannot read table {gm} ({e})") from None
        finally:
            if cur is not None:
                cur.close()
        if chunk:
            # DuckDB compresses in-memory tables at a checkpoint (~15x for counters): memory stays bounded.
            with contextlib.suppress(duckdb.Error):  # inside a caller's transaction: no checkpoint, only more memory
                con.execute("CHECKPOINT")
    after = one(con, "SELECT count(*) FROM counters")
    n = int(after[0] - before[0]) if after and before else 0
    if n and not meta.gpu_metrics_hz:
        # No sampling frequency recorded: each series' mean sample spacing is its period.
        con.execute(f"""
            UPDATE counters SET start_ns = counters.end_ns - p.period FROM (
                SELECT device, metric, ((max(end_ns) - min(end_ns)) / greatest(count(*) - 1, 1))::BIGINT AS period
                FROM counters WHERE source_id = {sid} GROUP BY ALL) p
            WHERE counters.source_id = {sid} AND counters.start_ns IS NULL
              AND counters.device IS NOT DISTINCT FROM p.device AND counters.metric = p.metric""")
    con.execute("DROP TABLE IF EXISTS _ns_gpumetric_dev")
    if n:
        info.notes.append(f"GPU metrics: {n} samples of {len(set(tbl['metric']))} metrics")
        if meta.gpu_metrics_hz:
            info.sample_period_ns = round(1e9 / meta.gpu_metrics_hz)
    return n
