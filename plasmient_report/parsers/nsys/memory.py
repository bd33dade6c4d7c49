"""nsys CUDA memory records (`nsys profile --cuda-memory-usage=true`: CUDA_GPU_MEMORY_USAGE_EVENTS) → memory_events.

What the table records, as seen in real exports (nsys 2025.3, `sample_traces/h200_nsys_memory/`): one row per
device-memory allocation or free the CUDA driver saw — `cudaMalloc` / `cudaFree` (a caching allocator's segments, a
library's workspace), the mapping and unmapping of virtual-memory pages (`cuMemSetAccess` / `cuMemUnmap`, as
PyTorch's `expandable_segments` does), and stream-ordered allocations from a memory pool (`cudaMallocAsync` /
`cudaFreeAsync`, with the pool's size after the operation in `localMemoryPoolSize`) — plus module globals loaded
with the code (`memKind` Device Static) and host allocations (Pinned, Pageable).

So this is device memory **from the driver's point of view**: what the process holds, not what its tensors use.
Under PyTorch's caching allocator every `cudaMalloc` is a segment the allocator *reserves*; which blocks of it live
tensors *allocate* the driver never sees. The store's rows are therefore `origin = 'driver'`: `bytes_delta` is the
signed size of each allocation / free; `total_reserved` the process's device memory on that GPU after the event —
non-pool allocations still held plus each pool's size — and `total_allocated` is NULL (unknown). The total is only
exact when the report saw every allocation of the process, i.e. the capture began before the process did (no
capture range, no delay, no pause): else it is NULL too and a note says why. Module globals, host and managed
memory and allocations from pools imported from another process are left out (counted in the notes).
"""

from __future__ import annotations

import duckdb

from ...store import one
from .metadata import NsysSource
from .reader import Export, c, stage, text

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
# ENUM_CUDA_MEM_KIND / ENUM_CUDA_DEV_MEM_EVENT_OPER as the exports of 2025.3 give them, for exports without the enums
DEVICE_KINDS = {"CUDA_MEMOPR_MEMORY_KIND_DEVICE": 2, "CUDA_MEMOPR_MEMORY_KIND_ARRAY": 3}
OPERATIONS = {"CUDA_DEV_MEM_EVENT_OPR_ALLOCATION": 0, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION": 1}
PROFILER_CALL_RE = r"^cu(da)?Profiler(Start|Stop)(_v[0-9]+)?$"
_TEMP = ("_ns_mem", "_ns_mem_diag", "_ns_mem_pid", "_ns_mem_rows")


def _enum_ids(ex: Export, table: str, names: dict[str, int]) -> dict[str, int]:
    """The ids the export's enum table gives these symbol names (the built-in ones where it has none)."""
    ids = dict(names)
    t = ex.table(table)
    if ex.has(t, "id") and ex.has(t, "name"):
        for i, name in ex.rows(f'SELECT id, name FROM "{t}"'):
            if i is not None and text(name) in ids:
                ids[text(name)] = int(i)
    return ids


def emit(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource) -> int:
    """Device allocations and frees of the report → memory_events (origin 'driver'); returns the rows read."""
    table = ex.table(TABLE)
    if table is None:
        return 0
    try:
        return _emit(con, ex, table, sid, info)
    finally:
        for t in _TEMP:
            con.execute(f"DROP TABLE IF EXISTS {t}")


def _emit(con: duckdb.DuckDBPyConnection, ex: Export, table: str, sid: int, info: NsysSource) -> int:
    n = stage(
        con,
        ex,
        "_ns_mem",
        table,
        [
            c("start"),
            c("globalPid"),
            c("deviceId"),
            c("address"),
            c("bytes"),
            c("memKind"),
            c("memoryOperationType"),
            c("correlationId"),
            c("localMemoryPoolAddress"),
            c("localMemoryPoolSize"),
            c("importedMemoryPoolAddress"),
        ],
    )
    if not n:
        return 0
    kinds = _enum_ids(ex, "ENUM_CUDA_MEM_KIND", DEVICE_KINDS)
    ops = _enum_ids(ex, "ENUM_CUDA_DEV_MEM_EVENT_OPER", OPERATIONS)
    dev_kinds = ", ".join(str(kinds[k]) for k in DEVICE_KINDS)
    alloc, free = ops["CUDA_DEV_MEM_EVENT_OPR_ALLOCATION"], ops["CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"]
    diag = ex.table("DIAGNOSTIC_EVENT")
    stage(
        con,
        ex,
        "_ns_mem_diag",
        diag if ex.has(diag, "timestamp") and ex.has(diag, "text") else None,
        [c("timestamp"), c("globalPid"), c("text", typ="s")],
    )
    pid = "((globalPid >> 24) & 16777215)"
    # The rows the store can place: device memory of a known process and GPU, allocated or freed, not from a
    # pool another process exported. The others are counted.
    keep = (
        f"memKind IN ({dev_kinds}) AND memoryOperationType IN ({alloc}, {free}) AND importedMemoryPoolAddress IS NULL"
        " AND start IS NOT NULL AND globalPid IS NOT NULL AND deviceId BETWEEN 0 AND 2147483647 AND bytes >= 0"
    )
    left = con.execute(f"""
        SELECT count(*) FILTER (WHERE memKind IN ({dev_kinds}) AND importedMemoryPoolAddress IS NOT NULL),
               count(*) FILTER (WHERE memKind NOT IN ({dev_kinds}) OR memKind IS NULL),
               coalesce(sum(bytes) FILTER (WHERE memKind NOT IN ({dev_kinds}) OR memKind IS NULL), 0),
               count(*) FILTER (WHERE memKind IN ({dev_kinds}) AND importedMemoryPoolAddress IS NULL AND NOT ({keep}))
        FROM _ns_mem""").fetchone()
    imported, other, other_bytes, bad = (int(v or 0) for v in left) if left else (0, 0, 0, 0)
    # Was every allocation of the process seen? Only when the capture began before the process did (its first
    # diagnostic — "launched by the profiler", "injection initialized" — after "Profiling has started"), it never
    # stopped before the process's last record, the process did not start / stop it (cudaProfilerStart/Stop:
    # a capture range), and no free is of a block the report never saw allocated.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_mem_pid AS
        WITH m AS (SELECT {pid} AS pid, * FROM _ns_mem WHERE {keep}),
        s AS (SELECT min(timestamp) AS started FROM _ns_mem_diag WHERE starts_with(text, 'Profiling has started')),
        p AS (SELECT pid, max(start) AS last, bool_or(localMemoryPoolAddress IS NOT NULL AND localMemoryPoolSize IS NULL)
                         AS pool_unknown FROM m GROUP BY pid),
        d AS (SELECT {pid} AS pid, min(timestamp) AS first FROM _ns_mem_diag WHERE globalPid > 0 GROUP BY 1),
        unseen AS (
            SELECT f.pid, count(*) AS n FROM m f
            WHERE f.memoryOperationType = {free} AND NOT EXISTS (
                SELECT 1 FROM m a WHERE a.pid = f.pid AND a.address = f.address AND a.memoryOperationType = {alloc}
                  AND a.start <= f.start)
            GROUP BY f.pid
        ), prof AS (
            SELECT (x.globalTid >> 24) & 16777215 AS pid, count(*) AS n
            FROM _ns_runtime x JOIN _ns_str s ON s.id = x.nameId
            WHERE regexp_matches(s.value, '{PROFILER_CALL_RE}') GROUP BY 1
        ), stops AS (
            SELECT p.pid, count(g.timestamp) AS n FROM p LEFT JOIN _ns_mem_diag g
              ON starts_with(g.text, 'Profiling has stopped') AND g.timestamp < p.last GROUP BY p.pid
        )
        SELECT p.pid, s.started, d.first, coalesce(u.n, 0) AS unseen_frees, coalesce(prof.n, 0) AS profiler_calls,
               p.pool_unknown, stops.n AS stops,
               s.started IS NOT NULL AND d.first IS NOT NULL AND d.first >= s.started AND coalesce(u.n, 0) = 0
                 AND coalesce(prof.n, 0) = 0 AND NOT p.pool_unknown AND stops.n = 0 AS complete
        FROM p CROSS JOIN s JOIN stops USING (pid) LEFT JOIN d USING (pid) LEFT JOIN unseen u USING (pid)
        LEFT JOIN prof USING (pid)""")
    # Each record's change of the process's device memory on that GPU: its signed size, except that an allocation
    # from (or a free to) a pool changes it by the pool's growth (localMemoryPoolSize after the operation) — the
    # pool holds the memory, the allocation is a piece of it. Ties in time are ordered by the API call's id.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_mem_rows AS
        WITH m AS (SELECT {pid} AS pid, * FROM _ns_mem WHERE {keep}),
        t AS (SELECT (globalTid >> 24) & 16777215 AS pid, correlationId, any_value(globalTid & 16777215) AS thread
              FROM _ns_runtime WHERE correlationId IS NOT NULL GROUP BY ALL)
        SELECT m.pid, m.deviceId AS device, m.start, m.address,
               CASE WHEN m.memoryOperationType = {alloc} THEN m.bytes ELSE -m.bytes END AS delta,
               CASE WHEN m.localMemoryPoolAddress IS NULL
                        THEN CASE WHEN m.memoryOperationType = {alloc} THEN m.bytes ELSE -m.bytes END
                    ELSE m.localMemoryPoolSize - coalesce(lag(m.localMemoryPoolSize) OVER (
                        PARTITION BY m.pid, m.deviceId, m.localMemoryPoolAddress
                        ORDER BY m.start, m.correlationId, m.memoryOperationType), 0) END AS held_delta,
               m.correlationId, m.memoryOperationType AS op, t.thread
        FROM m LEFT JOIN t ON t.pid = m.pid AND t.correlationId = m.correlationId""")
    base = int(info.base_time_ns or 0)
    con.execute(f"""
        INSERT INTO memory_events (source_id, rank, device, pid, thread, ts_ns, bytes_delta, total_allocated,
                                   total_reserved, addr, origin)
        SELECT {sid}, r.rank, m.device, m.pid, m.thread, {base}::BIGINT + m.start, m.delta, NULL,
               CASE WHEN p.complete THEN sum(m.held_delta) OVER (
                   PARTITION BY m.pid, m.device ORDER BY m.start, m.correlationId, m.op
                   ROWS UNBOUNDED PRECEDING) END,
               m.address, 'driver'
        FROM _ns_mem_rows m JOIN _ns_mem_pid p USING (pid) LEFT JOIN _ns_rank r ON r.pid = m.pid""")
    kept = one(con, "SELECT count(*) FROM _ns_mem_rows")
    info.notes += _notes(con, int(kept[0]) if kept else 0, imported, other, other_bytes, bad)
    return n


def _notes(con: duckdb.DuckDBPyConnection, kept: int, imported: int, other: int, other_bytes: int, bad: int) -> list[str]:
    notes = []
    if kept:
        notes.append(
            f"device memory: {kept} CUDA allocation / free records (--cuda-memory-usage) read as the driver sees "
            "them: memory the process holds (a caching allocator's reserved segments), not what its tensors use"
        )
    for pid, started, first, unseen, prof, pool_unknown, stops in con.execute(
        "SELECT pid, started, first, unseen_frees, profiler_calls, pool_unknown, stops FROM _ns_mem_pid "
        "WHERE NOT complete ORDER BY pid"
    ).fetchall():
        why = (
            "the report has no diagnostics saying when the capture began"
            if started is None or first is None
            else "the capture began after the process did (a capture range or a delay)"
            if first < started
            else f"it freed {unseen} blocks the report never saw allocated"
            if unseen
            else "the process started / stopped the capture (cudaProfilerStart / Stop)"
            if prof
            else "the capture stopped before the process's last record"
            if stops
            else "a memory pool's size is missing"
            if pool_unknown
            else "unknown"
        )
        notes.append(
            f"device memory of process {pid}: its allocations before the capture are not in the report ({why}), "
            "so its total device memory is unknown (memory_events.total_reserved NULL); sizes of the records kept"
        )
    if other:
        notes.append(
            f"memory records left out: {other} of module globals, host or managed memory ({other_bytes:,} bytes; "
            "not device allocations)"
        )
    if imported:
        notes.append(f"memory records left out: {imported} from memory pools imported from another process")
    if bad:
        notes.append(f"memory records left out: {bad} without a time, process, device or size")
    return notes
