"""report.html: one self-contained page (SPEC §6) from the typed verdict and the store's views.

Charts are matplotlib figures inlined as SVG (their text and axes take the page's colours, so light and dark
themes both read); tables sort in the browser with a few lines of inline script. No network, no CDN.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader
from jinja2.bccache import Bucket
from markupsafe import Markup

from .. import store
from ..verdict_model import KernelGroup, Loss, RankSummary, Step, StepSummary, Verdict, from_dict
from ..vocab import CATEGORIES
from ._format import (
    UNSPLIT,
    UNSPLIT_TEXT,
    achieved_text,
    achieved_why,
    category_label,
    hardware_label,
    kernel_names,
    middle_ellipsis,
    pct,
    range_occurrences,
    range_per_occurrence_ns,
    rate,
    signed_pct,
    step_counts,
    step_outliers_text,
    step_time_text,
    unsplit_fraction,
)
from ._format import (
    range_name as range_label,
)
from ._mpl import (
    Figure,
    FuncFormatter,
    Line2D,
    MaxNLocator,
    MixedModeRenderer,
    Patch,
    PolyCollection,
    RendererSVG,
    ScaledTranslation,
    matplotlib,
    to_rgba,
)
from .verdict import document

if TYPE_CHECKING:  # the page worker draws pages without the store's libraries
    import duckdb

TIMELINE_BINS = 800
ROOFLINE_POINTS = 30  # at most; each point is numbered by its row in the kernel table (the verdict's top_kernels)
MAX_RANK_BARS = 128  # the per-rank stacked bars; beyond this the sortable matrix table carries it
MAX_COUNTER_RANKS = 8

# Colours per loss category (and achieved), mid-saturation so they read on light and dark backgrounds.
COLOURS: dict[str, str] = {
    "achieved": "#2ca02c",
    "collective_wait": "#d62728",
    "collective_transfer": "#ff7f0e",
    "pipeline_bubble": "#e377c2",
    "memory_bound": "#1f77b4",
    "unknown_flops": "#aec7e8",
    "compute_inefficiency": "#17becf",
    "memcpy": "#bcbd22",
    "launch_bound": "#9467bd",
    "sync_stall": "#8c564b",
    "input_bound": "#e6b422",
    "startup": "#c5b0d5",
    "host_other": "#9a9a9a",
    "no_coverage": "#4d4d4d",
}
# matplotlib draws text, axes and grid in these placeholder colours; the inlined SVG then takes them from CSS.
_FG, _GRID, _PANEL = "#010203", "#020304", "#030405"
_CSS_COLOURS = {_FG: "currentColor", _GRID: "var(--grid)", _PANEL: "var(--panel)"}
FRACTION_METRICS = (
    "gpu_util",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "mem_util",
    "fp16_active",
    "fp32_active",
    "fp64_active",
    "nvlink_util",
    "pcie_util",
)


def category_colour(category: str) -> str:
    return COLOURS.get(category, "#777777")


def fmt_ms(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    ms = ns / 1e6
    return f"{ms:,.3f}" if ms < 1 else f"{ms:,.1f}"


def fmt_si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if x == 0:
        return f"0 {unit}".strip()
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:,.3g} {prefix}{unit}"
    return f"{x:,.3g} {unit}".strip()


def fmt_duration(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:,.3g} s"
    if a >= 1e6:
        return f"{ns / 1e6:,.3g} ms"
    if a >= 1e3:
        return f"{ns / 1e3:,.3g} µs"
    return f"{ns:,.0f} ns"


def fmt_value(x: Any) -> str:
    """A verdict value of unknown shape, for the generic tables (clock, coverage, evidence)."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:,.4g}"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, list):
        if not x:
            return "none"
        if all(isinstance(i, dict) for i in x):
            return "; ".join(", ".join(f"{k}: {fmt_value(val)}" for k, val in i.items()) for i in x)
        return ", ".join(fmt_value(i) for i in x)
    if isinstance(x, dict):
        return ", ".join(f"{k}: {fmt_value(val)}" for k, val in x.items()) if x else "none"
    return str(x)


def key_label(key: str) -> str:
    """A verdict key as a column header: its unit suffix dropped (the cell says it), underscores as spaces —
    `sample_period_ns` → 'sample period', `gpu_util` → 'gpu util'."""
    for suffix in ("_ns", "_bytes", "_bytes_s"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def fmt_field(x: Any, key: str) -> str:
    """A value of a generic table (clock sources, coverage) by its key's unit suffix."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        if key.endswith("_ns"):
            return fmt_duration(x)
        if key.endswith(("fraction", "coverage")) and isinstance(x, float):
            return pct(x)
    return fmt_value(x)


def sort_key(x: Any) -> str:
    """What a table cell sorts by (data-sort): an integer exactly, a float to 12 significant digits, or empty for
    none. Twelve digits order any two values the page tells apart, and are the same whichever order a parallel sum
    added a value's terms in: the mean of a counter's 12.6 M samples read 1662.7386163476472 in one run and
    1662.738616347647 in the next, and report.html differed by that digit."""
    if x is None:
        return ""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return f"{x:.12g}" if math.isfinite(x) else ""
    return str(x)


# ---------------------------------------------------------------------------------------------------------------
# Binning in SQL: any interval source, split pro rata over fixed time bins.


SPANS_VIEW = "_html_spans"  # the time grids, registered for the duration of one binning query


@dataclass(frozen=True)
class Span:
    """A time grid for one GPU: `nbins` bins of `bin_ns` from `g0_ns`; the GPU's window is [ws_ns, we_ns]."""

    rank: int | None
    device: int | None
    g0_ns: int
    bin_ns: float
    nbins: int
    ws_ns: int
    we_ns: int

    def bin_lengths(self) -> np.ndarray:
        """How much of each bin lies inside the GPU's window (ns)."""
        lo = self.g0_ns + np.arange(self.nbins) * self.bin_ns
        return np.clip(np.minimum(lo + self.bin_ns, self.we_ns) - np.maximum(lo, self.ws_ns), 0, None)


@dataclass(frozen=True)
class Binned:
    """Per span, bin and key: overlap time (ns) and the overlap-weighted sum of the source's value."""

    keys: list[str]
    overlap_ns: np.ndarray  # [span, bin, key]
    weighted: np.ndarray  # [span, bin, key]


def bin_intervals(
    con: duckdb.DuckDBPyConnection,
    source_sql: str,
    spans: list[Span],
    params: dict[str, Any] | None = None,
    part_names: str | None = None,
) -> Binned:
    """`source_sql` yields (rank, device, s, e, key, val); each interval is split over every bin it touches
    (an interval spanning many bins reaches all of them). One SQL pass; no per-row Python.

    With `part_names` (SQL of (part, name) rows), the source also yields a `part` column and the series are
    (key, part), named `key<US>name` ('?' for a part without a name): grouped by the columns as stored, the
    names joined to the few groups, never built once per row (millions of counter samples)."""
    import pyarrow as pa

    n_bins = max((s.nbins for s in spans), default=0)
    if not spans:
        return Binned([], np.zeros((0, 0, 0)), np.zeros((0, 0, 0)))
    tbl = pa.table(
        {
            "span_id": pa.array(range(len(spans)), pa.int32()),
            "rank": pa.array([s.rank for s in spans], pa.int32()),
            "device": pa.array([s.device for s in spans], pa.int32()),
            "g0": pa.array([s.g0_ns for s in spans], pa.int64()),
            "g1": pa.array([s.g0_ns + int(math.ceil(s.bin_ns * s.nbins)) for s in spans], pa.int64()),
            "bw": pa.array([s.bin_ns for s in spans], pa.float64()),
            "nb": pa.array([s.nbins for s in spans], pa.int64()),
        }
    )
    name = SPANS_VIEW
    part, label, names = "NULL", "g.key", ""
    if part_names is not None:
        part, label = "src.part", "g.key || chr(31) || coalesce(pn.name, '?')"
        names = f"LEFT JOIN ({part_names}) pn ON pn.part = g.part"
    con.register(name, tbl)
    try:
        # Per interval, its first bin f0 = floor(rs / bw) and last f1 = ceil(re / bw) - 1 (before the grid's clipping
        # to 0 and nb - 1: floor((re - 1) / bw) left out the part of a bin an interval reaches by less than 1 ns,
        # where bins do not start on whole nanoseconds). Its overlap with its first bin, min(re, (b0 + 1)·bw) −
        # max(rs, b0·bw), and with its last, are linear in rs and re with coefficients the pair (f0, f1) fixes, the
        # clipping included: the intervals are grouped by (span, key, f0, f1) with the sums of 1, val, rs, val·rs,
        # re − rs and val·(re − rs), and each group's overlaps are computed from them below — in SQL only the
        # per-interval bins and six sums (millions of 10 kHz counter samples: the 486 MiB export's 12.6 M binned
        # in 0.35 s where the overlaps summed in SQL took 0.49 s, benchmarks/README.md session 35). A whole bin
        # between, (b + 1)·bw − b·bw, is the same for every interval of a group: the groups (a few per bin) are
        # spread over their middle bins below.
        rows = con.execute(
            f"""
            WITH src AS ({source_sql}),
            x AS (
                SELECT sp.span_id, src.key, {part} AS part, src.val, (src.s - sp.g0)::DOUBLE AS rs,
                       (src.e - sp.g0)::DOUBLE AS re, sp.bw
                FROM src JOIN {name} sp
                  ON src.rank IS NOT DISTINCT FROM sp.rank AND src.device IS NOT DISTINCT FROM sp.device
                WHERE src.e > src.s AND src.e > sp.g0 AND src.s < sp.g1
            ), g AS (
                SELECT span_id, key, part, floor(rs / bw)::BIGINT AS f0, (ceil(re / bw) - 1)::BIGINT AS f1,
                       count(*) AS n, coalesce(sum(val), 0) AS sv, sum(rs) AS sr, coalesce(sum(val * rs), 0) AS svr,
                       sum(re - rs) AS sl, coalesce(sum(val * (re - rs)), 0) AS svl
                FROM x GROUP BY span_id, key, part, f0, f1
            )
            SELECT g.* EXCLUDE (key), {label} AS key, ({label}) IS NULL AS null_key FROM g {names}""",
            params or {},
        ).fetchnumpy()
    finally:
        con.unregister(name)
    col = {c: np.asarray(v) for c, v in rows.items()}
    span_id = col["span_id"].astype(np.int64)
    f0, f1 = col["f0"].astype(np.int64), col["f1"].astype(np.int64)
    n = col["n"].astype(float)
    sv, sr, svr, sl, svl = (np.nan_to_num(col[c].astype(float)) for c in ("sv", "sr", "svr", "sl", "svl"))
    bw = tbl.column("bw").to_numpy()[span_id]
    nb = tbl.column("nb").to_numpy()[span_id]
    b0, b1 = np.maximum(f0, 0), np.minimum(f1, nb - 1)
    # the first bin: from the interval's start (or the grid's, 0) to its end when it ends there, else the bin's end;
    # an interval inside one bin overlaps it by its length (re − rs summed: no sums of large times to subtract)
    ends_in_b0 = f1 <= b0
    ov0 = np.where(ends_in_b0, sr + sl, n * (b0 + 1) * bw) - np.where(f0 >= 0, sr, 0.0)
    wv0 = np.where(ends_in_b0, svr + svl, sv * (b0 + 1) * bw) - np.where(f0 >= 0, svr, 0.0)
    inside = (f0 >= 0) & (f1 == f0)
    ov0, wv0 = np.where(inside, sl, ov0), np.where(inside, svl, wv0)
    # the last bin, when it is another: from its start to the interval's end (or the grid's)
    two = b1 > b0
    ends_inside = f1 <= nb - 1
    ov1 = np.where(two, np.where(ends_inside, sr + sl, n * (b1 + 1) * bw) - n * b1 * bw, 0.0)
    wv1 = np.where(two, np.where(ends_inside, svr + svl, sv * (b1 + 1) * bw) - sv * b1 * bw, 0.0)
    # the groups that reach a bin (one starting past the grid's end, before g1 rounded it up, reaches none)
    keep = (b1 >= b0) & ((ov0 > 0) | (ov1 > 0) | (b1 > b0 + 1))
    keys, kidx = _key_index(col["key"][keep], col["null_key"][keep].astype(bool))
    ov = np.zeros((len(spans), n_bins, len(keys)))
    wv = np.zeros_like(ov)
    ovf, wvf = ov.reshape(-1), wv.reshape(-1)  # views: the bins' sums added in place
    if len(kidx):
        span_id, b0, b1, n, sv, bw = span_id[keep], b0[keep], b1[keep], n[keep], sv[keep], bw[keep]
        for b, o, w in ((b0, ov0[keep], wv0[keep]), (b1, ov1[keep], wv1[keep])):
            at = np.ravel_multi_index((span_id, b, kidx), ov.shape)
            ovf += np.bincount(at, np.where(o > 0, o, 0.0), ov.size)
            wvf += np.bincount(at, np.where(o > 0, w, 0.0), ov.size)
        mid = np.maximum(b1 - b0 - 1, 0)  # whole bins between the end ones, per group
        if mid.any():
            g = np.repeat(np.arange(len(mid)), mid)
            b = b0[g] + 1 + (np.arange(g.size) - np.repeat(np.cumsum(mid) - mid, mid))
            whole = (b + 1) * bw[g] - b * bw[g]
            keep_w = whole > 0
            at = np.ravel_multi_index((span_id[g], b, kidx[g]), ov.shape)[keep_w]
            ovf += np.bincount(at, (n[g] * whole)[keep_w], ov.size)
            wvf += np.bincount(at, (sv[g] * whole)[keep_w], ov.size)
    return Binned(keys, ov, wv)


def _key_index(key: np.ndarray, null: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct keys in SQL's order (ascending, NULL last: 'None') and each row's index into them."""
    uk, inv = np.unique(key[~null].astype(str), return_inverse=True)
    kidx = np.full(key.size, uk.size, dtype=np.int64)
    kidx[~null] = inv
    return [str(k) for k in uk] + (["None"] if null.any() else []), kidx


LOSS_SOURCE = """
    SELECT rank, device, start_ns AS s, end_ns AS e, category AS key, lost_ns / (end_ns - start_ns) AS val
    FROM losses WHERE scope = 'window' AND end_ns > start_ns"""
BUSY_SOURCE = f"""
    WITH k AS (
        SELECT rank, device, start_ns, end_ns,
               max(end_ns) OVER (PARTITION BY rank, device ORDER BY start_ns, end_ns
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM kernels k WHERE end_ns > start_ns AND EXISTS (
            SELECT 1 FROM {SPANS_VIEW} sp WHERE sp.rank IS NOT DISTINCT FROM k.rank AND sp.device = k.device)
    ), g AS (
        SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
                  OVER (PARTITION BY rank, device ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
        FROM k
    )
    SELECT rank, device, min(start_ns) AS s, max(end_ns) AS e, 'busy' AS key, 1.0 AS val
    FROM g GROUP BY rank, device, island"""
# A counter row belongs to a GPU by UUID when both sides know it, else by rank / device where given.
# Keyed by metric and the log it comes from (`metric<US>file`): two logs of the same metric are two series, never
# samples interleaved into one (their sum would cover the window twice).
KEY_SEP = chr(31)
COUNTER_SOURCE = """
    WITH g AS (
        SELECT DISTINCT w.rank, w.device, d.gpu_uuid FROM windows w
        LEFT JOIN devices d ON d.rank IS NOT DISTINCT FROM w.rank AND d.device = w.device
        WHERE w.scope = 'window'
    )
    SELECT g.rank, g.device, c.start_ns AS s, greatest(c.end_ns, c.start_ns + 1) AS e, c.metric AS key,
           c.source_id AS part, c.value AS val
    FROM counters c
    JOIN g
      ON CASE WHEN c.gpu_uuid IS NOT NULL AND g.gpu_uuid IS NOT NULL THEN c.gpu_uuid = g.gpu_uuid
              ELSE (c.rank IS NULL OR c.rank = g.rank) AND (c.device IS NULL OR c.device = g.device) END
    WHERE c.value IS NOT NULL AND isfinite(c.value)"""
# The series' log: the file name, joined to the binned groups (not once per sample: millions of 10 kHz rows).
COUNTER_PARTS = "SELECT source_id AS part, regexp_extract(path, '[^/\\\\]+$') AS name FROM sources"


def gpu_windows(con: duckdb.DuckDBPyConnection) -> list[tuple[int | None, int | None, int, int]]:
    return [
        (r, d, s, e)
        for r, d, s, e in con.execute(
            "SELECT rank, device, start_ns, end_ns FROM windows WHERE scope = 'window' AND end_ns > start_ns "
            "ORDER BY rank, device"
        ).fetchall()
    ]


def own_spans(windows: list[tuple[int | None, int | None, int, int]], nbins: int = TIMELINE_BINS) -> list[Span]:
    return [Span(r, d, s, (e - s) / nbins, nbins, s, e) for r, d, s, e in windows]


def common_spans(windows: list[tuple[int | None, int | None, int, int]], nbins: int = TIMELINE_BINS) -> list[Span]:
    if not windows:
        return []
    g0 = min(w[2] for w in windows)
    g1 = max(w[3] for w in windows)
    return [Span(r, d, g0, (g1 - g0) / nbins, nbins, s, e) for r, d, s, e in windows]


def where_peak_went(binned: Binned, spans: list[Span]) -> tuple[list[str], np.ndarray]:
    """Per span and bin, the index into the returned labels of where most of the bin's peak went
    ('achieved' or a loss category); -1 where the bin lies outside the GPU's window."""
    labels = ["achieved"] + [c for c in CATEGORIES] + [k for k in binned.keys if k not in CATEGORIES]
    n_bins = max((s.nbins for s in spans), default=0)
    out = np.full((len(spans), n_bins), -1, dtype=np.int64)
    if not spans:
        return labels, out
    lost = np.zeros((len(spans), n_bins, len(labels)))
    for i, k in enumerate(binned.keys):
        lost[:, :, labels.index(k)] = binned.weighted[:, :, i]
    lengths = np.stack([s.bin_lengths() for s in spans])
    lost[:, :, 0] = np.clip(lengths - lost[:, :, 1:].sum(axis=2), 0, None)
    choice = lost.argmax(axis=2)
    out = np.where(lengths > 0, choice, -1)
    return labels, out


# ---------------------------------------------------------------------------------------------------------------
# Charts: matplotlib → inline SVG.

_figure_counter = 0


@dataclass(frozen=True, eq=False)
class Chart:
    """A chart still to draw: a drawing function of this module by name, with its arguments (data only, no store).
    The page's context holds these; `page` draws them, in this process or in the page worker's
    (`render/page_worker.py`), which draws while the run writes its other outputs."""

    fn: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    seq: int  # charts are drawn in the order they were asked for (the SVG ids count in that order)

    def draw(self) -> Markup | None:
        out: Markup | None = _DRAWERS[self.fn](*self.args, **self.kwargs)
        return out


_chart_seq = itertools.count()


def later(fn: Any, *args: Any, **kwargs: Any) -> Chart:
    """A chart of `fn` (one of `_DRAWERS`) to draw when the page is rendered."""
    assert fn.__name__ in _DRAWERS, fn
    return Chart(fn.__name__, args, kwargs, next(_chart_seq))


def _charts_in(x: Any, found: list[Chart]) -> None:
    if isinstance(x, Chart):
        found.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _charts_in(v, found)
    elif isinstance(x, list):
        for v in x:
            _charts_in(v, found)
    elif isinstance(x, CounterView):
        _charts_in(x.chart, found)


def _drawn(x: Any, drawn: dict[int, Markup | None]) -> Any:
    if isinstance(x, Chart):
        return drawn[id(x)]
    if isinstance(x, dict):
        return {k: _drawn(v, drawn) for k, v in x.items()}
    if isinstance(x, list):
        return [_drawn(v, drawn) for v in x]
    if isinstance(x, CounterView) and isinstance(x.chart, Chart):
        return dataclasses.replace(x, chart=drawn[id(x.chart)])
    return x


def draw_charts(x: Any) -> Any:
    """`x` with every Chart inside (dict values, list items, CounterView.chart) drawn, in the order they were asked
    for."""
    found: list[Chart] = []
    _charts_in(x, found)
    drawn = {id(c): c.draw() for c in sorted(found, key=lambda c: c.seq)}
    return _drawn(x, drawn)


def start_page() -> None:
    """SVG ids count from 0 on every page: a page does not depend on what its process drew before."""
    global _figure_counter
    _figure_counter = 0


def svg(fig: Figure, label: str) -> Markup:
    """The figure as an inline <svg>: no XML prologue, no metadata, unique ids, colours from CSS."""
    global _figure_counter
    _figure_counter += 1
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"plasmient-{label}-{_figure_counter}"}):
        view_box = _draw_svg(fig, buf)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'(<svg[^>]*?)\s(width|height)="[^"]*"', r"\1", text, count=1)
    text = re.sub(r'(<svg[^>]*?)\s(width|height)="[^"]*"', r"\1", text, count=1)
    text = re.sub(r'(<svg[^>]*?\sviewBox=)"[^"]*"', rf'\1"{view_box}"', text, count=1)
    text = text.replace("<svg ", f'<svg role="img" aria-label="{label}" class="chart-svg" ', 1)
    for placeholder, css in _CSS_COLOURS.items():
        text = text.replace(placeholder, css)
    # Fonts come from the page (svg.fonttype none): name a generic family after matplotlib's choice.
    text = text.replace("font-family: 'DejaVu Sans'", "font-family: system-ui, 'DejaVu Sans', sans-serif")
    return Markup(text)


# Each figure is laid out from one measurement of its text, taken with the renderer that then draws it (so every
# label is measured once), and drawn once: `savefig` with constrained layout or a tight bounding box draws it twice.
PAD_IN = 3 / 72  # around each axes' decorations and a legend below (constrained layout's w_pad / h_pad)
CROP_PAD_IN = 0.05  # around a cropped figure's content (savefig's pad_inches)


def _draw_svg(fig: Figure, out: io.StringIO) -> str:
    """Draw `fig` as SVG (what savefig(format="svg", transparent=True) writes) into `out`; returns the viewBox
    to show, in points.

    A figure with a legend below its axes (`_legend(fig, ...)`) keeps its size and its axes fill it, as
    constrained layout would place them (`_fill`); any other keeps its axes where they are and is cropped to its
    content plus CROP_PAD_IN, as bbox_inches="tight" would (the viewBox shows that part)."""
    fig.patch.set(facecolor="none", edgecolor="none")
    axes: list[Any] = list(fig.axes)
    while axes:  # (and any inset axes: all see-through, as savefig's transparent=True has them)
        ax = axes.pop()
        ax.patch.set(facecolor="none", edgecolor="none")
        axes.extend(ax.child_axes)
    image_dpi = fig.dpi
    width, height = fig.get_size_inches()
    fig.dpi = 72  # one display unit is one point, as savefig's SVG output has it; images keep their dpi
    try:
        renderer: Any = MixedModeRenderer(  # what print_svg draws with (it delegates to the SVG renderer)
            fig,
            width,
            height,
            image_dpi,
            RendererSVG(
                width * 72,
                height * 72,
                out,
                image_dpi=image_dpi,
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
            ),
        )
        if fig.legends:
            _fill(fig, renderer)
            x0, y0, x1, y1 = 0.0, 0.0, width, height
        else:
            x0, y0, x1, y1 = fig.get_tightbbox(renderer).padded(CROP_PAD_IN).extents
        fig.draw(renderer)
        renderer.finalize()
    finally:
        fig.dpi = image_dpi
    return " ".join(f"{v * 72:.6g}" for v in (x0, height - y1, x1 - x0, y1 - y0))  # SVG's y runs downwards


def _fill(fig: Figure, renderer: Any) -> None:
    """Place the figure's axes (subplots of one grid) as constrained layout would, without its engine: each side
    of an axes leaves PAD_IN beyond its decorations (tick labels, axis labels, title), axes of a column share their
    left and right edges and axes of a row their top and bottom, the figure's legends (below) keep their height
    plus twice PAD_IN at the bottom, and the grid's width and height ratios hold between the axes themselves.

    The decorations are measured once, at the axes' first positions; they are measured again only if the axes'
    new sizes changed their ticks (a taller axis may have more), as constrained layout's second pass would."""
    specs = [(ax, spec) for ax in fig.axes if (spec := ax.get_subplotspec()) is not None]
    if not specs:
        return
    grid = specs[0][1].get_gridspec()
    spans = {ax: _span(spec) for ax, spec in specs if spec.get_gridspec() is grid}  # any other axes stays put
    axes = list(spans)
    nrows, ncols = grid.get_geometry()
    width, height = fig.get_size_inches()
    pad_x, pad_y = PAD_IN / width, PAD_IN / height
    to_fig = fig.transFigure.inverted()
    below = sum(to_fig.transform_bbox(leg.get_window_extent(renderer)).height + 2 * pad_y for leg in fig.legends)
    wr = np.asarray(grid.get_width_ratios() or [1] * ncols, dtype=float)
    hr = np.asarray(grid.get_height_ratios() or [1] * nrows, dtype=float)
    decorations: dict[Any, tuple[float, float, float, float]] = {}  # per axes: beyond its left, right, bottom, top
    measure = axes
    for _ in range(2):
        for ax in measure:
            pos = ax.get_position(original=True)
            box = ax.get_tightbbox(renderer, for_layout_only=True)
            box = to_fig.transform_bbox(box) if box is not None else pos
            decorations[ax] = (pos.x0 - box.x0, box.x1 - pos.x1, pos.y0 - box.y0, box.y1 - pos.y1)
        left, right, top, bottom = np.zeros(ncols), np.zeros(ncols), np.zeros(nrows), np.zeros(nrows)
        for ax, (c0, c1, r0, r1) in spans.items():
            d_left, d_right, d_bottom, d_top = decorations[ax]
            left[c0] = max(left[c0], d_left + pad_x)
            right[c1] = max(right[c1], d_right + pad_x)
            bottom[r1] = max(bottom[r1], d_bottom + pad_y)
            top[r0] = max(top[r0], d_top + pad_y)
        inner_w = (1 - left.sum() - right.sum()) * wr / wr.sum()
        inner_h = (1 - below - top.sum() - bottom.sum()) * hr / hr.sum()
        if inner_w.min() <= 0 or inner_h.min() <= 0:
            return  # the decorations leave no room (constrained layout gives up too): the axes stay where they are
        x = np.cumsum(left) + np.concatenate([[0], np.cumsum(inner_w + right)[:-1]])  # each column's left edge
        y = 1 - np.cumsum(top) - np.concatenate([[0], np.cumsum(inner_h + bottom)[:-1]])  # each row's top edge
        ticks = {ax: _ticks(ax) for ax in axes}
        for ax, (c0, c1, r0, r1) in spans.items():
            x0, x1, y0, y1 = x[c0], x[c1] + inner_w[c1], y[r1] - inner_h[r1], y[r0]
            ax.set_position((x0, y0, x1 - x0, y1 - y0))
            ax.set_in_layout(True)  # (set_position takes an axes out of layouts; here it is the layout)
        measure = [ax for ax in axes if not _same_ticks(ticks[ax], _ticks(ax))]
        if not measure:
            return


def _span(spec: Any) -> tuple[int, int, int, int]:
    """The first and last column and row of its grid that a subplot takes."""
    return spec.colspan.start, spec.colspan.stop - 1, spec.rowspan.start, spec.rowspan.stop - 1


def _ticks(ax: Any) -> list[np.ndarray]:
    return [np.asarray(t) for axis in (ax.xaxis, ax.yaxis) for t in (axis.get_majorticklocs(), axis.get_minorticklocs())]


def _same_ticks(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.shape == y.shape and bool(np.all(x == y)) for x, y in zip(a, b, strict=True))


def _figure(width_in: float, height_in: float) -> Figure:
    return Figure(figsize=(width_in, height_in), facecolor="none")


def _style(ax: Any, grid_axis: str | None = "x") -> None:
    ax.set_facecolor("none")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(_FG)
    ax.tick_params(colors=_FG, labelcolor=_FG, labelsize=8)
    ax.xaxis.label.set_color(_FG)
    ax.yaxis.label.set_color(_FG)
    ax.title.set_color(_FG)
    if grid_axis:
        ax.grid(True, axis=grid_axis, color=_GRID, linewidth=0.5)
        ax.set_axisbelow(True)


LEGEND_FONT_PT = 7
# A legend's widths in ems of its font (matplotlib's defaults): each entry's handle and the gap to its text, the
# space between columns and the padding around them. What the page's fonts draw is a little wider or narrower
# than matplotlib's measure: a legend is laid out to fill at most LEGEND_ROOM of the figure's width.
LEGEND_HANDLE_EM, LEGEND_COLUMN_GAP_EM, LEGEND_PAD_EM = 2.0 + 0.8, 2.0, 2 * 0.4
LEGEND_ROOM = 0.92


def _legend_columns(fig: Figure, labels: list[str]) -> int:
    """The most columns (at most five) in which a legend below the axes fits the figure's width: its entries go
    into columns in order, the first columns the longer (as matplotlib places them), each column as wide as its
    longest label, measured in the legend's font. Long labels (a counter's metric and log) get fewer columns and
    more rows rather than being cut off at the figure's edge."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop, measure = FontProperties(size=LEGEND_FONT_PT), TextToPath()
    widths = np.array([measure.get_text_width_height_descent(t, prop, ismath=False)[0] for t in labels], dtype=float)
    room = LEGEND_ROOM * fig.get_figwidth() * 72
    for ncol in range(min(len(labels), 5), 1, -1):
        cols = np.array_split(widths, ncol)
        em = LEGEND_FONT_PT
        total = sum(float(c.max()) + LEGEND_HANDLE_EM * em for c in cols) + (ncol - 1) * LEGEND_COLUMN_GAP_EM * em
        if total + LEGEND_PAD_EM * em <= room:
            return ncol
    return 1


def _legend(where: Any, handles: list[Any], **kw: Any) -> None:
    """A legend on an axes, or (given the figure) below all its axes, in as many columns as fit its width
    (`_legend_columns`): the figure then keeps its size, its axes filling the rest (`_fill`)."""
    if isinstance(where, Figure):
        kw = {"loc": "outside lower center", "ncol": _legend_columns(where, [h.get_label() for h in handles]), **kw}
    leg = where.legend(handles=handles, fontsize=LEGEND_FONT_PT, frameon=False, **kw)
    for t in leg.get_texts():
        t.set_color(_FG)


def _hbars(ax: Any, y: np.ndarray, widths: np.ndarray, lefts: np.ndarray, colours: Any, height: float) -> None:
    """Horizontal bars as one polygon collection (what `barh` draws as one patch each, ~3x slower to render for a
    chart of steps); empty bars are left out of the drawing, not of the limits: the axes scale to every bar, empty
    ones too, as they do to `barh`'s (a waterfall whose last row, achieved, is 0% had that row on its x axis)."""
    keep = widths > 0
    lo, hi = lefts[keep], lefts[keep] + widths[keep]
    top, bottom = y[keep] - height / 2, y[keep] + height / 2
    verts: Any = np.stack([np.stack(p, axis=1) for p in ((lo, top), (hi, top), (hi, bottom), (lo, bottom))], axis=1)
    face = colours if isinstance(colours, str) else [c for c, k in zip(colours, keep, strict=True) if k]
    ax.add_collection(PolyCollection(verts, facecolors=face, linewidths=0, antialiased=True))
    if not keep.all():
        empty = ~keep
        x0 = np.broadcast_to(lefts, y.shape)[empty]
        ax.update_datalim(
            np.column_stack([np.concatenate([x0, x0]), np.concatenate([y[empty] - height / 2, y[empty] + height / 2])])
        )
    ax.autoscale_view()


def _row_labels(ax: Any, y: np.ndarray, labels: list[str]) -> None:
    """What `ax.set_yticks(y, labels)` draws — a tick mark at each row and its label left of it, where an axis puts
    them — as one line of tick markers and a text per label, without an axis tick per row: matplotlib builds each
    tick (two lines, two texts, a grid line) and lays it out, ~0.8 ms a row (the step chart of a 40-step trace:
    108 -> 77 ms, the page the same to the pixel but for antialiasing; benchmarks/README.md, session 41). The marks
    and labels take an axis' tick size, pad and colour (`_FG`, as `_style` colours an axis)."""
    ax.set_yticks([])
    size, width = matplotlib.rcParams["ytick.major.size"], matplotlib.rcParams["ytick.major.width"]
    pad = matplotlib.rcParams["ytick.major.pad"] + size  # (an outward tick: the label clears it, as Tick pads it)
    on_axis = ax.get_yaxis_transform()  # x in axes units, y in data
    marks = Line2D(
        np.zeros(len(y)),
        np.asarray(y, dtype=float),
        transform=on_axis,
        linestyle="none",
        marker=0,  # (matplotlib.markers.TICKLEFT: what a y axis' ticks are drawn with)
        markersize=size,
        markeredgewidth=width,
        markeredgecolor=_FG,
        clip_on=False,
        zorder=0.5,  # (below the plot, as `_style`'s set_axisbelow puts an axis; the marks lie outside the axes)
    )
    ax.add_artist(marks)  # (not add_line: the marks are not data, the axes do not scale to them)
    shift = on_axis + ScaledTranslation(-pad / 72, 0, ax.figure.dpi_scale_trans)
    for yi, label in zip(y, labels, strict=True):
        ax.text(0, float(yi), label, transform=shift, ha="right", va="center_baseline", fontsize=8, color=_FG)


def waterfall_chart(achieved: float, losses: list[Loss]) -> Markup:
    """Peak (100%) minus each loss category in turn, down to what was achieved."""
    labels = ["peak"] + [category_label(x.category) for x in losses] + ["achieved"]
    lefts, widths, colours = [0.0], [1.0], ["#7f7f7f"]
    level = 1.0
    for x in losses:
        level -= x.fraction
        lefts.append(level)
        widths.append(x.fraction)
        colours.append(category_colour(x.category))
    lefts.append(0.0)
    widths.append(achieved)
    colours.append(COLOURS["achieved"])
    fig = _figure(7.5, 0.3 * len(labels) + 0.7)
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    _hbars(ax, y, np.array(widths), np.array(lefts), colours, 0.7)
    for yi, left, w in zip(y, lefts, widths, strict=True):
        ax.text(min(left + w, 1.0) + 0.01, float(yi), pct(w), va="center", fontsize=8, color=_FG)
    _row_labels(ax, y, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12)
    ax.set_xticks(np.linspace(0, 1, 6), [f"{v:.0%}" for v in np.linspace(0, 1, 6)])
    ax.set_xlabel("share of peak over the analysed window", fontsize=8)
    _style(ax)
    return svg(fig, "loss waterfall")


def stacked_share_chart(
    shares: list[dict[str, float]], labels: list[str], xlabel: str, alt: str, max_height: float = 9
) -> Markup:
    """One 100% stacked bar per row: achieved, then each loss category (`shares[i][category]`, fractions)."""
    fig = _figure(7.5, min(0.25 * len(shares) + 1.1, max_height))
    ax = fig.add_subplot()
    y = np.arange(len(shares))
    left = np.zeros(len(shares))
    present = []
    for cat in ["achieved", *CATEGORIES]:
        vals = np.array([row.get(cat) or 0.0 for row in shares])
        if not vals.any():
            continue
        present.append(cat)
        _hbars(ax, y, vals, left, category_colour(cat), 0.75)
        left += vals
    _row_labels(ax, y, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xticks(np.linspace(0, 1, 6), [f"{v:.0%}" for v in np.linspace(0, 1, 6)])
    ax.set_xlabel(xlabel, fontsize=8)
    _style(ax)
    _legend(fig, [Patch(color=category_colour(c), label=category_label(c)) for c in present])
    return svg(fig, alt)


def rank_bars_chart(ranks: list[RankSummary]) -> Markup:
    """One 100% stacked bar per rank: achieved, then each loss category."""
    shares = [
        {
            "achieved": r.achieved_fraction_of_peak or 0.0,
            **{c: sum(x.fraction for x in r.losses if x.category == c) for c in CATEGORIES},
        }
        for r in ranks
    ]
    labels = [f"rank {r.rank}" for r in ranks] if len(ranks) <= 32 else [""] * len(ranks)
    return stacked_share_chart(shares, labels, "share of each rank's window", "where each rank's peak went")


def _time_unit(span_ns: float) -> tuple[float, str]:
    if span_ns >= 5e9:
        return 1e9, "s"
    if span_ns >= 5e6:
        return 1e6, "ms"
    return 1e3, "µs"


def timeline_chart(spans: list[Span], labels: list[str], choice: np.ndarray, common: bool) -> Markup:
    """A strip per GPU, each bin coloured by where most of its peak went (transparent outside the window)."""
    palette = np.array([to_rgba(category_colour(c)) for c in labels])
    rgba = np.zeros((len(spans), choice.shape[1], 4))
    inside = choice >= 0
    rgba[inside] = palette[choice[inside]]
    n = len(spans)
    fig = _figure(7.5, min(0.22 * n + 1.0, 10))
    ax = fig.add_subplot()
    if common:
        scale, unit = _time_unit(spans[0].bin_ns * spans[0].nbins)
        extent = (0.0, spans[0].bin_ns * spans[0].nbins / scale, n - 0.5, -0.5)
        ax.set_xlabel(f"time since the first window starts ({unit}; all ranks on one clock)", fontsize=8)
    else:
        extent = (0.0, 100.0, n - 0.5, -0.5)
        ax.set_xlabel("% of each GPU's own window", fontsize=8)
    ax.imshow(rgba, aspect="auto", interpolation="none", extent=extent)
    if n <= 32:
        names = [f"rank {s.rank}" + (f" · gpu {s.device}" if s.device is not None else "") for s in spans]
        if not common:
            names = [f"{nm} ({fmt_duration(s.we_ns - s.ws_ns)})" for nm, s in zip(names, spans, strict=True)]
        _row_labels(ax, np.arange(n), names)
    else:
        ax.set_ylabel(f"{n} GPUs (by rank)", fontsize=8)
        ax.set_yticks([])
    _style(ax, grid_axis=None)
    used = sorted({int(c) for c in np.unique(choice) if c >= 0})
    _legend(fig, [Patch(color=category_colour(labels[i]), label=category_label(labels[i])) for i in used])
    return svg(fig, "timeline strip" + (" (one clock)" if common else " (own windows)"))


def roofline_chart(groups: Sequence[KernelGroup], peak_flop_s: float, bandwidth_bytes_s: float | None) -> Markup | None:
    placed = [g for g in groups[:ROOFLINE_POINTS] if g.arithmetic_intensity and g.achieved_flop_s]
    if not placed:
        return None
    ai = np.array([g.arithmetic_intensity for g in placed], dtype=float)
    perf = np.array([g.achieved_flop_s for g in placed], dtype=float) / 1e12
    share = np.array([g.time_share for g in placed])
    p = peak_flop_s / 1e12
    lo = min(ai.min(), (peak_flop_s / bandwidth_bytes_s) if bandwidth_bytes_s else ai.min()) / 4
    hi = max(ai.max(), (peak_flop_s / bandwidth_bytes_s) if bandwidth_bytes_s else ai.max()) * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    if bandwidth_bytes_s:
        roof = np.minimum(p, x * bandwidth_bytes_s / 1e12)
        ridge = peak_flop_s / bandwidth_bytes_s
        ax.loglog(x, roof, color=_FG, linewidth=1.5, label=f"roof: {p:,.0f} TFLOP/s, {bandwidth_bytes_s / 1e12:.2f} TB/s")
        ax.axvline(ridge, color=_GRID, linestyle=":", linewidth=1)
        ax.text(ridge * 1.08, p * 1.15, f"ridge {ridge:,.0f} FLOP/B", fontsize=7, color=_FG)
    else:
        ax.loglog(x, np.full_like(x, p), color=_FG, linewidth=1.5, label=f"peak {p:,.0f} TFLOP/s")
    colours = [COLOURS["memory_bound"] if g.bound == "memory" else COLOURS["compute_inefficiency"] for g in placed]
    sizes = 20 + 400 * share / max(share.max(), 1e-12)
    ax.scatter(ai, perf, s=sizes, c=colours, alpha=0.75, edgecolors=_FG, linewidths=0.4, zorder=3)
    # Numbered as in the kernel table; points that nearly coincide share one label ("#2, #4").
    labels: list[tuple[int, list[str]]] = []
    for i in np.argsort(-share):
        near = next(
            (lab for j, lab in labels if abs(math.log10(ai[i] / ai[j])) < 0.06 and abs(math.log10(perf[i] / perf[j])) < 0.06),
            None,
        )
        number = f"#{groups.index(placed[i]) + 1}"
        if near is not None:
            near.append(number)
        else:
            labels.append((int(i), [number]))
    for j, names in labels:
        ax.annotate(", ".join(names), (ai[j], perf[j]), fontsize=7, color=_FG, xytext=(5, 4), textcoords="offset points")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(perf.min(), p) / 4, p * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)", fontsize=8)
    ax.set_ylabel("achieved TFLOP/s", fontsize=8)
    _style(ax, grid_axis="both")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.xaxis.set_major_formatter(plain)
    _legend(
        ax,
        [
            *ax.get_legend_handles_labels()[0],
            Patch(color=COLOURS["memory_bound"], label="memory-bound group"),
            Patch(color=COLOURS["compute_inefficiency"], label="compute-bound group"),
        ],
        loc="lower right",
    )
    return svg(fig, "roofline")


MAX_STEP_ROWS = 256  # the per-step table (the store's `steps` table and the export have all)
MAX_STEP_BARS = 64  # the per-step stacked bars
MAX_STEP_SERIES = 16  # ranks drawn in the step-time chart


def _mark_steps(ax: Any, steps: Sequence[Step], **style: Any) -> None:
    """Open markers over the step-time line at the given steps (the slow ones, the cut ones)."""
    ax.scatter([x.occurrence for x in steps], [x.gpu_ns / 1e6 for x in steps], facecolors="none", zorder=3, **style)


def step_time_chart(steps: Sequence[Step], summary: StepSummary) -> Markup | None:
    """GPU step time per occurrence, one line per rank (GPU), the median dashed and the slow steps marked: the
    outlier step shows itself. A step the recording cut is a lower bound: an open triangle off the line."""
    if len(steps) < 2:
        return None
    by_gpu: dict[tuple[Any, Any], list[Step]] = {}
    for st in steps:
        by_gpu.setdefault((st.rank, st.device), []).append(st)
    fig = _figure(7.5, 2.0)
    ax = fig.add_subplot()
    palette = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22"]
    cut_said = False
    for i, (key, all_xs) in enumerate(list(by_gpu.items())[:MAX_STEP_SERIES]):
        xs = [x for x in all_xs if not x.cut]
        cut = [x for x in all_xs if x.cut]
        if cut:
            label = None if cut_said else "cut by the recording (≥)"
            _mark_steps(ax, cut, s=22, marker="^", edgecolors=_FG, linewidths=0.9, label=label)
            cut_said = True
        occ = [x.occurrence for x in xs]
        ms_ = [x.gpu_ns / 1e6 for x in xs]
        ax.plot(
            occ,
            ms_,
            marker="o",
            markersize=3,
            linewidth=1,
            color=palette[i % len(palette)],
            label=f"rank {key[0]}" + (f" · gpu {key[1]}" if key[1] is not None else "") if len(by_gpu) > 1 else "step",
        )
        slow = [x for x in xs if x.slow]
        if slow:
            _mark_steps(ax, slow, s=40, edgecolors=COLOURS["collective_wait"], linewidths=1.2)
    ax.axhline(summary.median_ns / 1e6, color=_FG, linestyle="--", linewidth=0.8)
    ax.text(
        0.0,
        summary.median_ns / 1e6,
        f" median {summary.median_ns / 1e6:,.1f} ms",
        fontsize=7,
        color=_FG,
        va="bottom",
        transform=ax.get_yaxis_transform(),
    )
    top = max(x.gpu_ns for x in steps) / 1e6
    ax.set_ylim(0, top * 1.12)
    ax.set_xlabel(f"occurrence of {summary.range} on its rank", fontsize=8)
    ax.set_ylabel("GPU step time (ms)", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _style(ax, grid_axis="y")
    if len(by_gpu) > 1 or cut_said:
        _legend(fig, ax.get_legend_handles_labels()[0])
    return svg(fig, "GPU step time per step")


def steps_view(con: duckdb.DuckDBPyConnection, typed: Verdict) -> dict[str, Any] | None:
    """The per-step section: the first range of steps (step_summary[0]), its steps from the verdict and each step's
    waterfall from the store (step_losses)."""
    if not typed.step_summary:
        return None
    summary = typed.step_summary[0]
    steps = [x for x in typed.steps if x.range == summary.range]
    bars = None
    if 1 < len(steps) <= MAX_STEP_BARS:
        lost: dict[tuple[Any, Any, int], dict[str, float]] = {}
        for r, d, o, c, ns in con.execute(
            "SELECT rank, device, occurrence, category, lost_ns FROM step_losses WHERE label = ?", [summary.range]
        ).fetchall():
            lost.setdefault((r, d, o), {})[c] = ns
        shares = [
            {
                "achieved": x.achieved_fraction_of_peak or 0.0,
                **{c: ns / x.gpu_ns for c, ns in lost.get((x.rank, x.device, x.occurrence), {}).items()},
            }
            for x in steps
        ]
        labels = [(f"r{x.rank} " if summary.ranks > 1 else "") + range_label(x.name) for x in steps]
        bars = later(stacked_share_chart, shares, labels, "share of each step's GPU window", "where each step's peak went")
    return {
        "summary": summary,
        "rows": steps[:MAX_STEP_ROWS],
        "total": len(steps),
        "chart": later(step_time_chart, steps, summary),
        "bars": bars,
        "outliers": step_outliers_text(summary),
        "counts": step_counts(summary),
        "time": step_time_text(summary),
    }


@dataclass(frozen=True)
class CounterView:
    chart: Markup | Chart | None
    rows: list[dict[str, Any]]
    ranks_shown: int
    ranks_total: int


def _fraction_metric(metric: str) -> bool:
    m = metric.lower()
    return m in FRACTION_METRICS or m.endswith(("util", "_active", "_pct", "_percent", "utilization"))


def counters_view(con: duckdb.DuckDBPyConnection, windows: list[tuple[int | None, int | None, int, int]]) -> CounterView:
    """Device counters against the trace's busy fraction, binned over each GPU's window."""
    ((n,),) = con.execute("SELECT count(*) FROM counters").fetchall()
    if not n or not windows:
        return CounterView(None, [], 0, len(windows))
    spans = own_spans(windows)
    counters = bin_intervals(con, COUNTER_SOURCE, spans, part_names=COUNTER_PARTS)
    if not counters.keys:
        return CounterView(None, [], 0, len(windows))
    lengths = np.stack([s.bin_lengths() for s in spans])
    rows: list[dict[str, Any]] = []
    scale = {}
    for j, key in enumerate(counters.keys):
        metric, _, source = key.partition(KEY_SEP)
        ov, wv = counters.overlap_ns[:, :, j], counters.weighted[:, :, j]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_all = wv.sum(axis=1) / ov.sum(axis=1)
            per_bin = wv / ov
        hi = np.nanmax(per_bin) if np.isfinite(per_bin).any() else 0.0
        scale[key] = 100.0 if _fraction_metric(metric) and hi > 1.5 else 1.0
        for i, s in enumerate(spans):
            if ov[i].sum() > 0:
                vals = per_bin[i][ov[i] > 0]
                # One log's samples may still overlap each other (rounded times): covered is at most all of it.
                covered = min(1.0, float(ov[i].sum() / max(lengths[i].sum(), 1)))
                rows.append(
                    {
                        "rank": s.rank,
                        "device": s.device,
                        "metric": metric,
                        "source": source,
                        "coverage": covered,
                        "mean": float(mean_all[i]),
                        "min": float(vals.min()),
                        "max": float(vals.max()),
                    }
                )
    shown = [i for i in range(len(spans)) if counters.overlap_ns[i].sum() > 0][:MAX_COUNTER_RANKS]

    # Plotted: the utilization-like counters that ever leave zero, on the busy fraction's 0–1 scale (at most six,
    # the common ones first); power, clocks and temperatures have other units and stay in the table.
    def priority(m: str) -> tuple[int, str]:
        return (FRACTION_METRICS.index(m) if m in FRACTION_METRICS else len(FRACTION_METRICS), m)

    def metric_of(key: str) -> str:
        return key.partition(KEY_SEP)[0]

    plotted = sorted(
        (
            k
            for j, k in enumerate(counters.keys)
            if _fraction_metric(metric_of(k)) and np.nanmax(np.abs(counters.weighted[:, :, j])) > 0
        ),
        key=lambda k: (priority(metric_of(k)), k),
    )[:6]
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["device"] or 0, priority(r["metric"]), r["source"]))
    several = len({k.partition(KEY_SEP)[2] for k in plotted}) > 1
    if not shown:
        return CounterView(None, rows, 0, len(windows))
    # The trace's busy fraction only for the GPUs plotted: merging kernel intervals is the costly part.
    busy = bin_intervals(con, BUSY_SOURCE, [spans[i] for i in shown])
    busy_frac = np.zeros_like(lengths)
    if busy.keys:
        busy_frac[shown] = busy.overlap_ns[:, :, 0] / np.where(lengths[shown] > 0, lengths[shown], 1)
    panels = []
    for i in shown:
        lines = []
        for k, metric in enumerate(plotted):
            j = counters.keys.index(metric)
            ov, wv = counters.overlap_ns[i, :, j], counters.weighted[i, :, j]
            if ov.sum() == 0:
                continue
            series = np.where(ov > 0, wv / np.where(ov > 0, ov, 1), np.nan) / scale[metric]
            name, _, source = metric.partition(KEY_SEP)
            lines.append((k, name + (f" ({source})" if several else "") + (" (÷100)" if scale[metric] != 1 else ""), series))
        panels.append((spans[i], busy_frac[i], lines))
    return CounterView(later(counters_chart, panels), rows, len(shown), len(windows))


def counters_chart(panels: list[tuple[Span, np.ndarray, list[tuple[int, str, np.ndarray]]]]) -> Markup:
    """One panel per GPU: the trace's busy fraction and each plotted counter `(colour index, label, per-bin
    values)` over that GPU's window."""
    fig = _figure(7.5, 1.6 * len(panels) + 0.7)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    palette = ["#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    handles: dict[str, Any] = {}
    for ax, (s, busy, lines) in zip(axes, panels, strict=True):
        unit_scale, unit = _time_unit(s.we_ns - s.ws_ns)
        t = (np.arange(s.nbins) + 0.5) * s.bin_ns / unit_scale
        (line,) = ax.plot(t, busy, color=COLOURS["achieved"], linewidth=1.2)
        handles.setdefault("trace: busy fraction", line)
        for k, label, series in lines:
            (line,) = ax.plot(t, series, color=palette[k % len(palette)], linewidth=1, drawstyle="steps-mid")
            handles.setdefault(label, line)
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlim(0, s.nbins * s.bin_ns / unit_scale)
        ax.set_title(f"rank {s.rank} · gpu {s.device}", fontsize=8, loc="left", color=_FG)
        ax.set_xlabel(f"time since the window starts ({unit})", fontsize=8)
        ax.set_ylabel("fraction", fontsize=8)
        _style(ax, grid_axis="y")
    for label, line in handles.items():
        line.set_label(label)
    _legend(fig, list(handles.values()))
    return svg(fig, "counters vs trace busy time")


# ---------------------------------------------------------------------------------------------------------------
# Collectives, memory and launch statistics (the verdict's collective_stats, memory, launch_stats; sql/
# collective_stats.sql, sql/memory.sql, sql/launch_stats.sql).

MAX_HEATMAP_RANKS = 64
MAX_HEATMAP_STEPS = 64
MAX_MEMORY_GPUS = 8
MEMORY_BINS = 800
MAX_HISTOGRAM_STREAMS = 4
# Sections a finding's evidence is shown in (an anchor of this page), by rule.
RULE_SECTIONS = {"PR101": "collective-lateness", "PR501": "launch-stats", "PR701": "memory"}
STREAM_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def fmt_bytes(n: float | None) -> str:
    """Bytes in binary units (message and memory sizes are powers of two)."""
    if n is None:
        return "n/a"
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= factor:
            return f"{n / factor:,.3g} {unit}"
    return f"{n:,.0f} B"


def fmt_bucket(lower_ns: int, upper_ns: int | None) -> str:
    """A kernel-duration bucket as a label: '< 1 µs', '2–4 µs', '≥ 8.39 s'."""
    if not lower_ns:
        return f"< {fmt_duration(upper_ns)}"
    if upper_ns is None:
        return f"≥ {fmt_duration(lower_ns)}"
    return f"{fmt_duration(lower_ns).split(' ')[0]}–{fmt_duration(upper_ns)}"


def lateness_heatmap(cells: list[dict[str, Any]], per_step: bool = True) -> Markup | None:
    """Steps (columns) × ranks (rows), each cell how late that rank arrived to that step's collectives (summed);
    without steps one column, the whole profile."""
    other = "outside steps" if per_step else "whole profile"
    steps = sorted({(c["step_occurrence"] if c["step_occurrence"] is not None else 1 << 30, c["step"] or other) for c in cells})
    ranks = sorted({c["rank"] for c in cells if c["rank"] is not None})
    if not steps or not ranks or len(ranks) > MAX_HEATMAP_RANKS or len(steps) > MAX_HEATMAP_STEPS:
        return None
    # Steps line up across ranks by name (ProfilerStep#N), not by occurrence number.
    names = list(dict.fromkeys(name for _, name in steps))
    grid = np.full((len(ranks), len(names)), np.nan)
    for c in cells:
        if c["rank"] in ranks:
            j = names.index(c["step"] or other)
            grid[ranks.index(c["rank"]), j] = np.nansum([grid[ranks.index(c["rank"]), j], c["lateness_ns"] / 1e6])
    fig = _figure(7.5, min(0.28 * len(ranks) + 1.3, 9))
    ax = fig.add_subplot()
    image = ax.imshow(grid, aspect="auto", cmap="Reds", vmin=0, vmax=max(float(np.nanmax(grid)), 1e-3), interpolation="nearest")
    if grid.size <= 240:
        top = float(np.nanmax(grid)) or 1.0
        for (i, j), x in np.ndenumerate(grid):
            if np.isfinite(x):
                ax.text(j, i, f"{x:.3g}", ha="center", va="center", fontsize=7, color="white" if x > 0.6 * top else "black")
    ax.set_xticks(
        range(len(names)),
        [n.replace("ProfilerStep", "step ") for n in names],
        fontsize=7,
        rotation=45 if len(names) > 8 else 0,
        ha="right" if len(names) > 8 else "center",
    )
    ax.set_yticks(
        range(len(ranks)),
        [f"rank {r}" for r in ranks]
        if len(ranks) <= 32
        else [str(r) if i % max(1, len(ranks) // 16) == 0 else "" for i, r in enumerate(ranks)],
    )
    ax.set_xlabel("step" if per_step else "", fontsize=8)
    _style(ax, grid_axis=None)
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("lateness (ms)", fontsize=8, color=_FG)
    bar.ax.tick_params(colors=_FG, labelcolor=_FG, labelsize=7)
    bar.outline.set_edgecolor(_FG)
    return svg(fig, "lateness per step and rank")


def busbw_chart(groups: list[dict[str, Any]]) -> Markup | None:
    """Bus bandwidth against message size (as nccl-tests plots it), with each link's one-direction peak."""
    pts = [g for g in groups if g.get("busbw_bytes_s") and g.get("bytes")]
    if not pts:
        return None
    fig = _figure(7.5, 3.2)
    ax = fig.add_subplot()
    colls = list(
        dict.fromkeys(f"{g['collective']} ({g['kind']})" if g["kind"] != "collective" else str(g["collective"]) for g in pts)
    )
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    for i, name in enumerate(colls):
        sel = [
            g for g in pts if (f"{g['collective']} ({g['kind']})" if g["kind"] != "collective" else str(g["collective"])) == name
        ]
        ax.scatter(
            [g["bytes"] for g in sel],
            [g["busbw_bytes_s"] / 1e9 for g in sel],
            s=[max(12.0, min(200.0, 12.0 * math.sqrt(g["ops"]))) for g in sel],
            color=palette[i % len(palette)],
            label=name,
            alpha=0.85,
            linewidths=0,
        )
    for link, bw in sorted({(g["link"], g["link_bytes_s"]) for g in pts if g.get("link_bytes_s")}, key=lambda x: x[1]):
        ax.axhline(bw / 1e9, color=_FG, linestyle="--", linewidth=0.8)
        ax.text(
            min(g["bytes"] for g in pts), bw / 1e9, f" {link}: {bw / 1e9:,.0f} GB/s one way", fontsize=7, color=_FG, va="bottom"
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v)))
    ax.set_xlabel("message size", fontsize=8)
    ax.set_ylabel("bus bandwidth (GB/s)", fontsize=8)
    top = max([g["busbw_bytes_s"] for g in pts] + [g["link_bytes_s"] or 0 for g in pts]) / 1e9
    ax.set_ylim(0, top * 1.15)
    _style(ax, grid_axis="both")
    _legend(ax, ax.get_legend_handles_labels()[0], loc="upper left")
    return svg(fig, "bus bandwidth by message size")


def memory_origin(peaks: list[dict[str, Any]], t0_ns: int | None) -> int:
    """The memory chart's time origin: the first window's start, or the first allocator event when earlier."""
    lo = min(p["first_ns"] for p in peaks)
    return t0_ns if t0_ns is not None and t0_ns <= lo else lo


def memory_view(con: duckdb.DuckDBPyConnection, peaks: list[dict[str, Any]], t0_ns: int | None) -> Chart | None:
    """The memory chart: memory_timeline binned from the store (the most in each bin), to draw."""
    gpus = [(p["rank"], p["device"]) for p in peaks][:MAX_MEMORY_GPUS]
    if not gpus:
        return None
    t0 = memory_origin(peaks, t0_ns)
    hi = max(p["last_ns"] for p in peaks)
    span = max(hi - t0, 1)
    bw = span / MEMORY_BINS
    rows = con.execute(
        """
        SELECT rank, device, least(floor((ts_ns - $t0) / $bw)::BIGINT, $nb - 1) AS b,
               max(allocated_bytes) AS a, max(reserved_bytes) AS r
        FROM memory_timeline WHERE rank IS NOT NULL GROUP BY ALL ORDER BY rank, device, b""",
        {"t0": t0, "bw": bw, "nb": MEMORY_BINS},
    ).fetchall()
    return later(memory_chart, rows, gpus, peaks, t0, span)


def memory_chart(
    rows: list[tuple[Any, ...]], gpus: list[tuple[Any, Any]], peaks: list[dict[str, Any]], t0: int, span: int
) -> Markup:
    """Allocated (solid) and reserved (dashed) device memory over time per GPU (`rows`: rank, device, bin, most
    allocated, most reserved), with each peak marked and the device's memory when the run came near it; reserved
    solid where the records know no allocated bytes (driver-level records of nsys --cuda-memory-usage)."""
    bw = span / MEMORY_BINS
    scale, unit = _time_unit(span)
    fig = _figure(7.5, 3.2)
    ax = fig.add_subplot()
    top = 0.0
    for k, (rank, dev) in enumerate(gpus):
        pts = [(b, a, r) for rr, dd, b, a, r in rows if rr == rank and dd == dev]
        if not pts:
            continue
        colour = STREAM_PALETTE[k % len(STREAM_PALETTE)] if len(gpus) <= 4 else None
        t = np.array([(b + 0.5) * bw / scale for b, _, _ in pts])
        alloc = np.array([a if a is not None else np.nan for _, a, _ in pts], dtype=float) / 2**30
        res = np.array([r if r is not None else np.nan for _, _, r in pts], dtype=float) / 2**30
        label = f"rank {rank}" + (f" · gpu {dev}" if len({d for _, d in gpus}) > 1 else "")
        # driver-level records (nsys) know reserved memory only: it is then the solid line
        solid, solid_label = (alloc, "allocated") if np.isfinite(alloc).any() else (res, "reserved")
        (line,) = ax.plot(t, solid, drawstyle="steps-mid", linewidth=1.1, color=colour, label=f"{label} {solid_label}")
        if solid is alloc and np.isfinite(res).any():
            ax.plot(
                t, res, drawstyle="steps-mid", linewidth=1.0, linestyle="--", color=line.get_color(), label=f"{label} reserved"
            )
        p = next(x for x in peaks if x["rank"] == rank and x["device"] == dev)
        which = "allocated" if solid is alloc else "reserved"
        if p.get(f"peak_{which}_bytes") is not None and p.get(f"peak_{which}_ns") is not None:
            ax.plot(
                [(p[f"peak_{which}_ns"] - t0) / scale],
                [p[f"peak_{which}_bytes"] / 2**30],
                marker="o",
                markersize=4,
                color=line.get_color(),
            )
        seen = np.concatenate([alloc, res])
        top = max(top, float(np.nanmax(seen)) if np.isfinite(seen).any() else 0.0)
    near = [
        p
        for p in peaks
        if p.get("device_memory_bytes") and (p.get("peak_reserved_fraction") or p.get("peak_allocated_fraction") or 0) >= 0.5
    ]
    if near:
        cap = min(p["device_memory_bytes"] for p in near) / 2**30
        ax.axhline(cap, color=_FG, linestyle=":", linewidth=0.9)
        ax.text(0, cap, f" device memory {cap:,.0f} GiB", fontsize=7, color=_FG, va="bottom")
        top = max(top, cap)
    ax.set_ylim(0, top * 1.12 if top else 1)
    ax.set_xlim(0, span / scale)
    ax.set_xlabel(f"time since the first window starts ({unit})", fontsize=8)
    ax.set_ylabel("GiB", fontsize=8)
    _style(ax, grid_axis="y")
    _legend(fig, ax.get_legend_handles_labels()[0])
    return svg(fig, "device memory over time")


def histogram_chart(streams: list[dict[str, Any]]) -> Markup | None:
    """Kernel durations per stream in log2 buckets (counts): the short-kernel histogram."""
    shown = [s for s in streams if s.get("histogram")][:MAX_HISTOGRAM_STREAMS]
    if not shown:
        return None
    buckets = sorted(
        {(h["lower_ns"], h["upper_ns"] if h["upper_ns"] is not None else 1 << 62) for s in shown for h in s["histogram"]}
    )
    lo = buckets[0][0]
    hi = buckets[-1][0]
    edges = [0] + [1000 * 2**i for i in range(0, 40)]
    labels = [(a, b) for a, b in zip(edges, edges[1:], strict=False) if lo <= a <= hi]
    x = np.arange(len(labels))
    width = 0.8 / len(shown)
    fig = _figure(7.5, 2.8)
    ax = fig.add_subplot()
    for k, s in enumerate(shown):
        counts = {h["lower_ns"]: h["kernels"] for h in s["histogram"]}
        ax.bar(
            x + (k - (len(shown) - 1) / 2) * width,
            [counts.get(a, 0) for a, _ in labels],
            width=width,
            color=STREAM_PALETTE[k % len(STREAM_PALETTE)],
            linewidth=0,
            label=f"rank {s['rank']} · stream {s['stream']}",
        )
    last_upper = {h["lower_ns"]: h["upper_ns"] for s in shown for h in s["histogram"]}
    ax.set_xticks(x, [fmt_bucket(a, last_upper.get(a, b)) for a, b in labels], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("kernels", fontsize=8)
    ax.set_xlabel("kernel duration", fontsize=8)
    _style(ax, grid_axis="y")
    _legend(fig, ax.get_legend_handles_labels()[0])
    return svg(fig, "kernel durations per stream")


def tables_context(con: duckdb.DuckDBPyConnection, verdict: dict[str, Any], t0_ns: int | None) -> dict[str, Any]:
    """What the collectives, memory and launch-statistics sections show, from the verdict (and, for the memory
    curve, the store's memory_timeline)."""
    cs = verdict.get("collective_stats") or None
    memory = verdict.get("memory") or []
    launch = verdict.get("launch_stats") or []
    return {
        "coll": cs,
        "coll_busbw": later(busbw_chart, cs["groups"]) if cs else None,
        "coll_heatmap": later(lateness_heatmap, cs["lateness"], cs["lateness_per_step"]) if cs and cs["lateness"] else None,
        "memory": memory,
        "memory_chart": memory_view(con, memory, t0_ns) if memory else None,
        "memory_t0": memory_origin(memory, t0_ns) if memory else None,
        "launch": launch,
        "launch_histogram": later(histogram_chart, launch),
        "rule_sections": RULE_SECTIONS,
    }


# ---------------------------------------------------------------------------------------------------------------
# The page.


def _basename(x: Any) -> str:
    """A path (or a list of them) as file names: the page names files, the title attribute the full path."""
    if isinstance(x, (list, tuple)):
        return ", ".join(_basename(i) for i in x)
    return str(x).replace("\\", "/").rsplit("/", 1)[-1]


class _TemplateCache(FileSystemBytecodeCache):
    """Compiled templates kept between runs (jinja2's bytecode cache: keyed by template, checked against the
    template's source and the Python version). A cache that cannot be read or written is no cache: the templates
    are compiled as without one, never an error."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, EOFError, ValueError, TypeError):
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):  # unwritable (read-only home, full disk): compiled again next run
            super().dump_bytecode(bucket)


def _template_cache() -> _TemplateCache | None:
    """`$XDG_CACHE_HOME/plasmient-report/templates` (else `~/.cache/…`), private to the user; None where it
    cannot be made. Compiling the page's templates costs every run ~0.1 s; loading them from here ~2 ms."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = base / "plasmient-report" / "templates"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError):
        return None
    return _TemplateCache(str(folder))


@functools.cache
def _env() -> Environment:
    """The page's templates, compiled once per process (batch renders many pages) or loaded compiled from the
    user's cache (`_template_cache`)."""
    env = Environment(
        loader=PackageLoader("plasmient_report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=_template_cache(),
    )
    env.filters.update(
        field=fmt_field,
        pct=pct,
        ms=fmt_ms,
        si=fmt_si,
        duration=fmt_duration,
        value=fmt_value,
        bytes=fmt_bytes,
        bucket=fmt_bucket,
        sortkey=sort_key,
        colour=category_colour,
        label=lambda c: category_label(str(c)),
        key=key_label,
        short=middle_ellipsis,
        basename=_basename,
        hardware=hardware_label,
        rate=rate,
        signed=lambda x: signed_pct(x) if x is not None else "",
    )
    return env


def _loss_rows(achieved: float | None, losses: list[Loss], unsplit: float = 0.0) -> list[dict[str, Any]]:
    """The loss table's rows: achieved first when known; with it unknown, the share in no loss (`unsplit_fraction`)
    last, so that the rows still cover the window."""
    rows = [
        {"category": x.category, "layer": x.layer, "fraction": x.fraction, "recommendation": x.recommendation} for x in losses
    ]
    if achieved is not None:
        rows.insert(
            0, {"category": "achieved", "layer": "", "fraction": achieved, "recommendation": "useful FLOPs at the chosen peak"}
        )
    elif unsplit > 0:
        rows.append({"category": UNSPLIT, "layer": "kernel", "fraction": unsplit, "recommendation": UNSPLIT_TEXT})
    return rows


def _evidence(e: Any) -> list[tuple[str, str]]:
    if isinstance(e, str):
        try:
            e = json.loads(e)
        except ValueError:
            return [("", e)]
    if isinstance(e, dict):
        return [(str(k), fmt_value(v)) for k, v in e.items()]
    if isinstance(e, list):
        return [(str(i), fmt_value(v)) for i, v in enumerate(e)]
    return [] if e is None else [("", fmt_value(e))]


def _utc(ns: int | None) -> str:
    if ns is None:
        return "n/a"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _gpu_title(v: Any) -> str:
    if v.peak.gpu:
        return str(v.peak.gpu)
    names = sorted({g.name for g in v.run.gpus if g.name})
    return ", ".join(names) + " (no peak known)" if names else "unknown GPU"


def _typed(verdict: Verdict | dict[str, Any]) -> Verdict:
    return verdict if isinstance(verdict, Verdict) else from_dict(verdict, strict=False)


def context(con: duckdb.DuckDBPyConnection, verdict: Verdict | dict[str, Any]) -> dict[str, Any]:
    """Everything the template shows, from the typed verdict and the store's views (never from input files, never
    from the verdict's text). `v` in the template is the verdict's JSON document, for its generic key-value
    tables (coverage, clock, counter sources)."""
    typed = _typed(verdict)
    doc = document(typed)
    run, peak = typed.run, typed.peak
    achieved = typed.achieved_fraction_of_peak
    peak_flop_s = peak.tflops * 1e12 if peak.tflops else None
    bandwidth = peak.memory_bandwidth_tbs * 1e12 if peak.memory_bandwidth_tbs else None

    ach_text = achieved_text(typed)
    losses = typed.losses
    range_rows = [
        {
            **r,
            "display_name": range_label(r["name"]),
            "occurrences": range_occurrences(t, typed),
            "per_occurrence_ns": range_per_occurrence_ns(t),
        }
        for r, t in zip(doc["ranges"], typed.ranges, strict=True)
    ]

    windows = gpu_windows(con)
    timeline_common = timeline_own = None
    # Without a peak nothing is achieved or lost: no strip to colour. With one, an unknown achieved fraction (no FLOP
    # estimate) still has its time-based losses and its unknown work, each in the losses' intervals.
    if windows and (achieved is not None or typed.peak.tflops is not None):
        common = common_spans(windows)
        labels, choice = where_peak_went(bin_intervals(con, LOSS_SOURCE, common), common)
        timeline_common = later(timeline_chart, common, labels, choice, common=True)
        span = max(w[3] for w in windows) - min(w[2] for w in windows)
        if len(windows) > 1 and any((w[3] - w[2]) < 0.9 * span for w in windows):
            own = own_spans(windows)
            labels, choice = where_peak_went(bin_intervals(con, LOSS_SOURCE, own), own)
            timeline_own = later(timeline_chart, own, labels, choice, common=False)

    ranks = typed.ranks
    gpu_names = {(g.rank, g.device): g.name for g in run.gpus}
    window_by_gpu = {(r, d): (s, e) for r, d, s, e in windows}
    first_ns = min((w[2] for w in windows), default=None)
    rank_rows = []
    for r, rd in zip(ranks, doc["ranks"], strict=True):
        top = r.losses[0] if r.losses else None
        w = window_by_gpu.get((r.rank, r.device))
        rank_rows.append(
            {
                **rd,
                "gpu": gpu_names.get((r.rank, r.device)),
                "window_start": _utc(w[0]) if w else "n/a",
                "start_offset_ns": w[0] - first_ns if w and first_ns is not None else None,
                "top_loss": top.category if top else None,
                "top_loss_fraction": top.fraction if top else None,
                "loss_by_category": {x.category: x.fraction for x in r.losses},
            }
        )
    rank_categories = [c for c in CATEGORIES if any(c in rr["loss_by_category"] for rr in rank_rows)]

    # The roofline of the verdict (judge built it once from the library's kernel_roofline).
    groups, op_groups = typed.top_kernels, typed.top_ops
    loss_rows = _loss_rows(achieved, losses, unsplit_fraction(typed))
    roofline = later(roofline_chart, groups, peak_flop_s, bandwidth) if peak_flop_s else None
    shown = groups[:ROOFLINE_POINTS]
    placed = sum(1 for g in shown if g.arithmetic_intensity and g.achieved_flop_s)
    flops_no_bytes = sum(1 for g in shown if g.flops and not g.arithmetic_intensity)

    counters = counters_view(con, windows)
    clock = doc["clock"]["sources"]
    known_clock = ["path", "format", "format_version", "rank", "rank_method", "anchor", "offset_ns", "method", "uncertainty_ns"]
    extra_clock = sorted({k for s in clock for k in s if k not in known_clock})
    findings = [{**f, "evidence_rows": _evidence(f.get("evidence"))} for f in doc["findings"]]
    n_ranks = len(run.ranks)
    return {
        "v": doc,
        "title": f"plasmient · {', '.join(run.range) if run.range else 'whole profile'} · "
        f"{n_ranks} rank{'s' if n_ranks != 1 else ''} · {_gpu_title(typed)}",
        "n_ranks": n_ranks,
        "utilization": typed.utilization.trace,
        "measured": typed.utilization.measured,
        "achieved": achieved,
        "achieved_text": ach_text,
        "achieved_why": achieved_why(typed),
        "headroom": doc["headroom"],
        "peak": doc["peak"],
        "ridge": peak_flop_s / bandwidth if peak_flop_s and bandwidth else None,
        "window_ns": run.window_ns,
        "loss_rows": loss_rows,
        "loss_total": math.fsum(r["fraction"] for r in loss_rows),
        "waterfall": later(waterfall_chart, achieved, losses) if achieved is not None else None,
        "rank_rows": rank_rows,
        "rank_categories": rank_categories,
        "rank_bars": later(rank_bars_chart, ranks) if 1 < len(ranks) <= MAX_RANK_BARS else None,
        "timeline_common": timeline_common,
        "timeline_own": timeline_own,
        "timeline_bins": TIMELINE_BINS,
        "run_start": _utc(min(w[2] for w in windows)) if windows else "n/a",
        "findings": findings,
        "kernel_groups": groups,
        "kernel_labels": kernel_names([g.name for g in groups], 56),
        "op_labels": kernel_names([g.op for g in op_groups], 48),
        "kernel_groups_total": typed.coverage.kernel_names or len(groups),
        "op_groups": op_groups,
        "op_groups_total": typed.coverage.op_names or len(op_groups),
        "kernel_time_ns": sum(g.time_ns for g in groups) / sum(g.time_share for g in groups)
        if groups and sum(g.time_share for g in groups) > 0
        else None,
        "roofline": roofline,
        "roofline_placed": placed,
        "roofline_unplaced": flops_no_bytes,
        "ranges": range_rows,
        "counters": counters,
        "clock": clock,
        "clock_extra": extra_clock,
        "coverage": doc["coverage"],
        "notes": typed.notes,
        "steps": steps_view(con, typed),
        "shapes": typed.shapes,
        "shapes_total": typed.coverage.shapes or len(typed.shapes),
        **tables_context(con, doc, min((w[2] for w in windows), default=None)),
    }


def page_context(con: duckdb.DuckDBPyConnection, verdict: Verdict | dict[str, Any]) -> dict[str, Any]:
    """What `page` renders: everything read from the store, the charts still to draw (no store needed after)."""
    # A cursor of our own: the caller's connection may hold an unfinished result, and ours registers views.
    cur = store.cursor(con)
    try:
        return context(cur, verdict)
    finally:
        cur.close()


def page(ctx: dict[str, Any]) -> str:
    """The page of a `page_context`: its charts drawn, the template rendered."""
    start_page()
    return _env().get_template("report.html.j2").render(**draw_charts(ctx))


def warm_up() -> None:
    """What a first page costs once per process, done ahead: every template compiled, fonts loaded by a figure."""
    env = _env()
    for name in env.list_templates(filter_func=lambda n: n.endswith(".j2")):
        env.get_template(name)
    fig = _figure(1, 1)
    ax = fig.add_subplot()
    ax.set_xlabel("warm-up", fontsize=8)
    _style(ax)
    _draw_svg(fig, io.StringIO())


def render(con: duckdb.DuckDBPyConnection, verdict: Verdict | dict[str, Any]) -> str:
    return page(page_context(con, verdict))


def write(con: duckdb.DuckDBPyConnection, verdict: Verdict | dict[str, Any], path: Path) -> None:
    """Write report.html for this run to `path`."""
    Path(path).write_text(render(con, verdict), encoding="utf-8")


# The functions a Chart may name (the page worker draws only these).
_DRAWERS: dict[str, Any] = {
    f.__name__: f
    for f in (
        waterfall_chart,
        stacked_share_chart,
        rank_bars_chart,
        timeline_chart,
        roofline_chart,
        step_time_chart,
        counters_chart,
        lateness_heatmap,
        busbw_chart,
        memory_chart,
        histogram_chart,
    )
}
