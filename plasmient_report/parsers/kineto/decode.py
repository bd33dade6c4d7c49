"""Kineto decode: a trace's `traceEvents` into typed DuckDB staging tables, streaming, in bounded memory.

The splitter (`_jsonsplit`) cuts `traceEvents` into batches of whole events written as NDJSON segments, which
DuckDB's JSON reader decodes straight into columns (no Python object per event) on a second thread while the
next segment is cut. SQL types the fields leniently (traces disagree on types), with the category and argument
spellings of every torch generation taken from `schema`. The staging tables:

- `_kin_gpu`, `_kin_cpu`, `_kin_api`: complete (`ph = X`) GPU, CPU and runtime events, typed;
- `_kin_meta`: process / thread names; `_kin_cats`: events per category (what a trace without GPU work is) and
  complete events without a name (left out);
- `_kin_mem`: allocator events (`[memory]` instants of `profile_memory=True`).

This module is the decode internals only: detection, schema variants and device mapping live beside it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ...errors import BadInput
from ...store import one
from .._io import GuardedReader
from .._jsonsplit import SplitError, split_events
from . import schema

# Events are staged as NDJSON in temporary files and read by DuckDB this many bytes at a time.
SEGMENT_BYTES = 24 << 20
STAGES = ("_kin_gpu", "_kin_cpu", "_kin_api", "_kin_meta", "_kin_cats", "_kin_mem")

# The args read from each event (all as raw JSON, typed in SQL with TRY_CAST: traces disagree on types).
ARG_KEYS = ((
    "External id", "correlation", "device", "stream", "grid", "block", "registers per thread", "shared memory",
    "bytes", "flops", "Input Dims", "Input type", "Concrete Inputs", "Sequence number", "Collective name", "dtype",
    "In msg nelems", "Out msg nelems", "Group size", "Process Group Name", "Process Group Description",
    "Process Group Ranks", "Process Group ID", "cuda_sync_kind", "cbid", "name", "labels",
    "Memory Bytes", "Total Allocated", "Total Reserved", "Device Id", "Device Type", "Addr"))
_ARGS_TYPE = "STRUCT(" + ", ".join(f'"{k}" JSON' for k in ARG_KEYS) + ")"
RAW_COLUMNS = {"ph": "JSON", "cat": "JSON", "name": "JSON", "pid": "JSON", "tid": "JSON", "ts": "JSON",
               "dur": "JSON", "args": _ARGS_TYPE}


@dataclass
class Decoded:
    head: bytes               # the rest of the document (top-level keys), traceEvents emptied
    events: int               # events read
    partial_tail: bool        # an array-form trace that ends inside its last event (that event left out)
    top_is_array: bool


def read_json_sql(path: Path) -> str:
    cols = ", ".join(f"'{k}': '{v}'" for k, v in RAW_COLUMNS.items())
    p = str(path).replace("'", "''")
    return (f"SELECT * FROM read_json('{p}', columns = {{{cols}}}, format = 'newline_delimited', "
            f"maximum_object_size = 16777216)")


def decode(path: Path, con: duckdb.DuckDBPyConnection) -> Decoded:
    """Fill the staging tables from the trace at `path` (plain or gzip)."""
    cols = ", ".join(f'"{k}" {v}' for k, v in RAW_COLUMNS.items())
    # The staging tables, typed by their SELECTs over an empty raw table. TEMP: they live in memory (spilling
    # under the budget), never in the store's file; the loader thread uses this same connection, one statement
    # at a time (this thread only cuts segments meanwhile), so it sees them.
    con.execute(f"CREATE OR REPLACE TEMP TABLE _kin_raw0 ({cols})")
    for table, sql in stage_selects("_kin_raw0").items():
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {sql}")
    con.execute("DROP TABLE _kin_raw0")
    # Segments of today's traces take the plain category; those that may hold torch 1.8-era names the mapped one.
    selects = {False: stage_selects("_kin_seg", old=False), True: stage_selects("_kin_seg", old=True)}
    tmp = Path(tempfile.mkdtemp(prefix="plasmient-kineto-"))
    loader = con
    pool = ThreadPoolExecutor(max_workers=1)
    pending: Future[None] | None = None
    n_events = 0
    head_bytes = b"{}"
    partial = False
    top_array = False

    def load(seg_file: Path, old: bool) -> None:
        # One segment: its raw JSON columns live only until its events are typed into the staging tables,
        # so the store never holds the raw trace.
        nonlocal n_events
        try:
            loader.execute(f"CREATE OR REPLACE TEMP TABLE _kin_seg AS {read_json_sql(seg_file)}")
            for table, sql in selects[old].items():
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
    seg_old = False
    seg_file = tmp / f"events-{n_seg}.ndjson"
    seg = open(seg_file, "wb")  # noqa: SIM115 - closed below, one file per segment
    try:
        with GuardedReader(path) as stream:
            for batch in split_events(stream, ndjson=True):
                if isinstance(batch, tuple):
                    if batch[0] == "head":
                        head_bytes = batch[1]
                    elif batch[0] == "partial_tail":
                        partial = True
                    elif batch[0] == "array":
                        top_array = True
                    continue
                seg_old = seg_old or schema.has_old_categories(batch)
                seg.write(schema.normalise_keys(batch))
                seg.write(b"\n")
                if seg.tell() >= SEGMENT_BYTES:
                    seg.close()
                    wait()  # at most one segment loading while the next is cut
                    pending = pool.submit(load, seg_file, seg_old)
                    seg_old = False
                    n_seg += 1
                    seg_file = tmp / f"events-{n_seg}.ndjson"
                    seg = open(seg_file, "wb")  # noqa: SIM115
            seg.close()
            wait()
            if seg_file.stat().st_size:
                pending = pool.submit(load, seg_file, seg_old)
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
        shutil.rmtree(tmp, ignore_errors=True)
    return Decoded(head=head_bytes, events=n_events, partial_tail=partial, top_is_array=top_array)


def drop_stages(con: duckdb.DuckDBPyConnection) -> None:
    for stage in STAGES:
        con.execute(f"DROP TABLE IF EXISTS {stage}")


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


def _array_text(x: str) -> str:
    """A JSON array as its text; anything else (a string, a number, an object) NULL: shapes and dtypes are
    lists, and a value of another type is no shape."""
    return f"CASE WHEN json_type({x}) = 'ARRAY' THEN CAST({x} AS VARCHAR) END"


def stage_selects(src: str, old: bool = True) -> dict[str, str]:
    """The typed staging tables per event family (and the metadata events), as SELECTs over a table `src` of
    raw JSON columns (one segment of events); `old`: the segment may hold categories of an older torch."""
    a = "args"
    arg = lambda k: schema.arg_sql(a, k)  # noqa: E731
    cat = schema.category_sql("json_extract_string(cat, '$')", old)
    common = f"""{cat} AS cat, json_extract_string(name, '$') AS name,
                 {_i('pid')} AS pid, {_i('tid')} AS tid, {_d('ts')} AS ts, {_d('dur')} AS dur,
                 {_i(arg('External id'))} AS external_id"""
    comms = f"""{_s(arg('Collective name'))} AS collective, {_s(arg('dtype'))} AS dtype,
                {_i(arg('In msg nelems'))} AS in_nelems, {_i(arg('Out msg nelems'))} AS out_nelems,
                TRY_CAST({_i(arg('Group size'))} AS INTEGER) AS group_size,
                coalesce({_s(arg('Process Group Name'))}, {_s(arg('Process Group ID'))}) AS pg_name,
                {_s(arg('Process Group Description'))} AS pg_desc,
                CASE json_type({arg('Process Group Ranks')}) WHEN 'VARCHAR'
                     THEN json_extract_string({arg('Process Group Ranks')}, '$')
                     WHEN 'ARRAY' THEN '[' || array_to_string(TRY_CAST({arg('Process Group Ranks')} AS BIGINT[]), ', ')
                                       || ']' END AS pg_ranks"""
    x = "json_extract_string(ph, '$') = 'X'"
    cats = lambda names: f"{cat} IN (" + ", ".join(f"'{n}'" for n in names) + ")"  # noqa: E731
    dims, types, concrete = (arg("Input Dims"), arg("Input type"), arg("Concrete Inputs"))
    return {
        "_kin_gpu": f"""
        SELECT {common}, {_i(arg('correlation'))} AS correlation,
               TRY_CAST({_i(arg('device'))} AS INTEGER) AS device, {_i(arg('stream'))} AS stream,
               TRY_CAST({_i(arg('grid') + "->'$[0]'")} AS INTEGER) AS grid_x,
               TRY_CAST({_i(arg('grid') + "->'$[1]'")} AS INTEGER) AS grid_y,
               TRY_CAST({_i(arg('grid') + "->'$[2]'")} AS INTEGER) AS grid_z,
               TRY_CAST({_i(arg('block') + "->'$[0]'")} AS INTEGER) AS block_x,
               TRY_CAST({_i(arg('block') + "->'$[1]'")} AS INTEGER) AS block_y,
               TRY_CAST({_i(arg('block') + "->'$[2]'")} AS INTEGER) AS block_z,
               TRY_CAST({_i(arg('registers per thread'))} AS INTEGER) AS regs,
               {_i(arg('shared memory'))} AS smem, {_d(arg('bytes'))} AS bytes, {comms},
               {_s(arg('cuda_sync_kind'))} AS sync_kind
        FROM {src} WHERE {x} AND {cats(schema.GPU_CATS)}""",
        "_kin_cpu": f"""
        SELECT {common}, {_i(arg('Sequence number'))} AS seq, {_d(arg('flops'))} AS flops,
               {_array_text(dims)} AS input_dims, {_array_text(types)} AS input_types,
               {_array_text(concrete)} AS concrete,
               ({dims} IS NOT NULL AND json_type({dims}) <> 'ARRAY') OR
               ({types} IS NOT NULL AND json_type({types}) <> 'ARRAY') AS bad_shapes, {comms}
        FROM {src} WHERE {x} AND {cats(schema.CPU_CATS)}""",
        "_kin_api": f"""
        SELECT {common}, {_i(arg('correlation'))} AS correlation, TRY_CAST({_i(arg('cbid'))} AS INTEGER) AS cbid
        FROM {src} WHERE {x} AND {cats(schema.API_CATS)}""",
        "_kin_meta": f"""
        SELECT json_extract_string(pid, '$') AS pid, json_extract_string(tid, '$') AS tid,
               json_extract_string(name, '$') AS name,
               json_extract_string(coalesce({arg('name')}, {arg('labels')}), '$') AS value
        FROM {src} WHERE json_extract_string(ph, '$') = 'M'
          AND json_extract_string(name, '$') IN ('process_name', 'thread_name', 'process_labels')""",
        "_kin_cats": f"""
        SELECT {cat} AS cat, count(*) AS n,
               count(*) FILTER (WHERE {x} AND json_extract_string(name, '$') IS NULL) AS nameless
        FROM {src} GROUP BY ALL""",
        "_kin_mem": f"""
        SELECT {_i('pid')} AS pid, {_i('tid')} AS tid, {_d('ts')} AS ts, {_d(arg('Memory Bytes'))} AS bytes,
               {_d(arg('Total Allocated'))} AS total_allocated, {_d(arg('Total Reserved'))} AS total_reserved,
               TRY_CAST({_i(arg('Device Id'))} AS INTEGER) AS device,
               TRY_CAST({_i(arg('Device Type'))} AS INTEGER) AS device_type, {_i(arg('Addr'))} AS addr
        FROM {src} WHERE json_extract_string(ph, '$') = 'i' AND json_extract_string(name, '$') = '[memory]'""",
    }
