"""Host events that reach outside the profiler's recording (its `PyTorch Profiler (N)` span) are cut to it: a
range that closed after the profiler stopped (the last ProfilerStep of a torch.compile run, seconds later at exit)
holds no recorded work past the recording, and measured whole it read as seconds of idle GPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plasmient_report import pipeline, vocab

from .conftest import corpus_file, sample_file

LATE_S = 10.0  # how far past the recording the edited step closes


def _events(path: Path) -> tuple[dict, list[dict]]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return doc, doc["traceEvents"]


def _span_end(ev: list[dict]) -> float:
    """The recording's end (µs, the trace's clock): the profiler's span, widened to the last GPU activity."""
    span = max(e["ts"] + e["dur"] for e in ev if e.get("cat") == "Trace" and e.get("ph") == "X")
    gpu = max(e["ts"] + e.get("dur", 0) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    return max(span, gpu)


def _span_start(ev: list[dict]) -> float:
    """The recording's start: the profiler's span, widened to the first GPU activity."""
    span = min(e["ts"] for e in ev if e.get("cat") == "Trace" and e.get("ph") == "X")
    return min(span, min(e["ts"] for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")))


def _steps(path: Path) -> tuple[list[tuple[int, int, int]], list[str], list[bool]]:
    """(occurrence, start_ns, end_ns) of each ProfilerStep's GPU window, the verdict's notes, and which of its steps
    the verdict says were cut (`steps[].cut`, in occurrence order; checked against `step_summary`'s count)."""
    res = pipeline.analyse([path], pipeline.Options())
    try:
        rows = res.con.execute(
            "SELECT occurrence, start_ns, end_ns FROM steps WHERE label = 'ProfilerStep#*' ORDER BY occurrence"
        ).fetchall()
        assert res.typed is not None
        cut = [x.cut for x in sorted(res.typed.steps, key=lambda x: x.occurrence)]
        assert res.typed.step_summary[0].cut_step_count == sum(cut)
        return rows, list(res.typed.notes), cut
    finally:
        res.close()


@pytest.mark.parametrize("edge", ["end", "start"])
def test_a_step_reaching_past_the_recording_is_measured_over_it(edge: str, tmp_path: Path) -> None:
    # Truth: the same recording (h200_sync_stack, 6 ProfilerSteps) as recorded, where every step lies inside the
    # profiler's span. The edit makes the last CPU-side ProfilerStep close LATE_S after the recording (as a step left
    # open at exit does), or the first open LATE_S before it. The recorded work did not change, so neither may the
    # steps' windows, but for the edited step's CPU edge now reaching the recording's edge: at most `slack_ns` (how
    # far the recording's edge lies beyond the step's recorded one) farther, not LATE_S.
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    doc, ev = _events(path)
    cpu_steps = [e for e in ev if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]
    late = edge == "end"
    step = (max if late else min)(cpu_steps, key=lambda e: e["ts"])
    step_end = step["ts"] + step["dur"]
    # (ints: the ns times are beyond float precision)
    slack_ns = round((_span_end(ev) - step_end) * 1e3) if late else round((step["ts"] - _span_start(ev)) * 1e3)
    assert slack_ns >= 0
    if late:
        step["dur"] = _span_end(ev) - step["ts"] + LATE_S * 1e6
    else:
        step["ts"] = _span_start(ev) - LATE_S * 1e6
        step["dur"] = step_end - step["ts"]
    edited = tmp_path / f"step_past_{edge}.pt.trace.json.gz"
    edited.write_bytes(gzip.compress(json.dumps(doc).encode()))

    want, _, whole = _steps(path)
    got, notes, cut = _steps(edited)
    assert len(got) == len(want) == 6
    i = -1 if late else 0
    # the edited step, and only it, is flagged cut (the verdict's step table marks it, its time a lower bound)
    assert not any(whole) and cut == [k == i % 6 for k in range(6)], (whole, cut)
    assert [r for k, r in enumerate(got) if k != i % 6] == [r for k, r in enumerate(want) if k != i % 6]
    (_, s0, e0), (_, s1, e1) = want[i], got[i]
    # + the cut's 1 µs edge, and 1 ns of rounding of each of the two µs-to-ns conversions
    if late:
        assert s1 == s0 and e0 <= e1 <= e0 + slack_ns + 1002, (e0, e1, slack_ns)
    else:
        assert e1 == e0 and s0 - slack_ns - 1002 <= s1 <= s0, (s0, s1, slack_ns)
    said = [n for n in notes if vocab.CUT_RANGES_MARK in n]
    words = "ended 10.00 s after" if late else "began 10.00 s before"
    assert len(said) == 1 and "ProfilerStep#" in said[0] and words in said[0], notes


def test_the_torch_compile_example_s_step_ends_with_its_recording() -> None:
    # HTA's triton_example (A100, torch.compile): ProfilerStep#1 closes 13.3 s after the profiler's span ends,
    # 1.7 ms after the step began. Truth: the span in the file, read here with json.
    path = corpus_file("public-kineto-hta/triton_example__triton_example.json.gz")
    _, ev = _events(path)
    end = _span_end(ev)
    step = next(e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert step["ts"] + step["dur"] > end + 1e6  # (what makes this trace the case)
    rows, notes, cut = _steps(path)
    assert len(rows) == 1 and cut == [True]
    _, s, e = rows[0]
    assert (e - s) / 1e3 <= end - step["ts"] + 2, ((e - s) / 1e3, end - step["ts"])
    assert any(vocab.CUT_RANGES_MARK in n and "ProfilerStep#1" in n for n in notes), notes


def test_nothing_is_cut_from_a_trace_recorded_whole() -> None:
    # Every event of this recording lies inside the profiler's span: no note, the ranges as recorded.
    path = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")
    _, ev = _events(path)
    end = _span_end(ev)
    # (to the ns: the frames that close with the profiler end on its span's end, `ts + dur` of floats ~1 ns off)
    assert all(e["ts"] + e.get("dur", 0) <= end + 0.002 for e in ev if e.get("ph") == "X" and e.get("cat") != "Trace")
    res = pipeline.analyse([path], pipeline.Options())
    try:
        notes = res.con.execute("SELECT notes FROM sources").fetchone()[0] or ""
        assert vocab.OUTSIDE_RECORDING_MARK not in notes
        assert res.con.execute("SELECT count(*) FROM ranges WHERE cut").fetchone()[0] == 0
        # (known whole: false, not unknown)
        assert res.con.execute("SELECT count(*) FROM ranges WHERE domain = 'user_annotation' AND cut IS NULL").fetchone()[0] == 0
        assert res.typed is not None and not any(x.cut for x in res.typed.steps)
    finally:
        res.close()


def test_runtime_calls_after_the_span_widen_the_recording() -> None:
    # HTA's nccl_parser_config: four cudaEventQuery calls were recorded 17 ms after the profiler's span ended (the
    # GPU tracer records runtime calls with the GPU activities): they are kept, and bound the recording (truth: the
    # file's own runtime events, counted with json).
    path = corpus_file("public-kineto-hta/nccl_parser_config__nccl_data.json.gz")
    _, ev = _events(path)
    span_end = max(e["ts"] + e["dur"] for e in ev if e.get("cat") == "Trace" and e.get("ph") == "X")
    api = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    assert sum(e["ts"] > span_end for e in api) == 4  # (what makes this trace the case)
    res = pipeline.analyse([path], pipeline.Options())
    try:
        assert res.con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == len(api)
        notes = res.con.execute("SELECT notes FROM sources").fetchone()[0] or ""
        assert vocab.OUTSIDE_RECORDING_MARK not in notes
    finally:
        res.close()


def _two_steps_one_cut(tmp_path: Path) -> Path:
    """A construction: the profiler's span is 0–1400 µs; ProfilerStep#1 (0–1000 µs) launches one 950 µs kernel and
    lies inside it; ProfilerStep#2 opens at 1000 µs, launches a 300 µs kernel and closes 60 ms later, long after the
    recording ended: its recorded part (1000–1400 µs) is a lower bound on its time."""

    def kernel(corr: int, ts: float, dur: float) -> list[dict]:
        return [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": ts - 10.0,
             "dur": 2.0, "args": {"External id": corr, "correlation": corr, "cbid": 211}},
            {"ph": "X", "cat": "kernel", "name": "k_elem", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
             "args": {"External id": corr, "device": 0, "stream": 7, "correlation": corr}},
        ]  # fmt: skip

    def step(n: int, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 100, "tid": 1, "ts": ts,
                "dur": dur, "args": {"External id": 0}}  # fmt: skip

    ev = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 0.0, "dur": 1400.0},
        step(1, 0.0, 1000.0), *kernel(1, 20.0, 950.0),
        step(2, 1000.0, 60000.0), *kernel(2, 1020.0, 300.0),
    ]  # fmt: skip
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
           "traceEvents": ev, "baseTimeNanoseconds": 1790000000000000000}  # fmt: skip
    path = tmp_path / "two_steps.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_cut_step_is_left_out_of_the_step_statistics(tmp_path: Path) -> None:
    # Truth: the construction above. The one whole step is the only step time known; the cut one's is a lower bound,
    # so it neither sets the median (which flagged the whole step 43% slow than a median of 1000 µs and ~400 µs)
    # nor is it compared with it, nor gives a throughput.
    res = pipeline.analyse([_two_steps_one_cut(tmp_path)], pipeline.Options(tokens_per_step=1000))
    try:
        v = res.typed
        assert v is not None
        steps = sorted(v.steps, key=lambda x: x.occurrence)
        assert [x.cut for x in steps] == [False, True]
        whole, cut = steps
        assert whole.excess_over_median == 0.0 and not whole.slow
        assert cut.excess_over_median is None and not cut.slow and cut.tokens_per_s is None
        assert whole.tokens_per_s == pytest.approx(1000 / (whole.gpu_ns / 1e9))
        assert cut.gpu_ns < whole.gpu_ns / 2  # (what makes this the case: the cut step looks fast)
        (s,) = v.step_summary
        assert s.steps == 2 and s.cut_step_count == 1 and s.slow_step_count == 0
        assert s.mean_ns == s.median_ns == s.min_ns == s.max_ns == whole.gpu_ns and s.stddev_ns == 0
        assert s.slowest is not None and s.slowest.occurrence == 0
        assert [(r.steps, r.mean_ns) for r in s.by_rank] == [(1, whole.gpu_ns)]
        stats = res.con.execute("SELECT steps, cut_steps, timed_steps, median_ns FROM step_stats").fetchall()
        assert stats == [(2, 1, 1, whole.gpu_ns)]
    finally:
        res.close()


def test_without_the_profilers_span_whether_a_range_was_cut_is_unknown(tmp_path: Path) -> None:
    # The construction without its `PyTorch Profiler (0)` span (as a splitter's cut-out iteration has none): nothing
    # bounds the recording, so no range is said cut or whole (`ranges.cut` NULL), and the step statistics take
    # every step.
    path = _two_steps_one_cut(tmp_path)
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "Trace"]
    path.write_text(json.dumps(doc))
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        cut = res.con.execute("SELECT DISTINCT cut FROM ranges WHERE domain = 'user_annotation'").fetchall()
        assert cut == [(None,)]
        assert res.con.execute("SELECT steps, cut_steps, timed_steps FROM step_stats").fetchall() == [(2, 0, 2)]
        assert res.typed is not None and not any(x.cut for x in res.typed.steps)
    finally:
        res.close()


def test_the_step_chart_draws_a_cut_step_apart(tmp_path: Path) -> None:
    # The step chart's line joins the whole steps; the cut one (its time a lower bound) is a marker of its own, in
    # the legend, so a step that looks fast only because it was cut does not read as a fast step.
    from plasmient_report.render import html

    res = pipeline.analyse([_two_steps_one_cut(tmp_path)], pipeline.Options(write_html=False, write_trace=False))
    try:
        v = res.typed
        assert v is not None
        chart = str(html.step_time_chart(v.steps, v.step_summary[0]))
        whole = [x for x in v.steps if not x.cut]
        assert "cut by the recording" in chart
        assert str(html.step_time_chart(whole * 2, v.step_summary[0])).count("cut by the recording") == 0
    finally:
        res.close()
