"""FLOP models against analytic counts (2 FLOPs per multiply-add)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plasmient_report.flops import op_bytes, op_flops, op_precision


def f(name: str, dims: list, concrete: list | None = None) -> float | None:
    return op_flops(name, json.dumps(dims), json.dumps(concrete) if concrete is not None else None)


def test_mm_family():
    assert f("aten::mm", [[64, 128], [128, 32]]) == 2 * 64 * 128 * 32
    assert f("aten::addmm", [[32], [64, 128], [128, 32], [], []]) == 2 * 64 * 128 * 32
    assert f("aten::bmm", [[8, 64, 128], [8, 128, 32]]) == 2 * 8 * 64 * 128 * 32
    assert f("aten::baddbmm", [[8, 64, 32], [8, 64, 128], [8, 128, 32], [], []]) == 2 * 8 * 64 * 128 * 32


def test_the_other_matmul_class_ops_read_their_operands_where_they_are():
    # argument orders of native_functions.yaml (the dims as torch 2.11's profiler records them, blas_forms' trace)
    mm = 2 * 64 * 128 * 32
    assert f("aten::_int_mm", [[64, 128], [128, 32]]) == mm  # int8 × int8 → int32
    assert f("aten::_addmm_activation", [[32], [64, 128], [128, 32], [], [], []], ["", "", "", "1", "1", "True"]) == mm
    assert f("aten::addmm_", [[64, 32], [64, 128], [128, 32], [], []]) == mm  # in place: what addbmm runs per batch
    assert f("aten::baddbmm_", [[8, 64, 32], [8, 64, 128], [8, 128, 32], [], []]) == 8 * mm
    assert f("aten::addbmm", [[64, 32], [8, 64, 128], [8, 128, 32], [], []]) == 8 * mm  # summed into one 64 × 32
    v2 = [[64, 128], [128, 32], [[]], [], [], [[]], [], [], [], [], [], []]  # scales and recipes after the operands
    assert f("aten::_scaled_mm_v2", v2) == mm
    assert f("aten::mv", [[64, 128], [128]]) == 2 * 64 * 128
    assert f("aten::addmv", [[64], [64, 128], [128], [], []]) == 2 * 64 * 128
    assert f("aten::addmv_", [[64], [64, 128], [128], [], []]) == 2 * 64 * 128
    assert f("aten::dot", [[1000], [1000]]) == 2 * 1000
    assert f("aten::mv", [[64, 128], [64]]) is None and f("aten::dot", [[1000], [999]]) is None  # sizes disagree
    # int4 weight-only (tinygemm): activations [M, K], the weight packed as [N / 8, K / (8 · 16), 32, 8 / 2] int32,
    # group size 128, scales and zeros [K / 128, N, 2] (the dims as torch 2.11 records them: blas_forms' trace)
    int4 = [[16, 8192], [1024, 64, 32, 4], [], [64, 8192, 2]]
    assert f("aten::_weight_int4pack_mm", int4, ["", "", "128", ""]) == 2 * 16 * 8192 * 8192
    assert f("aten::_weight_int4pack_mm", [[16, 8192], [512, 64, 32, 4], [], [64, 8192, 2]]) is None  # N disagrees
    bf16 = json.dumps(["c10::BFloat16", "int", "Scalar", "c10::BFloat16"])
    # activations, scales and output in bf16; the packed weight is N · K / 2 bytes
    packed = 8192 * 8192 // 2
    assert op_bytes("aten::_weight_int4pack_mm", json.dumps(int4), bf16) == 2 * (16 * 8192 + 64 * 8192 * 2 + 16 * 8192) + packed


def test_gemv_dot_and_addbmm_bytes_read_each_operand_and_write_the_output_once():
    bf16 = json.dumps(["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"])
    assert op_bytes("aten::mv", json.dumps([[64, 128], [128]]), bf16) == 2 * (64 * 128 + 128 + 64)
    assert op_bytes("aten::addmv", json.dumps([[64], [64, 128], [128], [], []]), bf16) == 2 * (64 * 128 + 128 + 64)
    assert op_bytes("aten::dot", json.dumps([[1000], [1000]]), json.dumps(["float", "float"])) == 4 * (2 * 1000 + 1)
    addbmm = json.dumps([[64, 32], [8, 64, 128], [8, 128, 32], [], []])
    assert op_bytes("aten::addbmm", addbmm, bf16) == 2 * (8 * 64 * 128 + 8 * 128 * 32 + 64 * 32)
    i8 = json.dumps(["signed char", "signed char"])
    # int8 × int8 → int32 (torch._int_mm's documented output): the output at 4 bytes an element
    assert op_precision(i8) == "int8" and op_bytes("aten::_int_mm", json.dumps([[64, 128], [128, 32]]), i8) == (
        64 * 128 + 128 * 32 + 4 * 64 * 32
    )


# The arguments of the FP8 GEMMs as torch 2.11 recorded them on the H200 (sample_traces/h200_hf: fp8_gemm's
# _scaled_mm, blas_forms' _scaled_mm_v2): e4m3 operands, out_dtype bf16 (ScalarType 15) at 6 / 9.
SCALED_MM = ("aten::_scaled_mm", 8, 6, ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "Scalar", "Scalar"])
SCALED_MM_V2 = ("aten::_scaled_mm_v2", 12, 9, ["c10::Float8_e4m3fn"] * 2 + ["TensorList", "ScalarList"] * 3)


@pytest.mark.parametrize(("name", "n_args", "out_at", "types"), [SCALED_MM, SCALED_MM_V2])
@pytest.mark.parametrize(("out_dtype", "out_elem"), [("15", 2), ("6", 4), ("", 1)])
def test_scaled_mm_bytes_write_the_output_at_its_out_dtype(name, n_args, out_at, types, out_dtype, out_elem):
    m, k, n = 256, 512, 128
    dims = [[m, k], [k, n]] + [[]] * (n_args - 2)
    concrete = [""] * n_args
    concrete[out_at] = out_dtype  # bf16, fp32, or not given: the operands' fp8
    got = op_bytes(name, json.dumps(dims), json.dumps(types), json.dumps(concrete))
    assert got == m * k + k * n + out_elem * m * n


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        # torch._grouped_mm's four forms (torch.nn.functional.grouped_mm's documentation): 8 experts, 4096 routed rows
        ([[4096, 1024], [8, 1024, 2816], [8]], 2 * 4096 * 1024 * 2816),  # rows split by offs: experts' forward
        ([[2816, 4096], [4096, 1024], [8]], 2 * 2816 * 4096 * 1024),  # K split by offs: the experts' weight gradient
        ([[8, 64, 1024], [1024, 512], [8]], 2 * 64 * 1024 * 512),  # columns split: each group's own 64 columns
        ([[8, 64, 1024], [8, 1024, 32]], 2 * 8 * 64 * 1024 * 32),  # a batch
        ([[4096, 1024], [8, 2816, 1024], [8]], None),  # K disagrees: no estimate
        ([[4096], [8, 1024, 2816], [8]], None),
    ],
)
def test_grouped_mm_counts_the_whole_split_dimension(dims, expected):
    assert f("aten::_grouped_mm", dims) == expected
    # the scaled (FP8) forms take the same two operands first; their dtype says the precision
    assert f("aten::_scaled_grouped_mm", [*dims[:2], [4096], [8, 2816]]) == expected
    assert op_precision(json.dumps(["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float"])) == "fp8"


def test_grouped_mm_bytes_read_the_operands_and_write_the_output_once():
    bf16 = json.dumps(["c10::BFloat16", "c10::BFloat16", "int"])
    rows = json.dumps([[4096, 1024], [8, 1024, 2816], [8]])
    assert op_bytes("aten::_grouped_mm", rows, bf16) == 2 * (4096 * 1024 + 8 * 1024 * 2816 + 4096 * 2816)
    wgrad = json.dumps([[2816, 4096], [4096, 1024], [8]])  # one 2816 × 1024 gradient per expert
    assert op_bytes("aten::_grouped_mm", wgrad, bf16) == 2 * (2816 * 4096 + 4096 * 1024 + 8 * 2816 * 1024)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([5], [5], 2 * 5),  # dot
        ([3, 5], [5], 2 * 3 * 5),  # matrix-vector
        ([5], [5, 7], 2 * 5 * 7),  # vector-matrix
        ([2, 3, 4, 5], [5, 6], 2 * 2 * 3 * 4 * 5 * 6),  # batched @ matrix
        ([2, 1, 4, 5], [3, 5, 6], 2 * 2 * 3 * 4 * 5 * 6),  # broadcast batch dims
    ],
)
def test_matmul_broadcasting(a, b, expected):
    assert f("aten::matmul", [a, b]) == expected


def test_linear_counts_all_leading_dims():
    # x [B, T, K] @ Wᵀ [K, N]: 2·B·T·K·N
    assert f("aten::linear", [[8, 1024, 2048], [6144, 2048], [6144]]) == 2 * 8 * 1024 * 2048 * 6144


def test_sdpa_forward_causal_halves_and_backward_is_2_5x():
    q = [8, 16, 1024, 128]
    full = 2 * 8 * 16 * 1024 * 1024 * (128 + 128)  # QKᵀ and PV
    conc = ["", "", "", "0.0", "True", "False", ""]
    assert f("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], []], conc) == full / 2
    conc_nc = ["", "", "", "0.0", "False", "False", ""]
    assert f("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], []], conc_nc) == full
    bwd_conc = [""] * 11 + ["True"] + [""] * 3
    # backward: 5 matmuls of the forward's 2 (dV, dP, dQ, dK and the recomputed QKᵀ), halved when causal
    assert f("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q, q] + [[]] * 10, bwd_conc) == 2.5 * full / 2


# FlashAttention 2's own ops (flash_attn/flash_attn_interface.py, the custom ops since flash_attn 2.6.3): q, k, v are
# (batch, seqlen, heads, head dim); the forward's concrete inputs are (q, k, v, dropout_p, softmax_scale, causal,
# window_size_left, window_size_right, softcap, alibi_slopes, return_softmax).
FA_Q = [2, 512, 16, 64]


def fa_fwd(causal: str, left: int = -1, right: int = -1, q: list | None = None, k: list | None = None) -> float | None:
    q = q or FA_Q
    k = k or q
    concrete = ["", "", "", "0.0", "0.125", causal, str(left), str(right), "0.0", "", "False"]
    return f("flash_attn::_flash_attn_forward", [q, k, k] + [[]] * 8, concrete)


def kept_by_mask(lq: int, s: int, left: int, right: int) -> int:
    """The (query, key) pairs flash_attn's docstring says a query sees: keys i + s − lq − left … i + s − lq + right
    inclusive, -1 no limit; counted on the whole matrix."""
    i = np.arange(lq)[:, None] + s - lq
    j = np.arange(s)[None, :]
    keep = np.ones((lq, s), dtype=bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return int(keep.sum())


def test_flash_attn_forward_and_backward_read_their_own_signatures():
    b, lq, h, d = FA_Q
    full = 2 * b * h * lq * lq * (d + d)  # QKᵀ and PV
    assert fa_fwd("False") == full
    assert fa_fwd("True") == full / 2
    # backward (dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, window_size_left,
    # window_size_right, softcap, alibi_slopes, deterministic, rng_state): q at 1, causal at 11
    bwd = [""] * 9 + ["0.0", "0.125", "True", "-1", "-1", "0.0", "", "False", ""]
    assert f("flash_attn::_flash_attn_backward", [FA_Q] * 5 + [[2, 16, 512]] + [FA_Q] * 3 + [[]] * 9, bwd) == 2.5 * full / 2
    # GQA: 4 key / value heads; the query's 16 do the work
    assert fa_fwd("False", k=[2, 512, 4, 64]) == full


@pytest.mark.parametrize(
    ("causal", "left", "right", "lq", "s"),
    [("True", 128, -1, 512, 512), ("False", 64, 64, 512, 512), ("True", 100, -1, 128, 1024), ("False", -1, 0, 512, 512)],
)
def test_flash_attn_sliding_window_counts_the_pairs_it_keeps(causal, left, right, lq, s):
    b, _, h, d = FA_Q
    got = fa_fwd(causal, left, right, q=[b, lq, h, d], k=[b, s, h, d])
    right_seen = 0 if causal == "True" else right  # flash_attn: causal is a window with right = 0
    assert got == pytest.approx(2 * b * h * (d + d) * kept_by_mask(lq, s, left, right_seen), rel=1e-12)


def test_flash_attn_without_readable_flags_is_unknown():
    # a factor of 2 (causal) rests on the flag: unrecorded, or another signature's value there, is no estimate
    assert f("flash_attn::_flash_attn_forward", [FA_Q] * 3 + [[]] * 8) is None
    assert f("flash_attn::_flash_attn_forward", [FA_Q] * 3 + [[]] * 8, ["", "", "", "0.0", "0.125", "0.5", "-1", "-1"]) is None
    assert f("flash_attn::_flash_attn_forward", [FA_Q] * 3 + [[]] * 8, ["", "", "", "0.0", "0.125", "True"]) is None


def test_gqa_uses_query_heads():
    q, kv = [2, 32, 512, 64], [2, 8, 512, 64]
    assert f("aten::scaled_dot_product_attention", [q, kv, kv]) == 2 * 2 * 32 * 512 * 512 * 128


def test_conv2d_with_stride_padding_groups():
    # x [N=2, C=64, 56, 56], w [128, 64/groups=32, 3, 3], stride 2, pad 1, groups 2 → out 28×28
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2"]
    expected = 2 * 2 * 128 * 28 * 28 * (64 // 2) * 9
    assert f("aten::conv2d", [[2, 64, 56, 56], [128, 32, 3, 3], [128], [], [], [], []], conc) == expected


def test_a_convolution_without_its_stride_and_padding_has_no_estimate():
    # torch <= 1.9 records no concrete inputs: ResNet-50's stem (x [32,3,224,224], w [64,3,7,7], truly stride 2,
    # padding 3 → 112×112, 7.55 GFLOP) would count 218×218 outputs at stride 1 / padding 0 — 28.6 GFLOP, 3.8× over
    # (kineto's resnet50 sample of 2021, V100: its kernels then "ran" at 47 TFLOP/s on a 15.7 TFLOP/s GPU). Unknown.
    assert f("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []]) is None
    assert f("aten::conv2d", [[32, 3, 224, 224], [64, 3, 7, 7], [64], [], [], [], []], ["", "", "", "", "", "", ""]) is None


def test_cudnn_convolution_reads_its_own_argument_order():
    # aten::cudnn_convolution(input, weight, padding, stride, dilation, groups, …) has no bias: padding comes before
    # stride. ResNet-50's stem as Kineto recorded it (sample_traces/h200_hf/resnet50_amp): x [128,3,224,224],
    # w [64,3,7,7], padding 3, stride 2 → out 112×112.
    dims = [[128, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []]
    conc = ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]
    assert f("aten::cudnn_convolution", dims, conc) == 2 * 128 * 64 * 112 * 112 * 3 * 49


def test_conv_transpose_groups_position():
    # conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation): groups at 6
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2", "[1, 1]"]
    x, w = [4, 64, 14, 14], [64, 16, 3, 3]  # weight [C_in, C_out/groups, kH, kW]
    assert f("aten::conv_transpose2d", [x, w, [], [], [], [], [], []], conc) == 2 * 4 * 64 * 14 * 14 * 16 * 9


def test_convolution_backward_is_the_input_and_weight_gradients():
    # torch.utils.flop_counter's convention: grad_input and grad_weight each cost the forward convolution; the
    # output mask says which were asked for. A ResNet-50 1×1 conv as recorded (sample_traces/h200_hf/resnet50_amp).
    dims = [[128, 2048, 7, 7], [128, 512, 7, 7], [2048, 512, 1, 1], [], [], [], [], [], [], [], []]
    fwd = 2 * 128 * 2048 * 7 * 7 * 512
    conc = ["", "", "", "[0]", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    assert f("aten::convolution_backward", dims, conc) == 2 * fwd
    first_layer = conc[:10] + ["[False, True, False]"]  # the stem needs no input gradient
    assert f("aten::convolution_backward", dims, first_layer) == fwd


def test_unknown_or_malformed_is_none():
    assert f("aten::relu", [[10]]) is None
    assert op_flops("aten::mm", "not json") is None
    assert f("aten::mm", [[64, 128], []]) is None


def test_precision_from_first_tensor_dtype():
    assert op_precision('["c10::BFloat16", "c10::BFloat16"]') == "bf16"
    assert op_precision('["", "float", "float"]') == "fp32"
    assert op_precision('["c10::Float8_e4m3fn", "c10::Float8_e4m3fn"]') == "fp8"
