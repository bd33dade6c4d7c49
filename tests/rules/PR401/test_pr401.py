"""PR401 matmul-without-tensor-cores: fires on fp32 CUDA-core GEMMs with the fix that fits the GPU (TF32 where it
exists, 16-bit where not) and the program (PyTorch's switches, or cuBLAS's), silent on bf16 tensor-core GEMMs."""

from __future__ import annotations

from ...conftest import annotation, cpu_op, kernel, launch, write_trace
from ..expect import Expect, analyse, check, single_phase
from ..traces import runtime


def _sgemm(tmp_path, gpu: str = "NVIDIA H100 80GB HBM3", pytorch: bool = True):
    # Construction: one 4096³ fp32 mm (1.4e11 FLOP) on a CUDA-core sgemm kernel for 20 ms of a 20.2 ms window:
    # 6.9 TFLOP/s, below the fp32 peak of an H100 (67) and a V100 (15.7).
    n = 4096
    ev = [annotation("step", 0.0, 20_200.0), kernel("ampere_sgemm_128x64_nn", 100.0, 20_000.0, ext=1, corr=11)]
    ev += (
        [cpu_op("aten::mm", 10.0, 20.0, ext=1, dims=[[n, n], [n, n]], types=["float", "float"]), launch(12.0, ext=1, corr=11)]
        if pytorch
        else [runtime("cudaLaunchKernel", 12.0, 3.0, corr=11)]
    )
    return analyse([write_trace(tmp_path / "fp32.json", ev, gpu=gpu)])


def test_fires_with_tf32_advice_on_hopper(tmp_path):
    check(
        _sgemm(tmp_path),
        [
            Expect(
                "PR401",
                category="compute_inefficiency",
                evidence={"kernels.0.kernel": "ampere_sgemm_128x64_nn", "peak_tflops.tf32": lambda x: x and x > 0},
                says=[r"TF32", r"set_float32_matmul_precision"],
            )
        ],
    )


def test_fires_with_fp16_advice_on_volta(tmp_path):
    # peaks.toml: a V100 has no TF32 and no bf16: 16-bit tensor cores are fp16.
    check(
        _sgemm(tmp_path, gpu="Tesla V100-SXM2-32GB"),
        [Expect("PR401", says=[r"fp16"], never_says=[r"enable TF32", r"bf16 autocast"])],
    )


def test_cublas_advice_without_pytorch(tmp_path):
    check(_sgemm(tmp_path, pytorch=False), [Expect("PR401", says=[r"CUBLAS_"], never_says=[r"torch"])])


def test_silent_on_bf16():
    check(single_phase("compute_bound"), [], silent=["PR401"])
    check(single_phase("train_step"), [], silent=["PR401"])


def test_silent_on_fp32_dot_products():
    # sample_traces/h200_hf/blas_forms, the whole profile: bf16 / fp8 / int8 GEMMs below their peaks (compute
    # inefficiency) beside 20 fp32 torch.dot of 2²⁸ elements (cuBLAS dot_kernel + reduce_1Block_kernel, FLOPs
    # known). A dot or matrix-vector product has no tensor-core path: TF32 would not change it, so it is not "fp32
    # on CUDA cores", and the GEMMs' inefficiency is not advised to "enable TF32".
    from ...conftest import sample_file

    v = analyse([sample_file("h200_hf/blas_forms.pt.trace.json.gz")])
    check(v, [], silent=["PR401"])
    assert not any("TF32" in (x["recommendation"] or "") for x in v["losses"])


def test_silent_on_a_cublas_gemv_kernel_of_a_matmul(tmp_path):
    # Construction: an fp32 torch.matmul of a 4096² matrix and a vector runs cuBLAS's gemv kernel (aten::matmul →
    # aten::mv; the outermost modelled op, matmul, owns it): 3.4e7 FLOP in 1 ms, fp32, no tensor-core marker in the
    # name. TF32 would not change a GEMV, so PR401 says nothing of it.
    n = 4096
    ev = [
        annotation("step", 0.0, 2_000.0),
        cpu_op("aten::matmul", 10.0, 30.0, ext=1, dims=[[n, n], [n]], types=["float", "float"]),
        cpu_op("aten::mv", 12.0, 20.0, ext=2, dims=[[n, n], [n]], types=["float", "float"]),
        launch(14.0, ext=2, corr=11),
        kernel("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false>", 100.0, 1_000.0, ext=2, corr=11),
    ]
    check(analyse([write_trace(tmp_path / "gemv.json", ev)], ranges=["step"]), [], silent=["PR401"])
