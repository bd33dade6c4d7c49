"""PR402 gemm-wave-quantization: fires on a GEMM one tile past a whole wave, on a convolution counted as its
implicit GEMM (its fix naming cuDNN / MIOpen, which chose it), on a ROCm GEMM whose grid is in work-items or blocks
(its launch call's unit); silent on a large square GEMM and on a convolution whose
blocks fill whole waves."""

from __future__ import annotations

import pytest

from ...conftest import annotation, cpu_op, kernel, launch, write_trace
from ..expect import Expect, Near, analyse, check, single_phase
from ..traces import write_gpu_trace

HOPPER_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
ONE_PER_SM = {"registers per thread": 168, "shared memory": 200000}  # 200 kB of shared memory: one block per SM


# (a grid dimension written as 0 counts 1: no launch runs an empty grid)
@pytest.mark.parametrize("grid", [[143, 1, 1], [143, 0, 0]])
def test_fires_one_tile_past_a_wave(tmp_path, grid):
    # Construction: a 1664×1408 output in 128×128 tiles = 13·11 = 143 tiles, one block per SM on 132 SMs: 1.08
    # waves, the second nearly empty → 143 / 264 = 54% efficient.
    m, k, n = 1664, 8192, 1408
    ev = [
        annotation("step", 0.0, 130.0),
        cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[m, k], [k, n]], types=["c10::BFloat16"] * 2),
        launch(2.0, ext=1, corr=11),
        kernel(HOPPER_GEMM, 10.0, 100.0, ext=1, corr=11, grid=grid, block=[384, 1, 1], **ONE_PER_SM),
    ]
    check(
        analyse([write_trace(tmp_path / "waves.json", ev)]),
        [
            Expect(
                "PR402",
                category="compute_inefficiency",
                evidence={
                    "gemms.0.units": 143,
                    "gemms.0.slots": 132,
                    "gemms.0.shape": "gemm",
                    "gemms.0.waves": Near(143 / 132, rel=1e-9, truth="construction"),
                    "gemms.0.efficiency": Near(143 / 264, rel=1e-9, truth="construction: 143 of 2 × 132 slots"),
                },
            )
        ],
    )


def test_a_narrow_gemm_is_named_by_its_tile_padding_not_its_waves(tmp_path):
    # Construction: a 4224×400 output (compute-bound: K = 8192) in 128×128 tiles = 33 × 4 = 132 tiles, one block per
    # SM on 132 SMs: one whole wave (100% wave efficiency), but the last tile of each row computes 16 of its 128
    # columns → 400 / 512 of the padded area is used. What loses the time is the padding; a title blaming the waves
    # would send the user to the wrong fix (a real case: an A100 DLRM trace's bmm with N = 30 on 64-wide tiles,
    # HTA's trace_diff test trace).
    m, k, n = 4224, 8192, 400
    ev = [
        annotation("step", 0.0, 130.0),
        cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[m, k], [k, n]], types=["c10::BFloat16"] * 2),
        launch(2.0, ext=1, corr=11),
        kernel(HOPPER_GEMM, 10.0, 100.0, ext=1, corr=11, grid=[132, 1, 1], block=[384, 1, 1], **ONE_PER_SM),
    ]
    check(
        analyse([write_trace(tmp_path / "narrow.json", ev)]),
        [
            Expect(
                "PR402",
                category="compute_inefficiency",
                evidence={
                    "gemms.0.wave_efficiency": Near(1.0, rel=1e-9, truth="construction: 132 tiles on 132 slots"),
                    "gemms.0.padding_efficiency": Near(400 / 512, rel=1e-9, truth="construction: 400 of 512 columns"),
                },
                says=[r"(?i)padding", r"(?i)tile"],
                never_says=[r"(?i)wave quantization", r"whole waves"],
            )
        ],
    )


def test_a_convolution_is_its_implicit_gemm(tmp_path):
    # Construction: a 3×3 convolution, input [1, 1024, 143, 128], 128 filters, stride 1, padding 1 (compute-bound:
    # K = 1024·9): the implicit GEMM is M = 1·143·128 = 18304 output pixels by N = 128 channels = 143 × 1 tiles of
    # 128×128 — one past a wave of 132, as above (the conv's dims read as matrices would give absurd tile counts).
    ev = [
        annotation("step", 0.0, 130.0),
        cpu_op(
            "aten::conv2d",
            1.0,
            5.0,
            ext=1,
            dims=[[1, 1024, 143, 128], [128, 1024, 3, 3], [], [], [], [], []],
            types=["c10::BFloat16"] * 2 + [""] * 5,
            **{"Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]},
        ),
        launch(2.0, ext=1, corr=11),
        kernel(
            "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
            10.0,
            100.0,
            ext=1,
            corr=11,
            grid=[143, 1, 1],
            block=[384, 1, 1],
            **ONE_PER_SM,
        ),
    ]
    check(
        analyse([write_trace(tmp_path / "conv.json", ev)]),
        [
            Expect(
                "PR402",
                evidence={
                    "gemms.0.shape": "conv",
                    "gemms.0.units": 143,
                    "gemms.0.tile": [128, 128],
                    "gemms.0.efficiency": Near(143 / 264, rel=1e-9, truth="construction"),
                    "gemms.0.padding_efficiency": Near(1.0, abs=1e-9, truth="18304 and 128 are multiples of 128"),
                },
                # a convolution's algorithm is cuDNN's to choose, not cuBLASLt's
                says=[r"cuDNN's benchmark mode", r"another algorithm"],
                never_says=[r"cuBLAS", r"split-K"],
            )
        ],
    )


def _hip_call(call: str, ts: float, ext: int, corr: int) -> dict:
    """A HIP launch call (its name decides the grid's unit), as ROCm's Kineto traces record it."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": call,
        "pid": 100,
        "tid": 1,
        "ts": ts,
        "dur": 2.0,
        "args": {"External id": ext, "correlation": corr},
    }


def _rocm_gemm(tmp_path, launch: str, grid_x: int, also: tuple[str, int] | None = None):
    # Construction: an MI300X (304 CUs); a 2560×4096 · 4096×2048 bf16 GEMM in 128×128 tiles = 20·16 = 320
    # workgroups of 256 work-items, launched by `launch` with a grid of `grid_x`, for 250 µs. `also`: then a
    # 1280×4096 · 4096×2048 one (10·16 = 160 workgroups) launched by also[0] with a grid of also[1], for 200 µs.
    def gemm(t: float, m: int, call: str, grid: int, dur: float, ext: int) -> list[dict]:
        k, n = 4096, 2048
        return [
            cpu_op("aten::mm", t + 1.0, 5.0, ext=ext, dims=[[m, k], [k, n]], types=["c10::BFloat16"] * 2),
            _hip_call(call, t + 2.0, ext, corr=10 + ext),
            kernel(
                "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1_SN_LDSB0",
                t + 10.0,
                dur,
                ext=ext,
                corr=10 + ext,
                grid=[grid, 1, 1],
                block=[256, 1, 1],
            ),
        ]

    ev = [annotation("step", 0.0, 600.0 if also else 300.0), *gemm(0.0, 2560, launch, grid_x, 250.0, 1)]
    if also:
        ev += gemm(300.0, 1280, *also, 200.0, 2)
    return write_gpu_trace(tmp_path / "rocm.json", ev, gpu="AMD Instinct MI300X", sms=304, major=9, minor=4, warp=64, rocm=True)


@pytest.mark.parametrize(
    "launch, grid_x, unit",
    [
        # hipBLASLt launches its Tensile GEMMs with a global work size: the grid counts work-items
        ("hipExtModuleLaunchKernel", 320 * 256, "work-items (HIP)"),
        # hipLaunchKernel (CK, PyTorch's kernels) and hipModuleLaunchKernel (Triton) take the grid in blocks
        ("hipLaunchKernel", 320, "blocks (HIP)"),
        ("hipModuleLaunchKernel", 320, "blocks (HIP)"),
    ],
)
def test_a_rocm_grid_in_its_launch_calls_unit(tmp_path, launch, grid_x, unit):
    # 320 workgroups on 304 CUs leave the second wave nearly empty whatever the occupancy (the trace gives no
    # registers / LDS): at best 320 / 608 = 53%.
    check(
        analyse([_rocm_gemm(tmp_path, launch, grid_x)]),
        [
            Expect(
                "PR402",
                evidence={
                    "gemms.0.grid_unit": unit,
                    "gemms.0.units": 320,
                    "gemms.0.occupancy_known": False,
                    "gemms.0.efficiency": Near(320 / 608, rel=1e-6, truth="construction: 320 of 2 × 304 slots"),
                },
                # AMD's words: compute units, hipBLASLt (not SMs, cuBLASLt)
                says=[r"304 CUs", r"hipBLASLt"],
                never_says=[r"\bSMs?\b", r"cuBLAS"],
            )
        ],
    )


def test_each_gemm_in_its_own_grid_unit(tmp_path):
    # One trace, two launch paths (hipBLASLt's work-item grid, then a block grid): each GEMM is read, and said, in
    # its own unit — 320 and 160 workgroups (160 of 304 CUs: 53%).
    paths = [_rocm_gemm(tmp_path, "hipExtModuleLaunchKernel", 320 * 256, also=("hipLaunchKernel", 160))]
    check(
        analyse(paths),
        [
            Expect(
                "PR402",
                evidence={
                    "gemms.0.grid_unit": "work-items (HIP)",
                    "gemms.0.units": 320,
                    "gemms.1.grid_unit": "blocks (HIP)",
                    "gemms.1.units": 160,
                    "gemms.1.efficiency": Near(160 / 304, rel=1e-6, truth="construction: 160 of 304 slots"),
                },
            )
        ],
    )


def test_an_amd_convolution_names_miopen(tmp_path):
    # Construction: a weight-gradient convolution on an MI300X (304 CUs), CK's / MIOpen's implicit-GEMM kernel
    # (the name HTA's MI300 ResNet trace has) with 320 blocks of 256 (hipLaunchKernel: the grid is in blocks). Its
    # output size is not in the trace, so the blocks alone count: at best 320 / 608 = 53% whatever the occupancy.
    # The fix names the library that chose this kernel (MIOpen), not hipBLASLt, which never ran it.
    ev = [
        annotation("step", 0.0, 300.0),
        cpu_op(
            "aten::convolution_backward",
            1.0,
            5.0,
            ext=1,
            dims=[[64, 256, 56, 56], [64, 256, 56, 56], [256, 256, 3, 3], [], [], [], [], [], [], [], []],
            types=["c10::BFloat16"] * 3 + [""] * 8,
            # stride 1, padding 1, dilation 1, not transposed, 1 group; the weight's gradient only
            **{"Concrete Inputs": ["", "", "", "[256]", *["[1, 1]"] * 3, "False", "[0, 0]", "1", "[False, True, False]"]},
        ),
        _hip_call("hipLaunchKernel", 2.0, ext=1, corr=11),
        kernel("kernel_batched_gemm_xdlops_bwd_weight", 10.0, 250.0, ext=1, corr=11, grid=[320, 1, 1], block=[256, 1, 1]),
    ]
    path = write_gpu_trace(tmp_path / "conv.json", ev, gpu="AMD Instinct MI300X", sms=304, major=9, minor=4, warp=64, rocm=True)
    check(
        analyse([path]),
        [
            Expect(
                "PR402",
                evidence={
                    "gemms.0.shape": "blocks",
                    "gemms.0.units": 320,
                    "gemms.0.efficiency": Near(320 / 608, rel=1e-6, truth="construction: 320 of 2 × 304 slots"),
                },
                says=[r"MIOpen", r"304 CUs"],
                never_says=[r"hipBLASLt", r"cuDNN", r"split-K"],
            )
        ],
    )


def test_silent_on_a_gemm_without_a_grid(tmp_path):
    # The GEMM of test_fires_one_tile_past_a_wave with a grid of [0, 0, 0]: no grid in the trace, no waves to count.
    m, k, n = 1664, 8192, 1408
    ev = [
        annotation("step", 0.0, 130.0),
        cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[m, k], [k, n]], types=["c10::BFloat16"] * 2),
        launch(2.0, ext=1, corr=11),
        kernel(HOPPER_GEMM, 10.0, 100.0, ext=1, corr=11, grid=[0, 0, 0], block=[384, 1, 1], **ONE_PER_SM),
    ]
    v = analyse([write_trace(tmp_path / "nogrid.json", ev)])
    check(v, [], silent=["PR402"])
    assert not any("PR402" in n for n in v["notes"]), v["notes"]  # (not a rule that failed and was skipped)


def test_silent_on_whole_waves(tmp_path):
    # 8192³ with 320×128 persistent tiles: 1664 tiles = 12.6 waves on 132 SMs (≈ 96% efficient).
    check(single_phase("compute_bound"), [], silent=["PR402"])
    # A convolution whose stride is not in the trace: only its blocks count — 784 × 4 blocks of 128 threads fill
    # 132 SMs in ≥ 96% whole waves at every occupancy the threads allow, so nothing is said.
    ev = [
        annotation("step", 0.0, 300.0),
        cpu_op(
            "aten::conv2d",
            1.0,
            5.0,
            ext=1,
            dims=[[32, 64, 56, 56], [256, 64, 1, 1], [], [], [], [], []],
            types=["c10::BFloat16"] * 2 + [""] * 5,
        ),
        launch(2.0, ext=1, corr=11),
        kernel(
            "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x32",
            10.0,
            250.0,
            ext=1,
            corr=11,
            grid=[784, 4, 1],
            block=[128, 1, 1],
        ),
    ]
    check(analyse([write_trace(tmp_path / "conv_blocks.json", ev)]), [], silent=["PR402"])


def test_in_place_and_epilogue_gemms_read_their_operands_after_self():
    # addmm_ (what addbmm runs per batch) and _addmm_activation take `self` first, as addmm does: M and N come
    # from mat1 and mat2 (the dims as torch 2.11's profiler records them)
    from plasmient_report.rules.kernel.gemm_wave_quantization import gemm_mnb

    dims = "[[4096, 1024], [4096, 2048], [2048, 1024], [], []]"
    assert gemm_mnb("aten::addmm_", dims) == gemm_mnb("aten::addmm", dims) == (4096, 1024, 1)
    assert gemm_mnb("aten::_addmm_activation", "[[1024], [4096, 2048], [2048, 1024], [], [], []]") == (4096, 1024, 1)
    assert gemm_mnb("aten::_int_mm", "[[4096, 2048], [2048, 1024]]") == (4096, 1024, 1)
