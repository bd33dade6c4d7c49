"""Reading an Nsight Systems SQLite export as SQLite itself reads it, read-only, and the column plumbing every
export shares (`Col`, typed SELECTs, Arrow batches into DuckDB staging tables).

SQLite semantics are kept, never bypassed: the file is opened `mode=ro` (not `immutable`), so another process's
lock is respected (one clear line when it holds the database), and a database with side files is recovered the
way SQLite recovers it — committed frames of a `-wal` applied, a hot `-journal` rolled back — on a private copy:
the input and its side files are never written (a read-only connection would otherwise write the `-shm`).
Only tables are read (a view, even an endlessly recursive one, never is). Tables are read from the file's pages
(`Pages`, `_sqlpages.c`) only where the file alone is the database SQLite reads (rollback-journal mode, no side
file) and only under SQLite's own shared lock, held by a read transaction: the same rows SQLite gives, or the
driver reads them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import adbc_driver_manager
import duckdb
import numpy as np
import pyarrow as pa

from ...errors import BadInput
from ...store import one

_native: Any
try:  # the page reader (_sqlpages.c); where it is not built, every table goes through the driver
    from . import _sqlpages as _native
except ImportError:  # pragma: no cover - a build without a C compiler
    _native = None

BATCH_ROWS = 65_536
LOCK_TIMEOUT_S = 2.0  # how long to wait for another process's lock before saying so
SIDE_FILES = ("-wal", "-journal")
SQLITE_MAGIC = b"SQLite format 3\x00"
ROWID_MIN, ROWID_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Col:
    """One column to read: the output name, the source column(s) tried in order, and its type (i, s, f, b: blob)."""

    out: str
    src: tuple[str, ...]
    typ: str = "i"


def c(out: str, *src: str, typ: str = "i") -> Col:
    return Col(out, src or (out,), typ)


class Export:
    """A read-only view of one export: which tables and columns exist, and the two readers (`rows` for small
    tables, `scan` for event tables as Arrow batches). `arrow.ArrowExport` serves parquetdir / arrow exports
    through the same interface."""

    is_sqlite = True
    format = "nsys-sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notes: list[str] = []
        self._copy_dir: Path | None = None
        self._adbc: Driver | None = None
        db = self._recovered(path)
        self.db = db  # the file SQLite reads: the input, or the copy it recovered
        self.uri = f"file:{quote(str(db.resolve()))}?mode=ro"
        try:
            self.sq = sqlite3.connect(self.uri, uri=True, timeout=LOCK_TIMEOUT_S)
            self.sq.text_factory = bytes  # TARGET_INFO_SYSTEM_ENV values can be invalid UTF-8
            names = [text(n) for (n,) in self.sq.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
            self.columns: dict[str, list[str]] = {}
            for n in names:
                cols = self.sq.execute(f'PRAGMA table_info("{n.replace(chr(34), chr(34) * 2)}")').fetchall()
                self.columns[n] = [text(c[1]) for c in cols]
        except sqlite3.OperationalError as e:
            self.close()
            if "locked" in str(e).lower() or "busy" in str(e).lower():
                raise BadInput(
                    path,
                    "the database is locked by another process (is an export or a writer still "
                    "running?): try again when it is done",
                ) from None
            raise BadInput(path, f"not a readable SQLite database ({e})") from None
        except sqlite3.DatabaseError as e:
            self.close()
            raise BadInput(path, f"not a readable SQLite database ({e})") from None
        except UnicodeDecodeError:  # SQLite's message about a damaged schema, quoting bytes that are not UTF-8
            self.close()
            raise BadInput(path, "not a readable SQLite database (its schema is damaged)") from None

    def _recovered(self, path: Path) -> Path:
        """The file to read: the input itself, or — when SQLite would have to write to read it (committed frames
        in a `-wal`, a hot `-journal`) — a private copy it recovered. Decided the way SQLite decides: a journal
        is hot only when no process holds the database (a read-only open then fails with a read-only error)."""
        wal, journal = (Path(str(path) + s) for s in SIDE_FILES)
        has_wal = _nonempty(wal)
        if not has_wal and not _nonempty(journal):
            return path
        if not has_wal:
            try:
                probe = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)
                try:
                    probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
                    return path  # a journal SQLite does not need to roll back (not hot)
                finally:
                    probe.close()
            except sqlite3.OperationalError as e:
                why = str(e).lower()
                if "locked" in why or "busy" in why:
                    raise BadInput(
                        path,
                        "the database is locked by another process (is an export or a writer "
                        "still running?): try again when it is done",
                    ) from None
                if "readonly" not in why and "read-only" not in why:  # SQLITE_READONLY_ROLLBACK: a hot journal
                    raise BadInput(path, f"not a readable SQLite database ({e})") from None
            except sqlite3.DatabaseError as e:
                raise BadInput(path, f"not a readable SQLite database ({e})") from None
        self._copy_dir = Path(tempfile.mkdtemp(prefix="plasmient-sqlite-"))
        copy = self._copy_dir / "export.sqlite"
        try:
            shutil.copyfile(path, copy)
            side = wal if has_wal else journal
            shutil.copyfile(side, Path(str(copy) + ("-wal" if has_wal else "-journal")))
            rec = sqlite3.connect(str(copy), timeout=LOCK_TIMEOUT_S)
            try:
                rec.execute("SELECT count(*) FROM sqlite_master").fetchone()  # SQLite recovers on first read
                if has_wal:
                    rec.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    rec.execute("PRAGMA journal_mode = DELETE")
            finally:
                rec.close()
        except (OSError, sqlite3.DatabaseError) as e:
            raise BadInput(
                path, f"cannot recover the database from its {'-wal' if has_wal else '-journal'} file on a copy ({e})"
            ) from None
        self.notes.append(
            "its -wal file's committed transactions applied (on a copy; the input is untouched)"
            if has_wal
            else "a hot -journal left by an interrupted writer rolled back (on a copy; the input is untouched)"
        )
        return copy

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

    def adbc(self) -> Driver:
        if self._adbc is None:
            self._adbc = Driver(self.uri)
        return self._adbc

    def connect_another(self) -> Driver:
        """A second driver connection to the same file (for reading chunks of a table in parallel)."""
        return Driver(self.uri)

    def close(self) -> None:
        with contextlib.suppress(AttributeError, sqlite3.Error):
            self.sq.close()
        if self._adbc is not None:
            with contextlib.suppress(Exception):
                self._adbc.close()
            self._adbc = None
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None


class Pages:
    """A table's columns (numbers, text, blobs) read from the file's pages (`_sqlpages.c`), under a read transaction
    that keeps any writer out meanwhile: ~10x faster than through the driver (the 486 MiB export's 12.6 M GPU_METRICS
    rows 0.5 s, 4.9 s through ADBC), the same rows, values and NULLs. Only where the file is the database as SQLite reads it — a
    rollback-journal file with no -wal or -journal beside it — and the table a plain rowid table (no hidden or
    generated columns, none of those read in its primary key, so none the rowid itself). A range holding anything
    the reader leaves to SQLite (see `_sqlpages.c`) reads None: the caller reads it through the driver, as before.
    `open` gives None where the reader is not built or the file or table does not qualify."""

    def __init__(self, lock: sqlite3.Connection, fd: int, geometry: tuple[int, int, int], root: int, cols: list[int], kinds: str):
        self.lock, self.fd = lock, fd
        self.kinds = kinds
        self.args = (*geometry, root, cols, kinds.encode())  # geometry: page size, usable bytes per page, pages

    @staticmethod
    def open(ex: Export, table: str, columns: Sequence[str], kinds: str) -> Pages | None:
        """`columns` by name, each read as its kind in `kinds` (`_sqlpages.c`: 'i' an integer, 'f' a number as a
        double, 's' text, 'b' a blob)."""
        if _native is None or not ex.is_sqlite or not 0 < len(columns) <= _native.MAX_COLS:
            return None
        if any(_nonempty(Path(str(ex.db) + s)) for s in SIDE_FILES):
            return None
        lock = None
        fd = -1
        try:
            lock = sqlite3.connect(ex.uri, uri=True, timeout=LOCK_TIMEOUT_S, check_same_thread=False)
            lock.execute("BEGIN")
            row = lock.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", [table]).fetchone()
            info = lock.execute(f"PRAGMA table_xinfo({_quoted(table)})").fetchall()
            names = [str(r[1]).lower() for r in info]
            if not row or not isinstance(row[0], int) or any(r[6] for r in info) or any(x.lower() not in names for x in columns):
                raise LookupError
            cols = [names.index(x.lower()) for x in columns]
            if any(info[i][5] for i in cols):  # part of the primary key: maybe the rowid itself, not in the record
                raise LookupError
            fd = os.open(ex.db, os.O_RDONLY)
            head = os.pread(fd, 100, 0)  # read under the transaction: the file as SQLite reads it now
            if len(head) < 100 or head[:16] != SQLITE_MAGIC or head[18] != 1 or head[19] != 1:
                raise LookupError  # (WAL mode: pages may live in the -wal)
            if set(kinds) & {"s", "b"} and int.from_bytes(head[56:60], "big") != 1:
                raise LookupError  # text not in UTF-8
            page_size = int.from_bytes(head[16:18], "big")
            page_size = 65536 if page_size == 1 else page_size
            usable = page_size - head[20]
            if page_size < 512 or page_size & (page_size - 1) or usable < 480:
                raise LookupError
            n_pages = os.fstat(fd).st_size // page_size
            in_header = int.from_bytes(head[28:32], "big")
            if in_header and head[24:28] == head[92:96]:  # the header's size, where valid, is SQLite's
                n_pages = min(n_pages, in_header)
            return Pages(lock, fd, (page_size, usable, n_pages), row[0], cols, kinds)
        except (LookupError, OSError, sqlite3.Error):
            if fd >= 0:
                os.close(fd)
            if lock is not None:
                lock.close()
            return None

    def read(self, rowids: tuple[int, int] | None, schema: pa.Schema) -> pa.Table | None:
        """The rows whose rowid is in `rowids` (inclusive; None: all), as `schema` (one field per column: int64 or
        float64, large_string for 's' — invalid UTF-8 replaced, as `valid_utf8` does for the driver's —, large_binary
        for 'b'), or None (see the class)."""
        lo, hi = rowids if rowids else (ROWID_MIN, ROWID_MAX)
        got = _native.read(self.fd, *self.args, lo, hi)
        if got is None:
            return None
        n, bufs, masks, datas = got
        arrays = []
        for f, b, m, d in zip(schema, bufs, masks, datas, strict=True):
            valid = None if m is None else pa.py_buffer(np.packbits(np.frombuffer(m, np.bool_), bitorder="little"))
            arrays.append(pa.Array.from_buffers(f.type, n, [valid, pa.py_buffer(b)] + ([] if d is None else [pa.py_buffer(d)])))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        return pa.Table.from_batches([valid_utf8(batch) if "s" in self.kinds else batch], schema)

    def close(self) -> None:
        os.close(self.fd)
        self.lock.close()


class Driver:
    """A connection of the ADBC SQLite driver, through its own API (`adbc_driver_manager`), not its DB-API module:
    that module registers a polars backend whenever polars can be imported, and importing polars costs every nsys
    run ~0.1 s and ~45 MiB resident (parsers/_polars.py) for Arrow the tool never asks of it. As the DB-API module
    connects: autocommit off (the connection reads in one transaction)."""

    def __init__(self, uri: str) -> None:
        import adbc_driver_sqlite

        self._db = adbc_driver_sqlite.connect(uri)
        try:
            self._conn = adbc_driver_manager.AdbcConnection(self._db)
            self._conn.set_autocommit(False)
        except BaseException:
            self._db.close()
            raise

    def cursor(self) -> Cursor:
        return Cursor(self._conn)

    def close(self) -> None:
        try:
            with contextlib.suppress(adbc_driver_manager.Error):
                self._conn.rollback()
            self._conn.close()
        finally:
            self._db.close()


class Cursor:
    """One statement of a `Driver`: `execute`, then its rows as an Arrow stream or table; `close` after reading."""

    def __init__(self, conn: Any) -> None:
        self._stmt = adbc_driver_manager.AdbcStatement(conn)
        with contextlib.suppress(adbc_driver_manager.Error):  # older drivers: their default batch size
            self._stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        self._stream: Any = None

    def execute(self, sql: str) -> None:
        self._stmt.set_sql_query(sql)
        self._stream, _ = self._stmt.execute_query()

    def fetch_record_batch(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader._import_from_c(self._stream.address)

    def fetch_arrow_table(self) -> pa.Table:
        return self.fetch_record_batch().read_all()

    def close(self) -> None:
        self._stmt.close()


def _nonempty(p: Path) -> bool:
    try:
        return p.stat().st_size > 0 and os.path.isfile(p)
    except OSError:
        return False


def text(v: object) -> str:
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
    head = ", ".join(f'{_SENTINEL[c.typ]} AS "{c.out}"' for c in cols)
    body = []
    for c in cols:
        src = next((s for s in c.src if ex.has(table, s)), None)
        body.append(f'{_typed(src, c.typ)} AS "{c.out}"' if src else f'NULL AS "{c.out}"')
    sql = f'SELECT 0 AS _s, {head} UNION ALL SELECT 1, {", ".join(body)} FROM "{table}"'
    return sql + (f" WHERE {where}" if where else "")


def _typed(col: str, typ: str) -> str:
    if typ == "i":
        return f'CASE typeof("{col}") WHEN \'integer\' THEN "{col}" WHEN \'real\' THEN CAST("{col}" AS INTEGER) END'
    if typ == "f":
        return f'CASE typeof("{col}") WHEN \'real\' THEN "{col}" WHEN \'integer\' THEN CAST("{col}" AS REAL) END'
    if typ == "b":
        return f'CASE typeof("{col}") WHEN \'blob\' THEN "{col}" WHEN \'text\' THEN CAST("{col}" AS BLOB) END'
    return f'CAST("{col}" AS TEXT)'


def valid_utf8(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Replace invalid UTF-8 in string columns (rare: only then is a column decoded in Python)."""
    arrays = []
    changed = False
    for a in batch.columns:
        if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
            try:
                a.validate(full=True)
            except pa.ArrowInvalid:
                raw = a.view(pa.large_binary() if pa.types.is_large_string(a.type) else pa.binary()).to_pylist()
                a = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw], a.type)
                changed = True
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema) if changed else batch


def _reader(ex: Export, sql: str) -> tuple[Any, pa.RecordBatchReader]:
    cur = ex.adbc().cursor()
    cur.execute(sql)
    rdr = cur.fetch_record_batch()
    if any(pa.types.is_string(f.type) for f in rdr.schema):
        src = rdr

        def batches() -> Iterator[pa.RecordBatch]:
            for b in src:
                yield valid_utf8(b)

        rdr = pa.RecordBatchReader.from_batches(src.schema, batches())
    return cur, rdr


def _stage_as_stored(
    con: duckdb.DuckDBPyConnection, ex: Export, name: str, table: str, cols: Sequence[Col], where: str | None
) -> bool:
    """The fast path of `stage` through the driver for a table of integer columns: read as stored, without the
    per-value CASE of `_select_sql` (half the read of a kernel or runtime table). Taken only when every value is
    what the typed read would give unchanged — the driver types the columns as integers and fails on a value of
    another kind (a real, text, a blob) —; False (nothing staged) otherwise, and the typed read runs."""
    picks = [(c, next((s for s in c.src if ex.has(table, s)), None)) for c in cols]
    present = [(c, s) for c, s in picks if s]
    if not present:
        return False
    sql = f"SELECT {', '.join(f'{_quoted(s)} AS {_quoted(c.out)}' for c, s in present)} FROM {_quoted(table)}"
    cur = ex.adbc().cursor()
    try:
        cur.execute(sql + (f" WHERE {where}" if where else ""))
        rdr = cur.fetch_record_batch()
        if not all(pa.types.is_integer(f.type) for f in rdr.schema):
            return False
        select = ", ".join(
            f"{_quoted(c.out)}::BIGINT AS {_quoted(c.out)}" if s else f"NULL::BIGINT AS {_quoted(c.out)}" for c, s in picks
        )
        con.register("_nsys_in", rdr)
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {select} FROM _nsys_in")
        finally:
            con.unregister("_nsys_in")
        return True
    except (duckdb.Error, OSError, pa.ArrowException, sqlite3.Error, adbc_driver_manager.Error):
        # a value of another kind (the driver's type mismatch), or any other failure: the typed read decides
        con.execute(f"DROP TABLE IF EXISTS {name}")
        return False
    finally:
        cur.close()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def rowid_ranges(ex: Export, table: str, rows: int) -> list[tuple[int, int] | None]:
    """rowid ranges of about `rows` rows (a rowid range is a b-tree range in SQLite: no full scan); one unbounded
    range for small tables or tables without rowid, and for Arrow-family exports (streamed)."""
    if not ex.is_sqlite:
        return [None]
    try:
        ((lo,),) = ex.rows(f"SELECT min(rowid) FROM {_quoted(table)}")
        ((hi,),) = ex.rows(f"SELECT max(rowid) FROM {_quoted(table)}")
    except sqlite3.DatabaseError:
        return [None]
    if lo is None or hi is None or hi - lo < rows:
        return [None]
    n_chunks = (hi - lo) // rows + 1
    # Sparse rowids (an edited or hostile file) ask for more ranges than there are rows: then no more chunks than the
    # rows need. Counted only when the file could not hold that many rows: a count scans the table (0.48 s for the
    # 49.8 M rows of a 1.9 GiB export), its size in bytes is known.
    if n_chunks > 64 and n_chunks > _most_rows(ex) // rows + 1:
        ((count,),) = ex.rows(f"SELECT count(*) FROM {_quoted(table)}")
        n_chunks = min(n_chunks, count // rows + 1)
    stride = -(-(hi - lo + 1) // n_chunks)
    return [(a, min(a + stride - 1, hi)) for a in range(lo, hi + 1, stride)]


# The fewest bytes of its file a row of a SQLite table of four columns or more takes: a leaf cell's 2-byte pointer,
# its payload size and rowid (a byte each at least) and its record header (a byte, and one per column); a value 0 or
# 1 takes none. (9 in all: 8 errs towards more rows, so towards not counting.)
MIN_SQLITE_ROW_BYTES = 8


def _most_rows(ex: Export) -> int:
    """The most rows a table of four columns or more could hold in the file: its pages' bytes over
    MIN_SQLITE_ROW_BYTES."""
    try:
        ((pages,),) = ex.rows("PRAGMA page_count")
        ((size,),) = ex.rows("PRAGMA page_size")
    except (sqlite3.DatabaseError, ValueError):
        return 0
    return int(pages) * int(size) // MIN_SQLITE_ROW_BYTES


STAGE_CHUNK_ROWS = 262_144  # rows of a table staged from its pages at once (a rowid range)
_TYPES = {"i": "BIGINT", "s": "VARCHAR", "f": "DOUBLE", "b": "BLOB"}
_ARROW_TYPES = {"i": pa.int64(), "f": pa.float64(), "s": pa.large_string(), "b": pa.large_binary()}


def _staged_from_pages(
    con: duckdb.DuckDBPyConnection, ex: Export, name: str, table: str, cols: Sequence[Col], where: str | None
) -> bool:
    """`stage` from the file's pages (`Pages`): the rows and values the typed read (`_select_sql`) gives — text and
    blobs as stored, invalid UTF-8 replaced as `valid_utf8` does, NULLs —, 5-10x faster (NVTX_EVENTS' 346 k rows
    with their text). False (nothing staged) where the page reader leaves the table to SQLite: a value the typed
    read would convert (a real in an integer column, a number in a text column, text in a number column), or a
    file or table it does not read."""
    picks = [(col, next((s for s in col.src if ex.has(table, s)), None)) for col in cols]
    present = [(col, s) for col, s in picks if s]
    if where and any(col.out != s for col, s in present):
        return False  # (`where` names the export's columns; DuckDB sees them under their output names)
    pages = Pages.open(ex, table, [s for _, s in present], "".join(col.typ for col, _ in present)) if present else None
    if pages is None:
        return False
    schema = pa.schema([(col.out, _ARROW_TYPES[col.typ]) for col, _ in present])
    try:
        ranges = rowid_ranges(ex, table, STAGE_CHUNK_ROWS)
        first = pages.read(ranges[0], schema)
        if first is None:
            return False
        select = ", ".join(
            f"{_quoted(col.out)}::{_TYPES[col.typ]} AS {_quoted(col.out)}"
            if s
            else f"NULL::{_TYPES[col.typ]} AS {_quoted(col.out)}"
            for col, s in picks
        )
        query = f"SELECT {select} FROM _nsys_in" + (f" WHERE {where}" if where else "")
        _load(con, first, f"CREATE OR REPLACE TEMP TABLE {name} AS {query}")
        del first
        for rowids in ranges[1:]:  # a large table a range at a time: memory bounded by a range's columns
            part = pages.read(rowids, schema)
            if part is None:
                con.execute(f"DROP TABLE IF EXISTS {name}")
                return False
            _load(con, part, f"INSERT INTO {name} {query}")
    except duckdb.Error:  # (the driver's read then says what is wrong, as it always did)
        con.execute(f"DROP TABLE IF EXISTS {name}")
        return False
    finally:
        pages.close()
    return True


def _load(con: duckdb.DuckDBPyConnection, rows: pa.Table, sql: str) -> None:
    con.register("_nsys_in", rows)
    try:
        con.execute(sql)
    finally:
        con.unregister("_nsys_in")


def stage(
    con: duckdb.DuckDBPyConnection, ex: Export, name: str, table: str | None, cols: Sequence[Col], where: str | None = None
) -> int:
    """Stream one export table into a DuckDB temp table `name` (empty, same columns, when the table is absent):
    from the file's pages where they can be read (`_staged_from_pages`), else through the driver. `where`, a
    condition on the export's columns, is evaluated by SQLite or by DuckDB: it must mean the same in both."""
    if table is None:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT "
            + ", ".join(f'NULL::{_TYPES[c.typ]} AS "{c.out}"' for c in cols)
            + " WHERE false"
        )
        return 0
    if ex.is_sqlite and _staged_from_pages(con, ex, name, table, cols, where):
        row = one(con, f"SELECT count(*) FROM {name}")
        return int(row[0]) if row else 0
    if ex.is_sqlite and all(c.typ == "i" for c in cols) and _stage_as_stored(con, ex, name, table, cols, where):
        row = one(con, f"SELECT count(*) FROM {name}")
        return int(row[0]) if row else 0
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
