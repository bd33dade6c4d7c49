"""Per step (issue 20): one row per occurrence of the analysed range on each GPU, over its own GPU window, against
truth measured outside the trace — CUDA events recorded in-stream at each profiled step's boundaries
(sample_traces/h200_hf/*.truth.json `steps[].gpu_ms`), the FLOPs FlopCounterMode counted, the two-rank DDP run's
configuration and unprofiled step times (sample_traces/h200x2_ddp/ground_truth.json) — and a synthetic trace whose
slow step is known by construction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plasmient_report import pipeline

from .conftest import ROOT, annotation, cpu_op, kernel, launch, sample_file, write_trace

H200_BF16 = 989.4e12  # the H200's dense bf16 peak (peaks.toml; the truth files use the same figure)
STEP_WINDOW_TOL_NS = 0.5e6  # per-step GPU windows within 0.5 ms of the in-stream CUDA events


def _analyse(paths: list[Path], **kw: object) -> tuple[dict, list[dict]]:
    res = pipeline.analyse(paths, pipeline.Options(**kw))  # type: ignore[arg-type]
    try:
        v = res.verdict
        losses = [
            dict(zip(("label", "rank", "device", "occurrence", "category", "lost_ns"), r, strict=True))
            for r in res.con.execute("SELECT label, rank, device, occurrence, category, lost_ns FROM step_losses").fetchall()
        ]
        return v, losses
    finally:
        res.close()


@pytest.mark.parametrize(
    "workload", ["llama_eager", "llama_compile", "llama_fsdp2", "input_bound", "resnet50_amp", "bert_amp", "vit_compile"]
)
def test_profiler_steps_match_the_cuda_events(workload: str) -> None:
    truth = json.loads(sample_file(f"h200_hf/{workload}.truth.json").read_text())
    v, losses = _analyse([sample_file(f"h200_hf/{workload}.pt.trace.json.gz")])
    steps = v["steps"]
    assert [s["name"] for s in steps] == [t["profiler_step"] for t in truth["steps"]]
    for s, t in zip(steps, truth["steps"], strict=True):
        assert abs(s["gpu_ns"] - t["gpu_ms"] * 1e6) <= STEP_WINDOW_TOL_NS, (s["name"], s["gpu_ns"], t["gpu_ms"])
        assert s["range"] == "ProfilerStep#*" and s["window"] == "gpu"
        # achieved + every category = 1 for each step (its waterfall is its window's)
        lost = sum(x["lost_ns"] for x in losses if x["occurrence"] == s["occurrence"] and x["label"] == s["range"])
        assert s["achieved_fraction_of_peak"] + lost / s["gpu_ns"] == pytest.approx(1.0, abs=1e-6)
    summary = v["step_summary"][0]
    events_ms = [t["gpu_ms"] for t in truth["steps"]]
    assert summary["steps"] == len(events_ms) and summary["ranks"] == 1
    assert summary["mean_ns"] == pytest.approx(sum(events_ms) / len(events_ms) * 1e6, abs=STEP_WINDOW_TOL_NS)
    assert summary["max_ns"] == pytest.approx(max(events_ms) * 1e6, abs=STEP_WINDOW_TOL_NS)


def test_input_bound_steps_keep_their_data_loading() -> None:
    """The DataLoader fetch (host, GPU idle) stays inside its step: 34–35 ms of each ~45 ms step (truth.json)."""
    truth = json.loads(sample_file("h200_hf/input_bound.truth.json").read_text())
    v, losses = _analyse([sample_file("h200_hf/input_bound.pt.trace.json.gz")])
    for s, fetch_ms in zip(v["steps"], truth["fetch_ms"], strict=True):
        assert s["largest_loss"] == "input_bound"
        lost = sum(x["lost_ns"] for x in losses if x["occurrence"] == s["occurrence"] and x["category"] == "input_bound")
        assert lost / 1e6 == pytest.approx(fetch_ms, rel=0.1), (s["name"], lost / 1e6, fetch_ms)


def test_achieved_and_mfu_per_step_match_the_flop_counter() -> None:
    """Eager Llama training: each step's achieved fraction is FlopCounterMode's causal FLOPs over (the step's CUDA-event
    time · peak); with those FLOPs as --model-flops, MFU per step is the same ratio."""
    truth = json.loads(sample_file("h200_hf/llama_eager.truth.json").read_text())
    flops = truth["flops_per_step_causal"]
    tokens = truth["batch"] * truth["seq"]
    v, _ = _analyse([sample_file("h200_hf/llama_eager.pt.trace.json.gz")])
    for s, t in zip(v["steps"], truth["steps"], strict=True):
        expected = flops / (t["gpu_ms"] / 1e3 * H200_BF16)
        assert s["achieved_fraction_of_peak"] == pytest.approx(expected, rel=0.02), s["name"]
        assert not s["achieved_is_lower_bound"]
    v, _ = _analyse(
        [sample_file("h200_hf/llama_eager.pt.trace.json.gz")], model_flops=float(flops), tokens_per_step=float(tokens)
    )
    for s, t in zip(v["steps"], truth["steps"], strict=True):
        assert s["mfu"] == pytest.approx(flops / (t["gpu_ms"] / 1e3 * H200_BF16), rel=0.01), s["name"]
        assert s["tokens_per_s"] == pytest.approx(tokens / (t["gpu_ms"] / 1e3), rel=0.01)
    summary = v["step_summary"][0]
    assert summary["mfu"] == pytest.approx(truth["achieved_truth_causal"], rel=0.01)
    assert summary["tokens_per_step"] == tokens and summary["model_flops"] == flops
    assert summary["tokens_per_s"] == pytest.approx(tokens / (truth["gpu_ms_total"] / 3 / 1e3), rel=0.01)


def test_nsys_steps_are_its_repeating_nvtx_range() -> None:
    """An nsys report without ProfilerStep: its NVTX `train_step` (3 occurrences) is the step, found without --range;
    no shapes, so the achieved fraction is unknown but the step times are not."""
    truth = json.loads(sample_file("h200_hf/llama_nsys.truth.json").read_text())
    v, _ = _analyse([sample_file("h200_hf/llama_nsys.sqlite")])
    steps = v["steps"]
    assert [s["range"] for s in steps] == ["train_step"] * 3
    for s, t in zip(steps, truth["steps"], strict=True):
        assert s["occurrence"] == t["occurrence"]
        assert abs(s["gpu_ns"] - t["gpu_ms"] * 1e6) <= STEP_WINDOW_TOL_NS
        assert s["achieved_fraction_of_peak"] is None and s["largest_loss"] == "unknown_flops"


def test_a_range_occurrence_is_a_step() -> None:
    """--range NAME: its occurrences are the steps (here one each: 20 bf16 GEMMs, then 20 FP8 GEMMs; CUDA events)."""
    truth = json.loads(sample_file("h200_hf/fp8_gemm.truth.json").read_text())["phases"]
    v, _ = _analyse([sample_file("h200_hf/fp8_gemm.pt.trace.json.gz")], ranges=["bf16_gemm", "fp8_gemm"])
    by_range = {s["range"]: s for s in v["steps"]}
    assert set(by_range) == {"bf16_gemm", "fp8_gemm"}
    for name, s in by_range.items():
        assert abs(s["gpu_ns"] - truth[name]["gpu_ms"] * 1e6) <= STEP_WINDOW_TOL_NS, name
    assert [x["range"] for x in v["step_summary"]] == ["bf16_gemm", "fp8_gemm"]


@pytest.fixture(scope="module")
def ddp() -> tuple[dict, dict]:
    truth = json.loads(sample_file("h200x2_ddp/ground_truth.json").read_text())
    v, _ = _analyse([sample_file("h200x2_ddp/kineto")], tokens_per_step=float(truth["config"]["tokens"]))
    return v, truth


def test_ddp_steps_per_rank(ddp: tuple[dict, dict]) -> None:
    """Two ranks × 5 steps; rank 1 sleeps 30 ms on the host every step, so rank 0 waits in the first all-reduce: its
    steps lose most to collective wait (≈ 30 of ≈ 40 ms), rank 1's to the host. Every step's achieved fraction is
    the recorded FLOPs per step over (step · peak); each step lasts about the unprofiled step time with the sleep."""
    v, truth = ddp
    steps = v["steps"]
    assert sorted({s["rank"] for s in steps}) == [0, 1]
    assert all(sum(1 for s in steps if s["rank"] == r) == truth["profiled_steps"] for r in (0, 1))
    wall = {u["rank"]: u["step_wall_ms_median_with_sleep"] for u in truth["unprofiled_per_rank"]}
    late, late_s = truth["late_rank"], truth["late_sleep_s"]
    for s in steps:
        assert s["gpu_ns"] / 1e6 == pytest.approx(wall[s["rank"]], rel=0.05), s
        expected = truth["flops_per_step_per_rank"] / (s["gpu_ns"] / 1e9 * H200_BF16)
        assert s["achieved_fraction_of_peak"] == pytest.approx(expected, rel=0.03), s
        if s["rank"] != late:
            assert s["largest_loss"] == "collective_wait"
            assert s["largest_loss_fraction"] == pytest.approx(late_s / (s["gpu_ns"] / 1e9), abs=0.08)
        else:
            assert s["largest_loss"] != "collective_wait"
    summary = v["step_summary"][0]
    assert summary["ranks"] == 2 and summary["per_rank"] == 5 and summary["steps"] == 10
    assert {r["rank"] for r in summary["by_rank"]} == {0, 1}
    assert summary["slow_step_count"] == 0 and summary["slowest_rank"] is None  # the ranks keep in step
    tokens = truth["config"]["tokens"]
    assert summary["tokens_per_s"] == pytest.approx(tokens / (summary["mean_ns"] / 1e9))
    assert summary["tokens_per_s_all_ranks"] == pytest.approx(2 * summary["tokens_per_s"])


def _steps_trace(path: Path, lengths_us: list[float]) -> Path:
    """ProfilerStep#1… of the given lengths, each launching one 200 µs GEMM at its start; the GPU idles the rest."""
    n = 2048
    ev, t = [], 0.0
    for i, length in enumerate(lengths_us):
        ext = 100 + i
        ev += [
            annotation(f"ProfilerStep#{i + 1}", t, length),
            cpu_op("aten::mm", t + 5, 20.0, ext=ext, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
            launch(t + 8, ext=ext, corr=ext),
            kernel("nvjet_sm90_tst_gemm", t + 30, 200.0, ext=ext, corr=ext),
        ]
        t += length
    return write_trace(path, ev)


def test_the_slow_step_is_flagged(tmp_path: Path) -> None:
    """Five 1 ms steps but the fourth takes 3 ms (by construction): it alone is slow (+200% over the median), the
    slowest, and named in a note; the spread says so."""
    path = _steps_trace(tmp_path / "steps.pt.trace.json", [1000.0, 1000.0, 1000.0, 3000.0, 1000.0])
    v, _ = _analyse([path])
    steps = v["steps"]
    assert [round(s["gpu_ns"] / 1e3) for s in steps] == [1000, 1000, 1000, 3000, 1000]
    assert [s["slow"] for s in steps] == [False, False, False, True, False]
    assert steps[3]["excess_over_median"] == pytest.approx(2.0, abs=1e-6)
    summary = v["step_summary"][0]
    assert summary["slowest"]["name"] == "ProfilerStep#4" and summary["slow_step_count"] == 1
    assert summary["median_ns"] == pytest.approx(1e6, abs=1e3) and summary["spread"] > 0.5
    assert any("ProfilerStep#4" in n and "slower than the median" in n and "outlier step" in n for n in v["notes"])
    # The idle rest of each step is lost to the host: 200 µs of kernel in a 1 ms step is 20% utilization.
    assert steps[0]["utilization"] == pytest.approx(0.2, abs=1e-6)
    assert steps[3]["utilization"] == pytest.approx(200 / 3000, abs=1e-6)


def test_a_slow_first_step_is_said_to_be_warm_up(tmp_path: Path) -> None:
    """The construction above with the first of five steps 3 ms (TraceLens's normalization-layer test trace: each
    layer's first of 3 runs took up to 1,842× the others'): its rank's first step, warm-up, not an outlier."""
    v, _ = _analyse([_steps_trace(tmp_path / "first.pt.trace.json", [3000.0, 1000.0, 1000.0, 1000.0, 1000.0])])
    (note,) = [n for n in v["notes"] if "slower than the median" in n]
    assert "ProfilerStep#1" in note and "its rank's first: warm-up" in note and "outlier" not in note, note


def test_a_trace_without_steps_has_none(tiny_trace: Path) -> None:
    v, _ = _analyse([tiny_trace])
    assert v["steps"] == [] and v["step_summary"] == []  # phase:work occurs once: nothing repeats


def test_the_box_shows_step_time_and_spread(tmp_path: Path) -> None:
    path = _steps_trace(tmp_path / "steps.pt.trace.json", [1000.0, 1000.0, 1000.0, 3000.0, 1000.0])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "plasmient_report.cli",
            str(path),
            "--out",
            str(tmp_path / "out"),
            "--no-html",
            "--no-trace",
            "--tokens-per-step",
            "4096",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"},
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "step time (GPU)" in x)
    assert "1.4 ms" in line and "±" in line and "5 steps" in line  # mean of 1, 1, 1, 3, 1 ms
    assert "ProfilerStep#4" in r.stdout and "tokens/s" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", str(path), "--out", str(tmp_path / "out2"), "--tokens-per-step", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 2 and "--tokens-per-step must be a positive number" in r.stderr


def test_a_repeating_range_that_launches_nothing_is_no_step(tmp_path: Path) -> None:
    """Without ProfilerStep, the repeating range with the most GPU time is the step, but one that launched no GPU
    work (a DataLoader's __next__: a public RTX 2080 Ti trace of PARAM read "step time (GPU) 273.5 ms ← 30 steps of
    enumerate(DataLoader)…", the loader's CPU time) is none: its window is its CPU interval. Construction: three
    3,000 µs DataLoader annotations launching nothing, each followed by a 200 µs `train` annotation launching one
    150 µs kernel."""
    ev = []
    for i in range(3):
        t0 = i * 4000.0
        ev += [annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0, 3000.0)]
        ev += [annotation("train", t0 + 3000.0, 200.0), launch(t0 + 3010.0, ext=i + 1, corr=i + 1)]
        ev += [kernel("k", t0 + 3020.0, 150.0, ext=i + 1, corr=i + 1)]
    v, _ = _analyse([write_trace(tmp_path / "t.json", ev)], write_html=False, write_trace=False)
    assert [s["range"] for s in v["step_summary"]] == ["train"]
    assert all(s["range"] == "train" for s in v["steps"]) and len(v["steps"]) == 3


def test_the_outlier_line_counts_the_slow_steps_once(tmp_path: Path) -> None:
    """Steps of 1, 1, 1, 3 and 2.5 ms (by construction): two are slow; the line names the slowest and counts the
    other one ("1 more"), not both again (8×V100 DLRM: "slowest … ; 4 more than 10% over the median" of 4 slow)."""
    from plasmient_report.render._format import step_outliers_text

    path = _steps_trace(tmp_path / "steps.pt.trace.json", [1000.0, 1000.0, 1000.0, 3000.0, 2500.0])
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert res.typed is not None
        (s,) = res.typed.step_summary
        assert s.slow_step_count == 2
        text = step_outliers_text(s)
    finally:
        res.close()
    assert "slowest ProfilerStep#4" in text and "1 more 10%+ over the median" in text, text


def test_the_summary_is_unknown_when_every_steps_achieved_is(tmp_path: Path) -> None:
    """Steps whose GEMMs have no FLOP estimate (no shapes: `my_op` launches them) have an unknown achieved fraction;
    their summary is unknown too, not 0% (pipit's saxpy-mpi export: each step null, the summary 0.0)."""
    ev, t = [], 0.0
    for i in range(3):
        ext = 100 + i
        ev += [annotation(f"ProfilerStep#{i + 1}", t, 1000.0), cpu_op("my_op", t + 5, 20.0, ext=ext)]
        ev += [launch(t + 8, ext=ext, corr=ext), kernel("nvjet_sm90_tst_gemm", t + 30, 200.0, ext=ext, corr=ext)]
        t += 1000.0
    v, _ = _analyse([write_trace(tmp_path / "unknown.json", ev)], write_html=False, write_trace=False)
    assert [s["achieved_fraction_of_peak"] for s in v["steps"]] == [None] * 3
    assert v["step_summary"][0]["achieved_fraction_of_peak"] is None
