"""store.asof_joins: ASOF joins planned as ASOF joins whatever DuckDB estimates of their left side (the range
windows, the rules' lost_ns), with the same rows as DuckDB's default plan (for this query a nested loop join and an
aggregate on DuckDB 2.0), and the connection's setting given back."""

from __future__ import annotations

from plasmient_report import store

# A left side DuckDB estimates small (a GROUP BY over a few keys) against a right side of many rows per key: the
# shape of the range windows' per-occurrence rows against the kernels of their GPU.
QUERY = """
    WITH occ AS (SELECT g AS dev, max(t) AS t FROM range(300) r(t), range(2) d(g) WHERE t % 7 = 0 GROUP BY g, t % 5),
    acts AS (SELECT i % 2 AS dev, i AS start_ns, i + 3 AS end_ns FROM range(20000) r(i))
    SELECT o.dev, o.t, a.start_ns, a.end_ns FROM occ o ASOF LEFT JOIN acts a ON a.dev = o.dev AND a.start_ns < o.t
    ORDER BY ALL"""


def _plan(con) -> str:
    """The physical plan's operator names, as one spelling whatever the DuckDB version ("Asof Join", "ASOF_JOIN")."""
    text = "\n".join(str(r[1]) for r in con.execute("EXPLAIN " + QUERY).fetchall())
    return text.upper().replace(" ", "_")


def _threshold(con) -> int:
    return int(store.one(con, "SELECT current_setting('asof_loop_join_threshold')")[0])


def test_the_join_is_an_asof_join_with_the_same_rows_and_the_setting_is_given_back():
    con = store.connect()
    before, default_rows = _threshold(con), con.execute(QUERY).fetchall()
    with store.asof_joins(con):
        plan = _plan(con)
        rows = con.execute(QUERY).fetchall()
    assert "ASOF_JOIN" in plan and "NESTED_LOOP_JOIN" not in plan, plan
    assert rows == default_rows and len(rows) == 10  # (the 2 GPUs x 5 groups, each with its last earlier activity)
    assert _threshold(con) == before


def test_a_cursor_keeps_its_own_setting():
    # the range windows are built on a cursor beside the FLOP attribution: the setting must not reach the other
    con = store.connect()
    cur = store.cursor(con)
    before = _threshold(con)
    with store.asof_joins(cur):
        assert _threshold(cur) == 0
        assert _threshold(con) == before
    assert _threshold(cur) == before
