"""The verdict box in the terminal (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._format import achieved_text, pct

WIDTH = 79


def _grid() -> Table:
    g = Table.grid(padding=(0, 1))
    g.add_column(no_wrap=True)
    g.add_column(justify="right", no_wrap=True, style="bold")
    g.add_column(style="dim", overflow="fold")
    return g


def _row(g: Table, label: str, value: str, note: str = "", width: int = 33) -> None:
    g.add_row(Text("  " + label + " " + "." * max(2, width - len(label))), value, note)


TOP_FINDINGS = 3
RANKS_DIFFER_PTS = 0.02  # per-rank lines when utilization or achieved differ by more than this, or the top loss does


def _ranks_differ(ranks: list[dict[str, Any]]) -> bool:
    def spread(xs: list[float | None]) -> float:
        ys = [x for x in xs if x is not None]
        return max(ys) - min(ys) if ys else 0.0

    tops = {(r.get("losses") or [{}])[0].get("category") for r in ranks}
    return (spread([r["utilization"]["trace"] for r in ranks]) > RANKS_DIFFER_PTS
            or spread([r["achieved_fraction_of_peak"] for r in ranks]) > RANKS_DIFFER_PTS or len(tops) > 1)


def _span(xs: list[float | None]) -> str:
    ys = [x for x in xs if x is not None]
    if not ys:
        return "n/a"
    lo, hi = pct(min(ys)), pct(max(ys))
    return lo if lo == hi else f"{lo}–{hi}"


def box(v: dict[str, Any]) -> Panel:
    run = v["run"]
    peak = v["peak"]
    n_ranks = len(run["ranks"])
    scope = ", ".join(run["range"]) if run.get("range") else "whole profile"
    gpu = peak.get("gpu") or "unknown GPU"
    title = f"plasmient · {scope} · {n_ranks} rank{'s' if n_ranks != 1 else ''} · {gpu}"
    util = v["utilization"]["trace"]
    ach = v["achieved_fraction_of_peak"]
    head = _grid()
    lines: list[Any] = [head]
    _row(head, "GPU utilization (trace)", pct(util), "← what the dashboard shows")
    if v["utilization"].get("measured") is not None:
        _row(head, "GPU utilization (measured)", pct(v["utilization"]["measured"]))
    ach_s = achieved_text(v)
    prec = peak.get("precision")
    tf = peak.get("tflops")
    _row(head, "achieved fraction of peak", ach_s,
         f"← of {tf:,.1f} TFLOP/s {prec}" if tf else "← no peak known for this GPU")
    losses = v.get("losses") or []
    if losses and ach is not None:
        lines.append(Text(""))
        lines.append(Text(f"  where the other {pct(1 - ach)} went:"))
        g = _grid()
        for loss in [x for x in losses if x["fraction"] >= 0.005][:5]:
            _row(g, "  " + loss["category"].replace("_", " "), pct(loss["fraction"]),
                 loss.get("recommendation") or "", width=31)
        lines.append(g)
    # The top findings' one-line fixes, except those already beside their loss line.
    shown = {x.get("recommendation") for x in losses}
    findings = [f for f in v.get("findings") or []
                if (f.get("lost_fraction") or 0) >= 0.005 and f.get("fix") not in shown][:TOP_FINDINGS]
    if findings:
        lines.append(Text(""))
        lines.append(Text("  also found (plasmient-report rules --explain ID):"))
        fg = Table.grid(padding=(0, 1))
        fg.add_column(no_wrap=True)
        fg.add_column(justify="right", no_wrap=True, style="bold")
        fg.add_column(style="dim", overflow="fold")
        for f in findings:
            fg.add_row(Text(f"    {f['rule']}"), pct(f.get("lost_fraction")), Text(f.get("fix") or f["title"]))
        lines.append(fg)
    ranks = v.get("ranks", [])
    if len(ranks) > 1 and _ranks_differ(ranks):
        lines.append(Text(""))
        tbl = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
        tbl.add_column("  rank", justify="right")
        tbl.add_column("gpu", justify="right")
        tbl.add_column("util", justify="right")
        tbl.add_column("achieved", justify="right")
        tbl.add_column("largest loss", no_wrap=True, overflow="ellipsis")
        for r in ranks:
            top = (r.get("losses") or [None])[0]
            tbl.add_row(f"  {r['rank']}", str(r["device"]), pct(r["utilization"]["trace"]),
                        pct(r["achieved_fraction_of_peak"]),
                        f"{top['category'].replace('_', ' ')} {pct(top['fraction'])}" if top else "")
        lines.append(tbl)
    elif len(ranks) > 1:
        lines.append(Text(""))
        lines.append(Text(f"  {len(ranks)} ranks alike: utilization "
                          f"{_span([r['utilization']['trace'] for r in ranks])}, achieved "
                          f"{_span([r['achieved_fraction_of_peak'] for r in ranks])}"))
    ranges = [r for r in v.get("ranges", []) if not run.get("range") or r["name"] not in run["range"]]
    if ranges and not run.get("range"):
        lines.append(Text(""))
        tbl = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False, title_justify="left")
        tbl.add_column("  range")
        tbl.add_column("n", justify="right")
        tbl.add_column("ms", justify="right")
        tbl.add_column("util", justify="right")
        tbl.add_column("achieved", justify="right")
        for r in ranges[:12]:
            tbl.add_row(f"  {r['name'][:34]}", str(r["count"]), f"{(r['window_ns'] or 0) / 1e6:,.1f}",
                        pct(r["utilization"]), pct(r["achieved_fraction_of_peak"]))
        lines.append(tbl)
    lines.append(Text(""))
    verdict = Text("  VERDICT: ", style="bold")
    verdict.append(v["verdict"] + ".", style="bold")
    hr = v["headroom"]
    if hr.get("factor"):
        verdict.append(" " + hr["text"] + ".")
    lines.append(verdict)
    if v.get("notes"):
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column()
        for note in v["notes"][:4]:
            grid.add_row(Text("  note:", style="yellow"), Text(note, style="yellow"))
        lines.append(grid)
    return Panel(Group(*lines), title=title, title_align="left", width=WIDTH, expand=False)


def render(v: dict[str, Any], console: Console | None = None, footer: str | None = None) -> None:
    console = console or Console(width=WIDTH + 1)
    console.print(box(v))
    if footer:
        console.print(f"  {footer}", style="dim", highlight=False)
