"""The numbers (SPEC §4): FLOPs per kernel, analysis windows, and the per-GPU sweep that yields
utilization and achieved fraction of peak for every window. SQL over the store; no row loops.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from .errors import BadInput
from .flops import DTYPE_PRECISION, MODELS, op_bytes, op_flops, op_precision, op_traffic_bytes
from .peaks import GpuPeaks, Peak, choose_peak
from .store import one

# 1.5x the fastest HBM in peaks.toml (8 TB/s): no kernel moves more; a byte estimate implying more is wrong.
MAX_PLAUSIBLE_BANDWIDTH_BYTES_S = 12e12
# Kernel names that do matrix work: an op's FLOPs are split over these (by duration) when it has any.
MATMUL_KERNEL_RE = (r"(?i)(gemm|nvjet|xmma|cutlass|cublas|cudnn|matmul|mma|wgmma|flash|fmha|attn|attention|"
                    r"conv|winograd|implicit|sm[0-9]{2,3}_|ampere_|volta_|turing_|hopper_|Cijk_)")
# Attention's helper kernels (FlashAttention's and cuDNN's backward: rowsum(dO·O) before, the fp32 dQ accumulator
# cast after) run no tensor-core work (ncu: 0 tensor ops, sample_traces/h200_attention): they get none of the op's.
AUX_ATTENTION_KERNEL_RE = r"(?i)(dot_do_o|convert_dq|convert_dkv)"


def model_op_flops(con: duckdb.DuckDBPyConnection) -> int:
    """Fill ops.flops from the FLOP models where the trace gave none; record each op's precision and bytes.
    The models run once per distinct (name, shapes, types, concrete inputs), not once per op: a long trace
    repeats a few hundred shapes millions of times."""
    shapes = con.execute("""
        SELECT DISTINCT name, input_dims, input_types, concrete_inputs FROM ops
        WHERE name IN (SELECT unnest(?::VARCHAR[]))""", [list(MODELS)]).fetchall()
    if not shapes:
        return 0
    con.register("_op_model", pa.table({
        "name": pa.array([n for n, _, _, _ in shapes], pa.string()),
        "dims": pa.array([d for _, d, _, _ in shapes], pa.string()),
        "types": pa.array([t for _, _, t, _ in shapes], pa.string()),
        "concrete": pa.array([c for _, _, _, c in shapes], pa.string()),
        "f": pa.array([op_flops(n, d, c) for n, d, _, c in shapes], pa.float64()),
        "p": pa.array([op_precision(t) for _, _, t, _ in shapes], pa.string()),
        "b": pa.array([op_bytes(n, d, t) for n, d, t, _ in shapes], pa.float64())}))
    # the trace's own `flops` arg wins over the model (SPEC §4 precedence)
    con.execute("""
        UPDATE ops SET flops = coalesce(ops.flops, m.f),
                       flops_source = CASE WHEN ops.flops IS NOT NULL THEN 'op' WHEN m.f IS NOT NULL THEN 'model' END,
                       precision = m.p, bytes = m.b
        FROM _op_model m
        WHERE ops.name = m.name AND ops.input_dims IS NOT DISTINCT FROM m.dims
          AND ops.input_types IS NOT DISTINCT FROM m.types AND ops.concrete_inputs IS NOT DISTINCT FROM m.concrete""")
    con.unregister("_op_model")
    row = one(con, "SELECT count(*) FROM ops WHERE flops IS NOT NULL AND name IN (SELECT unnest(?::VARCHAR[]))",
              [list(MODELS)])
    return int(row[0]) if row else 0


# The element size a kernel's name gives away where the op's arguments carry no dtype (cat's TensorList):
# PyTorch's CatArrayBatchedCopy and other byte-moving kernels are templated on OpaqueType<sizeof(T)>.
KERNEL_ELEMENT_BYTES_RE = r"OpaqueType<([0-9]+)"


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
    con.register(f"{view}_shapes", pa.table({
        "name": pa.array([r[0] for r in shapes], pa.string()),
        "input_dims": pa.array([r[1] for r in shapes], pa.string()),
        "input_types": pa.array([r[2] for r in shapes], pa.string()),
        "concrete_inputs": pa.array([r[3] for r in shapes], pa.string()),
        "elem_hint": pa.array([r[4] for r in shapes], pa.int32()),
        "b": pa.array([op_traffic_bytes(*r) for r in shapes], pa.float64())}))
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {view} AS
        SELECT o.op_id, s.b FROM ({ops_sql}) o JOIN {view}_shapes s
          ON s.name = o.name AND s.input_dims = o.input_dims AND s.input_types IS NOT DISTINCT FROM o.input_types
         AND s.concrete_inputs IS NOT DISTINCT FROM o.concrete_inputs AND s.elem_hint IS NOT DISTINCT FROM o.elem_hint
        WHERE s.b IS NOT NULL""")
    con.unregister(f"{view}_shapes")


def model_kernel_bytes(con: duckdb.DuckDBPyConnection) -> None:
    """Bytes for the rest: each op that launched compute kernels and has no byte figure gets its byte model
    (flops.op_traffic_bytes: norms, softmax, reductions, embedding, copies, gathers, cat; else elementwise),
    evaluated once per distinct (name, dims, types, concrete inputs); its compute kernels without bytes share
    them by duration."""
    evaluate_op_bytes(con, op_byte_shapes_sql("(SELECT * FROM ops WHERE bytes IS NULL)", "kernels"), "_op_shape_bytes")
    con.execute("UPDATE ops SET bytes = s.b FROM _op_shape_bytes s WHERE ops.op_id = s.op_id AND ops.bytes IS NULL")
    con.execute("DROP TABLE _op_shape_bytes")
    con.execute("""
        UPDATE kernels SET bytes = x.b FROM (
            SELECT k.kernel_id, o.bytes * (k.end_ns - k.start_ns)
                   / nullif(sum(k.end_ns - k.start_ns) OVER (PARTITION BY k.op_id), 0) AS b
            FROM kernels k JOIN ops o ON o.op_id = k.op_id
            WHERE k.kind = 'compute' AND k.bytes IS NULL AND k.flops IS NULL AND o.bytes IS NOT NULL
        ) x WHERE kernels.kernel_id = x.kernel_id AND x.b IS NOT NULL""")
    # "Every input read once" over-counts gathers (losses, indexing): an estimate implying more bandwidth than
    # any GPU's memory has (1.5x the fastest HBM in peaks.toml) is wrong, and is dropped rather than shown.
    con.execute(f"""
        UPDATE kernels SET bytes = NULL
        WHERE kind = 'compute' AND flops IS NULL AND bytes IS NOT NULL AND end_ns > start_ns
          AND bytes / ((end_ns - start_ns) / 1e9) > {MAX_PLAUSIBLE_BANDWIDTH_BYTES_S}""")


def nest_ops(con: duckdb.DuckDBPyConnection) -> None:
    """ops.depth and ops.parent_op_id from nesting on each thread (ops on one thread nest)."""
    con.execute("""
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
        SELECT op_id, (lvl - 1)::INTEGER AS depth FROM run WHERE is_start = 1""")
    con.execute("UPDATE ops SET depth = d.depth FROM _op_depth d WHERE ops.op_id = d.op_id")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _op_parent AS
        SELECT c.op_id, p.op_id AS parent
        FROM ops c ASOF JOIN ops p
          ON c.source_id = p.source_id AND c.thread = p.thread AND p.depth = c.depth - 1 AND p.start_ns <= c.start_ns
        WHERE c.depth > 0 AND p.end_ns >= c.end_ns""")
    con.execute("UPDATE ops SET parent_op_id = p.parent FROM _op_parent p WHERE ops.op_id = p.op_id")
    con.execute("DROP TABLE _op_depth; DROP TABLE _op_parent")


def attribute_kernel_flops(con: duckdb.DuckDBPyConnection) -> None:
    """SPEC §4 step 3: the outermost op with a FLOP figure that was open on the launching thread at launch
    time owns the kernel; its FLOPs are split by duration over its matmul-like kernels (or all, if none)."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _launch AS
        WITH ext AS (
            SELECT source_id, external_id, arg_max(op_id, start_ns) AS op_id, arg_max(thread, start_ns) AS thread,
                   max(start_ns) AS op_start
            FROM ops WHERE external_id IS NOT NULL GROUP BY source_id, external_id
        ), api AS (
            SELECT source_id, correlation, any_value(thread) AS thread, min(start_ns) AS start_ns
            FROM api_calls WHERE correlation IS NOT NULL GROUP BY source_id, correlation
        )
        SELECT k.kernel_id, k.source_id, e.op_id,
               coalesce(a.thread, e.thread) AS thread, coalesce(a.start_ns, e.op_start) AS launch_ns
        FROM kernels k
        LEFT JOIN api a ON a.source_id = k.source_id AND a.correlation = k.correlation
        LEFT JOIN ext e ON e.source_id = k.source_id AND e.external_id = k.external_id""")
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
        CREATE OR REPLACE TEMP TABLE _kflops AS
        WITH owned AS (
            SELECT l.kernel_id, r.op_id AS owner, r.flops AS op_flops, r.bytes AS op_bytes, r.flops_source AS src
            FROM _launch l ASOF JOIN _mroots r
              ON l.source_id = r.source_id AND l.thread = r.thread AND r.start_ns <= l.launch_ns
            WHERE r.end_ns >= l.launch_ns
        ), k AS (
            SELECT o.*, (kk.end_ns - kk.start_ns)::DOUBLE AS dur,
                   kk.kind = 'compute' AND regexp_matches(kk.name, '{MATMUL_KERNEL_RE}')
                       AND NOT regexp_matches(kk.name, '{AUX_ATTENTION_KERNEL_RE}') AS mm
            FROM owned o JOIN kernels kk USING (kernel_id)
            WHERE kk.kind = 'compute'
        ), elig AS (
            SELECT k.*, bool_or(mm) OVER (PARTITION BY owner) AS any_mm FROM k
        ), e AS (
            SELECT *, sum(dur) OVER (PARTITION BY owner) AS tot, count(*) OVER (PARTITION BY owner) AS n
            FROM elig WHERE mm OR NOT any_mm
        )
        SELECT kernel_id, owner,
               CASE WHEN tot > 0 THEN op_flops * dur / tot ELSE op_flops / n END AS flops,
               CASE WHEN tot > 0 THEN op_bytes * dur / tot ELSE op_bytes / n END AS bytes, src
        FROM e""")
    con.execute("""
        UPDATE kernels SET op_id = l.op_id FROM _launch l WHERE kernels.kernel_id = l.kernel_id""")
    con.execute("""
        UPDATE kernels SET flops = f.flops, bytes = f.bytes, flops_op_id = f.owner, flops_source = f.src
        FROM _kflops f WHERE kernels.kernel_id = f.kernel_id AND kernels.flops_source IS DISTINCT FROM 'ncu'""")
    con.execute("DROP TABLE _launch; DROP TABLE _mroots; DROP TABLE _kflops")


def apply_model_flops(con: duckdb.DuckDBPyConnection, flops_per_occurrence: float,
                      range_patterns: Sequence[str]) -> str:
    """--model-flops (SPEC §4): the user's FLOPs per step (ProfilerStep#N) or per occurrence of the --range,
    spread over the compute kernels running inside each occurrence by their time in it, `flops_source='user'`.
    Without steps or ranges, once over each rank's whole profile. Replaces the shape-model estimates."""
    if not flops_per_occurrence >= 0:
        raise BadInput(None, "--model-flops must be a non-negative number")
    names = [n for (n,) in con.execute("SELECT DISTINCT name FROM ranges WHERE NOT on_gpu").fetchall()]
    pats = list(range_patterns) or ["ProfilerStep#*"]
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    con.register("_mf_names", pa.table({"name": pa.array(chosen, pa.string())}))
    if chosen:
        occ_sql = ("SELECT rank, start_ns, end_ns FROM ranges WHERE NOT on_gpu AND end_ns > start_ns "
                   "AND name IN (SELECT name FROM _mf_names)")
        what = f"each occurrence of {', '.join(pats)}"
    else:
        occ_sql = "SELECT rank, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM kernels GROUP BY rank"
        what = "each rank's profiled window (no steps or ranges to divide it by)"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _mf AS
        WITH occ AS (SELECT row_number() OVER () AS oid, * FROM ({occ_sql})),
        ov AS (
            SELECT o.oid, k.kernel_id,
                   (least(k.end_ns, o.end_ns) - greatest(k.start_ns, o.start_ns))::DOUBLE AS t
            FROM kernels k JOIN occ o ON k.rank IS NOT DISTINCT FROM o.rank
             AND k.start_ns < o.end_ns AND k.end_ns > o.start_ns
            WHERE k.kind = 'compute'
        )
        SELECT kernel_id, sum(t / tot * ?) AS flops
        FROM (SELECT *, sum(t) OVER (PARTITION BY oid) AS tot FROM ov WHERE t > 0) GROUP BY kernel_id""",
                [flops_per_occurrence])
    con.unregister("_mf_names")
    con.execute("UPDATE kernels SET flops = NULL, flops_source = NULL, flops_op_id = NULL "
                "WHERE kind = 'compute' AND flops_source IS DISTINCT FROM 'ncu'")
    con.execute("UPDATE kernels SET flops = m.flops, flops_source = 'user' FROM _mf m "
                "WHERE kernels.kernel_id = m.kernel_id AND kernels.flops_source IS DISTINCT FROM 'ncu'")
    con.execute("DROP TABLE _mf")
    return f"--model-flops: {flops_per_occurrence:.4g} FLOP per {what}, spread over its compute kernels by time"


def dominant_precision(con: duckdb.DuckDBPyConnection) -> str | None:
    """The precision carrying the most matmul FLOPs (the default peak precision)."""
    row = one(con, """
        SELECT precision FROM ops WHERE flops IS NOT NULL AND precision IS NOT NULL
        GROUP BY precision ORDER BY sum(flops) DESC LIMIT 1""")
    return row[0] if row else None


@dataclass(frozen=True)
class GpuPeak:
    rank: int
    device: int
    device_name: str | None
    peak: Peak


def assign_peaks(con: duckdb.DuckDBPyConnection, table: list[GpuPeaks], precision: str | None,
                 gpu: str | None, peak_tflops: float | None) -> tuple[str, list[GpuPeak]]:
    """The peak of every GPU at one precision: --peak-precision, else the dtype carrying most matmul FLOPs,
    else bf16 (choose_peak falls back to fp16 on GPUs without a bf16 figure). When no matmul op carries a
    dtype (nsys `emit_nvtx` records shapes but no dtypes), the assumption is written into each peak's source."""
    from dataclasses import replace

    found = None if precision else dominant_precision(con)
    prec = precision or found or "bf16"
    if prec not in set(DTYPE_PRECISION.values()) | {"tf32", "fp64_tensor"}:
        raise BadInput(None, f"unknown --peak-precision {prec!r}")
    gpus = con.execute("""
        SELECT g.rank, g.device, any_value(d.name)
        FROM (SELECT DISTINCT rank, device FROM kernels) g
        LEFT JOIN devices d ON d.rank IS NOT DISTINCT FROM g.rank AND d.device = g.device
        GROUP BY g.rank, g.device ORDER BY g.rank, g.device""").fetchall()
    out = [GpuPeak(r, d, n, choose_peak(n, prec, table, gpu, peak_tflops)) for r, d, n in gpus]
    if precision is None and found is None and peak_tflops is None:
        why = (f"precision {out[0].peak.precision if out else prec} assumed: no matmul op in the trace carries a "
               "dtype (e.g. nsys emit_nvtx records shapes only); give --peak-precision to change it")
        out = [replace(g, peak=replace(g.peak, source=f"{g.peak.source}; {why}")) for g in out]
    return prec, out


def _merge_sql(src: str) -> str:
    """Union of possibly overlapping intervals per (scope, range_name, rank, device) (gaps and islands)."""
    return f"""
        WITH s AS (
            SELECT *, max(end_ns) OVER (PARTITION BY scope, range_name, rank, device ORDER BY start_ns, end_ns
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
            FROM ({src})
        ), g AS (
            SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
                      OVER (PARTITION BY scope, range_name, rank, device ORDER BY start_ns, end_ns
                            ROWS UNBOUNDED PRECEDING) AS island
            FROM s
        )
        SELECT scope, range_name, rank, device, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
               count(*)::INTEGER AS occurrences
        FROM g GROUP BY scope, range_name, rank, device, island"""


def build_windows(con: duckdb.DuckDBPyConnection, range_patterns: Sequence[str]) -> dict[str, list[int]]:
    """Fill `windows`: each GPU's profiled window, plus one entry per requested (or top-level) range.

    Returns, per range pattern, the ranks that lack it (reported, never guessed)."""
    con.execute("DELETE FROM windows")
    con.execute("""
        INSERT INTO windows
        WITH span AS (
            SELECT rank, min(s) AS s, max(e) AS e FROM (
                SELECT rank, start_ns s, end_ns e FROM kernels UNION ALL
                SELECT rank, start_ns, end_ns FROM ops UNION ALL
                SELECT rank, start_ns, end_ns FROM api_calls UNION ALL
                SELECT rank, start_ns, end_ns FROM ranges WHERE domain IS DISTINCT FROM 'python') GROUP BY rank
        )
        SELECT 'window', NULL, g.rank, g.device, span.s, span.e
        FROM (SELECT DISTINCT rank, device FROM kernels) g JOIN span USING (rank)""")
    occurrences: dict[tuple[str, int, int], int] = {}
    missing: dict[str, list[int]] = {}
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    if range_patterns:
        pats = list(range_patterns)
        names = [n for (n,) in con.execute(
            "SELECT DISTINCT name FROM ranges WHERE domain IS DISTINCT FROM 'python'").fetchall()]
        label_rows = [(p, n) for p in pats for n in names if fnmatch.fnmatchcase(n, p)]
    else:
        # Top-level CPU-side ranges (not inside another range on that rank); ProfilerStep#N grouped.
        label_rows = [(p, n) for (p, n) in con.execute(r"""
            WITH cpu AS (SELECT * FROM ranges WHERE NOT on_gpu AND domain IS DISTINCT FROM 'python'),
            inner_ AS (
                SELECT DISTINCT c.rank, c.name, c.start_ns, c.end_ns FROM cpu c JOIN cpu o
                  ON o.rank IS NOT DISTINCT FROM c.rank AND o.start_ns <= c.start_ns AND o.end_ns >= c.end_ns
                 AND (o.start_ns < c.start_ns OR o.end_ns > c.end_ns)
            )
            SELECT DISTINCT regexp_replace(name, '#[0-9]+$', '#*') AS label, name FROM cpu
            WHERE (rank, name, start_ns, end_ns) NOT IN (SELECT (rank, name, start_ns, end_ns) FROM inner_)
              AND NOT starts_with(name, 'nccl:') AND NOT starts_with(name, 'Optimizer.')
              AND coalesce(domain, '') NOT IN ('NCCL', 'NCCL_API')
            """).fetchall()]
        pats = sorted({p for p, _ in label_rows})
    if label_rows:
        lab = pa.table({"label": [p for p, _ in label_rows], "name": [n for _, n in label_rows]})
        con.register("_labels", lab)
        # CPU-side occurrence when the rank has one (GPU copies can end early); else the GPU copy.
        con.execute(f"""
            INSERT INTO windows
            SELECT scope, range_name, rank, device, start_ns, end_ns FROM ({_merge_sql('''
                WITH r AS (
                    SELECT l.label, g.rank, g.device, x.start_ns, x.end_ns, x.on_gpu,
                           bool_or(NOT x.on_gpu) OVER (PARTITION BY l.label, g.rank) AS has_cpu
                    FROM ranges x JOIN _labels l ON x.name = l.name
                    JOIN (SELECT DISTINCT rank, device FROM kernels) g ON g.rank IS NOT DISTINCT FROM x.rank
                    WHERE x.end_ns > x.start_ns
                )
                SELECT 'range' AS scope, label AS range_name, rank, device, start_ns, end_ns
                FROM r WHERE NOT on_gpu OR NOT has_cpu''')})""")
        con.unregister("_labels")
    for p in pats:
        have = {r for (r,) in con.execute(
            "SELECT DISTINCT rank FROM windows WHERE scope = 'range' AND range_name = ?", [p]).fetchall()}
        missing[p] = [r for r in ranks if r not in have]
    for p, cnt in con.execute("""
            SELECT range_name, count(*) FROM windows WHERE scope='range' GROUP BY range_name""").fetchall():
        occurrences[(p, 0, 0)] = cnt
    return missing


# SPEC §4 loss categories and their layers, in the order the waterfall lists them.
CATEGORIES: dict[str, str] = {
    "collective_wait": "cluster",
    "collective_transfer": "cluster",
    "pipeline_bubble": "pipeline",
    "memory_bound": "op",
    "compute_inefficiency": "kernel",
    "memcpy": "kernel",
    "launch_bound": "host",
    "sync_stall": "host",
    "input_bound": "host",
    "host_other": "host",
    "no_coverage": "device",
}
SYNC_API_RE = r"(?i)(synchronize|^cudaMemcpy(2D|3D|ToSymbol|FromSymbol)?(_v[0-9]+)?$|^cuMemcpy[DH]to[DH](_v[0-9]+)?$|^hipMemcpy$)"
LAUNCH_API_RE = r"(?i)(launch|graphlaunch|memcpyasync|memsetasync)"
DATALOADER_RE = r"(?i)(dataloader|data_loader|enumerate\(DataLoader)"
P2P_KERNEL_RE = r"(?i)(sendrecv|_send|_recv|send_|recv_)"
# Packed per-class counts of active kernels (see _seg): at most 255 of one class at once on one GPU.
_PACK = ("((1::BIGINT << 48) + CASE cls WHEN 'compute_bound' THEN 1::BIGINT << 40 WHEN 'memory_bound' THEN "
         "1::BIGINT << 32 WHEN 'nccl_wait' THEN 1::BIGINT << 24 WHEN 'nccl' THEN 1::BIGINT << 16 "
         "WHEN 'p2p' THEN 1::BIGINT << 8 WHEN 'copy' THEN 1::BIGINT ELSE 0 END)")
SYNC_TOLERANCE_NS = 20_000  # a sync that returned up to 20 µs before an idle stretch began caused it


def collective_waits(con: duckdb.DuckDBPyConnection) -> bool:
    """Per NCCL kernel: the wait part = its duration minus the minimum duration of the same collective across
    ranks (same process group, collective and sequence number). Returns whether any peer was found."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _nccl_wait AS
        WITH c AS (
            SELECT c.rank, c.kernel_correlation, c.source_id, coalesce(c.process_group, c.group_ranks, '') AS pg,
                   c.collective, c.seq, c.end_ns - c.start_ns AS dur
            FROM collectives c
            -- send/recv pair with the peer's opposite operation, not by sequence number: no wait estimate
            WHERE NOT regexp_matches(coalesce(c.collective, ''), '(?i)(send|recv)')
        ), m AS (
            SELECT pg, collective, seq, min(dur) AS min_dur, count(DISTINCT rank) AS n FROM c GROUP BY ALL
        )
        SELECT k.kernel_id, CASE WHEN m.n > 1 THEN c.dur - m.min_dur ELSE 0 END AS wait_ns, m.n AS ranks_seen
        FROM c JOIN m USING (pg, collective, seq)
        JOIN kernels k ON k.source_id = c.source_id AND k.correlation = c.kernel_correlation AND k.kind = 'nccl'""")
    row = one(con, "SELECT coalesce(max(ranks_seen), 0) FROM _nccl_wait")
    return bool(row and row[0] > 1)


def sweep(con: duckdb.DuckDBPyConnection, peaks: list[GpuPeak]) -> None:
    """The per-GPU sweep over every window (SPEC §4): in each stretch where the set of active kernels is
    constant, R = min(P, Σ flops/dur) is achieved and (1 − R/P)·Δt is lost to exactly one category.
    Fills `metrics` (utilization, achieved, coverage) and `losses` (merged lost stretches)."""
    con.execute("DELETE FROM metrics")
    con.execute("DELETE FROM losses")
    collective_waits(con)
    con.register("_peaks", pa.table({
        "rank": pa.array([p.rank for p in peaks], pa.int32()),
        "device": pa.array([p.device for p in peaks], pa.int32()),
        "peak": pa.array([p.peak.flop_s for p in peaks], pa.float64()),
        "bw": pa.array([p.peak.bandwidth_bytes_s for p in peaks], pa.float64())}))
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _w AS
        SELECT row_number() OVER () AS wid, w.*, p.peak, p.bw FROM windows w
        LEFT JOIN _peaks p ON p.rank IS NOT DISTINCT FROM w.rank AND p.device = w.device
        WHERE w.end_ns > w.start_ns""")
    # Each kernel clipped to each window; its class decides the category of the stretches it is active in.
    # NCCL kernels are split at start + wait: the first part waits for peers, the rest moves data.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _kc AS
        WITH k AS (
            SELECT k.*, coalesce(nw.wait_ns, 0) AS wait_ns FROM kernels k
            LEFT JOIN _nccl_wait nw USING (kernel_id)
        ), parts AS (
            SELECT kernel_id, rank, device, start_ns AS s0, start_ns + wait_ns AS e0, 'nccl_wait' AS cls,
                   0.0 AS rate, false AS has_flops, kind
            FROM k WHERE kind = 'nccl' AND wait_ns > 0
            UNION ALL
            SELECT kernel_id, rank, device, start_ns + CASE WHEN kind = 'nccl' THEN wait_ns ELSE 0 END, end_ns,
                   CASE WHEN kind = 'nccl' THEN CASE WHEN regexp_matches(name, '{P2P_KERNEL_RE}') THEN 'p2p'
                                                     ELSE 'nccl' END
                        WHEN kind IN ('memcpy', 'memset') THEN 'copy'
                        ELSE 'compute' END,
                   CASE WHEN end_ns > start_ns THEN coalesce(flops, 0) / (end_ns - start_ns) ELSE 0 END,
                   flops IS NOT NULL AND flops > 0, kind
            FROM k
        )
        SELECT w.wid, p.kernel_id, greatest(p.s0, w.start_ns) AS s, least(p.e0, w.end_ns) AS e, p.rate,
               p.has_flops, p.kind,
               CASE WHEN p.cls <> 'compute' THEN p.cls
                    WHEN p.has_flops AND (kk.bytes IS NULL OR w.bw IS NULL OR w.peak IS NULL
                                          OR kk.flops / kk.bytes >= w.peak / w.bw) THEN 'compute_bound'
                    ELSE 'memory_bound' END AS cls
        FROM parts p JOIN _w w
          ON p.rank IS NOT DISTINCT FROM w.rank AND p.device = w.device
         AND p.s0 < w.end_ns AND p.e0 > w.start_ns
        JOIN kernels kk USING (kernel_id)""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _seg AS
        WITH ev AS (
            -- the active-kernel counts per class, packed into one integer (8 bits each, n in the top 16) so
            -- that one running sum tracks them all: sums of packed deltas are the packed running counts
            SELECT wid, s AS t, {_PACK} AS dk, rate AS dr FROM _kc WHERE e > s
            UNION ALL SELECT wid, e, -({_PACK}), -rate FROM _kc WHERE e > s
            UNION ALL SELECT wid, start_ns, 0, 0 FROM _w
            UNION ALL SELECT wid, end_ns, 0, 0 FROM _w
        ), agg AS (
            SELECT wid, t, sum(dk)::BIGINT AS dk, sum(dr) AS dr FROM ev GROUP BY wid, t
        ), run AS (
            SELECT wid, t, lead(t) OVER c AS t_next, sum(dk) OVER c AS k, sum(dr) OVER c AS r
            FROM agg
            WINDOW c AS (PARTITION BY wid ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        ), unpacked AS (
            SELECT wid, t, t_next, r, (k >> 48)::INTEGER AS n, ((k >> 40) & 255)::INTEGER AS cb,
                   ((k >> 32) & 255)::INTEGER AS mb, ((k >> 24) & 255)::INTEGER AS nw, ((k >> 16) & 255)::INTEGER AS nc,
                   ((k >> 8) & 255)::INTEGER AS p2p, (k & 255)::INTEGER AS cp
            FROM run
        )
        SELECT run.wid, run.t, run.t_next, run.n, run.cb, run.mb, run.nw, run.nc, run.p2p, run.cp,
               CASE WHEN run.n > 0 THEN greatest(run.r, 0) ELSE 0 END AS r, w.rank, w.device, w.peak
        FROM unpacked run JOIN _w w USING (wid)
        WHERE run.t_next IS NOT NULL AND run.t_next > run.t""")
    # What the host was doing during each idle stretch (ASOF joins: no quadratic interval joins).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _idle AS
        WITH idle AS (SELECT wid, t, t_next, rank FROM _seg WHERE n = 0),
        syncs AS (SELECT rank, start_ns, end_ns FROM api_calls WHERE regexp_matches(name, '{SYNC_API_RE}')),
        launches AS (SELECT rank, start_ns, end_ns FROM api_calls WHERE regexp_matches(name, '{LAUNCH_API_RE}')),
        loaders AS (SELECT rank, start_ns, end_ns FROM ranges WHERE NOT on_gpu AND domain IS DISTINCT FROM 'python'
                    AND regexp_matches(name, '{DATALOADER_RE}')),
        a AS (
            SELECT i.wid, i.t, i.t_next, i.rank,
                   s.end_ns < i.t_next AS after_sync
            -- the first sync to return once the GPU went idle (or just before): if it returned inside the
            -- stretch, the host had blocked on the GPU and the queue ran dry behind it
            FROM idle i ASOF LEFT JOIN syncs s
              ON s.rank IS NOT DISTINCT FROM i.rank AND s.end_ns >= i.t - {SYNC_TOLERANCE_NS}
        ), b AS (
            SELECT a.*, l.end_ns > a.t AS in_loader
            FROM a ASOF LEFT JOIN loaders l ON l.rank IS NOT DISTINCT FROM a.rank AND l.start_ns < a.t_next
        )
        SELECT b.wid, b.t,
               CASE WHEN coalesce(after_sync, false) THEN 'sync_stall'
                    WHEN coalesce(in_loader, false) THEN 'input_bound'
                    WHEN coalesce(x.end_ns > b.t, false) THEN 'launch_bound'
                    ELSE 'host_other' END AS category
        FROM b ASOF LEFT JOIN launches x ON x.rank IS NOT DISTINCT FROM b.rank AND x.start_ns < b.t_next""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _lost AS
        SELECT s.wid, s.t, s.t_next, s.rank, s.device,
               CASE WHEN s.peak IS NULL THEN 0
                    ELSE least(s.r, s.peak / 1e9) / (s.peak / 1e9) * (s.t_next - s.t) END AS achieved_ns,
               CASE WHEN s.n = 0 THEN i.category
                    WHEN s.cb > 0 THEN 'compute_inefficiency'
                    WHEN s.mb > 0 THEN 'memory_bound'
                    WHEN s.nw > 0 THEN 'collective_wait'
                    WHEN s.p2p > 0 THEN 'pipeline_bubble'
                    WHEN s.nc > 0 THEN 'collective_transfer'
                    ELSE 'memcpy' END AS category,
               s.peak
        FROM _seg s LEFT JOIN _idle i ON i.wid = s.wid AND i.t = s.t""")
    cats = ", ".join(f"('{c}', '{layer}')" for c, layer in CATEGORIES.items())
    con.execute(f"""
        INSERT INTO losses
        WITH l AS (
            -- a window's stretches are contiguous: an island of one category starts where the category changes
            SELECT wid, t, t_next, rank, device, category, peak, (t_next - t) - achieved_ns AS lost_ns,
                   (category IS DISTINCT FROM lag(category) OVER (PARTITION BY wid ORDER BY t))::INTEGER AS chg
            FROM _lost
        ), isl AS (
            SELECT *, sum(chg) OVER (PARTITION BY wid ORDER BY t ROWS UNBOUNDED PRECEDING) AS island
            FROM l WHERE lost_ns > 0 OR chg = 1
        ), merged AS (
            SELECT wid, island, any_value(rank) AS rank, any_value(device) AS device, min(t) AS s, max(t_next) AS e,
                   any_value(category) AS category, sum(lost_ns) AS lost_ns, any_value(peak) AS peak
            FROM isl GROUP BY wid, island
        )
        SELECT w.scope, w.range_name, m.rank, m.device, m.s, m.e, m.category, c.layer,
               m.lost_ns / 1e9 * m.peak, m.lost_ns, NULL
        FROM merged m JOIN _w w USING (wid) JOIN (VALUES {cats}) c(category, layer) USING (category)
        WHERE m.lost_ns > 0""")
    con.execute("""
        INSERT INTO metrics
        WITH per_w AS (
            SELECT w.wid, w.scope, w.range_name, w.rank, w.device, w.end_ns - w.start_ns AS wlen, w.peak,
                   coalesce(sum(CASE WHEN s.n > 0 THEN s.t_next - s.t END), 0) AS busy,
                   coalesce(sum(CASE WHEN s.n > 0 THEN least(s.r, coalesce(w.peak / 1e9, s.r)) * (s.t_next - s.t) END), 0)
                       AS flops,
                   coalesce(sum(CASE WHEN s.n > 0 AND w.peak IS NOT NULL AND s.r > w.peak / 1e9 * (1 + 1e-9)
                                THEN s.t_next - s.t END), 0) AS capped
            FROM _w w LEFT JOIN _seg s USING (wid)
            GROUP BY w.wid, w.scope, w.range_name, w.rank, w.device, w.start_ns, w.end_ns, w.peak
        ), cov AS (
            SELECT wid, sum(CASE WHEN kind = 'compute' THEN e - s END) AS kns,
                   sum(CASE WHEN kind = 'compute' AND has_flops THEN e - s END) AS kns_f
            FROM _kc WHERE e > s GROUP BY wid
        )
        SELECT scope, range_name, rank, device, sum(wlen)::BIGINT, count(*)::INTEGER, sum(busy)::BIGINT,
               sum(busy) / sum(wlen), sum(flops), sum(flops) / (sum(wlen) / 1e9),
               CASE WHEN any_value(peak) IS NOT NULL THEN sum(flops) / (sum(wlen) / 1e9) / any_value(peak) END,
               sum(capped)::BIGINT, coalesce(sum(kns), 0)::BIGINT, coalesce(sum(kns_f), 0)::BIGINT, any_value(peak)
        FROM per_w LEFT JOIN cov USING (wid)
        GROUP BY scope, range_name, rank, device""")
    # Run level: the GPUs' windows combined (a window-weighted mean of the per-GPU fractions).
    con.execute("""
        INSERT INTO metrics
        SELECT scope, range_name, NULL, NULL, sum(window_ns), sum(occurrences)::INTEGER, sum(busy_ns),
               sum(busy_ns) / sum(window_ns), sum(flops), sum(flops) / (sum(window_ns) / 1e9),
               CASE WHEN bool_and(peak_flop_s IS NOT NULL)
                    THEN sum(flops) / sum(window_ns / 1e9 * peak_flop_s) END,
               sum(capped_ns), sum(kernel_ns), sum(kernel_ns_with_flops),
               CASE WHEN bool_and(peak_flop_s IS NOT NULL) THEN sum(window_ns * peak_flop_s) / sum(window_ns) END
        FROM metrics WHERE rank IS NOT NULL GROUP BY scope, range_name""")
    con.unregister("_peaks")
    con.execute("DROP TABLE _kc; DROP TABLE _seg; DROP TABLE _w; DROP TABLE _idle; DROP TABLE _lost; "
                "DROP TABLE _nccl_wait")


def loss_fractions(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None,
                   rank: int | None) -> dict[str, float]:
    """Each category's share of the window (run level when rank is None: Σ lost time / Σ windows)."""
    rows = con.execute("""
        WITH w AS (SELECT sum(window_ns) AS wns FROM metrics
                   WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND rank IS NOT NULL
                     AND ($rank IS NULL OR rank = $rank) AND peak_flop_s IS NOT NULL)
        SELECT category, sum(lost_ns) / any_value(w.wns) FROM losses, w
        WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND ($rank IS NULL OR rank = $rank)
        GROUP BY category""", {"scope": scope, "rn": range_name, "rank": rank}).fetchall()
    return {c: float(f) for c, f in rows if f is not None}
