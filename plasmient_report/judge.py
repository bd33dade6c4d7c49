"""Judge: turn the measured tables into the verdict (SPEC §6, `plasmient.verdict/1`), typed: a
`verdict_model.Verdict` built from the window-scoped views of the measurement library (sql/).

Renderers, `diff` and `batch` read this typed verdict (and the store's views), never its text; the wording
thresholds live here.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import msgspec

from . import __version__, flops, measured, peaks, roofline, verdict_tables, vocab
from .errors import BadInput
from .metrics import STEP_LABEL, GpuPeak, loss_fractions, window_label
from .rules.base import COMMON_THRESHOLDS
from .store import aside, has_table, one
from .verdict_model import (
    Clock,
    ClockSource,
    Coverage,
    Finding,
    GpuEntry,
    HardwareEstimate,
    Headroom,
    IncompleteSource,
    KernelGroup,
    Loss,
    OpGroup,
    Peak,
    PrecisionShare,
    RangeSummary,
    RankSteps,
    RankSummary,
    RunInfo,
    Shape,
    Step,
    StepRef,
    StepSummary,
    Tool,
    Utilization,
    Verdict,
    WindowUtilization,
)
from .vocab import CATEGORIES, MATERIAL_UNKNOWN_FLOPS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCHEMA = "plasmient.verdict/1"
# Rows of `top_kernels` (per kernel name) and `top_ops` (per op) in the verdict, by time in the window.
TOP_GROUPS = 20


@dataclass(frozen=True)
class Thresholds:
    idle_utilization: float = 0.30  # below: "idle"
    healthy_achieved: float = 0.50  # at or above: "healthy"
    busy_utilization: float = 0.70  # busy and achieved < useful_achieved: "busy, not useful"
    useful_achieved: float = 0.30
    comm_share: float = 0.50  # communication share of busy time above which: "communication-bound"
    material_unknown_flops: float = MATERIAL_UNKNOWN_FLOPS  # vocab.unknown_is_material: above it, a lower bound
    slow_step: float = 0.10  # a step this much slower than the median step is flagged (an outlier)
    slow_rank: float = 0.05  # a rank whose mean step is this much above the fastest rank's is named


def thresholds_from(config: Path | None) -> Thresholds:
    """The verdict thresholds, with a `[verdict]` table of the rules config overriding the defaults."""
    if config is None:
        return Thresholds()
    try:
        table = tomllib.loads(Path(config).read_text(encoding="utf-8")).get("verdict", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise BadInput(config, f"cannot read rules config ({e})") from None
    if not isinstance(table, dict):
        raise BadInput(config, "[verdict] must be a table of thresholds")
    known = {f.name for f in fields(Thresholds)}
    values: dict[str, float] = {}
    for name, value in table.items():
        if name not in known:
            raise BadInput(config, f"[verdict] {name}: unknown threshold; known: {', '.join(sorted(known))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise BadInput(config, f"[verdict] {name} = {value!r}: a fraction between 0 and 1 is needed")
        values[name] = float(value)
    return Thresholds(**values)


@dataclass
class RunContext:
    inputs: list[str]
    ranges: list[str]
    precision: str
    peaks: list[GpuPeak]
    missing_ranges: dict[str, list[int]]
    notes: list[str] = field(default_factory=list)
    tokens_per_step: float | None = None  # --tokens-per-step: tokens one rank processes per step
    samples_per_step: float | None = None  # --samples-per-step
    model_flops: float | None = None  # --model-flops: the model's FLOPs per step (the MFU convention)


# One-line fixes per category; the rules (SPEC §5) replace these with findings that name the cause.
RECOMMENDATIONS = {
    "collective_wait": "a peer rank arrives late: balance work or find the straggler",
    "collective_transfer": "overlap communication with compute; bucket / compress gradients",
    "pipeline_bubble": "more micro-batches or an interleaved schedule",
    "memory_bound": "fuse elementwise ops; raise arithmetic intensity",
    "unknown_flops": "unknown work: give --model-flops N, record shapes, or an Nsight Compute CSV",
    "compute_inefficiency": "bigger / better-shaped GEMMs; tensor-core precisions",
    "memcpy": "pinned memory, async copies, fewer host round trips",
    "launch_bound": "CUDA graphs / torch.compile; fewer, larger kernels",
    "sync_stall": "remove host syncs (.item(), .cpu()) from the hot loop",
    "input_bound": "more DataLoader workers, pinned memory, prefetch",
    "startup": "one-time set-up: profile after warm-up steps, or analyse a --range that excludes it",
    "host_other": "the GPU waits on host code: profile the Python side",
    "no_coverage": "this GPU has no trace data in the window",
}


def loss_list(
    fractions: dict[str, float], fixes: dict[str, str] | None = None, generic: dict[str, str] | None = None
) -> list[Loss]:
    """The waterfall's lines, largest first; a category's recommendation is its best finding's one-line fix when a
    rule explained it, else the generic text (`generic_advice`: in the program's words)."""
    fixes = fixes or {}
    generic = generic or RECOMMENDATIONS
    out = [
        Loss(category=c, layer=CATEGORIES[c], fraction=f, recommendation=fixes.get(c) or generic[c])
        for c, f in fractions.items()
        if c in CATEGORIES and f > 0
    ]
    return sorted(out, key=lambda x: -x.fraction)


def generic_advice(con: duckdb.DuckDBPyConnection, unknown: UnknownWork | None = None) -> dict[str, str]:
    """RECOMMENDATIONS in the program's words: HIP graphs for a HIP program; the host side, not the Python side, of a
    program with no sign of PyTorch; for copies that are all from pinned memory already, not "pinned memory" again."""
    out = dict(RECOMMENDATIONS)
    u = unknown or unknown_work(con)
    if u.api == "HIP":
        out["launch_bound"] = out["launch_bound"].replace("CUDA graphs", "HIP graphs")
    # unknown work: recording shapes helps only a trace without them, and never graph replays
    if u.graph_share >= UNKNOWN_GRAPH_SHARE:
        out["unknown_flops"] = "unknown work, replayed from graphs (no shapes): give --model-flops N or an Nsight Compute CSV"
    elif u.has_shapes:
        out["unknown_flops"] = "unknown work: give --model-flops N or an Nsight Compute CSV"
    if not u.pytorch:  # a C / CUDA / Fortran program (llm.c under nsys): its host is not "the Python side"
        out["host_other"] = "the GPU waits on host code: profile the host side (a CPU sampler)"
    if u.training is False:  # inference: no gradients — the forward's tensor / expert-parallel collectives
        out["collective_transfer"] = "overlap the forward's collectives with GEMMs, or shard over fewer GPUs"
    # the copies' time by kind: host copies (Kineto names them `Memcpy HtoD (Pageable -> Device)`, nsys `HtoD
    # (Pageable)`), how much of it pageable, and device-to-device copies
    total, host, pageable, device = (
        float(x or 0)
        for x in one(
            con,
            """WITH c AS (SELECT end_ns - start_ns AS ns, coalesce(copy_kind, '') AS kind, name FROM kernels
                          WHERE kind = 'memcpy')
               SELECT sum(ns), sum(ns) FILTER (WHERE regexp_matches(kind, '^(HtoD|DtoH)')),
                      sum(ns) FILTER (WHERE regexp_matches(name || ' ' || kind, '(?i)pageable')),
                      sum(ns) FILTER (WHERE regexp_matches(kind, '^(DtoD|PtoP)')) FROM c""",
        )
        or (0, 0, 0, 0)
    )
    if total and device > total / 2:
        out["memcpy"] = "device-to-device copies: fewer clones, .contiguous() and cat; copy fewer bytes"
    elif host > total / 2 and pageable < 0.1 * host:
        out["memcpy"] = "host copies already pinned: overlap them with compute (another stream), or move fewer bytes"
    return out


def findings_list(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """The rules' findings (the `findings` table, worst first) as verdict entries."""
    cur = con.execute("""SELECT rule_id, layer, category, severity, rank, lost_fraction, title, evidence,
                                  recommendation, fix, key FROM findings
                           ORDER BY lost_fraction DESC NULLS LAST, rule_id, key""")
    out = []
    for rid, layer, cat, sev, rank, lost, title, ev, rec, fix, key in cur.fetchall():
        out.append(
            Finding(
                rule=rid,
                layer=layer,
                category=cat,
                severity=sev,
                rank=rank,
                lost_fraction=_f(lost),
                title=title,
                evidence=_finite(json.loads(ev)) if ev else {},
                recommendation=rec,
                fix=fix,
                key=key,
            )
        )
    return out


def best_fixes(findings: list[Finding], rank: int | None = None) -> dict[str, str]:
    """Per loss category, the one-line fix of the finding that explains most of it (for `rank`: its own
    findings and the run-wide ones)."""
    fixes: dict[str, str] = {}
    for f in findings:  # worst first
        if f.category and f.fix and f.category not in fixes and (rank is None or f.rank in (None, rank)):
            fixes[f.category] = f.fix
    return fixes


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _finite(x: Any) -> Any:
    """A rule's evidence with every non-finite number as null (the verdict holds finite numbers only)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _metric_rows(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(f"SELECT * FROM metrics WHERE {where} ORDER BY range_name NULLS FIRST, rank, device", params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def verdict_word(
    util: float | None,
    achieved: float | None,
    comm_share: float,
    t: Thresholds,
    lower_bound: bool = False,
    peak_known: bool = True,
) -> str:
    """The verdict's word from the two headline numbers. When the achieved fraction is a lower bound (unknown work
    is material) or unknown, nothing calls the GPU "not useful": only time-based words, or "healthy" when even the
    lower bound is."""
    if util is None:
        return "no data"
    if util < t.idle_utilization:
        return "idle"
    if comm_share >= t.comm_share:
        return "communication-bound"
    if achieved is None:
        if not peak_known:
            return "busy (no peak known)"
        return "busy (achieved unknown)" if util >= t.busy_utilization else "underused (achieved unknown)"
    if achieved >= t.healthy_achieved:
        return "healthy"
    if lower_bound:
        return "busy (achieved: lower bound)" if util >= t.busy_utilization else "underused"
    if util >= t.busy_utilization and achieved < t.useful_achieved:
        return "busy, not useful"
    return "underused"


def headroom(achieved: float | None, lower_bound: bool = False, peak_known: bool = True) -> Headroom:
    """1 / achieved, worded. A lower-bound achieved gives only an upper bound on headroom: no factor is claimed.
    Unknown for want of a peak, it says so (FLOPs may well be measured)."""
    if achieved is None:
        return Headroom(
            factor=None,
            text="headroom unknown (no peak known for this GPU)"
            if not peak_known
            else "headroom unknown (the achieved fraction is unknown)"
            if lower_bound
            else "headroom unknown (no useful FLOPs measured)",
        )
    if achieved <= 0:
        return Headroom(
            factor=None,
            text="headroom unknown (the achieved fraction is a lower bound)"
            if lower_bound
            else "headroom unknown (no useful FLOPs measured)",
        )
    f = 1.0 / achieved
    if lower_bound:
        return Headroom(
            factor=None,
            text=f"headroom unknown: at most {f:.1f}x before new hardware (the achieved fraction is a lower bound)"
            if f <= 100
            else "headroom unknown (the achieved fraction is a lower bound)",
        )
    if f > 100:
        return Headroom(factor=f, text="more than 100x below peak")
    return Headroom(factor=f, text=f"{f:.1f}x headroom before new hardware")


MAX_LISTED_RANKS = 1024


def partial_coverage(con: duckdb.DuckDBPyConnection, present: set[int]) -> dict[str, Any]:
    """What the inputs lack: ranks of the job (0 … world size − 1, from the traces) with no GPU activity among
    the inputs, and what the recorders say they lost (dropped events, CUPTI buffer overflow)."""
    row = one(con, "SELECT max(world_size) FROM sources WHERE rank_method IS DISTINCT FROM 'counters'")
    world = int(row[0]) if row and row[0] else None
    missing = [r for r in range(world) if r not in present] if world else []
    dropped = one(con, "SELECT sum(dropped_events) FROM sources")
    incomplete = con.execute("SELECT path, incomplete FROM sources WHERE incomplete IS NOT NULL ORDER BY source_id").fetchall()
    return {
        "world_size": world,
        "missing_ranks": missing[:MAX_LISTED_RANKS],
        "missing_rank_count": len(missing),
        "dropped_events": int(dropped[0]) if dropped and dropped[0] is not None else None,
        "incomplete_sources": [{"path": p, "what": w} for p, w in incomplete],
    }


@dataclass(frozen=True)
class Achieved:
    """The achieved fraction of one window as the verdict states it."""

    value: float | None  # None: unknown (no peak, or no FLOP estimate at all beside unknown work)
    lower_bound: bool  # unknown work is material: the value is a floor
    unknown_fraction: float | None  # unknown-FLOP share of compute-kernel time
    with_flops_fraction: float | None  # compute-kernel time with a FLOP estimate
    peak_known: bool


def achieved_of(row: dict[str, Any], t: Thresholds) -> Achieved:
    """From a `metrics` row: the achieved fraction, whether it is a lower bound, and the coverage behind it."""
    kns = row.get("kernel_ns") or 0
    unknown = (row.get("unknown_ns") or 0) / kns if kns else None
    with_flops = (row.get("kernel_ns_with_flops") or 0) / kns if kns else None
    value = _f(row.get("achieved_fraction_of_peak"))
    peak_known = row.get("peak_flop_s") is not None
    lower = value is not None and vocab.unknown_is_material(
        row.get("unknown_ns"), row.get("kernel_ns_with_flops"), t.material_unknown_flops
    )
    if value is not None and kns and unknown and not row.get("kernel_ns_with_flops"):
        value, lower = None, True  # nothing in the window has a FLOP estimate: a number would be a guess
    return Achieved(value, lower, unknown, with_flops, peak_known)


def _achieved_by_precision(
    con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, rank: int | None = None, device: int | None = None
) -> list[PrecisionShare]:
    rows = con.execute(
        """
        SELECT precision, flops, peak_flop_s, achieved_fraction_of_peak FROM metrics_by_precision
        WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? AND rank IS NOT DISTINCT FROM ?
          AND device IS NOT DISTINCT FROM ?
        ORDER BY achieved_fraction_of_peak DESC, precision""",
        [scope, range_name, rank, device],
    ).fetchall()
    return [
        PrecisionShare(precision=p, flops=_f(fl), peak_tflops=pk / 1e12 if pk else None, fraction=_f(fr))
        for p, fl, pk, fr in rows
    ]


def hardware_estimate(means: list[measured.WindowMean], scope: str, range_name: str | None) -> HardwareEstimate | None:
    """Tensor-pipe activity from device counters (nsys GPU metrics' Tensor Active, DCGM PIPE_TENSOR_ACTIVE) covering
    the window, beside the achieved fraction."""
    m = next(
        (x for x in means if x.scope == scope and x.range_name == range_name and x.rank is None and x.metric == "tensor_active"),
        None,
    )
    if m is None:
        return None
    return HardwareEstimate(
        metric="tensor_active",
        value=_f(m.value),
        source=m.sources[0] if len(m.sources) == 1 else ", ".join(m.sources),
        what="the share of time the tensor cores were active, averaged over the window by the GPU's own counters: an "
        "upper bound on tensor-core work (an active pipe is not a full one), measured with no FLOP estimate, so "
        "it stands where the trace cannot say",
    )


def _range_info(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    rows = con.execute("""
        SELECT label, count(DISTINCT rank) AS ranks, max(n) AS per_rank, bool_or(window_kind IN ('gpu', 'gpu_annotation'))
        FROM (SELECT label, rank, window_kind, count(DISTINCT occurrence) OVER (PARTITION BY label, rank) AS n
              FROM range_occurrences WHERE is_window)
        GROUP BY label""").fetchall()
    return {lab: {"ranks": int(r), "count": int(n), "window": "gpu" if g else "cpu"} for lab, r, n, g in rows}


def _utilization(block: dict[str, Any]) -> WindowUtilization:
    return msgspec.convert(block, WindowUtilization)


TOP_SHAPES = 30


def shapes_of(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None) -> tuple[list[Shape], int]:
    """The window's matmul-class work per shape (sql/shapes.sql `shape_roofline`): the first TOP_SHAPES by time, and
    how many shapes there are."""
    if one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kernel_shapes'") == (0,):
        return [], 0
    cur = con.execute("SELECT * FROM shape_roofline(?, ?)", [scope, range_name])
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    out = []
    for r in rows[:TOP_SHAPES]:
        d = _finite(dict(zip(cols, r, strict=True)))
        out.append(
            Shape(
                family=d["family"],
                op=d["op"],
                shape=d["shape"],
                dtype=d["dtype"],
                precision=d["precision"],
                layout=d["layout"],
                pass_=d["pass"],
                batch=d["batch"],
                m=d["m"],
                n=d["n"],
                k=d["k"],
                heads=d["heads"],
                kv_heads=d["kv_heads"],
                q_len=d["q_len"],
                kv_len=d["kv_len"],
                head_dim=d["head_dim"],
                causal=d["causal"],
                conv_input=d["conv_input"],
                conv_weight=d["conv_weight"],
                stride=d["stride"],
                padding=d["padding"],
                groups=d["groups"],
                transposed=d["transposed"],
                calls=int(d["calls"]),
                kernels=int(d["kernels"]),
                time_ns=float(d["time_ns"]),
                time_share=d["time_share"],
                time_per_call_ns=d["time_per_call_ns"],
                flops=d["flops"],
                bytes=d["bytes"],
                achieved_flop_s=d["achieved_flop_s"],
                achieved_bandwidth_bytes_s=d["achieved_bandwidth_bytes_s"],
                fraction_of_peak=d["fraction_of_peak"],
                arithmetic_intensity=d["arithmetic_intensity"],
                bound=d["bound"],
                kernel_class=d["class"],
                kernel=d["kernel"],
                kernel_names=int(d["kernel_names"]),
                parent_op=d["parent_op"],
            )
        )
    return out, len(rows)


MAX_STEPS = 4096  # step rows in the verdict (the store's `steps` table has all)
MAX_STEP_REFS = 20
MAX_RANK_STEPS = 64


def step_labels(con: duckdb.DuckDBPyConnection, ranges: list[str]) -> list[str]:
    """The ranges whose occurrences are the run's steps: the --range patterns; without --range, ProfilerStep#* when
    the trace has it, else the top-level range that repeats on a rank (two or more occurrences) and covers the most
    GPU time; none when nothing repeats. A range most of whose occurrences launched no GPU work (a DataLoader's
    `__next__`, a host-side phase) is no step: its "GPU time" is its CPU interval."""
    have = {
        lab: (per_rank, total, gpu)
        for lab, per_rank, total, gpu in con.execute(
            "SELECT label, max(occurrence) + 1, sum(gpu_ns), 2 * count(*) FILTER (WHERE launched > 0) >= count(*) "
            "FROM steps GROUP BY label"
        ).fetchall()
    }
    if ranges:
        return [r for r in dict.fromkeys(ranges) if r in have]
    if STEP_LABEL in have:
        return [STEP_LABEL]
    repeating = sorted(((-total, lab) for lab, (per_rank, total, gpu) in have.items() if per_rank >= 2 and gpu))
    return [repeating[0][1]] if repeating else []


def _ref(row: dict[str, Any]) -> StepRef:
    return StepRef(
        rank=row["rank"],
        device=row["device"],
        occurrence=row["occurrence"],
        name=row["name"],
        gpu_ns=row["gpu_ns"],
        excess_over_median=_f(row["excess_over_median"]),
    )


def _per_s(amount: float | None, ns: float | None) -> float | None:
    return amount / (ns / 1e9) if amount is not None and ns else None


def steps_of(con: duckdb.DuckDBPyConnection, ctx: RunContext, t: Thresholds) -> tuple[list[Step], list[StepSummary]]:
    """Per step and per range of steps, from the library's `steps` / `step_stats` (sql/steps.sql), with throughput
    and MFU when --tokens-per-step / --samples-per-step / --model-flops say the work of a step."""
    labels = step_labels(con, ctx.ranges)
    steps: list[Step] = []
    summaries: list[StepSummary] = []
    for label in labels:
        cur = con.execute("SELECT * FROM steps WHERE label = ? ORDER BY rank, device, occurrence", [label])
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        for row in rows:
            gpu = row["gpu_ns"]
            kns = row["kernel_ns"] or 0
            achieved = _f(row["achieved_fraction_of_peak"])
            lower = achieved is not None and vocab.unknown_is_material(
                row["unknown_ns"], row["kernel_ns_with_flops"], t.material_unknown_flops
            )
            if achieved is not None and kns and row["unknown_ns"] and not row["kernel_ns_with_flops"]:
                achieved, lower = None, True
            row["achieved_known"] = achieved is not None
            peak = row["peak_flop_s"]
            row["slow"] = row["excess_over_median"] is not None and row["excess_over_median"] > t.slow_step
            top = row["largest_loss"]
            steps.append(
                Step(
                    range=label,
                    name=row["name"],
                    rank=row["rank"],
                    device=row["device"],
                    occurrence=row["occurrence"],
                    start_ns=row["start_ns"],
                    gpu_ns=gpu,
                    cpu_ns=row["cpu_ns"],
                    window=row["window_kind"],
                    utilization=_f(row["utilization"]),
                    achieved_fraction_of_peak=achieved,
                    achieved_is_lower_bound=lower,
                    flops=_f(row["flops"]),
                    largest_loss=top,
                    largest_loss_fraction=_f(row["largest_loss_ns"] / gpu) if top and gpu else None,
                    excess_over_median=_f(row["excess_over_median"]),
                    slow=row["slow"],
                    cut=bool(row["cut"]),
                    # a cut step's time is a lower bound: no rate from it (it would be an upper bound)
                    tokens_per_s=None if row["cut"] else _per_s(ctx.tokens_per_step, gpu),
                    samples_per_s=None if row["cut"] else _per_s(ctx.samples_per_step, gpu),
                    mfu=_f(ctx.model_flops / (gpu / 1e9 * peak))
                    if ctx.model_flops is not None and peak and gpu and not row["cut"]
                    else None,
                )
            )
        stats = con.execute("SELECT * FROM step_stats WHERE label = ?", [label]).fetchall()
        if not stats or not rows:
            continue
        st = dict(zip([d[0] for d in con.description], stats[0], strict=True))
        slow = sorted((r for r in rows if r["slow"]), key=lambda r: -r["gpu_ns"])
        # a step the recording cut is a lower bound: the step times are over the whole steps (all when none is)
        timed = [r for r in rows if not r["cut"]] or rows
        by_gpu: dict[tuple[Any, Any], list[int]] = {}
        for r in timed:
            by_gpu.setdefault((r["rank"], r["device"]), []).append(r["gpu_ns"])
        means = {k: sum(v) / len(v) for k, v in by_gpu.items()}
        fastest = min(means.values())
        ranked = sorted(means, key=lambda k: (-means[k], k[0] if k[0] is not None else -1, k[1] or 0))
        by_rank = [
            RankSteps(
                rank=k[0],
                device=k[1],
                steps=len(by_gpu[k]),
                mean_ns=means[k],
                excess_over_fastest=means[k] / fastest - 1.0 if fastest else 0.0,
            )
            for k in ranked
        ]
        slowest_rank = by_rank[0] if len(by_rank) > 1 and by_rank[0].excess_over_fastest > t.slow_rank else None
        n_ranks = int(st["ranks"])
        mean = float(st["mean_ns"])
        peaks = [(r["gpu_ns"], r["peak_flop_s"]) for r in timed]
        mfu = None
        if ctx.model_flops is not None and all(p for _, p in peaks):
            mfu = _f(ctx.model_flops * len(peaks) / sum(g / 1e9 * p for g, p in peaks))
        tps = _per_s(ctx.tokens_per_step, mean)
        sps = _per_s(ctx.samples_per_step, mean)
        summaries.append(
            StepSummary(
                range=label,
                steps=int(st["steps"]),
                per_rank=int(st["per_rank"]),
                ranks=n_ranks,
                mean_ns=mean,
                median_ns=float(st["median_ns"]),
                min_ns=int(st["min_ns"]),
                max_ns=int(st["max_ns"]),
                stddev_ns=float(st["stddev_ns"]),
                spread=_f(st["cv"]),
                utilization=_f(st["utilization"]),
                # (unknown when no step's is known: a sum of unknowns is no 0%)
                achieved_fraction_of_peak=_f(st["achieved_fraction_of_peak"]) if any(r["achieved_known"] for r in rows) else None,
                slowest=_ref(max(timed, key=lambda r: (r["gpu_ns"], -r["occurrence"]))),
                slow_threshold=t.slow_step,
                slow_steps=[_ref(r) for r in slow[:MAX_STEP_REFS]],
                slow_step_count=len(slow),
                cut_step_count=sum(1 for r in rows if r["cut"]),
                by_rank=by_rank[:MAX_RANK_STEPS],
                slowest_rank=slowest_rank,
                tokens_per_step=ctx.tokens_per_step,
                samples_per_step=ctx.samples_per_step,
                tokens_per_s=tps,
                tokens_per_s_all_ranks=tps * n_ranks if tps is not None else None,
                samples_per_s=sps,
                samples_per_s_all_ranks=sps * n_ranks if sps is not None else None,
                model_flops=ctx.model_flops,
                mfu=mfu,
            )
        )
    return steps[:MAX_STEPS], summaries


GIVE_FLOPS = (
    "give --model-flops N (the model's FLOPs per step or per --range occurrence), record shapes "
    "(torch.profiler record_shapes=True; nsys: emit_nvtx(record_shapes=True)), or an Nsight Compute CSV"
)


# A loss line's recommendation in a window too short to judge (its share is measured; nothing is advised).
NOT_JUDGED = "not judged: the window is too short"
# Convolutions without stride / padding said as the reason for unknown work when they are this share of its time.
UNKNOWN_CONV_SHARE = 0.5


# Attention given a mask tensor is said (its FLOPs counted dense) when it is this share of the counted FLOPs.
MASKED_ATTENTION_NOTE_SHARE = 0.01


# Graph replays said as the reason for unknown work when their kernels are this share of its time.
UNKNOWN_GRAPH_SHARE = 0.5


class UnknownWork(NamedTuple):
    """What the program and its trace offer about the unknown kernels: read once a run, for the loss line's advice
    and the note's (`generic_advice`, `give_flops`)."""

    api: str  # "CUDA" or "HIP": the graph API the program's runtime has
    pytorch: bool
    has_shapes: bool  # any op with input shapes
    graph_share: float  # the share of unknown kernels' time that graph replays launched
    training: bool | None  # backward work in the trace (`program`); None: no framework ops to tell


def unknown_work(con: duckdb.DuckDBPyConnection) -> UnknownWork:
    runtime, pytorch, training = one(con, "SELECT runtime, pytorch, training FROM program") or ("cuda", False, None)
    has_shapes = one(con, "SELECT count(*) > 0 FROM ops WHERE input_dims IS NOT NULL AND input_dims NOT IN ('', '[]')")
    # a kernel replayed from a graph (cudaGraphLaunch / hipGraphLaunch) has no op and no shapes in any trace,
    # whatever the profiler recorded
    row = one(
        con,
        """SELECT sum(k.end_ns - k.start_ns),
                  sum(k.end_ns - k.start_ns) FILTER (WHERE regexp_matches(coalesce(kl.launch_name, ''), ?))
           FROM kernel_class kc JOIN kernels k USING (kernel_id) LEFT JOIN kernel_launch kl USING (kernel_id)
           WHERE kc.class = 'unknown'""",
        [vocab.GRAPH_LAUNCH_API_RE],
    )
    share = float(row[1]) / float(row[0]) if row and row[0] and row[1] else 0.0
    return UnknownWork("HIP" if runtime == "hip" else "CUDA", bool(pytorch), bool(has_shapes and has_shapes[0]), share, training)


def masked_attention(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None) -> tuple[float, str, str] | None:
    """Attention run with a mask tensor (flops.ATTENTION_MASK_AT) in the window: (its share of the window's counted
    FLOPs, the op of its largest kernel share and that op's mask dims); None when there is none. Its FLOPs count
    every (query, key) pair: the trace does not record which ones the mask keeps."""
    at = list(flops.ATTENTION_MASK_AT.items())
    row = one(
        con,
        f"""WITH m(op, idx) AS (VALUES {", ".join("(?, ?)" for _ in at)}),
            w AS (SELECT wk.share * k.flops AS f, k.flops_op_id FROM window_kernels wk JOIN kernels k USING (kernel_id)
                  WHERE wk.scope = ? AND wk.range_name IS NOT DISTINCT FROM ? AND k.flops > 0),
            a AS (SELECT w.f, o.name AS op, json_extract(o.input_dims, '$[' || m.idx || ']') AS mask
                  FROM w JOIN ops o ON o.op_id = w.flops_op_id JOIN m ON m.op = o.name
                  WHERE json_valid(o.input_dims))
            SELECT (SELECT exact_sum(f, {vocab.AMOUNT_FIXED_SCALE!r}) FROM w), exact_sum(f, {vocab.AMOUNT_FIXED_SCALE!r}),
                   arg_max(op, (f, op)), arg_max(mask::VARCHAR, (f, mask::VARCHAR))
            FROM a WHERE json_array_length(mask) >= 2""",
        [x for pair in at for x in pair] + [scope, range_name],
    )
    if not row or not row[0] or not row[1]:
        return None
    return float(row[1]) / float(row[0]), str(row[2]), str(row[3]).replace(",", ", ")


def give_flops(con: duckdb.DuckDBPyConnection, unknown: UnknownWork | None = None) -> str:
    """What to give for unknown work: shapes only where the trace has none to offer (a trace recorded with shapes
    whose unknown kernels are custom or compiled gains nothing from recording them again; nor does one whose unknown
    kernels are graph replays), and PyTorch's switches only for a PyTorch program."""
    u = unknown or unknown_work(con)
    give = "give --model-flops N (the model's FLOPs per step or per --range occurrence)"
    graphs, api = u.graph_share, u.api
    if graphs >= UNKNOWN_GRAPH_SHARE:
        return (
            f"{graphs:.0%} of that time is kernels replayed from {api} graphs ({api.lower()}GraphLaunch): a replay "
            f"records no op, so the trace has no shapes for them — {give}, profile a step run without graphs (eager) for "
            "its shapes, or give an Nsight Compute CSV"
        )
    if u.has_shapes:
        # convolutions with shapes but no stride / padding have no estimate (flops.conv): said as such when they are
        # most of the unknown time, not as custom kernels. A Kineto trace without Concrete Inputs (torch <= 1.9)
        # gains them from a newer torch; nsys's NVTX shape ranges never carry them.
        conv = one(
            con,
            """WITH u AS (
                   SELECT k.end_ns - k.start_ns AS ns, o.name AS op, o.input_dims, o.concrete_inputs, s.format
                   FROM kernel_class kc JOIN kernels k USING (kernel_id) LEFT JOIN ops o ON o.op_id = k.op_id
                   LEFT JOIN sources s ON s.source_id = o.source_id
                   WHERE kc.class = 'unknown')
               SELECT sum(ns), sum(ns) FILTER (WHERE regexp_matches(op, ?) AND input_dims NOT IN ('', '[]')
                                                 AND coalesce(concrete_inputs, '') IN ('', '[]')),
                      bool_and(format = 'kineto') FILTER (WHERE regexp_matches(op, ?)) FROM u""",
            [vocab.CONV_OP_RE, vocab.CONV_OP_RE],
        )
        if conv and conv[0] and conv[1] and conv[1] >= UNKNOWN_CONV_SHARE * conv[0]:
            newer, why = (
                (", record with a newer torch,", "the trace records no Concrete Inputs")
                if conv[2]
                else (",", "the profiler records no argument values")
            )
            return (
                f"{conv[1] / conv[0]:.0%} of that time is convolutions: the trace has their shapes but not their "
                f"stride and padding ({why}), which a convolution's FLOPs need: {give}{newer} or give an Nsight "
                "Compute CSV"
            )
        return (
            f"the trace has shapes, but these kernels (custom, compiled or library kernels) have no FLOP model: "
            f"{give} or an Nsight Compute CSV"
        )
    if not u.pytorch:
        return f"{give} or an Nsight Compute CSV"
    return GIVE_FLOPS


# The roofline's groups by kernel and by op, and the shapes with how many there are (read beside the verdict, `build`)
_RooflineGroups = tuple[list[roofline.KernelGroup], list[roofline.KernelGroup], tuple[list[Shape], int]]


def build(con: duckdb.DuckDBPyConnection, ctx: RunContext, t: Thresholds | None = None) -> Verdict:
    """The verdict of one run, typed (`verdict_model.Verdict`), from the window-scoped views of the store: the
    headline window (the first --range, else each GPU's profiled window), per rank, per range.

    The roofline's groups (by kernel and by op) and the shapes are read on a cursor of their own, beside the rest:
    they only read what the measure stage wrote. Measured (benchmarks/README.md, session 31), eight interleaved
    pairs: the 486 MiB nsys export 10.76 -> 10.57 s (medians; its verdict 0.64 s of which these are 0.26 s), 20-30
    MiB more at the peak; the 100 MiB Kineto trace unchanged (its are 0.08 s)."""
    scope = "range" if ctx.ranges else "window"
    # With --range the headline is the union of the requested ranges (several patterns: a label of its own).
    head_range = window_label(ctx.ranges)

    def groups(cur: duckdb.DuckDBPyConnection) -> _RooflineGroups:
        return (
            roofline.kernel_groups(cur, scope, head_range, by="kernel"),
            roofline.kernel_groups(cur, scope, head_range, by="op"),
            shapes_of(cur, scope, head_range),
        )

    with aside(con, groups) as roofline_groups:
        return _build(con, ctx, t or Thresholds(), scope, head_range, roofline_groups)


def _build(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    t: Thresholds,
    scope: str,
    head_range: str | None,
    roofline_groups: Callable[[], _RooflineGroups],
) -> Verdict:
    head_where = "scope = 'range' AND range_name = ? AND rank IS NULL" if ctx.ranges else "scope = 'window' AND rank IS NULL"
    head_params: list[Any] = [head_range] if ctx.ranges else []
    head = (_metric_rows(con, head_where, head_params) or [{}])[0]
    util = _f(head.get("utilization"))
    ach = achieved_of(head, t)
    achieved = ach.value
    comm_share = (head.get("communication_ns") or 0) / head["activity_ns"] if head.get("activity_ns") else 0.0

    kern = one(
        con,
        """
        SELECT count(*), count(*) FILTER (WHERE flops_source = 'model'), count(*) FILTER (WHERE flops_source = 'op'),
               count(*) FILTER (WHERE flops_source = 'ncu'), count(*) FILTER (WHERE flops_source = 'user')
        FROM kernels""",
    ) or (0, 0, 0, 0, 0)
    # kernels of the analysed window whose launch was linked to a CPU op
    linked = one(
        con,
        """SELECT avg((l.op_id IS NOT NULL)::INTEGER) FROM
                         (SELECT DISTINCT kernel_id FROM window_kernels WHERE scope = ? AND range_name IS NOT DISTINCT FROM ?) w
                         JOIN kernel_launch l USING (kernel_id)""",
        [scope, head_range],
    )
    run_row = (_metric_rows(con, "scope = 'window' AND rank IS NULL", []) or [{}])[0]
    cov_run = (run_row["kernel_ns_with_flops"] / run_row["kernel_ns"]) if run_row.get("kernel_ns") else None

    means = measured.window_means(con)
    findings = findings_list(con)
    # Losses whenever the window was swept: time-based categories need no peak.
    unknown = unknown_work(con)
    generic = generic_advice(con, unknown)
    losses = loss_list(loss_fractions(con, scope, head_range, None), best_fixes(findings), generic)
    hosts = {
        r: h for r, h in con.execute("SELECT rank, any_value(host) FROM sources WHERE rank IS NOT NULL GROUP BY rank").fetchall()
    }
    names = {(p.rank, p.device): p.device_name for p in ctx.peaks}
    ranks = []
    for r in _metric_rows(
        con, f"scope = '{scope}' AND rank IS NOT NULL" + (" AND range_name = ?" if ctx.ranges else ""), head_params
    ):
        a = achieved_of(r, t)
        ranks.append(
            RankSummary(
                rank=r["rank"],
                device=r["device"],
                host=hosts.get(r["rank"]),
                gpu=names.get((r["rank"], r["device"])),
                utilization=_utilization(
                    measured.utilization_block(_f(r["utilization"]), means, scope, head_range, r["rank"], r["device"])
                ),
                achieved_fraction_of_peak=a.value,
                achieved_is_lower_bound=a.lower_bound,
                window_ns=r["window_ns"],
                flops=_f(r["flops"]),
                losses=loss_list(
                    loss_fractions(con, scope, head_range, r["rank"], r["device"]), best_fixes(findings, r["rank"]), generic
                ),
            )
        )
    info = _range_info(con)
    ranges = []
    for r in _metric_rows(con, "scope = 'range' AND rank IS NULL", []):
        if len(set(ctx.ranges)) > 1 and r["range_name"] == head_range:
            continue  # the union of the patterns is the headline window, not a range of the trace
        a = achieved_of(r, t)
        ri = info.get(r["range_name"], {})
        n_gpus = one(
            con, "SELECT count(*) FROM metrics WHERE scope = 'range' AND range_name = ? AND rank IS NOT NULL", [r["range_name"]]
        ) or (1,)
        per_occ = r["window_ns"] / r["occurrences"] if r.get("occurrences") else None
        ranges.append(
            RangeSummary(
                name=r["range_name"],
                count=r["occurrences"],
                ranks=ri.get("ranks"),
                window=ri.get("window"),
                window_ns=r["window_ns"],
                per_occurrence_ns=_f(per_occ) if n_gpus[0] else None,
                utilization=_f(r["utilization"]),
                achieved_fraction_of_peak=a.value,
                achieved_is_lower_bound=a.lower_bound,
                utilization_measured=_f(
                    measured.utilization_block(None, means, "range", r["range_name"], None, None)["measured"]
                ),
                flops=_f(r["flops"]),
                missing_ranks=ctx.missing_ranges.get(r["range_name"], []),
                losses=loss_list(loss_fractions(con, "range", r["range_name"], None), generic=generic),
            )
        )
    for name, miss in ctx.missing_ranges.items():
        if not any(x.name == name for x in ranges):
            ranges.append(
                RangeSummary(
                    name=name,
                    count=0,
                    ranks=0,
                    window=None,
                    window_ns=0,
                    per_occurrence_ns=None,
                    utilization=None,
                    achieved_fraction_of_peak=None,
                    achieved_is_lower_bound=False,
                    flops=None,
                    missing_ranks=miss,
                    losses=[],
                )
            )

    sources = con.execute("""
        SELECT path, format, format_version, rank, rank_method, clock_anchor, offset_ns, offset_method,
               offset_uncertainty_ns, notes, time_zone, sample_period_ns FROM sources ORDER BY source_id""").fetchall()
    gpus = [GpuEntry(rank=p.rank, device=p.device, name=p.device_name) for p in ctx.peaks]
    first = ctx.peaks[0].peak if ctx.peaks else None
    # `peak.gpu`: the peak-table entry used (or the GPU --peak-tflops gave a figure for), never a name no entry
    # matched — run.gpus holds the trace's names
    distinct_gpus = {p.peak.gpu for p in ctx.peaks if p.peak.gpu_key or p.peak.forced}
    by_precision = _achieved_by_precision(con, scope, head_range) if achieved is not None else []
    dominant = by_precision[0].precision if by_precision else (first.precision if first else ctx.precision)
    dom_peak = (
        one(
            con,
            """SELECT peak_flop_s, source FROM device_peaks WHERE peak_precision = ?
                           ORDER BY rank, device LIMIT 1""",
            [dominant],
        )
        if ctx.peaks
        else None
    )
    word = verdict_word(util, achieved, comm_share, t, ach.lower_bound, ach.peak_known)
    # A window shorter than the rules' minimum per GPU is measured (the numbers above hold for it) but not judged:
    # no rule ran on it, and a word for ~100 ns of work would be a verdict on noise.
    window_per_gpu = (head.get("window_ns") or 0) / max(len(ctx.peaks), 1)
    if word != "no data" and 0 < window_per_gpu < COMMON_THRESHOLDS["min_window_us"] * 1e3:
        word = "too short to judge"
        # its waterfall keeps its shares (measured) but gives no advice: no rule ran on it
        for x in losses:
            x.recommendation = NOT_JUDGED
    notes = list(ctx.notes)
    captured = graph_capture(con)
    if captured is not None:
        n_cap, n_in, n_all, api = captured
        notes.append(
            f"{n_in:,} of the trace's {n_all:,} kernel launches went into {n_cap} {api} graph capture"
            f"{'s' if n_cap != 1 else ''} ({api.lower()}StreamBeginCapture … EndCapture): recorded into a graph, "
            "not run while profiled — that host time is the graph's set-up, not the workload; profile the "
            f"graph's replays ({api.lower()}GraphLaunch) to measure it"
        )
        if word == "idle" and n_in >= n_all / 2:
            word = "idle (graph capture)"
            # the host's time is the capture's: no host advice on its idle lines ("profile the Python side")
            for x in losses:
                if x.category in vocab.IDLE_CATEGORIES and x.category != "startup" and x.recommendation != NOT_JUDGED:
                    x.recommendation = f"graph capture: the host recording {api} graphs, not the workload — profile their replays"
    unknown_pct = f"{ach.unknown_fraction:.0%}" if ach.unknown_fraction is not None else "?"
    if achieved is None and ach.peak_known and ach.lower_bound:
        notes.append(
            f"achieved: unknown — no compute kernel in the window has a FLOP estimate ({unknown_pct} of "
            f"compute-kernel time may do matmul-class work that nothing estimates); {give_flops(con, unknown)}"
        )
    elif ach.lower_bound:
        notes.append(
            f"{unknown_pct} of compute-kernel time is unknown work (GEMM / attention / custom or compiled "
            f"kernels without a FLOP estimate): the achieved fraction is a lower bound; {give_flops(con, unknown)}"
        )
    masked = masked_attention(con, scope, head_range) if achieved is not None else None
    if achieved is not None and masked is not None and masked[0] >= MASKED_ATTENTION_NOTE_SHARE:
        share, op, dims = masked
        notes.append(
            f"{share:.0%} of the FLOPs counted are attention given a mask tensor ({op}, mask {dims}), counted as if "
            "the mask kept every (query, key) pair: the trace does not record which pairs it keeps. A causal mask "
            f"keeps about half — achieved would then be {achieved * (1 - share / 2):.0%}, not {achieved:.0%}"
        )
    if first is not None and not first.known:
        notes.append(first.source + ("; utilization and the time-based losses are still measured" if util is not None else ""))
    partial = partial_coverage(con, {p.rank for p in ctx.peaks})
    if partial["missing_ranks"]:
        miss = partial["missing_ranks"]
        notes.append(
            f"{partial['missing_rank_count']} of {partial['world_size']} ranks have no GPU activity in the "
            f"inputs (rank {', '.join(map(str, miss[:8]))}{' …' if len(miss) > 8 else ''}): the run's numbers "
            "cover the ranks given"
        )
    for src in partial["incomplete_sources"]:
        notes.append(f"{Path(src['path']).name}: the recorder says data is missing: {src['what']}")
    if head.get("capped_ns"):
        notes.append(
            f"{head['capped_ns'] / 1e6:.2f} ms of kernel time implied more than peak and was capped at "
            "peak: a FLOP estimate or the peak is wrong"
        )
    notes += _precision_notes(con, scope, head_range)
    notes += _unlaunched_notes(con, scope, head_range, head.get("window_ns"))
    notes += _wait_unknown_notes(con, losses)
    notes += _source_notes(con)
    # (idle time with work queued explains the gaps better than the host's work after a sync: one or the other)
    pending = _pending_idle_notes(con, scope, head_range, head.get("window_ns"))
    notes += pending or _short_sync_notes(con, scope, head_range, losses)
    if pending:
        _say_pending_in_waterfall(con, scope, head_range, losses, head.get("window_ns") or 0)
    for rs in ranges:
        if rs.window == "cpu":
            notes.append(f"range {rs.name} launched no GPU work: its window is its CPU interval")
    # The roofline (the library's kernel_roofline) and the shapes, read once, beside the above (`build`):
    # report.html reads these rows.
    kgroups, ogroups, (shapes, n_shapes) = roofline_groups()
    steps, step_summary = steps_of(con, ctx, t)
    for ss in step_summary:
        kinds = [x.window for x in steps if x.range == ss.range]
        n_cpu = sum(1 for k in kinds if k == "cpu")
        if 0 < n_cpu < len(kinds):
            notes.append(
                f"{n_cpu} of the {len(kinds)} steps of {ss.range} launched no GPU work and keep their CPU interval, "
                "the rest their GPU window: the step times compare two kinds of window"
            )
    for ss in step_summary:
        if ss.slow_step_count:
            worst = ss.slow_steps[0]
            # (slow steps that are all their rank's first are warm-up: first calls, allocations, autotuning)
            warm_up = ss.slow_step_count == len(ss.slow_steps) and all(x.occurrence == 0 for x in ss.slow_steps)
            notes.append(
                f"{ss.slow_step_count} of {ss.steps} steps of {ss.range} are more than {ss.slow_threshold:.0%} "
                f"slower than the median step ({ss.median_ns / 1e6:,.1f} ms); the slowest, {worst.name} on "
                f"rank {worst.rank}, took {worst.gpu_ns / 1e6:,.1f} ms "
                f"({1 + (worst.excess_over_median or 0):,.1f}× the median)"
                + (
                    f"{', its rank' if ss.slow_step_count == 1 else ': each is its rank'}'s first: warm-up (first "
                    "calls, allocations, autotuning), not the steady state — profile after a warm-up step"
                    if warm_up
                    else ": an outlier step is often the finding"
                )
            )
    above = [g for g in kgroups[:TOP_GROUPS] if g.bandwidth_above_hbm_peak]
    if above:
        notes.append(
            f"{len(above)} of the top kernels' byte estimates imply more than the HBM peak (e.g. "
            f"{vocab.kernel_label(above[0].name)[:60]}): L2-resident reuse, or a byte model that over-counts — their bandwidth "
            "is an estimate, not a measurement"
        )
    run_ranks: list[int | None] = [r for r in sorted({p.rank for p in ctx.peaks})]
    return Verdict(
        schema=SCHEMA,
        tool=Tool(name="plasmient-report", version=__version__),
        run=RunInfo(
            inputs=ctx.inputs,
            ranks=run_ranks,
            gpus=gpus,
            window_ns=head.get("window_ns"),
            range=ctx.ranges or None,
            occurrences=head.get("occurrences"),
        ),
        utilization=msgspec.convert(
            {
                **measured.utilization_block(util, means, scope, head_range, None, None),
                "measured_by_source": measured.by_source(con, scope, head_range),
            },
            Utilization,
        ),
        achieved_fraction_of_peak=achieved,
        achieved_is_lower_bound=ach.lower_bound,
        achieved_by_precision=by_precision,
        hardware_estimate=hardware_estimate(means, scope, head_range),
        peak=Peak(
            gpu=first.gpu if first and (first.gpu_key or first.forced) else None,
            gpus=sorted(g for g in distinct_gpus if g) if len(distinct_gpus) > 1 else None,
            precision=dominant,
            precisions=[b.precision for b in by_precision] or ([dominant] if dominant else []),
            tflops=dom_peak[0] / 1e12 if dom_peak and dom_peak[0] else None,
            memory_bandwidth_tbs=first.bandwidth_bytes_s / 1e12 if first and first.bandwidth_bytes_s else None,
            source=(dom_peak[1] if dom_peak else None) or (first.source if first else None),
        ),
        losses=losses,
        headroom=headroom(achieved, ach.lower_bound, ach.peak_known),
        verdict=word,
        findings=findings,
        ranks=ranks,
        ranges=ranges,
        clock=Clock(
            sources=[
                ClockSource(
                    path=s[0],
                    format=s[1],
                    format_version=s[2],
                    rank=s[3],
                    rank_method=s[4],
                    anchor=s[5],
                    offset_ns=s[6],
                    method=s[7],
                    uncertainty_ns=s[8],
                    time_zone=s[10],
                    sample_period_ns=s[11],
                    notes=s[9],
                )
                for s in sources
            ]
        ),
        coverage=Coverage(
            kernels=kern[0],
            kernels_with_flops_time_fraction=_f(ach.with_flops_fraction),
            unknown_flops_time_fraction=_f(ach.unknown_fraction),
            run_kernels_with_flops_time_fraction=_f(cov_run),
            kernels_flops_from_model=kern[1],
            kernels_flops_from_trace=kern[2],
            kernels_flops_from_ncu=kern[3],
            kernels_flops_from_user=kern[4],
            kernels_linked_to_ops_fraction=_f(linked[0]) if linked else None,
            communication_time_fraction=_f(comm_share),
            kernel_names=len(kgroups),
            op_names=len(ogroups),
            shapes=n_shapes,
            world_size=partial["world_size"],
            missing_ranks=partial["missing_ranks"],
            missing_rank_count=partial["missing_rank_count"],
            dropped_events=partial["dropped_events"],
            incomplete_sources=[IncompleteSource(path=x["path"], what=x["what"]) for x in partial["incomplete_sources"]],
        ),
        top_kernels=[msgspec.convert(_finite(d), KernelGroup) for d in roofline.as_records(kgroups, TOP_GROUPS, "kernel")],
        top_ops=[msgspec.convert(_finite(d), OpGroup) for d in roofline.as_records(ogroups, TOP_GROUPS, "op")],
        shapes=shapes,
        steps=steps,
        step_summary=step_summary,
        # the tables beside the headline (verdict_tables: collectives, memory, launch statistics)
        collective_stats=verdict_tables.collective_stats(con, scope, head_range, next(iter(step_labels(con, ctx.ranges)), None)),
        memory=verdict_tables.memory(con),
        launch_stats=verdict_tables.launch_stats(con, scope, head_range),
        notes=notes,
    )


def graph_capture(con: duckdb.DuckDBPyConnection) -> tuple[int, int, int, str] | None:
    """Stream captures in the trace: (captures, launches made inside one — same thread, between its begin and end
    calls —, all kernel launches, 'CUDA' or 'HIP'); None when nothing was captured."""
    row = one(
        con,
        """
        WITH b AS (SELECT source_id, thread, start_ns, name FROM api_calls WHERE regexp_matches(name, $begin)),
        e AS (SELECT source_id, thread, end_ns FROM api_calls WHERE regexp_matches(name, $end)),
        cap AS (
            SELECT b.source_id, b.thread, b.start_ns, e.end_ns, b.name FROM b
            ASOF JOIN e ON e.source_id = b.source_id AND e.thread IS NOT DISTINCT FROM b.thread AND e.end_ns >= b.start_ns
        ), l AS (
            SELECT source_id, thread, start_ns FROM api_calls
            WHERE regexp_matches(name, $launch) AND NOT regexp_matches(name, $graph) AND kind IS DISTINCT FROM 'osrt'
        ), inside AS (
            SELECT count(*) AS n FROM l SEMI JOIN cap c
              ON c.source_id = l.source_id AND c.thread IS NOT DISTINCT FROM l.thread
             AND l.start_ns BETWEEN c.start_ns AND c.end_ns
        )
        SELECT (SELECT count(*) FROM cap), (SELECT n FROM inside), (SELECT count(*) FROM l),
               (SELECT bool_or(starts_with(lower(name), 'hip')) FROM cap)""",
        {
            "begin": vocab.CAPTURE_BEGIN_API_RE,
            "end": vocab.CAPTURE_END_API_RE,
            "launch": vocab.LAUNCH_API_RE,
            "graph": vocab.GRAPH_LAUNCH_API_RE,
        },
    )
    if not row or not row[0] or not row[1]:
        return None
    return int(row[0]), int(row[1]), int(row[2]), "HIP" if row[3] else "CUDA"


# Idle time of a GPU while a kernel it had been given waited (launched, not started): said when it is this share of
# the window — nothing in the trace explains it.
PENDING_IDLE_SHARE = 0.01
PENDING_IDLE_MIN_NS = 1_000_000


# The idle gaps whose next kernel had been launched more than a launch's latency before the gap ended
# (idle_gaps.pending_ns), cut to that part: from then on the GPU sat idle with work queued. A gap whose next
# activity's launch is not in the trace (or that no activity ends: the window's idle tail) has no pending_ns.
PENDING_GAPS_SQL = """
    SELECT DISTINCT rank, device, end_ns - pending_ns AS start_ns, end_ns FROM idle_gaps
    WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND pending_ns > 0"""
# A waterfall line whose idle time is at least this share GPU idle with work queued says so, not its host cause.
PENDING_CATEGORY_SHARE = 0.5


def _say_pending_in_waterfall(
    con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, losses: list[Loss], window_ns: int
) -> None:
    """An idle category whose time is mostly the GPU idle with its next kernel already queued was not caused by
    the host as its name says: its line says what is known instead."""
    if not window_ns:
        return
    rows = con.execute(
        f"""
        WITH p AS ({PENDING_GAPS_SQL})
        SELECT s.category, sum(least(s.end_ns, p.end_ns) - greatest(s.start_ns, p.start_ns)) AS ns
        FROM stretches s JOIN p ON p.rank IS NOT DISTINCT FROM s.rank AND p.device = s.device
         AND s.start_ns < p.end_ns AND s.end_ns > p.start_ns
        WHERE s.scope = $scope AND s.range_name IS NOT DISTINCT FROM $rn AND NOT s.busy
        GROUP BY s.category""",
        {"scope": scope, "rn": range_name},
    ).fetchall()
    queued = {c: float(ns or 0) for c, ns in rows}
    for x in losses:
        if x.fraction and queued.get(x.category, 0.0) >= PENDING_CATEGORY_SHARE * x.fraction * window_ns:
            x.recommendation = (
                "mostly GPU idle with its next kernel already queued: it waited on work the trace does not hold "
                "(another process, an uncaptured stream or event), not on the host — see the note"
            )


def _pending_idle_notes(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, window_ns: int | None) -> list[str]:
    """An idle gap whose next kernel had been launched more than a launch's latency before it ended: the GPU sat
    idle with work queued, which nothing in the trace explains — GPU work of another process or of streams not
    captured, or host and GPU clocks that disagree. Then the idle time, and the host causes read from it ("sync
    stall"), are not what they seem."""
    if not window_ns:
        return []
    row = one(
        con,
        f"WITH p AS ({PENDING_GAPS_SQL}) SELECT count(*), sum(end_ns - start_ns) FROM p",
        {"scope": scope, "rn": range_name},
    )
    if not row or not row[0]:
        return []
    n, ns = int(row[0]), int(row[1] or 0)
    if ns < PENDING_IDLE_MIN_NS or ns < PENDING_IDLE_SHARE * window_ns:
        return []
    return [
        f"the GPU sat idle {ns / 1e6:,.2f} ms ({ns / window_ns:.0%} of the window, {n:,} gap{'s' if n != 1 else ''}) "
        "with its next kernel already launched: it was busy with work the trace does not hold (another process, "
        "or streams not captured), or the host and GPU clocks disagree — that idle time, and the host causes read "
        "from it, are not what they seem"
    ]


def _short_sync_notes(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, losses: list[Loss]) -> list[str]:
    """sync_stall names the idle time after a host sync returned; when the syncs themselves hardly waited, what
    kept the GPU idle was the host's work after them, not the wait: said, with both times."""
    share = next((x.fraction for x in losses if x.category == "sync_stall"), 0.0) or 0.0
    if share < SHORT_SYNC_NOTE_FRACTION:
        return []
    row = one(
        con,
        """
        WITH s AS (SELECT sum(end_ns - start_ns) AS ns FROM stretches
                   WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND category = 'sync_stall'),
        g AS (SELECT sum(least(sync_end_ns - sync_start_ns, end_ns - start_ns)) AS waited FROM idle_gaps
              WHERE scope = $scope AND range_name IS NOT DISTINCT FROM $rn AND after_sync)
        SELECT s.ns, g.waited FROM s, g""",
        {"scope": scope, "rn": range_name},
    )
    if not row or not row[0] or row[1] is None or row[1] >= SHORT_SYNC_WAIT_SHARE * row[0]:
        return []
    return [
        f"sync stall ({share:.0%}): the syncs before those gaps waited {row[1] / 1e6:,.2f} ms of the "
        f"{row[0] / 1e6:,.2f} ms charged to them — for the rest the host did not launch after the sync returned "
        "(its own work, a sleep, I/O): dropping the syncs would recover at most their wait; look at what runs "
        "after each sync"
    ]


SHORT_SYNC_NOTE_FRACTION = 0.05
SHORT_SYNC_WAIT_SHARE = 0.25


def _source_notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """How a GPU the trace does not name (or names generically) was identified — its peak rests on it: the
    sources' notes of parsers/gpus.py (peaks.identify's sentences); and ranges cut to the profiler's recording
    (parsers/kineto) — a step's time rests on it. Each said once."""
    out: list[str] = []
    for (notes,) in con.execute("SELECT notes FROM sources WHERE notes IS NOT NULL ORDER BY source_id").fetchall():
        out += [
            x
            for x in str(notes).split("; ")
            if (peaks.IDENTIFIED_MARK in x or peaks.CONTRADICTED_MARK in x or vocab.CUT_RANGES_MARK in x) and x not in out
        ]
    return out


def _wait_unknown_notes(con: duckdb.DuckDBPyConnection, losses: list[Loss]) -> list[str]:
    """A material `collective_transfer` loss whose collectives were seen on one rank only: their time includes any
    wait for the peers (not separable without the peers' traces), so it is not all data moving."""
    share = next((x.fraction for x in losses if x.category == "collective_transfer"), 0.0) or 0.0
    if share < WAIT_UNKNOWN_NOTE_FRACTION:
        return []
    row = (
        one(
            con,
            """SELECT sum(dur_ns) FILTER (WHERE NOT wait_known), sum(dur_ns), max(group_size) FILTER (WHERE NOT wait_known)
           FROM collective_transfers WHERE kind IS DISTINCT FROM 'p2p'""",
        )
        if has_table(con, "collective_transfers")
        else None
    )
    if not row or not row[0] or not row[1] or row[0] < row[1] / 2:
        return []
    group = f" of {int(row[2])}" if row[2] else ""
    return [
        f"collective transfer ({share:.0%}) includes any waiting for the peers: its collectives were seen on one "
        f"rank{group} only, so the time this rank waited cannot be told from data moving — give every rank's "
        "trace to split it into collective wait and transfer"
    ]


WAIT_UNKNOWN_NOTE_FRACTION = 0.05


# Kernels with no launch in a trace that records launches are said when they hold this much of the window.
UNLAUNCHED_NOTE_FRACTION = 0.01


def _unlaunched_notes(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None, window_ns: int | None) -> list[str]:
    """GPU work in the window whose launch the trace does not hold, in traces that record launches: queued before
    the profiler started (the previous step's kernels still running) or launch records lost. It is measured
    (utilization, time-based losses) but no op launched it: no FLOP estimate, no step."""
    if not window_ns:
        return []
    row = one(
        con,
        """
        WITH launching AS (SELECT DISTINCT source_id FROM kernel_launch WHERE launch_start_ns IS NOT NULL)
        SELECT count(DISTINCT wk.kernel_id), sum(wk.end_ns - wk.start_ns) FROM window_kernels wk
        JOIN kernel_launch kl USING (kernel_id)
        WHERE wk.scope = ? AND wk.range_name IS NOT DISTINCT FROM ? AND kl.launch_start_ns IS NULL
          AND kl.source_id IN (SELECT source_id FROM launching)""",
        [scope, range_name],
    )
    n, ns = (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)
    share = ns / window_ns  # (the run's window: its GPUs' windows summed)
    if not n or share < UNLAUNCHED_NOTE_FRACTION:
        return []
    return [
        f"{n:,} GPU {'activity' if n == 1 else 'activities'} ({ns / 1e6:,.2f} ms, {share:.0%} of the window's GPU "
        f"time) {'has' if n == 1 else 'have'} no launch in the trace — queued before the profiler started (the "
        "previous step's work still running), or launch records lost: counted in utilization and the time-based "
        "losses, but no op launched them — no shapes to estimate their FLOPs from, no step that launched them"
    ]


def _precision_notes(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None) -> list[str]:
    """Precisions the GPU has no peak figure for: said, never invented (their kernels count as unknown work)."""
    rows = con.execute(
        """
        SELECT kc.precision, any_value(dp.gpu), sum(wk.end_ns - wk.start_ns) FROM window_kernels wk
        JOIN kernel_class kc USING (kernel_id)
        LEFT JOIN device_peaks dp ON dp.headline AND dp.rank IS NOT DISTINCT FROM kc.rank AND dp.device = kc.device
        WHERE wk.scope = ? AND wk.range_name IS NOT DISTINCT FROM ? AND kc.reason = 'no peak for its precision'
        GROUP BY kc.precision ORDER BY 3 DESC""",
        [scope, range_name],
    ).fetchall()
    return [
        f"{ns / 1e6:.2f} ms of {p} kernel time: the peak table has no {p} figure for {g}, so that work is counted "
        "as unknown (give --peak-precision or --peaks FILE.toml)"
        for p, g, ns in rows
    ]
