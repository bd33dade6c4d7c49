"""store.release_freed_memory: the pages DuckDB's queries freed go back to the system (its own jemalloc keeps them
resident otherwise), so that one stage's working memory is not under the next one's peak."""

from __future__ import annotations

import sys

import pytest

from plasmient_report import store


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory read from /proc (Linux)")
def test_the_pages_of_a_dropped_table_go_back_to_the_system() -> None:
    if store._mallctl() is None:
        pytest.skip("this DuckDB build exports no jemalloc mallctl (it allocates otherwise): nothing to release")
    con = store.connect()
    try:
        before = _rss_mib()
        # ~200 MiB of rows in memory (a million 200-character strings), then dropped: freed, but kept by jemalloc
        con.execute("CREATE TEMP TABLE big AS SELECT i, repeat('x', 200) || i AS s FROM range(1000000) r(i)")
        assert _rss_mib() - before > 150
        con.execute("DROP TABLE big")
        held = _rss_mib()
        store.release_freed_memory()
        released = held - _rss_mib()
        assert released > 100, f"only {released:.0f} MiB of the dropped table's pages went back"
        assert con.execute("SELECT count(*) FROM range(1000)").fetchone() == (1000,)  # DuckDB goes on as before
    finally:
        con.close()


def test_it_purges_every_arena_and_is_a_no_op_where_duckdb_has_no_jemalloc(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(store, "_mallctl", lambda: lambda *a: calls.append(a) or 0)
    store.release_freed_memory()
    # jemalloc's MALLCTL_ARENAS_ALL is 4096: one purge of all arenas, nothing read or written back
    assert calls == [(b"arena.4096.purge", None, None, None, 0)]
    monkeypatch.setattr(store, "_mallctl", lambda: None)
    store.release_freed_memory()  # (nothing to call: no error either)
    assert len(calls) == 1
