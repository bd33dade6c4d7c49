"""PR302 unfused-elementwise-chain: fires on the committed memory-bound phase (x.mul_().add_() ten times: a chain of
two ops on one shape) and on a synthetic chain, silent on compute-bound work."""

from __future__ import annotations

from ...conftest import annotation, cpu_op, kernel, launch, write_trace
from ..expect import Expect, Near, analyse, check, single_phase


def test_fires_on_the_memory_bound_phase():
    # sample_traces/README.md: 10 × x.mul_(1.0001).add_(1e-6) back to back on one 1 GiB tensor: 20 kernels whose
    # ops repeat mul_ → add_; the chain is the whole memory-bound loss of the phase.
    v = single_phase("memory_bound")
    mb = next(x["fraction"] for x in v["losses"] if x["category"] == "memory_bound")
    check(
        v,
        [
            Expect(
                "PR302",
                category="memory_bound",
                lost_fraction=Near(mb, rel=0.01, truth="the phase's memory-bound loss"),
                evidence={
                    "ops": ["aten::mul_", "aten::add_"],
                    "repeats": 10,
                    "kernels": 20,
                    "saving_if_unit_fused": Near(0.5, abs=1e-9, truth="2 ops → 1 kernel"),
                },
            )
        ],
    )


def test_fires_on_a_synthetic_chain(tmp_path):
    # Construction: 4 × (mul → add → relu), each a 20 µs elementwise kernel on a [4096, 4096] fp32 tensor.
    ev, corr, t = [annotation("work", 0.0, 400.0)], 10, 5.0
    for _ in range(4):
        for op in ("aten::mul", "aten::add", "aten::relu"):
            ev += [
                cpu_op(op, t, 2.0, ext=corr, dims=[[4096, 4096], []], types=["float", "Scalar"]),
                launch(t + 0.5, ext=corr, corr=corr),
                kernel(
                    "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float> >",
                    t + 5.0,
                    20.0,
                    ext=corr,
                    corr=corr,
                ),
            ]
            corr += 1
            t += 25.0
    v = analyse([write_trace(tmp_path / "chain.json", ev)], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR302",
                evidence={
                    "ops": ["aten::mul", "aten::add", "aten::relu"],
                    "repeats": 4,
                    "kernels": 12,
                    "time_ns": Near(240e3, rel=0.01, truth="12 × 20 µs"),
                },
            )
        ],
    )


def test_silent_on_compute_bound():
    check(single_phase("compute_bound"), [], silent=["PR302"])


def test_a_run_of_one_op_claims_no_bytes_it_cannot_know(tmp_path):
    # Construction: 12 aten::add_ in a row, each a 20 µs elementwise kernel, no shapes recorded (an SGD step's
    # per-parameter updates look like this: the public V100 trace of HTA's df_index_resolver, 404 add_ per step).
    # Whether they update one tensor or twelve the trace does not say: the launches can go, the bytes maybe not.
    ev, corr, t = [annotation("work", 0.0, 400.0)], 10, 5.0
    for _ in range(12):
        ev += [cpu_op("aten::add_", t, 2.0, ext=corr), launch(t + 0.5, ext=corr, corr=corr)]
        ev += [
            kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float> >", t + 5.0, 20.0, ext=corr, corr=corr)
        ]
        corr += 1
        t += 25.0
    v = analyse([write_trace(tmp_path / "run.json", ev)], ranges=["work"])
    (f,) = [x for x in v["findings"] if x["rule"] == "PR302"]
    assert "foreach" in f["fix"] and "bytes)" not in f["fix"] and "−" not in f["fix"], f["fix"]
