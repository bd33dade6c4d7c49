"""store.aside: a read on a cursor of the store, on a thread of its own, beside the caller's work (the verdict
reads the roofline's groups and the shapes that way, judge.build)."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest

from plasmient_report import store
from plasmient_report.store import aside


@pytest.fixture
def con(tmp_path: Path):
    c = store.connect_run(tmp_path / "run")
    c.execute("CREATE TABLE t AS SELECT range AS x FROM range(1000)")
    try:
        yield c
    finally:
        c.close()


def test_the_value_is_read_on_another_connection_of_the_same_store(con: duckdb.DuckDBPyConnection) -> None:
    seen: list[object] = []

    def read(cur: duckdb.DuckDBPyConnection) -> int:
        seen.append((cur is not con, threading.current_thread() is not threading.main_thread()))
        row = cur.execute("SELECT sum(x) FROM t").fetchone()
        assert row is not None
        return int(row[0])

    with aside(con, read) as result:
        here = con.execute("SELECT count(*) FROM t").fetchone()
        assert result() == sum(range(1000))
        assert result() == sum(range(1000))  # asked twice: the same value
    assert here == (1000,)
    assert seen == [(True, True)]


def test_what_the_read_raised_is_raised_where_the_value_is_asked_for(con: duckdb.DuckDBPyConnection) -> None:
    def read(cur: duckdb.DuckDBPyConnection) -> int:
        cur.execute("SELECT * FROM no_such_table")
        return 0

    with aside(con, read) as result, pytest.raises(duckdb.CatalogException):
        result()


def test_the_read_is_finished_when_the_block_fails(con: duckdb.DuckDBPyConnection) -> None:
    started = threading.Event()

    def read(cur: duckdb.DuckDBPyConnection) -> int:
        started.set()
        row = cur.execute("SELECT count(*) FROM range(100000000) a").fetchone()  # long enough to be interrupted
        return int(row[0]) if row else 0

    with pytest.raises(RuntimeError, match="the block failed"), aside(con, read):
        started.wait(10)
        raise RuntimeError("the block failed")
    assert not any(t.name == "plasmient-beside" and t.is_alive() for t in threading.enumerate())
    assert con.execute("SELECT count(*) FROM t").fetchone() == (1000,)  # the store is still usable
