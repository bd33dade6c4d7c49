"""The numbers (SPEC §4): the peaks of every GPU and precision, the analysed windows (each GPU's profile; the GPU
windows of requested or top-level ranges), and the sweep that yields utilization, achieved fraction of peak and the
loss waterfall for every window. The definitions live in the SQL library (`plasmient_report/sql/`); this module
fills its inputs and installs it in order. No row loops.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, replace

import duckdb
import pyarrow as pa

from . import kernel_flops, sql
from .errors import BadInput
from .kernel_flops import evaluate_op_bytes, model_op_flops, nest_ops, op_byte_shapes_sql
from .peaks import PRECISIONS, GpuPeaks, Peak, choose_peak
from .store import beside, one
from .vocab import (
    CATEGORIES,
    DATALOADER_RE,
    DEFAULT_PRECISION,
    MAX_PLAUSIBLE_BANDWIDTH_BYTES_S,
    NS_FIXED_SCALE,
    STEP_LABEL,
    SYNC_API_RE,
    SYNC_TOLERANCE_NS,
)

__all__ = [
    "CATEGORIES",
    "DATALOADER_RE",
    "MAX_PLAUSIBLE_BANDWIDTH_BYTES_S",
    "SYNC_API_RE",
    "SYNC_TOLERANCE_NS",
    "GpuPeak",
    "assign_peaks",
    "attribute_kernel_flops",
    "build_windows",
    "dominant_precision",
    "evaluate_op_bytes",
    "loss_fractions",
    "model_kernel_bytes",
    "model_op_flops",
    "nest_ops",
    "op_byte_shapes_sql",
    "sweep",
]


def attribute_kernel_flops(con: duckdb.DuckDBPyConnection) -> None:
    """Every kernel's launch and op, and its FLOPs and bytes from the op models and Nsight Compute, written once
    (kernel_flops); without --model-flops."""
    kernel_flops.link_kernels(con)
    kernel_flops.op_candidates(con)
    kernel_flops.ncu_candidates(con)
    kernel_flops.write(con)


def model_kernel_bytes(con: duckdb.DuckDBPyConnection) -> None:
    """Kept for callers of the old stage list: the byte models are part of attribute_kernel_flops now."""


# ------------------------------------------------------------------------------------------------------- peaks


def dominant_precision(con: duckdb.DuckDBPyConnection) -> str | None:
    """The precision the matmul-class kernels spend most time in — each kernel's precision from the op that launched
    it (fp32 with a TF32 kernel: tf32), else its FLOP owner's, else its name — when those with a precision hold at
    least half of the matmul-class kernel time; else None (nothing says, e.g. graph replays or nsys without dtypes:
    the caller assumes the default and says so). The run's headline precision when --peak-precision gives none."""
    sql.install(con, "vocab")
    row = one(
        con,
        """
        WITH k AS (
            SELECT (k.end_ns - k.start_ns)::DOUBLE AS dur,
                   CASE WHEN coalesce(lo.precision, fo.precision) = 'fp32' AND n.np = 'tf32'
                        THEN 'tf32' ELSE coalesce(lo.precision, fo.precision, n.np) END AS p
            FROM kernels k LEFT JOIN ops lo ON lo.op_id = k.op_id LEFT JOIN ops fo ON fo.op_id = k.flops_op_id
            LEFT JOIN (SELECT name, is_matmul_class_kernel(name) AS mm, kernel_name_precision(name) AS np
                       FROM (SELECT DISTINCT name FROM kernels)) n
              ON n.name = k.name  -- (each name's patterns matched once, not once per kernel)
            WHERE k.kind = 'compute' AND k.end_ns > k.start_ns AND (n.mm OR lo.precision IS NOT NULL)
        ), tot AS (SELECT sum(dur) AS all_ns, sum(dur) FILTER (WHERE p IS NOT NULL) AS voted_ns FROM k)
        SELECT p FROM k, tot WHERE p IS NOT NULL AND tot.voted_ns >= 0.5 * tot.all_ns
        GROUP BY p ORDER BY sum(dur) DESC, p LIMIT 1""",
    )
    if row:
        return row[0]
    # no matmul-class kernel at all (an HPC code on doubles: `saxpy(double *, …)` runs at fp64, not at the bf16 a
    # tensor core would): the compute kernels' names, when those naming one hold most of their time. (Not where
    # matmuls run unnamed: a bf16 model's fp32 elementwise kernels would then pick the wrong peak.)
    row = one(
        con,
        """
        WITH n AS (SELECT name, kernel_name_precision(name) AS p, is_matmul_class_kernel(name) AS mm
                   FROM (SELECT DISTINCT name FROM kernels WHERE kind = 'compute')),
        k AS (SELECT (k.end_ns - k.start_ns)::DOUBLE AS dur, n.p FROM kernels k JOIN n USING (name)
              WHERE k.kind = 'compute' AND k.end_ns > k.start_ns),
        tot AS (SELECT sum(dur) AS all_ns, sum(dur) FILTER (WHERE p IS NOT NULL) AS voted_ns FROM k)
        SELECT p FROM k, tot WHERE p IS NOT NULL AND tot.voted_ns >= 0.5 * tot.all_ns
          AND NOT EXISTS (SELECT 1 FROM n WHERE n.mm)
        GROUP BY p ORDER BY sum(dur) DESC, p LIMIT 1""",
    )
    return row[0] if row else None


@dataclass(frozen=True)
class GpuPeak:
    rank: int
    device: int
    device_name: str | None
    peak: Peak


def assign_peaks(
    con: duckdb.DuckDBPyConnection, table: list[GpuPeaks], precision: str | None, gpu: str | None, peak_tflops: float | None
) -> tuple[str, list[GpuPeak]]:
    """The peak of every GPU at every precision into `device_peaks` (peaks.py's table and fallbacks), and the
    headline peak of each GPU: at --peak-precision, else the run's dominant precision, else bf16 (fp16 on GPUs
    without a bf16 figure). --peak-precision or --peak-tflops maps every precision to that one peak. When nothing
    in the trace names a precision, the assumption is written into each peak's source."""
    found = None if precision else dominant_precision(con)
    prec = precision or found or DEFAULT_PRECISION
    if prec not in PRECISIONS:
        raise BadInput(None, f"unknown --peak-precision {prec!r} (one of {', '.join(PRECISIONS)})")
    gpus = con.execute("""
        SELECT g.rank, g.device, any_value(d.name)
        FROM (SELECT DISTINCT rank, device FROM kernels) g
        LEFT JOIN devices d ON d.rank IS NOT DISTINCT FROM g.rank AND d.device = g.device
        GROUP BY g.rank, g.device ORDER BY g.rank, g.device""").fetchall()
    out = [GpuPeak(r, d, n, choose_peak(n, prec, table, gpu, peak_tflops)) for r, d, n in gpus]
    if precision is None and found is None and peak_tflops is None:
        why = (
            f"precision {out[0].peak.precision if out else prec} assumed: nothing in the trace names one (no "
            "matmul op carries a dtype, e.g. nsys emit_nvtx records shapes only, and no kernel name says it); "
            "give --peak-precision to change it"
        )
        out = [replace(g, peak=replace(g.peak, source=f"{g.peak.source}; {why}")) for g in out]
    rows = []
    for g in out:
        for p in PRECISIONS:
            if precision is not None or peak_tflops is not None or p == prec:
                pk = g.peak  # the headline; or one peak for all (--peak-precision / --peak-tflops)
            else:
                pk = choose_peak(g.device_name, p, table, gpu, None)
            rows.append(
                (
                    g.rank,
                    g.device,
                    p,
                    pk.precision if pk.flop_s else None,
                    pk.flop_s,
                    pk.bandwidth_bytes_s,
                    pk.gpu,
                    pk.gpu_key,
                    pk.source,
                    p == prec,
                )
            )
    sql.install(con, "device_peaks")
    con.register(
        "_device_peaks",
        pa.table(
            {
                "rank": pa.array([r[0] for r in rows], pa.int32()),
                "device": pa.array([r[1] for r in rows], pa.int32()),
                "precision": pa.array([r[2] for r in rows], pa.string()),
                "peak_precision": pa.array([r[3] for r in rows], pa.string()),
                "peak_flop_s": pa.array([r[4] for r in rows], pa.float64()),
                "bandwidth_bytes_s": pa.array([r[5] for r in rows], pa.float64()),
                "gpu": pa.array([r[6] for r in rows], pa.string()),
                "gpu_key": pa.array([r[7] for r in rows], pa.string()),
                "source": pa.array([r[8] for r in rows], pa.string()),
                "headline": pa.array([r[9] for r in rows], pa.bool_()),
            }
        ),
    )
    con.execute("INSERT INTO device_peaks SELECT * FROM _device_peaks")
    con.unregister("_device_peaks")
    assign_links(con, table, out)
    return prec, out


def assign_links(con: duckdb.DuckDBPyConnection, table: Sequence[GpuPeaks], gpus: Sequence[GpuPeak]) -> None:
    """Each GPU's links from its peak-table entry into `device_links` (sql/device_links.sql): NULL where the table
    gives none."""
    by_key = {g.key: g for g in reversed(table)}  # a user entry (placed first) wins
    rows = []
    for g in gpus:
        entry = by_key.get(g.peak.gpu_key) if g.peak.gpu_key else None
        ic = entry.interconnect if entry else None
        rows.append(
            (
                g.rank,
                g.device,
                g.peak.gpu_key,
                ic.link if ic else None,
                ic.link_gbs if ic else None,
                ic.link_mesh if ic else None,
                ic.pcie if ic else None,
                ic.pcie_gbs if ic else None,
                ic.source
                if ic
                else (
                    "no interconnect figures for this GPU in the peak table" if entry else "unknown GPU: no interconnect figures"
                ),
            )
        )
    sql.install(con, "device_links")
    cols = ["rank", "device", "gpu_key", "link", "link_gbs", "link_mesh", "pcie", "pcie_gbs", "source"]
    types = [pa.int32(), pa.int32(), pa.string(), pa.string(), pa.float64(), pa.int32(), pa.string(), pa.float64(), pa.string()]
    con.register(
        "_device_links",
        pa.table({c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(zip(cols, types, strict=True))}),
    )
    con.execute("INSERT INTO device_links SELECT * FROM _device_links")
    con.unregister("_device_links")


# ----------------------------------------------------------------------------------------------------- windows


def match_range_names(pattern: str, names: Sequence[str]) -> list[str]:
    """The range names a --range pattern selects: the name itself when it is one (`[param|cuda]` is a real range
    name, not a character class), else every name the glob matches."""
    if pattern in names:
        return [pattern]
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)]


def _top_level_labels(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """Top-level CPU-side ranges (not inside another range on that rank); ProfilerStep#N grouped as #*."""
    return [
        (p, n)
        for (p, n) in con.execute(r"""
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
        ORDER BY label, name""").fetchall()
    ]


def window_label(range_patterns: Sequence[str]) -> str | None:
    """The label of the analysed window under `--range`: the pattern itself, or with several patterns their
    union, labelled by the patterns joined with ", " (SPEC §1: the window is the union of the ranges asked for)."""
    pats = list(dict.fromkeys(range_patterns))
    return ", ".join(pats) if pats else None


def build_windows(
    con: duckdb.DuckDBPyConnection, range_patterns: Sequence[str], step_occurrences: bool = False
) -> dict[str, list[int]]:
    """Fill `windows`: each GPU's profiled window, plus one entry per requested (or top-level) range, each the union
    of its occurrences' GPU windows (sql/range_windows.sql). With `step_occurrences`, ProfilerStep#* occurrences are
    found too when they are not a window (for --model-flops per step).

    Returns, per range pattern, the ranks that lack it (reported, never guessed)."""
    if one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kernel_launch'") == (0,):
        kernel_flops.link_kernels(con)
    names = [
        n
        for (n,) in con.execute(
            "SELECT DISTINCT name FROM ranges WHERE domain IS DISTINCT FROM 'python' ORDER BY name"
        ).fetchall()
    ]
    if range_patterns:
        pats = list(dict.fromkeys(range_patterns))
        label_rows = [(p, n, True) for p in pats for n in match_range_names(p, names)]
        if len(pats) > 1:  # the analysed window: the union of every pattern's ranges
            union = ", ".join(pats)
            label_rows += [(union, n, True) for n in dict.fromkeys(n for _, n, _ in label_rows)]
    else:
        label_rows = [(p, n, True) for p, n in _top_level_labels(con)]
        pats = sorted({p for p, _, _ in label_rows})
    if step_occurrences and not any(p == STEP_LABEL for p, _, _ in label_rows):
        label_rows += [(STEP_LABEL, n, False) for n in match_range_names(STEP_LABEL, names)]
    sql.install(con, "range_labels")
    if label_rows:
        con.register(
            "_labels",
            pa.table(
                {
                    "label": [p for p, _, _ in label_rows],
                    "name": [n for _, n, _ in label_rows],
                    "is_window": [w for _, _, w in label_rows],
                }
            ),
        )
        con.execute("INSERT INTO range_labels SELECT label, name, is_window FROM _labels")
        con.unregister("_labels")
    sql.install(con, "intervals", "rank_span")
    sql.install(con, "range_windows")  # (ASOF joins: its occurrences against every kernel of their GPU, store.connect)
    sql.install(con, "windows")
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    missing: dict[str, list[int]] = {}
    for p in pats:
        have = {
            r
            for (r,) in con.execute("SELECT DISTINCT rank FROM windows WHERE scope = 'range' AND range_name = ?", [p]).fetchall()
        }
        missing[p] = [r for r in ranks if r not in have]
    return missing


# ------------------------------------------------------------------------------------------------------- sweep


def _headline_peaks(con: duckdb.DuckDBPyConnection, peaks: Sequence[GpuPeak]) -> None:
    """device_peaks from the headline peaks alone, for callers that did not run assign_peaks."""
    sql.install(con, "device_peaks")
    for g in peaks:
        con.execute(
            "INSERT INTO device_peaks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, true)",
            [
                g.rank,
                g.device,
                g.peak.precision,
                g.peak.precision if g.peak.flop_s else None,
                g.peak.flop_s,
                g.peak.bandwidth_bytes_s,
                g.peak.gpu,
                g.peak.gpu_key,
                g.peak.source,
            ],
        )


def sweep(con: duckdb.DuckDBPyConnection, peaks: Sequence[GpuPeak] | None = None) -> None:
    """The per-GPU sweep over every window (SPEC §4; sql/stretches.sql): kernel classes, the kernels cut to the
    windows, what the host does, the stretches with their cause, the idle gaps, `losses`, and `metrics` /
    `metrics_by_precision` (utilization, achieved, coverage)."""
    exists = one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'device_peaks'")
    if peaks is not None and (exists == (0,) or one(con, "SELECT count(*) FROM device_peaks") == (0,)):
        _headline_peaks(con, peaks)
    if one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kernel_launch'") == (0,):
        kernel_flops.link_kernels(con)
    if one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'device_links'") == (0,):
        sql.install(con, "device_links")  # no peak table consulted (a caller that did not run assign_peaks)
    from . import shapes

    # Independent chains of modules are computed side by side (their statements run on tables of 10-100 k rows,
    # mostly one core's work each): the kernels' classes beside the host's activity and the kernels cut to the
    # windows; then the sweep; then the steps and the collectives' statistics beside the rest (measured on the
    # 100 MiB trace, interleaved: the last part 0.27 -> 0.19 s).
    sql.install(con, "vocab", "intervals", "collective_key")
    beside(
        con,
        lambda cur: sql.install(cur, "host_activity", "window_kernels"),
        lambda: sql.install(con, "collectives", "kernel_class"),
    )
    sql.install(con, "stretches")

    def steps_chain(cur: duckdb.DuckDBPyConnection) -> None:
        sql.install(cur, "steps", "collective_stats")

    def the_rest() -> None:
        sql.install(con, "losses", "window_metrics", "kernel_roofline", "memory", "launch_stats")
        shapes.fill(con)

    beside(con, steps_chain, the_rest)


def loss_fractions(
    con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, rank: int | None, device: int | None = None
) -> dict[str, float]:
    """Each category's share of the window: per GPU (rank and device), per rank (its GPUs' windows together),
    or for the run (rank None: Σ lost time / Σ windows)."""
    rows = con.execute(
        """
        WITH w AS (SELECT sum(window_ns) AS wns FROM metrics
                   WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND device IS NOT NULL
                     AND ($rank IS NULL OR rank = $rank) AND ($device IS NULL OR device = $device))
        SELECT category, exact_sum(lost_ns, $scale) / any_value(w.wns) FROM losses, w
        WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND ($rank IS NULL OR rank = $rank)
          AND ($device IS NULL OR device = $device)
        GROUP BY category""",
        {"scope": scope, "rn": range_name, "rank": rank, "device": device, "scale": NS_FIXED_SCALE},
    ).fetchall()
    return {c: float(f) for c, f in rows if f is not None}
