"""The measurement library's native blocks (plasmient_report/sql/native.py) against their own SQL: the same store
rows, to the last bit, on real recordings — the SQL inside `-- native: NAME {` … `-- }` is the definition, the numpy
code the fast way of computing it. Also the fallbacks (a sum that could leave int64 runs the SQL) and DuckDB's
rounding of a DOUBLE, which the fixed-point sums must reproduce."""

from __future__ import annotations

import contextlib
from pathlib import Path

import duckdb
import numpy as np
import pytest

from plasmient_report import pipeline, sql, store
from plasmient_report.sql import native

from .conftest import sample_file

# Tables the sweep writes and the ones computed from them (the verdict reads these).
SWEPT = ("stretches", "idle_gaps", "losses", "metrics", "metrics_by_precision", "steps", "step_losses")


def _digest(con: duckdb.DuckDBPyConnection, table: str) -> tuple[int, int]:
    """Row count and an order-free hash of every row (each column as its own value: a changed bit shows)."""
    cols = ", ".join(f'"{c}"' for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall())
    ((n, h),) = con.execute(f"SELECT count(*), coalesce(sum(hash({cols})), 0)::HUGEINT FROM {table}").fetchall()
    return int(n), int(h)


def _run(path: Path, reference: bool, ranges: list[str] | None = None) -> tuple[dict[str, tuple[int, int]], dict]:
    # one DuckDB thread: the SQL's own sums then come in one order, so equal rows give equal digits
    with store.threads(1), sql.reference() if reference else contextlib.nullcontext():
        res = pipeline.analyse([path], pipeline.Options(ranges=ranges or []))
    try:
        present = {t for (t,) in res.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        return {t: _digest(res.con, t) for t in SWEPT if t in present}, res.verdict
    finally:
        res.close()


@pytest.mark.parametrize(
    ("rel", "ranges"),
    [
        ("h200_sync_stack/sync_stack.pt.trace.json.gz", None),  # one GPU, host syncs, Python stacks
        ("h200_hf/llama_nsys.sqlite", ["train_step"]),  # Nsight Systems, NVTX ranges
        ("h200x2_pipeline/m8", None),  # two ranks, pipeline P2P and bubbles
        ("h200x2_ddp/kineto", ["ProfilerStep#*"]),  # two ranks, collectives, steps
        ("h200_hf/input_bound.pt.trace.json.gz", None),  # data-loader gaps (idle stretches of every kind)
    ],
)
def test_native_blocks_give_the_rows_of_their_sql(rel, ranges, monkeypatch):
    path = sample_file(rel)
    taken: list[bool] = []
    fits, sums = native._fits, native._sums
    monkeypatch.setattr(native, "_fits", lambda x, at: taken.append(fits(x, at)) or taken[-1])
    monkeypatch.setattr(native, "_sums", lambda x, at: taken.append((r := sums(x, at)) is not None) or r)
    fast, v_fast = _run(path, reference=False, ranges=ranges)
    assert taken and all(taken)  # the numpy way ran (no fallback to the SQL)
    ref, v_ref = _run(path, reference=True, ranges=ranges)
    assert fast["stretches"][0] > 0
    assert fast == ref
    assert v_fast == v_ref


def test_sums_that_could_leave_int64_run_the_sql(monkeypatch):
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    ref, _ = _run(path, reference=True)
    monkeypatch.setattr(native, "_SAFE", 1.0)  # every sum "could overflow": each block runs its SQL instead
    refused: list[str] = []
    fits, fixed = native._fits, native._fixed

    def spy_fits(x, at):
        ok = fits(x, at)
        refused.extend([] if ok else ["segments"])
        return ok

    def spy_fixed(x, scale):
        out = fixed(x, scale)
        refused.extend([] if out is not None else ["islands"])
        return out

    monkeypatch.setattr(native, "_fits", spy_fits)
    monkeypatch.setattr(native, "_fixed", spy_fixed)
    fallback, _ = _run(path, reference=False)
    assert {"segments", "islands"} <= set(refused)
    assert fallback == ref


@pytest.mark.parametrize("x", [0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994, 4503599627370497.0, 1e-300, 0.0, 7.5e17])
def test_fixed_point_rounds_as_duckdb_does(x):
    ((want,),) = duckdb.sql(f"SELECT round({x!r}::DOUBLE)::HUGEINT").fetchall()
    got = native._fixed(np.array([x]), 1.0)
    assert got is not None and int(got[0]) == int(want)


def test_module_text_outside_native_blocks_runs_as_written():
    # the marked blocks are whole statements: cutting them out leaves SQL that parses, block by block
    for name, mod in sql.modules().items():
        text = sql.render(name)
        for m in sql._NATIVE_RE.finditer(text):
            assert m.group(1) in native.NATIVE, f"sql/{name}.sql: unknown native block {m.group(1)!r}"
        assert text.count("-- native: ") == len(sql._NATIVE_RE.findall(text)), f"sql/{name}.sql: unclosed block"
        assert mod.name == name
