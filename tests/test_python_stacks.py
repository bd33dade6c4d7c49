"""Python stacks (torch.profiler with_stack=True): the host-sync rule names the Python site of each sync.

Sample: sample_traces/h200_sync_stack/ (H200, sample_traces/generate/sync_stack.py): every step two named
functions block the host on the GPU — log_metrics (loss.item()) and check_finite (isfinite(...).all().item()) —
then sleep 5 ms. truth.json gives their files and the lines of their `def` (what python_function events name).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plasmient_report import pipeline

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces/h200_sync_stack"
TRACE = SAMPLE / "sync_stack.pt.trace.json.gz"


@pytest.fixture(scope="module")
def result() -> pipeline.Result:
    res = pipeline.analyse([TRACE], pipeline.Options())
    yield res
    res.close()


def test_python_frames_are_ranges_of_their_thread(result: pipeline.Result) -> None:
    n, threads = result.con.execute("SELECT count(*), count(DISTINCT thread) FROM ranges WHERE domain = 'python'").fetchall()[0]
    raw = json.loads(gzip.decompress(TRACE.read_bytes()))
    assert n == sum(1 for e in raw["traceEvents"] if e.get("cat") == "python_function")
    assert threads >= 1


def test_sync_rule_names_each_python_site(result: pipeline.Result) -> None:
    truth = json.loads((SAMPLE / "truth.json").read_text())
    found = {f["evidence"]["python_site"]: f for f in result.verdict["findings"] if f["rule"] == "PR502"}
    steps = truth["steps_profiled"]
    for site in truth["sync_sites"]:
        name = f"{site['file']}({site['def_line']}): {site['function']}"
        assert name in found, (name, list(found))
        f = found[name]
        assert f["evidence"]["as_written"] == ".item()"
        assert f["evidence"]["sync_call"] == "cudaStreamSynchronize"
        assert f["evidence"]["syncs"] == steps  # one per profiled step
        # the GPU idles for the host's 5 ms sleep after each sync, plus Python / launch overhead (< 1 ms here)
        assert 5.0e6 <= f["evidence"]["mean_idle_ns"] <= 6.5e6
        assert name in f["title"] and name in f["recommendation"]


def test_stacks_do_not_change_the_numbers(result: pipeline.Result, tmp_path: Path) -> None:
    """The same trace without its python_function events: identical windows, utilization, achieved, losses."""
    raw = json.loads(gzip.decompress(TRACE.read_bytes()))
    raw["traceEvents"] = [e for e in raw["traceEvents"] if e.get("cat") != "python_function"]
    bare = tmp_path / "bare.pt.trace.json"
    bare.write_text(json.dumps(raw))
    other = pipeline.analyse([bare], pipeline.Options())
    try:
        a, b = result.verdict, other.verdict
        assert a["achieved_fraction_of_peak"] == pytest.approx(b["achieved_fraction_of_peak"], rel=1e-9)
        assert a["utilization"]["trace"] == pytest.approx(b["utilization"]["trace"], rel=1e-9)
        assert a["run"]["window_ns"] == b["run"]["window_ns"]
        assert {x["category"]: x["fraction"] for x in a["losses"]} == pytest.approx(
            {x["category"]: x["fraction"] for x in b["losses"]}, rel=1e-9
        )
        assert [r["name"] for r in a["ranges"]] == [r["name"] for r in b["ranges"]]
        # without stacks the sync rule still finds both syncs, and says how to get the Python line
        sites = [f for f in b["findings"] if f["rule"] == "PR502"]
        assert sites and all(f["evidence"]["python_site"] is None for f in sites)
        assert "with_stack=True" in sites[0]["recommendation"]
    finally:
        other.close()
