"""PR503 input-bound-step: fires on a single-process DataLoader (synthetic, and the committed HF sample whose loader
sleeps 2 ms per sample with num_workers=0), silent where no loader holds the GPU up."""

from __future__ import annotations

from ...conftest import annotation, cpu_op, kernel, launch, sample_file, write_trace
from ..expect import Expect, Near, analyse, check, single_phase, truth


def test_fires_on_a_synthetic_loader(tmp_path):
    # Construction: 3 steps of 1000 µs: 798 µs inside a single-process DataLoader with the GPU idle, then a
    # 190 µs kernel.
    ev = []
    for i in range(3):
        t0 = i * 1000.0
        ev.append(annotation(f"ProfilerStep#{i}", t0, 1000.0))
        ev.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 1.0, 798.0))
        ev.append(cpu_op("aten::add_", t0 + 800.0, 5.0, ext=i + 1))
        ev.append(launch(t0 + 801.0, ext=i + 1, corr=100 + i))
        ev.append(kernel("vectorized_elementwise_kernel", t0 + 805.0, 190.0, ext=i + 1, corr=100 + i))
    check(
        analyse([write_trace(tmp_path / "loader.json", ev)]),
        [
            Expect(
                "PR503",
                category="input_bound",
                evidence={
                    "single_process": True,
                    "suggested_workers": lambda n: n and n >= 2,
                    "wait_per_step_ns": Near(800e3, rel=0.05, truth="construction: ~800 µs of loading per step"),
                },
                says=[r"num_workers="],
            )
        ],
    )


def test_fires_on_the_hf_input_bound_sample():
    # sample_traces/h200_hf/input_bound.truth.json: the loader's fetch (host, GPU idle) takes 34.9 / 34.4 / 34.5 ms of
    # each 45 ms step, num_workers=0.
    t = truth("h200_hf/input_bound.truth.json")
    fetch = sum(t["fetch_ms"]) / len(t["fetch_ms"]) * 1e6
    v = analyse([sample_file("h200_hf/input_bound.pt.trace.json.gz")])
    check(
        v,
        [
            Expect(
                "PR503", evidence={"single_process": True, "wait_per_step_ns": Near(fetch, rel=0.15, truth="truth.json fetch_ms")}
            )
        ],
    )


def test_silent_without_a_loader():
    check(single_phase("compute_bound"), [], silent=["PR503"])
    check(single_phase("train_step"), [], silent=["PR503"])
