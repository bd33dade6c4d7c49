"""store.in_order: a parser's kernel and op ids are the rows' positions in a sort, counted as the sorted rows stream
by (`row_number() OVER ()` over an ordered subquery), and an INSERT from it writes the rows in that order. The ids
then depend on DuckDB keeping a sorted subquery's order through an empty OVER clause and the INSERT, on any number
of threads and when the sort spills: checked here against the numbering a window ordered by the same keys gives
(what `numbered` computed before, session 41), on tables of many row groups with many ties in the sort keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from plasmient_report import store

ROWS = 300_000


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilling"])
def test_positions_follow_the_sort_and_the_insert_keeps_them(tmp_path: Path, threads: int, spill: bool) -> None:
    with store.threads(threads):
        con = store.connect(
            tmp_path / "s.duckdb", memory_limit_bytes=(48 << 20) if spill else None, temp_dir=tmp_path / "spill", comments=False
        )
    # Staging rows in "input order" (their rowid), the sort keys full of ties (a tenth of the rows share a start)
    # and a long text column (what the ops' shapes are), so the sort carries wide rows.
    con.execute(f"""
        CREATE TEMP TABLE stage AS
        SELECT (hash(i) % {ROWS // 10})::DOUBLE AS ts, (hash(i * 7) % 5)::DOUBLE AS dur,
               repeat(chr(65 + (i % 26)::INTEGER), 40) || i::VARCHAR AS name
        FROM range({ROWS}) t(i)""")
    rows = store.in_order("SELECT * FROM stage WHERE dur IS NOT NULL", "ts, dur DESC, rowid")
    # into a table of the store's file (its small row groups), as the parsers write their kernels and ops
    con.execute("CREATE TABLE target (_n BIGINT, ts DOUBLE, dur DOUBLE, name VARCHAR)")
    con.execute(f"INSERT INTO target SELECT _n, ts, dur, name FROM ({rows})")
    con.execute("SET memory_limit = '1GiB'")  # (the checks below need not spill)
    # every row's position is the one a window ordered by the same keys gives it (the keys end with the rowid)
    wrong = con.execute("""
        WITH want AS (SELECT name, row_number() OVER (ORDER BY ts, dur DESC, rowid) AS n FROM stage)
        SELECT count(*), count(*) FILTER (WHERE want.n IS DISTINCT FROM got._n) FROM want JOIN target got USING (name)
        """).fetchone()
    assert wrong == (ROWS, 0)
    # and the rows were written in that order: the table's own order is the positions'
    assert con.execute("SELECT count(*), bool_and(_n = rowid + 1) FROM target").fetchone() == (ROWS, True)
    con.close()
