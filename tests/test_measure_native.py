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

from plasmient_report import align, kernel_flops, pipeline, sql, store
from plasmient_report.sql import native

from .conftest import corpus_file, sample_file

# Tables the sweep writes and the ones computed from them (the verdict reads these).
SWEPT = ("stretches", "idle_gaps", "losses", "metrics", "metrics_by_precision", "steps", "step_losses")


def _digest(con: duckdb.DuckDBPyConnection, table: str, but: tuple[str, ...] = ()) -> tuple[int, int]:
    """Row count and an order-free hash of every row (each column as its own value: a changed bit shows), leaving
    out the columns `but`."""
    names = [c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall() if c not in but]
    cols = ", ".join(f'"{c}"' for c in names)
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
    monkeypatch.setattr(native, "_fits", lambda *a: taken.append(fits(*a)) or taken[-1])
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

    def spy_fits(*a):
        ok = fits(*a)
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


def _spy_slices(monkeypatch) -> list[int | None]:
    """The slice size of every sorted read of a native block (None: whole, sorted in numpy)."""
    sizes: list[int | None] = []
    in_order = native._in_order
    monkeypatch.setattr(native, "_in_order", lambda con, q, keys, rows: sizes.append(rows) or in_order(con, q, keys, rows))
    return sizes


@pytest.mark.parametrize(
    ("rel", "ranges", "rows"),
    [
        ("h200_sync_stack/sync_stack.pt.trace.json.gz", None, 97),  # one GPU, host syncs, Python stacks
        ("h200_hf/input_bound.pt.trace.json.gz", None, 53),  # data-loader gaps (idle stretches of every kind)
    ],
)
def test_blocks_in_slices_give_the_rows_of_their_sql(rel, ranges, rows, monkeypatch):
    # A block whose input is beyond its memory allowance reads it sorted by DuckDB a slice at a time, carrying its
    # running sums, the point a slice ends inside and the island still open into the next: small slices (a prime
    # number of rows, so that they end anywhere: inside a group of points at one instant, an island, a window)
    # give the rows of the SQL to the last bit, and of the numpy way on the whole input.
    path = sample_file(rel)
    ref, v_ref = _run(path, reference=True, ranges=ranges)
    monkeypatch.setattr(native, "_slice_rows", lambda con, name, held=0: rows)
    sizes = _spy_slices(monkeypatch)
    sliced, v_sliced = _run(path, reference=False, ranges=ranges)
    assert sizes and all(n is not None for n in sizes)
    assert sliced["stretches"][0] > 0
    assert sliced == ref
    assert v_sliced == v_ref


BLOCK_TABLES = {"sweep_segments": ("_sw_seg", "_sw_busy"), "stretch_islands": ("_sw_m",), "short_gaps": ("_sw_short",)}


@pytest.mark.parametrize(
    ("rel", "ranges"),
    [
        ("h200_sync_stack/sync_stack.pt.trace.json.gz", None),
        ("h200x2_ddp/kineto", ["ProfilerStep#*"]),  # two ranks, collectives, steps (a window each)
    ],
)
def test_each_block_in_slices_writes_the_tables_of_its_sql(rel, ranges, monkeypatch):
    # Block by block, inside a real run: the block's own tables from its SQL, from numpy on the whole input and
    # in slices as small as 3 rows (every slice ends inside something: a group of points at one instant, a busy
    # island, an island of one category, a window) are the same rows to the last bit.
    compared: list[str] = []

    def both(name, fn):
        def run(con, reference_sql):
            digests = []
            for rows in ("sql", None, 3, 41):
                if rows == "sql":
                    con.execute(reference_sql)
                else:
                    monkeypatch.setattr(native, "_slice_rows", lambda con, name, held=0, rows=rows: rows)
                    fn(con, reference_sql)
                digests.append([_digest(con, t, but=("island",)) for t in BLOCK_TABLES[name]])  # (the SQL's group key)
            assert all(d == digests[0] for d in digests), (name, digests)
            assert digests[0][0][0] > 0
            compared.append(name)

        return run

    for name, fn in list(native.NATIVE.items()):
        if name in BLOCK_TABLES:
            monkeypatch.setitem(native.NATIVE, name, both(name, fn))
    with store.threads(1):
        pipeline.analyse([sample_file(rel)], pipeline.Options(ranges=ranges or [])).close()
    assert sorted(compared) == sorted(BLOCK_TABLES)


def test_blocks_too_large_for_the_memory_budget_run_in_slices_or_their_sql(monkeypatch):
    # Under --memory-budget a block whose arrays would not fit the run's allowance beside DuckDB runs in slices of
    # as many rows as fit; the short gaps run their SQL (which DuckDB spills) when their host intervals alone would
    # take half of it. The same rows as the reference either way. Without a budget, or when the input fits, the
    # numpy way runs on the whole input. (This sample: 294 host intervals, 35 kB held, and 1,243 gaps.)
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    ref, v_ref = _run(path, reference=True)
    sizes = _spy_slices(monkeypatch)
    slices: dict[str, int | None] = {}
    slice_rows = native._slice_rows
    monkeypatch.setattr(
        native, "_slice_rows", lambda con, name, held=0: slices.__setitem__(name, n := slice_rows(con, name, held)) or n
    )
    before = dict(native._allowances)  # (stores other tests left open)
    monkeypatch.setattr(pipeline, "NATIVE_ALLOWANCE", 64 << 10)  # 64 KiB: no block's input fits, nor the intervals
    small, v_small = _run(path, reference=False)
    want = {b: (64 << 10) // native.SLICE_BYTES_PER_ROW[b] for b in ("sweep_segments", "stretch_islands")}
    assert sorted(sizes) == sorted(want.values()) and slices == want  # (the short gaps: their SQL)
    assert small == ref and v_small == v_ref
    assert native._allowances == before  # this run's forgotten when its store closed
    slices.clear()
    monkeypatch.setattr(pipeline, "NATIVE_ALLOWANCE", 128 << 10)  # the intervals fit half of it: the gaps in slices
    gaps, v_gaps = _run(path, reference=False)
    assert slices["short_gaps"] == ((128 << 10) - 294 * native.INTERVAL_BYTES) // native.SLICE_BYTES_PER_ROW["short_gaps"]
    assert slices["short_gaps"] < 1243
    assert gaps == ref and v_gaps == v_ref
    sizes.clear()
    slices.clear()
    with store.threads(1):
        free = pipeline.analyse([path], pipeline.Options(memory_budget=None))  # no budget: no allowance
    free.close()
    assert sizes == [None, None] and set(slices.values()) == {None}
    sizes.clear()
    monkeypatch.setattr(pipeline, "NATIVE_ALLOWANCE", 256 << 20)
    fits, _ = _run(path, reference=False)
    assert sizes == [None, None] and fits == ref


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


# ---------------------------------------------------------------------------------------------- nest_ops


def _nested(path: Path, native_way: bool, edit: str | None = None) -> tuple[list[tuple], bool]:
    """Every op with its depth and its parent's interval, ordered: the same for two ways of nesting whatever op
    ids they chose among ops that tie (the same thread, start and end). And whether numpy did the nesting."""
    inputs = [path]
    took: list[bool] = []
    real = kernel_flops._nest_arrays
    with store.threads(1), pipeline.run_store(inputs, pipeline.Options()) as con:
        pipeline.ingest(con, inputs)
        align.align(con)
        if edit:
            con.execute(edit)
        kernel_flops._nest_arrays = lambda c: (lambda t: took.append(t is not None) or t)(real(c))
        try:
            kernel_flops.nest_ops(con, native=native_way)
        finally:
            kernel_flops._nest_arrays = real
        rows = con.execute("""SELECT c.source_id, c.thread, c.start_ns, c.end_ns, c.depth, p.start_ns, p.end_ns, p.depth
                              FROM ops c LEFT JOIN ops p ON p.op_id = c.parent_op_id ORDER BY ALL""").fetchall()
    return rows, bool(took and all(took))


NESTED = [
    ("sample", "h200_sync_stack/sync_stack.pt.trace.json.gz"),  # Kineto cpu_ops with Python stacks (deep nesting)
    ("sample", "h200x2_ddp/kineto/rank0.pt.trace.json.gz"),  # DDP: autograd threads
    ("sample", "h200_hf/input_bound.pt.trace.json.gz"),  # data-loader threads
    ("corpus", "h200-single-nsys/nsys_workload.sqlite"),  # Nsight Systems emit_nvtx op ranges
    ("corpus", "h200-single-kineto/kineto_single.json.gz"),
    ("corpus", "public-real/param-resnet-2080ti/resnet_kineto.json.gz"),  # µs times: ~1000 tied op pairs
]


@pytest.mark.parametrize(("where", "rel"), NESTED)
def test_nest_ops_in_numpy_gives_the_nesting_of_its_sql(where, rel):
    path = sample_file(rel) if where == "sample" else corpus_file(rel)
    fast, took = _nested(path, native_way=True)
    assert took  # the numpy way ran
    ref, _ = _nested(path, native_way=False)
    assert len(fast) > 100 and any(r[4] and r[4] > 1 for r in fast)  # ops that nest, several levels deep
    assert fast == ref


def test_nest_ops_ties_and_ops_numpy_cannot_take():
    """Ops that tie (a copy of an op, new id) nest alike either way; an op id twice, or an op without an end,
    make the SQL run (numpy declines)."""
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    copy = "INSERT INTO ops SELECT * REPLACE (op_id + 10000000 AS op_id) FROM ops WHERE depth IS NULL AND op_id % 7 = 0"
    fast, took = _nested(path, native_way=True, edit=copy)
    assert took
    assert fast == _nested(path, native_way=False, edit=copy)[0]
    # One thread's ops 2^61 ns earlier (a hostile file's times): (thread, time) no longer fits one int64 as it
    # is, and numpy nests by the times' ranks instead.
    far = (
        "UPDATE ops SET start_ns = start_ns - (1::BIGINT << 61), end_ns = end_ns - (1::BIGINT << 61) "
        "WHERE thread = (SELECT min(thread) FROM ops)"
    )
    fast, took = _nested(path, native_way=True, edit=far)
    assert took
    assert fast == _nested(path, native_way=False, edit=far)[0]
    for edit in ("INSERT INTO ops SELECT * FROM ops WHERE op_id % 50 = 0", "UPDATE ops SET end_ns = NULL WHERE op_id % 50 = 0"):
        fast, took = _nested(path, native_way=True, edit=edit)
        assert not took
        assert fast == _nested(path, native_way=False, edit=edit)[0]


def test_nest_ops_beyond_the_native_allowance_runs_its_sql(monkeypatch):
    """More ops than the run's allowance for native blocks holds (BYTES_PER_ROW['nest_ops'] each: the 4 GiB Kineto
    trace's 4.12 M ops took 1 GiB in numpy, under any budget): the SQL nests them (it spills), numpy is not asked,
    and the nesting is the numpy way's."""
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    fast, took = _nested(path, native_way=True)
    assert took
    inputs = [path]
    with store.threads(1), pipeline.run_store(inputs, pipeline.Options()) as con:
        pipeline.ingest(con, inputs)
        align.align(con)
        ((n,),) = con.execute("SELECT count(*) FROM ops").fetchall()
        native.allow(con, n * native.BYTES_PER_ROW["nest_ops"] - 1)  # one byte short of the ops
        monkeypatch.setattr(kernel_flops, "_nest_arrays", lambda c: pytest.fail("numpy asked beyond the allowance"))
        kernel_flops.nest_ops(con)
        rows = con.execute("""SELECT c.source_id, c.thread, c.start_ns, c.end_ns, c.depth, p.start_ns, p.end_ns, p.depth
                              FROM ops c LEFT JOIN ops p ON p.op_id = c.parent_op_id ORDER BY ALL""").fetchall()
    assert rows == fast


def _table_after_run(path: Path, ranges: list[str] | None, table: str) -> tuple[int, int]:
    """`table`'s digest after analysing `path` (one DuckDB thread)."""
    with store.threads(1):
        res = pipeline.analyse([path], pipeline.Options(ranges=ranges or []))
    try:
        return _digest(res.con, table)
    finally:
        res.close()


def _launch_stats_sorted_spy(monkeypatch) -> list[str]:
    """The statements `native.launch_stats` runs from its sorted form (sql.fill's where)."""
    taken: list[str] = []
    fill = sql.fill
    monkeypatch.setattr(
        sql, "fill", lambda text, where="SQL": (where == "sql/native.py" and taken.append(where)) or fill(text, where)
    )
    return taken


@pytest.mark.parametrize(
    ("rel", "ranges"),
    [
        ("h200_sync_stack/sync_stack.pt.trace.json.gz", None),  # one GPU, host syncs
        ("h200x2_ddp/kineto", ["ProfilerStep#*"]),  # two ranks, collectives, a window per step
        ("h200_hf/llama_nsys.sqlite", ["train_step"]),  # Nsight Systems, NVTX ranges
    ],
)
def test_launch_stats_from_sorted_values_gives_the_rows_of_its_sql(rel, ranges, monkeypatch):
    # Where its quantile states would take more than half of DuckDB's memory limit, launch_stats comes from the
    # values sorted within their groups (which spills): the same rows as its SQL, to the last bit.
    path = sample_file(rel)
    taken = _launch_stats_sorted_spy(monkeypatch)
    ref = _table_after_run(path, ranges, "launch_stats")
    assert taken == []  # (a sample's kernels: the SQL)
    monkeypatch.setattr(native, "LAUNCH_STATS_BYTES_PER_ROW", 1 << 40)
    assert _table_after_run(path, ranges, "launch_stats") == ref
    assert taken and ref[0] > 1


def test_launch_stats_quantiles_from_sorted_values_are_quantile_disc(monkeypatch):
    # Streams of 1 to 120 kernels (durations with ties; every third launch missing, so delays are NULL there; calls
    # that launch several kernels; copies left out) in two windows, and one kernel without a GPU: the sorted form
    # picks the p50 and p99 DuckDB's quantile_disc picks, for every group size.
    con = duckdb.connect()
    con.execute("""
        CREATE TABLE kernels AS
        SELECT i AS kernel_id, g AS stream, i * 1000 AS start_ns, i * 1000 + (hash(i) % 97) * 10 AS end_ns,
               CASE WHEN i % 11 = 0 THEN 'memcpy' ELSE 'compute' END AS kind
        FROM (SELECT row_number() OVER () AS i, g FROM range(1, 121) r(g), range(g) s(j))""")
    con.execute("""
        CREATE TABLE window_kernels AS
        SELECT w.scope, w.range_name, 0 AS rank, CASE WHEN kernel_id = 7 THEN NULL ELSE 0 END AS device, kernel_id
        FROM kernels, (VALUES ('window', NULL), ('range', 'step')) w(scope, range_name)
        WHERE w.scope = 'window' OR kernel_id % 2 = 0""")
    con.execute("""
        CREATE TABLE kernel_launch AS
        SELECT kernel_id, 1 AS launch_thread, start_ns - 500 - (kernel_id % 5) AS launch_start_ns,
               start_ns - 400 + (hash(kernel_id // 2) % 13) AS launch_end_ns,
               CASE WHEN kernel_id % 17 = 0 THEN 'cudaGraphLaunch' ELSE 'cudaLaunchKernel' END AS launch_name
        FROM kernels WHERE kernel_id % 3 <> 0""")
    taken = _launch_stats_sorted_spy(monkeypatch)
    with sql.reference():
        sql.install(con, "launch_stats")
    ref = _digest(con, "launch_stats")
    monkeypatch.setattr(native, "LAUNCH_STATS_BYTES_PER_ROW", 1 << 40)
    sql.install(con, "launch_stats")
    assert taken and _digest(con, "launch_stats") == ref
    ((groups,),) = con.execute("""
        SELECT count(DISTINCT (w.scope, w.range_name, w.device, k.stream)) FROM window_kernels w
        JOIN kernels k USING (kernel_id) WHERE k.kind <> 'memcpy'""").fetchall()
    assert ref[0] == groups > 200  # a row per window, GPU and stream


def _levels_spy(monkeypatch) -> list[int]:
    """How many ops each level-by-level walk (`native._owners_level_by_level`) found an owner for."""
    walked: list[int] = []
    walk = native._owners_level_by_level

    def spy(con: duckdb.DuckDBPyConnection) -> None:
        walk(con)
        walked.append(int(con.execute("SELECT count(*) FROM _ks_owner").fetchall()[0][0]))

    monkeypatch.setattr(native, "_owners_level_by_level", spy)
    return walked


@pytest.mark.parametrize(
    ("rel", "ranges"),
    [
        ("h200_sync_stack/sync_stack.pt.trace.json.gz", None),  # GPT: linear layers under modules, Python stacks
        ("h200_hf/llama_eager.pt.trace.json.gz", None),  # HF Llama: attention, MLP, under modules
        ("h200_hf/bert_amp.pt.trace.json.gz", None),  # mixed precision: casts between the modules and their matmuls
    ],
)
def test_shape_owners_level_by_level_give_the_rows_of_their_sql(rel, ranges, monkeypatch):
    # Where the recursive walk up the callers would take more than half of DuckDB's memory limit, each launching
    # op's shape op is found one level at a time (joins that spill): kernel_shapes has the same rows.
    path = sample_file(rel)
    walked = _levels_spy(monkeypatch)
    ref = _table_after_run(path, ranges, "kernel_shapes")
    assert walked == []  # (a sample's ops: the recursive SQL)
    monkeypatch.setattr(native, "SHAPE_WALK_BYTES_PER_ROW", 1 << 40)
    assert _table_after_run(path, ranges, "kernel_shapes") == ref
    assert ref[0] > 0 and walked and walked[0] > 0


def test_shape_owners_level_by_level_past_64_callers_and_shapes_at_every_level():
    # Call chains 1 to 70 deep, a shape on every fifth op of each, several launching ops per chain: each
    # launching op's outermost shape op within 64 levels up is the one the recursive SQL finds.
    con = duckdb.connect()
    con.execute("""
        CREATE TABLE ops AS
        SELECT c * 100 + d AS op_id, CASE WHEN d > 0 THEN c * 100 + d - 1 END AS parent_op_id, d AS depth,
               CASE WHEN (c + d) % 5 = 0 THEN 'aten::mm' ELSE 'aten::other' END AS name
        FROM range(1, 71) r(c), range(0, 70) s(d) WHERE d < c""")
    con.execute("CREATE TABLE kernel_launch AS SELECT op_id FROM ops WHERE op_id % 7 = 0 OR depth = 69")
    con.execute("CREATE TEMP TABLE _ks_shaped AS SELECT op_id FROM ops WHERE name = 'aten::mm'")
    reference = sql._NATIVE_RE.search(sql.render("shapes"))
    assert reference is not None and reference.group(1) == "shape_owners"
    con.execute(reference.group(2))
    ref = _digest(con, "_ks_owner")
    native._owners_level_by_level(con)
    assert _digest(con, "_ks_owner") == ref
    assert ref[0] > 100
    ((deep,),) = con.execute("SELECT count(*) FROM _ks_owner o JOIN ops USING (op_id) WHERE depth < 5").fetchall()
    assert deep > 0  # (owners found far up the chains)
