"""The store: one DuckDB database per run, created from schema.sql.

Every stage reads and writes these tables and nothing else (SPEC §2). A run's store is a DuckDB file from the
start (in the run's private temporary folder, with its spill files): it becomes the output run.duckdb by a
checkpoint and a move, never by copying the tables.
"""

from __future__ import annotations

import contextvars
import ctypes
import errno
import functools
import os
import re
import shutil
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

import duckdb

from . import interrupt

TABLES = (
    "sources",
    "devices",
    "kernels",
    "ops",
    "api_calls",
    "syncs",
    "ranges",
    "collectives",
    "counters",
    "ncu_kernels",
    "windows",
    "metrics",
    "losses",
    "findings",
)


def schema_sql() -> str:
    return resources.files("plasmient_report").joinpath("schema.sql").read_text(encoding="utf-8")


_COMMENT_STMT_RE = re.compile(
    r"^COMMENT ON (?:TABLE|VIEW|COLUMN) [a-z_][a-z0-9_.]* IS '(?:[^']|'')*';[ \t]*$", re.IGNORECASE | re.MULTILINE
)


def schema_parts() -> tuple[str, str]:
    """schema.sql as its tables and its `COMMENT ON` statements. Each comment alters its table's catalog entry:
    the 228 of them take ~40 ms, the tables ~6 ms."""
    text = schema_sql()
    return _COMMENT_STMT_RE.sub("", text), "\n".join(m.group(0) for m in _COMMENT_STMT_RE.finditer(text))


_threads: ContextVar[int | None] = ContextVar("plasmient_store_threads", default=None)


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Stores opened inside use `n` DuckDB threads (None: DuckDB's default, one per core). One thread makes a
    run reproducible to the last digit — parallel sums add in varying order — and is what `batch` uses, where
    the parallelism is across runs."""
    token = _threads.set(n)
    try:
        yield
    finally:
        _threads.reset(token)


# A file store is attached under this name (and made the default database of its connection and cursors).
STORE_DB = "store"
# Rows per row group in a file store (DuckDB's default: 122,880). DuckDB gives a scan one task per row group, and
# a run's tables are ~10-500 k rows: with the default most statements ran on one core of two. 16 Ki rows: the
# 100 MiB trace's run 4.6 -> 4.1 s (measured, benchmarks/README.md, session 11).
STORE_ROW_GROUP_ROWS = 16384


def connect(
    path: str | Path | None = None,
    memory_limit_bytes: int | None = None,
    temp_dir: Path | None = None,
    comments: bool = True,
) -> duckdb.DuckDBPyConnection:
    """Open (or create) a store. Extensions are never auto-installed: everything ships with the wheel.

    With `comments=False` the tables are created without schema.sql's comments, which `finish` adds before the
    store becomes run.duckdb (`save`): the run's store (`connect_run`) so spends ~40 ms of catalog changes at its
    end, beside report.html's drawing, not at its start.

    With `memory_limit_bytes`, DuckDB keeps its buffers (tables included, in-memory stores too) under that
    size and spills the rest to `temp_dir` — the bounded-memory mode for traces of many GB.

    A file store is attached (`STORE_DB`) with small row groups and without a write-ahead log: it is the run's
    scratch copy until `save` checkpoints it into run.duckdb, so a crash loses nothing a WAL would have kept (the
    run's scratch folder goes with it). Cursors of it come from `cursor`, which selects it."""
    config: dict[str, str | bool | int | float | list[str]] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    n = _threads.get()
    if n is not None:
        config["threads"] = n
    if memory_limit_bytes is not None:
        config["memory_limit"] = f"{max(1 << 20, int(memory_limit_bytes)) >> 20}MiB"
    if temp_dir is not None:
        config["temp_directory"] = str(temp_dir)
    con = duckdb.connect(":memory:", config=config)
    if path:
        con.execute(
            f"ATTACH '{_sql_str(path)}' AS {STORE_DB} (ROW_GROUP_SIZE {STORE_ROW_GROUP_ROWS}, RECOVERY_MODE no_wal_writes)"
        )
        con.execute(f"USE {STORE_DB}")
    # No progress bar: DuckDB prints it on stdout for long queries, into `--json` output (and cursors of this
    # connection inherit the setting).
    con.execute("SET enable_progress_bar = false")
    # ASOF joins as ASOF joins whatever the left side's estimated size (GLOBAL: on every cursor too). DuckDB makes one
    # whose left side it expects to hold at most `asof_loop_join_threshold` (64) rows a nested loop join and an
    # aggregate: every left row against every right row of its partition. Where the estimate is wrong that is
    # quadratic: the range windows' per-occurrence rows against every kernel of a GPU (the 486 MiB nsys export's
    # 140 occurrences against 66 k kernels each, 9.1 M joined rows: 0.27 s against 0.06 s as ASOF joins, session
    # 34), or the host's launch calls against its top-level ops when a regex filter makes DuckDB guess 16 rows
    # (`host_activity` on the 300 KB sample: 39 ms against 11 ms, session 37). An ASOF join sorts its sides.
    con.execute("SET GLOBAL asof_loop_join_threshold = 0")
    # One transaction: a file store otherwise commits (and syncs its WAL) after each of ~300 statements, which
    # took 0.4–0.7 s of every run; 0.1 s so.
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(schema_sql() if comments else schema_parts()[0])
    except BaseException:
        con.execute("ROLLBACK")
        con.close()
        raise
    con.execute("COMMIT")
    return con


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of the store (another connection to its database, for another thread or an unfinished result),
    with the store as its default database as on `con`."""
    row = one(con, "SELECT current_database()")
    cur = con.cursor()
    if row and row[0] != "memory":
        cur.execute('USE "' + str(row[0]).replace('"', '""') + '"')
    with _installed_lock:  # the measurement library's definitions installed on either are there for both
        _installed[cur] = _installed.setdefault(con, set())
    return cur


# What the measurement library installed once per database (sql.DEFINITIONS: its modules of only macros and views),
# as (database, module): a record per connection, the same one for its cursors (`cursor`).
_installed: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_installed_lock = threading.Lock()


def installed(con: duckdb.DuckDBPyConnection) -> set[tuple[str, str]]:
    """The record of what the measurement library installed once per database on `con` and its cursors."""
    with _installed_lock:
        return _installed.setdefault(con, set())


def in_transaction(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the caller holds a transaction on `con`. Outside one each statement is a transaction of its own: two
    give two ids. (Trying BEGIN, or a CHECKPOINT, would abort a caller's transaction instead of telling.)"""
    return one(con, "SELECT txid_current()") == one(con, "SELECT txid_current()")


STORE_FILE = "run.duckdb"


def connect_run(folder: Path, memory_limit_bytes: int | None = None) -> duckdb.DuckDBPyConnection:
    """A run's store: the DuckDB file `folder/run.duckdb` (the folder is created, private), spilling into
    `folder/spill`. Under a memory limit DuckDB evicts the store's own pages to its file and intermediate
    results to the spill folder, so the budget holds whatever the trace size."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return connect(folder / STORE_FILE, memory_limit_bytes=memory_limit_bytes, temp_dir=folder / "spill", comments=False)


def finish(con: duckdb.DuckDBPyConnection) -> None:
    """The store made whole for run.duckdb: schema.sql's comments added when it was opened without them, then a
    checkpoint (a file store). `save` calls it; the run calls it earlier, on a cursor beside report.html's drawing,
    which leaves `save` a rename. Run it when nothing else uses the store."""
    missing = one(
        con,
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'sources' AND comment IS NULL",
    )
    if missing and missing[0]:
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(schema_parts()[1])
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    if database_file(con) is not None:
        con.execute("CHECKPOINT")


def database_file(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The file of the connection's main database, None for an in-memory one."""
    row = one(con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()")
    return Path(row[0]) if row and row[0] else None


def save(con: duckdb.DuckDBPyConnection, dest: Path) -> None:
    """Make `dest` the run.duckdb users query, as the store's last write: a store kept in a file is
    checkpointed and moved there (a rename; one file copy across file systems), and the connection goes on
    reading it; an in-memory store is copied."""
    finish(con)  # (the current database: the store)
    src = database_file(con)
    if src is None:
        copy_store(con, dest)
        return
    dest = Path(dest)
    if dest.exists():
        dest.unlink()
    try:
        os.replace(src, dest)  # the open connection follows the file (the same inode)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dest)


def copy_store(src: duckdb.DuckDBPyConnection, dest: Path) -> None:
    """Copy the store's tables into a new DuckDB file (the store stays open; `save` is the run's way)."""
    dest = Path(dest)
    if dest.exists():
        dest.unlink()
    row = one(src, "SELECT current_database()")
    name = row[0] if row else "memory"
    src.execute(f"ATTACH '{_sql_str(dest)}' AS outdb")
    try:
        src.execute(f'COPY FROM DATABASE "{name}" TO outdb')
    finally:
        src.execute("DETACH outdb")


def _sql_str(p: Path | str) -> str:
    return str(p).replace("'", "''")


def open_readonly(path: str | Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(
        str(path), read_only=True, config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store has this table or view (the measure stage creates some: a store it has not seen lacks
    them)."""
    # A probe, not a catalog query: information_schema.tables costs ~1.7 ms a call, this ~0.3 ms (the trace
    # writer asks 14 times).
    try:
        con.execute(f'SELECT 1 FROM "{name.replace(chr(34), chr(34) * 2)}" LIMIT 0').fetchall()
    except duckdb.CatalogException:
        return False
    return True


def has_macro(con: duckdb.DuckDBPyConnection, name: str, *args: str) -> bool:
    """Whether the store has this scalar macro, taking arguments of the given SQL types (a probe: listing
    duckdb_functions() costs ~10 ms)."""
    call = ", ".join(f"NULL::{t}" for t in args)
    try:
        con.execute(f'SELECT "{name.replace(chr(34), chr(34) * 2)}"({call})').fetchall()
    except duckdb.CatalogException:
        return False
    return True


def in_order(rows: str, order: str) -> str:
    """The rows of the query `rows` sorted by `order`, each with its position `_n` from 1 (a parser's kernel and op
    ids), as a query whose rows come in that order: an INSERT from it writes them so. `order` ends with a key no two
    rows share (a staging table's rowid: its rows as the input has them), so the ids are the same every run.

    The positions are counted as the sorted rows stream by (`row_number() OVER ()`, which DuckDB documents as
    keeping its input's order; tests/test_store_in_order.py holds it to a window ordered by the same keys, on one and
    four threads, spilling or not), so the rows are sorted once. The numbering this replaced sorted the rowids to
    number them and joined the rows back to them before the INSERT's own sort: the 100 MiB Kineto trace's ops
    125-134 -> 94-113 ms (benchmarks/README.md, session 41); before that, a window over the whole rows (session 27)
    was 1.7-1.9x slower still."""
    return f"SELECT row_number() OVER () AS _n, * FROM ({rows} ORDER BY {order})"


def one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple | None:
    """First row of a query, with the result fully consumed (DuckDB ≥ 2 keeps an unfinished result open)."""
    rows = con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
    return rows[0] if rows else None


@contextmanager
def setting(con: duckdb.DuckDBPyConnection, name: str, value: int | str) -> Iterator[None]:
    """DuckDB's setting `name` (a number, or text: a string value) at `value` on `con` for the block (a connection
    or cursor: its own), given back after."""

    def literal(v: object) -> str:
        return str(int(str(v))) if isinstance(value, int) else "'" + str(v or "").replace("'", "''") + "'"

    row = one(con, "SELECT current_setting(?)", [name])
    con.execute(f"SET {name} = {literal(value)}")
    try:
        yield
    finally:
        if row is not None:
            con.execute(f"SET {name} = {literal(row[0])}")


# ------------------------------------------------------------------------------------------------ memory


@functools.cache
def _mallctl() -> Any:
    """DuckDB's own jemalloc's `mallctl` (its Linux builds export it as `duckdb_je_mallctl`), from its native module
    `_duckdb` (duckdb >= 1.4; the project needs 2.0.1); None where DuckDB allocates otherwise (macOS, Windows) or the
    symbol is not there."""
    import importlib

    try:
        path = getattr(importlib.import_module("_duckdb"), "__file__", None)
        fn = ctypes.CDLL(path).duckdb_je_mallctl if path else None
    except (ImportError, OSError, AttributeError, TypeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def release_freed_memory() -> None:
    """Give back to the system the pages DuckDB's queries freed. DuckDB allocates through a jemalloc of its own,
    which keeps freed pages resident for reuse and returns them over seconds: after the 100 MiB Kineto trace's
    ingest it held 162 MiB resident for 18 MiB allocated (its staging tables and sorts gone). Purging all its arenas
    (`arena.<MALLCTL_ARENAS_ALL>.purge`) takes 4-8 ms; the run calls it between stages, where a stage's working
    memory is gone and the next one's not yet taken (benchmarks/README.md, session 33). A no-op without jemalloc."""
    fn = _mallctl()
    if fn is not None:
        fn(b"arena.4096.purge", None, None, None, 0)


# ------------------------------------------------------------------------------------- work beside the caller's

T = TypeVar("T")


# Work beside the caller's (`beside`, `aside`; the nsys ingest's GPU metrics beside its other tables) runs at once
# only with room in DuckDB's memory limit for two queries' working memory (sorts, hash tables, the blocks of the
# tables they read) beside its tables (the store's, on disk or in memory; the staging tables, spilled or not): the
# tables take at most BESIDE_SHARE of the limit, and what is left
# holds a DuckDB thread's minimum for each of the two queries (DuckDB's performance guide, "Environment": "a minimum
# of 125 MB of memory per thread"). Else one after the other, spilling where need be. Measured: two sorts at once
# spilled on the 2 GiB Kineto trace under its budget, emit 3.9-4.2 -> 4.7-5.8 s (benchmarks/README.md, session 32);
# DuckDB squeezed to 48 MiB beside a 9 MiB store (tests/test_bounded_memory.py), the verdict's two queries at once ran
# out of memory where one after the other spill. The 100 MiB Kineto trace's 53 MiB of staging tables, or the 486 MiB
# nsys export's 112 MiB store, against the default budget's 768 MiB are far from either bound.
BESIDE_SHARE = 0.25
BESIDE_FREE_BYTES = 2 * 125_000_000


_SIZE_UNITS = {
    **{u: 1 for u in ("", "b", "byte", "bytes")},
    **{u: 1000**i for i, p in enumerate("kmgtp", 1) for u in (p, p + "b")},
    **{p + "ib": 1 << (10 * i) for i, p in enumerate("kmgtp", 1)},
}


def size_bytes(text: str) -> int | None:
    """A size as a person or DuckDB writes it ('1.5GiB', '800MB', '2g', '768.0 MiB', '1073741824') in bytes; None
    when it is not one."""
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text.strip().lower())
    if not m or m.group(2) not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def room_beside(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether DuckDB's memory limit (as `current_setting` prints it: '768.0 MiB') has room for two queries at once
    beside its tables (the blocks each database file uses, the in-memory tables in memory or spilled): BESIDE_SHARE
    and BESIDE_FREE_BYTES. Not when the limit cannot be read."""
    row = one(
        con,
        "SELECT current_setting('memory_limit'), (SELECT sum(used_blocks * block_size) FROM pragma_database_size()), "
        "(SELECT sum(memory_usage_bytes + temporary_storage_bytes) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE')",
    )
    limit = size_bytes(str(row[0])) if row else None
    if row is None or limit is None:
        return False
    tables = float(row[1] or 0) + float(row[2] or 0)
    return tables <= BESIDE_SHARE * limit and limit - tables >= BESIDE_FREE_BYTES


# How soon a thread waiting for Python's GIL gets it from one running Python (`quick_handoffs`), against Python's
# own 5 ms. Measured (benchmarks/README.md, session 38): the run's last step, report.html drawn beside the store's
# ~680 `COMMENT ON`s, 0.42-0.52 -> 0.33-0.38 s (300 KB sample, six interleaved runs each).
HANDOFF_S = 1e-4
_handoff_lock = threading.Lock()
_handoff_depth = 0
_handoff_saved = 0.0


@contextmanager
def quick_handoffs() -> Iterator[None]:
    """Inside, Python hands its GIL to a waiting thread within HANDOFF_S (sys.setswitchinterval), not 5 ms.

    DuckDB's Python API takes the GIL back after each statement it runs, so a thread running many short statements
    (the store's comments: ~0.2 ms each) beside one running Python (report.html's charts) otherwise waits up to
    5 ms for it after each: 0.09 s of statements took 0.3-0.4 s that way, 2.4 s beside a pure-Python loop. The
    Python thread gives the GIL away only when another asks for it, so it barely slows. The interval is the
    process's: nested blocks, or blocks on several threads of a caller of the library, set it once and the last to
    leave restores it (batch runs each run in a process of its own)."""
    global _handoff_depth, _handoff_saved
    with _handoff_lock:
        if _handoff_depth == 0:
            _handoff_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(HANDOFF_S, _handoff_saved))
        _handoff_depth += 1
    try:
        yield
    finally:
        with _handoff_lock:
            _handoff_depth -= 1
            if _handoff_depth == 0:
                sys.setswitchinterval(_handoff_saved)


def beside(con: duckdb.DuckDBPyConnection, other: Callable[[duckdb.DuckDBPyConnection], None], here: Callable[[], None]) -> None:
    """`other` on a cursor of the store, on a thread of its own, while `here` runs on this one; both finished (or
    the first error raised) when it returns. The two must not write the same tables. Without room for both
    (`room_beside`), `here` and then `other`."""
    with aside(con, other) as finished:
        here()
        finished()


@contextmanager
def aside(con: duckdb.DuckDBPyConnection, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> Iterator[Callable[[], T]]:
    """`fn` on a cursor of the store, on a thread of its own, while the block runs on this one; the block gets a
    function that waits for `fn`'s value (or raises what it raised). `fn` must not write what the block reads or
    writes (the verdict's groups only read; `beside`'s chains write tables of their own). On leaving, the thread
    is finished (interrupted when the block failed) and its cursor closed. Without room for both (`room_beside`),
    `fn` runs on this thread when its value is first asked for (never, when the block does not ask)."""
    cur = cursor(con)
    interrupt.watch(cur)
    box: list[Any] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            box.append(fn(cur))
        except BaseException as e:  # raised in the caller's thread by the result function
            error.append(e)

    t: threading.Thread | None = None
    if room_beside(con):
        # (in the caller's context: its settings held in context variables, such as the library's deferred
        # comments or its reference mode, hold on this thread too)
        t = threading.Thread(target=contextvars.copy_context().run, args=(body,), name="plasmient-beside", daemon=True)
        t.start()

    def result() -> T:
        if t is not None:
            t.join()
        elif not box and not error:
            body()
        if error:
            raise error[0]
        return cast(T, box[0])

    try:
        yield result
    except BaseException:
        with suppress(Exception):
            cur.interrupt()
        raise
    finally:
        if t is not None:
            t.join()
        with suppress(duckdb.Error):
            cur.close()
