"""PR102 exposed-communication: fires when all-reduces run with nothing beside them, silent when compute overlaps
them."""

from __future__ import annotations

import json

from ..expect import Expect, Near, analyse, check
from ..traces import allreduce_traces


def test_fires_when_communication_runs_alone(tmp_path):
    # Construction: punctual ranks, each step 200 µs of mm then a 150 µs all-reduce with no other kernel:
    # 0% overlap; 2 ranks × 3 × 150 µs of transfer over 2 × 3000 µs of windows = 0.15.
    v = analyse(allreduce_traces(tmp_path))
    check(
        v,
        [
            Expect(
                "PR102",
                rank=None,
                category="collective_transfer",
                lost_fraction=Near(0.15, abs=0.005, truth="construction: 900 µs of 6000 µs"),
                evidence={
                    "overlap": Near(0.0, abs=1e-9, truth="construction: nothing beside the all-reduce"),
                    "nccl_ns": Near(900e3, rel=0.01, truth="construction: 2 × 3 × 150 µs"),
                    "top_collectives.0.collective": "allreduce",
                    "top_collectives.0.count": 3,
                },
            )
        ],
    )


def test_silent_when_overlapped(tmp_path):
    # Construction: a compute kernel on another stream spans every all-reduce: 100% overlap.
    check(analyse(allreduce_traces(tmp_path, overlap=True)), [], silent=["PR102"])


def test_a_collective_of_unknown_size_gets_no_bandwidth(tmp_path):
    # Construction: the same loop, the all-reduce kernels without NCCL's size metadata (older traces, or nsys
    # without payloads): their size is unknown, so no bandwidth is stated — never "0.0 GB/s".
    paths = allreduce_traces(tmp_path)
    for p in paths:
        doc = json.loads(p.read_text())
        for e in doc["traceEvents"]:
            for k in ("In msg nelems", "Out msg nelems", "dtype"):
                e.get("args", {}).pop(k, None)
        p.write_text(json.dumps(doc))
    check(
        analyse(paths),
        [Expect("PR102", category="collective_transfer", says=[r"size not in the trace"], never_says=[r"GB/s"])],
    )


def test_the_advice_fits_training_or_inference(tmp_path):
    # The construction above has framework ops (aten::mm) and no backward: the forward's collectives (TraceLens's B200
    # vLLM trace, tensor-parallel all-reduces, was told "DDP — smaller bucket_cap_mb … bf16 gradients"). With an
    # autograd backward op added on each rank it is a training step, and the gradient advice fits.
    (tmp_path / "inference").mkdir()
    (tmp_path / "training").mkdir()
    inference = analyse(allreduce_traces(tmp_path / "inference"))
    check(inference, [Expect("PR102", says=[r"forward pass's collectives"], never_says=[r"bucket_cap_mb", r"gradients\)"])])
    paths = allreduce_traces(tmp_path / "training")
    for p in paths:
        doc = json.loads(p.read_text())
        doc["traceEvents"].append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "autograd::engine::evaluate_function: MmBackward0",
                "pid": 100,
                "tid": 1,
                "ts": 900.0,
                "dur": 5.0,
                "args": {"External id": 99},
            }
        )
        p.write_text(json.dumps(doc))
    check(analyse(paths), [Expect("PR102", says=[r"bucket_cap_mb"], never_says=[r"forward pass's collectives"])])


def test_the_waterfalls_generic_line_fits_inference(tmp_path):
    # The generic collective_transfer line (said when no rule names the cause) of the inference construction above:
    # no "bucket / compress gradients" for a program with no backward.
    from plasmient_report import judge, pipeline

    res = pipeline.analyse(allreduce_traces(tmp_path), pipeline.Options(write_html=False, write_trace=False))
    try:
        line = judge.generic_advice(res.con)["collective_transfer"]
    finally:
        res.close()
    assert "gradients" not in line and "forward's collectives" in line, line
