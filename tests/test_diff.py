"""`plasmient-report diff`: what changed between two runs, and the CI gate (`--fail-if-drop`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plasmient_report import diff

from .conftest import corpus_file, cpu_op, kernel, launch, write_trace
from .rules.traces import allreduce_traces


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def two_phases(tmp_path_factory) -> tuple[Path, Path]:
    """Two real runs: the H200 corpus' compute_bound phase (≈76% of peak) and its train_step phase (≈46%)."""
    path = corpus_file("h200-single-kineto/kineto_single.json.gz")
    tmp = tmp_path_factory.mktemp("diff")
    outs = []
    for phase in ("compute_bound", "train_step"):
        out = tmp / phase
        r = cli(path, "--range", f"phase:{phase}", "--out", out, "--quiet")
        assert r.returncode == 0, r.stderr
        outs.append(out)
    return outs[0], outs[1]


def test_diff_reports_the_drop_and_gates(two_phases):
    base, cand = two_phases
    r = cli("diff", base, cand, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "plasmient.diff/1"
    ach = next(n for n in d["numbers"] if n["name"] == "achieved_fraction_of_peak")
    assert 25 < -ach["delta_pts"] < 35  # 76% → 46% (tests/test_measure.py ground truth)
    mb = next(x for x in d["losses"] if x["category"] == "memory_bound")
    assert mb["delta_pts"] > 20
    assert {f["rule"] for f in d["findings"]["new"]} >= {"PR301", "PR602"}
    assert any("different ranges" in n for n in d["notes"])
    # The gate: a 30-point drop fails a 5-point limit (exit 1, one line on stderr), passes a 50-point one.
    r = cli("diff", base, cand, "--fail-if-drop", "5")
    assert r.returncode == 1 and "FAIL" in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and "fell" in r.stderr
    assert cli("diff", base, cand, "--fail-if-drop", "50").returncode == 0
    # Improvement never fails; verdict.json files work as well as output folders.
    r = cli("diff", cand / "verdict.json", base / "verdict.json", "--fail-if-drop", "0")
    assert r.returncode == 0 and "rose" in r.stdout


def test_diff_straggler_appears(tmp_path):
    # Two 2-rank runs, the second with rank 1 300 µs late to every all-reduce: the straggler finding is new.
    a, b = tmp_path / "punctual", tmp_path / "late"
    a.mkdir()
    b.mkdir()
    allreduce_traces(a, skew_us=0.0)
    allreduce_traces(b, skew_us=300.0)
    d = diff.compare(diff.load(a), diff.load(b), fail_if_drop=1.0)
    assert [f["rule"] for f in d["findings"]["new"] if f["rule"] == "PR101"] == ["PR101"]
    assert next(x for x in d["losses"] if x["category"] == "collective_wait")["delta_pts"] > 0
    assert d["gate"]["failed"] and d["gate"]["drop_pts"] > 1.0
    r = cli("diff", a, b, "--fail-if-drop", "1")
    assert r.returncode == 1


def _mm_trace(path: Path, kernel_us: float) -> Path:
    n = 4096
    ev = [
        cpu_op("aten::mm", 10.0, 20.0, ext=5, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
        launch(12.0, ext=5, corr=50),
        kernel("nvjet_sm90_tst_gemm", 100.0, kernel_us, ext=5, corr=50),
        cpu_op("aten::add_", 990.0, 5.0, ext=6),
        launch(991.0, ext=6, corr=51),
        kernel("vectorized_elementwise_kernel", 995.0, 5.0, ext=6, corr=51),
    ]
    return write_trace(path, ev)


def test_diff_of_trace_inputs(tmp_path):
    fast = _mm_trace(tmp_path / "fast.json", 200.0)
    slow = _mm_trace(tmp_path / "slow.json", 400.0)
    d = diff.compare(diff.load(fast), diff.load(slow), fail_if_drop=2.0)
    # Same FLOPs in the same 0–1000 µs window (first to last event): the achieved fraction is unchanged; the
    # slower kernel turns idle host time into compute inefficiency.
    ach = next(n for n in d["numbers"] if n["name"] == "achieved_fraction_of_peak")
    assert ach["delta_pts"] == pytest.approx(0.0, abs=1e-6) and not d["gate"]["failed"]
    ci = next(x for x in d["losses"] if x["category"] == "compute_inefficiency")
    assert ci["delta_pts"] > 0


def test_diff_bad_inputs(tmp_path):
    r = cli("diff", tmp_path / "nope.json", tmp_path / "nope2.json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/1"}))
    r = cli("diff", other, other)
    assert r.returncode == 2 and "not a plasmient verdict" in r.stderr


@pytest.fixture(scope="module")
def real_verdict(tmp_path_factory) -> dict:
    """A real verdict (the committed H200 sample, its compute_bound phase: ≈79% of peak) to edit into broken ones."""
    from plasmient_report import pipeline

    from .conftest import sample_file

    res = pipeline.analyse(
        [sample_file("h200_single/kineto_single.pt.trace.json.gz")], pipeline.Options(ranges=["phase:compute_bound"])
    )
    try:
        return json.loads(json.dumps(res.verdict))
    finally:
        res.close()


def _write(tmp_path: Path, name: str, doc: object) -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_gate_needs_a_known_achieved_fraction(real_verdict, tmp_path):
    good = _write(tmp_path, "good.json", real_verdict)
    unknown = _write(tmp_path, "unknown.json", {**real_verdict, "achieved_fraction_of_peak": None})
    assert cli("diff", unknown, unknown).returncode == 0  # nothing to gate on: a plain comparison
    for a, b in ((good, unknown), (unknown, good)):
        r = cli("diff", a, b, "--fail-if-drop", "1")
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "cannot gate" in r.stderr and "unknown" in r.stderr
        assert "unknown.json" in r.stderr  # says which side


def test_gate_refuses_a_lower_bound(real_verdict, tmp_path):
    good = _write(tmp_path, "good.json", real_verdict)
    low = _write(tmp_path, "low.json", {**real_verdict, "achieved_is_lower_bound": True})
    for a, b in ((good, low), (low, good)):
        r = cli("diff", a, b, "--fail-if-drop", "5")
        assert r.returncode == 2 and "lower bound" in r.stderr and "low.json" in r.stderr, r.stderr
    assert cli("diff", good, good, "--fail-if-drop", "0").returncode == 0


@pytest.mark.parametrize(
    "how",
    [
        "nan_literal",
        "infinity",
        "huge_float",
        "string_achieved",
        "list_losses",
        "loss_without_fraction",
        "missing_run",
        "truncated",
        "not_an_object",
        "empty",
        "binary",
        "ranks_not_a_list",
    ],
)
def test_malformed_verdicts_are_one_line_and_exit_2(real_verdict, tmp_path, how):
    """A broken verdict is bad input (exit 2, one line naming it) — never a traceback, never exit 1 (the
    regression code a CI gate reads)."""
    v = json.loads(json.dumps(real_verdict))
    text = None
    if how == "nan_literal":
        text = json.dumps(v).replace(json.dumps(v["achieved_fraction_of_peak"]), "NaN", 1)
    elif how == "infinity":
        text = json.dumps(v).replace(json.dumps(v["achieved_fraction_of_peak"]), "Infinity", 1)
    elif how == "huge_float":
        text = json.dumps(v).replace(json.dumps(v["achieved_fraction_of_peak"]), "1e999", 1)
    elif how == "string_achieved":
        v["achieved_fraction_of_peak"] = "79%"
    elif how == "list_losses":
        v["losses"] = {"memory_bound": 0.1}
    elif how == "loss_without_fraction":
        del v["losses"][0]["fraction"]
    elif how == "missing_run":
        del v["run"]
    elif how == "truncated":
        text = json.dumps(v)[:500]
    elif how == "not_an_object":
        text = "[1, 2, 3]"
    elif how == "empty":
        text = ""
    elif how == "binary":
        text = "\x00\x01garbage"
    elif how == "ranks_not_a_list":
        v["ranks"] = 3
    bad = _write(tmp_path, "verdict.json", text if text is not None else v)
    good = _write(tmp_path, "good.json", real_verdict)
    for args in ((good, bad), (bad, good), (bad, bad, "--fail-if-drop", "1"), (good, bad, "--fail-if-drop", "0")):
        r = cli("diff", *args)
        assert r.returncode == 2, (how, args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr and "verdict.json" in lines[0], r.stderr


def test_load_verdict_accepts_keys_of_a_newer_version(real_verdict, tmp_path):
    # Changes are additive: a verdict with keys this version does not know still loads (they are dropped).
    from plasmient_report.verdict_model import load_verdict

    v = {**real_verdict, "some_new_key": {"x": 1}}
    v["losses"] = [{**x, "new_field": 2} for x in v["losses"]]
    loaded = load_verdict(_write(tmp_path, "v.json", v))
    assert loaded.achieved_fraction_of_peak == real_verdict["achieved_fraction_of_peak"]
    assert [x.category for x in loaded.losses] == [x["category"] for x in real_verdict["losses"]]
