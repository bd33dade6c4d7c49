"""Nsight Systems exports (`nsys export --type sqlite | parquetdir | arrowdir | arrow`, 2022.2 → 2026.x) → the store.

Along its seams:
- `reader`: the SQLite export, read as SQLite reads it (read-only, locks respected, `-wal` / hot `-journal`
  recovered on a copy, tables only), and the typed-column plumbing into DuckDB staging tables;
- `arrow`: parquetdir / arrowdir / arrow-stream exports behind the same interface;
- `metadata`: versions, time normalisation, session start, captured environment, diagnostics, the clock;
- `processes`: which process is which rank;
- `events`: GPU activities, API calls, syncs, NVTX ranges and ops, collectives, devices;
- `nccl`: NCCL's NVTX payloads;
- `gpu_metrics`: GPU_METRICS samples → counters;
- `memory`: CUDA_GPU_MEMORY_USAGE_EVENTS (`--cuda-memory-usage=true`) → memory_events.
Small tables are read with `sqlite3`; event tables stream as Arrow batches straight into DuckDB, which decodes the
packed ids, converts times to UTC and splits rows into the store's tables. No Python loop touches rows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import adbc_driver_manager
import duckdb
import pyarrow as pa

from ... import store
from ...errors import BadInput
from ...store import one
from ..base import Format, Sniff
from . import events, gpu_metrics, metadata, processes
from . import memory as device_memory
from .arrow import ArrowExport, export_kind
from .gpu_metrics import metric_name
from .metadata import NsysSource
from .reader import Col, Export

__all__ = [
    "FORMATS",
    "ArrowExport",
    "Col",
    "Export",
    "NsysSource",
    "export_kind",
    "ingest",
    "metric_name",
    "open_export",
    "sniff",
]

SQLITE_MAGIC = b"SQLite format 3\x00"


def open_export(path: Path) -> Export:
    """The export at `path`: a SQLite file, or a parquetdir / arrowdir folder or `.arrows` stream."""
    kind = export_kind(path)
    return ArrowExport(path, kind) if kind else Export(path)


def sniff(s: Sniff) -> str | None:
    if s.head.startswith(SQLITE_MAGIC):
        return "nsys-sqlite"
    return export_kind(s.path)


def ingest(path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> NsysSource:
    """Read one nsys export (SQLite, parquetdir or arrow) into the store. Several GPU processes = several ranks
    (rank per row)."""
    ex = open_export(path)
    try:
        info = _ingest(ex, con, source_id)
        info.notes[:0] = getattr(ex, "notes", [])
        return info
    except pa.ArrowException as e:
        raise BadInput(path, f"corrupt {ex.format.removeprefix('nsys-')} export ({str(e).strip().splitlines()[0]})") from None
    except UnicodeDecodeError:  # SQLite's message about a damaged schema, quoting bytes that are not UTF-8
        raise BadInput(path, "corrupt SQLite export (its schema is damaged)") from None
    except (sqlite3.DatabaseError, adbc_driver_manager.Error) as e:
        # a page the header promised is corrupt or missing: found only when a query reaches it
        text = str(e).strip().splitlines()[0] if str(e).strip() else str(e)
        if "locked" in text.lower() or "busy" in text.lower():
            raise BadInput(
                path,
                "the database is locked by another process (is an export or a writer still running?): try again when it is done",
            ) from None
        raise BadInput(path, f"corrupt SQLite export ({text})") from None
    finally:
        ex.close()
        for t in _TEMP:
            con.execute(f"DROP TABLE IF EXISTS {t}")


_TEMP = (
    "_ns_str",
    "_ns_kernel",
    "_ns_memcpy",
    "_ns_memset",
    "_ns_runtime",
    "_ns_overhead",
    "_ns_profoverhead",
    "_ns_sync",
    "_ns_nvtx",
    "_ns_rank",
    "_ns_gpu",
    "_ns_devmap",
    "_ns_metric",
    "_ns_copykind",
    "_ns_memkind",
    "_ns_domain",
    "_ns_gpuacts",
    "_ns_cudadev",
    "_ns_nvtx_r",
    "_ns_gpumetric_dev",
    "_ns_pl_entries",
    "_ns_pl_enums",
    "_ns_pl_enum_entries",
    "_ns_pl_values",
    "_ns_nccl_calls",
    "_ns_comms",
    "_ns_nccl_match",
    "_ns_osrt",
)


def _ingest(ex: Export, con: duckdb.DuckDBPyConnection, sid: int) -> NsysSource:
    if not any(ex.table(t) for t in ("StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA")):
        what = "SQLite database" if ex.is_sqlite else "Arrow tables"
        raise BadInput(ex.path, f"{what} but not an Nsight Systems export (no StringIds / META_DATA_EXPORT)")
    meta = metadata.read_meta(ex)
    info = NsysSource(format=ex.format, tables=set(ex.columns))
    info.format_version = f"nsys {meta.version or '?'} (schema {meta.schema or '?'})"
    info.host = meta.host
    info.incomplete, info.dropped_events = metadata.diagnostics(ex)
    info.events = events.stage_all(con, ex)
    metadata.choose_clock(con, meta, info)
    events.drop_impossible_times(con, ex.path, info)
    processes.assign_ranks(con, meta, info)
    events.build_enums(con, ex)
    device_notes = events.emit_activities(con, ex, sid, info)
    # The GPU metrics (most of a large export) go in on threads of their own while the other tables are written,
    # where DuckDB has room for both (store.room_beside); else the other tables first: beside the metrics' load
    # their sorts spill. Measured (benchmarks/README.md, session 33), the ingest alone: the 1.9 GiB export under
    # the default budget (569 MiB of staging tables against 768 MiB for DuckDB) 20.4-22.6 -> 18.4-19.3 s, 38-42 ->
    # 33-35 CPU-s (two rounds); the 486 MiB one (144 MiB) keeps the overlap, 4.45-4.74 s against 4.77-4.99 s.
    together = store.room_beside(con)
    if not together:
        _emit_rest(con, ex, sid, info, device_notes)
    counters = gpu_metrics.start_counters(con, ex, sid, meta, info)
    if together:
        try:
            _emit_rest(con, ex, sid, info, device_notes)
        except BaseException:
            counters.cancel()
            raise
    info.events += counters.finish()
    row = one(con, "SELECT count(*) FROM kernels WHERE source_id = ?", [sid])
    info.gpu_events = int(row[0]) if row else 0
    if ex.table("CUPTI_ACTIVITY_KIND_KERNEL") is None:
        info.notes.append("no CUPTI_ACTIVITY_KIND_KERNEL table (captured without --trace=cuda, or no kernel ran)")
    if not info.gpu_events and not any(ex.table(t) for t in CUDA_TABLES):
        info.no_gpu_reason = no_cuda_trace(ex)
    return info


# The tables of a CUDA trace: an export with none of them was recorded without `--trace=cuda` (or while the
# program made no CUDA call), whatever else it has, or holds no recording at all.
CUDA_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
)
# What such an export may hold instead, as said in the refusal.
_OTHER_RECORDS = (("GPU_METRICS", "GPU metric samples"), ("NVTX_EVENTS", "NVTX events"), ("OSRT_API", "OS runtime calls"))


def no_cuda_trace(ex: Export) -> str:
    """Why an export without CUDA tables has no GPU work to measure, naming what it holds instead (a GPU-metrics-only
    or NVTX-only recording is not a CPU-only profile), or saying that it holds no recording at all (string tables
    only: seen where an older nsys exported a newer one's report)."""
    if not any(ex.table(t) for t in ("META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME")):
        return (
            "this export holds no recording (no session, metadata or event table: the nsys that exported it may not "
            "read the report's version): export it again with the nsys that recorded it"
        )
    held = []
    for name, what in _OTHER_RECORDS:
        table = ex.table(name)
        n = int(ex.rows(f'SELECT count(*) FROM "{table}"')[0][0]) if table else 0
        if n:
            held.append(f"{n:,} {what}")
    holds = f"; it holds {', '.join(held)}, but" if held else ", and"
    return (
        "no CUDA trace in this export (no CUPTI_ACTIVITY_KIND table: recorded without `nsys profile --trace=cuda`, "
        f"or the program made no CUDA call while recorded){holds} GPU utilization needs the kernels: record with "
        "`--trace=cuda,nvtx`"
    )


def _emit_rest(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource, device_notes: list[str]) -> None:
    """Every table after the devices and the GPU activities except the GPU metrics: kernels, runtime and OS calls,
    syncs, NVTX ranges and ops, collectives, device memory."""
    events.emit_rest(con, ex, sid, info, device_notes)
    info.events += device_memory.emit(con, ex, sid, info)


FORMATS = (
    Format("nsys-sqlite", "Nsight Systems SQLite export", ingest),
    Format("nsys-parquetdir", "Nsight Systems parquetdir export", ingest),
    Format("nsys-arrow", "Nsight Systems arrow export", ingest),
)
