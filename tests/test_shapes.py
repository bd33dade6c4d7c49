"""Per shape (issue 20, TraceLens's view): GEMM / attention / convolution work grouped by op and problem shape, against
truth measured outside the trace — the FP8 GEMM recording's CUDA-event TFLOP/s (sample_traces/h200_hf/fp8_gemm),
the attention recording's cases and their Nsight Compute tensor-op counts (sample_traces/h200_attention/README.md),
the Llama training recording's configuration (llama_eager.truth.json) — and op shapes read by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plasmient_report import pipeline
from plasmient_report.flops import op_shape

from .conftest import cpu_op, kernel, launch, sample_file, write_trace

H200 = {"bf16": 989.4e12, "fp8": 1978.9e12}  # dense peaks (peaks.toml), as the truth files use them


def _verdict(paths: list[Path], **kw: object) -> dict:
    res = pipeline.analyse(paths, pipeline.Options(**kw))  # type: ignore[arg-type]
    try:
        return res.verdict
    finally:
        res.close()


def test_fp8_and_bf16_gemms_against_cuda_events() -> None:
    """20 × bf16 mm and 20 × FP8 _scaled_mm, M = N = K = 8192. The truth's TFLOP/s is over CUDA-event time, which
    holds the launch gaps between the GEMMs; ours is over the kernels' own time: at least the truth, within 5%. Each is
    measured against the peak of its own precision."""
    truth = json.loads(sample_file("h200_hf/fp8_gemm.truth.json").read_text())
    v = _verdict([sample_file("h200_hf/fp8_gemm.pt.trace.json.gz")])
    shapes = {s["op"]: s for s in v["shapes"]}
    cases = {"aten::mm": ("bf16_gemm", "BFloat16"), "aten::_scaled_mm": ("fp8_gemm", "Float8_e4m3fn")}
    assert set(cases) <= set(shapes)
    for op, (phase, dtype) in cases.items():
        s, t = shapes[op], truth["phases"][phase]
        assert s["family"] == "gemm" and (s["m"], s["n"], s["k"]) == (truth["M"], truth["N"], truth["K"])
        assert s["shape"] == "M=8192 N=8192 K=8192" and s["batch"] == 1
        assert s["calls"] == truth["reps"] and s["dtype"] == dtype and s["precision"] == t["precision"]
        assert s["flops"] == pytest.approx(t["flops"], rel=1e-9)  # 2·M·N·K per call
        assert s["time_ns"] <= t["gpu_ms"] * 1e6 <= s["time_ns"] * 1.05
        tflops = s["achieved_flop_s"] / 1e12
        assert t["tflops"] <= tflops <= t["tflops"] * 1.05, (op, tflops, t["tflops"])
        assert s["fraction_of_peak"] == pytest.approx(s["achieved_flop_s"] / H200[t["precision"]], rel=1e-6)
        assert t["achieved_truth"] <= s["fraction_of_peak"] <= t["achieved_truth"] * 1.05
        assert s["bound"] == "compute" and s["layout"]  # nvjet names spell the transposes (…_NNT, …_TNN)


def test_attention_cases_and_their_flops() -> None:
    """The five SDPA cases of the attention recording (README: B, Hq, Hkv, L, S, D, causal), forward and backward
    (`full` and `cudnn` share one forward shape: two calls). Their FLOPs here come from Nsight Compute; for the
    non-causal cases the README measured ncu's count within 1.5% of 2·B·Hq·L·S·2D (forward) and 2.5× that
    (backward) per call."""
    cases = [
        (4, 16, 16, 2048, 2048, 128, False),
        (4, 16, 16, 2048, 2048, 128, True),
        (4, 32, 8, 2048, 2048, 128, False),
        (4, 16, 16, 1024, 2048, 64, False),
    ]
    v = _verdict([sample_file("h200_attention")])
    att = [s for s in v["shapes"] if s["family"] == "attention"]
    for b, h, hk, lq, s_len, d, causal in cases:
        rows = [
            s
            for s in att
            if (s["batch"], s["heads"], s["kv_heads"], s["q_len"], s["kv_len"], s["head_dim"], s["causal"])
            == (b, h, hk, lq, s_len, d, causal)
        ]
        assert {r["pass"] for r in rows} == {"forward", "backward"}, (b, h, hk, lq, s_len, d, causal, att)
        if causal:
            continue
        fwd = 2.0 * b * h * lq * s_len * 2 * d
        for r in rows:
            model = fwd * (2.5 if r["pass"] == "backward" else 1.0)
            assert r["flops"] / r["calls"] == pytest.approx(model, rel=0.02), r
            assert r["bound"] == "compute"
    gqa = next(s for s in att if s["heads"] == 32)
    assert gqa["shape"].startswith("B=4 H=32/8 L=2048 S=2048 D=128")


def test_llama_shapes_follow_its_config() -> None:
    """Eager Llama training (config in truth.json: 8 layers, hidden 2048, intermediate 5632, 16 heads, seq 2048,
    batch 8, 3 steps): the MLP's up/gate projections are 2 linears per layer per step of M = batch·seq, K = hidden,
    N = intermediate; attention is one causal SDPA per layer per step."""
    truth = json.loads(sample_file("h200_hf/llama_eager.truth.json").read_text())
    c, steps = truth["config"], truth["profiled_steps"]
    tokens, layers = truth["batch"] * truth["seq"], c["num_hidden_layers"]
    v = _verdict([sample_file("h200_hf/llama_eager.pt.trace.json.gz")], ranges=["ProfilerStep#*"])
    shapes = v["shapes"]
    up = next(
        s
        for s in shapes
        if s["op"] == "aten::linear" and (s["m"], s["n"], s["k"]) == (tokens, c["intermediate_size"], c["hidden_size"])
    )
    assert up["calls"] == 2 * layers * steps
    fwd = next(s for s in shapes if s["family"] == "attention" and s["pass"] == "forward")
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    assert (fwd["batch"], fwd["heads"], fwd["kv_heads"], fwd["q_len"], fwd["kv_len"], fwd["head_dim"], fwd["causal"]) == (
        truth["batch"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        truth["seq"],
        truth["seq"],
        head_dim,
        True,
    )
    assert fwd["calls"] == layers * steps
    # per call: 2·B·H·L·S·2D halved (causal), the convention of the truth's flops_per_step_causal
    assert fwd["flops"] / fwd["calls"] == pytest.approx(
        2.0 * truth["batch"] * c["num_attention_heads"] * truth["seq"] ** 2 * 2 * head_dim * 0.5, rel=1e-9
    )
    assert all(s["time_share"] <= 1 for s in shapes) and v["coverage"]["shapes"] >= len(shapes)


def test_resnet50_convolutions_against_the_flop_counter() -> None:
    """torchvision ResNet-50 (batch 128, 224², bf16 autocast; truth.json): the convolution shapes' FLOPs over the
    three profiled steps are FlopCounterMode's aten.convolution and aten.convolution_backward per step, × 3; the stem
    is one 7×7 / stride 2 / pad 3 convolution of the 3-channel image per step."""
    truth = json.loads(sample_file("h200_hf/resnet50_amp.truth.json").read_text())
    steps, batch, image = truth["profiled_steps"], truth["batch"], truth["image"]
    v = _verdict([sample_file("h200_hf/resnet50_amp.pt.trace.json.gz")], ranges=["ProfilerStep#*"])
    res = pipeline.analyse([sample_file("h200_hf/resnet50_amp.pt.trace.json.gz")], pipeline.Options(ranges=["ProfilerStep#*"]))
    try:
        rows = res.con.execute(
            "SELECT pass, sum(flops) FROM shape_roofline('range', 'ProfilerStep#*') WHERE family = 'conv' GROUP BY pass"
        ).fetchall()
    finally:
        res.close()
    by_pass = dict(rows)
    assert by_pass["forward"] == pytest.approx(truth["flops_by_op"]["aten.convolution"] * steps, rel=0.01)
    assert by_pass["backward"] == pytest.approx(truth["flops_by_op"]["aten.convolution_backward"] * steps, rel=0.01)
    stem = next(
        s
        for s in v["shapes"]
        if s["family"] == "conv" and s["pass"] == "forward" and s["conv_input"] == f"{batch}×3×{image}×{image}"
    )
    assert (stem["conv_weight"], stem["stride"], stem["padding"], stem["groups"], stem["calls"]) == (
        "64×3×7×7",
        "2×2",
        "3×3",
        1,
        steps,
    )


def test_a_shapes_caller_is_the_op_that_called_most_of_it_annotations_passed_over(tmp_path: Path) -> None:
    """Construction: one 1024³ bf16 GEMM shape, called three times by a `decoder_block` range (30 µs each, 90 µs)
    and once straight from the profiler step (50 µs, its longest kernel); a second shape (2048³) only from the step.
    The caller is the op with most of the shape's time — `decoder_block`, 90 of 140 µs — not the step marker around
    it; a shape with no caller but the step has none. The second shape's op also runs a 100 µs transpose beside its
    60 µs GEMM: most of its time (kernel, class) is the transpose's, its bound is its GEMM's."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_execute_kernel__5x_cublas"
    # (torch 1.x records the step as a CPU op, as kineto's and TensorBoard's ResNet-50 samples have it)
    ev: list[dict] = [cpu_op("ProfilerStep#1", 0.0, 1000.0, ext=0), cpu_op("decoder_block", 1.0, 300.0, ext=0)]

    def mm(t: float, n: int, dur: float, ext: int) -> list[dict]:
        return [
            cpu_op("aten::mm", t, 5.0, ext=ext, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
            launch(t + 1.0, ext=ext, corr=ext),
            kernel(gemm, 400.0 + 100.0 * ext, dur, ext=ext, corr=ext, grid=[64, 1, 1], block=[384, 1, 1]),
        ]

    for i in range(3):
        ev += mm(10.0 + 10 * i, 1024, 30.0, ext=1 + i)
    ev += mm(320.0, 1024, 50.0, ext=4) + mm(340.0, 2048, 60.0, ext=5)
    # the 2048³ GEMM's op also runs a layout transpose (no FLOPs) longer than the GEMM: most of the shape's time
    ev += [launch(343.0, ext=5, corr=6), kernel("batched_transpose_32x32_half", 1200.0, 100.0, ext=5, corr=6)]
    ev.sort(key=lambda e: e["ts"])
    shapes = {s["shape"]: s for s in _verdict([write_trace(tmp_path / "callers.json", ev)])["shapes"]}
    small, large = shapes["M=1024 N=1024 K=1024"], shapes["M=2048 N=2048 K=2048"]
    assert (small["calls"], small["time_ns"]) == (4, 140_000)
    assert small["parent_op"] == "decoder_block"
    assert large["parent_op"] is None
    # the kernel and the class of most of its time are the transpose's (100 of 160 µs); its bound is its math's
    assert (large["kernel"], large["kernel_class"]) == ("batched_transpose_32x32_half", "memory")
    assert large["bound"] == "compute"


def test_no_shapes_without_input_shapes() -> None:
    v = _verdict([sample_file("h200_hf/llama_nsys.sqlite")])  # nsys, no emit_nvtx: no shapes at all
    assert v["shapes"] == [] and v["coverage"]["shapes"] == 0


def test_op_shapes_read_by_hand() -> None:
    s = op_shape("aten::linear", "[[8,2048,2048],[5632,2048],[]]")
    assert s and (s["family"], s["m"], s["n"], s["k"], s["batch"]) == ("gemm", 16384, 5632, 2048, 1)
    s = op_shape("aten::addmm", "[[5632],[16384,2048],[2048,5632]]")
    assert s and (s["m"], s["n"], s["k"]) == (16384, 5632, 2048)
    s = op_shape("aten::bmm", "[[12,1024,64],[12,64,1024]]")
    assert s and (s["batch"], s["m"], s["n"], s["k"]) == (12, 1024, 1024, 64)
    s = op_shape("aten::matmul", "[[8,2048,2048],[2048,5632]]")  # a batch against a matrix: one GEMM
    assert s and (s["batch"], s["m"], s["n"], s["k"]) == (1, 16384, 5632, 2048)
    s = op_shape("aten::matmul", "[[8,16,128,64],[8,16,64,128]]")  # batched: 8·16 GEMMs of 128×128×64
    assert s and (s["batch"], s["m"], s["n"], s["k"]) == (128, 128, 128, 64)
    s = op_shape(
        "aten::scaled_dot_product_attention",
        "[[2,32,512,128],[2,8,512,128],[2,8,512,128],[],[],[],[],[]]",
        '["","","","","0.","True","",""]',
    )
    assert s and (s["heads"], s["kv_heads"], s["q_len"], s["head_dim"], s["causal"], s["pass"]) == (
        32,
        8,
        512,
        128,
        True,
        "forward",
    )
    s = op_shape("aten::conv2d", "[[32,64,56,56],[128,32,3,3],[128],[],[],[],[]]", '["","","","[2, 2]","[1, 1]","[1, 1]","2"]')
    assert s and (s["family"], s["conv_input"], s["conv_weight"], s["stride"], s["padding"], s["groups"]) == (
        "conv",
        "32×64×56×56",
        "128×32×3×3",
        "2×2",
        "1×1",
        2,
    )
    s = op_shape(
        "aten::convolution",
        "[[1,3,224,224],[64,3,7,7],[],[],[],[],[],[],[]]",
        '["","","","[2, 2]","[3, 3]","[1, 1]","False","[0, 0]","1"]',
    )
    assert s and (s["stride"], s["padding"], s["transposed"], s["groups"]) == ("2×2", "3×3", False, 1)
    assert op_shape("aten::mm", "[[16384,2048]]") is None and op_shape("aten::add", "[[4],[4]]") is None
    assert op_shape("aten::mm", "not json") is None
