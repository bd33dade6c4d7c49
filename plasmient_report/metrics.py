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
from .flops import DTYPE_PRECISION, MODELS, op_flops, op_precision
from .peaks import GpuPeaks, Peak, choose_peak

# Kernel names that do matrix work: an op's FLOPs are split over these (by duration) when it has any.
MATMUL_KERNEL_RE = (r"(?i)(gemm|nvjet|xmma|cutlass|cublas|cudnn|matmul|mma|wgmma|flash|fmha|attn|attention|"
                    r"conv|winograd|implicit|sm[0-9]{2,3}_|ampere_|volta_|turing_|hopper_|Cijk_)")


def model_op_flops(con: duckdb.DuckDBPyConnection) -> int:
    """Fill ops.flops from the FLOP models where the trace gave none; record each op's precision."""
    names = list(MODELS)
    rows = con.execute(
        "SELECT op_id, name, input_dims, input_types, concrete_inputs, flops FROM ops "
        "WHERE name IN (SELECT unnest(?::VARCHAR[]))", [names]).fetchall()
    ids, flops, src, prec = [], [], [], []
    for op_id, name, dims, types, concrete, given in rows:
        f = given if given is not None else op_flops(name, dims, concrete)
        ids.append(op_id)
        flops.append(f)
        src.append(("op" if given is not None else "model") if f is not None else None)
        prec.append(op_precision(types))
    if not ids:
        return 0
    tbl = pa.table({"op_id": pa.array(ids, pa.int64()), "f": pa.array(flops, pa.float64()),
                    "s": pa.array(src, pa.string()), "p": pa.array(prec, pa.string())})
    con.register("_op_model", tbl)
    con.execute("UPDATE ops SET flops = m.f, flops_source = m.s, precision = m.p FROM _op_model m "
                "WHERE ops.op_id = m.op_id")
    con.unregister("_op_model")
    return sum(1 for f in flops if f is not None)


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
            SELECT l.kernel_id, r.op_id AS owner, r.flops AS op_flops, r.flops_source AS src
            FROM _launch l ASOF JOIN _mroots r
              ON l.source_id = r.source_id AND l.thread = r.thread AND r.start_ns <= l.launch_ns
            WHERE r.end_ns >= l.launch_ns
        ), k AS (
            SELECT o.*, (kk.end_ns - kk.start_ns)::DOUBLE AS dur,
                   kk.kind = 'compute' AND regexp_matches(kk.name, '{MATMUL_KERNEL_RE}') AS mm
            FROM owned o JOIN kernels kk USING (kernel_id)
            WHERE kk.kind = 'compute'
        ), elig AS (
            SELECT k.*, bool_or(mm) OVER (PARTITION BY owner) AS any_mm FROM k
        ), e AS (
            SELECT *, sum(dur) OVER (PARTITION BY owner) AS tot, count(*) OVER (PARTITION BY owner) AS n
            FROM elig WHERE mm OR NOT any_mm
        )
        SELECT kernel_id, owner,
               CASE WHEN tot > 0 THEN op_flops * dur / tot ELSE op_flops / n END AS flops, src
        FROM e""")
    con.execute("""
        UPDATE kernels SET op_id = l.op_id FROM _launch l WHERE kernels.kernel_id = l.kernel_id""")
    con.execute("""
        UPDATE kernels SET flops = f.flops, flops_op_id = f.owner, flops_source = f.src
        FROM _kflops f WHERE kernels.kernel_id = f.kernel_id AND kernels.flops_source IS DISTINCT FROM 'ncu'""")
    con.execute("DROP TABLE _launch; DROP TABLE _mroots; DROP TABLE _kflops")


def dominant_precision(con: duckdb.DuckDBPyConnection) -> str | None:
    """The precision carrying the most matmul FLOPs (the default peak precision)."""
    row = con.execute("""
        SELECT precision FROM ops WHERE flops IS NOT NULL AND precision IS NOT NULL
        GROUP BY precision ORDER BY sum(flops) DESC LIMIT 1""").fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class GpuPeak:
    rank: int
    device: int
    device_name: str | None
    peak: Peak


def assign_peaks(con: duckdb.DuckDBPyConnection, table: list[GpuPeaks], precision: str | None,
                 gpu: str | None, peak_tflops: float | None) -> tuple[str, list[GpuPeak]]:
    prec = precision or dominant_precision(con) or "bf16"
    if prec not in set(DTYPE_PRECISION.values()) | {"tf32", "fp64_tensor"}:
        raise BadInput(None, f"unknown --peak-precision {prec!r}")
    gpus = con.execute("""
        SELECT g.rank, g.device, any_value(d.name)
        FROM (SELECT DISTINCT rank, device FROM kernels) g
        LEFT JOIN devices d ON d.rank IS NOT DISTINCT FROM g.rank AND d.device = g.device
        GROUP BY g.rank, g.device ORDER BY g.rank, g.device""").fetchall()
    out = [GpuPeak(r, d, n, choose_peak(n, prec, table, gpu, peak_tflops)) for r, d, n in gpus]
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
                SELECT rank, start_ns, end_ns FROM ranges) GROUP BY rank
        )
        SELECT 'window', NULL, g.rank, g.device, span.s, span.e
        FROM (SELECT DISTINCT rank, device FROM kernels) g JOIN span USING (rank)""")
    occurrences: dict[tuple[str, int, int], int] = {}
    missing: dict[str, list[int]] = {}
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    if range_patterns:
        pats = list(range_patterns)
        names = [n for (n,) in con.execute("SELECT DISTINCT name FROM ranges").fetchall()]
        label_rows = [(p, n) for p in pats for n in names if fnmatch.fnmatchcase(n, p)]
    else:
        # Top-level CPU-side ranges (not inside another range on that rank); ProfilerStep#N grouped.
        label_rows = [(p, n) for (p, n) in con.execute(r"""
            WITH cpu AS (SELECT * FROM ranges WHERE NOT on_gpu),
            inner_ AS (
                SELECT DISTINCT c.rank, c.name, c.start_ns, c.end_ns FROM cpu c JOIN cpu o
                  ON o.rank IS NOT DISTINCT FROM c.rank AND o.start_ns <= c.start_ns AND o.end_ns >= c.end_ns
                 AND (o.start_ns < c.start_ns OR o.end_ns > c.end_ns)
            )
            SELECT DISTINCT regexp_replace(name, '#[0-9]+$', '#*') AS label, name FROM cpu
            WHERE (rank, name, start_ns, end_ns) NOT IN (SELECT (rank, name, start_ns, end_ns) FROM inner_)
              AND NOT starts_with(name, 'nccl:') AND NOT starts_with(name, 'Optimizer.')
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


def sweep(con: duckdb.DuckDBPyConnection, peaks: list[GpuPeak]) -> None:
    """The per-GPU sweep over every window: utilization, capped achieved FLOPs, coverage → `metrics`."""
    con.execute("DELETE FROM metrics")
    con.register("_peaks", pa.table({
        "rank": pa.array([p.rank for p in peaks], pa.int32()),
        "device": pa.array([p.device for p in peaks], pa.int32()),
        "peak": pa.array([p.peak.flop_s for p in peaks], pa.float64())}))
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _w AS
        SELECT row_number() OVER () AS wid, * FROM windows WHERE end_ns > start_ns""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _kc AS
        SELECT w.wid, greatest(k.start_ns, w.start_ns) AS s, least(k.end_ns, w.end_ns) AS e,
               CASE WHEN k.end_ns > k.start_ns THEN coalesce(k.flops, 0) / (k.end_ns - k.start_ns) ELSE 0 END AS rate,
               k.kind, k.flops IS NOT NULL AND k.flops > 0 AS has_flops
        FROM kernels k JOIN _w w
          ON k.rank IS NOT DISTINCT FROM w.rank AND k.device = w.device
         AND k.start_ns < w.end_ns AND k.end_ns > w.start_ns""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _seg AS
        WITH ev AS (
            SELECT wid, s AS t, 1 AS dn, rate AS dr FROM _kc WHERE e > s
            UNION ALL SELECT wid, e, -1, -rate FROM _kc WHERE e > s
        ), agg AS (SELECT wid, t, sum(dn) AS dn, sum(dr) AS dr FROM ev GROUP BY wid, t),
        run AS (
            SELECT wid, t, lead(t) OVER (PARTITION BY wid ORDER BY t) AS t_next,
                   sum(dn) OVER (PARTITION BY wid ORDER BY t ROWS UNBOUNDED PRECEDING) AS n,
                   sum(dr) OVER (PARTITION BY wid ORDER BY t ROWS UNBOUNDED PRECEDING) AS r
            FROM agg
        )
        SELECT wid, t, t_next, n, CASE WHEN n > 0 THEN greatest(r, 0) ELSE 0 END AS r
        FROM run WHERE t_next IS NOT NULL AND t_next > t""")
    con.execute("""
        INSERT INTO metrics
        WITH per_w AS (
            SELECT w.wid, w.scope, w.range_name, w.rank, w.device, w.end_ns - w.start_ns AS wlen, p.peak,
                   coalesce(sum(CASE WHEN s.n > 0 THEN s.t_next - s.t END), 0) AS busy,
                   coalesce(sum(CASE WHEN s.n > 0 THEN least(s.r, coalesce(p.peak / 1e9, s.r)) * (s.t_next - s.t) END), 0)
                       AS flops,
                   coalesce(sum(CASE WHEN s.n > 0 AND p.peak IS NOT NULL AND s.r > p.peak / 1e9 * (1 + 1e-9)
                                THEN s.t_next - s.t END), 0) AS capped
            FROM _w w LEFT JOIN _seg s USING (wid)
            LEFT JOIN _peaks p ON p.rank IS NOT DISTINCT FROM w.rank AND p.device = w.device
            GROUP BY ALL
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
    con.execute("DROP TABLE _kc; DROP TABLE _seg; DROP TABLE _w")
