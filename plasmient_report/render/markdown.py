"""Markdown for pull requests: the verdict (and `diff`'s comparison) as GitHub-flavoured markdown that fits a PR
comment or `$GITHUB_STEP_SUMMARY` — the headline numbers, the step time, the loss waterfall as a table and the top
findings; short, tables only, no HTML. Everything comes from the typed verdict (or the comparison `diff.compare`
returns); the wording is the box's (render/_format.py)."""

from __future__ import annotations

import re
from typing import Any

from ..verdict_model import Verdict
from ._format import (
    achieved_text,
    achieved_why,
    category_label,
    ms,
    pct,
    rate,
    step_counts,
    step_outliers_text,
    step_time_text,
)

MAX_LOSSES = 6
MAX_FINDINGS = 5
MAX_NOTES = 3
BAR_WIDTH = 20

_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def esc(text: object) -> str:
    """Free text for a markdown table cell or line: markdown punctuation backslash-escaped (no accidental emphasis,
    links or HTML tags from a kernel's template brackets), newlines folded."""
    return _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def code(text: object) -> str:
    """A name as inline code (template brackets stay literal); a pipe escaped for tables."""
    t = " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")
    return f"`{t}`"


def bar(fraction: float | None) -> str:
    """A share of peak as a bar of block characters (20 = 100%)."""
    if fraction is None or fraction <= 0:
        return ""
    n = fraction * BAR_WIDTH
    full = int(n)
    return "█" * full + ("▌" if n - full >= 0.5 else "")


def _title(v: Verdict) -> str:
    scope = ", ".join(v.run.range) if v.run.range else "whole profile"
    n = len(v.run.ranks)
    gpu = v.peak.gpu or ", ".join(sorted({g.name for g in v.run.gpus if g.name})) or "unknown GPU"
    return f"plasmient · {scope} · {n} rank{'s' if n != 1 else ''} · {gpu}"


def verdict(v: Verdict) -> str:
    """The run's verdict as markdown."""
    lines = [f"### {esc(_title(v))}", ""]
    word = f"**VERDICT: {esc(v.verdict)}.**"
    if v.headroom.factor:
        word += f" {esc(v.headroom.text)}."
    lines += [word, ""]
    why = achieved_why(v)
    of_peak = f"of {v.peak.tflops:,.1f} TFLOP/s {v.peak.precision}" if v.peak.tflops else ""
    rows = [("GPU utilization (trace)", esc(pct(v.utilization.trace)), "what the dashboard shows")]
    if v.utilization.measured is not None:
        rows.append(("GPU utilization (measured)", esc(pct(v.utilization.measured)), "counter logs"))
    rows.append(("**achieved fraction of peak**", f"**{esc(achieved_text(v))}**", esc(why or of_peak)))
    hw = v.hardware_estimate
    if hw is not None and hw.value is not None:
        rows.append((esc(hw.metric.replace("_", " ")), esc(pct(hw.value)), "the GPU's own counters"))
    if v.step_summary:
        s = v.step_summary[0]
        rows.append(("step time (GPU)", esc(step_time_text(s)), esc(f"{step_counts(s)} of {s.range}")))
        if s.tokens_per_s is not None:
            rows.append(
                (
                    "throughput",
                    esc(rate(s.tokens_per_s, "tokens")),
                    f"per rank; {esc(rate(s.tokens_per_s_all_ranks, 'tokens'))} in all" if s.ranks > 1 else "",
                )
            )
        if s.samples_per_s is not None:
            rows.append(
                (
                    "throughput",
                    esc(rate(s.samples_per_s, "samples")),
                    f"per rank; {esc(rate(s.samples_per_s_all_ranks, 'samples'))} in all" if s.ranks > 1 else "",
                )
            )
        if s.mfu is not None:
            rows.append(("MFU (--model-flops)", esc(pct(s.mfu)), "model FLOPs over step time × peak"))
        out = step_outliers_text(s)
        if out:
            rows.append(("step outliers", "", esc(out)))
    lines += ["| | | |", "|---|---:|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows] + [""]
    losses = [x for x in v.losses if x.fraction >= 0.005][:MAX_LOSSES]
    if losses:
        lines += [
            "**Where the peak went**"
            if v.achieved_fraction_of_peak is not None
            else "**Where the peak went** (achieved unknown: the time-based losses)",
            "",
            "| | share of peak | | what to do |",
            "|---|---:|---|---|",
        ]
        if v.achieved_fraction_of_peak is not None:
            lines.append(f"| achieved | {esc(pct(v.achieved_fraction_of_peak))} | {bar(v.achieved_fraction_of_peak)} | |")
        for x in losses:
            lines.append(
                f"| {esc(category_label(x.category))} | {esc(pct(x.fraction))} | {bar(x.fraction)} | "
                f"{esc(x.recommendation or '')} |"
            )
        rest = sum(x.fraction for x in v.losses[len(losses) :])
        if rest >= 0.0005:
            lines.append(f"| (the rest) | {esc(pct(rest))} | | |")
        lines.append("")
    findings = [f for f in v.findings if (f.lost_fraction or 0) >= 0.005 or f.severity == "high"][:MAX_FINDINGS]
    # risks that claim no lost time (PR701: memory near the device's limit) are never cut by the loss findings
    findings += [f for f in v.findings if f.lost_fraction is None and f.severity == "medium"][:2]
    if findings:
        lines += ["**Top findings** (`plasmient-report rules --explain ID`)", ""]
        shown = {x.recommendation for x in losses}
        for f in findings:
            where = f" rank {f.rank}" if f.rank is not None else ""
            lost = f" · {esc(pct(f.lost_fraction))} of peak" if f.lost_fraction is not None else " · risk"
            fix = f" — {esc(f.fix)}" if f.fix and f.fix not in shown else ""
            lines.append(f"- {code(f.rule)}{where}{lost}: {esc(f.title)}{fix}")
        lines.append("")
    notes = v.notes[:MAX_NOTES]
    for n in notes:
        lines.append(f"> {esc(n)}")
    if len(v.notes) > MAX_NOTES:
        lines.append(f"> … and {len(v.notes) - MAX_NOTES} more in verdict.json (`notes`) and report.html")
    if notes:
        lines.append("")
    lines.append(f"_{esc(v.tool.name)} {esc(v.tool.version)}: the full report is report.html, every number is in verdict.json_")
    return "\n".join(lines) + "\n"


def _fraction(x: float | None) -> str:
    return esc(pct(x))


def _times(x: float | None) -> str:
    return esc(f"{x:.1f}x") if x else "n/a"


def _delta(pts: float | None) -> str:
    if pts is None:
        return ""
    mark = "🔻" if pts < -0.05 else "🔺" if pts > 0.05 else ""
    return esc(f"{pts:+.1f} pts") + (f" {mark}" if mark else "")


def diff(d: dict[str, Any]) -> str:
    """`diff`'s comparison (diff.compare) as markdown: the gate's outcome first, then the numbers, the losses that
    moved and the findings that came or went."""
    g = d["gate"]
    lines = ["### plasmient diff", ""]
    if g["threshold_pts"] is not None:
        word = "❌ FAIL" if g["failed"] else "⚠️ CANNOT GATE" if g["undecided"] else "✅ OK"
        lines += [f"**{word}**: {esc(g['message'])}", ""]
    lines += [
        f"base {code(d['base']['source'])} → candidate {code(d['candidate']['source'])}",
        "",
        "| | base | candidate | change |",
        "|---|---:|---:|---:|",
    ]
    for n in d["numbers"]:
        a, b = n["base"], n["candidate"]
        if a is None and b is None:
            continue
        ratio = esc(f"{n['ratio']:.2f}x") if n.get("ratio") else ""
        if n["unit"] == "fraction":
            lines.append(
                f"| {esc(n['name'].replace('_', ' '))} | {_fraction(a)} | {_fraction(b)} | {_delta(n.get('delta_pts'))} |"
            )
        elif n["unit"] == "ns":
            lines.append(f"| window | {esc(ms(a))} | {esc(ms(b))} | {ratio} |")
        else:
            lines.append(f"| {esc(n['name'])} | {_times(a)} | {_times(b)} | {ratio} |")
    lines.append(f"| verdict | {esc(d['base']['verdict'])} | {esc(d['candidate']['verdict'])} | |")
    for s in d.get("steps") or []:
        ratio = esc(f"{s['ratio']:.2f}x") if s.get("ratio") else ""
        lines.append(f"| step time ({esc(s['range'])}) | {esc(ms(s['base_ns']))} | {esc(ms(s['candidate_ns']))} | {ratio} |")
    lines.append("")
    moved = [x for x in d["losses"] if abs(x["delta_pts"]) >= 0.05 or max(x["base"], x["candidate"]) >= 0.005]
    if moved:
        lines += ["**Losses**", "", "| | base | candidate | change |", "|---|---:|---:|---:|"]
        for x in moved[:MAX_LOSSES]:
            lines.append(
                f"| {esc(category_label(x['category']))} | {_fraction(x['base'])} | {_fraction(x['candidate'])} | "
                f"{_delta(x['delta_pts'])} |"
            )
        lines.append("")
    f = d["findings"]
    items = [("new", x) for x in f["new"]] + [("resolved", x) for x in f["resolved"]]
    if items:
        lines += ["**Findings**", ""]
        for label, x in items[: 2 * MAX_FINDINGS]:
            lines.append(f"- {label} {code(x['rule'])} {esc(pct(x['lost_fraction']))}: {esc(x['title'])}")
        lines.append("")
    for n in d["notes"][:MAX_NOTES]:
        lines.append(f"> {esc(n)}")
    return "\n".join(lines).rstrip("\n") + "\n"


__all__ = ["bar", "code", "diff", "esc", "verdict"]
