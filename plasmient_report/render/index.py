"""index.html of a batch: the fleet on one self-contained page — runs ranked by headroom, each linking to its own
report.html, where each run's peak went, the runs that failed with their error, and what was in no run, with why.
Built from the summary rows (summary.parquet), nothing else: no store, no files of the runs."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from markupsafe import Markup
from matplotlib.patches import Patch

from .. import __version__
from ..metrics import CATEGORIES
from ._format import category_label
from .html import _FG, _env, _figure, _legend, _style, category_colour, stacked_share_chart, start_page, svg

MAX_BARS = 40  # runs in the stacked-bar chart (the table has them all)
MAX_LABELS = 40  # scatter points numbered by their table row up to this many runs


def _rank_key(row: dict[str, Any]) -> tuple[bool, float, str]:
    h = row.get("headroom")
    return (h is None, -(h or 0.0), row["run_id"])


def _weighted(rows: list[dict[str, Any]], key: str) -> float | None:
    pairs = [(r[key], r["window_ns"]) for r in rows if r.get(key) is not None and r.get("window_ns")]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def context(rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    runs = [r for r in rows if r["level"] == "run"]
    ok = sorted((r for r in runs if r["status"] == "ok"), key=_rank_key)
    failed = sorted((r for r in runs if r["status"] != "ok"), key=lambda r: r["run_id"])
    unread = sorted((r for r in rows if r["level"] == "unread"), key=lambda r: r["run_id"])
    ranks: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["level"] == "rank":
            ranks.setdefault(r["run_id"], []).append(r)
    gpu_rows = [r for r in rows if r["level"] == "rank" and r["status"] == "ok"]
    achieved = [r["achieved_fraction_of_peak"] for r in ok if r.get("achieved_fraction_of_peak") is not None]
    return {
        "title": title,
        "version": __version__,
        "ok": ok,
        "failed": failed,
        "unread": unread,
        "ranks": ranks,
        "n_runs": len(runs),
        "n_gpus": len(gpu_rows),
        "fleet_utilization": _weighted(gpu_rows, "utilization"),
        "fleet_achieved": _weighted(gpu_rows, "achieved_fraction_of_peak"),
        "median_achieved": median(achieved) if achieved else None,
        "categories": list(CATEGORIES),
        "scatter": scatter_chart(ok) if ok else None,
        "bars": bars_chart(ok[:MAX_BARS]) if ok else None,
        "more_bars": max(0, len(ok) - MAX_BARS),
    }


def scatter_chart(ok: list[dict[str, Any]]) -> Markup:
    """Utilization (what the dashboard shows) against achieved fraction of peak, one point per run."""
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    present: list[str] = []
    for i, r in enumerate(ok, start=1):
        x, y = r.get("utilization"), r.get("achieved_fraction_of_peak")
        if x is None or y is None:
            continue
        cat = r.get("top_loss") or "achieved"
        if cat not in present:
            present.append(cat)
        ax.scatter([x], [y], s=36, color=category_colour(cat), edgecolors="none", zorder=3)
        if len(ok) <= MAX_LABELS:
            ax.annotate(str(i), (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7, color=_FG)
    top = max(0.1, min(1.02, max((r.get("achieved_fraction_of_peak") or 0) for r in ok) * 1.25))
    ax.plot([0, 1], [0, 1], color=_FG, linewidth=0.6, linestyle=":", zorder=1)
    ax.text(top * 0.95, top * 0.95, "achieved = utilization ", ha="right", va="bottom", fontsize=7, color=_FG)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, top)
    ticks = np.linspace(0, 1, 6)
    ax.set_xticks(ticks, [f"{v:.0%}" for v in ticks])
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:.0%}")
    ax.set_xlabel("GPU utilization (trace): what the dashboard shows", fontsize=8)
    ax.set_ylabel("achieved fraction of peak", fontsize=8)
    _style(ax, grid_axis="both")
    _legend(fig, [Patch(color=category_colour(c), label=f"largest loss: {category_label(c)}") for c in present])
    return svg(fig, "utilization against achieved fraction of peak, per run")


def bars_chart(ok: list[dict[str, Any]]) -> Markup:
    """One 100% bar per run (most headroom first): achieved, then each loss category."""
    shares = [
        {"achieved": r.get("achieved_fraction_of_peak") or 0.0, **{c: r.get(f"loss_{c}") or 0.0 for c in CATEGORIES}} for r in ok
    ]
    return stacked_share_chart(
        shares,
        [f"{i}. {_short(r['run_id'])}" for i, r in enumerate(ok, start=1)],
        "share of each run's window (100% = peak)",
        "where each run's peak went",
        max_height=12,
    )


def _short(run_id: str, n: int = 38) -> str:
    return run_id if len(run_id) <= n else "…" + run_id[-(n - 1) :]


def render(rows: list[dict[str, Any]], title: str = "plasmient · batch") -> str:
    start_page()
    return _env().get_template("index.html.j2").render(**context(rows, title))


def write(rows: list[dict[str, Any]], path: Path, title: str = "plasmient · batch") -> None:
    Path(path).write_text(render(rows, title), encoding="utf-8")
