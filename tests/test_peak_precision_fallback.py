"""The headline precision of a program with no matmul-class kernel comes from its kernels' names: an HPC code on
doubles runs at fp64, not at the bf16 assumed when nothing names one (pipit's public saxpy-mpi and cloverleaf
exports on A100: `saxpy(double *, …)`, `clover::…<double>` kernels, said "precision bf16 assumed"). Where matmuls
run unnamed, their precision stays unknown: a bf16 model's fp32 elementwise kernels do not set it."""

from __future__ import annotations

from .conftest import kernel, launch, write_trace
from .rules.expect import analyse


def _peak(tmp_path, names: list[str]) -> dict:
    ev = []
    for i, name in enumerate(names):
        ev += [launch(10.0 + 200.0 * i, ext=i + 1, corr=i + 1), kernel(name, 20.0 + 200.0 * i, 150.0, ext=i + 1, corr=i + 1)]
    v = analyse([write_trace(tmp_path / "t.json", ev, gpu="NVIDIA A100-SXM4-80GB")], write_html=False, write_trace=False)
    return v["peak"]


def test_a_program_on_doubles_is_measured_at_fp64(tmp_path) -> None:
    peak = _peak(tmp_path, ["saxpy(int, double, double *, double *)"] * 3 + ["reduce_kernel<double>(double *)"])
    assert peak["precision"] == "fp64" and "assumed" not in peak["source"], peak


def test_unnamed_matmuls_keep_the_assumed_precision(tmp_path) -> None:
    # a GEMM kernel whose name says no precision, beside fp32-named elementwise kernels: still assumed, and said so
    names = ["nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"] * 2 + ["vectorized_elementwise_kernel<4, MulFunctor<float> >"] * 3
    peak = _peak(tmp_path, names)
    assert peak["precision"] == "bf16" and "assumed" in peak["source"], peak
