"""The measurement library (plasmient_report/sql/): every module installs from the store and its declared
dependencies alone, every object and column it creates carries a comment, the generated page matches, and the
objects travel with run.duckdb."""

from __future__ import annotations

import re

import duckdb
import pytest

from plasmient_report import pipeline, sql, store

from .conftest import ROOT, sample_file

_OBJECT_RE = re.compile(r"CREATE OR REPLACE (?:TEMP )?(TABLE|VIEW|MACRO) ([a-z_][a-z0-9_]*)", re.IGNORECASE)


def library_objects() -> dict[str, list[tuple[str, str]]]:
    """Per module: the (kind, name) of the persistent objects it creates (temporaries start with `_`)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name in sql.modules():
        found = [(k.upper(), n) for k, n in _OBJECT_RE.findall(sql.render(name)) if not n.startswith("_")]
        out[name] = list(dict.fromkeys(found))
    return out


def test_docs_page_matches_the_modules():
    page = (ROOT / "docs" / "measurements.md").read_text(encoding="utf-8")
    assert page == sql.docs(), "docs/measurements.md is stale: python -m plasmient_report.sql > docs/measurements.md"


@pytest.mark.parametrize("module", sorted(sql.modules()))
def test_each_module_installs_from_its_declared_dependencies(module):
    # an empty store and only the modules it says it depends on: a missing declaration fails here
    con = store.connect()
    sql.install(con, module, with_dependencies=True)
    for kind, name in library_objects()[module]:
        if kind == "MACRO":
            assert con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = ?", [name]).fetchone()[0]
        else:
            con.execute(f"SELECT * FROM {name} LIMIT 0")


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    res = pipeline.analyse([sample_file("h200x2_ddp/kineto")], pipeline.Options(ranges=["ProfilerStep#*"]))
    out = tmp_path_factory.mktemp("db") / "run.duckdb"
    store.copy_store(res.con, out)
    yield res, out
    res.close()


def test_every_object_and_column_is_commented(analysed):
    res, _ = analysed
    assert not _uncommented(res.con)


def _uncommented(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The library's objects and columns in a store that carry no comment."""
    out = []
    for module, objs in library_objects().items():
        for kind, name in objs:
            if kind == "MACRO":
                rows = con.execute("SELECT any_value(comment) FROM duckdb_functions() WHERE function_name = ?", [name])
                out += [] if rows.fetchone()[0] else [f"{module}: macro {name}"]
                continue
            rows = con.execute("SELECT column_name, comment FROM duckdb_columns() WHERE table_name = ?", [name]).fetchall()
            out += [f"{module}: {name} (not there)"] if not rows else [f"{module}: {name}.{c}" for c, m in rows if not m]
    return out


@pytest.mark.parametrize("html", [False, True], ids=["after-save", "beside-the-page"])
def test_deferred_comments_reach_run_duckdb(html, tmp_path):
    # The main job keeps the library's comments out of the analysis (analyse(defer_comments=True)) and adds them
    # when it writes run.duckdb: beside report.html's drawing, else just before the store is saved.
    inputs = [sample_file("h200x2_ddp/kineto")]
    opts = pipeline.Options(ranges=["ProfilerStep#*"], write_html=html, write_trace=False)
    res = pipeline.analyse(inputs, opts, defer_comments=True)
    try:
        assert res.comments, "nothing was deferred"
        assert _uncommented(res.con), "the comments were added during the analysis"
        out = pipeline.write_outputs(res, tmp_path / "out", inputs, opts)
        assert not res.comments
    finally:
        res.close()
    con = duckdb.connect(str(out / "run.duckdb"), read_only=True)
    try:
        assert not _uncommented(con)
    finally:
        con.close()


def test_deferred_comments_skip_objects_dropped_meanwhile():
    con = store.connect()
    with sql.deferred_comments() as pending:
        sql.install(con, "memory", "device_peaks")
    assert len(pending) == 2
    assert "memory: memory_timeline.rank" in _uncommented(con)  # none added yet
    con.execute("DROP TABLE memory_peaks")  # (its COMMENT ONs now fail: that module's other comments still go in)
    sql.apply_comments(con, pending)
    assert not pending
    left = [m for m in _uncommented(con) if m.startswith(("memory:", "device_peaks:"))]
    assert left == ["memory: memory_peaks (not there)"]


def test_library_objects_travel_with_run_duckdb(analysed):
    res, path = analysed
    con = duckdb.connect(str(path), read_only=True)
    try:
        for table in (
            "kernel_class",
            "stretches",
            "idle_gaps",
            "range_occurrences",
            "collective_members",
            "metrics_by_precision",
            "window_kernels",
            "kernel_launch",
            "device_peaks",
        ):
            assert (
                con.execute(f"SELECT count(*) FROM {table}").fetchone()
                == res.con.execute(f"SELECT count(*) FROM {table}").fetchone()
            )
        # views and table macros too: the waterfall's losses, the roofline
        assert con.execute("SELECT sum(lost_ns) FROM losses").fetchone()[0] == pytest.approx(
            res.con.execute("SELECT sum(lost_ns) FROM losses").fetchone()[0]
        )
        assert con.execute("SELECT count(*) FROM kernel_roofline('range', 'ProfilerStep#*', 'kernel')").fetchone()[0] > 0
    finally:
        con.close()


def test_patterns_come_from_vocab():
    # the modules hold no name pattern of their own: every pattern is a vocab constant ({{NAME}}) or a macro
    # generated from vocab (vocab.sql)
    for name, m in sql.modules().items():
        assert not re.search(r"'\(\?i\)|regexp_matches\([^;]*?,\s*'\^", m.sql), f"sql/{name}.sql: a literal pattern"


def test_names_matching_is_the_pattern_read_once_per_distinct_name():
    # the modules filter large tables by a name pattern through names_matching (the pattern once per distinct name):
    # the rows it keeps must be exactly those the pattern kept row by row (NULL names neither way)
    con = store.connect()
    sql.install(con, "vocab")
    con.execute(
        """CREATE TABLE t AS SELECT range AS i, CASE WHEN range % 7 = 0 THEN NULL WHEN range % 3 = 0 THEN 'cudaStreamSynchronize'
           WHEN range % 3 = 1 THEN 'cudaLaunchKernel' ELSE 'aten::mm' || (range % 5) END AS name FROM range(1000)"""
    )
    for pattern in ("(?i)synchronize", "^aten::mm[0-2]$", "nothing matches"):
        per_row = con.execute("SELECT list(i ORDER BY i) FROM t WHERE regexp_matches(name, ?)", [pattern]).fetchone()
        once = con.execute(
            f"SELECT list(i ORDER BY i) FROM t WHERE name IN (SELECT n FROM names_matching('t', '{pattern}'))"
        ).fetchone()
        assert once == per_row, pattern
    assert con.execute("SELECT count(*) FROM names_matching('t', '.')").fetchone()[0] == 7  # distinct, no NULL
    con.close()


_DEFINITION_RE = re.compile(r"CREATE OR REPLACE (?:TEMP |TEMPORARY )?(?:MACRO|VIEW)\b", re.IGNORECASE)


def _statements(module: str) -> list[str]:
    """The module's statements as DuckDB's parser splits them, their leading comment lines cut."""
    text = sql.render(module)
    out = []
    for st in duckdb.connect().extract_statements(text):
        lines = [ln for ln in st.query.strip().splitlines() if not ln.lstrip().startswith("--")]
        out.append("\n".join(lines).strip())
    return [s for s in out if s]


@pytest.mark.parametrize("module", sorted(sql.modules()))
def test_definitions_are_the_modules_that_define_only_macros_and_views(module):
    # sql.DEFINITIONS are installed once per store (installing them again would change nothing): a module listed
    # there must create nothing computed from the store's rows, and a module that only defines must be listed
    kinds = [bool(_DEFINITION_RE.match(s)) or s.upper().startswith("COMMENT ON") for s in _statements(module)]
    assert kinds, module
    assert all(kinds) == (module in sql.DEFINITIONS), (module, module in sql.DEFINITIONS)


def test_a_run_installs_each_definition_module_once(monkeypatch):
    # the measure stage's steps each ask for the vocabulary they use: three times a run for `vocab` before
    # (~17 ms each), twice or three times for `intervals`, `rank_span` and `collective_key`
    ran: list[str] = []
    execute = sql._execute

    def counting(con: duckdb.DuckDBPyConnection, text: str) -> None:
        ran.extend(m.group(1) for m in re.finditer(r"^-- Module: ([a-z_]+)", text, re.MULTILINE))
        execute(con, text)

    monkeypatch.setattr(sql, "_execute", counting)
    res = pipeline.analyse([sample_file("h200x2_ddp/kineto")], pipeline.Options(ranges=["ProfilerStep#*"]))
    try:
        installed = {m: ran.count(m) for m in sql.DEFINITIONS}
        assert installed == dict.fromkeys(sql.DEFINITIONS, 1), installed
        assert "kernel_class" in ran  # (the count saw the run's modules)
        # and what they define is there, for the store's own connection and for a cursor of it
        for con in (res.con, store.cursor(res.con)):
            assert con.execute("SELECT exact_sum(0.25, 1000), collective_key(NULL, 'r')").fetchone() == (0.25, "r")
    finally:
        res.close()


def test_definitions_are_installed_again_where_they_are_missing():
    # a caller's transaction rolled back: installed again
    con = store.connect()
    con.execute("BEGIN TRANSACTION")
    with sql.deferred_comments():  # (a module's comments otherwise go in a transaction of their own)
        sql.install(con, "vocab")
    con.execute("ROLLBACK")
    sql.install(con, "vocab")
    assert con.execute("SELECT exact_sum(0.5, 1000)").fetchone() == (0.5,)
    # another database of the same connection gets its own
    con.execute("ATTACH ':memory:' AS other")
    con.execute("USE other")
    sql.install(con, "vocab")
    n = "SELECT count(*) FROM duckdb_functions() WHERE database_name = ? AND function_name = 'exact_sum'"
    assert con.execute(n, ["other"]).fetchone() == (1,)
    # another store, too
    con2 = store.connect()
    sql.install(con2, "vocab")
    assert con2.execute("SELECT exact_sum(0.5, 1000)").fetchone() == (0.5,)
