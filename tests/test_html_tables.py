"""report.html's collectives, memory and launch-statistics sections: what they show is the verdict's numbers, the
lateness heatmap and the charts are drawn, and the straggler and launch-bound findings link to their evidence."""

from __future__ import annotations

import re
from pathlib import Path

from plasmient_report import pipeline
from plasmient_report.render import html as html_render

from .conftest import sample_file
from .test_html import parse


def render(inputs: list[Path], out: Path, **kw):
    res = pipeline.analyse(inputs, pipeline.Options(**kw))
    html_render.write(res.con, res.verdict, out)
    return out.read_text(encoding="utf-8"), parse(out), res.typed


def test_ddp_collectives_and_the_straggler_link(tmp_path: Path) -> None:
    text, page, v = render([sample_file("h200x2_ddp/kineto")], tmp_path / "r.html")
    for ident in ("collectives", "collectives-table", "collective-lateness", "lateness-table", "launch-stats"):
        assert ident in page.by_id, ident
    g = v.collective_stats.groups[0]
    table = page.text_of["collectives-table"]
    assert "32 MiB" in table and f"{g.busbw_bytes_s / 1e9:.1f}" in table and "NVLink 4" in table
    # the heatmap is an SVG chart in the lateness part; its table holds rank 1's 30 ms per step
    lateness = text[text.index('id="collective-lateness"') : text.index('id="memory"')]
    assert 'aria-label="lateness per step and rank"' in lateness
    worst = max(c.lateness_ns for c in v.collective_stats.lateness)
    assert html_render.fmt_duration(worst) in page.text_of["lateness-table"]
    # PR101 (rank 1 is late) links to the heatmap
    pr101 = text[text.index("<code>PR101</code>") :]
    pr101 = pr101[: pr101.index("</article>")]
    assert re.search(r'href="#collective-lateness"', pr101)
    assert 'aria-label="bus bandwidth by message size"' in text


def test_memory_chart_and_table(tmp_path: Path) -> None:
    text, page, v = render([sample_file("h200_hf/llama_memory.pt.trace.json.gz")], tmp_path / "r.html")
    (m,) = v.memory
    assert 'aria-label="device memory over time"' in text
    table = page.text_of["memory-table"]
    assert html_render.fmt_bytes(m.peak_allocated_bytes) in table and html_render.fmt_bytes(m.peak_reserved_bytes) in table
    assert f"{m.peak_allocated_bytes:,}" in text  # the exact bytes on hover
    assert "No collectives in the analysed window" in page.text_of["collectives"]


def test_driver_memory_records_say_allocated_is_unknown(tmp_path: Path) -> None:
    # nsys --cuda-memory-usage=true: reserved from CUDA's own records, allocated not in them (unknown, not 0 or n/a)
    text, page, v = render([sample_file("h200_nsys_memory/nsys_memory.sqlite")], tmp_path / "r.html")
    (m,) = v.memory
    assert m.peak_allocated_bytes is None and m.peak_reserved_bytes
    table = page.text_of["memory-table"]
    assert "unknown (driver)" in table and html_render.fmt_bytes(m.peak_reserved_bytes) in table
    assert "--cuda-memory-usage=true" in page.text_of["memory"] and "caching allocator's own records" not in text
    assert 'aria-label="device memory over time"' in text and "rank 0 reserved" in text


def test_launch_bound_links_to_the_histogram(tmp_path: Path) -> None:
    text, page, v = render(
        [sample_file("h200_single/kineto_single.pt.trace.json.gz")], tmp_path / "r.html", ranges=["phase:launch_bound"]
    )
    assert 'aria-label="kernel durations per stream"' in text
    s = v.launch_stats[0]
    assert f"{s.kernels:,}" in page.text_of["launch-table"]
    assert html_render.fmt_duration(s.launch_delay_ns.p50) in page.text_of["launch-table"]
    pr501 = text[text.index("<code>PR501</code>") :]
    assert 'href="#launch-stats"' in pr501[: pr501.index("</article>")]
