"""FLOPs and bytes per kernel (SPEC §4), written to `kernels` in one place. Each source of figures gives its
candidates — Nsight Compute (joined by kernel name and occurrence order), the op's FLOPs (the trace's own, else a
shape model) split over the kernels it launched, the byte models of the ops without FLOPs, `--model-flops` per
step or range occurrence — and `write` applies them once, by precedence: ncu, then --model-flops, then the op.
Ops are nested and linked to their kernels first (sql/kernel_launch.sql: checked links). SQL over the store.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pyarrow as pa

from . import sql
from .errors import BadInput
from .flops import MODELS, op_bytes, op_flops, op_precision, op_traffic_bytes
from .sql import native as sql_native
from .store import one
from .vocab import (
    AUX_ATTENTION_KERNEL_RE,
    KERNEL_ELEMENT_BYTES_RE,
    MATMUL_KERNEL_RE,
    MAX_KERNEL_AMOUNT,
    MAX_PLAUSIBLE_BANDWIDTH_BYTES_S,
)

# Candidate tables (temporary): one row per kernel a source gives a figure for.
_CANDIDATES = ("_kf_op", "_kb_op", "_kf_ncu", "_kf_user")


# --------------------------------------------------------------------------------------------------------- ops


NEST_DEPTH_SQL = """
    CREATE OR REPLACE TEMP TABLE _op_depth AS
    WITH ev AS (
        SELECT source_id, thread, start_ns AS t, 1 AS d, 1 AS is_start, end_ns, op_id FROM ops
        UNION ALL
        SELECT source_id, thread, end_ns, -1, 0, NULL, NULL FROM ops
    ), run AS (
        SELECT *, sum(d) OVER (PARTITION BY source_id, thread
                               ORDER BY t, is_start, end_ns DESC ROWS UNBOUNDED PRECEDING) AS lvl
        FROM ev
    )
    SELECT op_id, (lvl - 1)::INTEGER AS depth FROM run WHERE is_start = 1"""
NEST_PARENT_SQL = """
    CREATE OR REPLACE TEMP TABLE _op_parent AS
    SELECT c.op_id, p.op_id AS parent
    FROM ops c ASOF JOIN ops p
      ON c.source_id = p.source_id AND c.thread = p.thread AND p.depth = c.depth - 1 AND p.start_ns <= c.start_ns
    WHERE c.depth > 0 AND p.end_ns >= c.end_ns"""


def nest_ops(con: duckdb.DuckDBPyConnection, native: bool = True) -> None:
    """ops.depth and ops.parent_op_id from nesting on each thread (ops on one thread nest). The definition is
    the SQL (`NEST_DEPTH_SQL`: an op's depth is the number of ops open on its thread when it starts — ends before
    starts at one time, a longer op before a shorter one; `NEST_PARENT_SQL`: its parent the latest-starting op one
    level up that started no later and ends no earlier); `_nest_arrays` computes the same in numpy (DuckDB's
    ordered window over every op's two events was most of this step: 0.7 of 0.9 CPU s for 346 k NVTX ops).
    `native=False`, ops more than the run's allowance for native blocks holds (sql/native.py: `fits`), or ops that
    numpy cannot take as they are (a NULL time or op id, an op id twice), run the SQL."""
    nested = _nest_arrays(con) if native and sql_native.fits(con, "nest_ops") else None
    if nested is None:
        con.execute(NEST_DEPTH_SQL)
        con.execute("UPDATE ops SET depth = d.depth FROM _op_depth d WHERE ops.op_id = d.op_id")
        con.execute(NEST_PARENT_SQL)
        con.execute("UPDATE ops SET parent_op_id = p.parent FROM _op_parent p WHERE ops.op_id = p.op_id")
        con.execute("DROP TABLE _op_depth; DROP TABLE _op_parent")
        return
    # Both columns in one UPDATE (every op has a row; `parent` NULL where it has none): an UPDATE of the ops grows
    # faster than the ops (1.37 M: 8.5-11x the time of 346 k); two of them took 0.24-0.52 s there, one 0.18-0.25 s
    # (benchmarks/README.md, session 29).
    con.register("_op_nested", nested)
    try:
        con.execute("UPDATE ops SET depth = n.depth, parent_op_id = n.parent FROM _op_nested n WHERE ops.op_id = n.op_id")
    finally:
        con.unregister("_op_nested")


def _nest_arrays(con: duckdb.DuckDBPyConnection) -> pa.Table | None:
    """(op_id, depth, parent) of every op as the two SQL statements of `nest_ops` give them, in whole-array steps:
    each op's depth is the number of its thread's starts before it in the window's order less the number of the
    thread's ends at or before its start (one sort of the starts, one of the ends, one binary search); the parent
    by one binary search among the starts sorted by (depth, thread, start). Where the SQL's order leaves a tie (two
    ops of one thread with the same start and end; two candidate parents with the same start) its choice is
    arbitrary (on a trace of microsecond times, one tied pair one way and the next the other way); here the order
    the ops are stored in (the trace's) decides: the first of two tied ops is the outer one. None when a time or op
    id is NULL or an op id repeats (the SQL then runs)."""
    o = con.sql("SELECT source_id, thread, start_ns, end_ns, op_id, rowid AS at FROM ops").fetchnumpy()
    n = len(o["op_id"])
    if n == 0:
        return None
    cols = {}
    for c in ("start_ns", "end_ns", "op_id"):
        x = o[c]
        if np.ma.isMaskedArray(x) and np.ma.getmaskarray(x).any():
            return None
        cols[c] = np.asarray(x, dtype=np.int64)
    start, end, op_id = cols["start_ns"], cols["end_ns"], cols["op_id"]
    tie = np.asarray(o["at"], dtype=np.int64)
    if _sorted_unique(op_id).size != n:
        return None
    # the thread partition: (source_id, thread) numbered, NULL a value of its own (as PARTITION BY has it)
    keys = []
    for c in ("source_id", "thread"):
        x = o[c]
        null = np.ma.getmaskarray(x) if np.ma.isMaskedArray(x) else np.zeros(n, dtype=bool)
        keys += [np.where(null, 0, np.asarray(np.ma.getdata(x), dtype=np.int64)), null]
    by_part = np.lexsort(keys[::-1])
    sk = [k[by_part] for k in keys]
    new = np.ones(n, dtype=bool)
    new[1:] = np.any([k[1:] != k[:-1] for k in sk], axis=0)
    part = np.empty(n, dtype=np.int64)
    part[by_part] = np.cumsum(new) - 1
    # (thread, time) as one int64 key, for the starts and the ends: the time from the trace's first, or (should the
    # pair not fit in 62 bits: times of a hostile file) its rank among every start and end
    lo = min(int(start.min()), int(end.min()))
    width = max(int(start.max()), int(end.max())) - lo + 1
    if (int(part.max()) + 1) * width < 1 << 62:
        ks, ke = part * width + (start - lo), part * width + (end - lo)
    else:
        times = _sorted_unique(np.concatenate([start, end]))
        ks = part * (times.size + 1) + np.searchsorted(times, start)
        ke = part * (times.size + 1) + np.searchsorted(times, end)
    # the starts in the window's order: thread, start, the longer op first, then the order the ops are stored in
    by_start = np.lexsort((tie, -end, ks))
    # an op's depth: the starts before it in that order less the ends at or before it (ends before starts at one
    # time), as the running sum over both in one order counts them; a thread's ops all end, so the threads before
    # it add nothing
    depth = np.empty(n, dtype=np.int64)
    depth[by_start] = np.arange(n) - np.searchsorted(np.sort(ke), ks[by_start], side="right")
    # parents: the starts sorted by (depth, thread, start, stored order), as one key: the depth, then the start's
    # rank among the distinct (thread, start) pairs (< n + 1: no overflow); for each op one level down, the last
    # start <= its own in its thread's level above (as the ASOF join), kept when that op ends no earlier
    sorted_ks = ks[by_start]
    rank = np.empty(n, dtype=np.int64)
    rank[by_start] = np.cumsum(np.concatenate(([0], sorted_ks[1:] != sorted_ks[:-1])))
    lowest = int(depth.min())
    key = (depth - lowest) * (n + 1) + rank
    by = np.lexsort((tie, key))
    at = np.searchsorted(key[by], key - (n + 1), side="right") - 1  # (depth - 1, the same rank or the last below)
    ok = (depth > 0) & (at >= 0)
    cand = by[np.where(ok, at, 0)]
    ok &= (depth[cand] == depth - 1) & (part[cand] == part) & (end[cand] >= end)
    parent = pa.array(np.where(ok, op_id[cand], 0), pa.int64(), mask=~ok)
    return pa.table({"op_id": pa.array(op_id, pa.int64()), "depth": pa.array(depth, pa.int32()), "parent": parent})


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of `x`, sorted (by one sort: numpy's hash-based unique was 3x slower here)."""
    s = np.sort(x)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def model_op_flops(con: duckdb.DuckDBPyConnection) -> int:
    """Fill ops.flops from the FLOP models where the trace gave none; record each op's precision and bytes.
    The models run once per distinct (name, shapes, types, concrete inputs), not once per op: a long trace
    repeats a few hundred shapes millions of times."""
    shapes = con.execute(
        """
        SELECT DISTINCT name, input_dims, input_types, concrete_inputs FROM ops
        WHERE name IN (SELECT unnest(?::VARCHAR[]))""",
        [list(MODELS)],
    ).fetchall()
    if not shapes:
        return 0
    con.register(
        "_op_model",
        pa.table(
            {
                "name": pa.array([n for n, _, _, _ in shapes], pa.string()),
                "dims": pa.array([d for _, d, _, _ in shapes], pa.string()),
                "types": pa.array([t for _, _, t, _ in shapes], pa.string()),
                "concrete": pa.array([c for _, _, _, c in shapes], pa.string()),
                "f": pa.array([op_flops(n, d, c) for n, d, _, c in shapes], pa.float64()),
                "p": pa.array([op_precision(t) for _, _, t, _ in shapes], pa.string()),
                "b": pa.array([op_bytes(n, d, t, c) for n, d, t, c in shapes], pa.float64()),
            }
        ),
    )
    # the trace's own `flops` arg wins over the model (SPEC §4 precedence)
    con.execute("""
        UPDATE ops SET flops = coalesce(ops.flops, m.f),
                       flops_source = CASE WHEN ops.flops IS NOT NULL THEN 'op' WHEN m.f IS NOT NULL THEN 'model' END,
                       precision = m.p, bytes = m.b
        FROM _op_model m
        WHERE ops.name = m.name AND ops.input_dims IS NOT DISTINCT FROM m.dims
          AND ops.input_types IS NOT DISTINCT FROM m.types AND ops.concrete_inputs IS NOT DISTINCT FROM m.concrete""")
    con.unregister("_op_model")
    row = one(con, "SELECT count(*) FROM ops WHERE flops IS NOT NULL AND name IN (SELECT unnest(?::VARCHAR[]))", [list(MODELS)])
    return int(row[0]) if row else 0


def prepare_ops(con: duckdb.DuckDBPyConnection) -> None:
    """Ops nested on their threads, with their FLOP / byte models and precisions."""
    nest_ops(con)
    model_op_flops(con)


def link_kernels(con: duckdb.DuckDBPyConnection) -> None:
    """kernel_launch (each activity's launch and checked op link), and kernels.op_id from it."""
    sql.install(con, "vocab", "kernel_launch")
    con.execute("""UPDATE kernels SET op_id = l.op_id FROM kernel_launch l
                   WHERE kernels.kernel_id = l.kernel_id AND kernels.op_id IS DISTINCT FROM l.op_id""")


# ------------------------------------------------------------------------------------------ op FLOPs and bytes


def op_byte_shapes_sql(ops_table: str, kernels_table: str) -> str:
    """The distinct (name, input_dims, input_types, concrete_inputs, elem_hint) of the ops of `ops_table` that launched
    compute kernels: the byte models run once per row of this, not once per op."""
    return f"""
        WITH h AS (
            SELECT op_id, max(try_cast(regexp_extract(name, '{KERNEL_ELEMENT_BYTES_RE}', 1) AS INTEGER)) AS elem_hint
            FROM {kernels_table} WHERE op_id IS NOT NULL AND kind = 'compute' GROUP BY op_id
        )
        SELECT o.op_id, o.name, o.input_dims, o.input_types, o.concrete_inputs,
               CASE WHEN o.input_types LIKE '%TensorList%' THEN h.elem_hint END AS elem_hint
        FROM {ops_table} o JOIN h USING (op_id) WHERE o.input_dims IS NOT NULL"""


def evaluate_op_bytes(con: duckdb.DuckDBPyConnection, ops_sql: str, view: str) -> None:
    """Register `view(op_id, b)`: each op of `ops_sql` (op_byte_shapes_sql) with its byte model's figure, the model
    evaluated once per distinct shape."""
    shapes = con.execute(f"""SELECT DISTINCT name, input_dims, input_types, concrete_inputs, elem_hint
                             FROM ({ops_sql})""").fetchall()
    con.register(
        f"{view}_shapes",
        pa.table(
            {
                "name": pa.array([r[0] for r in shapes], pa.string()),
                "input_dims": pa.array([r[1] for r in shapes], pa.string()),
                "input_types": pa.array([r[2] for r in shapes], pa.string()),
                "concrete_inputs": pa.array([r[3] for r in shapes], pa.string()),
                "elem_hint": pa.array([r[4] for r in shapes], pa.int32()),
                "b": pa.array([op_traffic_bytes(*r) for r in shapes], pa.float64()),
            }
        ),
    )
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {view} AS
        SELECT o.op_id, s.b FROM ({ops_sql}) o JOIN {view}_shapes s
          ON s.name = o.name AND s.input_dims = o.input_dims AND s.input_types IS NOT DISTINCT FROM o.input_types
         AND s.concrete_inputs IS NOT DISTINCT FROM o.concrete_inputs AND s.elem_hint IS NOT DISTINCT FROM o.elem_hint
        WHERE s.b IS NOT NULL""")
    con.unregister(f"{view}_shapes")


def op_candidates(con: duckdb.DuckDBPyConnection) -> None:
    """SPEC §4 step 3: the outermost op with a FLOP figure that was open on the launching thread at launch time owns
    the kernel; its FLOPs (and matmul bytes) are split by duration over its matmul-like kernels (or all, if none).
    Every compute kernel it owns records it as owner (`_kf_op`). The other compute kernels get their op's byte
    model, split by duration (`_kb_op`)."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _mroots AS
        WITH m AS (SELECT * FROM ops WHERE flops IS NOT NULL),
        ev AS (
            SELECT source_id, thread, start_ns AS t, 1 AS d, 1 AS is_start, end_ns AS e, op_id FROM m
            UNION ALL SELECT source_id, thread, end_ns, -1, 0, NULL, NULL FROM m
        ), run AS (
            SELECT *, sum(d) OVER (PARTITION BY source_id, thread
                                   ORDER BY t, is_start, e DESC ROWS UNBOUNDED PRECEDING) AS lvl FROM ev
        )
        SELECT m.* FROM m JOIN run r ON r.op_id = m.op_id WHERE r.is_start = 1 AND r.lvl = 1""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _kf_op AS
        WITH owned AS (
            SELECT l.kernel_id, r.op_id AS owner, r.flops AS op_flops, r.bytes AS op_bytes, r.flops_source AS src
            FROM (SELECT * FROM kernel_launch WHERE launch_thread IS NOT NULL) l
            ASOF JOIN _mroots r
              ON l.source_id = r.source_id AND l.launch_thread = r.thread AND r.start_ns <= l.launch_start_ns
            WHERE r.end_ns >= l.launch_start_ns
        ), k AS (
            SELECT o.*, (kk.end_ns - kk.start_ns)::DOUBLE AS dur,
                   regexp_matches(kk.name, '{MATMUL_KERNEL_RE}') AND NOT regexp_matches(kk.name, '{AUX_ATTENTION_KERNEL_RE}')
                       AS mm
            FROM owned o JOIN kernels kk USING (kernel_id)
            WHERE kk.kind = 'compute'
        ), elig AS (
            SELECT k.*, bool_or(mm) OVER (PARTITION BY owner) AS any_mm FROM k
        ), e AS (
            SELECT *, mm OR NOT any_mm AS gets,
                   sum(dur) FILTER (WHERE mm OR NOT any_mm) OVER (PARTITION BY owner) AS tot,
                   count(*) FILTER (WHERE mm OR NOT any_mm) OVER (PARTITION BY owner) AS n
            FROM elig
        )
        SELECT kernel_id, owner, src,
               CASE WHEN NOT gets THEN NULL WHEN tot > 0 THEN op_flops * dur / tot ELSE op_flops / n END AS flops,
               CASE WHEN NOT gets THEN NULL WHEN tot > 0 THEN op_bytes * dur / tot ELSE op_bytes / n END AS bytes
        FROM e""")
    con.execute("DROP TABLE _mroots")
    # Bytes for the rest: each op that launched compute kernels and has no byte figure gets its byte model
    # (flops.op_traffic_bytes: norms, softmax, reductions, embedding, copies, gathers, cat; else elementwise),
    # evaluated once per distinct (name, dims, types, concrete inputs); its compute kernels without FLOPs share
    # them by duration.
    evaluate_op_bytes(con, op_byte_shapes_sql("(SELECT * FROM ops WHERE bytes IS NULL)", "kernels"), "_op_shape_bytes")
    con.execute("UPDATE ops SET bytes = s.b FROM _op_shape_bytes s WHERE ops.op_id = s.op_id AND ops.bytes IS NULL")
    con.execute("DROP TABLE _op_shape_bytes")
    # "Every input read once" over-counts gathers (losses, indexing): an estimate implying more bandwidth than
    # any GPU's memory has (1.5x the fastest HBM in peaks.toml) is wrong, and is dropped rather than shown.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _kb_op AS
        WITH k AS (
            SELECT k.kernel_id, k.end_ns - k.start_ns AS dur, o.bytes * (k.end_ns - k.start_ns)
                   / nullif(sum(k.end_ns - k.start_ns) OVER (PARTITION BY k.op_id), 0) AS b
            FROM kernels k JOIN ops o ON o.op_id = k.op_id
            WHERE k.kind = 'compute' AND k.bytes IS NULL AND o.bytes IS NOT NULL
              AND k.kernel_id NOT IN (SELECT kernel_id FROM _kf_op WHERE flops IS NOT NULL)
        )
        SELECT kernel_id, b AS bytes FROM k
        WHERE b IS NOT NULL AND NOT (dur > 0 AND b / (dur / 1e9) > {MAX_PLAUSIBLE_BANDWIDTH_BYTES_S})""")


# ------------------------------------------------------------------------------------------- Nsight Compute


def _key_exact(name: str) -> str:
    return name


def _key_normalized(name: str) -> str:
    """Demanglers differ (`at::native::` vs `at::`, `2ul` vs `2`, `char*` vs `char *`, concrete vs T1
    parameters): compare names without namespaces, parameter list, integer suffixes and spaces."""
    n = name.strip()
    n = n[5:] if n.startswith("void ") else n
    n = re.sub(r"\(anonymous namespace\)::|<unnamed>::|\{anonymous\}::", "", n)
    depth = 0
    cut = len(n)
    for i, ch in enumerate(n):  # cut the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    n = n[:cut]
    n = re.sub(r"[A-Za-z_][A-Za-z0-9_]*::", "", n)
    n = re.sub(r"\b(\d+)(ul|ull|u|l|ll)\b", r"\1", n)
    return re.sub(r"\s+", "", n)


def _key_base(name: str) -> str:
    n = _key_normalized(name)
    return n.split("<", 1)[0]


KEYS = (("exact", _key_exact), ("normalized", _key_normalized), ("function", _key_base))


def ncu_candidates(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Nsight Compute launches → trace kernels, by name and occurrence order (per rank): the k-th profiled launch
    of a kernel is the k-th launch of that kernel in the trace. Names are compared exactly, else without namespaces
    / parameters, else by function name. Joined kernels take ncu's FLOPs and DRAM bytes (`_kf_ncu`); ncu_kernels
    records the kernel each launch was joined to. Returns the note."""
    con.execute("CREATE OR REPLACE TEMP TABLE _kf_ncu (kernel_id BIGINT, flops DOUBLE, bytes DOUBLE)")
    n_ncu = one(con, "SELECT count(*) FROM ncu_kernels")
    if not n_ncu or not n_ncu[0]:
        return []
    ncu_names = [n for (n,) in con.execute("SELECT DISTINCT name FROM ncu_kernels").fetchall()]
    trace_names = [n for (n,) in con.execute("SELECT DISTINCT name FROM kernels WHERE kind IN ('compute', 'nccl')").fetchall()]
    level_of: dict[str, tuple[str, str]] = {}
    for nm in ncu_names:
        for level, fn in KEYS:
            k = fn(nm)
            if k and any(fn(t) == k for t in trace_names):
                level_of[nm] = (level, k)
                break
    if not level_of:
        return [
            f"Nsight Compute: none of its {len(ncu_names)} kernel names occurs in the trace (was it the same "
            "program?); its counts are kept in ncu_kernels"
        ]
    tkeys = {(level, t): fn(t) for level, fn in KEYS for t in trace_names}
    con.register(
        "_ncu_map",
        pa.table(
            {"ncu_name": list(level_of), "level": [level_of[n][0] for n in level_of], "key": [level_of[n][1] for n in level_of]}
        ),
    )
    con.register(
        "_trace_map", pa.table({"level": [lv for lv, _ in tkeys], "name": [t for _, t in tkeys], "key": list(tkeys.values())})
    )
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _ncu_join AS
        WITH n AS (
            SELECT m.level, m.key, x.*,
                   row_number() OVER (PARTITION BY m.level, m.key ORDER BY x.source_id, x.launch_id) - 1 AS k_occ
            FROM ncu_kernels x JOIN _ncu_map m ON m.ncu_name = x.name
        ), used AS (SELECT DISTINCT level, key FROM n),
        t AS (
            SELECT k.kernel_id, k.rank, u.level, u.key,
                   row_number() OVER (PARTITION BY k.rank, u.level, u.key ORDER BY k.start_ns, k.kernel_id) - 1 AS k_occ
            FROM kernels k JOIN _trace_map tm ON tm.name = k.name
            JOIN used u ON u.level = tm.level AND u.key = tm.key
            WHERE k.kind IN ('compute', 'nccl')
        )
        SELECT t.kernel_id, n.source_id, n.launch_id, n.flops, n.dram_bytes
        FROM t JOIN n ON n.level = t.level AND n.key = t.key AND n.k_occ = t.k_occ""")
    con.unregister("_ncu_map")
    con.unregister("_trace_map")
    con.execute("""INSERT INTO _kf_ncu SELECT kernel_id, any_value(flops), any_value(dram_bytes) FROM _ncu_join
                   WHERE flops IS NOT NULL GROUP BY kernel_id""")
    con.execute("""UPDATE ncu_kernels SET kernel_id = j.kernel_id FROM (
                       SELECT source_id, launch_id, min(kernel_id) AS kernel_id FROM _ncu_join GROUP BY ALL) j
                   WHERE ncu_kernels.source_id = j.source_id AND ncu_kernels.launch_id = j.launch_id""")
    joined = one(con, "SELECT count(*), count(*) FILTER (WHERE flops IS NOT NULL) FROM _ncu_join") or (0, 0)
    matched_launches = one(con, "SELECT count(*) FROM ncu_kernels WHERE kernel_id IS NOT NULL") or (0,)
    con.execute("DROP TABLE _ncu_join")
    levels = sorted({lv for lv, _ in level_of.values()} - {"exact"})
    note = (
        f"Nsight Compute: {matched_launches[0]} of {n_ncu[0]} profiled launches matched trace kernels by name "
        f"and occurrence; {joined[1]} trace kernels take ncu FLOPs"
    )
    if levels:
        note += f" (names compared {' / '.join(levels)} where they differ)"
    return [note]


# ------------------------------------------------------------------------------------------- --model-flops


def user_candidates(con: duckdb.DuckDBPyConnection, flops_per_occurrence: float, label: str | None) -> str:
    """--model-flops (SPEC §4): the user's FLOPs per occurrence of the range `label` (range_launches: the --range,
    or ProfilerStep#*), spread over the compute kernels that occurrence launched by their duration (an occurrence
    that launched none: the compute kernels in its window, by their time in it). Without steps or ranges: once
    over each rank's whole profile. Returns the note."""
    if not flops_per_occurrence >= 0:
        raise BadInput(None, "--model-flops must be a non-negative number")
    sql.install(con, "vocab")
    have = label is not None and (one(con, "SELECT count(*) FROM range_occurrences WHERE label = ?", [label]) or (0,))[0]
    # the kernels that may do the model's matmul-class work: not communication, not known to do none (an
    # elementwise, norm or routing kernel takes no share); all compute kernels when none is left
    base = "k.kind = 'compute' AND NOT is_communication_kernel(k.kind, k.name) AND k.end_ns > k.start_ns"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _kf_cand AS
        SELECT k.* FROM kernels k LEFT JOIN ops o ON o.op_id = k.op_id
        WHERE {base} AND NOT known_no_matmul_kernel(k.name, o.name)""")
    if not (one(con, "SELECT count(*) FROM _kf_cand") or (0,))[0]:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _kf_cand AS SELECT k.* FROM kernels k WHERE {base}")
    if have:
        what = f"each occurrence of {label}"
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _kf_user AS
            WITH own AS (
                SELECT l.rank, l.occurrence, k.kernel_id, (k.end_ns - k.start_ns)::DOUBLE AS t
                FROM range_launches l JOIN _kf_cand k USING (kernel_id) WHERE l.label = $label
            ), occ AS (
                SELECT DISTINCT rank, occurrence FROM range_occurrences WHERE label = $label
            ), none AS (
                SELECT o.* FROM occ o ANTI JOIN own ON own.rank IS NOT DISTINCT FROM o.rank
                                                    AND own.occurrence = o.occurrence
            ), inside AS (
                SELECT r.rank, r.occurrence, k.kernel_id,
                       (least(k.end_ns, r.end_ns) - greatest(k.start_ns, r.start_ns))::DOUBLE AS t
                FROM range_occurrences r SEMI JOIN none n ON n.rank IS NOT DISTINCT FROM r.rank
                                                         AND n.occurrence = r.occurrence
                JOIN _kf_cand k ON k.rank IS NOT DISTINCT FROM r.rank AND k.device = r.device
                 AND k.start_ns < r.end_ns AND k.end_ns > r.start_ns
                WHERE r.label = $label
            ), parts AS (SELECT * FROM own UNION ALL SELECT * FROM inside WHERE t > 0)
            SELECT kernel_id, sum(t / tot * $f) AS flops
            FROM (SELECT *, sum(t) OVER (PARTITION BY rank, occurrence) AS tot FROM parts) GROUP BY kernel_id""",
            {"label": label, "f": flops_per_occurrence},
        )
    else:
        what = "each rank's profiled window (no steps or ranges to divide it by)"
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _kf_user AS
            SELECT kernel_id, (k.end_ns - k.start_ns) / sum(k.end_ns - k.start_ns) OVER (PARTITION BY k.rank) * $f
                   AS flops
            FROM _kf_cand k""",
            {"f": flops_per_occurrence},
        )
    con.execute("DROP TABLE _kf_cand")
    return (
        f"--model-flops: {flops_per_occurrence:.4g} FLOP per {what}, spread by time over its compute kernels that "
        "may do matmul-class work"
    )


# ------------------------------------------------------------------------------------------------ the write


def write(con: duckdb.DuckDBPyConnection) -> list[str]:
    """kernels.flops / bytes / flops_source / flops_op_id from the candidates, once: Nsight Compute, else
    --model-flops (which replaces every shape-model estimate), else the owning op's share; bytes from ncu, else the
    op's matmul bytes, else its byte model, else what the parser recorded (copies). An estimate above
    vocab.MAX_KERNEL_AMOUNT is left out (the kernel's FLOPs, or bytes, unknown); returns the notes saying so."""
    for t in _CANDIDATES:
        cols = (
            "kernel_id BIGINT, owner BIGINT, src VARCHAR, flops DOUBLE, bytes DOUBLE"
            if t == "_kf_op"
            else "kernel_id BIGINT, bytes DOUBLE"
            if t == "_kb_op"
            else "kernel_id BIGINT, flops DOUBLE"
            if t == "_kf_user"
            else "kernel_id BIGINT, flops DOUBLE, bytes DOUBLE"
        )
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {t} ({cols})")
    user = bool((one(con, "SELECT count(*) FROM _kf_user") or (0,))[0])
    con.execute(f"""
        UPDATE kernels SET flops = x.flops, bytes = x.bytes, flops_source = x.src, flops_op_id = x.owner FROM (
            SELECT k.kernel_id,
                   CASE WHEN n.kernel_id IS NOT NULL THEN n.flops
                        WHEN {user} THEN u.flops ELSE o.flops END AS flops,
                   coalesce(n.bytes, o.bytes, b.bytes, k.bytes) AS bytes,
                   CASE WHEN n.kernel_id IS NOT NULL THEN 'ncu'
                        WHEN {user} THEN CASE WHEN u.flops IS NOT NULL THEN 'user' END
                        WHEN o.flops IS NOT NULL THEN o.src END AS src,
                   CASE WHEN n.kernel_id IS NULL AND NOT {user} THEN o.owner END AS owner
            FROM kernels k
            LEFT JOIN _kf_ncu n USING (kernel_id) LEFT JOIN _kf_user u USING (kernel_id)
            LEFT JOIN _kf_op o USING (kernel_id) LEFT JOIN _kb_op b USING (kernel_id)
            WHERE n.kernel_id IS NOT NULL OR u.kernel_id IS NOT NULL OR o.kernel_id IS NOT NULL
               OR b.kernel_id IS NOT NULL OR k.flops IS NOT NULL OR k.flops_op_id IS NOT NULL
        ) x WHERE kernels.kernel_id = x.kernel_id""")
    for t in _CANDIDATES:
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return _drop_implausible(con)


def _drop_implausible(con: duckdb.DuckDBPyConnection) -> list[str]:
    """FLOP and byte estimates no kernel can have (above vocab.MAX_KERNEL_AMOUNT: a broken `flops` argument or
    shape) left out, so the kernel is measured as one of unknown work, and said."""
    flops, nbytes = one(
        con,
        f"SELECT count(*) FILTER (WHERE flops > {MAX_KERNEL_AMOUNT!r}), count(*) FILTER (WHERE bytes > {MAX_KERNEL_AMOUNT!r}) "
        "FROM kernels",
    ) or (0, 0)
    notes = []
    if flops:
        con.execute(
            f"UPDATE kernels SET flops = NULL, flops_source = NULL, flops_op_id = NULL WHERE flops > {MAX_KERNEL_AMOUNT!r}"
        )
        notes.append(f"{flops} kernels' FLOP estimates left out (more than {MAX_KERNEL_AMOUNT:.0e}: no kernel's work)")
    if nbytes:
        con.execute(f"UPDATE kernels SET bytes = NULL WHERE bytes > {MAX_KERNEL_AMOUNT!r}")
        notes.append(f"{nbytes} kernels' byte counts left out (more than {MAX_KERNEL_AMOUNT:.0e}: no kernel's traffic)")
    return notes
