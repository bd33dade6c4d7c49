"""docs/schema.md is the store's own comments (schema.sql's COMMENT ON), and the store documents only what something
writes: every documented column is filled on some real input (the project's recordings), or its comment or the
list below says which input would fill it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

from plasmient_report import pipeline, schema_doc, sql, store

from .conftest import ROOT, sample_file

NOT_WRITTEN = "always NULL"  # how a column's comment says that nothing writes it yet
# Columns no committed recording fills, and the input that would.
FILLED_ONLY_BY = {
    ("collectives", "peer"): "an nsys report of NCCL send/recv exported with --include-blobs (NCCL's payload `Peer rank`)",
    ("ncu_kernels", "flops_fp64"): "an Nsight Compute CSV of a kernel doing FP64 work",
    ("sources", "dropped_events"): "a trace whose recorder counts dropped events (tests/test_contract_hostile_inputs.py)",
}


def test_schema_doc_is_generated_from_the_store():
    page = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
    assert page == schema_doc.render(), "docs/schema.md drifted: python -m plasmient_report.schema_doc > docs/schema.md"


def test_every_table_and_column_carries_a_comment():
    con = store.connect()
    tables = con.execute("SELECT table_name, comment FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()
    assert {t for t, _ in tables} >= set(store.TABLES) - set(schema_doc.LIBRARY_OBJECTS)
    assert not [t for t, c in tables if not c], "tables without a comment"
    bare = con.execute("""SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main'
                          AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main')
                          AND coalesce(comment, '') = ''""").fetchall()
    assert not bare, f"columns without a comment: {bare}"
    for name in schema_doc.LIBRARY_OBJECTS:  # SPEC §2 objects of the library: documented there, column by column
        assert any(kind == "COLUMN" and obj.startswith(f"{name}.") for kind, obj, _ in sql.comments(name))


def _skewed(src: Path, dst: Path, skew_us: float) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += skew_us
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


@pytest.mark.slow
def test_every_documented_column_is_written(tmp_path):
    # Recordings of every format the store reads, with their logs, Nsight Compute, a range, a skewed rank (rank
    # alignment), allocator events: each column must hold a value in at least one of them.
    s = sample_file
    runs: list[tuple[list[Path], dict[str, object]]] = [
        (
            [
                s("h200_single/kineto_single.pt.trace.json.gz"),
                s("h200_single/nvidia_smi_dmon.txt"),
                s("h200_single/nvidia_smi_query.csv"),
                s("h200_single/nvml_samples.csv"),
            ],
            {"ranges": ["phase:*"]},
        ),
        ([s("h200_attention/attention.pt.trace.json.gz"), s("h200_attention/ncu_raw.csv")], {}),
        ([s("h200x2_ddp/nsys/nsys_ddp_pqtdir"), ROOT / "tests/data/dcgmi_dmon_ids_iso.txt"], {}),
        ([s("h200x2_ddp/nsys/nsys_ddp.sqlite")], {}),
        (
            [
                s("h200x2_ddp/kineto/rank0.pt.trace.json.gz"),
                _skewed(s("h200x2_ddp/kineto/rank1.pt.trace.json.gz"), tmp_path / "rank1.pt.trace.json.gz", 2000.0),
            ],
            {},
        ),
        ([s("h200_hf/llama_memory.pt.trace.json.gz")], {}),
        ([s("h200_sync_stack/sync_stack.pt.trace.json.gz")], {}),
        ([ROOT / "tests/data/dcgm_exporter_scrapes.prom", s("h200_single/nsys_single.sqlite")], {}),
    ]
    filled: dict[tuple[str, str], int] = {}
    for inputs, opts in runs:
        res = pipeline.analyse(inputs, pipeline.Options(write_html=False, write_trace=False, **opts))  # type: ignore[arg-type]
        try:
            cols = res.con.execute("""SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main'
                                      AND table_name IN (SELECT table_name FROM duckdb_tables()
                                                         WHERE schema_name = 'main' AND NOT temporary)""").fetchall()
            documented = set(
                store.connect()
                .execute("SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main'")
                .fetchall()
            )
            for t, c in cols:
                if (t, c) in documented:
                    (n,) = res.con.execute(f'SELECT count("{c}") FROM "{t}"').fetchone()
                    filled[(t, c)] = filled.get((t, c), 0) + n
        finally:
            res.close()
    comments = dict(
        ((t, c), m)
        for t, c, m in store.connect()
        .execute("SELECT table_name, column_name, comment FROM duckdb_columns() WHERE schema_name = 'main'")
        .fetchall()
    )
    empty = {k for k, n in filled.items() if n == 0}
    # a column nothing fills yet says so in its own comment ("always NULL")
    unexplained = sorted(k for k in empty if k not in FILLED_ONLY_BY and NOT_WRITTEN not in (comments.get(k) or ""))
    assert not unexplained, f"documented columns nothing writes: {unexplained}"
    stale = sorted(k for k in FILLED_ONLY_BY if filled.get(k))
    assert not stale, f"now filled by a recording: drop them from FILLED_ONLY_BY: {stale}"
    reserved = sorted(k for k in filled if NOT_WRITTEN in (comments.get(k) or "") and filled[k])
    assert not reserved, f"written now, but documented as reserved: {reserved}"


def _schema_comments(con) -> set[tuple[str, str | None, str | None]]:
    """schema.sql's comments in a store: its tables' and their columns' (the library's objects, which the measure
    stage replaces with its own, left out)."""
    names = ", ".join(repr(t) for t in sorted(set(store.TABLES) - set(schema_doc.LIBRARY_OBJECTS)))
    tables = con.execute(
        f"SELECT table_name, NULL, comment FROM duckdb_tables() WHERE schema_name = 'main' AND table_name IN ({names})"
    ).fetchall()
    columns = con.execute(
        f"SELECT table_name, column_name, comment FROM duckdb_columns() WHERE schema_name = 'main' AND table_name IN ({names})"
    ).fetchall()
    return set(tables) | set(columns)


def test_run_duckdb_gets_the_schema_comments_its_store_was_opened_without(tmp_path: Path) -> None:
    """The run's store is opened without schema.sql's comments (store.connect_run: ~40 ms of catalog changes moved
    off the run's start); the run.duckdb it becomes carries every one of them, as a store opened with them does —
    by `store.save`, and by the main job, which adds them beside report.html's drawing."""
    reference = _schema_comments(store.connect())
    assert all(c for _, _, c in reference)

    con = store.connect_run(tmp_path / "scratch")
    assert not any(c for _, _, c in _schema_comments(con)), "connect_run's store has no comments until it is finished"
    store.save(con, tmp_path / "run.duckdb")
    con.close()
    assert _schema_comments(store.open_readonly(tmp_path / "run.duckdb")) == reference

    from plasmient_report import cli

    out = tmp_path / "out"
    trace = sample_file("h200_single/kineto_single.pt.trace.json.gz")
    cli.main([str(trace), "--out", str(out), "--quiet"], standalone_mode=False)
    assert _schema_comments(store.open_readonly(out / "run.duckdb")) == reference


def test_counter_time_source_is_the_closed_vocabulary_of_anchors():
    # counters.time_source is a one-byte ENUM (millions of nsys GPU-metric rows), not a string: it holds exactly the
    # anchors the aligner knows (trusted ones as logged, the rest synthesized), and a new one fails loudly at insert
    from plasmient_report.align import COUNTER_TRUSTED

    con = store.connect()
    (values,) = con.execute("SELECT enum_range(NULL::counter_time_source)").fetchone()
    assert sorted(values) == sorted((*COUNTER_TRUSTED, "synthesized"))
    (typ,) = con.execute(
        "SELECT data_type FROM duckdb_columns() WHERE table_name = 'counters' AND column_name = 'time_source'"
    ).fetchone()
    assert typ.startswith("ENUM(")
    con.execute("INSERT INTO counters (source_id, metric, time_source) VALUES (1, 'gpu_util', 'native')")
    assert con.execute("SELECT count(*) FROM counters WHERE time_source = 'native'").fetchone()[0] == 1
    with pytest.raises(duckdb.ConversionException):
        con.execute("INSERT INTO counters (source_id, metric, time_source) VALUES (1, 'gpu_util', 'guessed')")
    con.close()
