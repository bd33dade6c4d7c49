"""nsys event tables → the store: GPU activities (kernels, copies, memsets), runtime / driver and OS runtime
calls, synchronisations, NVTX ranges and emit_nvtx ops, NCCL collectives, and the GPU behind each process's CUDA
ordinal. Tables stream into DuckDB staging tables with only the columns used; rows that cannot be placed (no
time, an end before the start, an id of the wrong type) are left out and counted."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa

from ...errors import BadInput
from ...store import in_order, one
from .. import gpus
from . import nccl
from .metadata import NVTX_DOMAIN_CREATE, NVTX_PUSHPOP, NVTX_STARTEND, NsysSource
from .reader import Export, c, stage, text

ID_STRIDE = 10**12  # kernel_id / op_id = source_id * ID_STRIDE + n, as the Kineto parser does
# |UTC ns| beyond this is no time (after 2116 or before 1823): the difference of two times must fit in int64.
TIME_LIMIT_NS = 2**62
NOT_APPLICABLE = 0xFFFFFFFF  # streamId / eventId "not applicable"


# Built-in fallbacks for exports without the ENUM tables (2022.2 has none for these).
COPY_KIND = {
    0: "unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
MEM_KIND = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
# Kineto's words for CUPTI synchronization types, so `syncs.kind` reads the same for both formats.
SYNC_KIND = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

# Names the collective comes from in NCCL kernel names (ncclDevKernel_AllReduce_Sum_bf16_RING_LL …), the
# same fallback the Kineto parser uses, so ranks from both formats pair on (collective, seq).
NCCL_KERNEL_RE = r"(?i)^(void )?(nccl|ncclDevKernel|ncclKernel)"
NCCL_COLLECTIVE_RE = r"(?i)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)"
NCCL_DTYPE_RE = r"_(bf16|f16|f32|f64|f8e4m3|f8e5m2|i8|u8|i32|u32|i64|u64)(_|$|\()"
# emit_nvtx text: `aten::mm, seq = 12, op_id = 345, sizes = [[8192, 8192], [8192, 8192]], input_op_ids = …`.
OP_TEXT_RE = r", op_id = [0-9]+"


def stage_all(con: duckdb.DuckDBPyConnection, ex: Export) -> int:
    """Every event table into DuckDB temp tables, with only the columns the store needs."""
    n = 0
    stage(con, ex, "_ns_str", ex.table("StringIds"), [c("id"), c("value", typ="s")])
    act = [c("start"), c("end"), c("deviceId"), c("contextId"), c("streamId"), c("correlationId"), c("globalPid")]
    n += stage(
        con,
        ex,
        "_ns_kernel",
        ex.table("CUPTI_ACTIVITY_KIND_KERNEL"),
        [
            *act,
            c("demangledName"),
            c("shortName"),
            c("registersPerThread"),
            c("gridX"),
            c("gridY"),
            c("gridZ"),
            c("blockX"),
            c("blockY"),
            c("blockZ"),
            c("staticSharedMemory"),
            c("dynamicSharedMemory"),
        ],
    )
    n += stage(
        con,
        ex,
        "_ns_memcpy",
        ex.table("CUPTI_ACTIVITY_KIND_MEMCPY"),
        [*act, c("bytes"), c("copyKind"), c("srcKind"), c("dstKind")],
    )
    n += stage(con, ex, "_ns_memset", ex.table("CUPTI_ACTIVITY_KIND_MEMSET"), [*act, c("bytes"), c("memKind")])
    n += stage(
        con,
        ex,
        "_ns_runtime",
        ex.table("CUPTI_ACTIVITY_KIND_RUNTIME"),
        [c("start"), c("end"), c("eventClass"), c("globalTid"), c("correlationId"), c("nameId")],
    )
    n += stage(con, ex, "_ns_sync", ex.table("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"), [*act, c("syncType")])
    # OS runtime calls (--trace=osrt): pthread_cond_wait, read, poll, ioctl, … Nested calls (fopen → open) are
    # left out: only the outermost call of each stack, so time is not counted twice.
    osrt = ex.table("OSRT_API")
    n += stage(
        con, ex, "_ns_osrt", osrt, [c("start"), c("end"), c("globalTid"), c("nameId"), c("returnValue"), c("nestingLevel")]
    )
    nvtx = ex.table("NVTX_EVENTS")
    n += stage(
        con,
        ex,
        "_ns_nvtx",
        nvtx,
        [
            c("start"),
            c("end"),
            c("eventType"),
            c("text", typ="s"),
            c("globalTid"),
            c("endGlobalTid"),
            c("textId"),
            c("domainId"),
            c("binaryData", typ="b"),
        ],
        where=f"eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}, {NVTX_DOMAIN_CREATE})" if ex.has(nvtx, "eventType") else None,
    )
    # The overhead records: CUPTI's (lazy function loading, module loading, a full command buffer) and nsys's own
    # (its CUDA profiling initialization, buffer flushes, instrumentation): profiler_overhead, as Kineto's.
    ov = [c("start"), c("end"), c("globalTid"), c("nameId")]
    n += stage(con, ex, "_ns_overhead", ex.table("CUPTI_ACTIVITY_KIND_OVERHEAD"), ov)
    n += stage(con, ex, "_ns_profoverhead", ex.table("PROFILER_OVERHEAD"), ov)
    # globalPid absent (very old exports): the process is then unknown, one process assumed.
    return n


def drop_impossible_times(con: duckdb.DuckDBPyConnection, path: Path, info: NsysSource) -> None:
    """Rows that cannot be placed are left out and counted in the notes: a time that would be no UTC time (int64
    overflow, before 1823 or after 2116), an end before the start, a GPU activity without a start, an end or a
    device (a column missing, text in a number column)."""
    base = int(info.base_time_ns or 0)
    if abs(base) >= TIME_LIMIT_NS:
        raise BadInput(path, f"session start / time shift of {base} ns is no time (utcEpochNs or EXPORT_PARAM_TIME_SHIFT)")
    # anchored to UTC (a session start): no event is before 1970; relative times may be negative (before capture)
    lo = -base if info.clock_anchor == "native" and base > 0 else -TIME_LIMIT_NS - base
    hi = TIME_LIMIT_NS - base
    reasons = {
        "impossible times": " OR ".join(f"NOT coalesce({c} BETWEEN {lo} AND {hi}, true)" for c in ("start", '"end"')),
        "an end before the start": '"end" < start',
        "no start, end or device": 'start IS NULL OR "end" IS NULL OR deviceId IS NULL',
        "a device id beyond int32": "NOT coalesce(deviceId BETWEEN 0 AND 2147483647, true)",
    }
    gpu = ("_ns_kernel", "_ns_memcpy", "_ns_memset")
    host = ("_ns_runtime", "_ns_sync", "_ns_nvtx", "_ns_osrt")
    overhead = ("_ns_overhead", "_ns_profoverhead")  # the profiler's own records: their times reach the store too
    tables_of = {
        "impossible times": gpu + host + overhead,
        "an end before the start": gpu + host,
        "no start, end or device": gpu + ("_ns_sync",),
        "a device id beyond int32": gpu + ("_ns_sync",),
    }
    counts: dict[str, int] = {}
    for reason, cond in reasons.items():
        tables = tables_of[reason]
        for t in tables:
            row = one(con, f"SELECT count(*) FROM {t} WHERE {cond}")
            if row and row[0]:
                counts[reason] = counts.get(reason, 0) + int(row[0])
                con.execute(f"DELETE FROM {t} WHERE {cond}")
    if counts:
        info.notes.append("events left out: " + ", ".join(f"{n} with {r}" for r, n in counts.items()))
    # Descriptive ids out of their type's range (CUPTI's are 32-bit) are unknown, not errors.
    for t, cols in (
        (
            "_ns_kernel",
            (
                *("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "correlationId"),
                *("staticSharedMemory", "dynamicSharedMemory"),  # (summed: beyond 32 bits the sum could overflow)
            ),
        ),
        ("_ns_memcpy", ("correlationId",)),
        ("_ns_memset", ("correlationId",)),
        ("_ns_sync", ("correlationId",)),
        ("_ns_runtime", ("correlationId",)),
    ):
        sets = ", ".join(
            f'"{c}" = CASE WHEN "{c}" BETWEEN 0 AND {4294967295 if c == "correlationId" else 2147483647} THEN "{c}" END'
            for c in cols
        )
        con.execute(f"UPDATE {t} SET {sets}")


def build_enums(con: duckdb.DuckDBPyConnection, ex: Export) -> None:
    """copyKind / memory-kind words: the export's ENUM tables when present, the built-in maps otherwise."""

    def table_of(enum: str, fallback: dict[int, str], rename: bool) -> pa.Table:
        words = dict(fallback)
        t = ex.table(enum)
        if ex.has(t, "id") and ex.has(t, "name"):
            for i, name in ex.rows(f'SELECT id, name FROM "{t}"'):
                w = _enum_word(text(name), rename) if rename else None
                if i is not None and w:
                    words[int(i)] = w
        if ex.has(t, "id") and ex.has(t, "label") and not rename:
            for i, label in ex.rows(f'SELECT id, label FROM "{t}"'):
                if i is not None and label:
                    words[int(i)] = text(label)
        return pa.table({"id": pa.array(list(words), pa.int64()), "word": pa.array(list(words.values()), pa.string())})

    for name, enum, fallback, rename in (
        ("_ns_copykind", "ENUM_CUDA_MEMCPY_OPER", COPY_KIND, True),
        ("_ns_memkind", "ENUM_CUDA_MEM_KIND", MEM_KIND, False),
    ):
        con.register("_ns_enum_in", table_of(enum, fallback, rename))
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM _ns_enum_in")
        con.unregister("_ns_enum_in")


def _enum_word(name: str, rename: bool) -> str | None:
    """CUDA_MEMCPY_KIND_HTOD → HtoD, CUDA_MEMCPY_KIND_UVM_DTOH → UVM DtoH (the words Kineto uses)."""
    m = re.fullmatch(r"CUDA_MEMCPY_KIND_(UVM_)?([A-Z])TO([A-Z])", name)
    if m:
        return ("UVM " if m.group(1) else "") + f"{m.group(2)}to{m.group(3)}"
    return "unknown" if name.endswith("UNKNOWN") else None


def emit(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource) -> None:
    """Every event table into the store (the GPUs first: `emit_activities` then `emit_rest`)."""
    emit_rest(con, ex, sid, info, emit_activities(con, ex, sid, info))


def emit_activities(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource) -> list[str]:
    """The GPU activities staged as one table (`_ns_gpuacts`) and the GPUs behind them (`devices`, `_ns_devmap`):
    what the GPU metrics need, so that they can go in while `emit_rest` writes the other tables. Returns the
    devices' notes, which `emit_rest` adds after its own (the order the notes have always had)."""
    notes: list[str] = []
    # One row per GPU activity; names: demangled kernel names (as Kineto), Kineto-style memcpy/memset names.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_gpuacts AS
        SELECT k.start, k."end", k.deviceId, k.contextId, k.streamId, k.correlationId, k.globalPid,
               coalesce(d.value, s.value, '(kernel name ' || coalesce(k.demangledName, k.shortName)::VARCHAR
                        || ' missing from StringIds)', '(kernel without a name)') AS name,
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
    nameless = one(
        con,
        """SELECT count(*) FROM _ns_kernel k LEFT JOIN _ns_str d ON d.id = k.demangledName
                           LEFT JOIN _ns_str s ON s.id = k.shortName WHERE d.value IS NULL AND s.value IS NULL""",
    )
    if nameless and nameless[0]:
        info.notes.append(f"{nameless[0]} kernels have no name in StringIds (kept, named by their string id)")
    emit_devices(con, ex, sid, notes)
    return notes


def emit_rest(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, info: NsysSource, device_notes: list[str]) -> None:
    """After `emit_activities`: kernels, runtime / driver / OS runtime calls, syncs, NVTX ranges and ops, collectives
    and their NCCL payloads; then the devices' notes."""
    base = int(info.base_time_ns or 0)
    pid = "((y.globalPid >> 24) & 16777215)"
    tpid = "((x.globalTid >> 24) & 16777215)"
    tid = "(x.globalTid & 16777215)"
    stride = f"{sid}::BIGINT * {ID_STRIDE}"
    # kernel ids in (start, end, stream, correlation, the export's order) (store.in_order)
    kernels = in_order(
        "SELECT a.*, r.rank AS _rank FROM _ns_gpuacts a LEFT JOIN _ns_rank r ON r.pid = (a.globalPid >> 24) & 16777215 "
        'WHERE a.start IS NOT NULL AND a."end" IS NOT NULL',
        'a.start, a."end", a.streamId, a.correlationId, a.rowid',
    )
    con.execute(f"""
        INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, raw_start, name, kind,
                             correlation, grid_x, grid_y, grid_z, block_x, block_y, block_z, regs, smem,
                             copy_kind, bytes)
        SELECT _n + {stride},
               {sid}, _rank, deviceId, streamId, {base}::BIGINT + start, {base}::BIGINT + "end",
               start::DOUBLE, name, kind, correlationId, gridX, gridY, gridZ, blockX, blockY, blockZ,
               regs, smem, copy_kind, bytes
        FROM ({kernels})""")
    con.execute(f"""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind, correlation)
        SELECT {sid}, r.rank, {tpid}, {tid}, {base}::BIGINT + x.start, {base}::BIGINT + x."end",
               regexp_replace(coalesce(s.value, 'unknown'), '_v[0-9]+$', ''),
               CASE x.eventClass WHEN 1 THEN 'driver' ELSE 'runtime' END, x.correlationId
        FROM _ns_runtime x LEFT JOIN _ns_str s ON s.id = x.nameId LEFT JOIN _ns_rank r ON r.pid = {tpid}
        WHERE x.start IS NOT NULL
        -- one call recorded twice (some exports write each runtime call under two event classes, 0 and 67: the
        -- same thread and correlation, one name with its `_v3020` suffix and one without, one interval around the
        -- other): one row, the lowest class's (a driver call inside a runtime call has another name: kept)
        QUALIFY x.correlationId IS NULL
             OR row_number() OVER (PARTITION BY x.globalTid, x.correlationId,
                                   regexp_replace(coalesce(s.value, 'unknown'), '_v[0-9]+$', '')
                                   ORDER BY x.eventClass, x.start) = 1""")
    con.execute(f"""
        INSERT INTO profiler_overhead (source_id, rank, name, start_ns, end_ns)
        SELECT {sid}, r.rank, coalesce(s.value, 'unknown'), {base}::BIGINT + x.start, {base}::BIGINT + x."end"
        FROM (SELECT * FROM _ns_overhead UNION ALL SELECT * FROM _ns_profoverhead) x
        LEFT JOIN _ns_str s ON s.id = x.nameId LEFT JOIN _ns_rank r ON r.pid = {tpid}
        WHERE x.start IS NOT NULL AND x."end" > x.start""")
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
    emit_nvtx(con, sid, base, info)
    emit_collectives(con, sid)
    nccl.emit_payloads(con, ex, sid, base, info)
    info.notes += device_notes


def emit_nvtx(con: duckdb.DuckDBPyConnection, sid: int, base: int, info: NsysSource) -> None:
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
    unfinished = one(
        con,
        f"""SELECT count(*) FROM _ns_nvtx WHERE eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND})
                              AND "end" IS NULL""",
    )
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
    # The name is the text before the first `, seq = N` / `, op_id = N` (every row here has one; a name with a
    # newline there is none, as `.` reads it) and `sizes` the match after its 10-character label: whole matches,
    # which RE2 finds without its slower capture engine.
    # op ids in (start, longer first, thread, the export's order) (store.in_order)
    ops = in_order(
        "SELECT n.*, r.rank AS _rank FROM _ns_nvtx_r n LEFT JOIN _ns_rank r ON r.pid = n.pid "
        f"WHERE n.domainId = 0 AND n.name IS NOT NULL AND regexp_matches(n.name, '{OP_TEXT_RE}')",
        'n.start, n."end" DESC, n.tid, n.rowid',
    )
    con.execute(f"""
        INSERT INTO ops (source_id, rank, pid, thread, start_ns, end_ns, raw_start, name, op_id, seq, input_dims)
        SELECT {sid}, _rank, pid, tid, {base}::BIGINT + start, {base}::BIGINT + "end", start::DOUBLE,
               CASE WHEN contains(name, chr(10)) THEN regexp_extract(name, '^(.*?), (?:seq|op_id) = [0-9]', 1)
                    ELSE regexp_split_to_array(name, ', (?:seq|op_id) = [0-9]')[1] END,
               _n + {sid}::BIGINT * {ID_STRIDE},
               TRY_CAST(nullif(regexp_extract(name, ', seq = ([0-9]+)', 1), '') AS BIGINT),
               nullif(substr(regexp_extract(name, ', sizes = \\[[\\[\\]0-9, -]*\\]', 0), 11), '')
        FROM ({ops})""")
    con.execute("DROP TABLE _ns_nvtx_r")


def emit_collectives(con: duckdb.DuckDBPyConnection, sid: int) -> None:
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


def emit_devices(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, notes: list[str]) -> None:
    """`devices`: per GPU process and CUDA ordinal (kernels.device), the physical GPU behind it:
    TARGET_INFO_CUDA_DEVICE(pid, cudaId → gpuId), else TARGET_INFO_GPU.cuDevice = the ordinal. Notes go to
    `notes`."""
    gpu = ex.table("TARGET_INFO_GPU")
    gcols = [
        c("id"),
        c("name", typ="s"),
        c("busLocation", typ="s"),
        c("uuid", typ="s"),
        c("smCount"),
        c("totalMemory"),
        c("computeMajor"),
        c("computeMinor"),
        c("cuDevice"),
        c("vmId"),
    ]
    stage(con, ex, "_ns_gpu", gpu if ex.has(gpu, "id") else None, gcols)
    cdev = ex.table("TARGET_INFO_CUDA_DEVICE")
    stage(
        con,
        ex,
        "_ns_cudadev",
        cdev if ex.has(cdev, "cudaId") else None,
        [c("gpuId"), c("cudaId"), c("pid"), c("uuid", typ="s"), c("numMultiprocessors")],
    )
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
        ), host AS (
            SELECT count(*) AS n, count(DISTINCT name) AS names, min(id) AS first_id FROM _ns_gpu
        ), mapped AS (
            SELECT b.pid, r.rank, b.device,
                   coalesce(b.gpu_id, CASE WHEN cu.n = 1 THEN cu.gpu_id END,
                            CASE WHEN h.n = 1 THEN h.first_id END) AS gpu_id,  -- (else: the host's one GPU)
                   b.cuda_uuid, b.sms, h.names, h.first_id
            FROM byproc b LEFT JOIN bycu cu ON cu.cuDevice = b.device LEFT JOIN _ns_rank r ON r.pid = b.pid, host h
        )
        -- No map to the physical GPU (older exports: no TARGET_INFO_CUDA_DEVICE, cuDevice empty or shared): the
        -- model alone, from any of the host's GPUs when they are all one model, else from the GPU whose id is the
        -- activities' deviceId, the join nsys's own reports make (cuda_gpu_trace: TARGET_INFO_GPU.id = deviceId).
        SELECT m.pid, m.rank, m.device, m.gpu_id, m.cuda_uuid, m.sms,
               coalesce(m.gpu_id, CASE WHEN m.names = 1 THEN m.first_id END, g.id) AS model_id,
               m.gpu_id IS NULL AND m.names > 1 AND g.id IS NOT NULL AS model_by_id
        FROM mapped m LEFT JOIN _ns_gpu g ON g.id = m.device""")
    con.execute(f"""
        INSERT INTO devices (source_id, rank, device, gpu_uuid, bus_id, name, sm_count, memory_bytes,
                             compute_capability, vendor)
        SELECT {sid}, m.rank, m.device,
               CASE WHEN coalesce(g.uuid, m.cuda_uuid, '') = '' THEN NULL
                    WHEN starts_with(lower(coalesce(nullif(g.uuid, ''), m.cuda_uuid)), 'gpu-')
                        THEN coalesce(nullif(g.uuid, ''), m.cuda_uuid)
                    ELSE 'GPU-' || coalesce(nullif(g.uuid, ''), m.cuda_uuid) END,
               nullif(g.busLocation, ''), mg.name, coalesce(mg.smCount, m.sms), mg.totalMemory,
               CASE WHEN mg.computeMajor IS NOT NULL THEN mg.computeMajor || '.' || coalesce(mg.computeMinor, 0) END,
               CASE WHEN mg.name LIKE '%NVIDIA%' OR mg.name IS NULL THEN 'NVIDIA' END
        FROM _ns_devmap m LEFT JOIN _ns_gpu g ON g.id = m.gpu_id LEFT JOIN _ns_gpu mg ON mg.id = m.model_id
        ORDER BY m.rank, m.device""")
    notes += gpus.name_devices(con, sid)
    missing = one(con, "SELECT count(*) FROM _ns_devmap WHERE model_id IS NULL")
    if missing and missing[0]:
        notes.append("GPU model not in the export (no TARGET_INFO_GPU row for the device): give --gpu")
    by_id = con.execute("SELECT DISTINCT device FROM _ns_devmap WHERE model_by_id ORDER BY 1").fetchall()
    if by_id:
        notes.append(
            f"GPU model of device {', '.join(str(d) for (d,) in by_id)} read from TARGET_INFO_GPU.id = the activities' "
            "deviceId, as nsys's own reports do (the export maps no CUDA device to its GPU, and the host's GPUs are of "
            "several models: under CUDA_VISIBLE_DEVICES this may name another; give --gpu if so)"
        )
    con.execute("DROP TABLE IF EXISTS _ns_cudadev")
