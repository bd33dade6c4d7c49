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


def test_without_room_for_two_queries_the_read_runs_here_when_asked_for(tmp_path: Path) -> None:
    """DuckDB squeezed below two threads' minimum (store.room_beside): the read runs on the caller's thread, after
    the block's own work, when its value is asked for, and not at all when it is not; `beside` runs both in turn."""
    c = store.connect_run(tmp_path / "run", memory_limit_bytes=64 << 20)
    try:
        c.execute("CREATE TABLE t AS SELECT range AS x FROM range(1000)")
        assert not store.room_beside(c)
        order: list[str] = []

        def read(cur: duckdb.DuckDBPyConnection) -> int:
            order.append("read on " + threading.current_thread().name)
            row = cur.execute("SELECT sum(x) FROM t").fetchone()
            return int(row[0]) if row else 0

        with aside(c, read) as result:
            order.append("block")
            assert result() == sum(range(1000)) and result() == sum(range(1000))
        with aside(c, read):
            order.append("a block that does not ask")
        store.beside(c, lambda cur: order.append("other"), lambda: order.append("here"))
        assert order == ["block", "read on " + threading.main_thread().name, "a block that does not ask", "here", "other"]
    finally:
        c.close()


def test_room_for_two_queries_counts_the_tables_against_the_memory_limit(tmp_path: Path) -> None:
    c = store.connect_run(tmp_path / "run", memory_limit_bytes=1 << 30)
    try:
        assert store.room_beside(c)
        c.execute("CREATE TEMP TABLE big AS SELECT i, repeat('x', 300) || i AS s FROM range(1000000) r(i)")  # ~300 MiB
        assert not store.room_beside(c)  # over a quarter of the limit
    finally:
        c.close()


def test_quick_handoffs_shortens_the_switch_interval_inside_and_restores_it_after() -> None:
    # the final step's page beside the store's comments (pipeline.write_outputs): the GIL goes to the statements'
    # thread within HANDOFF_S of its asking, not Python's 5 ms
    import sys

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with store.quick_handoffs():
            assert sys.getswitchinterval() == pytest.approx(store.HANDOFF_S, rel=1e-6)
            with store.quick_handoffs():  # nested: the inner block's exit keeps the outer one's setting
                assert sys.getswitchinterval() == pytest.approx(store.HANDOFF_S, rel=1e-6)
            assert sys.getswitchinterval() == pytest.approx(store.HANDOFF_S, rel=1e-6)
        assert sys.getswitchinterval() == pytest.approx(0.005, rel=1e-6)
        with pytest.raises(RuntimeError), store.quick_handoffs():
            raise RuntimeError("the block failed")
        assert sys.getswitchinterval() == pytest.approx(0.005, rel=1e-6)
        sys.setswitchinterval(1e-5)  # a user's shorter interval is not lengthened
        with store.quick_handoffs():
            assert sys.getswitchinterval() == pytest.approx(1e-5, rel=1e-6)
        assert sys.getswitchinterval() == pytest.approx(1e-5, rel=1e-6)
    finally:
        sys.setswitchinterval(before)


def test_quick_handoffs_from_threads_restores_the_interval_when_the_last_leaves() -> None:
    # a library caller may write several runs' outputs at once on threads: the first in sets it, the last out
    # restores it
    import sys

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        inside, leave, seen = threading.Barrier(3), threading.Event(), []

        def run() -> None:
            with store.quick_handoffs():
                inside.wait()
                leave.wait()
                seen.append(sys.getswitchinterval())

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        inside.wait()
        assert sys.getswitchinterval() == pytest.approx(store.HANDOFF_S, rel=1e-6)
        leave.set()
        for t in threads:
            t.join()
        assert len(seen) == 2 and min(seen) == pytest.approx(store.HANDOFF_S, rel=1e-6)
        assert sys.getswitchinterval() == pytest.approx(0.005, rel=1e-6)
    finally:
        sys.setswitchinterval(before)
