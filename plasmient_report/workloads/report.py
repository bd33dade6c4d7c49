"""Analysing a `measure` recording (no torch needed): each workload's trace and NVML samples through the normal
pipeline into `OUT/<workload>/` (verdict.json, report.html, trace.pftrace, run.duckdb), its box printed, then the
GPU's measured ceilings beside the datasheet and one table: NVML utilization (what the dashboard shows), the
trace's utilization, the achieved fraction of peak, the truth (analytic FLOPs over the unprofiled time) and the
largest loss the tool names. `OUT/summary.json` holds the same rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import BadInput
from .recorder import INFO, SCHEMA

SUMMARY = "summary.json"
SUMMARY_SCHEMA = "plasmient.measure-summary/1"


@dataclass(frozen=True)
class Recording:
    folder: Path
    info: dict[str, Any]

    @property
    def workloads(self) -> list[dict[str, Any]]:
        return list(self.info.get("workloads") or [])


@dataclass(frozen=True)
class Row:
    """One workload's line of the summary."""

    workload: str
    what: str
    bound_by: str  # by construction
    nvml_utilization: float | None  # time-weighted NVML gpu_util over the window (the dashboard's number)
    trace_utilization: float | None  # fraction of the window with a kernel resident
    achieved_fraction_of_peak: float | None
    achieved_is_lower_bound: bool  # little of the compute time has a FLOP estimate (the box's "?")
    expected_fraction_of_peak: float | None  # analytic FLOPs / (unprofiled step time × the peak the tool used)
    peak_tflops: float | None
    precision: str | None
    largest_loss: str | None
    largest_loss_fraction: float | None
    verdict: str | None
    outputs: str


def load(folder: Path) -> Recording:
    """A recording folder (or a measure output folder holding `recording/`), checked: BadInput, one line."""
    folder = Path(folder)
    if (folder / "recording" / INFO).is_file() and not (folder / INFO).is_file():
        folder = folder / "recording"
    path = folder / INFO
    if not folder.is_dir():
        raise BadInput(folder, "no such folder (give a recording made by `plasmient-report measure`)")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(folder, f"not a measure recording (no {INFO})") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInput(path, f"unreadable ({e})") from None
    if not isinstance(info, dict) or info.get("schema") != SCHEMA or not isinstance(info.get("workloads"), list):
        raise BadInput(path, f"not a measure recording (schema {SCHEMA} expected)")
    for w in info["workloads"]:
        if not isinstance(w, dict) or not isinstance(w.get("name"), str) or not w.get("trace"):
            raise BadInput(path, "a workload entry without a name or trace")
        for key in ("trace", "nvml"):
            if w.get(key) and not (folder / w[key]).is_file():
                raise BadInput(folder / w[key], f"missing (the {key} of workload {w['name']})")
    return Recording(folder, info)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def expected_fraction(w: dict[str, Any], peak_tflops: float | None) -> float | None:
    """The truth: the workload's analytic FLOPs per step over its unprofiled step time, as a fraction of the peak
    the analysis used (the datasheet's, for the precision it chose)."""
    flops, step_s = _num(w.get("flops_per_step")), _num(w.get("unprofiled_step_s"))
    if flops is None or not step_s or not peak_tflops:
        return None
    return flops / step_s / (peak_tflops * 1e12)


def analyse(
    rec: Recording,
    out_dir: Path,
    console: Console | None = None,
    quiet: bool = False,
    write_html: bool = True,
    write_trace: bool = True,
) -> list[Row]:
    """Every workload of the recording through the pipeline; prints each box, the ceilings and the summary."""
    from .. import pipeline
    from ..render import terminal

    console = console or Console(width=terminal.WIDTH + 1)
    out_dir = Path(out_dir)
    rows = []
    for w in rec.workloads:
        inputs = [rec.folder / w["trace"]] + ([rec.folder / w["nvml"]] if w.get("nvml") else [])
        opts = pipeline.Options(write_html=write_html, write_trace=write_trace, cache_dir=out_dir / ".plasmient-cache")
        result = pipeline.analyse(inputs, opts, write_trace_early=True, defer_comments=True)
        try:
            out = pipeline.write_outputs(result, out_dir / w["name"], inputs, opts)
        finally:
            result.close()
        v = result.verdict
        if not quiet:
            console.print(
                f"\n[bold]{w['name']}[/bold]: {w.get('what', '')} — bound by {w.get('bound_by')} "
                f"by construction; {w.get('steps', 0):,} steps",
                highlight=False,
            )
            terminal.render(v, console, footer=f"outputs: {out}/")
        rows.append(_row(w, v, out))
    if not quiet:
        print_ceilings(rec, console)
        print_summary(rows, console)
    _write_summary(rec, rows, out_dir)
    return rows


def _row(w: dict[str, Any], v: dict[str, Any], out: Path) -> Row:
    peak = v.get("peak") or {}
    util = v.get("utilization") or {}
    losses = [x for x in v.get("losses") or [] if _num(x.get("fraction"))]
    top = max(losses, key=lambda x: x["fraction"], default=None)
    tflops = _num(peak.get("tflops"))
    return Row(
        workload=w["name"],
        what=w.get("what", ""),
        bound_by=w.get("bound_by", ""),
        nvml_utilization=_num(util.get("measured")),
        trace_utilization=_num(util.get("trace")),
        achieved_fraction_of_peak=_num(v.get("achieved_fraction_of_peak")),
        achieved_is_lower_bound=bool(v.get("achieved_is_lower_bound")),
        expected_fraction_of_peak=expected_fraction(w, tflops),
        peak_tflops=tflops,
        precision=peak.get("precision"),
        largest_loss=top["category"] if top else None,
        largest_loss_fraction=_num(top["fraction"]) if top else None,
        verdict=v.get("verdict"),
        outputs=str(out),
    )


def fine_pct(x: float | None) -> str:
    """A percentage with two significant digits below 1% (the achieved fraction of a launch-bound loop is tiny)."""
    if x is None:
        return "n/a"
    if x == 0:
        return "0%"
    if abs(x) < 0.01:
        return f"{x * 100:.2g}%"
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"


def print_ceilings(rec: Recording, console: Console) -> None:
    """Measured ceilings of this GPU beside its datasheet peaks (peaks.toml)."""
    from ..peaks import load_table, match_gpu

    c = rec.info.get("ceilings") or {}
    name = (rec.info.get("gpu") or {}).get("name")
    g = match_gpu(name, load_table())
    console.print(
        f"\n[bold]this GPU[/bold] ({name or 'unknown'}): measured ceilings (unprofiled) beside the "
        f"datasheet{f' ({g.key})' if g else ' (not in the peak table)'}",
        highlight=False,
    )
    gemm, copy = c.get("gemm") or {}, c.get("copy") or {}
    peak_bf16 = g.tflops.get("bf16") if g else None
    bw = g.memory_bandwidth_gbs / 1e3 if g and g.memory_bandwidth_gbs else None
    mt, mb = _num(gemm.get("tflops")), _num(copy.get("tb_per_s"))
    for label, value, peak, unit, how in (
        ("bf16 GEMM", mt, peak_bf16, "TFLOP/s", gemm.get("what")),
        ("memory copy", mb, bw, "TB/s", copy.get("what")),
    ):
        shown = (f"{value:,.1f}" if unit == "TFLOP/s" else f"{value:,.2f}") if value else "n/a"
        of = f" = {fine_pct(value / peak)} of the datasheet's {peak:,.4g}" if value and peak else ""
        console.print(f"  {label:<12} {shown:>7} {unit}{of}", highlight=False)
        if how:
            console.print(f"  {'':<12} [dim]{how}[/dim]", highlight=False)


def print_summary(rows: list[Row], console: Console) -> None:
    console.print("\n[bold]what the dashboard shows, and what the GPU did[/bold]", highlight=False)
    t = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
    for col in ("  workload", "NVML", "trace", "achieved", "expected", "largest loss"):
        t.add_column(col, justify="left" if col in ("  workload", "largest loss") else "right", no_wrap=True)
    for r in rows:
        loss = f"{r.largest_loss.replace('_', ' ')} {fine_pct(r.largest_loss_fraction)}" if r.largest_loss else "—"
        achieved = fine_pct(r.achieved_fraction_of_peak)
        if r.achieved_is_lower_bound and r.achieved_fraction_of_peak is not None:
            achieved = "?" if r.achieved_fraction_of_peak < 0.005 else "≥" + achieved  # as the box says it
        t.add_row(
            f"  {r.workload}",
            fine_pct(r.nvml_utilization),
            fine_pct(r.trace_utilization),
            achieved,
            fine_pct(r.expected_fraction_of_peak),
            loss,
        )
    console.print(t)
    console.print(
        "  [dim]NVML = nvidia-smi's utilization (the dashboard) · trace = a kernel resident · achieved = "
        "useful FLOP/s ÷ peak (? = no FLOP estimate) · expected = analytic FLOPs ÷ unprofiled time ÷ peak"
        "[/dim]",
        highlight=False,
    )


def _write_summary(rec: Recording, rows: list[Row], out_dir: Path) -> None:
    doc = {
        "schema": SUMMARY_SCHEMA,
        "recording": str(rec.folder),
        "gpu": rec.info.get("gpu"),
        "ceilings": {k: {kk: vv for kk, vv in v.items() if kk != "seconds"} for k, v in (rec.info.get("ceilings") or {}).items()},
        "workloads": [asdict(r) for r in rows],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{SUMMARY}.partial"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(out_dir / SUMMARY)
