"""Judge: turn the measured tables into the verdict document (SPEC §6, `plasmient.verdict/1`).

Renderers only format this document; the wording thresholds live here.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import duckdb

from . import __version__, measured, roofline
from .errors import BadInput
from .metrics import CATEGORIES, GpuPeak, loss_fractions
from .store import one

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCHEMA = "plasmient.verdict/1"
# Rows of `top_kernels` (per kernel name) and `top_ops` (per op) in the verdict, by time in the window.
TOP_GROUPS = 20


@dataclass(frozen=True)
class Thresholds:
    idle_utilization: float = 0.30       # below: "idle"
    healthy_achieved: float = 0.50       # at or above: "healthy"
    busy_utilization: float = 0.70       # busy and achieved < useful_achieved: "busy, not useful"
    useful_achieved: float = 0.30
    comm_share: float = 0.50             # NCCL share of busy time above which: "communication-bound"
    low_coverage: float = 0.50           # compute time with a FLOP estimate below: achieved is a lower bound


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


# One-line fixes per category; the rules (SPEC §5) replace these with findings that name the cause.
RECOMMENDATIONS = {
    "collective_wait": "a peer rank arrives late: balance work or find the straggler",
    "collective_transfer": "overlap communication with compute; bucket / compress gradients",
    "pipeline_bubble": "more micro-batches or an interleaved schedule",
    "memory_bound": "fuse elementwise ops; raise arithmetic intensity",
    "compute_inefficiency": "bigger / better-shaped GEMMs; tensor-core precisions",
    "memcpy": "pinned memory, async copies, fewer host round trips",
    "launch_bound": "CUDA graphs / torch.compile; fewer, larger kernels",
    "sync_stall": "remove host syncs (.item(), .cpu()) from the hot loop",
    "input_bound": "more DataLoader workers, pinned memory, prefetch",
    "host_other": "the GPU waits on host code: profile the Python side",
    "no_coverage": "this GPU has no trace data in the window",
}


def loss_list(fractions: dict[str, float], fixes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The waterfall's lines; a category's recommendation is its best finding's one-line fix when a rule
    explained it, else the generic text."""
    fixes = fixes or {}
    out = [{"category": c, "layer": CATEGORIES[c], "fraction": f,
            "recommendation": fixes.get(c) or RECOMMENDATIONS[c]}
           for c, f in fractions.items() if c in CATEGORIES and f > 0]
    return sorted(out, key=lambda x: -x["fraction"])


def findings_list(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The rules' findings (the `findings` table, worst first) as verdict entries."""
    cur = con.execute("""SELECT rule_id, layer, category, severity, rank, lost_fraction, title, evidence,
                                  recommendation, fix, key FROM findings
                           ORDER BY lost_fraction DESC NULLS LAST, rule_id, key""")
    out = []
    for rid, layer, cat, sev, rank, lost, title, ev, rec, fix, key in cur.fetchall():
        out.append({"rule": rid, "layer": layer, "category": cat, "severity": sev, "rank": rank,
                    "lost_fraction": _f(lost), "title": title, "evidence": json.loads(ev) if ev else {},
                    "recommendation": rec, "fix": fix, "key": key})
    return out


def best_fixes(findings: list[dict[str, Any]], rank: int | None = None) -> dict[str, str]:
    """Per loss category, the one-line fix of the finding that explains most of it (for `rank`: its own
    findings and the run-wide ones)."""
    fixes: dict[str, str] = {}
    for f in findings:  # worst first
        if f["category"] and f["fix"] and f["category"] not in fixes and (rank is None or f["rank"] in (None, rank)):
            fixes[f["category"]] = f["fix"]
    return fixes


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _metric_rows(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(f"SELECT * FROM metrics WHERE {where} ORDER BY range_name NULLS FIRST, rank, device", params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def verdict_word(util: float | None, achieved: float | None, comm_share: float, t: Thresholds) -> str:
    if util is None:
        return "no data"
    if util < t.idle_utilization:
        return "idle"
    if comm_share >= t.comm_share:
        return "communication-bound"
    if achieved is None:
        return "busy (no peak known)"
    if achieved >= t.healthy_achieved:
        return "healthy"
    if util >= t.busy_utilization and achieved < t.useful_achieved:
        return "busy, not useful"
    return "underused"


def headroom(achieved: float | None) -> dict[str, Any]:
    if achieved is None or achieved <= 0:
        return {"factor": None, "text": "unknown (no useful FLOPs measured)"}
    f = 1.0 / achieved
    if f > 100:
        return {"factor": f, "text": "more than 100x below peak"}
    return {"factor": f, "text": f"{f:.1f}x headroom before new hardware"}


MAX_LISTED_RANKS = 1024


def partial_coverage(con: duckdb.DuckDBPyConnection, present: set[int]) -> dict[str, Any]:
    """What the inputs lack: ranks of the job (0 … world size − 1, from the traces) with no GPU activity among
    the inputs, and what the recorders say they lost (dropped events, CUPTI buffer overflow)."""
    row = one(con, "SELECT max(world_size) FROM sources WHERE rank_method IS DISTINCT FROM 'counters'")
    world = int(row[0]) if row and row[0] else None
    missing = [r for r in range(world) if r not in present] if world else []
    dropped = one(con, "SELECT sum(dropped_events) FROM sources")
    incomplete = con.execute("SELECT path, incomplete FROM sources WHERE incomplete IS NOT NULL "
                             "ORDER BY source_id").fetchall()
    return {"world_size": world, "missing_ranks": missing[:MAX_LISTED_RANKS], "missing_rank_count": len(missing),
            "dropped_events": int(dropped[0]) if dropped and dropped[0] is not None else None,
            "incomplete_sources": [{"path": p, "what": w} for p, w in incomplete]}


def build(con: duckdb.DuckDBPyConnection, ctx: RunContext, t: Thresholds | None = None) -> dict[str, Any]:
    t = t or Thresholds()
    scope = "range" if ctx.ranges else "window"
    # With --range the headline is the union of the requested ranges; several patterns → the first.
    head_where = "scope = 'range' AND range_name = ? AND rank IS NULL" if ctx.ranges else \
        "scope = 'window' AND rank IS NULL"
    head_params: list[Any] = [ctx.ranges[0]] if ctx.ranges else []
    head = (_metric_rows(con, head_where, head_params) or [{}])[0]
    util = _f(head.get("utilization"))
    achieved = _f(head.get("achieved_fraction_of_peak"))

    comm = one(con, """
        SELECT coalesce(sum(CASE WHEN kind = 'nccl' THEN end_ns - start_ns END), 0),
               coalesce(sum(end_ns - start_ns), 0) FROM kernels""") or (0, 0)
    comm_share = comm[0] / comm[1] if comm[1] else 0.0
    kern_time = one(con, """
        SELECT count(*), coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'compute'), 0),
               coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'compute' AND flops > 0), 0),
               count(*) FILTER (WHERE flops_source = 'model'), count(*) FILTER (WHERE flops_source = 'op'),
               count(*) FILTER (WHERE flops_source = 'ncu')
        FROM kernels""") or (0, 0, 0, 0, 0, 0)
    cov_run = kern_time[2] / kern_time[1] if kern_time[1] else None
    cov_head = (head["kernel_ns_with_flops"] / head["kernel_ns"]) if head.get("kernel_ns") else cov_run

    head_range = ctx.ranges[0] if ctx.ranges else None
    means = measured.window_means(con)
    findings = findings_list(con)
    losses = loss_list(loss_fractions(con, scope, head_range, None), best_fixes(findings)) \
        if achieved is not None else []
    ranks = []
    for r in _metric_rows(con, f"scope = '{scope}' AND rank IS NOT NULL" +
                          (" AND range_name = ?" if ctx.ranges else ""), head_params):
        ranks.append({
            "rank": r["rank"], "device": r["device"],
            "utilization": measured.utilization_block(_f(r["utilization"]), means, scope, head_range, r["rank"],
                                                      r["device"]),
            "achieved_fraction_of_peak": _f(r["achieved_fraction_of_peak"]),
            "window_ns": r["window_ns"], "flops": _f(r["flops"]),
            "losses": loss_list(loss_fractions(con, scope, head_range, r["rank"]), best_fixes(findings, r["rank"]))
            if r["achieved_fraction_of_peak"] is not None else []})
    ranges = []
    for r in _metric_rows(con, "scope = 'range' AND rank IS NULL", []):
        ranges.append({
            "name": r["range_name"], "count": r["occurrences"], "window_ns": r["window_ns"],
            "utilization": _f(r["utilization"]), "achieved_fraction_of_peak": _f(r["achieved_fraction_of_peak"]),
            "utilization_measured": measured.utilization_block(None, means, "range", r["range_name"], None,
                                                               None)["measured"],
            "flops": _f(r["flops"]), "missing_ranks": ctx.missing_ranges.get(r["range_name"], []),
            "losses": loss_list(loss_fractions(con, "range", r["range_name"], None))
            if r["achieved_fraction_of_peak"] is not None else []})
    for name, miss in ctx.missing_ranges.items():
        if not any(x["name"] == name for x in ranges):
            ranges.append({"name": name, "count": 0, "window_ns": 0, "utilization": None,
                           "achieved_fraction_of_peak": None, "flops": None, "missing_ranks": miss, "losses": []})

    sources = con.execute("""
        SELECT path, format, format_version, rank, rank_method, clock_anchor, offset_ns, offset_method,
               offset_uncertainty_ns, notes, time_zone, sample_period_ns FROM sources ORDER BY source_id""").fetchall()
    gpus = [{"rank": p.rank, "device": p.device, "name": p.device_name} for p in ctx.peaks]
    first = ctx.peaks[0].peak if ctx.peaks else None
    distinct_gpus = {p.peak.gpu for p in ctx.peaks}
    word = verdict_word(util, achieved, comm_share, t)
    lower_bound = cov_head is not None and cov_head < t.low_coverage
    notes = list(ctx.notes)
    if lower_bound:
        notes.append(f"only {cov_head:.0%} of compute-kernel time has a FLOP estimate: the achieved fraction is a "
                     "lower bound (give --model-flops, or record shapes)")
    if first is not None and not first.known:
        notes.append(first.source)
    partial = partial_coverage(con, {p.rank for p in ctx.peaks})
    if partial["missing_ranks"]:
        miss = partial["missing_ranks"]
        notes.append(f"{partial['missing_rank_count']} of {partial['world_size']} ranks have no GPU activity in the "
                     f"inputs (rank {', '.join(map(str, miss[:8]))}{' …' if len(miss) > 8 else ''}): the run's numbers "
                     "cover the ranks given")
    for src in partial["incomplete_sources"]:
        notes.append(f"{Path(src['path']).name}: the recorder says data is missing: {src['what']}")
    if head.get("capped_ns"):
        notes.append(f"{head['capped_ns'] / 1e6:.2f} ms of kernel time implied more than peak and was capped at "
                     "peak: a FLOP estimate or the peak is wrong")
    bw = first.bandwidth_bytes_s if first else None
    pk = first.flop_s if first else None
    kgroups = roofline.kernel_groups(con, scope, head_range, pk, bw)
    ogroups = roofline.kernel_groups(con, scope, head_range, pk, bw, by="op")
    return {
        "schema": SCHEMA,
        "tool": {"name": "plasmient-report", "version": __version__},
        "run": {
            "inputs": ctx.inputs,
            "ranks": sorted({p.rank for p in ctx.peaks}),
            "gpus": gpus,
            "window_ns": head.get("window_ns"),
            "range": ctx.ranges or None,
            "occurrences": head.get("occurrences"),
        },
        "utilization": {**measured.utilization_block(util, means, scope, head_range, None, None),
                        "measured_by_source": measured.by_source(con, scope, head_range)},
        "achieved_fraction_of_peak": achieved,
        "achieved_is_lower_bound": lower_bound,
        "peak": {
            "gpu": first.gpu if first else None,
            "gpus": sorted(g for g in distinct_gpus if g) if len(distinct_gpus) > 1 else None,
            "precision": ctx.precision,
            "tflops": first.flop_s / 1e12 if first and first.flop_s else None,
            "memory_bandwidth_tbs": first.bandwidth_bytes_s / 1e12 if first and first.bandwidth_bytes_s else None,
            "source": first.source if first else None,
        },
        "losses": losses,
        "headroom": headroom(achieved),
        "verdict": word,
        "findings": findings,
        "ranks": ranks,
        "ranges": ranges,
        "clock": {"sources": [
            {"path": s[0], "format": s[1], "format_version": s[2], "rank": s[3], "rank_method": s[4],
             "anchor": s[5], "offset_ns": s[6], "method": s[7], "uncertainty_ns": s[8], "time_zone": s[10],
             "sample_period_ns": s[11], "notes": s[9]} for s in sources]},
        "coverage": {
            "kernels": kern_time[0],
            "kernels_with_flops_time_fraction": cov_head,
            "run_kernels_with_flops_time_fraction": cov_run,
            "kernels_flops_from_model": kern_time[3],
            "kernels_flops_from_trace": kern_time[4],
            "kernels_flops_from_ncu": kern_time[5],
            "communication_time_fraction": comm_share,
            **partial,
        },
        "top_kernels": roofline.as_records(kgroups, TOP_GROUPS, "kernel"),
        "top_ops": roofline.as_records(ogroups, TOP_GROUPS, "op"),
        "notes": notes,
    }
