"""PR301 memory-bound-kernel: fires on memory-class kernels with advice that fits what they are — elementwise
kernels at the roofline (the committed memory-bound phase), a GEMM below the ridge, an already-fused compiled
kernel, a kernel whose bandwidth is unknown in a program without PyTorch, a byte estimate above the HBM peak — and is
silent on compute-bound, launch-bound, communication and unknown-FLOP kernels."""

from __future__ import annotations

import pytest

from ...conftest import annotation, cpu_op, kernel, launch, write_trace
from ..expect import Expect, Near, analyse, check, single_phase, truth
from ..traces import runtime, write_gpu_trace

H100_HBM = 3.35e12  # peaks.toml: H100 SXM HBM3


def test_fires_on_the_memory_bound_phase():
    # sample_traces/README.md: 10 × x.mul_(1.0001).add_(1e-6) on 1 GiB fp32; ground_truth.json: 0.867 of the
    # 4.8 TB/s HBM peak (unprofiled).
    t = truth("h200_single/ground_truth.json")["phases"]["phase:memory_bound"]
    hbm = Near(t["expected_fraction_of_hbm_peak"], abs=0.06, truth="ground_truth.json expected_fraction_of_hbm_peak")
    v = single_phase("memory_bound")
    check(
        v,
        [
            Expect(
                "PR301",
                key=k,
                category="memory_bound",
                evidence={
                    "hbm_fraction": hbm,
                    "ops": [op],
                    "kernel_kind": "at_roofline",
                    "count": 10,
                    "bandwidth_above_hbm_peak": False,
                },
                says=[r"torch\.compile", r"with no tensor-core work"],
            )
            for k, op in [(f["key"], f["evidence"]["ops"][0]) for f in v["findings"] if f["rule"] == "PR301"]
        ],
    )
    assert {f["evidence"]["ops"][0] for f in v["findings"] if f["rule"] == "PR301"} == {"aten::mul_", "aten::add_"}


def test_a_gemm_below_the_ridge_is_not_told_to_fuse(tmp_path):
    # Construction: a 1×8192 · 8192×8192 bf16 mm (a GEMV: 2 FLOP per 2-byte weight, ~1 FLOP/B, far below the
    # H100's ridge of ~295) runs 50 µs of a 200 µs window: memory-bound, 25% of the window.
    n = 8192
    ev = [
        annotation("work", 0.0, 200.0),
        cpu_op("aten::mm", 5.0, 10.0, ext=1, dims=[[1, n], [n, n]], types=["c10::BFloat16"] * 2),
        launch(6.0, ext=1, corr=11),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", 100.0, 50.0, ext=1, corr=11),
    ]
    v = analyse([write_trace(tmp_path / "gemv.json", ev)], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR301",
                lost_fraction=Near(0.25, abs=0.01, truth="construction: 50 of 200 µs"),
                evidence={"kernel_kind": "matmul", "ops": ["aten::mm"]},
                says=[r"below the ridge"],
                # an xmma GEMM runs on the tensor cores, memory-bound or not
                never_says=[r"\bfuse (it|aten)", r"torch\.compile", r"no tensor-core work"],
            )
        ],
    )


def test_attention_far_below_the_bandwidth_roof_is_not_told_to_read_fewer_bytes(tmp_path):
    # Construction: SDPA flash attention, B = H = 16, L = S = 559, D = 64, bf16, not causal (a real shape:
    # TraceLens's MI300X / H100 Qwen1.5-0.5B inference traces): 2·16·16·559²·128 = 10.2 GFLOP over Q, K, V and O
    # (4 × 18.3 MB) ≈ 140 FLOP/B, below the H100's ridge of ~295 → memory class. Its kernel takes 1 ms: ≈73 MB/ms =
    # 0.073 TB/s, ~2% of the 3.35 TB/s HBM peak. Neither roof sets its speed, so "fewer KV bytes" would not help.
    b, h, n, d = 16, 16, 559, 64
    qkv = [[b, h, n, d]] * 3
    ev = [
        annotation("work", 0.0, 2000.0),
        cpu_op("aten::_scaled_dot_product_flash_attention", 5.0, 10.0, ext=1, dims=qkv, types=["c10::BFloat16"] * 3),
        launch(6.0, ext=1, corr=11),
        kernel("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", 100.0, 1000.0, ext=1, corr=11),
    ]
    v = analyse([write_trace(tmp_path / "attn.json", ev)], ranges=["work"])
    io_bytes = 4 * b * h * n * d * 2
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={
                    "kernel_kind": "attention_underfed",
                    "hbm_fraction": Near(io_bytes / 1e-3 / H100_HBM, rel=0.05, truth="construction: Q, K, V, O in 1 ms"),
                },
                says=[r"only \d+(\.\d)?% of (the )?HBM bandwidth", r"(?i)more work per launch|larger batch"],
                never_says=[r"fewer KV bytes", r"(?i)batch queries", r"\bfuse"],
            )
        ],
    )


def test_a_compiled_kernel_is_not_fused_again_nor_its_region_named(tmp_path):
    # Construction: an Inductor pointwise kernel launched inside a "Torch-Compiled Region" annotation.
    ev = [
        annotation("work", 0.0, 200.0),
        cpu_op("Torch-Compiled Region: 0/0", 5.0, 20.0, ext=1),
        launch(6.0, ext=1, corr=11),
        kernel("triton_poi_fused_add_mul_0", 100.0, 40.0, ext=1, corr=11),
    ]
    v = analyse([write_trace(tmp_path / "compiled.json", ev)], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={"kernel_kind": "compiled", "ops": [], "launched_in": ["Torch-Compiled Region: 0/0"]},
                says=[r"already a fused kernel"],
                never_says=[r"fuse Torch-Compiled", r"fuse triton"],
            )
        ],
    )


def test_no_pytorch_advice_for_a_program_without_pytorch(tmp_path):
    # Construction: a CUDA program (no framework op, no PyTorch kernel): an elementwise kernel, no shapes.
    ev = [
        runtime("cudaLaunchKernel", 5.0, 3.0, corr=11),
        kernel("elementwise_scale_kernel", 50.0, 100.0, ext=0, corr=11),
        runtime("cudaStreamSynchronize", 9.0, 150.0, corr=12),
    ]
    v = analyse([write_trace(tmp_path / "cuda.json", ev)])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={"kernel_kind": "bandwidth_unknown", "hbm_fraction": None},
                never_says=[r"torch", r"\.item\(\)", r"DataLoader"],
            )
        ],
    )


def test_bandwidth_above_hbm_is_an_estimate_problem(tmp_path):
    # Construction: an elementwise add whose byte model (read two 1 GiB fp32 tensors, write one: 3 GiB) over
    # 0.5 ms implies 6.4 TB/s, above the H100's 3.35 TB/s: flagged, never stated as reached.
    n = 2**28
    ev = [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::add", 10.0, 5.0, ext=1, dims=[[n], [n], []], types=["float", "float", "Scalar"]),
        launch(11.0, 1, 10),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", 100.0, 500.0, ext=1, corr=10
        ),
    ]
    v = analyse([write_trace(tmp_path / "t.json", ev)], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={
                    "bandwidth_above_hbm_peak": True,
                    "hbm_fraction": Near(3 * 2**30 / 0.5e-3 / H100_HBM, rel=0.05, truth="construction: 3 GiB in 0.5 ms"),
                },
                says=[r"estimate problem"],
                never_says=[r"at ≈[0-9.]+ TB/s \(\d+% of HBM\)", r"already at \d+%"],
            )
        ],
    )


def test_silent_on_compute_communication_unknown_and_tiny_kernels(tmp_path):
    check(single_phase("compute_bound"), [], silent=["PR301"])
    check(single_phase("launch_bound"), [], silent=["PR301"])  # ~1 µs kernels: PR501's, not memory-bound
    # DeepEP dispatch / combine kernels (communication) and a GEMM with no shapes (unknown FLOPs): never "fuse".
    ev = [
        annotation("work", 0.0, 400.0),
        launch(2.0, ext=0, corr=11),
        kernel("void deep_ep::intranode::combine<8, 768>(int, void*)", 10.0, 100.0, ext=0, corr=11),
        launch(3.0, ext=0, corr=12),
        kernel("void deep_ep::intranode::dispatch<8, 768>(int, void*)", 120.0, 100.0, ext=0, corr=12),
        cpu_op("aten::mm", 4.0, 5.0, ext=3),
        launch(5.0, ext=3, corr=13),
        kernel("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 230.0, 100.0, ext=3, corr=13),
    ]
    check(analyse([write_trace(tmp_path / "ep.json", ev)], ranges=["work"]), [], silent=["PR301", "PR302"])


CAST = "void quant::per_channel_cast_and_transpose<__nv_bfloat16, __nv_fp8_e4m3>(__nv_bfloat16 const*, unsigned char*)"


def test_data_already_in_fp8_is_not_told_to_use_16_bits(tmp_path):
    # Construction: a CUDA program's cast of bf16 activations to fp8 (the kernel name says so, as DeepSeek's
    # `per_channel_cast_and_transpose` in its published profile does), memory-bound, no shapes: fewer bytes can only
    # come from fusing it — its output is already 8-bit, so "keep it in bf16 / 16 bits" would double its bytes. An
    # fp32 elementwise kernel beside it is still told to use 16 bits.
    ev = [
        runtime("cudaLaunchKernel", 5.0, 3.0, corr=11),
        kernel(
            "void quant::per_channel_cast_and_transpose<__nv_bfloat16, __nv_fp8_e4m3>(__nv_bfloat16 const*, unsigned char*)",
            50.0,
            100.0,
            0,
            11,
        ),
        runtime("cudaLaunchKernel", 10.0, 3.0, corr=12),
        kernel("void elementwise_scale_kernel<float, 4>(float*, float)", 150.0, 90.0, 0, 12),
        runtime("cudaStreamSynchronize", 15.0, 230.0, corr=13),
    ]
    v = analyse([write_trace(tmp_path / "fp8cast.json", ev)])
    check(
        v,
        [
            Expect(
                "PR301",
                key=CAST,
                evidence={"kernel_kind": "bandwidth_unknown", "data_precision": "fp8"},
                never_says=[r"16 bits", r"bf16", r"fp8 where"],
            ),
            Expect(
                "PR301",
                key="void elementwise_scale_kernel<float, 4>(float*, float)",
                evidence={"data_precision": "fp32"},
                says=[r"16 bits"],
            ),
        ],
    )


def test_a_matrix_vector_product_is_told_to_batch_its_vectors():
    # sample_traces/h200_hf/blas_forms, range `mv`: 20 torch.mv of a 16384² bf16 matrix (512 MiB read per call in
    # ~0.155 ms of CUDA-event time: ~3.5 TB/s, most of the H200's 4.8). A GEMV is memory-bound whatever its size:
    # the advice is to batch the vectors into one matmul, not "batch more rows" of a GEMM.
    from ...conftest import sample_file

    v = analyse([sample_file("h200_hf/blas_forms.pt.trace.json.gz")], ranges=["mv"])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={"kernel_kind": "gemv"},
                says=[r"matrix-vector", r"batch (the )?vectors into one matmul"],
                never_says=[r"\bfuse (it|aten)", r"GEMM below the ridge"],
            )
        ],
    )


def _slow_add(blocks: int, grid: list[int] | None = None) -> list[dict]:
    # Construction: an elementwise add reading two 64 MiB fp32 tensors and writing one (192 MiB) in 600 µs, on a
    # grid of `blocks` blocks of 128 threads (as `grid` when given): 0.34 TB/s, 10% of an H100's 3.35 TB/s, 17% of an
    # A100's 2.04 TB/s.
    n = 2**24
    return [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::add", 10.0, 5.0, ext=1, dims=[[n], [n], []], types=["float", "float", "Scalar"]),
        launch(11.0, 1, 10),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >",
            100.0,
            600.0,
            ext=1,
            corr=10,
            grid=grid or [blocks, 1, 1],
            block=[128, 1, 1],
        ),
    ]


@pytest.mark.parametrize(
    "blocks, says",
    [
        # fewer blocks than the H100's 132 SMs: part of the GPU has nothing to do
        (64, r"too few blocks \(64 for 132 SMs: part of the GPU idles\)"),
        # more: every SM has blocks, so it is not their number but the loads in flight per SM, or the access pattern
        (8192, r"too few loads in flight per SM \(8,192 blocks, 62\.1 per SM\) or strided"),
    ],
)
@pytest.mark.parametrize("empty", [False, True])
def test_far_below_the_roofline_says_what_its_grid_tells(tmp_path, blocks, says, empty):
    # `empty`: the grid's y and z written as 0, which count 1 (no launch runs an empty grid), not as no blocks
    n = 2**24
    grid = [blocks, 0, 0] if empty else None
    v = analyse([write_trace(tmp_path / "t.json", _slow_add(blocks, grid))], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={
                    "kernel_kind": "poor_bandwidth",
                    "blocks": blocks,
                    "hbm_fraction": Near(3 * 4 * n / 600e-6 / H100_HBM, rel=0.05, truth="construction: 192 MiB in 600 µs"),
                },
                says=[says],
            )
        ],
    )
    (f,) = [x for x in v["findings"] if x["rule"] == "PR301"]
    assert type(f["evidence"]["blocks"]) is int, f["evidence"]["blocks"]  # (a count of blocks, not 64.0)


def test_a_grid_the_trace_does_not_give_claims_no_blocks(tmp_path):
    # A grid of [0, 0, 0] is no grid (no launch runs an empty one): the blocks are not known, and nothing is said
    # of their number — never "too few blocks (1 …)".
    v = analyse([write_trace(tmp_path / "t.json", _slow_add(64, [0, 0, 0]))], ranges=["work"])
    check(
        v,
        [
            Expect(
                "PR301",
                evidence={"kernel_kind": "poor_bandwidth", "blocks": None},
                says=[r"too few blocks or strided / uncoalesced access"],
                never_says=[r"too few blocks \(", r"blocks, [0-9.]+ per SM"],
            )
        ],
    )


def test_each_ranks_blocks_are_set_against_its_own_gpus_sms(tmp_path):
    # Construction: rank 0 runs the slow add on an H100 (132 SMs) with 120 blocks — 12 SMs idle; rank 1 on an A100
    # (108 SMs) with 8,192. Set against the smaller GPU, 120 blocks would fill it; against its own, they do not.
    paths = [
        write_gpu_trace(tmp_path / "r0.json", _slow_add(120), "NVIDIA H100 80GB HBM3", 132, 9, 0, rank=0),
        write_gpu_trace(tmp_path / "r1.json", _slow_add(8192), "NVIDIA A100-SXM4-80GB", 108, 8, 0, rank=1),
    ]
    check(
        analyse(paths, ranges=["work"]),
        [Expect("PR301", evidence={"blocks": 120}, says=[r"too few blocks \(120 for 132 SMs: part of the GPU idles\)"])],
    )
