"""trace.pftrace written while the rules run (pipeline.TraceWriter): the same bytes as the trace written from the
finished verdict, and nothing left behind — no thread, no cursor, no file — when the run fails meanwhile."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from plasmient_report import pipeline, rules, scratch
from plasmient_report.render import perfetto

from .conftest import sample_file

# Committed recordings of the project's generator (sample_traces/README.md): one GPU with steps, and two ranks
# with collectives (the cluster layer's flows and the per-rank GPU names).
SAMPLES = ("h200_single/kineto_single.pt.trace.json.gz", "h200x2_ddp/kineto")


def _inputs(name: str) -> list[Path]:
    p = sample_file(name)
    return sorted(p.glob("*.json*")) if p.is_dir() else [p]


@pytest.mark.parametrize("name", SAMPLES)
def test_the_trace_written_beside_the_rules_is_the_trace_written_after_them(name: str, tmp_path: Path) -> None:
    inputs = _inputs(name)
    with scratch.run():
        res = pipeline.analyse(inputs, pipeline.Options(), write_trace_early=True)
        try:
            assert res.trace is not None
            early = tmp_path / "early.pftrace"
            res.trace.take(early)
            res.trace = None
            late = tmp_path / "late.pftrace"
            stats = perfetto.write(res.con, res.verdict, late)  # the verdict's GPU names and bandwidth
        finally:
            res.close()
    assert stats["kernels"] > 0
    assert early.read_bytes() == late.read_bytes()


def test_facts_from_the_peaks_are_the_verdicts() -> None:
    with scratch.run():
        res = pipeline.analyse(_inputs("h200x2_ddp/kineto"), pipeline.Options())
        try:
            doc = res.verdict
            from_verdict = perfetto.RunFacts.of_verdict(doc)
        finally:
            res.close()
    # The verdict repeats the measure stage's peaks: every GPU with its name, and the first GPU's bandwidth.
    assert len(from_verdict.gpu_names) == 2
    assert all(n and "H200" in n for n in from_verdict.gpu_names.values())
    assert from_verdict.bandwidth_tbs is not None and 3.0 < from_verdict.bandwidth_tbs < 6.0  # H200: 4.8 TB/s


def test_a_run_that_fails_during_the_rules_leaves_no_trace_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[pipeline.TraceWriter] = []
    real = pipeline.TraceWriter.__init__

    def spy(self, *a, **kw):  # type: ignore[no-untyped-def]
        real(self, *a, **kw)
        started.append(self)

    def boom(*a, **kw):  # type: ignore[no-untyped-def]
        raise RuntimeError("a rule failed")

    monkeypatch.setattr(pipeline.TraceWriter, "__init__", spy)
    monkeypatch.setattr(rules, "run", boom)
    before = {t.ident for t in threading.enumerate()}
    with scratch.run() as where:
        with pytest.raises(RuntimeError, match="a rule failed"):
            pipeline.analyse(_inputs(SAMPLES[0]), pipeline.Options(), write_trace_early=True)
        assert len(started) == 1
        assert not started[0].thread.is_alive()
        assert not started[0].path.exists()
        assert not list(where.path.glob("trace-*.pftrace"))
    assert {t.ident for t in threading.enumerate() if t.name == "plasmient-trace"} <= before


def test_no_trace_is_started_without_the_trace_or_for_callers_that_write_no_outputs() -> None:
    with scratch.run():
        for opts, early in ((pipeline.Options(write_trace=False), True), (pipeline.Options(), False)):
            res = pipeline.analyse(_inputs(SAMPLES[0]), opts, write_trace_early=early)
            try:
                assert res.trace is None
            finally:
                res.close()
