"""The store plans ASOF joins as ASOF joins whatever DuckDB estimates of their left side (store.connect: the range
windows, the host's launch calls against its ops, the rules' lost_ns), on its connection and on every cursor of it,
with the same rows as DuckDB's default plan (for this query a nested loop join and an aggregate on DuckDB 2.0)."""

from __future__ import annotations

import duckdb
import pytest

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


def test_duckdb_by_default_makes_this_join_a_loop_join():
    # (else this test file checks nothing: the store's setting would change no plan)
    plan = _plan(duckdb.connect())
    assert "NESTED_LOOP_JOIN" in plan and "ASOF_JOIN" not in plan, plan


@pytest.mark.parametrize("on", ["connection", "cursor"])
def test_the_store_plans_an_asof_join_with_the_same_rows(on, tmp_path):
    default_rows = duckdb.connect().execute(QUERY).fetchall()
    for con in (store.connect(), store.connect_run(tmp_path / "run")):
        c = store.cursor(con) if on == "cursor" else con
        plan = _plan(c)
        assert "ASOF_JOIN" in plan and "NESTED_LOOP_JOIN" not in plan, plan
        rows = c.execute(QUERY).fetchall()
        assert rows == default_rows and len(rows) == 10  # (the 2 GPUs x 5 groups, each with its last earlier activity)
        con.close()
