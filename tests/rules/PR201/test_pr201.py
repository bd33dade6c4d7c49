"""PR201 pipeline-bubble: fires on a GPipe schedule (synthetic, and two real 2-stage recordings with their truth),
counts micro-batches only when steps are marked, and is silent on data parallelism and on send/recv that make an
all-to-all."""

from __future__ import annotations

import pytest

from ...conftest import cpu_op, launch, sample_file, write_trace
from ..expect import Between, Expect, Near, analyse, check, ddp_sample, truth
from ..traces import gpipe_traces, nccl_kernel


@pytest.mark.parametrize(("stages", "micro", "order"), [(2, 4, None), (3, 6, [2, 0, 1])])
def test_fires_on_a_synthetic_gpipe_schedule(tmp_path, stages, micro, order):
    # Construction: equal stages → GPipe bubble (p−1)/(m+p−1); the pipeline's GPU span is
    # (m+p−1)·(tf+tb) + 2·(p−1)·c µs, of which each stage computes m·(tf+tb).
    theory = (stages - 1) / (micro + stages - 1)
    span = (micro + stages - 1) * 300.0 + 2 * (stages - 1) * 10.0
    v = analyse(gpipe_traces(tmp_path, stages=stages, micro=micro, rank_of_stage=order))
    check(
        v,
        [
            Expect(
                "PR201",
                category="pipeline_bubble",
                evidence={
                    "num_stages": stages,
                    "micro_batches": micro,
                    "steps_known": True,
                    "theory_bubble": Near(theory, abs=1e-9, truth="(p−1)/(m+p−1)"),
                    "stage_order": order or list(range(stages)),
                    "measured_bubble": Near(1 - micro * 300.0 / span, abs=1e-6, truth="construction: 1 − m·300/span"),
                    "micro_batches_to_halve": 2 * micro + stages - 1,
                },
            )
        ],
    )


def test_micro_batches_unknown_without_step_markers(tmp_path):
    # Construction: the same schedule with no ProfilerStep range: the sends could span several steps.
    v = analyse(gpipe_traces(tmp_path, steps_marked=False))
    check(
        v,
        [
            Expect(
                "PR201",
                evidence={"steps_known": False, "micro_batches": None, "theory_bubble": None, "sends_in_window": 4},
                never_says=[r"→ \d+ halves"],
            )
        ],
    )


@pytest.mark.parametrize(("run", "m"), [("m4", 4), ("m8", 8)])
def test_fires_on_real_gpipe_recordings(run, m):
    # sample_traces/h200x2_pipeline/<run>/truth.json: 2 stages of GPipe on two H200s; the profiled bubble is
    # above theory (the profiler slows the host: sample_traces/README.md), never below it.
    t = truth(f"h200x2_pipeline/{run}/truth.json")
    d = sample_file(f"h200x2_pipeline/{run}/rank0.pt.trace.json.gz").parent
    v = analyse([d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"])
    check(
        v,
        [
            Expect(
                "PR201",
                evidence={
                    "num_stages": t["stages"],
                    "micro_batches": t["micro_batches"],
                    "stage_order": [0, 1],
                    "theory_bubble": Near(t["theory_bubble"], abs=1e-9, truth="truth.json"),
                    "measured_bubble": Between(t["theory_bubble"], 1.0, truth="truth.json: at least the schedule's bubble"),
                },
            )
        ],
    )


@pytest.mark.parametrize("run", ["d8192_m4", "d8192_m8"])
def test_near_theory_when_compute_dominates(run):
    # sample_traces/h200x2_pipeline/d8192_*: ~5 ms of forward per micro-batch; stage 1 also computes the loss, so the
    # stages are unequal and the schedule's bubble is 1 − (m/(m+1)) / (t_max / t_mean) (README: imbalance 1.12).
    t = truth(f"h200x2_pipeline/{run}/truth.json")
    d = sample_file(f"h200x2_pipeline/{run}/rank0.pt.trace.json.gz").parent
    v = analyse([d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"])
    check(
        v,
        [
            Expect(
                "PR201",
                evidence={
                    "micro_batches": t["micro_batches"],
                    "stage_imbalance": Between(1.05, 1.25, truth="README: 1.12"),
                    "measured_bubble": Between(t["theory_bubble"], t["theory_bubble"] + 0.12, truth="truth.json + profiling"),
                    "idle": Between(0.0, 0.03, truth="the host keeps up: almost no time without a kernel"),
                },
            )
        ],
    )
    ev = [f for f in v["findings"] if f["rule"] == "PR201"][0]["evidence"]
    assert ev["measured_bubble"] == pytest.approx(ev["theory_bubble_unequal_stages"], abs=0.02)


def test_silent_without_a_pipeline(tmp_path):
    check(ddp_sample(), [], silent=["PR201"])  # data parallel: all-reduces, no send/recv
    # Send/recv kernels launched inside an all-to-all op (DLRM / MoE embedding exchange) on two ranks: an
    # all-to-all collective, not pipeline stages.
    paths = []
    for rank in (0, 1):
        ev = []
        for i in range(3):
            t0 = i * 500.0
            ev.append(cpu_op("c10d::alltoall_base_", t0, 20.0, ext=10 + i))
            ev.append(launch(t0 + 5.0, ext=10 + i, corr=100 + i))
            ev.append(
                nccl_kernel(
                    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                    t0 + 30.0,
                    200.0,
                    ext=10 + i,
                    corr=100 + i,
                    collective="send" if rank == 0 else "recv",
                )
            )
        paths.append(write_trace(tmp_path / f"a2a{rank}.json", ev, rank=rank))
    check(analyse(paths), [], silent=["PR201"])
