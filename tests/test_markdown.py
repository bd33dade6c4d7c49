"""Markdown for pull requests (issue 20): `--markdown FILE` on the main job and on `diff` — the verdict, the step
time, the waterfall as a table and the top findings, as GitHub-flavoured markdown that fits a PR comment or
$GITHUB_STEP_SUMMARY: short, tables, no HTML; the numbers are the verdict's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plasmient_report.render import markdown
from plasmient_report.render._format import achieved_text, category_label, pct
from plasmient_report.verdict_model import from_dict

from .conftest import ROOT, sample_file

GITHUB_COMMENT_LIMIT = 65536  # characters GitHub accepts in one comment
HTML_TAG = re.compile(r"<(?!sub>|/sub>)[A-Za-z/!][^>]*>")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})},
    )


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("md")
    md = tmp / "verdict.md"
    r = cli(
        str(sample_file("h200x2_ddp/kineto")),
        "--out",
        str(tmp / "out"),
        "--no-html",
        "--no-trace",
        "--tokens-per-step",
        "16384",
        "--markdown",
        str(md),
    )
    assert r.returncode == 0, r.stderr
    assert "VERDICT" in r.stdout  # the box is still printed
    return tmp / "out", md


def _tables(text: str) -> list[list[str]]:
    """Every table row's cells (header and delimiter rows included)."""
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines() if line.startswith("|")]


def test_the_verdict_as_markdown(ddp: tuple[Path, Path]) -> None:
    out, md = ddp
    v = json.loads((out / "verdict.json").read_text())
    typed = from_dict(v)
    text = md.read_text()
    assert text == markdown.verdict(typed)  # the file is the verdict's markdown, nothing else
    assert len(text) < GITHUB_COMMENT_LIMIT // 8 and len(text.splitlines()) < 60
    assert not HTML_TAG.search(text), HTML_TAG.search(text)
    assert f"**VERDICT: {v['verdict']}.**" in text
    rows = _tables(text)
    assert ["**achieved fraction of peak**", f"**{achieved_text(typed)}**"] == rows[3][:2]
    # the waterfall: achieved and every loss of at least 0.5%, in the verdict's order, with the verdict's numbers
    shown = [x for x in v["losses"] if x["fraction"] >= 0.005][: markdown.MAX_LOSSES]
    waterfall = [r for r in rows if r[0] == "achieved" or r[0] in {category_label(x["category"]) for x in v["losses"]}]
    assert [r[0] for r in waterfall] == ["achieved"] + [category_label(x["category"]) for x in shown]
    assert [r[1] for r in waterfall[1:]] == [pct(x["fraction"]) for x in shown]
    # the step time and the throughput
    step = next(r for r in rows if r[0] == "step time (GPU)")
    assert "5 steps × 2 ranks" in step[2]
    assert any(r[0] == "throughput" and "tokens/s" in r[1] for r in rows)
    # the top findings by rule id
    for f in [x for x in v["findings"] if (x["lost_fraction"] or 0) >= 0.005][: markdown.MAX_FINDINGS]:
        assert f"`{f['rule']}`" in text


def test_names_are_escaped() -> None:
    """A kernel's template brackets and a name's underscores stay literal: no tag, no emphasis."""
    assert (
        markdown.esc("void at::native::vectorized_elementwise_kernel<4, float>")
        == "void at::native::vectorized\\_elementwise\\_kernel\\<4, float\\>"
    )
    assert markdown.esc("a | b\nc") == "a \\| b c"
    assert markdown.code("x|y") == "`x\\|y`"
    assert markdown.bar(0.5) == "█" * 10 and markdown.bar(None) == ""


def test_markdown_to_stdout_and_the_step_summary(tmp_path: Path) -> None:
    trace = str(sample_file("h200_hf/input_bound.pt.trace.json.gz"))
    r = cli(trace, "--out", str(tmp_path / "a"), "--no-html", "--no-trace", "--markdown", "-")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("### plasmient") and "╭" not in r.stdout  # markdown instead of the box
    summary = tmp_path / "summary.md"
    summary.write_text("## earlier step\n")
    r = cli(
        trace,
        "--out",
        str(tmp_path / "b"),
        "--no-html",
        "--no-trace",
        "--quiet",
        "--markdown",
        str(summary),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert r.returncode == 0, r.stderr
    text = summary.read_text()
    assert text.startswith("## earlier step\n### plasmient")  # appended: the runner's summary collects steps
    r = cli(trace, "--out", str(tmp_path / "c"), "--json", "--markdown", "-")
    assert r.returncode == 2 and "both print to stdout" in r.stderr and not (tmp_path / "c").exists()
    r = cli(trace, "--out", str(tmp_path / "d"), "--markdown", str(tmp_path))
    assert r.returncode == 2 and "not a folder" in r.stderr and not (tmp_path / "d").exists()


def test_diff_markdown_and_the_gate(ddp: tuple[Path, Path], tmp_path: Path) -> None:
    """diff --markdown: the gate's outcome first; a lower-bound side cannot be gated (exit 2, saying why)."""
    out, _ = ddp
    md = tmp_path / "diff.md"
    r = cli("diff", str(out), str(out), "--fail-if-drop", "1", "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert "**✅ OK**" in text and "step time (ProfilerStep#\\*)" in text and not HTML_TAG.search(text)
    v = json.loads((out / "verdict.json").read_text())
    low = tmp_path / "low.json"
    low.write_text(json.dumps({**v, "achieved_is_lower_bound": True}))
    r = cli("diff", str(out), str(low), "--fail-if-drop", "1", "--markdown", str(md))
    assert r.returncode == 2 and "lower bound" in r.stderr and "low.json" in r.stderr
    assert "CANNOT GATE" in md.read_text() and "lower bound" in md.read_text()
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**v, "achieved_fraction_of_peak": None}))
    r = cli("diff", str(unknown), str(out), "--fail-if-drop", "1")
    assert r.returncode == 2 and "unknown in the base" in r.stderr
    assert os.path.getsize(md) > 0
