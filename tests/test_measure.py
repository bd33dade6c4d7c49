"""Utilization and achieved fraction of peak against ground truth."""

from __future__ import annotations

import pytest

from plasmient_report import pipeline

from . import contract
from .conftest import corpus_file, cpu_op, kernel, launch, write_trace

H100_BF16 = 989.4e12  # NVIDIA H100 SXM datasheet, dense bf16


def run(paths, **kw):
    return pipeline.analyse(list(paths), pipeline.Options(**kw)).verdict


def test_tiny_trace_exact(tiny_trace):
    v = run([tiny_trace])
    # Truth from the fixture's construction: 205 µs busy of a 1000 µs window; one 4096³ mm.
    assert v["utilization"]["trace"] == pytest.approx(0.205, abs=1e-9)
    assert v["achieved_fraction_of_peak"] == pytest.approx(2 * 4096**3 / (1e-3 * H100_BF16), rel=1e-9)
    assert v["peak"]["precision"] == "bf16" and v["peak"]["tflops"] == pytest.approx(989.4)


def test_range_window_and_overlapping_kernels(tmp_path):
    n = 3072  # one kernel alone runs below peak (5.8e14 FLOP/s), two together above it
    flops = 2 * n**3
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 100, "tid": 1, "ts": 0.0, "dur": 400.0, "args": {}},
        cpu_op("aten::mm", 1.0, 3.0, ext=1, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
        launch(2.0, 1, 10),
        cpu_op("aten::mm", 5.0, 3.0, ext=2, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
        launch(6.0, 2, 11),
        # Two overlapping matmuls on two streams, 100 µs each, overlap 50 µs.
        kernel("sm90_xmma_gemm", 100.0, 100.0, 1, 10, stream=7),
        kernel("sm90_xmma_gemm", 150.0, 100.0, 2, 11, stream=8),
        # Outside the range: must not count.
        kernel("elementwise", 900.0, 50.0, 3, 12),
    ]
    p = write_trace(tmp_path / "t.json", ev)
    v = run([p], ranges=["step"])
    assert v["utilization"]["trace"] == pytest.approx(150 / 400)
    # In the overlap both rates add: 2·flops/100µs = 2.75e15 > peak → capped at peak for those 50 µs.
    rate = flops / 100e-6
    achieved_flops = rate * 50e-6 + H100_BF16 * 50e-6 + rate * 50e-6
    assert v["achieved_fraction_of_peak"] == pytest.approx(achieved_flops / (400e-6 * H100_BF16), rel=1e-9)
    assert any("capped" in n for n in v["notes"])


def test_missing_range_is_one_clear_error(tiny_trace):
    from plasmient_report.errors import BadInput

    with pytest.raises(BadInput, match="no range matches 'nope'"):
        run([tiny_trace], ranges=["nope"])


# Ground truth: ../shared/corpus/README.md (H200, 989.4 TFLOP/s dense bf16). compute_bound: 30 × 2·8192³ FLOP in
# a 43.3 ms GPU range → ≈ 0.76; train_step: ≈ 0.47 (analytic 24.74 TFLOP/step at 53.4 ms unprofiled); memory_bound:
# elementwise only, ≈ 0.
@pytest.mark.parametrize(
    ("phase", "lo", "hi", "util_lo"),
    [
        ("compute_bound", 0.72, 0.80, 0.95),
        ("train_step", 0.42, 0.52, 0.90),
        ("memory_bound", 0.0, 0.02, 0.95),
        ("launch_bound", 0.0, 0.01, 0.0),
        ("host_stall", 0.0, 0.01, 0.0),
    ],
)
def test_h200_corpus_phases(phase, lo, hi, util_lo):
    path = corpus_file("h200-single-kineto/kineto_single.json.gz")
    v = run([path], ranges=[f"phase:{phase}"])
    assert lo <= v["achieved_fraction_of_peak"] <= hi
    assert v["utilization"]["trace"] >= util_lo
    assert v["achieved_fraction_of_peak"] <= v["utilization"]["trace"]
    if phase in ("launch_bound", "host_stall"):
        # GPU mostly idle: microsecond kernels between launches; sleeps after a sync.
        assert v["utilization"]["trace"] < 0.2


def test_whole_profile_has_per_range_breakdown():
    v = run([corpus_file("h200-single-kineto/kineto_single.json.gz")])
    names = {r["name"] for r in v["ranges"]}
    assert {"phase:compute_bound", "phase:train_step"} <= names
    assert 0 < v["achieved_fraction_of_peak"] < v["utilization"]["trace"] <= 1


def test_two_ranks_each_reported():
    v = run([corpus_file("h200x2-small/kineto")])
    assert [r["rank"] for r in v["ranks"]] == [0, 1]
    assert v["run"]["ranks"] == [0, 1]
    assert v["coverage"]["communication_time_fraction"] > 0.5  # rank 1 waits ~1 s in its first all-reduce


def test_waterfall_sums_to_one_exactly(tiny_trace):
    v = run([tiny_trace])
    contract.check_verdict(v)  # the waterfall closes: run, each GPU, each range
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    # The fixture's mm kernel runs at 6.87e14 FLOP/s (< peak) for 200 µs: the rest of its time is compute
    # inefficiency; the 795 µs with no kernel are host time (a launch, then host code).
    assert cats["compute_inefficiency"] == pytest.approx(200e-6 * (1 - 2 * 4096**3 / 200e-6 / H100_BF16) / 1e-3)


@pytest.mark.parametrize("phase", ["compute_bound", "memory_bound", "train_step", "launch_bound", "host_stall"])
def test_h200_phase_waterfall(phase):
    v = run([corpus_file("h200-single-kineto/kineto_single.json.gz")], ranges=[f"phase:{phase}"])
    contract.check_verdict(v)  # the waterfall closes: run, each GPU, each range
    top = v["losses"][0]["category"]
    # What each phase is built to lose (../shared/corpus/README.md).
    expected = {
        "compute_bound": "compute_inefficiency",
        "memory_bound": "memory_bound",
        "train_step": "memory_bound",
        "launch_bound": "launch_bound",
        "host_stall": "sync_stall",
    }[phase]
    assert top == expected


def test_straggler_wait_is_collective_wait():
    # Rank 1's first all-reduce waits ~1 s for rank 0 (../shared/corpus/h200x2-small/PROVENANCE.txt).
    v = run([corpus_file("h200x2-small/kineto")])
    contract.check_verdict(v)  # the waterfall closes: run, each GPU, each range
    r1 = next(r for r in v["ranks"] if r["rank"] == 1)
    assert r1["losses"][0]["category"] == "collective_wait" and r1["losses"][0]["fraction"] > 0.9


def test_train_step_flops_per_step_match_analytic():
    # ../shared/corpus/README.md: analytic matmul FLOPs 24.74 TFLOP/step (FlopCounterMode 25.01), 3 steps.
    # Ours count executed FLOPs (causal attention halved, its backward 2.5x): within 3% of the analytic figure.
    v = run([corpus_file("h200-single-kineto/kineto_single.json.gz")], ranges=["phase:train_step"])
    per_step = v["ranges"][0]["flops"] / 3
    assert per_step == pytest.approx(24.74e12, rel=0.03)


def test_model_flops_per_range_occurrence():
    # SPEC §4 --model-flops: the user's FLOPs per occurrence, spread over its compute kernels by time.
    # 3 steps x 24.74e12 analytic FLOPs (../shared/corpus/README.md) over the 157.7 ms CPU-side range.
    path = corpus_file("h200-single-kineto/kineto_single.json.gz")
    v = run([path], ranges=["phase:train_step"], model_flops=3 * 24.74e12)
    window_s = v["run"]["window_ns"] / 1e9
    assert v["achieved_fraction_of_peak"] == pytest.approx(3 * 24.74e12 / (window_s * 989.4e12), rel=0.01)
    # every kernel that may do the model's matmul work carries a share (none is left unknown); the elementwise,
    # norm and optimizer kernels, known to do none, carry none (the phase's AdamW and norms: a third of its time)
    assert v["coverage"]["unknown_flops_time_fraction"] == pytest.approx(0.0)
    assert 0.3 < v["coverage"]["kernels_with_flops_time_fraction"] < 0.9
    assert any("--model-flops" in n for n in v["notes"])


def test_model_flops_per_step_matches_the_shape_model():
    from .conftest import sample_file

    files = [sample_file("h200x2_ddp/kineto/rank0.pt.trace.json.gz"), sample_file("h200x2_ddp/kineto/rank1.pt.trace.json.gz")]
    shapes = run(files, ranges=["ProfilerStep#*"])
    # (6L−2)·M·d² per step per rank (sample_traces/README.md): the same number given by hand.
    user = run(files, ranges=["ProfilerStep#*"], model_flops=22 * 16384 * 4096**2)
    assert user["achieved_fraction_of_peak"] == pytest.approx(shapes["achieved_fraction_of_peak"], rel=0.01)


def test_elementwise_bytes_give_the_measured_hbm_bandwidth():
    # ../shared/corpus/README.md: phase:memory_bound is 40 x (x.mul_(1.0001).add_(1e-6)) on 1 GiB fp32, and the
    # in-place elementwise pass moves 2 GiB (read + write) at 4.17 TB/s measured outside the profiler.
    res = pipeline.analyse([corpus_file("h200-single-kineto/kineto_single.json.gz")], pipeline.Options())
    rows = res.con.execute("""
        SELECT count(*), sum(k.bytes), sum(k.end_ns - k.start_ns) FROM kernels k JOIN ops o ON o.op_id = k.op_id
        WHERE o.name IN ('aten::mul_', 'aten::add_') AND k.bytes > 1e9""").fetchall()[0]
    n, nbytes, ns = rows
    assert n == 80 and nbytes / n == pytest.approx(2 * 2**30, rel=1e-9)
    assert nbytes / (ns / 1e9) == pytest.approx(4.17e12, rel=0.1)


def test_verdict_thresholds_from_the_config(tmp_path, tiny_trace):
    # The fixture is 20.5% utilized: "idle" under the default 30% threshold, not under 10%.
    assert run([tiny_trace])["verdict"] == "idle"
    cfg = tmp_path / "plasmient.toml"
    cfg.write_text("[verdict]\nidle_utilization = 0.10\n")
    assert run([tiny_trace], rules_config=cfg)["verdict"] != "idle"
    cfg.write_text("[verdict]\nidle_util = 0.1\n")
    from plasmient_report.errors import BadInput

    with pytest.raises(BadInput, match="unknown threshold"):
        run([tiny_trace], rules_config=cfg)


def test_a_first_launch_that_loads_its_module_is_startup_not_launch_bound(tmp_path):
    # Construction: a 100 µs kernel, then the host sits 2 ms inside one launch call (a kernel's first launch loading
    # its module, as TraceLens's MI300X normalization benchmark shows: 332 and 212 ms first launches), and its kernel
    # runs 10 µs after that call returns. The idle 2,010 µs are one-time start-up; a short launch call's gap is
    # still launch-bound (the same trace with a 20 µs call: 20 of its 30 idle µs are in the call).
    def trace(name, call_us):  # type: ignore[no-untyped-def]
        ev = [
            cpu_op("aten::mm", 0.0, 5.0, ext=1, dims=[[64, 64], [64, 64]], types=["float"] * 2),
            launch(1.0, ext=1, corr=1),
            kernel("gemm_kernel", 0.0, 100.0, ext=1, corr=1),
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": 1,
                "ts": 100.0,
                "dur": call_us,
                "args": {"External id": 2, "correlation": 2, "cbid": 211},
            },
            kernel("first_kernel", 110.0 + call_us, 100.0, ext=2, corr=2),
        ]
        return write_trace(tmp_path / name, ev)

    def losses(path):  # type: ignore[no-untyped-def]
        return {x["category"]: x["fraction"] for x in run([path], write_html=False, write_trace=False)["losses"]}

    slow = losses(trace("slow.json", 2000.0))
    window = 110.0 + 2000.0 + 100.0
    assert slow.get("startup") == pytest.approx(2000.0 / window, abs=1e-6)  # the call's time in the gap
    assert "launch_bound" not in slow or slow["launch_bound"] < 1e-6
    fast = losses(trace("fast.json", 20.0))
    assert "startup" not in fast and fast.get("launch_bound", 0.0) > 0.0


def test_model_flops_skip_kernels_known_to_do_no_matmul_and_keep_each_kernels_precision(tmp_path):
    # Construction (the shape of a vLLM MoE step on B200, TraceLens): a bf16 GEMM, an fp8 GEMM and an elementwise
    # kernel, 100 µs each, back to back on an H100 SXM; --model-flops F over the whole profile. Truth: the F
    # FLOPs are the GEMMs' (half each, by time), none the elementwise kernel's; each GEMM is measured against the
    # peak of its own precision (datasheet, dense: bf16 989.4, fp8 1,978.9 TFLOP/s), so achieved =
    # (F/2 / 989.4e12 + F/2 / 1978.9e12) / 300 µs.
    from .conftest import kernel, launch, write_trace

    ev = []
    for i, name in enumerate(
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
            "sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
        )
    ):
        ev += [launch(1.0 + i, ext=i + 1, corr=i + 1), kernel(name, 10.0 + 100.0 * i, 100.0, ext=i + 1, corr=i + 1)]
    f = 1e11
    res = pipeline.analyse(
        [write_trace(tmp_path / "mf.json", ev)], pipeline.Options(write_html=False, write_trace=False, model_flops=f)
    )
    try:
        rows = dict(
            res.con.execute("""SELECT k.name[1:24], coalesce(k.flops, 0) FROM kernels k ORDER BY k.start_ns""").fetchall()
        )
        prec = res.con.execute("SELECT precision FROM kernel_class ORDER BY kernel_id").fetchall()
        v = res.verdict
    finally:
        res.close()
    assert list(rows.values()) == pytest.approx([f / 2, f / 2, 0.0])
    assert [p for (p,) in prec][:2] == ["bf16", "fp8"]
    window_s = v["run"]["window_ns"] / 1e9
    assert v["achieved_fraction_of_peak"] == pytest.approx((f / 2 / 989.4e12 + f / 2 / 1978.9e12) / window_s, rel=1e-6)


def test_the_whole_profiles_time_before_its_first_gpu_work_is_start_up_when_it_holds_the_set_up(tmp_path):
    # Construction (NVIDIA/Fuser's nsys report: 4.1 s of a 7.3 s window pass before the first kernel, the process's
    # CUDA set-up in it): a 1 ms cudaFree(0) (context creation) at t = 0, then nothing traced until the first of
    # 10 × 1 ms kernels at 50 ms, with one 20 ms host gap between the 5th and 6th. Truth: the 50 ms before the GPU's
    # first activity is the program setting up — start-up — and the 20 ms mid-run gap stays host time
    # (host_other); window 50 + 10 + 20 = 80 ms. The same trace without the set-up call (a profile begun mid-run,
    # after the process's start) keeps those 50 ms host time: nothing says they are set-up.
    from .conftest import kernel, launch, write_trace
    from .rules.traces import runtime

    for setup in (True, False):
        ev = [runtime("cudaFree", 0.0, 1_000.0)] if setup else [runtime("cudaStreamIsCapturing", 0.0, 1.0)]
        t = 50_000.0
        for i in range(10):
            ev += [launch(t - 6.0, ext=i + 1, corr=i + 1), kernel("work_kernel", t, 1_000.0, ext=i + 1, corr=i + 1)]
            t += 1_000.0 + (20_000.0 if i == 4 else 0.0)
        v = run([write_trace(tmp_path / f"lead{setup}.json", ev)])
        lost = {x["category"]: x["fraction"] * v["run"]["window_ns"] / 1e6 for x in v["losses"]}  # ms
        assert v["run"]["window_ns"] == pytest.approx(80e6, rel=1e-3)
        if setup:
            assert lost["startup"] == pytest.approx(50.0, abs=0.1)
            assert lost["host_other"] == pytest.approx(20.0, abs=0.1)
        else:
            assert "startup" not in lost
            assert lost["host_other"] == pytest.approx(70.0, abs=0.1)
