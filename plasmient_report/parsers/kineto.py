"""PyTorch profiler (Kineto) Chrome-trace JSON → the store's tables.

Columnar and lean, in bounded memory: a streaming scanner cuts `traceEvents` into batches of whole
events as NDJSON; DuckDB's JSON reader decodes only the fields we use straight into columns; SQL types
them (leniently: traces disagree on types), converts times and splits events into the store's tables.
The small rest of the document (device properties, distributedInfo, the time base) is decoded by msgspec.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from ..errors import BadInput
from ..store import one
from ._io import GuardedReader
from ._jsonsplit import SplitError, split_events
from .base import SourceInfo

NCCL_OP_RE = "(?i)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)"
# Events are staged as NDJSON in temporary files and read by DuckDB this many bytes at a time.
SEGMENT_BYTES = 24 << 20
# Kineto `ts` is µs; above this it is already epoch µs (traces before baseTimeNanoseconds existed).
EPOCH_US_THRESHOLD = 1e14
# |ts| beyond this (µs) cannot be a time: |UTC ns| must stay below 2**62 so that differences of times fit in int64.
MAX_ABS_TS_US = 4.6e15
MAX_RANKS = 1 << 20  # a rank or world size beyond this is no rank (a corrupt distributedInfo)


class DeviceProp(msgspec.Struct):
    id: int | None = None
    name: str | None = None
    totalGlobalMem: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    numSms: int | None = None


class PgConfig(msgspec.Struct):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | None = None


class DistributedInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None
    pg_config: list[PgConfig] | None = None
    nccl_version: str | None = None


class TraceHead(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None
    deviceProperties: list[DeviceProp] | None = None
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: int | None = None
    cuda_runtime_version: int | None = None
    host_name: str | None = None
    # Kineto's own log lines (torch >= 2.4), kept raw: only read for what the profiler says it lost.
    INFO: msgspec.Raw = msgspec.Raw()
    WARNING: msgspec.Raw = msgspec.Raw()
    ERROR: msgspec.Raw = msgspec.Raw()


_HEAD = msgspec.json.Decoder(TraceHead)
_LIST = msgspec.json.Decoder(list[msgspec.Raw])

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"}
CPU_CATS = {"cpu_op", "user_annotation", "python_function"}
API_CATS = {"cuda_runtime", "cuda_driver"}


@dataclass
class KinetoSource(SourceInfo):
    """What a Kineto file says about itself, for the `sources` and `devices` rows."""

    devices: list[DeviceProp] = field(default_factory=list)


def looks_like_kineto(head: bytes) -> bool:
    """Content sniffing on the first KiB of (decompressed) text."""
    h = head.lstrip()
    return (h.startswith(b"{") and b"traceEvents" in head) or (h.startswith(b"[") and b'"ph"' in head)


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def rank_from_filename(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _decode_head(path: Path, buf: bytes) -> TraceHead:
    try:
        stripped = buf[:64].lstrip()
        if stripped.startswith(b"["):
            return TraceHead(traceEvents=_LIST.decode(buf))
        head = _HEAD.decode(buf)
    except msgspec.ValidationError as e:
        raise BadInput(path, f"not a PyTorch profiler trace ({e})") from None
    except msgspec.DecodeError as e:
        msg = str(e)
        if "truncated" in msg.lower():
            raise BadInput(path, "truncated JSON (the file ends inside the trace)") from None
        if "utf-8" in msg.lower():
            raise BadInput(path, f"invalid UTF-8 in JSON ({msg})") from None
        raise BadInput(path, f"malformed JSON ({msg})") from None
    if head.traceEvents is None:
        raise BadInput(path, "JSON has no 'traceEvents' array: not a PyTorch profiler / Chrome trace")
    return head


_STAGE = {"gpu": "_kin_gpu", "cpu": "_kin_cpu", "api": "_kin_api"}

# The args read from each event (all as raw JSON, typed in SQL with TRY_CAST: traces disagree on types).
ARG_KEYS = ("External id", "correlation", "device", "stream", "grid", "block", "registers per thread",
            "shared memory", "bytes", "flops", "Input Dims", "Input type", "Concrete Inputs", "Sequence number",
            "Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
            "Process Group Description", "Process Group Ranks", "Process Group ID", "cuda_sync_kind", "cbid",
            "name", "labels")
_ARGS_TYPE = "STRUCT(" + ", ".join(f'"{k}" JSON' for k in ARG_KEYS) + ")"
_RAW_COLUMNS = {"ph": "JSON", "cat": "JSON", "name": "JSON", "pid": "JSON", "tid": "JSON", "ts": "JSON",
                "dur": "JSON", "args": _ARGS_TYPE}


def _read_json_sql(path: Path) -> str:
    cols = ", ".join(f"'{k}': '{v}'" for k, v in _RAW_COLUMNS.items())
    p = str(path).replace("'", "''")
    return (f"SELECT * FROM read_json('{p}', columns = {{{cols}}}, format = 'newline_delimited', "
            f"maximum_object_size = 16777216)")


def ingest(path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> KinetoSource:
    """Decode one Kineto file into the store, streaming: the splitter cuts `traceEvents` into batches of
    whole events as NDJSON segments, which DuckDB's JSON reader decodes straight into columns (no Python
    object per event) on a second thread while the next segment is cut. Memory is bounded by the segment,
    not the file. Rank may be None (decided by the caller)."""
    head_bytes = b"{}"
    cols = ", ".join(f'"{k}" {v}' for k, v in _RAW_COLUMNS.items())
    # The staging tables, typed by their SELECTs over an empty raw table; plain tables (not TEMP): the loader
    # thread's cursor is another connection to the same database.
    con.execute(f"CREATE OR REPLACE TEMP TABLE _kin_raw0 ({cols})")
    for table, sql in _stage_selects("_kin_raw0").items():
        con.execute(f"CREATE OR REPLACE TABLE {table} AS {sql}")
    con.execute("DROP TABLE _kin_raw0")
    selects = _stage_selects("_kin_seg")
    tmp = Path(tempfile.mkdtemp(prefix="plasmient-kineto-"))
    loader = con.cursor()
    pool = ThreadPoolExecutor(max_workers=1)
    pending: Future[None] | None = None
    n_events = 0

    def load(seg_file: Path) -> None:
        # One segment: its raw JSON columns live only until its events are typed into the staging tables,
        # so the store never holds the raw trace.
        nonlocal n_events
        try:
            loader.execute(f"CREATE OR REPLACE TEMP TABLE _kin_seg AS {_read_json_sql(seg_file)}")
            for table, sql in selects.items():
                loader.execute(f"INSERT INTO {table} {sql}")
            row = one(loader, "SELECT count(*) FROM _kin_seg")
            n_events += int(row[0]) if row else 0
            loader.execute("DROP TABLE _kin_seg")
        finally:
            seg_file.unlink(missing_ok=True)

    def wait() -> None:
        nonlocal pending
        if pending is not None:
            try:
                pending.result()
            except duckdb.Error as e:
                raise BadInput(path, f"bad event in traceEvents ({_duck_msg(e)})") from None
            finally:
                pending = None

    n_seg = 0
    seg_file = tmp / f"events-{n_seg}.ndjson"
    seg = open(seg_file, "wb")  # noqa: SIM115 - closed below, one file per segment
    try:
        with GuardedReader(path) as stream:
            for batch in split_events(stream, ndjson=True):
                if isinstance(batch, tuple):
                    head_bytes = batch[1]
                    continue
                seg.write(batch)
                seg.write(b"\n")
                if seg.tell() >= SEGMENT_BYTES:
                    seg.close()
                    wait()  # at most one segment loading while the next is cut
                    pending = pool.submit(load, seg_file)
                    n_seg += 1
                    seg_file = tmp / f"events-{n_seg}.ndjson"
                    seg = open(seg_file, "wb")  # noqa: SIM115
            seg.close()
            wait()
            if seg_file.stat().st_size:
                pending = pool.submit(load, seg_file)
                wait()
    except SplitError as e:
        raise BadInput(path, f"{e}: not a PyTorch profiler trace" if "truncated" not in str(e) else str(e)) from None
    finally:
        seg.close()
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):  # already failing; the first error is the one reported
                pending.result()
        pool.shutdown(wait=True)
        loader.close()
        shutil.rmtree(tmp, ignore_errors=True)
    head = _decode_head(path, head_bytes)
    meta = {(pid, tid, k): v for pid, tid, k, v in con.execute(
        "SELECT pid, tid, name, value FROM _kin_meta").fetchall()}
    info = _describe(path, head, n_events, meta)
    _check_times(path, con, info)
    _emit(con, source_id, info)
    for stage in (*_STAGE.values(), "_kin_meta"):
        con.execute(f"DROP TABLE IF EXISTS {stage}")
    return info


def _duck_msg(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:300]


def _i(x: str) -> str:
    return f"TRY_CAST({x} AS BIGINT)"


def _d(x: str) -> str:
    return f"TRY_CAST({x} AS DOUBLE)"


def _s(x: str) -> str:
    """A JSON string as text; numbers as their text too (process group names are sometimes ints)."""
    return (f"CASE json_type({x}) WHEN 'VARCHAR' THEN json_extract_string({x}, '$') "
            f"WHEN 'BIGINT' THEN CAST({x} AS VARCHAR) WHEN 'UBIGINT' THEN CAST({x} AS VARCHAR) END")


def _stage_selects(src: str) -> dict[str, str]:
    """The typed staging tables per event family (and the metadata events), as SELECTs over a table `src` of
    raw JSON columns (one segment of events)."""
    a = "args"
    common = f"""json_extract_string(cat, '$') AS cat, json_extract_string(name, '$') AS name,
                 {_i('pid')} AS pid, {_i('tid')} AS tid, {_d('ts')} AS ts, {_d('dur')} AS dur,
                 {_i(a + '."External id"')} AS external_id"""
    comms = f"""{_s(a + '."Collective name"')} AS collective, {_s(a + '.dtype')} AS dtype,
                {_i(a + '."In msg nelems"')} AS in_nelems, {_i(a + '."Out msg nelems"')} AS out_nelems,
                TRY_CAST({_i(a + '."Group size"')} AS INTEGER) AS group_size,
                coalesce({_s(a + '."Process Group Name"')}, {_s(a + '."Process Group ID"')}) AS pg_name,
                {_s(a + '."Process Group Description"')} AS pg_desc,
                CASE json_type({a}."Process Group Ranks") WHEN 'VARCHAR'
                     THEN json_extract_string({a}."Process Group Ranks", '$')
                     WHEN 'ARRAY' THEN '[' || array_to_string(TRY_CAST({a}."Process Group Ranks" AS BIGINT[]), ', ')
                                       || ']' END AS pg_ranks"""
    x = "json_extract_string(ph, '$') = 'X'"
    cats = lambda names: "json_extract_string(cat, '$') IN (" + ", ".join(f"'{n}'" for n in names) + ")"  # noqa: E731
    return {
        "_kin_gpu": f"""
        SELECT {common}, {_i(a + '.correlation')} AS correlation, TRY_CAST({_i(a + '.device')} AS INTEGER) AS device,
               {_i(a + '.stream')} AS stream,
               TRY_CAST({_i(a + ".grid->'$[0]'")} AS INTEGER) AS grid_x,
               TRY_CAST({_i(a + ".grid->'$[1]'")} AS INTEGER) AS grid_y,
               TRY_CAST({_i(a + ".grid->'$[2]'")} AS INTEGER) AS grid_z,
               TRY_CAST({_i(a + ".block->'$[0]'")} AS INTEGER) AS block_x,
               TRY_CAST({_i(a + ".block->'$[1]'")} AS INTEGER) AS block_y,
               TRY_CAST({_i(a + ".block->'$[2]'")} AS INTEGER) AS block_z,
               TRY_CAST({_i(a + '."registers per thread"')} AS INTEGER) AS regs,
               {_i(a + '."shared memory"')} AS smem, {_d(a + '.bytes')} AS bytes, {comms},
               {_s(a + '.cuda_sync_kind')} AS sync_kind
        FROM {src} WHERE {x} AND {cats(GPU_CATS)}""",
        "_kin_cpu": f"""
        SELECT {common}, {_i(a + '."Sequence number"')} AS seq, {_d(a + '.flops')} AS flops,
               CAST({a}."Input Dims" AS VARCHAR) AS input_dims, CAST({a}."Input type" AS VARCHAR) AS input_types,
               CAST({a}."Concrete Inputs" AS VARCHAR) AS concrete, {comms}
        FROM {src} WHERE {x} AND {cats(CPU_CATS)}""",
        "_kin_api": f"""
        SELECT {common}, {_i(a + '.correlation')} AS correlation, TRY_CAST({_i(a + '.cbid')} AS INTEGER) AS cbid
        FROM {src} WHERE {x} AND {cats(API_CATS)}""",
        "_kin_meta": f"""
        SELECT json_extract_string(pid, '$') AS pid, json_extract_string(tid, '$') AS tid,
               json_extract_string(name, '$') AS name, json_extract_string(coalesce(args.name, args.labels), '$') AS value
        FROM {src} WHERE json_extract_string(ph, '$') = 'M'
          AND json_extract_string(name, '$') IN ('process_name', 'thread_name', 'process_labels')""",
    }


def _describe(path: Path, head: TraceHead, n_events: int, meta: dict[Any, str]) -> KinetoSource:
    di = head.distributedInfo
    rank, method = None, "order"
    if di is not None and di.rank is not None and 0 <= di.rank < MAX_RANKS:
        rank, method = di.rank, "distributedInfo"
    elif (r := rank_from_filename(path)) is not None and r < MAX_RANKS:
        rank, method = r, "filename"
    base = head.baseTimeNanoseconds
    version = f"kineto schema {head.schemaVersion}" if head.schemaVersion is not None else "chrome trace"
    if base is None:
        version += " (no baseTimeNanoseconds)"
    host = head.host_name
    notes = []
    rocm = any((v or "").startswith("hip") for (_, _, k), v in meta.items() if k == "thread_name") or any(
        (d.name or "").startswith("AMD") for d in head.deviceProperties or [])
    if rocm:
        notes.append("ROCm trace")
    incomplete, dropped = _profiler_losses(head)
    return KinetoSource(incomplete=incomplete, dropped_events=dropped,
        format="kineto", format_version=version, rank=rank, rank_method=method,
        world_size=di.world_size if di is not None and di.world_size and 0 < di.world_size <= MAX_RANKS else None,
        base_time_ns=base, clock_anchor="native" if base is not None else "epoch_us", events=n_events,
        host=host, devices=list(head.deviceProperties or []), notes=notes)


_STOPPED_EARLY = re.compile(r"CUPTI stopped early\?\s*=\s*[1-9]")
_DROPPED = re.compile(r"(?i)(\d+)\s+(?:dropped|lost)\s+(?:activity\s+)?(?:records?|events?)"
                      r"|(\d+)\s+(?:activity\s+)?(?:records?|events?)\s+(?:were\s+)?(?:dropped|lost)"
                      r"|dropped(?:\s+records?)?\s*[=:]\s*(\d+)")


def _profiler_losses(head: TraceHead) -> tuple[list[str], int | None]:
    """What Kineto's log in the trace (INFO / WARNING / ERROR) says was lost: CUPTI stopping early when its
    activity buffer filled up, dropped records."""
    lines: list[str] = []
    for raw in (head.INFO, head.WARNING, head.ERROR):
        if not raw:
            continue
        try:
            v = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            continue
        lines += [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str)]
    out: list[str] = []
    dropped: int | None = None
    for line in lines:
        if _STOPPED_EARLY.search(line):
            out.append("CUPTI stopped early (its activity buffer filled up): GPU events after that point are missing")
        if m := _DROPPED.search(line):
            n = int(next(g for g in m.groups() if g))
            dropped = (dropped or 0) + n
            out.append(f"{n} CUPTI records dropped (activity buffer overflow)")
    return list(dict.fromkeys(out)), dropped


def _ns_expr(col: str, base: int) -> str:
    # base + floor(ts)·1000 + round(frac·1000): exact to the ns for µs floats with 3 decimals.
    return (f"({base}::BIGINT + CAST(floor({col}) AS BIGINT) * 1000 "
            f"+ CAST(round(({col} - floor({col})) * 1000) AS BIGINT))")


def _check_times(path: Path, con: duckdb.DuckDBPyConnection, info: KinetoSource) -> None:
    parts = " UNION ALL ".join(f"SELECT ts, dur FROM {s}" for s in _STAGE.values())
    row = one(con, f"""
        SELECT count(*), min(ts), max(ts), max(dur), min(dur),
               count(*) FILTER (WHERE NOT isfinite(ts) OR (dur IS NOT NULL AND NOT isfinite(dur))),
               count(*) FILTER (WHERE ts IS NULL)
        FROM ({parts})""")
    assert row is not None
    n, tmin, tmax, dmax, dmin, nonfinite, nots = row
    if n == 0:
        return
    if nonfinite or nots:
        raise BadInput(path, f"{nonfinite + nots} events have a missing, NaN or infinite 'ts'/'dur'")
    if max(abs(tmin), abs(tmax)) > MAX_ABS_TS_US or (dmax is not None and dmax > MAX_ABS_TS_US):
        raise BadInput(path, f"timestamp out of range (ts up to {max(abs(tmin), abs(tmax)):.4g} µs would overflow int64 ns)")
    if dmin is not None and dmin < 0:
        raise BadInput(path, f"an event has a negative duration ({dmin} µs)")
    if info.base_time_ns is None:
        if tmin > EPOCH_US_THRESHOLD:
            info.base_time_ns = 0
            info.clock_anchor = "epoch_us"
        else:
            info.base_time_ns = 0
            info.clock_anchor = "relative"
            info.notes.append("no baseTimeNanoseconds and ts is not epoch µs: times are relative, not UTC")
    elif not -(2**62) < info.base_time_ns + tmin * 1000 <= info.base_time_ns + (tmax + (dmax or 0)) * 1000 < 2**62:
        raise BadInput(path, f"baseTimeNanoseconds {info.base_time_ns} + ts is no time (int64 ns overflow)")


def _emit(con: duckdb.DuckDBPyConnection, sid: int, info: KinetoSource) -> None:
    base = info.base_time_ns or 0
    start = _ns_expr("ts", base)
    end = _ns_expr("ts + coalesce(dur, 0)", base)
    rank = "NULL::INTEGER" if info.rank is None else str(int(info.rank))
    # GPU device: Kineto puts the device index in pid for GPU rows; args.device where present.
    dev = "TRY_CAST(coalesce(device, pid) AS INTEGER)"
    kind = """CASE WHEN cat = 'gpu_memcpy' THEN 'memcpy' WHEN cat = 'gpu_memset' THEN 'memset'
                   WHEN regexp_matches(name, '(?i)^(void )?(nccl|rccl|ncclDevKernel|ncclKernel)') THEN 'nccl'
                   ELSE 'compute' END"""
    con.execute(f"""
        INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, raw_start, name, kind,
                             correlation, external_id, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                             regs, smem, copy_kind, bytes)
        SELECT row_number() OVER (ORDER BY ts) + {sid}::BIGINT * 1000000000000,
               {sid}, {rank}, {dev}, coalesce(stream, tid), {start}, {end}, ts, name, {kind},
               correlation, external_id, grid_x, grid_y, grid_z, block_x, block_y, block_z, regs, smem,
               CASE WHEN cat = 'gpu_memcpy' THEN coalesce(regexp_extract(name, 'Memcpy (\\w+)', 1), 'unknown') END,
               bytes
        FROM _kin_gpu WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND name IS NOT NULL""")
    con.execute(f"""
        INSERT INTO syncs (source_id, rank, device, stream, start_ns, end_ns, kind, correlation)
        SELECT {sid}, {rank}, {dev}, coalesce(stream, tid), {start}, {end}, coalesce(sync_kind, name), correlation
        FROM _kin_gpu WHERE cat = 'cuda_sync'""")
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rank}, pid, tid, {dev}, 'gpu_user_annotation', name, {start}, {end}, true, external_id
        FROM _kin_gpu WHERE cat = 'gpu_user_annotation' AND name IS NOT NULL""")
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rank}, pid, tid, NULL, 'user_annotation', name, {start}, {end}, false, external_id
        FROM _kin_cpu WHERE cat = 'user_annotation' AND name IS NOT NULL""")
    # Python frames (with_stack=True): ranges of domain 'python' on their thread, for the Python site of a
    # host sync; never analysis windows (metrics.build_windows leaves them out).
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rank}, pid, tid, NULL, 'python', name, {start}, {end}, false, NULL
        FROM _kin_cpu WHERE cat = 'python_function' AND name IS NOT NULL""")
    # ProfilerStep#N is a cpu_op in some torch versions and a user_annotation in others: keep it a range.
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rank}, pid, tid, NULL, 'user_annotation', name, {start}, {end}, false, external_id
        FROM _kin_cpu WHERE cat = 'cpu_op' AND name LIKE 'ProfilerStep#%'""")
    con.execute(f"""
        INSERT INTO ops (source_id, rank, pid, thread, start_ns, end_ns, raw_start, name, op_id, external_id, seq,
                         input_dims, input_types, concrete_inputs, flops, flops_source)
        SELECT {sid}, {rank}, pid, tid, {start}, {end}, ts, name,
               row_number() OVER (ORDER BY ts, dur DESC) + {sid}::BIGINT * 1000000000000, external_id, seq,
               input_dims, input_types, concrete, flops, CASE WHEN flops IS NOT NULL THEN 'op' END
        FROM _kin_cpu WHERE cat = 'cpu_op' AND name IS NOT NULL""")
    con.execute(f"""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind, correlation, external_id, cbid)
        SELECT {sid}, {rank}, pid, tid, {start}, {end}, name,
               CASE cat WHEN 'cuda_driver' THEN 'driver' ELSE 'runtime' END, correlation, external_id, cbid
        FROM _kin_api WHERE name IS NOT NULL""")
    # NCCL: one row per collective kernel (torch >= 2.3 puts the metadata on the kernel itself); older
    # traces carry it only on the CPU-side record_param_comms op, joined through External id.
    con.execute(f"""
        INSERT INTO collectives (source_id, rank, device, stream, kernel_correlation, start_ns, end_ns, collective,
                                 process_group, process_group_desc, group_ranks, group_size, seq, in_nelems,
                                 out_nelems, dtype, bytes)
        WITH k AS (
            SELECT * FROM _kin_gpu
            WHERE cat = 'kernel' AND regexp_matches(name, '(?i)^(void )?(nccl|rccl)')
        ), comms AS (
            SELECT external_id, any_value(collective) AS collective, any_value(pg_name) AS pg_name,
                   any_value(pg_desc) AS pg_desc, any_value(pg_ranks) AS pg_ranks, any_value(group_size) AS group_size,
                   any_value(in_nelems) AS in_nelems, any_value(out_nelems) AS out_nelems, any_value(dtype) AS dtype
            FROM _kin_cpu WHERE name = 'record_param_comms' AND external_id IS NOT NULL GROUP BY external_id
        ), j AS (
            SELECT k.*, coalesce(k.collective, c.collective,
                                 lower(regexp_extract(k.name, '{NCCL_OP_RE}', 1))) AS coll,
                   coalesce(k.pg_name, c.pg_name) AS pgn, coalesce(k.pg_desc, c.pg_desc) AS pgd,
                   coalesce(k.pg_ranks, c.pg_ranks) AS pgr, coalesce(k.group_size, c.group_size) AS gs,
                   coalesce(k.in_nelems, c.in_nelems) AS inn, coalesce(k.out_nelems, c.out_nelems) AS outn,
                   coalesce(k.dtype, c.dtype) AS dt
            FROM k LEFT JOIN comms c USING (external_id)
        )
        SELECT {sid}, {rank}, {dev}, coalesce(stream, tid), correlation, {start}, {end}, coll, pgn, pgd, pgr, gs,
               (row_number() OVER (PARTITION BY coalesce(pgn, pgr, ''), coll ORDER BY ts) - 1)::INTEGER,
               inn, outn, dt,
               CAST(greatest(coalesce(inn, 0), coalesce(outn, 0)) *
                    CASE lower(coalesce(dt, ''))
                        WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
                        WHEN 'double' THEN 8 WHEN 'long' THEN 8 WHEN 'int64' THEN 8
                        WHEN 'bfloat16' THEN 2 WHEN 'half' THEN 2 WHEN 'float16' THEN 2
                        WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'uint8' THEN 1
                        WHEN 'float8_e4m3fn' THEN 1 WHEN 'float8_e5m2' THEN 1 ELSE NULL END AS BIGINT)
        FROM j""")
    for d in info.devices:
        if d.id is None or not 0 <= d.id < 2**31:
            continue
        if d.numSms is not None and not 0 < d.numSms < 2**31 or d.totalGlobalMem is not None and not 0 < d.totalGlobalMem < 2**63:
            d = DeviceProp(id=d.id, name=d.name, computeMajor=d.computeMajor, computeMinor=d.computeMinor)
        cc = f"{d.computeMajor}.{d.computeMinor}" if d.computeMajor is not None else None
        vendor = "AMD" if (d.name or "").startswith("AMD") else "NVIDIA" if "NVIDIA" in (d.name or "") else None
        con.execute("INSERT INTO devices (source_id, rank, device, name, sm_count, memory_bytes, compute_capability,"
                    " vendor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [sid, info.rank, d.id, d.name, d.numSms, d.totalGlobalMem, cc, vendor])
    row = one(con, "SELECT count(*) FROM _kin_gpu WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')")
    info.gpu_events = int(row[0]) if row else 0
