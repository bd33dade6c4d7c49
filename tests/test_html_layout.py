"""report.html's charts are laid out without a layout engine (html._draw_svg): each figure is drawn once, its axes
where constrained layout would put them (a legend below) or its content cropped as bbox_inches="tight" crops it."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from plasmient_report.render import html
from plasmient_report.render._mpl import Figure, Patch, matplotlib
from plasmient_report.verdict_model import Loss

PT = 1 / 72  # inches


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """Every Figure.draw call, by figure."""
    seen: list[Figure] = []
    original = Figure.draw

    def draw(self: Figure, renderer: Any) -> None:
        seen.append(self)
        original(self, renderer)

    monkeypatch.setattr(Figure, "draw", draw)
    yield seen


def _panels(fig: Figure, rows: int, ylabel: str, entries: int) -> None:
    """A column of `rows` panels (title, axis labels, a long y tick label) with a legend of `entries` below."""
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    for i, ax in enumerate(axes):
        ax.plot(np.arange(50), np.linspace(0, 900 * (i + 1), 50), label=f"series {i}")
        ax.set_title(f"rank {i} · gpu {i}", fontsize=8, loc="left")
        ax.set_xlabel("time since the window starts (ms)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        html._style(ax, grid_axis="y")
    axes[0].set_yticks([0, 400, 800], ["0", "a long tick label", "800"])
    html._legend(fig, [Patch(color=html.category_colour(c), label=c) for c in list(html.COLOURS)[:entries]])


@pytest.mark.parametrize(("rows", "ylabel", "entries"), [(1, "ms", 2), (2, "GPU step time (ms)", 7), (4, "fraction", 12)])
def test_legend_below_fills_the_figure_as_constrained_layout(rows: int, ylabel: str, entries: int, draws: list[Figure]) -> None:
    size = (7.5, 1.6 * rows + 0.7)
    reference = Figure(figsize=size, layout="constrained")
    _panels(reference, rows, ylabel, entries)
    reference.savefig(io.StringIO(), format="svg")
    fig = html._figure(*size)
    _panels(fig, rows, ylabel, entries)
    draws.clear()

    view_box = html._draw_svg(fig, io.StringIO())

    assert draws == [fig]  # one draw, no layout engine
    assert fig.get_layout_engine() is None
    assert view_box == f"0 0 {size[0] * 72:g} {size[1] * 72:g}"  # the figure's own size, uncropped
    for ax, ref in zip(fig.axes, reference.axes, strict=True):
        got = np.array(ax.get_position().bounds) * np.tile(size, 2)
        want = np.array(ref.get_position().bounds) * np.tile(size, 2)
        assert np.allclose(got, want, atol=2 * PT), (got / PT, want / PT)
    # nothing clipped, the legend below everything else, panels apart
    renderer = fig._get_renderer()  # type: ignore[attr-defined]
    (legend,) = fig.legends
    top_of_legend = legend.get_window_extent(renderer).y1
    boxes: list[Any] = [ax.get_tightbbox(renderer) for ax in fig.axes]
    for box in boxes:
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1
        assert box.y0 > top_of_legend
    assert all(upper.y0 > lower.y1 for upper, lower in itertools.pairwise(boxes))


@pytest.mark.parametrize("n", [1, 3, 6])
def test_a_legend_of_long_labels_stays_inside_its_figure(n: int, draws: list[Figure]) -> None:
    """Counter series named by metric and log (the counters chart): the legend takes as many columns as fit the
    figure's width, every entry inside it, as matplotlib measures its text (five columns of these labels were
    cut off at the figure's right edge: gr_engine_active (nvidia_smi_dmon_nsys.txt) and the entries after it)."""
    labels = [
        "trace: busy fraction",
        "sm_active (nsys_workload.sqlite)",
        "tensor_active (nsys_workload.sqlite)",
        "mem_util (nvidia_smi_dmon_nsys.txt)",
        "gr_engine_active (nvidia_smi_dmon_nsys.txt)",
        "gpu_util (nvidia_smi_dmon_nsys.txt)",
    ][:n]
    fig = html._figure(7.5, 2.3)
    ax = fig.add_subplot()
    handles = [ax.plot([0, 1], [0, i], label=label)[0] for i, label in enumerate(labels)]
    html._legend(fig, handles)
    html._draw_svg(fig, io.StringIO())
    (legend,) = fig.legends
    box = legend.get_window_extent(fig._get_renderer())  # type: ignore[attr-defined]
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)
    assert legend._ncols == 1 if n == 1 else legend._ncols >= 2  # (not one long column either)


def test_a_legend_of_short_labels_stays_on_one_row() -> None:
    """Five loss categories fit one row of the figure's width: five columns, as before."""
    fig = html._figure(7.5, 2.3)
    fig.add_subplot()
    html._legend(fig, [Patch(color=html.category_colour(c), label=html.category_label(c)) for c in list(html.COLOURS)[:5]])
    (legend,) = fig.legends
    assert legend._ncols == 5


def _cropped(fig: Figure) -> None:
    """Long tick labels on the left, text beyond the axes on the right, a colorbar."""
    ax = fig.add_subplot()
    image = ax.imshow(np.arange(12.0).reshape(3, 4), aspect="auto")
    ax.set_yticks(range(3), ["compute inefficiency", "collective wait", "achieved"])
    ax.text(3.6, 1, "a note past the right edge", fontsize=8)
    ax.set_xlabel("step", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label("lateness (ms)", fontsize=8)


def _texts(svg: str, dx: float = 0, dy: float = 0) -> dict[str, tuple[float, float]]:
    """Each text's position (svg.fonttype none), shifted by (-dx, -dy)."""
    return {
        t: (float(x) - dx, float(y) - dy)
        for x, y, t in re.findall(r'<text[^>]* x="([-\d.]+)" y="([-\d.]+)"[^>]*>([^<]+)</text>', svg)
    }


def test_no_legend_below_is_cropped_as_a_tight_bbox(draws: list[Figure]) -> None:
    reference = Figure(figsize=(7.5, 2.5))
    _cropped(reference)
    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        reference.savefig(out, format="svg", bbox_inches="tight", pad_inches=html.CROP_PAD_IN)
    want = [float(re.search(rf'{k}="([\d.]+)pt"', out.getvalue()).group(1)) for k in ("width", "height")]  # type: ignore[union-attr]
    fig = html._figure(7.5, 2.5)
    _cropped(fig)
    draws.clear()
    ours = io.StringIO()

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        x, y, w, h = (float(v) for v in html._draw_svg(fig, ours).split())

    assert draws == [fig]
    assert w == pytest.approx(want[0], abs=0.5) and h == pytest.approx(want[1], abs=0.5)
    assert x < 0 and x + w > 7.5 * 72  # wider than the figure: the tick labels on the left, the note on the right
    # the same part of the figure shown: every text at the same place in the view
    texts, reference_texts = _texts(ours.getvalue(), x, y), _texts(out.getvalue())
    assert texts.keys() == reference_texts.keys() and "a note past the right edge" in texts
    for t, (tx, ty) in texts.items():
        assert tx == pytest.approx(reference_texts[t][0], abs=0.5) and ty == pytest.approx(reference_texts[t][1], abs=0.5), t


CHARTS: list[tuple[str, Callable[[], Any]]] = [
    (
        "waterfall",
        lambda: html.waterfall_chart(
            0.2,
            [
                Loss(category="sync_stall", layer="host", fraction=0.5, recommendation=None),
                Loss(category="compute_inefficiency", layer="kernel", fraction=0.3, recommendation=None),
            ],
        ),
    ),
    (
        "stacked share",
        lambda: html.stacked_share_chart(
            [{"achieved": 0.3, "sync_stall": 0.7}, {"achieved": 0.5, "memory_bound": 0.5}],
            ["ProfilerStep#1", "ProfilerStep#2"],
            "share of each step's GPU window",
            "where each step's peak went",
        ),
    ),
    (
        "histogram",
        lambda: html.histogram_chart(
            [
                {
                    "rank": r,
                    "stream": 7,
                    "histogram": [
                        {"lower_ns": 0, "upper_ns": 1000, "kernels": 40 * (r + 1)},
                        {"lower_ns": 1000, "upper_ns": 2000, "kernels": 3},
                    ],
                }
                for r in range(2)
            ]
        ),
    ),
    (
        "counters",
        lambda: html.counters_chart(
            [
                (
                    html.Span(r, 0, 0, 1e6, 100, 0, 100_000_000),
                    np.linspace(0, 1, 100),
                    [(0, "gpu_util", np.linspace(1, 0, 100)), (1, "sm_active", np.full(100, 0.4))],
                )
                for r in range(3)
            ]
        ),
    ),
]


@pytest.mark.parametrize("make", [m for _, m in CHARTS], ids=[n for n, _ in CHARTS])
def test_each_chart_is_drawn_once(make: Callable[[], Any], draws: list[Figure]) -> None:
    html.start_page()
    text = str(make())
    assert len(draws) == 1
    head = text[: text.index(">")]
    assert head.startswith('<svg role="img" aria-label="') and 'class="chart-svg"' in head
    assert "viewBox=" in head and " width=" not in head and " height=" not in head
    assert not any(placeholder in text for placeholder in html._CSS_COLOURS)
    assert "currentColor" in text
