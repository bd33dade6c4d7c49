"""`plasmient-report diff BASE CANDIDATE`: what changed between two runs — the headline numbers, the loss
waterfall, per-rank and per-range numbers, and the findings (new, resolved, changed) — and the CI gate
(`--fail-if-drop PTS`: the achieved fraction of peak fell by more than PTS percentage points).

A run is a `verdict.json`, an output folder holding one, or trace inputs (analysed on the fly).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput

SCHEMA = "plasmient.diff/1"
VERDICT_SCHEMA = "plasmient.verdict/1"


@dataclass(frozen=True)
class Run:
    label: str
    verdict: dict[str, Any]


def load(path: Path) -> Run:
    """A verdict from a verdict.json, an output folder, or (anything else) trace inputs analysed now."""
    path = Path(path)
    if not path.exists():
        raise BadInput(path, "no such file or directory")
    candidate = path / "verdict.json" if path.is_dir() else path
    if candidate.is_file() and candidate.suffix == ".json" and candidate.stat().st_size < 256 * 2**20:
        try:
            doc = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc.get("schema") == VERDICT_SCHEMA:
            return Run(str(candidate), doc)
        if isinstance(doc, dict) and "schema" in doc:
            raise BadInput(candidate, f"not a plasmient verdict (schema {doc.get('schema')!r})")
    from . import pipeline

    result = pipeline.analyse([path], pipeline.Options())
    return Run(str(path), result.verdict)


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


def _finding_key(f: dict[str, Any]) -> tuple[Any, ...]:
    return f.get("rule"), f.get("rank"), f.get("key") or f.get("title")


def _losses(v: dict[str, Any]) -> dict[str, float]:
    return {x["category"]: x["fraction"] for x in v.get("losses") or []}


def compare(base: Run, cand: Run, fail_if_drop: float | None = None) -> dict[str, Any]:
    b, c = base.verdict, cand.verdict
    ach_b, ach_c = b.get("achieved_fraction_of_peak"), c.get("achieved_fraction_of_peak")
    numbers = [
        _num("achieved_fraction_of_peak", ach_b, ach_c),
        _num("utilization", (b.get("utilization") or {}).get("trace"), (c.get("utilization") or {}).get("trace")),
        _num("utilization_measured", (b.get("utilization") or {}).get("measured"),
             (c.get("utilization") or {}).get("measured")),
        _num("headroom", (b.get("headroom") or {}).get("factor"), (c.get("headroom") or {}).get("factor"), "x"),
        _num("window_ns", (b.get("run") or {}).get("window_ns"), (c.get("run") or {}).get("window_ns"), "ns"),
    ]
    lb, lc = _losses(b), _losses(c)
    losses: list[dict[str, Any]] = [{"category": k, "base": lb.get(k, 0.0), "candidate": lc.get(k, 0.0),
                                     "delta_pts": (lc.get(k, 0.0) - lb.get(k, 0.0)) * 100.0}
                                    for k in sorted(set(lb) | set(lc))]
    losses.sort(key=lambda x: -abs(x["delta_pts"]))
    rb = {r["rank"]: r for r in b.get("ranks") or []}
    rc = {r["rank"]: r for r in c.get("ranks") or []}
    ranks = [{"rank": k, "achieved_base": (rb.get(k) or {}).get("achieved_fraction_of_peak"),
              "achieved_candidate": (rc.get(k) or {}).get("achieved_fraction_of_peak"),
              "delta_pts": _pts((rb.get(k) or {}).get("achieved_fraction_of_peak"),
                                (rc.get(k) or {}).get("achieved_fraction_of_peak"))}
             for k in sorted(set(rb) | set(rc), key=lambda x: (x is None, x))]
    gb = {r["name"]: r for r in b.get("ranges") or []}
    gc = {r["name"]: r for r in c.get("ranges") or []}
    ranges = [{"name": k, "achieved_base": (gb.get(k) or {}).get("achieved_fraction_of_peak"),
               "achieved_candidate": (gc.get(k) or {}).get("achieved_fraction_of_peak"),
               "delta_pts": _pts((gb.get(k) or {}).get("achieved_fraction_of_peak"),
                                 (gc.get(k) or {}).get("achieved_fraction_of_peak"))}
              for k in sorted(set(gb) | set(gc))]
    fb = {_finding_key(f): f for f in b.get("findings") or []}
    fc = {_finding_key(f): f for f in c.get("findings") or []}

    def brief(f: dict[str, Any]) -> dict[str, Any]:
        return {k: f.get(k) for k in ("rule", "rank", "severity", "lost_fraction", "title", "fix")}

    new = [brief(fc[k]) for k in fc if k not in fb]
    resolved = [brief(fb[k]) for k in fb if k not in fc]
    changed: list[dict[str, Any]] = []
    for k in fc:
        if k in fb:
            x, y = fb[k], fc[k]
            d = _pts(x.get("lost_fraction"), y.get("lost_fraction"))
            changed.append({**brief(y), "lost_base": x.get("lost_fraction"), "lost_candidate": y.get("lost_fraction"),
                            "delta_pts": d, "title_base": x.get("title")})
    changed.sort(key=lambda x: -abs(x["delta_pts"] or 0))
    notes = []
    pb, pc = b.get("peak") or {}, c.get("peak") or {}
    same_peak = (pb.get("gpu"), pb.get("precision"), pb.get("tflops")) == (pc.get("gpu"), pc.get("precision"),
                                                                           pc.get("tflops"))
    if not same_peak:
        notes.append(f"the peaks differ ({pb.get('gpu')} {pb.get('precision')} {pb.get('tflops')} TFLOP/s vs "
                     f"{pc.get('gpu')} {pc.get('precision')} {pc.get('tflops')} TFLOP/s): fractions are of different "
                     "peaks")
    if b.get("achieved_is_lower_bound") or c.get("achieved_is_lower_bound"):
        notes.append("an achieved fraction is a lower bound (little FLOP coverage): compare with care")
    if (b.get("run") or {}).get("range") != (c.get("run") or {}).get("range"):
        notes.append(f"the runs analyse different ranges ({(b.get('run') or {}).get('range')} vs "
                     f"{(c.get('run') or {}).get('range')})")
    drop = None if ach_b is None or ach_c is None else (ach_b - ach_c) * 100.0
    if fail_if_drop is None:
        gate = {"threshold_pts": None, "drop_pts": drop, "failed": False, "message": "no gate (--fail-if-drop not given)"}
    elif drop is None:
        which = "base" if ach_b is None else "candidate"
        gate = {"threshold_pts": fail_if_drop, "drop_pts": None, "failed": False,
                "message": f"cannot gate: the achieved fraction of peak is unknown in the {which} "
                           f"({base.label if which == 'base' else cand.label})"}
    else:
        failed = drop > fail_if_drop
        gate = {"threshold_pts": fail_if_drop, "drop_pts": drop, "failed": failed,
                "message": (f"achieved fraction of peak fell {drop:.2f} points ({ach_b:.2%} → {ach_c:.2%}), more than "
                            f"the {fail_if_drop:g} allowed") if failed else
                           (f"achieved fraction of peak {'fell' if drop > 0 else 'rose'} {abs(drop):.2f} points "
                            f"({ach_b:.2%} → {ach_c:.2%}); limit {fail_if_drop:g}")}
    return {"schema": SCHEMA, "base": {"source": base.label, "verdict": b.get("verdict")},
            "candidate": {"source": cand.label, "verdict": c.get("verdict")}, "numbers": numbers,
            "losses": losses, "ranks": ranks, "ranges": ranges,
            "findings": {"new": new, "resolved": resolved, "changed": changed}, "notes": notes, "gate": gate}


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
    con.print(f"[bold]plasmient diff[/bold]  {escape(d['base']['source'])}  →  {escape(d['candidate']['source'])}",
              highlight=False)
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
            t.add_row("window", f"{(a or 0) / 1e6:,.1f} ms", f"{(b or 0) / 1e6:,.1f} ms",
                      f"{n['ratio']:.2f}x" if n.get("ratio") else "")
        else:
            t.add_row(n["name"], f"{a:.1f}x" if a else "n/a", f"{b:.1f}x" if b else "n/a",
                      f"{n['ratio']:.2f}x" if n.get("ratio") else "")
    t.add_row("verdict", escape(str(d["base"]["verdict"])), escape(str(d["candidate"]["verdict"])), "")
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
            con.print(f"  [{style}]{label:8s}[/{style}] {x['rule']} {_pct(x['lost_fraction'])}  {escape(x['title'])}",
                      highlight=False)
    for x in [x for x in f["changed"] if x["delta_pts"] is not None and abs(x["delta_pts"]) >= 0.5][:8]:
        con.print(f"  changed  {x['rule']} {_pct(x['lost_base'])} → {_pct(x['lost_candidate'])}  {escape(x['title'])}",
                  highlight=False)
    for n in d["notes"]:
        con.print(f"  [yellow]note:[/yellow] {escape(n)}", highlight=False)
    g = d["gate"]
    if g["threshold_pts"] is not None:
        style = "bold red" if g["failed"] else "bold green" if g["drop_pts"] is not None else "bold yellow"
        word = "FAIL" if g["failed"] else "OK" if g["drop_pts"] is not None else "UNKNOWN"
        con.print(f"  [{style}]{word}[/{style}]: {escape(g['message'])}", highlight=False)
