"""The store: one DuckDB database per run, created from schema.sql.

Every stage reads and writes these tables and nothing else (SPEC §2).
"""

from __future__ import annotations

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


def connect(path: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """Open (or create) a store. Extensions are never auto-installed: everything ships with the wheel."""
    con = duckdb.connect(str(path) if path else ":memory:", config={"autoinstall_known_extensions": False,
                                                                    "autoload_known_extensions": False})
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
