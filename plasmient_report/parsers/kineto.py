"""PyTorch profiler (Kineto) Chrome-trace JSON → the store's tables.

Columnar and lean: the top level is decoded with msgspec, `traceEvents` kept as raw slices of the
input buffer, then decoded chunk by chunk into typed structs holding only the fields we use, turned
into Arrow columns and handed to DuckDB, which converts times and splits events into tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from ..errors import BadInput
from ..store import one
from ._io import GuardedReader
from ._jsonsplit import SplitError, split_events
from .base import SourceInfo

CHUNK_EVENTS = 200_000
# Kineto `ts` is µs; above this it is already epoch µs (traces before baseTimeNanoseconds existed).
EPOCH_US_THRESHOLD = 1e14
# |ts| beyond this (µs) cannot be a time: int64 ns would overflow around 9.2e15 µs.
MAX_ABS_TS_US = 9.0e15


_EMPTY_RAW = msgspec.Raw()


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    device: int | None = None
    stream: int | str | None = None
    context: int | str | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    regs: int | None = msgspec.field(default=None, name="registers per thread")
    smem: int | None = msgspec.field(default=None, name="shared memory")
    bytes: int | float | None = None
    flops: int | float | None = None
    input_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Concrete Inputs")
    seq: int | None = msgspec.field(default=None, name="Sequence number")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    dtype: str | None = None
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    pg_id: int | str | None = msgspec.field(default=None, name="Process Group ID")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    kind: str | int | None = None
    cbid: int | None = None
    name: str | None = None
    labels: str | None = None


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


class LooseArgs(msgspec.Struct, gc=False):
    """Same fields as Args, any JSON type: the fallback for traces whose args vary in type."""

    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    context: Any = None
    grid: Any = None
    block: Any = None
    regs: Any = msgspec.field(default=None, name="registers per thread")
    smem: Any = msgspec.field(default=None, name="shared memory")
    bytes: Any = None
    flops: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    seq: Any = msgspec.field(default=None, name="Sequence number")
    collective: Any = msgspec.field(default=None, name="Collective name")
    dtype: Any = None
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    sync_kind: Any = msgspec.field(default=None, name="cuda_sync_kind")
    kind: Any = None
    cbid: Any = None
    name: Any = None
    labels: Any = None


class LooseEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None


def _i(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _s(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _raw(v: Any) -> msgspec.Raw:
    return _EMPTY_RAW if v is None else msgspec.Raw(msgspec.json.encode(v))


def _ints(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(_i(x) is not None for x in v):
        return [int(x) for x in v]
    return None


def _tighten(e: LooseEvent) -> Event:
    """A loosely decoded event with every field coerced to the strict types (wrong types become null)."""
    a = e.args
    args = None
    if isinstance(a, LooseArgs):
        args = Args(
            external_id=_i(a.external_id), correlation=_i(a.correlation), device=_i(a.device),
            stream=_i(a.stream) if not isinstance(a.stream, str) else a.stream,
            context=_i(a.context), grid=_ints(a.grid), block=_ints(a.block), regs=_i(a.regs), smem=_i(a.smem),
            bytes=_num(a.bytes), flops=_num(a.flops), input_dims=_raw(a.input_dims), input_type=_raw(a.input_type),
            concrete=_raw(a.concrete), seq=_i(a.seq), collective=_s(a.collective), dtype=_s(a.dtype),
            in_nelems=_i(a.in_nelems), out_nelems=_i(a.out_nelems), group_size=_i(a.group_size),
            pg_name=_s(a.pg_name) if not isinstance(a.pg_name, int) else a.pg_name, pg_desc=_s(a.pg_desc),
            pg_ranks=_s(a.pg_ranks) if not isinstance(a.pg_ranks, list) else _ints(a.pg_ranks),
            pg_id=_i(a.pg_id), sync_kind=_s(a.sync_kind), kind=_s(a.kind), cbid=_i(a.cbid), name=_s(a.name),
            labels=_s(a.labels))
    pid = e.pid if isinstance(e.pid, str) else _i(e.pid)
    tid = e.tid if isinstance(e.tid, str) else _i(e.tid)
    return Event(ph=_s(e.ph), cat=_s(e.cat), name=_s(e.name), pid=pid, tid=tid, ts=_num(e.ts), dur=_num(e.dur),
                 args=args)


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


_HEAD = msgspec.json.Decoder(TraceHead)
_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[Event])
_LOOSE = msgspec.json.Decoder(list[LooseEvent])

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"}
CPU_CATS = {"cpu_op", "user_annotation"}
API_CATS = {"cuda_runtime", "cuda_driver"}


@dataclass
class KinetoSource(SourceInfo):
    """What a Kineto file says about itself, for the `sources` and `devices` rows."""

    devices: list[DeviceProp] = field(default_factory=list)


def looks_like_kineto(head: bytes) -> bool:
    """Content sniffing on the first KiB of (decompressed) text."""
    h = head.lstrip()
    return (h.startswith(b"{") and b"traceEvents" in head) or (h.startswith(b"[") and b'"ph"' in head)


def _strs(raws: list[Any]) -> list[str | None]:
    return [bytes(r).decode("utf-8", "replace") if len(r) else None for r in raws]


def _col(values: list[Any], typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ)


def _stream_int(v: int | str | None) -> int | None:
    if v is None or isinstance(v, int):
        return v
    try:
        return int(v, 0)
    except ValueError:
        return None


def _ranks_str(v: str | list[int] | None) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return "[" + ", ".join(str(x) for x in v) + "]"


def _gpu_table(evs: list[Event]) -> pa.Table:
    args = [e.args or _NOARGS for e in evs]
    grid = [a.grid or () for a in args]
    block = [a.block or () for a in args]
    i64, f64, s, i32 = pa.int64(), pa.float64(), pa.string(), pa.int32()
    return pa.table({
        "cat": _col([e.cat for e in evs], s),
        "name": _col([e.name for e in evs], s),
        "pid": _col([e.pid if isinstance(e.pid, int) else None for e in evs], i64),
        "tid": _col([e.tid if isinstance(e.tid, int) else None for e in evs], i64),
        "ts": _col([e.ts for e in evs], f64),
        "dur": _col([e.dur for e in evs], f64),
        "external_id": _col([a.external_id for a in args], i64),
        "correlation": _col([a.correlation for a in args], i64),
        "device": _col([a.device for a in args], i64),
        "stream": _col([_stream_int(a.stream) for a in args], i64),
        "grid_x": _col([g[0] if len(g) > 0 else None for g in grid], i64),
        "grid_y": _col([g[1] if len(g) > 1 else None for g in grid], i64),
        "grid_z": _col([g[2] if len(g) > 2 else None for g in grid], i64),
        "block_x": _col([g[0] if len(g) > 0 else None for g in block], i64),
        "block_y": _col([g[1] if len(g) > 1 else None for g in block], i64),
        "block_z": _col([g[2] if len(g) > 2 else None for g in block], i64),
        "regs": _col([a.regs for a in args], i32),
        "smem": _col([a.smem for a in args], i64),
        "bytes": _col([float(a.bytes) if a.bytes is not None else None for a in args], f64),
        "collective": _col([a.collective for a in args], s),
        "dtype": _col([a.dtype for a in args], s),
        "in_nelems": _col([a.in_nelems for a in args], i64),
        "out_nelems": _col([a.out_nelems for a in args], i64),
        "group_size": _col([a.group_size for a in args], i64),
        "pg_name": _col([None if a.pg_name is None else str(a.pg_name) for a in args], s),
        "pg_desc": _col([a.pg_desc for a in args], s),
        "pg_ranks": _col([_ranks_str(a.pg_ranks) for a in args], s),
        "sync_kind": _col([a.sync_kind for a in args], s),
    })


def _cpu_table(evs: list[Event]) -> pa.Table:
    args = [e.args or _NOARGS for e in evs]
    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    return pa.table({
        "cat": _col([e.cat for e in evs], s),
        "name": _col([e.name for e in evs], s),
        "pid": _col([e.pid if isinstance(e.pid, int) else None for e in evs], i64),
        "tid": _col([e.tid if isinstance(e.tid, int) else None for e in evs], i64),
        "ts": _col([e.ts for e in evs], f64),
        "dur": _col([e.dur for e in evs], f64),
        "external_id": _col([a.external_id for a in args], i64),
        "seq": _col([a.seq for a in args], i64),
        "flops": _col([float(a.flops) if a.flops is not None else None for a in args], f64),
        "input_dims": _col(_strs([a.input_dims for a in args]), s),
        "input_types": _col(_strs([a.input_type for a in args]), s),
        "concrete": _col(_strs([a.concrete for a in args]), s),
        "collective": _col([a.collective for a in args], s),
        "dtype": _col([a.dtype for a in args], s),
        "in_nelems": _col([a.in_nelems for a in args], i64),
        "out_nelems": _col([a.out_nelems for a in args], i64),
        "group_size": _col([a.group_size for a in args], i64),
        "pg_name": _col([None if a.pg_name is None else str(a.pg_name)
                         if a.pg_id is None or a.pg_name is not None else str(a.pg_id) for a in args], s),
        "pg_desc": _col([a.pg_desc for a in args], s),
        "pg_ranks": _col([_ranks_str(a.pg_ranks) for a in args], s),
    })


def _api_table(evs: list[Event]) -> pa.Table:
    args = [e.args or _NOARGS for e in evs]
    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    return pa.table({
        "cat": _col([e.cat for e in evs], s),
        "name": _col([e.name for e in evs], s),
        "pid": _col([e.pid if isinstance(e.pid, int) else None for e in evs], i64),
        "tid": _col([e.tid if isinstance(e.tid, int) else None for e in evs], i64),
        "ts": _col([e.ts for e in evs], f64),
        "dur": _col([e.dur for e in evs], f64),
        "external_id": _col([a.external_id for a in args], i64),
        "correlation": _col([a.correlation for a in args], i64),
        "cbid": _col([a.cbid for a in args], i64),
    })


_NOARGS = Args()
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
_BUILDERS = {"gpu": _gpu_table, "cpu": _cpu_table, "api": _api_table}


def ingest(path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> KinetoSource:
    """Decode one Kineto file into the store, streaming: memory is bounded by the batch size, not the file.
    Rank may be None (decided by the caller)."""
    meta: dict[tuple[int | str | None, int | str | None, str], str] = {}
    created: set[str] = set()
    n_events = 0
    head_bytes = b"{}"
    with GuardedReader(path) as stream:
        try:
            for batch in split_events(stream):
                if isinstance(batch, tuple):
                    head_bytes = batch[1]
                    continue
                n_events += _ingest_batch(path, con, batch, n_events, meta, created)
        except SplitError as e:
            raise BadInput(path, f"{e}: not a PyTorch profiler trace" if "truncated" not in str(e) else str(e)) from None
    head = _decode_head(path, head_bytes)
    for key, stage in _STAGE.items():
        if stage not in created:
            con.execute(_empty_stage_sql(key))
    info = _describe(path, head, n_events, meta)
    if _LOOSE_SEEN.pop(path, 0):
        info.notes.append("some event args had unexpected types and were read leniently (those values dropped)")
    _check_times(path, con, info)
    _emit(con, source_id, info)
    for stage in _STAGE.values():
        con.execute(f"DROP TABLE IF EXISTS {stage}")
    return info


_LOOSE_SEEN: dict[Path, int] = {}


def _ingest_batch(path: Path, con: duckdb.DuckDBPyConnection, blob: bytes, start: int,
                  meta: dict[tuple[int | str | None, int | str | None, str], str], created: set[str]) -> int:
    """Decode one batch of whole events into the staging tables; returns the number of events."""
    try:
        evs = _EVENTS.decode(blob)
    except msgspec.ValidationError:
        evs = _decode_loose(path, blob, start)
        _LOOSE_SEEN[path] = _LOOSE_SEEN.get(path, 0) + 1
    except msgspec.DecodeError as e:
        raise BadInput(path, f"bad JSON in traceEvents after event {start} ({e})") from None
    n = len(evs)
    xs = [e for e in evs if e.ph == "X"]
    buckets: dict[str, list[Event]] = {
        "gpu": [e for e in xs if e.cat in GPU_CATS],
        "cpu": [e for e in xs if e.cat in CPU_CATS],
        "api": [e for e in xs if e.cat in API_CATS],
    }
    for e in evs:
        if e.ph == "M" and e.args is not None and e.name in ("process_name", "thread_name", "process_labels"):
            v = e.args.name if e.name != "process_labels" else e.args.labels
            if v is not None:
                meta[(e.pid, e.tid, e.name)] = v
    del evs, xs
    for key, evl in buckets.items():
        if not evl:
            continue
        tbl = _BUILDERS[key](evl)
        stage = _STAGE[key]
        con.register("_kin_chunk", tbl)
        if stage in created:
            con.execute(f"INSERT INTO {stage} SELECT * FROM _kin_chunk")
        else:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {stage} AS SELECT * FROM _kin_chunk")
            created.add(stage)
        con.unregister("_kin_chunk")
    return n


def _decode_loose(path: Path, blob: bytes, start: int) -> list[Event]:
    try:
        loose = _LOOSE.decode(blob)
    except msgspec.ValidationError as e:
        raise BadInput(path, f"bad event near traceEvents[{start}] ({e})") from None
    out = []
    for e in loose:
        if isinstance(e.args, dict):
            try:
                e.args = msgspec.convert(e.args, LooseArgs)
            except msgspec.ValidationError:
                e.args = None
        elif e.args is not None:
            e.args = None
        out.append(_tighten(e))
    return out


def _empty_stage_sql(key: str) -> str:
    tbl = _BUILDERS[key]([])
    cols = ", ".join(f'NULL::{_duck_type(f.type)} AS "{f.name}"' for f in tbl.schema)
    return f"CREATE OR REPLACE TEMP TABLE {_STAGE[key]} AS SELECT {cols} WHERE false"


def _duck_type(t: pa.DataType) -> str:
    return {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}[t]


def _describe(path: Path, head: TraceHead, n_events: int, meta: dict[Any, str]) -> KinetoSource:
    di = head.distributedInfo
    rank, method = None, "order"
    if di is not None and di.rank is not None:
        rank, method = di.rank, "distributedInfo"
    elif (r := rank_from_filename(path)) is not None:
        rank, method = r, "filename"
    base = head.baseTimeNanoseconds
    version = f"kineto schema {head.schemaVersion}" if head.schemaVersion is not None else "chrome trace"
    if base is None:
        version += " (no baseTimeNanoseconds)"
    host = head.host_name
    notes = []
    rocm = any(v.startswith("hip") for (_, _, k), v in meta.items() if k == "thread_name") or any(
        (d.name or "").startswith("AMD") for d in head.deviceProperties or [])
    if rocm:
        notes.append("ROCm trace")
    return KinetoSource(
        format="kineto", format_version=version, rank=rank, rank_method=method,
        world_size=di.world_size if di is not None else None,
        base_time_ns=base, clock_anchor="native" if base is not None else "epoch_us", events=n_events,
        host=host, devices=list(head.deviceProperties or []), notes=notes)


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
    elif info.base_time_ns + tmax * 1000 > 2**63 - 1:
        raise BadInput(path, "baseTimeNanoseconds + ts overflows int64 ns")


def _emit(con: duckdb.DuckDBPyConnection, sid: int, info: KinetoSource) -> None:
    base = info.base_time_ns or 0
    start = _ns_expr("ts", base)
    end = _ns_expr("ts + coalesce(dur, 0)", base)
    rank = "NULL::INTEGER" if info.rank is None else str(int(info.rank))
    # GPU device: Kineto puts the device index in pid for GPU rows; args.device where present.
    dev = "coalesce(device, pid)::INTEGER"
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
                                 lower(regexp_extract(k.name, '(?i)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)', 1))) AS coll,
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
        if d.id is None:
            continue
        cc = f"{d.computeMajor}.{d.computeMinor}" if d.computeMajor is not None else None
        vendor = "AMD" if (d.name or "").startswith("AMD") else "NVIDIA" if "NVIDIA" in (d.name or "") else None
        con.execute("INSERT INTO devices (source_id, rank, device, name, sm_count, memory_bytes, compute_capability,"
                    " vendor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [sid, info.rank, d.id, d.name, d.numSms, d.totalGlobalMem, cc, vendor])
    row = one(con, "SELECT count(*) FROM _kin_gpu WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')")
    info.gpu_events = int(row[0]) if row else 0
