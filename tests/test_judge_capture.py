"""A profile of a CUDA / HIP graph capture: the launches between StreamBeginCapture and EndCapture are recorded into
a graph and do not run, so the GPU is idle while the host works — the verdict says it is a capture, not an idle
workload (real cases: TraceLens's SGLang and vLLM capture traces on MI300X, 544 of 546 launches captured)."""

from __future__ import annotations

from .conftest import kernel, launch, write_trace
from .rules.expect import analyse
from .rules.traces import runtime


def test_a_capture_is_said_and_is_the_verdict(tmp_path):
    # Construction: one kernel runs (10 µs at t = 5); then 10 launches inside a capture (t = 100 … 1100), which
    # run nothing: 10 of 11 launches captured, the GPU busy 10 of ~1100 µs.
    ev = [
        launch(1.0, ext=1, corr=1),
        kernel("warmup_kernel", 5.0, 10.0, ext=1, corr=1),
        runtime("cudaStreamBeginCapture", 100.0, 2.0),
    ]
    ev += [launch(110.0 + 100 * i, ext=10 + i, corr=10 + i) for i in range(10)]
    ev += [runtime("cudaStreamEndCapture", 1090.0, 3.0), runtime("cudaGraphInstantiate", 1095.0, 5.0)]
    v = analyse([write_trace(tmp_path / "t.json", ev)], write_html=False, write_trace=False)
    assert v["verdict"] == "idle (graph capture)"
    notes = [n for n in v["notes"] if "graph capture" in n]
    assert len(notes) == 1 and notes[0].startswith("10 of the trace's 11 kernel launches went into 1 CUDA graph capture")
    # the idle lines give no host advice ("profile the Python side"): their host time is the capture's
    idle = [x for x in v["losses"] if x["category"] in ("host_other", "launch_bound", "sync_stall", "input_bound")]
    assert idle and all(x["recommendation"].startswith("graph capture:") for x in idle), v["losses"]


def test_launches_outside_a_capture_are_not_counted_and_no_capture_says_nothing(tmp_path):
    # The same launches after the capture ended (t ≥ 1200): none captured; and a trace without a capture: silent.
    ev = [
        launch(1.0, ext=1, corr=1),
        kernel("warmup_kernel", 5.0, 10.0, ext=1, corr=1),
        runtime("cudaStreamBeginCapture", 100.0, 2.0),
    ]
    ev += [runtime("cudaStreamEndCapture", 150.0, 3.0)]
    ev += [launch(1200.0 + 100 * i, ext=10 + i, corr=10 + i) for i in range(10)]
    v = analyse([write_trace(tmp_path / "t.json", ev)], write_html=False, write_trace=False)
    assert v["verdict"] == "idle" and not [n for n in v["notes"] if "graph capture" in n]
