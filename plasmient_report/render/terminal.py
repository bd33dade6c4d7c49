"""The verdict box in the terminal (rich), from the typed verdict."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..verdict_model import RankSummary, Verdict, from_dict
from ._format import (
    UNSPLIT_LABEL,
    UNSPLIT_TEXT,
    achieved_text,
    achieved_why,
    bounded_pct,
    category_label,
    hardware_label,
    middle_ellipsis,
    pct,
    range_name,
    range_occurrences,
    range_per_occurrence_ns,
    rate,
    step_counts,
    step_outliers_text,
    step_time_text,
    unsplit_fraction,
)

WIDTH = 79
TOP_FINDINGS = 3
TOP_RISKS = 2  # findings that claim no lost time (risks) shown after them
MAX_LOSSES = 5
MAX_RANGES = 12
MAX_NOTES = 4
RANKS_DIFFER_PTS = 0.02  # per-rank lines when utilization or achieved differ by more than this, or the top loss does


def _grid() -> Table:
    g = Table.grid(padding=(0, 1))
    g.add_column(no_wrap=True)
    g.add_column(justify="right", no_wrap=True, style="bold")
    g.add_column(style="dim", overflow="fold")
    return g


def _row(g: Table, label: str, value: str, note: str = "", width: int = 33) -> None:
    g.add_row(Text("  " + label + " " + "." * max(2, width - len(label))), value, Text(note))


def _ranks_differ(ranks: list[RankSummary]) -> bool:
    def spread(xs: list[float | None]) -> float:
        ys = [x for x in xs if x is not None]
        return max(ys) - min(ys) if ys else 0.0

    tops = {r.losses[0].category if r.losses else None for r in ranks}
    return (
        spread([r.utilization.trace for r in ranks]) > RANKS_DIFFER_PTS
        or spread([r.achieved_fraction_of_peak for r in ranks]) > RANKS_DIFFER_PTS
        or len(tops) > 1
    )


def _span(xs: list[float | None]) -> str:
    ys = [x for x in xs if x is not None]
    if not ys:
        return "n/a"
    lo, hi = pct(min(ys)), pct(max(ys))
    return lo if lo == hi else f"{lo}–{hi}"


def _gpu_name(v: Verdict) -> str:
    if v.peak.gpu:
        return v.peak.gpu
    names = sorted({g.name for g in v.run.gpus if g.name})
    return ", ".join(names) + " (no peak known)" if names else "unknown GPU"


TITLE_ROOM = WIDTH - 6  # the box's top border: its corners, a rule on each side and a space around the title


def _title(prefix: str, gpu: str) -> str:
    """The box's title whole on its border (rich cuts a longer one): the GPUs' names without "(no peak known)",
    which the achieved line says, then without a closing parenthesis ("NVIDIA GH200 Grace Hopper Superchip", its
    "(H100 GPU, 96 GB HBM3)" left to report.html and verdict.json), then shortened in the middle — between words
    where the first two (the vendor and the model) and the last ones fit, else anywhere."""
    if len(prefix) + len(gpu) <= TITLE_ROOM:
        return prefix + gpu
    gpu = gpu.removesuffix(" (no peak known)")
    room = max(TITLE_ROOM - len(prefix), 12)
    for short in (gpu, re.sub(r" \([^()]*\)$", "", gpu)):
        if len(short) <= room:
            return prefix + short
    words = gpu.split(" ")
    head = " ".join(words[:2]) + " …"
    tail: list[str] = []
    for w in reversed(words[2:]):
        if len(head) + sum(len(t) + 1 for t in tail) + len(w) + 1 > room:
            break
        tail.insert(0, w)
    if tail:
        return prefix + head + " " + " ".join(tail)
    return prefix + middle_ellipsis(gpu, room)


def _ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.1f}"


def box(verdict: Verdict | dict[str, Any]) -> Panel:
    v = verdict if isinstance(verdict, Verdict) else from_dict(verdict, strict=False)
    run, peak, util = v.run, v.peak, v.utilization
    n_ranks = len(run.ranks)
    scope = ", ".join(run.range) if run.range else "whole profile"
    title = _title(f"plasmient · {scope} · {n_ranks} rank{'s' if n_ranks != 1 else ''} · ", _gpu_name(v))
    ach = v.achieved_fraction_of_peak
    head = _grid()
    lines: list[Any] = [head]
    _row(head, "GPU utilization (trace)", pct(util.trace), "← what the dashboard shows")
    if util.measured is not None:
        _row(head, "GPU utilization (measured)", pct(util.measured))
    if util.sm_active is not None:
        _row(head, "SM active (GPU metrics)", pct(util.sm_active))
    hw = v.hardware_estimate
    if util.tensor_active is not None and not (hw and hw.metric == "tensor_active"):
        _row(head, "tensor cores active", pct(util.tensor_active))
    why = achieved_why(v)
    of_peak = f"← of {peak.tflops:,.1f} TFLOP/s {peak.precision}" if peak.tflops else ""
    _row(head, "achieved fraction of peak", achieved_text(v), "← " + why if why else of_peak)
    if hw is not None and hw.value is not None:
        _row(head, hardware_label(hw.metric), pct(hw.value), "← the GPU's own counters")
    if len(v.achieved_by_precision) > 1:
        parts = " · ".join(f"{p.precision} {pct(p.fraction)}" for p in v.achieved_by_precision)
        lines.append(Text(f"    achieved by precision: {parts}", style="dim"))
    if v.step_summary:
        ss = v.step_summary[0]
        steps = _grid()
        lines.append(steps)
        # a step that is not the profiler's is a repeating range taken as the step: named, so it is not mistaken
        label = "" if ss.range.startswith("ProfilerStep") else f" of {range_name(ss.range)}"
        _row(steps, "step time (GPU)", step_time_text(ss), "← " + step_counts(ss) + label)
        if ss.tokens_per_s is not None:
            _row(
                steps,
                "throughput",
                rate(ss.tokens_per_s, "tokens"),
                f"← per rank; {rate(ss.tokens_per_s_all_ranks, 'tokens')} in all" if ss.ranks > 1 else "",
            )
        if ss.samples_per_s is not None:
            _row(
                steps,
                "throughput" if ss.tokens_per_s is None else "samples",
                rate(ss.samples_per_s, "samples"),
                f"← per rank; {rate(ss.samples_per_s_all_ranks, 'samples')} in all" if ss.ranks > 1 else "",
            )
        if ss.mfu is not None:
            _row(steps, "MFU (--model-flops)", pct(ss.mfu), "← model FLOPs / (step × peak)")
        outliers = step_outliers_text(ss)
        if outliers:
            lines.append(Text(f"    {outliers}", style="dim"))
    losses = v.losses
    if losses:
        lines.append(Text(""))
        lines.append(
            Text(f"  where the other {pct(1 - ach)} went:" if ach is not None else "  where the peak went (achieved unknown):")
        )
        g = _grid()
        shown_losses = [x for x in losses if x.fraction >= 0.005][:MAX_LOSSES]
        for loss in shown_losses:
            _row(g, "  " + category_label(loss.category), pct(loss.fraction), loss.recommendation or "", width=31)
        rest = unsplit_fraction(v)
        if rest >= 0.005:
            _row(g, "  " + UNSPLIT_LABEL, pct(rest), UNSPLIT_TEXT, width=31)
        lines.append(g)
    # The top findings' one-line fixes, except those already beside their loss line.
    shown = {x.recommendation for x in losses}
    # The findings that claim most lost time, then the risks that claim none (PR701: memory near the device's
    # limit) when medium or high: a risk never takes a loss finding's place, nor is it cut by them.
    findings = [f for f in v.findings if (f.lost_fraction or 0) >= 0.005 and f.fix not in shown][:TOP_FINDINGS]
    findings += [f for f in v.findings if f.lost_fraction is None and f.severity in ("high", "medium")][:TOP_RISKS]
    if findings:
        lines.append(Text(""))
        lines.append(Text("  also found (plasmient-report rules --explain ID):"))
        fg = Table.grid(padding=(0, 1))
        fg.add_column(no_wrap=True)
        fg.add_column(justify="right", no_wrap=True, style="bold")
        fg.add_column(style="dim", overflow="fold")
        for f in findings:
            fg.add_row(
                Text(f"    {f.rule}"),
                pct(f.lost_fraction) if f.lost_fraction is not None else "risk",
                Text(f.title if f.lost_fraction is None else f.fix or f.title),
            )
        lines.append(fg)
    ranks = v.ranks
    if len(ranks) > 1 and _ranks_differ(ranks):
        lines.append(Text(""))
        tbl = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
        tbl.add_column("  rank", justify="right")
        tbl.add_column("gpu", justify="right")
        tbl.add_column("util", justify="right")
        tbl.add_column("achieved", justify="right")
        tbl.add_column("largest loss", no_wrap=True, overflow="ellipsis")
        for rk in ranks:
            top = rk.losses[0] if rk.losses else None
            tbl.add_row(
                f"  {rk.rank}",
                str(rk.device),
                pct(rk.utilization.trace),
                bounded_pct(rk.achieved_fraction_of_peak, rk.achieved_is_lower_bound),
                f"{category_label(top.category)} {pct(top.fraction)}" if top else "",
            )
        lines.append(tbl)
    elif len(ranks) > 1:
        lines.append(Text(""))
        lines.append(
            Text(
                f"  {len(ranks)} ranks alike: utilization {_span([r.utilization.trace for r in ranks])}, "
                f"achieved {_span([r.achieved_fraction_of_peak for r in ranks])}"
            )
        )
    ranges = v.ranges
    if ranges and (not run.range or len(ranges) > 1):  # one chosen range is the headline itself
        lines.append(Text(""))
        tbl = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False, title_justify="left")
        tbl.add_column("  range", overflow="ellipsis", no_wrap=True, max_width=30)
        tbl.add_column("steps", justify="right", no_wrap=True)
        tbl.add_column("ms/step", justify="right")
        tbl.add_column("util", justify="right")
        tbl.add_column("achieved", justify="right")
        for r in ranges[:MAX_RANGES]:
            tbl.add_row(
                f"  {range_name(r.name)}",
                range_occurrences(r, v),
                _ms(range_per_occurrence_ns(r)),
                pct(r.utilization),
                bounded_pct(r.achieved_fraction_of_peak, r.achieved_is_lower_bound),
            )
        lines.append(tbl)
        if len(ranges) > MAX_RANGES:
            lines.append(Text(f"  … and {len(ranges) - MAX_RANGES} more ranges in report.html / verdict.json", style="dim"))
    lines.append(Text(""))
    verdict_line = Text("  VERDICT: ", style="bold")
    verdict_line.append(v.verdict + ".", style="bold")
    if v.headroom.factor:
        verdict_line.append(" " + v.headroom.text + ".")
    lines.append(verdict_line)
    if v.notes:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column()
        for note in v.notes[:MAX_NOTES]:
            grid.add_row(Text("  note:", style="yellow"), Text(note, style="yellow"))
        if len(v.notes) > MAX_NOTES:
            more = len(v.notes) - MAX_NOTES
            grid.add_row(
                Text("  note:", style="yellow"),
                Text(
                    f'… and {more} more note{"s" if more != 1 else ""} in verdict.json ("notes") and report.html', style="yellow"
                ),
            )
        lines.append(grid)
    return Panel(Group(*lines), title=Text(title), title_align="left", width=WIDTH, expand=False)


def render(v: Verdict | dict[str, Any], console: Console | None = None, footer: str | None = None) -> None:
    console = console or Console(width=WIDTH + 1)
    console.print(box(v))
    if footer:
        console.print(Text(f"  {footer}", style="dim"))
