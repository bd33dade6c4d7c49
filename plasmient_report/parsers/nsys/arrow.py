"""Nsight Systems Arrow-family exports (`nsys export --type parquetdir | arrowdir | arrow`) served as the same
tables as the SQLite export, so the nsys parser's SQL runs unchanged on them.

Tables are read with pyarrow (parquet files, Arrow IPC streams memory-mapped: no copy) and typed the way the
SQLite reader types them; DuckDB serves the small metadata queries. Only regular files are read: a FIFO or a
device named like a table would block or never end. nsys writes `NVTX_EVENTS.binaryData` as a
string column holding raw bytes, so it is read as binary, and other invalid UTF-8 is replaced, never fatal.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ...errors import BadInput
from .reader import BATCH_ROWS, Col, Export, valid_utf8

# Tables whose presence marks a folder as an nsys export (any one of them; StringIds is always exported).
MARKER_TABLES = ("StringIds", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME")
ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
ARROW_FILE_MAGIC = b"ARROW1"


def export_kind(path: Path) -> str | None:
    """`nsys-parquetdir` / `nsys-arrow` when the path is such an export (a folder of `<table>.parquet` /
    `<table>.arrow` files, or one `.arrows` stream of all tables), else None. Reads names and a few bytes only."""
    try:
        if path.is_dir():
            names = {p.name for p in path.iterdir()}
            if any(f"{t}.parquet" in names for t in MARKER_TABLES):
                return "nsys-parquetdir"
            if any(f"{t}.arrow" in names for t in MARKER_TABLES):
                return "nsys-arrow"
            return None
        if not _regular(path):  # never open a FIFO: it would block
            return None
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.startswith(ARROW_STREAM_MAGIC) and b"table_name" in head and any(t.encode() in head for t in MARKER_TABLES):
        # one table of an arrowdir (its StringIds.arrow) is no export of its own: its folder is
        return None if path.suffix == ".arrow" and export_kind(path.parent) else "nsys-arrow"
    return None


def _regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(p.stat().st_mode)
    except OSError:
        return False


@dataclass
class _Table:
    schema: pa.Schema
    batches: Callable[[list[str]], Iterator[pa.RecordBatch]]  # the named columns, BATCH_ROWS rows at a time


def _ipc_tables(path: Path) -> list[pa.Table]:
    """Every table of an Arrow IPC file: nsys writes streams one after another (`.arrows`, and each
    `_arwdir/*.arrow`); the Arrow file format (`ARROW1`) is read too. Memory-mapped: the buffers stay in the file."""
    src = pa.memory_map(str(path))
    if src.read(6) == ARROW_FILE_MAGIC:
        src.seek(0)
        return [ipc.open_file(src).read_all()]
    src.seek(0)
    out = []
    while src.tell() < src.size():
        out.append(ipc.open_stream(src).read_all())
    return out


def _table_batches(t: pa.Table) -> Callable[[list[str]], Iterator[pa.RecordBatch]]:
    def batches(cols: list[str]) -> Iterator[pa.RecordBatch]:
        yield from t.select(cols).to_batches(max_chunksize=BATCH_ROWS)

    return batches


def _parquet_file(path: Path) -> Any:
    """pyarrow's ParquetFile; pyarrow.parquet imported here, by a parquetdir export only (every run imports this
    module: ~16 ms and 7 MiB resident for a reader the other inputs never use)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(str(path))


def _parquet_batches(path: Path) -> Callable[[list[str]], Iterator[pa.RecordBatch]]:
    def batches(cols: list[str]) -> Iterator[pa.RecordBatch]:
        yield from _parquet_file(path).iter_batches(batch_size=BATCH_ROWS, columns=cols)

    return batches


_ARROW_TYPE = {"i": pa.int64(), "s": pa.string(), "f": pa.float64(), "b": pa.binary()}


def _typed(a: pa.Array, typ: str) -> pa.Array:
    """One column as the SQLite reader types it: integers as int64 (uint64 ids keep their bits, as SQLite stores
    them), reals truncated for integer columns, text as text; a value of the wrong kind (text in a number column)
    is NULL. `b` (blobs): the bytes, whatever the column's declared type."""
    t = a.type
    if typ == "b":
        if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
            return a.view(pa.large_binary()).cast(pa.binary())
        if pa.types.is_string(t) or pa.types.is_binary(t):
            return a.view(pa.binary())
        return pa.nulls(len(a), pa.binary())
    if typ == "s":
        if pa.types.is_large_string(t) or pa.types.is_string(t):
            a = valid_utf8(pa.RecordBatch.from_arrays([a.cast(pa.string())], ["v"])).column(0)
            return a
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return a.cast(pa.string())
        return pa.nulls(len(a), pa.string())
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t):
        return a.cast(_ARROW_TYPE[typ], safe=False)
    return pa.nulls(len(a), _ARROW_TYPE[typ])


class ArrowExport(Export):
    """One parquetdir / arrowdir / arrow-stream export with the SQLite Export's interface: `columns`, `table`,
    `has`, `rows` (DuckDB SQL over the small tables) and `scan` (typed Arrow batches of one table)."""

    is_sqlite = False

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.format = kind
        self._tables: dict[str, _Table] = {}
        try:
            if path.is_dir():
                for p in sorted(path.iterdir()):
                    if p.suffix in (".parquet", ".arrow") and not _regular(p):
                        raise BadInput(
                            p,
                            "a table of this nsys export is not a regular file (a pipe, socket or "
                            "device): give an export of plain files",
                        )
                    if p.suffix == ".parquet":
                        self._tables[p.stem] = _Table(_parquet_file(p).schema_arrow, _parquet_batches(p))
                    elif p.suffix == ".arrow":
                        for t in _ipc_tables(p):
                            self._add(t, p.stem)
            else:
                if not _regular(path):
                    raise BadInput(path, "not a regular file (a pipe, socket or device)")
                for t in _ipc_tables(path):
                    self._add(t, None)
        except (pa.ArrowException, OSError) as e:
            raise BadInput(path, f"not a readable nsys {kind.removeprefix('nsys-')} export ({e})") from None
        self.columns: dict[str, list[str]] = {n: list(t.schema.names) for n, t in self._tables.items()}
        self._duck: duckdb.DuckDBPyConnection | None = None
        self._registered: set[str] = set()

    def _add(self, t: pa.Table, default_name: str | None) -> None:
        meta = t.schema.metadata or {}
        name = meta.get(b"table_name", b"").decode("utf-8", "replace") or default_name
        if not name:
            return
        if name in self._tables:  # a table written in several streams: one table
            prev = self._tables[name]
            parts = [pa.Table.from_batches(list(prev.batches(prev.schema.names)), prev.schema), t]
            t = pa.concat_tables(parts, promote_options="permissive")
        self._tables[name] = _Table(t.schema, _table_batches(t))

    def scan(self, table: str, cols: Sequence[Col], where: str | None = None) -> tuple[Any, pa.RecordBatchReader]:
        """The table's columns named and typed as `cols` (absent ones NULL), with `_s = 1` as the SQLite reader
        gives it; `where` is DuckDB SQL over the output names."""
        src_table = self._tables[table]
        have = set(src_table.schema.names)
        picks = [(c, next((s for s in c.src if s in have), None)) for c in cols]
        wanted = list(dict.fromkeys(s for _, s in picks if s))
        out_schema = pa.schema([("_s", pa.int64())] + [(c.out, _ARROW_TYPE[c.typ]) for c in cols])

        def batches() -> Iterator[pa.RecordBatch]:
            for b in src_table.batches(wanted):
                n = b.num_rows
                arrays = [pa.array(np.ones(n, np.int64))]
                arrays += [_typed(b.column(s), c.typ) if s else pa.nulls(n, _ARROW_TYPE[c.typ]) for c, s in picks]
                yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)

        rdr = pa.RecordBatchReader.from_batches(out_schema, batches())
        if not where:
            return None, rdr
        duck = self._db()
        duck.register("_nsys_raw", rdr)
        return None, duck.sql(f"SELECT * FROM _nsys_raw WHERE {where}").to_arrow_reader(BATCH_ROWS)

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        """DuckDB runs the query over the tables it names (read whole: metadata, enums, GPU names — small)."""
        duck = self._db()
        for name in set(re.findall(r'"([^"]+)"', sql)) | set(re.findall(r"\b(\w+)\b", sql)):
            if name in self._tables and name not in self._registered:
                t = self._tables[name]
                cols = t.schema.names
                batch_list = [
                    pa.RecordBatch.from_arrays(
                        [
                            _typed(b.column(i), "s")
                            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                            else b.column(i)
                            for i, f in enumerate(b.schema)
                        ],
                        cols,
                    )
                    for b in t.batches(cols)
                ]
                duck.register(name, pa.Table.from_batches(batch_list) if batch_list else pa.table({c: pa.nulls(0) for c in cols}))
                self._registered.add(name)
        try:
            return duck.execute(sql, list(params)).fetchall()
        except duckdb.Error as e:
            raise BadInput(self.path, f"cannot read the export ({str(e).splitlines()[0]})") from None

    def _db(self) -> duckdb.DuckDBPyConnection:
        if self._duck is None:
            self._duck = duckdb.connect(
                config={"autoinstall_known_extensions": False, "autoload_known_extensions": False, "threads": 1}
            )
        return self._duck

    def adbc(self) -> Any:
        # Every read of an Arrow-family export goes through scan() / rows(); only the SQLite Export has a
        # driver connection, so reaching this is a programming error, not an unfinished feature.
        raise TypeError(f"{self.path}: an nsys Arrow-family export is read with scan(), not through SQLite")

    def close(self) -> None:
        if self._duck is not None:
            self._duck.close()
            self._duck = None
