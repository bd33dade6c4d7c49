"""The store: one DuckDB database per run, created from schema.sql.

Every stage reads and writes these tables and nothing else (SPEC §2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources
from pathlib import Path

import duckdb

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


def connect(path: str | Path | None = None, memory_limit_bytes: int | None = None,
            temp_dir: Path | None = None) -> duckdb.DuckDBPyConnection:
    """Open (or create) a store. Extensions are never auto-installed: everything ships with the wheel.

    With `memory_limit_bytes`, DuckDB keeps its buffers (tables included, in-memory stores too) under that
    size and spills the rest to `temp_dir` — the bounded-memory mode for traces of many GB."""
    config: dict[str, str | bool | int | float | list[str]] = {"autoinstall_known_extensions": False,
                                                                "autoload_known_extensions": False}
    n = _threads.get()
    if n is not None:
        config["threads"] = n
    if memory_limit_bytes is not None:
        config["memory_limit"] = f"{max(1 << 20, int(memory_limit_bytes)) >> 20}MiB"
    if temp_dir is not None:
        config["temp_directory"] = str(temp_dir)
    con = duckdb.connect(str(path) if path else ":memory:", config=config)
    # No progress bar: DuckDB prints it on stdout for long queries, into `--json` output (and cursors of this
    # connection inherit the setting).
    con.execute("SET enable_progress_bar = false")
    con.execute(schema_sql())
    return con


def copy_store(src: duckdb.DuckDBPyConnection, dest: Path) -> None:
    """Write the in-memory store to a DuckDB file (the run.duckdb users query)."""
    dest = Path(dest)
    if dest.exists():
        dest.unlink()
    src.execute(f"ATTACH '{_sql_str(dest)}' AS outdb")
    try:
        src.execute("COPY FROM DATABASE memory TO outdb")
    finally:
        src.execute("DETACH outdb")


def _sql_str(p: Path | str) -> str:
    return str(p).replace("'", "''")


def open_readonly(path: str | Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(path), read_only=True,
                          config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})


def one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple | None:
    """First row of a query, with the result fully consumed (DuckDB ≥ 2 keeps an unfinished result open)."""
    rows = con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
    return rows[0] if rows else None
