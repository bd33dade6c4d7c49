"""Kineto decode: a trace's `traceEvents` into typed DuckDB staging tables, streaming, in bounded memory.

The splitter (`_jsonsplit`) cuts `traceEvents` into runs of whole events of a few MiB, which msgspec decodes at
once into Structs of the fields this tool reads, typed strictly (`int | str`, `float | str`, `str | int`, raw JSON
for arrays). Where it is built, the native scan (`_scan.c`) reads a run first, straight into one column per field
without a Python object per event; it takes only the runs whose values it can hold exactly as the Structs would and
leaves every other run to them (tests/test_ingest_kineto_native.py compares the two ways). Each run becomes columns
— one Arrow array per field and event family (GPU, CPU, runtime, metadata, allocator), built only for the events of
that family — which DuckDB inserts into the staging tables on a second thread while the next run is decoded. A
field whose values all have the expected JSON type is a typed column; one that mixes types (a `tid` that is a
number on some events and a name on others) is a column of JSON text, typed in SQL exactly as before. A run the
strict Structs refuse (a float where a count belongs, `args` that is no object, invalid JSON) goes the lenient way
instead: written as NDJSON and read by DuckDB's JSON reader into JSON columns, typed with TRY_CAST — the same SQL
(`stage_selects`) over the other kind of columns, so both ways give the same rows. The categories and argument
spellings of every torch generation come from `schema`.

The staging tables:

- `_kin_gpu`, `_kin_cpu`, `_kin_api`: complete (`ph = X`) GPU, CPU (ops, annotations) and runtime events, typed;
- `_kin_py`: complete Python frames (`python_function`, with_stack=True): name, thread and times only;
- `_kin_meta`: process / thread names; `_kin_cats`: events per category (what a trace without GPU work is) and
  complete events without a name (left out);
- `_kin_mem`: allocator events (`[memory]` instants of `profile_memory=True`).
- `_kin_span`: the profiler's own events: its spans (category `trace`, e.g. `PyTorch Profiler (0)`: when it
  recorded) and its overhead (category `overhead`: CUPTI's buffer requests and flushes, lazy function loading).

This module is the decode internals only: detection, schema variants and device mapping live beside it.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import BadInput
from ...store import one
from .._io import GuardedReader
from .._jsonsplit import SplitError, split_events
from . import schema

_native: Any
try:  # the compiled scan (setup.py; optional): the columns the Structs below give, without a Python object per event
    from . import _scan as _native
except ImportError:  # pragma: no cover - built without a C compiler
    _native = None

# Runs of events decoded at once (the splitter's chunk): Python objects of one run are a few times this. 1 MiB
# rather than 4: ~60 MiB less peak RSS on a 100 MB trace (measured), no slower.
BATCH_BYTES = 1 << 20
# Columns of decoded runs are inserted this many bytes of JSON at a time: each INSERT costs ~5 ms to plan (the op
# and GPU ones ~7 ms), and two loads' columns are held at once (one inserting, the next being decoded): ~2 MiB of
# RSS per MiB here. 16 rather than 8: ~0.2-0.3 CPU s less on a 100 MB trace, +25 MiB of ingest peak (measured).
# 32 rather than 16 (session 12, the scan on a thread of its own, `_Ahead`): the 100 MiB trace's decode alone
# 16: 0.50 s, 32: 0.47, 64: 0.44, 128: 0.44 (medians of 5); the whole run, 4 interleaved rounds: 16: 3.64 s and
# 356 MiB peak, 32: 3.61 s and 346 MiB, 64: 3.58 s and 360 MiB. 64 buys ~1% of time for ~4% of peak RSS.
LOAD_BYTES = 32 << 20
STAGES = ("_kin_gpu", "_kin_cpu", "_kin_py", "_kin_api", "_kin_span", "_kin_meta", "_kin_cats", "_kin_mem")
# The staging tables' database: in memory (spilling under the budget, as TEMP tables do), never the store's file, and
# attached to the store's DuckDB, so that every cursor of the store sees them where a TEMP table is seen by its own
# connection only: `emit` writes the store's tables from them on two connections at once. Their names resolve
# through the search path (`open_stages`).
STAGE_DB = "plasmient_kin"

# How each field read is typed in SQL: INT → TRY_CAST(… AS BIGINT), FLOAT → DOUBLE, TEXT → the string (numbers as
# their text where the SQL says so), RAW → a JSON value (arrays: shapes, dtypes, grid, process-group ranks).
INT, FLOAT, TEXT, RAW = "int", "float", "text", "raw"
TOP_FIELDS = {"ph": TEXT, "cat": TEXT, "name": TEXT, "pid": INT, "tid": INT, "ts": FLOAT, "dur": FLOAT}
ARG_FIELDS = {
    "External id": INT,
    "correlation": INT,
    "device": INT,
    "stream": INT,
    "grid": RAW,
    "block": RAW,
    "registers per thread": INT,
    "shared memory": INT,
    "bytes": FLOAT,
    "flops": FLOAT,
    "Input Dims": RAW,
    "Input type": RAW,
    "Concrete Inputs": RAW,
    "Sequence number": INT,
    "Collective name": TEXT,
    "dtype": TEXT,
    "In msg nelems": INT,
    "Out msg nelems": INT,
    "Group size": INT,
    "Process Group Name": TEXT,
    "Process Group Description": TEXT,
    "Process Group Ranks": RAW,
    "Process Group ID": TEXT,
    "cuda_sync_kind": TEXT,
    "cbid": INT,
    "name": TEXT,
    "labels": TEXT,
    "Memory Bytes": FLOAT,
    "Total Allocated": FLOAT,
    "Total Reserved": FLOAT,
    "Device Id": INT,
    "Device Type": INT,
    "Addr": INT,
}
ARG_KEYS = tuple(ARG_FIELDS)
_ARGS_TYPE = "STRUCT(" + ", ".join(f'"{k}" JSON' for k in ARG_KEYS) + ")"
RAW_COLUMNS = {
    "ph": "JSON",
    "cat": "JSON",
    "name": "JSON",
    "pid": "JSON",
    "tid": "JSON",
    "ts": "JSON",
    "dur": "JSON",
    "args": _ARGS_TYPE,
}

_COMMS = (
    "Collective name",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "Process Group ID",
)
_EVENT = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
# The fields each staging table reads (top-level names, and args keys as `args.KEY`).
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "_kin_gpu": _EVENT
    + tuple(
        "args." + k
        for k in (
            "External id",
            "correlation",
            "device",
            "stream",
            "grid",
            "block",
            "registers per thread",
            "shared memory",
            "bytes",
            *_COMMS,
            "cuda_sync_kind",
        )
    ),
    "_kin_cpu": _EVENT
    + tuple(
        "args." + k for k in ("External id", "Sequence number", "flops", "Input Dims", "Input type", "Concrete Inputs", *_COMMS)
    ),
    "_kin_py": ("ph", "cat", "name", "pid", "tid", "ts", "dur"),
    "_kin_span": ("ph", "cat", "name", "ts", "dur"),  # (its pid / tid are text: "Spans", "PyTorch Profiler")
    "_kin_api": _EVENT + ("args.External id", "args.correlation", "args.cbid"),
    "_kin_meta": ("ph", "pid", "tid", "name", "args.name", "args.labels"),
    "_kin_cats": ("cat", "ph", "name"),
    "_kin_mem": ("ph", "name", "pid", "tid", "ts")
    + tuple("args." + k for k in ("Memory Bytes", "Total Allocated", "Total Reserved", "Device Id", "Device Type", "Addr")),
}
META_NAMES = ("process_name", "thread_name", "process_labels")


# Python frames (with_stack=True: often most of a trace's events) are staged apart, with only the fields their
# ranges keep: in the ops' table every one of them would carry a dozen empty op and collective columns.
_PY_CATS = ("python_function",)
_OP_CATS = tuple(c for c in schema.CPU_CATS if c not in _PY_CATS)


def _kind(field: str) -> str:
    return ARG_FIELDS[field[5:]] if field.startswith("args.") else TOP_FIELDS[field]


# ---------------------------------------------------------------------------------------- the strict Structs

# JSON types accepted per kind; anything else refuses the run (it goes the lenient way). A string where a number
# belongs (or a number where a string does) is kept: its column is then JSON text, typed in SQL as before.
_STRICT: dict[str, Any] = {INT: int | str | None, FLOAT: float | str | None, TEXT: str | int | None, RAW: msgspec.Raw}
# Older spellings of argument keys (schema.ARG_RENAMES) are fields of their own, merged into today's column
# when a run has them: no renaming pass over the bytes.
_OLD = {new: old for old, new in schema.ARG_RENAMES.items()}
_ATTR = {k: f"a{i}" for i, k in enumerate(ARG_KEYS)} | {f"old:{k}": f"o{i}" for i, k in enumerate(_OLD)}
_Args: Any = msgspec.defstruct(
    "_Args",
    [(_ATTR[k], _STRICT[v], msgspec.field(name=k, default=msgspec.Raw() if v == RAW else None)) for k, v in ARG_FIELDS.items()]
    + [
        (
            _ATTR[f"old:{k}"],
            _STRICT[ARG_FIELDS[k]],
            msgspec.field(name=old, default=msgspec.Raw() if ARG_FIELDS[k] == RAW else None),
        )
        for k, old in _OLD.items()
    ],
    gc=False,
)
_Event: Any = msgspec.defstruct(
    "_Event",
    [(f, str | None if f in ("ph", "cat", "name") else _STRICT[k], None) for f, k in TOP_FIELDS.items()]
    + [("args", _Args, msgspec.field(default_factory=_Args))],
    gc=False,
)
_STRICT_DECODER = msgspec.json.Decoder(list[_Event])
_ANY_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


@dataclass
class Decoded:
    head: bytes  # the rest of the document (top-level keys), traceEvents emptied
    events: int  # events read
    partial_tail: bool  # an array-form trace that ends inside its last event (that event left out)
    top_is_array: bool
    runs: int = 0  # runs of events decoded (the typed way) ...
    lenient_runs: int = 0  # ... and read by DuckDB's JSON reader (the lenient way)


@dataclass
class _Run:
    """A run of whole events: decoded (`events`: Structs, or `columns`: the native scan's), or its JSON bytes for
    the lenient way (neither)."""

    data: bytes | bytearray
    events: list[Any] | None = None
    columns: tuple[int, list[tuple[bytes, ...]]] | None = None

    @property
    def decoded(self) -> bool:
        return self.events is not None or self.columns is not None

    @property
    def count(self) -> int:
        if self.columns is not None:
            return self.columns[0]
        return len(self.events or ())


# Whether runs go through the native scan first (when it is built): tests turn it off to compare the two ways.
NATIVE = _native is not None


def _strict(data: bytes | bytearray) -> _Run | None:
    """The splitter's guess at a run of events: decoded strictly, or kept for the lenient way when it is whole
    JSON of other types; None when it is no run of whole events (the splitter then scans it exactly). The native
    scan reads the runs it can hold exactly as the Structs do (most); msgspec reads the others."""
    if NATIVE and _native is not None:
        cols = _native.scan(data, _NATIVE_SPEC)
        if cols is not None:
            return _Run(data, columns=cols)
    try:
        return _Run(data, _STRICT_DECODER.decode(data))
    except (msgspec.DecodeError, RecursionError) as e:
        if not isinstance(e, msgspec.ValidationError):
            return None  # not whole JSON (ValidationError: whole JSON of other types, tried below)
    try:
        _ANY_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return _Run(bytes(data))


def _exact(batch: bytes) -> _Run:
    """A batch the splitter cut exactly (whole events by construction): DuckDB's reader takes what the strict
    decoder does not (and says what is wrong with it)."""
    return _strict(batch) or _Run(batch)


# -------------------------------------------------------------------------------------------------- columns

_ARROW = {INT: pa.int64(), FLOAT: pa.float64(), TEXT: pa.string()}
_CONVERT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError)


class _NotStrict(Exception):
    """A decoded run holds what the typed columns cannot (raw JSON that is not UTF-8): it goes the lenient way."""


def _column(values: list[Any], kind: str) -> tuple[pa.Array, bool]:
    """One field of a family's events as an Arrow array, and whether it is JSON text (mixed types)."""
    try:
        return pa.array(values, _ARROW[kind]), False
    except _CONVERT_ERRORS:
        enc = msgspec.json.encode
        return pa.array([None if v is None else enc(v) for v in values], pa.string()), True


# The JSON type of a raw value from its first byte (the value is valid JSON: msgspec read it); 0: no value.
_JSON_TYPES = ("ARRAY", "OBJECT", "VARCHAR", "BOOLEAN", "NUMBER")
_FIRST_BYTE = np.full(256, 5, np.uint8)
_FIRST_BYTE[[ord("["), ord("{"), ord('"'), ord("t"), ord("f"), ord("n")]] = [1, 2, 3, 4, 4, 0]


def _raw_column(values: list[msgspec.Raw]) -> tuple[pa.Array, pa.Array]:
    """Raw JSON values as a string array built from their joined bytes, and their JSON types (`_JSON_TYPES`,
    1-based); an absent value and JSON null are NULL. msgspec does not check UTF-8 inside raw values: the cast
    to string does."""
    n = len(values)
    lengths = np.fromiter(map(len, values), np.int64, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(values)
    types = np.zeros(n, np.uint8)
    present = lengths > 0
    if data:
        types[present] = _FIRST_BYTE[np.frombuffer(data, np.uint8)[offsets[:-1][present]]]
    valid = types > 0
    arr = pa.Array.from_buffers(
        pa.binary(),
        n,
        [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=int(n - np.count_nonzero(valid)),
    )
    try:
        text = arr.cast(pa.string())
    except pa.ArrowInvalid:
        raise _NotStrict from None
    return text, pa.array(types, mask=~valid)


def _merge_old(new: list[Any], old: list[Any], kind: str) -> list[Any]:
    """Today's spelling of an argument where an event has it, else the older one."""
    if kind == RAW:
        return new if not any(old) else [n if n else o for n, o in zip(new, old, strict=True)]
    if old.count(None) == len(old):
        return new
    return [n if n is not None else o for n, o in zip(new, old, strict=True)]


def _transposer(fields: tuple[str, ...]) -> Callable[[list[Any], list[Any]], tuple[list[Any], ...]]:
    """A function of a family's events and their args giving one list per field (older spellings after them).
    Written out with the attribute names, because a comprehension over `e.ts` runs ~3x faster than getattr."""
    parts = []
    for f in fields:
        parts.append(f"[a.{_ATTR[f[5:]]} for a in args]" if f.startswith("args.") else f"[e.{f} for e in rows]")
    for f in fields:
        if f.startswith("args.") and f[5:] in _OLD:
            parts.append(f"[a.{_ATTR['old:' + f[5:]]} for a in args]")
    ns: dict[str, Any] = {}
    exec(f"def transpose(rows, args):\n    return ({''.join(p + ', ' for p in parts)})\n", ns)  # noqa: S102 - our own names
    return ns["transpose"]


class _Categories:
    """Canonical categories (`schema.category_sql`), computed by DuckDB itself (its lower() is the SQL's) for
    each distinct spelling once; on a private connection, as the store's is busy loading. (Closing it, at the end
    of the decode, also has DuckDB's allocator give back what the loads left cached: ~50 MiB on a 100 MB trace.)"""

    def __init__(self) -> None:
        self.con: duckdb.DuckDBPyConnection | None = None
        self.known: dict[str | None, str | None] = {}

    def map(self, cats: list[str | None]) -> list[str | None]:
        new = [c for c in cats if c not in self.known]
        if new:
            if self.con is None:
                self.con = duckdb.connect(config={"threads": 1})
            rows = self.con.execute(f"SELECT c, {schema.category_sql('c')} FROM unnest(?::VARCHAR[]) t(c)", [new]).fetchall()
            self.known.update(dict(rows))
        return [self.known[c] for c in cats]

    def close(self) -> None:
        if self.con is not None:
            self.con.close()


_FAMILIES = ("_kin_gpu", "_kin_cpu", "_kin_api", "_kin_py", "_kin_span")
_FAMILY = {
    **{c: 0 for c in schema.GPU_CATS},
    **{c: 1 for c in _OP_CATS},
    **{c: 2 for c in schema.API_CATS},
    **{c: 3 for c in _PY_CATS},
    **{c: 4 for c in schema.SPAN_CATS + schema.OVERHEAD_CATS},
}
_TAKEN = ("ph", "cat", "name")  # read for every event (to sort the events into families), then taken per family
_TRANSPOSE = {
    stage: (tuple(f for f in fields if f not in _TAKEN), _transposer(tuple(f for f in fields if f not in _TAKEN)))
    for stage, fields in STAGE_FIELDS.items()
}


def _tables(run: _Run, cats: _Categories, counts: dict[str | None, list[int]]) -> dict[str, tuple[pa.Table, frozenset[str]]]:
    """The run's events as one Arrow table per staging table (only that table's events and fields), with the
    fields that are JSON text. `counts` (the rows of `_kin_cats`: events per category, complete events without
    a name) is added to."""
    native = _NativeColumns(*run.columns) if run.columns is not None else None
    if native is not None:
        ph, name, raw_cat = native.text("ph"), native.text("name"), native.text("cat")
    else:
        evs = run.events
        assert evs is not None
        ph = pa.array([e.ph for e in evs], pa.string())
        name = pa.array([e.name for e in evs], pa.string())
        raw_cat = pa.array([e.cat for e in evs], pa.string())
    raw_cat = raw_cat.dictionary_encode()
    spellings = raw_cat.dictionary.to_pylist()
    names = cats.map(spellings) + [None]
    canon = pa.array(names, pa.string())
    code = raw_cat.indices.fill_null(len(spellings))
    codes = code.to_numpy()
    cat = canon.take(code)
    family = np.array([_FAMILY.get(c, -1) if c is not None else -1 for c in names], dtype=np.int8)[codes]
    is_x = _mask(pc.equal(ph, "X"))
    per_cat = np.bincount(codes, minlength=len(names)).tolist()
    nameless = np.bincount(codes[is_x & name.is_null().to_numpy(zero_copy_only=False)], minlength=len(names)).tolist()
    select = {
        "_kin_meta": _mask(pc.equal(ph, "M")) & _mask(pc.is_in(name, pa.array(META_NAMES))),
        "_kin_mem": _mask(pc.equal(ph, "i")) & _mask(pc.equal(name, "[memory]")),
    }
    for k, stage in enumerate(_FAMILIES):
        select[stage] = is_x & (family == k)
    if native is not None and not all(native.typed(stage, mask) for stage, mask in select.items()):
        # a table reads a value of its field's other JSON type (a string pid, an int64-overflowing id): its
        # column is JSON text, which the Structs' way builds
        try:
            run.events, run.columns = _STRICT_DECODER.decode(run.data), None
        except (msgspec.DecodeError, RecursionError):
            raise _NotStrict from None
        return _tables(run, cats, counts)
    for c, n, k in zip(names, per_cat, nameless, strict=True):
        if n:
            total = counts.setdefault(c, [0, 0])
            total[0] += n
            total[1] += k
    taken = {"ph": ph, "cat": cat, "name": name}
    out: dict[str, tuple[pa.Table, frozenset[str]]] = {}
    for stage, mask in select.items():
        ix = np.flatnonzero(mask)
        if not ix.size:
            continue
        if native is not None:
            out[stage] = (native.table(stage, ix, taken), frozenset())
            continue
        cols = {f: taken[f].take(ix) for f in STAGE_FIELDS[stage] if f in taken}
        assert run.events is not None
        rows = [run.events[i] for i in ix.tolist()]
        fields, transpose = _TRANSPOSE[stage]
        lists = transpose(rows, [e.args for e in rows])
        olds = iter(lists[len(fields) :])
        text: set[str] = set()
        for f, values in zip(fields, lists, strict=False):
            kind = _kind(f)
            if f.startswith("args.") and f[5:] in _OLD:
                values = _merge_old(values, next(olds), kind)
            if kind == RAW:
                cols[f], cols[f + ":type"] = _raw_column(values)
                continue
            cols[f], is_text = _column(values, kind)
            if is_text:
                text.add(f)
        out[stage] = (pa.table(cols), frozenset(text))
    return out


# The native scan's fields: every field a staging table reads (top-level and args keys), then the older
# spellings of argument keys, each with its kind (the C enum: text, int, float, raw).
_NATIVE_KIND = {TEXT: 0, INT: 1, FLOAT: 2, RAW: 3}
_NATIVE_STRICT_TEXT = 4  # ph / cat / name: `str | None` (args' text fields also take an int, as JSON text)
_NATIVE_FIELDS = tuple(TOP_FIELDS) + tuple("args." + k for k in ARG_KEYS) + tuple("old:" + k for k in _OLD)
_NATIVE_SPEC = tuple(
    (
        (_OLD[f[4:]] if f.startswith("old:") else f[5:] if f.startswith("args.") else f).encode(),
        _NATIVE_STRICT_TEXT if f in _TAKEN else _NATIVE_KIND[ARG_FIELDS[f[4:]] if f.startswith("old:") else _kind(f)],
        f not in TOP_FIELDS,
    )
    for f in _NATIVE_FIELDS
)
_NATIVE_INDEX = {f: i for i, f in enumerate(_NATIVE_FIELDS)}
# The scan's type codes (_scan.c) → `_JSON_TYPES` (1-based; 0: no value) for raw fields.
_T_ABSENT, _T_NULL, _T_INT, _T_NUMBER, _T_STRING = 0, 1, 2, 3, 4
_RAW_JSON_TYPE = np.array([0, 0, 5, 5, 3, 4, 1, 2, 5], np.uint8)
# The type codes a typed column of each kind holds (others: the column would be JSON text, the Structs' way).
_TYPED = {
    INT: np.isin(np.arange(256), [_T_ABSENT, _T_NULL, _T_INT]),
    FLOAT: np.isin(np.arange(256), [_T_ABSENT, _T_NULL, _T_INT, _T_NUMBER]),
    TEXT: np.isin(np.arange(256), [_T_ABSENT, _T_NULL, _T_STRING]),
}
_TYPED_BITS = {kind: sum(1 << int(t) for t in np.flatnonzero(ok[:32])) for kind, ok in _TYPED.items()}


class _NativeColumns:
    """The native scan's columns of one run, as the Arrow arrays `_tables` builds from the Structs: the same
    types, values and nulls (the scan takes only runs whose values all have their field's JSON type). Each field
    becomes one array over the run's events, once; a table takes its events' rows from it."""

    def __init__(self, n: int, columns: list[tuple[bytes, ...]]) -> None:
        self.n = n
        self.columns = columns
        self._full: dict[tuple[str, str], dict[str, pa.Array]] = {}

    def _types(self, f: str) -> np.ndarray:
        return np.frombuffer(self.columns[_NATIVE_INDEX[f]][0], np.uint8)

    def _kinds(self, f: str) -> int:
        """The type codes present in the field (bit t for type t; absent is never set)."""
        return int(self.columns[_NATIVE_INDEX[f]][-1])

    def typed(self, stage: str, mask: np.ndarray) -> bool:
        """Whether every field `stage` reads has, in the events of `mask`, only values of its JSON type."""
        if not mask.any():
            return True
        for f in _TRANSPOSE[stage][0]:
            kind = _kind(f)
            if kind == RAW:
                continue
            for src in [f, "old:" + f[5:]] if f.startswith("args.") and f[5:] in _OLD else [f]:
                if not self._kinds(src) & ~_TYPED_BITS[kind]:  # (the common case: no event of the run has another type)
                    continue
                if not _TYPED[kind][self._types(src)[mask]].all():
                    return False
        return True

    def _strings(self, f: str, valid: np.ndarray) -> pa.Array:
        col = self.columns[_NATIVE_INDEX[f]]
        offs, data = np.frombuffer(col[1], np.int64), col[2]
        small = offs[-1] < 2**31
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        offsets_buf = pa.py_buffer(offs.astype(np.int32) if small else offs)
        arr = pa.Array.from_buffers(
            pa.string() if small else pa.large_string(),
            self.n,
            [bitmap, offsets_buf, pa.py_buffer(data)],
            null_count=int(self.n - np.count_nonzero(valid)),
        )
        return arr if small else arr.cast(pa.string())

    def text(self, f: str) -> pa.Array:
        """A text field of every event (a string, else null)."""
        return self._strings(f, self._types(f) == _T_STRING)

    def _older(self, f: str, kind: str) -> np.ndarray | None:
        """Where the event's value of `f` is its older spelling's: today's key has no value (raw fields: is not
        there, JSON null counting as a value, as `_merge_old` takes it) and the older key is there."""
        if not f.startswith("args.") or f[5:] not in _OLD:
            return None
        new, old = self._types(f), self._types("old:" + f[5:])
        has_new = new != _T_ABSENT if kind == RAW else new > _T_NULL
        use_old = ~has_new & (old != _T_ABSENT)
        return use_old if use_old.any() else None

    def _column(self, f: str) -> dict[str, pa.Array]:
        """The field over all the run's events (its older spelling merged in), once."""
        key = (f, "")
        if key not in self._full:
            kind = _kind(f)
            col = self._one(f, f, kind)
            use_old = self._older(f, kind)
            if use_old is not None:
                old = self._one("old:" + f[5:], f, kind)
                pick = pa.array(use_old)
                col = {name: pc.if_else(pick, old[name], col[name]) for name in col}
            self._full[key] = col
        return self._full[key]

    def _one(self, src: str, f: str, kind: str) -> dict[str, pa.Array]:
        col = self.columns[_NATIVE_INDEX[src]]
        types = np.frombuffer(col[0], np.uint8)
        if kind == INT:
            return {f: pa.array(np.frombuffer(col[1], np.int64), pa.int64(), mask=types != _T_INT)}
        if kind == FLOAT:
            ok = (types == _T_INT) | (types == _T_NUMBER)
            return {f: pa.array(np.frombuffer(col[1], np.float64), pa.float64(), mask=~ok)}
        if kind == TEXT:
            return {f: self._strings(src, types == _T_STRING)}
        json_type = _RAW_JSON_TYPE[types]
        valid = json_type > 0
        return {f: self._strings(src, valid), f + ":type": pa.array(json_type, mask=~valid)}

    def table(self, stage: str, ix: np.ndarray, taken: dict[str, pa.Array]) -> pa.Table:
        """`stage`'s columns for the events `ix`: ph / cat / name from `taken` (every event's), the other fields
        from the run's columns, all taken in one call (a call per column cost ~30 µs of Python each: 41 a run,
        0.12 s of the 100 MiB trace's decode)."""
        order: list[str] = [f for f in STAGE_FIELDS[stage] if f in taken]
        full: dict[str, pa.Array] = {f: taken[f] for f in order}
        nulls: dict[str, pa.Array] = {}
        for f in _TRANSPOSE[stage][0]:
            if not self._kinds(f) & ~(1 << _T_NULL) and self._older(f, _kind(f)) is None:
                # no event of the run has it: a column of nulls of its type
                nulls[f] = pa.nulls(ix.size, _ARROW.get(_kind(f), pa.string()))
                order.append(f)
                if _kind(f) == RAW:
                    nulls[f + ":type"] = pa.nulls(ix.size, pa.uint8())
                    order.append(f + ":type")
                continue
            for name, arr in self._column(f).items():
                full[name] = arr
                order.append(name)
        rows = pa.table(full).take(pa.array(ix))
        return pa.table({name: nulls[name] if name in nulls else rows.column(name) for name in order})


def _mask(a: pa.Array) -> np.ndarray:
    return a.fill_null(False).to_numpy(zero_copy_only=False)


# ------------------------------------------------------------------------------------------------------ SQL


@dataclass(frozen=True)
class Columns:
    """How a staging SELECT reads the fields of its source table `src`: DuckDB's JSON reader gives JSON columns
    (`args` a STRUCT of them); a decoded run gives flat columns named by field, typed, except those in `text`
    (JSON text of mixed types) and the raw ones (JSON text, their JSON types in `FIELD:type`)."""

    src: str
    decoded: bool = False
    text: frozenset[str] = frozenset()

    def ref(self, f: str) -> str:
        if not self.decoded:
            return schema.arg_sql("args", f[5:]) if f.startswith("args.") else f
        return f'"{f}"'

    def is_json(self, f: str) -> bool:
        return not self.decoded or f in self.text or _kind(f) == RAW

    def json(self, f: str) -> str:
        """The field as a JSON value (SQL NULL when absent or JSON null)."""
        if not self.decoded:
            return self.ref(f)
        if self.is_json(f):
            return f"CAST({self.ref(f)} AS JSON)"
        return f"to_json({self.ref(f)})"

    def json_type(self, f: str) -> str:
        """json_type of the field; of raw decoded fields from their first byte, numbers all 'NUMBER' (only
        arrays and strings are told apart)."""
        if not self.decoded or _kind(f) != RAW:
            return f"json_type({self.json(f)})"
        return f'CASE "{f}:type" ' + " ".join(f"WHEN {i} THEN '{t}'" for i, t in enumerate(_JSON_TYPES, 1)) + " END"

    def json_text(self, f: str) -> str:
        """The field's JSON as text, minified as DuckDB's JSON reader writes it."""
        return f"CAST({self.json(f)} AS VARCHAR)" if not self.decoded else f"CAST(json({self.ref(f)}) AS VARCHAR)"

    def i(self, f: str) -> str:
        return self.ref(f) if not self.is_json(f) and _kind(f) == INT else f"TRY_CAST({self.json(f)} AS BIGINT)"

    def d(self, f: str) -> str:
        return self.ref(f) if not self.is_json(f) and _kind(f) == FLOAT else f"TRY_CAST({self.json(f)} AS DOUBLE)"

    def string(self, f: str) -> str:
        """json_extract_string: a string as itself, a number as its text."""
        if self.is_json(f):
            return f"json_extract_string({self.json(f)}, '$')"
        return self.ref(f) if _kind(f) == TEXT else f"CAST({self.ref(f)} AS VARCHAR)"

    def s(self, f: str) -> str:
        """A JSON string as text; integers as their text too (process group names are sometimes ints)."""
        if not self.is_json(f):
            return self.ref(f) if _kind(f) == TEXT else f"CAST({self.ref(f)} AS VARCHAR)"
        x = self.json(f)
        return (
            f"CASE json_type({x}) WHEN 'VARCHAR' THEN json_extract_string({x}, '$') "
            f"WHEN 'BIGINT' THEN CAST({x} AS VARCHAR) WHEN 'UBIGINT' THEN CAST({x} AS VARCHAR) END"
        )


def stage_selects(c: Columns, map_categories: bool = True) -> dict[str, str]:
    """The typed staging tables per event family (and the metadata events), as SELECTs over the columns `c`
    (one run of events), categories mapped to today's names (`map_categories=False`: they already are)."""
    cat = schema.category_sql(c.string("cat"), map_categories)
    ph, name = c.string("ph"), c.string("name")
    common = f"""{cat} AS cat, {name} AS name, {c.i("pid")} AS pid, {c.i("tid")} AS tid, {c.d("ts")} AS ts,
                 {c.d("dur")} AS dur, {c.i("args.External id")} AS external_id"""
    ranks, ranks_type = c.json("args.Process Group Ranks"), c.json_type("args.Process Group Ranks")
    comms = f"""{c.s("args.Collective name")} AS collective, {c.s("args.dtype")} AS dtype,
                {c.i("args.In msg nelems")} AS in_nelems, {c.i("args.Out msg nelems")} AS out_nelems,
                TRY_CAST({c.i("args.Group size")} AS INTEGER) AS group_size,
                coalesce({c.s("args.Process Group Name")}, {c.s("args.Process Group ID")}) AS pg_name,
                {c.s("args.Process Group Description")} AS pg_desc,
                CASE {ranks_type} WHEN 'VARCHAR' THEN json_extract_string({ranks}, '$')
                     WHEN 'ARRAY' THEN '[' || array_to_string(TRY_CAST({ranks} AS BIGINT[]), ', ') || ']'
                END AS pg_ranks"""
    x = f"{ph} = 'X'"
    cats = lambda names: f"{cat} IN (" + ", ".join(f"'{n}'" for n in names) + ")"  # noqa: E731

    def array_text(f: str) -> str:
        """A JSON array as its text; anything else (a string, a number, an object) NULL: shapes and dtypes are
        lists, and a value of another type is no shape."""
        return f"CASE WHEN {c.json_type(f)} = 'ARRAY' THEN {c.json_text(f)} END"

    def not_array(f: str) -> str:
        return f"({c.ref(f)} IS NOT NULL AND {c.json_type(f)} <> 'ARRAY')"

    grid, block = c.json("args.grid"), c.json("args.block")
    dim = lambda v, k: f"TRY_CAST(TRY_CAST({v}->'$[{k}]' AS BIGINT) AS INTEGER)"  # noqa: E731
    if c.is_json("args.name") or c.is_json("args.labels"):
        value = f"json_extract_string(coalesce({c.json('args.name')}, {c.json('args.labels')}), '$')"
    else:
        value = f"coalesce({c.ref('args.name')}, {c.ref('args.labels')})"
    src = c.src
    return {
        "_kin_gpu": f"""
        SELECT {common}, {c.i("args.correlation")} AS correlation,
               TRY_CAST({c.i("args.device")} AS INTEGER) AS device, {c.i("args.stream")} AS stream,
               {dim(grid, 0)} AS grid_x, {dim(grid, 1)} AS grid_y, {dim(grid, 2)} AS grid_z,
               {dim(block, 0)} AS block_x, {dim(block, 1)} AS block_y, {dim(block, 2)} AS block_z,
               TRY_CAST({c.i("args.registers per thread")} AS INTEGER) AS regs,
               {c.i("args.shared memory")} AS smem, {c.d("args.bytes")} AS bytes, {comms},
               {c.s("args.cuda_sync_kind")} AS sync_kind
        FROM {src} WHERE {x} AND {cats(schema.GPU_CATS)}""",
        "_kin_cpu": f"""
        SELECT {common}, {c.i("args.Sequence number")} AS seq, {c.d("args.flops")} AS flops,
               {array_text("args.Input Dims")} AS input_dims, {array_text("args.Input type")} AS input_types,
               {array_text("args.Concrete Inputs")} AS concrete,
               {not_array("args.Input Dims")} OR {not_array("args.Input type")} AS bad_shapes, {comms}
        FROM {src} WHERE {x} AND {cats(_OP_CATS)}""",
        "_kin_py": f"""
        SELECT {name} AS name, {c.i("pid")} AS pid, {c.i("tid")} AS tid, {c.d("ts")} AS ts, {c.d("dur")} AS dur
        FROM {src} WHERE {x} AND {cats(_PY_CATS)}""",
        "_kin_span": f"""
        SELECT {cat} AS cat, {name} AS name, {c.d("ts")} AS ts, {c.d("dur")} AS dur
        FROM {src} WHERE {x} AND {cats(schema.SPAN_CATS + schema.OVERHEAD_CATS)}""",
        "_kin_api": f"""
        SELECT {common}, {c.i("args.correlation")} AS correlation, TRY_CAST({c.i("args.cbid")} AS INTEGER) AS cbid
        FROM {src} WHERE {x} AND {cats(schema.API_CATS)}""",
        "_kin_meta": f"""
        SELECT {c.string("pid")} AS pid, {c.string("tid")} AS tid, {name} AS name, {value} AS value
        FROM {src} WHERE {ph} = 'M' AND {name} IN ({", ".join(f"'{n}'" for n in META_NAMES)})""",
        "_kin_cats": f"""
        SELECT {cat} AS cat, count(*) AS n, count(*) FILTER (WHERE {x} AND {name} IS NULL) AS nameless
        FROM {src} GROUP BY ALL""",
        "_kin_mem": f"""
        SELECT {c.i("pid")} AS pid, {c.i("tid")} AS tid, {c.d("ts")} AS ts, {c.d("args.Memory Bytes")} AS bytes,
               {c.d("args.Total Allocated")} AS total_allocated, {c.d("args.Total Reserved")} AS total_reserved,
               TRY_CAST({c.i("args.Device Id")} AS INTEGER) AS device,
               TRY_CAST({c.i("args.Device Type")} AS INTEGER) AS device_type, {c.i("args.Addr")} AS addr
        FROM {src} WHERE {ph} = 'i' AND {name} = '[memory]'""",
    }


def read_json_sql(path: Path) -> str:
    cols = ", ".join(f"'{k}': '{v}'" for k, v in RAW_COLUMNS.items())
    p = str(path).replace("'", "''")
    return f"SELECT * FROM read_json('{p}', columns = {{{cols}}}, format = 'newline_delimited', maximum_object_size = 16777216)"


# ---------------------------------------------------------------------------------------------- the decode


def decode(path: Path, con: duckdb.DuckDBPyConnection, strict: bool = True) -> Decoded:
    """Fill the staging tables from the trace at `path` (plain or gzip). `strict=False` sends every run the
    lenient way (DuckDB's JSON reader): the reference the decoded way is tested against. The staging tables are
    created in `STAGE_DB`, on `con`'s search path from here on (`open_stages`; `drop_stages` gives it back)."""
    open_stages(con)
    # Each run's columns live only until their INSERT. Arrow's default pool (mimalloc) keeps the pages of freed
    # columns; the system allocator gives them back: ~60 MiB less peak RSS on a 100 MB trace, no slower.
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    # This thread decodes while the loader thread's INSERTs run: DuckDB gets the other cores (on two cores one
    # thread each, not three threads on two: ~10% less wall time, measured).
    row = one(con, "SELECT current_setting('threads')")
    threads = int(row[0]) if row else 1
    con.execute(f"SET threads = {max(1, min(threads, (os.cpu_count() or 2) - 1))}")
    # Each load commits on its own, and DuckDB checkpoints the staging tables after a commit that leaves more than
    # checkpoint_threshold (16 MiB) of them unwritten: while the staging tables grow, a pause every ~250 k rows,
    # longer as they grow (120 loads of 16 k GPU rows: 4.65 s, 2.08 s without). None until the decode is done: the
    # 2 GiB trace's ingest 20.6-21.0 -> 16.1-16.2 s, +33 MiB peak (benchmarks/README.md, session 27); the staging
    # tables go after `emit` anyway.
    checkpoint = one(con, "SELECT current_setting('checkpoint_threshold')")
    con.execute("SET checkpoint_threshold = '1TB'")
    try:
        return _decode(path, con, strict)
    finally:
        con.execute(f"SET threads = {threads}")
        if checkpoint:
            con.execute(f"SET checkpoint_threshold = '{checkpoint[0]}'")
        pa.set_memory_pool(previous)


def _decode(path: Path, con: duckdb.DuckDBPyConnection, strict: bool) -> Decoded:
    cols = ", ".join(f'"{k}" {v}' for k, v in RAW_COLUMNS.items())
    # The staging tables, typed by their SELECTs over an empty raw table, in `STAGE_DB`: in memory (spilling under
    # the budget), never in the store's file; the loader thread uses this same connection, one statement at a time
    # (this thread only decodes meanwhile).
    con.execute(f"CREATE OR REPLACE TEMP TABLE _kin_raw0 ({cols})")
    for table, sql in stage_selects(Columns("_kin_raw0")).items():
        con.execute(f"CREATE OR REPLACE TABLE {STAGE_DB}.main.{table} AS {sql}")
    con.execute("DROP TABLE _kin_raw0")
    lenient_sql = stage_selects(Columns("_kin_seg"))
    tmp = Path(tempfile.mkdtemp(prefix="plasmient-kineto-"))
    loader = con
    pool = ThreadPoolExecutor(max_workers=1)
    cats = _Categories()
    pending: Future[None] | None = None
    n_events = 0
    head_bytes = b"{}"
    partial = False
    top_array = False

    def load_decoded(groups: list[tuple[str, frozenset[str], list[pa.Table]]]) -> None:
        for stage, text, parts in groups:
            tbl = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            loader.register("_kin_batch", tbl)
            try:
                sql = stage_selects(Columns("_kin_batch", decoded=True, text=text), map_categories=False)[stage]
                loader.execute(f"INSERT INTO {stage} {sql}")
            finally:
                loader.unregister("_kin_batch")

    def load_lenient(run: _Run, seg_file: Path) -> None:
        # One run as NDJSON: its raw JSON columns live only until its events are typed into the staging tables.
        nonlocal n_events
        try:
            with open(seg_file, "wb") as seg:
                data = schema.normalise_keys(bytes(run.data))  # DuckDB's struct reads today's spellings only
                for part in split_events(io.BytesIO(data), chunk_bytes=BATCH_BYTES, ndjson=True):
                    if not isinstance(part, tuple):
                        seg.write(part)
                        seg.write(b"\n")
            loader.execute(f"CREATE OR REPLACE TEMP TABLE _kin_seg AS {read_json_sql(seg_file)}")
            for table, sql in lenient_sql.items():
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

    def submit(work: Callable[[], None]) -> None:
        nonlocal pending
        wait()  # at most one load running while the next runs are decoded
        pending = pool.submit(work)

    # Decoded columns wait here until LOAD_BYTES of JSON are decoded (one INSERT per staging table), or until
    # the rows of a table would change types (a field of JSON text), or a run goes the lenient way: each table
    # receives its rows in document order.
    buffered: dict[str, tuple[frozenset[str], list[pa.Table]]] = {}
    buffered_bytes = 0

    def flush() -> None:
        nonlocal buffered_bytes
        if buffered:
            groups = [(stage, text, parts) for stage, (text, parts) in buffered.items()]
            buffered.clear()
            buffered_bytes = 0
            submit(lambda: load_decoded(groups))

    cat_counts: dict[str | None, list[int]] = {}  # `_kin_cats` of the decoded runs, inserted at the end
    guess: Callable[[bytearray], _Run | None] | None = _strict if strict else None
    n_run = n_lenient = 0
    try:
        with GuardedReader(path) as stream, _Ahead(split_events(stream, chunk_bytes=BATCH_BYTES, decode=guess)) as items:
            for item in items:
                if isinstance(item, tuple):
                    if item[0] == "head":
                        head_bytes = item[1]
                    elif item[0] == "partial_tail":
                        partial = True
                    elif item[0] == "array":
                        top_array = True
                    continue
                run = item if isinstance(item, _Run) else _exact(item) if strict else _Run(item)
                tables = None
                if run.decoded:
                    with contextlib.suppress(_NotStrict):
                        tables = _tables(run, cats, cat_counts)
                n_run += 1
                if tables is None:
                    flush()
                    n_lenient += 1
                    submit(lambda r=run, f=tmp / f"events-{n_run}.ndjson": load_lenient(r, f))  # type: ignore[misc]
                    continue
                n_events += run.count
                if any(stage in buffered and buffered[stage][0] != text for stage, (_, text) in tables.items()):
                    flush()
                for stage, (tbl, text) in tables.items():
                    buffered.setdefault(stage, (text, []))[1].append(tbl)
                buffered_bytes += len(run.data)
                del run  # the run's objects go as soon as its columns are built
                if buffered_bytes >= LOAD_BYTES:
                    flush()
            flush()
            wait()
        if cat_counts:
            con.register(
                "_kin_batch",
                pa.table(
                    {
                        "cat": pa.array(list(cat_counts), pa.string()),
                        "n": pa.array([v[0] for v in cat_counts.values()], pa.int64()),
                        "nameless": pa.array([v[1] for v in cat_counts.values()], pa.int64()),
                    }
                ),
            )
            try:
                con.execute("INSERT INTO _kin_cats SELECT cat, n, nameless FROM _kin_batch")
            finally:
                con.unregister("_kin_batch")
    except SplitError as e:
        raise BadInput(path, f"{e}: not a PyTorch profiler trace" if "truncated" not in str(e) else str(e)) from None
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):  # already failing; the first error is the one reported
                pending.result()
        pool.shutdown(wait=True)
        cats.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return Decoded(
        head=head_bytes, events=n_events, partial_tail=partial, top_is_array=top_array, runs=n_run, lenient_runs=n_lenient
    )


class _Ahead:
    """The splitter's items made on a thread of their own, at most `depth` ahead of this one: the file is read,
    cut into runs and scanned (the native scan lets go of the GIL) there, while this thread builds the previous
    runs' Arrow tables and the loader thread inserts earlier ones. Measured on the 100 MiB trace: the decode's
    three stages (scan 0.23, tables 0.21, INSERTs 0.28 CPU-s) ran as two, the scan and the tables one after the
    other. Items come in order; what the iterator raises is raised here, in its place. Leaving the `with` stops
    the thread (and closes the iterator there) before the file it reads is closed."""

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), name="plasmient-split", daemon=True)

    def __enter__(self) -> Iterator[Any]:
        self._thread.start()
        return self._items()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((0, item)):
                    return
            self._put((1, None))
        except BaseException as e:  # handed to the consuming thread, raised there
            self._put((2, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _put(self, entry: tuple[int, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _items(self) -> Iterator[Any]:
        while True:
            kind, item = self._queue.get()
            if kind == 0:
                yield item
            elif kind == 1:
                return
            else:
                raise item


def open_stages(con: duckdb.DuckDBPyConnection) -> str:
    """Attach the staging tables' database (`STAGE_DB`) and put it on `con`'s search path, after the store's own
    database (a connection or cursor of the store: a cursor is given the path again). Returns the search path it
    had, for `drop_stages`."""
    con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {STAGE_DB}")
    row = one(con, "SELECT current_setting('search_path'), current_database()")
    previous, db = (str(row[0]), str(row[1])) if row else ("", "memory")
    path = f'"{db}".main,{STAGE_DB}.main'.replace("'", "''")
    con.execute(f"SET search_path = '{path}'")
    return previous


def drop_stages(con: duckdb.DuckDBPyConnection, search_path: str | None = None) -> None:
    """Drop the staging tables; with `search_path` (what `open_stages` returned), give `con` its path back."""
    for stage in STAGES:
        con.execute(f"DROP TABLE IF EXISTS {STAGE_DB}.main.{stage}")
    if search_path is not None:
        con.execute(f"SET search_path = '{search_path.replace(chr(39), chr(39) * 2)}'")


def _duck_msg(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:300]
