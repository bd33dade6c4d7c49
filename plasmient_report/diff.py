"""`plasmient-report diff BASE CANDIDATE`: what changed between two runs — the headline numbers, the step time, the
loss waterfall, per-rank and per-range numbers, and the findings (new, resolved, changed) — and the CI gate
(`--fail-if-drop PTS`: the achieved fraction of peak fell by more than PTS percentage points; it cannot decide, and
fails saying why, when either side's achieved fraction is unknown or only a lower bound). `--markdown FILE` writes
the comparison for a pull request (render/markdown.py).

A run is a `verdict.json`, an output folder holding one, or trace inputs (analysed on the fly).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput
from .verdict_model import Finding, Loss, Verdict, load_verdict

SCHEMA = "plasmient.diff/1"
VERDICT_SCHEMA = "plasmient.verdict/1"


@dataclass(frozen=True)
class Run:
    label: str
    verdict: Verdict


def _looks_like_verdict(path: Path) -> bool:
    """verdict.json, or a .json whose start has a `"schema"` key (Kineto traces have `schemaVersion`): read as a
    verdict — a broken one is then refused as a verdict, not analysed as a trace."""
    if path.suffix != ".json" or not path.is_file():
        return False
    if path.name == "verdict.json":
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    import re

    return re.search(rb'"schema"\s*:', head) is not None


def load(path: Path) -> Run:
    """A verdict from a verdict.json, an output folder holding one, or (anything else) trace inputs analysed now.
    A file that is a verdict but a malformed one is BadInput (exit 2), never a traceback or an exit 1."""
    path = Path(path)
    if not path.exists():
        raise BadInput(path, "no such file or directory")
    candidate = path / "verdict.json" if path.is_dir() else path
    if path.is_dir() and candidate.is_file():
        return Run(str(candidate), load_verdict(candidate))
    if _looks_like_verdict(candidate):
        return Run(str(candidate), load_verdict(candidate))
    from . import pipeline, scratch

    with scratch.run():
        result = pipeline.analyse([path], pipeline.Options())
        try:
            assert result.typed is not None
            return Run(str(path), result.typed)
        finally:
            result.close()


def _pts(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 100.0


def _num(name: str, a: Any, b: Any, unit: str = "fraction") -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "base": a, "candidate": b, "unit": unit}
    if unit == "fraction":
        row["delta_pts"] = _pts(a, b)
    elif a is not None and b is not None:
        row["delta"] = b - a
        row["ratio"] = b / a if a else None
    return row


def _finding_key(f: Finding) -> tuple[Any, ...]:
    return f.rule, f.rank, f.key or f.title


def _losses(items: list[Loss]) -> dict[str, float]:
    out: dict[str, float] = {}
    for x in items:
        out[x.category] = out.get(x.category, 0.0) + x.fraction
    return out


def _gate(base: Run, cand: Run, fail_if_drop: float | None) -> dict[str, Any]:
    """The CI gate. `failed`: a regression (exit 1). `undecided`: the gate cannot judge — an achieved fraction is
    unknown or only a lower bound — which fails the gate too, saying why (exit 2), instead of passing on a
    collapsed measurement."""
    b, c = base.verdict, cand.verdict
    ach_b, ach_c = b.achieved_fraction_of_peak, c.achieved_fraction_of_peak
    drop = None if ach_b is None or ach_c is None else (ach_b - ach_c) * 100.0
    gate: dict[str, Any] = {"threshold_pts": fail_if_drop, "drop_pts": drop, "failed": False, "undecided": False}
    if fail_if_drop is None:
        gate["message"] = "no gate (--fail-if-drop not given)"
        return gate
    why = []
    for side, run in (("base", base), ("candidate", cand)):
        v = run.verdict
        if v.achieved_fraction_of_peak is None:
            why.append(
                f"the achieved fraction of peak is unknown in the {side} ({run.label}: "
                f"{'no peak known for the GPU' if v.peak.tflops is None else 'no FLOP estimate'})"
            )
        elif v.achieved_is_lower_bound:
            why.append(
                f"the achieved fraction of peak is only a lower bound in the {side} ({run.label}: work "
                "without a FLOP estimate is material; give --model-flops or record shapes)"
            )
    if why:
        gate["undecided"] = True
        gate["message"] = "cannot gate: " + "; ".join(why)
        return gate
    assert drop is not None and ach_b is not None and ach_c is not None
    failed = drop > fail_if_drop
    gate["failed"] = failed
    gate["message"] = (
        (f"achieved fraction of peak fell {drop:.2f} points ({ach_b:.2%} → {ach_c:.2%}), more than the {fail_if_drop:g} allowed")
        if failed
        else (
            f"achieved fraction of peak {'fell' if drop > 0 else 'rose'} {abs(drop):.2f} points "
            f"({ach_b:.2%} → {ach_c:.2%}); limit {fail_if_drop:g}"
        )
    )
    return gate


def compare(base: Run, cand: Run, fail_if_drop: float | None = None) -> dict[str, Any]:
    b, c = base.verdict, cand.verdict
    numbers = [
        _num("achieved_fraction_of_peak", b.achieved_fraction_of_peak, c.achieved_fraction_of_peak),
        _num("utilization", b.utilization.trace, c.utilization.trace),
        _num("utilization_measured", b.utilization.measured, c.utilization.measured),
        _num("headroom", b.headroom.factor, c.headroom.factor, "x"),
        _num("window_ns", b.run.window_ns, c.run.window_ns, "ns"),
    ]
    lb, lc = _losses(b.losses), _losses(c.losses)
    losses: list[dict[str, Any]] = [
        {
            "category": k,
            "base": lb.get(k, 0.0),
            "candidate": lc.get(k, 0.0),
            "delta_pts": (lc.get(k, 0.0) - lb.get(k, 0.0)) * 100.0,
        }
        for k in sorted(set(lb) | set(lc))
    ]
    losses.sort(key=lambda x: -abs(x["delta_pts"]))
    rb = {(r.rank, r.device): r for r in b.ranks}
    rc = {(r.rank, r.device): r for r in c.ranks}

    def ach(r: Any) -> float | None:
        return r.achieved_fraction_of_peak if r is not None else None

    ranks = [
        {
            "rank": k[0],
            "device": k[1],
            "achieved_base": ach(rb.get(k)),
            "achieved_candidate": ach(rc.get(k)),
            "delta_pts": _pts(ach(rb.get(k)), ach(rc.get(k))),
        }
        for k in sorted(set(rb) | set(rc), key=lambda x: (x[0] is None, x[0] or 0, x[1] is None, x[1] or 0))
    ]
    gb = {r.name: r for r in b.ranges}
    gc = {r.name: r for r in c.ranges}
    ranges = [
        {
            "name": k,
            "achieved_base": ach(gb.get(k)),
            "achieved_candidate": ach(gc.get(k)),
            "delta_pts": _pts(ach(gb.get(k)), ach(gc.get(k))),
        }
        for k in sorted(set(gb) | set(gc))
    ]
    sb = {s.range: s for s in b.step_summary}
    sc = {s.range: s for s in c.step_summary}
    steps = [
        {
            "range": k,
            "base_ns": sb[k].mean_ns,
            "candidate_ns": sc[k].mean_ns,
            "ratio": sc[k].mean_ns / sb[k].mean_ns if sb[k].mean_ns else None,
            "spread_base": sb[k].spread,
            "spread_candidate": sc[k].spread,
            "tokens_per_s_base": sb[k].tokens_per_s,
            "tokens_per_s_candidate": sc[k].tokens_per_s,
            "mfu_base": sb[k].mfu,
            "mfu_candidate": sc[k].mfu,
        }
        for k in sb
        if k in sc
    ]
    fb = {_finding_key(f): f for f in b.findings}
    fc = {_finding_key(f): f for f in c.findings}

    def brief(f: Finding) -> dict[str, Any]:
        return {
            "rule": f.rule,
            "rank": f.rank,
            "severity": f.severity,
            "lost_fraction": f.lost_fraction,
            "title": f.title,
            "fix": f.fix,
        }

    new = [brief(fc[k]) for k in fc if k not in fb]
    resolved = [brief(fb[k]) for k in fb if k not in fc]
    changed: list[dict[str, Any]] = []
    for k in fc:
        if k in fb:
            x, y = fb[k], fc[k]
            changed.append(
                {
                    **brief(y),
                    "lost_base": x.lost_fraction,
                    "lost_candidate": y.lost_fraction,
                    "delta_pts": _pts(x.lost_fraction, y.lost_fraction),
                    "title_base": x.title,
                }
            )
    changed.sort(key=lambda x: -abs(x["delta_pts"] or 0))
    notes = []
    pb, pc = b.peak, c.peak
    if (pb.gpu, pb.precision, pb.tflops) != (pc.gpu, pc.precision, pc.tflops):
        notes.append(
            f"the peaks differ ({pb.gpu} {pb.precision} {pb.tflops} TFLOP/s vs "
            f"{pc.gpu} {pc.precision} {pc.tflops} TFLOP/s): fractions are of different peaks"
        )
    if b.achieved_is_lower_bound or c.achieved_is_lower_bound:
        notes.append("an achieved fraction is a lower bound (work without a FLOP estimate): compare with care")
    if b.run.range != c.run.range:
        notes.append(f"the runs analyse different ranges ({b.run.range} vs {c.run.range})")
    return {
        "schema": SCHEMA,
        "base": {"source": base.label, "verdict": b.verdict},
        "candidate": {"source": cand.label, "verdict": c.verdict},
        "numbers": numbers,
        "losses": losses,
        "ranks": ranks,
        "ranges": ranges,
        "steps": steps,
        "findings": {"new": new, "resolved": resolved, "changed": changed},
        "notes": notes,
        "gate": _gate(base, cand, fail_if_drop),
    }


def _pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1%}" if 0 < abs(x) < 0.01 else f"{x:.0%}" if abs(x) >= 0.1 else f"{x:.1%}"


def _delta(pts: float | None) -> str:
    if pts is None:
        return ""
    color = "red" if pts < -0.05 else "green" if pts > 0.05 else "dim"
    return f"[{color}]{pts:+.1f} pts[/{color}]"


def render(d: dict[str, Any]) -> None:
    """The comparison in the terminal (rich)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    con.print(
        f"[bold]plasmient diff[/bold]  {escape(d['base']['source'])}  →  {escape(d['candidate']['source'])}", highlight=False
    )
    t = Table(box=None, pad_edge=False)
    for col in ("", "base", "candidate", "change"):
        t.add_column(col, justify="left" if not col else "right")
    for n in d["numbers"]:
        a, b = n["base"], n["candidate"]
        if a is None and b is None:
            continue
        if n["unit"] == "fraction":
            t.add_row(n["name"].replace("_", " "), _pct(a), _pct(b), _delta(n.get("delta_pts")))
        elif n["unit"] == "ns":
            t.add_row(
                "window", f"{(a or 0) / 1e6:,.1f} ms", f"{(b or 0) / 1e6:,.1f} ms", f"{n['ratio']:.2f}x" if n.get("ratio") else ""
            )
        else:
            t.add_row(
                n["name"],
                f"{a:.1f}x" if a else "n/a",
                f"{b:.1f}x" if b else "n/a",
                f"{n['ratio']:.2f}x" if n.get("ratio") else "",
            )
    t.add_row("verdict", escape(str(d["base"]["verdict"])), escape(str(d["candidate"]["verdict"])), "")
    for x in d.get("steps") or []:
        t.add_row(
            f"step time ({escape(x['range'])})",
            f"{x['base_ns'] / 1e6:,.1f} ms",
            f"{x['candidate_ns'] / 1e6:,.1f} ms",
            f"{x['ratio']:.2f}x" if x.get("ratio") else "",
        )
    con.print(t)
    if d["losses"]:
        lt = Table("loss", "base", "candidate", "change", box=None, pad_edge=False, title_justify="left")
        for x in d["losses"]:
            if abs(x["delta_pts"]) < 0.05 and max(x["base"], x["candidate"]) < 0.005:
                continue
            lt.add_row(x["category"].replace("_", " "), _pct(x["base"]), _pct(x["candidate"]), _delta(x["delta_pts"]))
        con.print(lt)
    if len(d["ranks"]) > 1:
        rt = Table("rank", "achieved base", "candidate", "change", box=None, pad_edge=False)
        for r in d["ranks"]:
            rt.add_row(str(r["rank"]), _pct(r["achieved_base"]), _pct(r["achieved_candidate"]), _delta(r["delta_pts"]))
        con.print(rt)
    f = d["findings"]
    for label, rows, style in (("new", f["new"], "red"), ("resolved", f["resolved"], "green")):
        for x in rows[:8]:
            con.print(
                f"  [{style}]{label:8s}[/{style}] {x['rule']} {_pct(x['lost_fraction'])}  {escape(x['title'])}", highlight=False
            )
    for x in [x for x in f["changed"] if x["delta_pts"] is not None and abs(x["delta_pts"]) >= 0.5][:8]:
        con.print(
            f"  changed  {x['rule']} {_pct(x['lost_base'])} → {_pct(x['lost_candidate'])}  {escape(x['title'])}", highlight=False
        )
    for n in d["notes"]:
        con.print(f"  [yellow]note:[/yellow] {escape(n)}", highlight=False)
    g = d["gate"]
    if g["threshold_pts"] is not None:
        style = "bold red" if g["failed"] or g["undecided"] else "bold green"
        word = "FAIL" if g["failed"] else "CANNOT GATE" if g["undecided"] else "OK"
        con.print(f"  [{style}]{word}[/{style}]: {escape(g['message'])}", highlight=False)
