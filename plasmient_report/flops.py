"""FLOP models of ops from their input shapes and dtypes (SPEC §4, step 2).

Each model takes the op's input dims (a list, one entry per argument) and concrete inputs and returns
the op's FLOPs, counting a multiply-add as 2 FLOPs. Conventions: bias adds and softmax are not counted;
attention counts the two matmuls (QKᵀ and PV), halved when causal, and its backward 2.5x the forward
(dQ, dK, dV, dP and the recomputed scores): the FLOPs the kernels execute, as FlashAttention's do — the
achieved fraction of peak is about the silicon's work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .vocab import DTYPE_PRECISION, ELEMENT_BYTES, EXTRA_ELEMENT_BYTES, SCALAR_TYPE_BYTES

__all__ = [
    "ATTENTION_OPS",
    "BOOL_OUTPUT_OPS",
    "BYTE_MODELS",
    "CONV_OPS",
    "DTYPE_PRECISION",
    "ELEMENT_BYTES",
    "GEMM_OPS",
    "GEMV_OPS",
    "MATMUL_OPS",
    "MODELS",
    "SHAPE_FIELDS",
    "element_bytes",
    "op_bytes",
    "op_flops",
    "op_precision",
    "op_shape",
    "op_traffic_bytes",
]

Dims = list[Any]


def _shape(x: Any) -> list[int] | None:
    if isinstance(x, list) and all(isinstance(v, int) for v in x):
        return x
    return None


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


def mm(d: Dims) -> float | None:
    a, b = _shape(d[0]), _shape(d[1])
    if not a or not b or len(a) != 2 or len(b) != 2:
        return None
    return 2.0 * a[0] * a[1] * b[1]


def addmm(d: Dims) -> float | None:
    if len(d) < 3:
        return None
    return mm(d[1:3])


def bmm(d: Dims) -> float | None:
    a, b = _shape(d[0]), _shape(d[1])
    if not a or not b or len(a) != 3 or len(b) != 3:
        return None
    return 2.0 * a[0] * a[1] * a[2] * b[2]


def baddbmm(d: Dims) -> float | None:
    if len(d) < 3:
        return None
    return bmm(d[1:3])


def matmul(d: Dims) -> float | None:
    """torch.matmul with numpy broadcasting: 1-D operands are promoted, batch dims broadcast."""
    a, b = _shape(d[0]), _shape(d[1])
    if not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return 2.0 * a[0]
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    m, k, n = a[-2], a[-1], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    nb = max(len(batch_a), len(batch_b))
    batch_a = [1] * (nb - len(batch_a)) + batch_a
    batch_b = [1] * (nb - len(batch_b)) + batch_b
    batch = [max(x, y) for x, y in zip(batch_a, batch_b, strict=True)]
    return 2.0 * _prod(batch) * m * k * n


def _grouped_mnk(a: list[int], b: list[int]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of torch._grouped_mm(a, b, offs) over its whole split dimension, None when the operands
    fit none of its four forms (K must agree)."""
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:  # rows split by offs, each group's rows times its matrix
        return 1, a[0], b[2], a[1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:  # K split by offs (a weight gradient per group)
        return 1, a[0], b[1], a[1]
    if len(a) == 3 and len(b) == 2 and a[2] == b[0]:  # columns split by offs, each group's own matrix
        return 1, a[1], b[1], a[2]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:  # a batch of equal matmuls
        return a[0], a[1], b[2], a[2]
    return None


def mv(d: Dims) -> float | None:
    """Matrix [N, K] times vector [K]."""
    a, x = _shape(d[0]), _shape(d[1])
    if not a or not x or len(a) != 2 or len(x) != 1 or a[1] != x[0]:
        return None
    return 2.0 * a[0] * a[1]


def addmv(d: Dims) -> float | None:
    if len(d) < 3:
        return None
    return mv(d[1:3])


def dot(d: Dims) -> float | None:
    """Two vectors of n elements: n multiply-adds."""
    a, b = _shape(d[0]), _shape(d[1])
    if not a or not b or len(a) != 1 or a != b:
        return None
    return 2.0 * a[0]


def int4_weight_mm(d: Dims) -> float | None:
    """torch._weight_int4pack_mm(self [M, K], packed weight, group size, scales and zeros [K / group, N, 2]): bf16
    activations times a 4-bit weight (tinygemm: gpt-fast, torchao's int4 weight-only), dequantised in the kernel.
    N comes from the scales; the packed weight ([N / 8, K / (inner k tiles · 16), 32, inner k tiles / 2] int32)
    must agree where it has that form."""
    if len(d) < 4:
        return None
    x, w, sz = _shape(d[0]), _shape(d[1]), _shape(d[3])
    if not x or not sz or len(x) < 2 or len(sz) != 3 or sz[2] != 2:
        return None
    n = sz[1]
    if w and len(w) == 4 and w[0] * 8 != n:
        return None
    return 2.0 * _prod(x[:-1]) * x[-1] * n


def grouped_mm(d: Dims) -> float | None:
    """torch._grouped_mm(mat_a, mat_b, offs, …) (and the scaled FP8 forms, whose first two inputs are the same):
    the matmuls of G groups (MoE experts) in one call, one dimension split into the groups by `offs` — the rows
    (2-D × 3-D: each expert's tokens times its weight), K (2-D × 2-D: each expert's weight gradient) or the columns
    (3-D × 2-D) — or a batch (3-D × 3-D). Each row, K slice or column is multiplied once whatever the split, so the
    FLOPs need only the shapes: 2 · M · N · K over the whole split dimension (rows past offs' last value, which the
    op leaves out, counted: an upper bound, exact when offs covers them all, as MoE layers' do)."""
    a, b = _shape(d[0]), _shape(d[1])
    got = _grouped_mnk(a, b) if a and b else None
    if got is None:
        return None
    batch, m, n, k = got
    return 2.0 * batch * m * n * k


def linear(d: Dims) -> float | None:
    x, w = _shape(d[0]), _shape(d[1])
    if not x or not w or len(w) != 2:
        return None
    return 2.0 * _prod(x[:-1]) * x[-1] * w[0]


def _is_causal(concrete: list[Any] | None, index: int) -> bool:
    if not concrete or index >= len(concrete):
        return False
    return str(concrete[index]).strip().lower() in ("true", "1")


def _attention(
    q: list[int] | None,
    k: list[int] | None,
    v: list[int] | None,
    causal: bool,
    layout: str = "bhsd",
    window: tuple[int, int] | None = None,
) -> float | None:
    """2·B·H·L·S·(E + Ev), halved when causal; with a sliding `window` (left, right), the pairs it keeps for L·S.
    Layout 'bhsd' (SDPA) or 'bshd' (flash/efficient internals)."""
    if not q or not k or len(q) != 4 or len(k) != 4:
        return None
    if layout == "bhsd":
        b, h, lq, e = q
        s = k[2]
    else:
        b, lq, h, e = q
        s = k[1]
    ev = v[-1] if v and len(v) == 4 else e
    pairs = _kept_pairs(lq, s, *window) if window is not None else lq * s
    flops = 2.0 * b * h * pairs * (e + ev)
    if causal and window is None:
        # Causal masking keeps the lower triangle: L·S − L·(L−1)/2 of L·S scores when L == S.
        flops *= 0.5 if lq == s else max(0.0, 1.0 - lq / (2.0 * s))
    return flops


def _flag(concrete: list[Any] | None, index: int) -> bool | None:
    """A bool argument as the profiler writes it ("True" / "False"), else None (not recorded, or another value:
    the signature is not the one the table expects)."""
    if not concrete or index >= len(concrete):
        return None
    v = str(concrete[index]).strip()
    return True if v == "True" else False if v == "False" else None


def _int_arg(concrete: list[Any] | None, index: int) -> int | None:
    if not concrete or index >= len(concrete):
        return None
    try:
        return int(str(concrete[index]).strip())
    except ValueError:
        return None


def _mask(name: str, concrete: list[Any] | None) -> tuple[bool, int, int] | None:
    """(causal, window left, window right) of an attention op; -1 is no limit on that side. None when an op whose
    flags `MASKED_ATTENTION` names does not have them readable where its signature puts them."""
    causal_at = ATTENTION_OPS[name][1]
    if name not in MASKED_ATTENTION:
        return _is_causal(concrete, causal_at), -1, -1
    causal = _flag(concrete, causal_at)
    left_at, right_at = MASKED_ATTENTION[name]
    left, right = _int_arg(concrete, left_at), _int_arg(concrete, right_at)
    if causal is None or left is None or right is None:
        return None
    return causal, left, 0 if causal else right


def _kept_pairs(lq: int, s: int, left: int, right: int) -> int:
    """How many (query, key) pairs a sliding-window mask keeps, FlashAttention's way (aligned to the bottom right:
    query i sees keys i + s − lq − left … i + s − lq + right; -1 is no limit on that side)."""
    i = np.arange(lq, dtype=np.int64) + (s - lq)
    lo = np.maximum(0, i - left) if left >= 0 else np.zeros(lq, dtype=np.int64)
    hi = np.minimum(s - 1, i + right) if right >= 0 else np.full(lq, s - 1, dtype=np.int64)
    return int(np.maximum(0, hi - lo + 1).sum())


def _sdpa(name: str) -> Callable[..., float | None]:
    q_at, _, layout, backward = ATTENTION_OPS[name]

    def model(d: Dims, concrete: list[Any] | None = None) -> float | None:
        if len(d) < q_at + 3:
            return None
        mask = _mask(name, concrete)
        if mask is None:
            return None
        causal, left, right = mask
        q, k, v = _shape(d[q_at]), _shape(d[q_at + 1]), _shape(d[q_at + 2])
        sliding = not (left < 0 and (right < 0 or causal))  # a window: the pairs it keeps, counted
        f = _attention(q, k, v, causal, layout, (left, right) if sliding else None)
        return None if f is None else (2.5 * f if backward else f)

    return model


# Where each convolution op keeps stride, padding, dilation and groups among its arguments (aten signatures):
# conv1d/2d/3d, convolution and _convolution (input, weight, bias, stride, padding, dilation, [transposed,
# output_padding,] groups …); conv_transpose (…, stride, padding, output_padding, groups, dilation);
# cudnn_convolution (input, weight, padding, stride, dilation, groups, …), which has no bias argument.
_CONV_ARGS = {"conv": (3, 4, 5, 6), "convolution": (3, 4, 5, 8), "transpose": (3, 4, 7, 6), "cudnn": (3, 2, 4, 5)}


def _ints(concrete: list[Any] | None, i: int, nsp: int) -> list[int] | None:
    if not concrete or i >= len(concrete):
        return None
    raw = concrete[i]
    try:
        v = json.loads(raw) if isinstance(raw, str) and raw else raw
    except ValueError:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return [v] * nsp
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        return list(v) if len(v) == nsp else [v[0]] * nsp
    return None


def conv(
    d: Dims, concrete: list[Any] | None = None, transposed: bool = False, args: tuple[int, int, int, int] = _CONV_ARGS["conv"]
) -> float | None:
    """Convolution: 2 · N · C_out · prod(out spatial) · C_in/groups · prod(kernel). `args`: the argument positions of
    stride, padding, dilation and groups in the op's signature. The output grid needs the stride and padding: a
    trace that does not record them (no concrete inputs: torch <= 1.9, or record_shapes without them) has no
    estimate — stride 1 / padding 0 would count a strided 7×7 stem 4× over (None: unknown, never invented)."""
    x, w = _shape(d[0]), _shape(d[1]) if len(d) > 1 else None
    if not x or not w or len(x) < 3 or len(w) != len(x):
        return None
    nsp = len(x) - 2
    stride = _ints(concrete, args[0], nsp)
    padding = _ints(concrete, args[1], nsp)
    if not transposed and (stride is None or padding is None):
        return None
    stride = stride or [1] * nsp
    padding = padding or [0] * nsp
    dilation = _ints(concrete, args[2], nsp) or [1] * nsp
    g = _ints(concrete, args[3], nsp)
    groups = max(g[0] if g else 1, 1)
    n, cin = x[0], x[1]
    ksp = w[2:]
    if transposed:
        cout = w[1] * groups
        # FLOPs of a transposed conv equal those of the forward conv it is the gradient of (on the input grid).
        return 2.0 * n * cin * _prod(x[2:]) * (cout // groups) * _prod(ksp)
    cout = w[0]
    out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (ksp[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    if any(o <= 0 for o in out):
        return None
    return 2.0 * n * cout * _prod(out) * (cin // groups) * _prod(ksp)


def conv_backward(d: Dims, concrete: list[Any] | None = None) -> float | None:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): the gradient of the input and the gradient of the weight each cost the
    forward convolution's FLOPs (as torch.utils.flop_counter counts them); the bias gradient is a reduction."""
    if len(d) < 3:
        return None
    transposed = _is_causal(concrete, 7)
    f = conv(d[1:], None if concrete is None else concrete[1:], transposed=transposed, args=(3, 4, 5, 8))
    if f is None:
        return None
    mask = [True, True, False]
    if concrete and len(concrete) > 10 and isinstance(concrete[10], str) and concrete[10].startswith("["):
        parts = [t.strip().lower() for t in concrete[10].strip("[]").split(",")]
        if len(parts) == 3 and all(t in ("true", "false") for t in parts):
            mask = [t == "true" for t in parts]
    return f * (int(mask[0]) + int(mask[1]))


def _plain(f: Callable[[Dims], float | None]) -> Callable[..., float | None]:
    return lambda d, concrete=None: f(d)


# Attention ops: (index of q in the inputs, index of is_causal in the concrete inputs, layout, backward).
ATTENTION_OPS: dict[str, tuple[int, int, str, bool]] = {
    "aten::scaled_dot_product_attention": (0, 5, "bhsd", False),
    "aten::_scaled_dot_product_flash_attention": (0, 4, "bhsd", False),
    "aten::_scaled_dot_product_efficient_attention": (0, 6, "bhsd", False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 6, "bhsd", False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, "bhsd", True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, "bhsd", True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 14, "bhsd", True),
    "aten::_flash_attention_forward": (0, 8, "bshd", False),
    "aten::_flash_attention_backward": (1, 11, "bshd", True),
    "aten::_efficient_attention_forward": (0, 99, "bshd", False),
    "aten::_efficient_attention_backward": (1, 99, "bshd", True),
    # FlashAttention 2's own ops (flash_attn >= 2.6.3, torch.library custom ops since 2024-09; what HF
    # transformers' attn_implementation="flash_attention_2" runs): q, k, v as (batch, seqlen, heads, head dim).
    # forward (q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap, …);
    # backward (dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, window_size_left,
    # window_size_right, …). The varlen forms keep their sequences' lengths in a tensor (unknown work).
    "flash_attn::_flash_attn_forward": (0, 5, "bshd", False),
    "flash_attn::_flash_attn_backward": (1, 11, "bshd", True),
}
# Attention ops that take a mask or bias tensor over the scores (attn_mask / attn_bias / bias): its index among
# the inputs (aten's signatures; torch 2.11's profiler records it as a [B | 1, H | 1, L, S] input). The pairs such a
# mask keeps are not in any trace: the op's FLOPs count every pair (as FlopCounterMode does), and the verdict says
# how much of its FLOPs that is (judge.masked_attention). HF transformers passes its causal mask this way under
# torch.compile, and for padded batches.
ATTENTION_MASK_AT: dict[str, int] = {
    "aten::scaled_dot_product_attention": 3,
    "aten::_scaled_dot_product_efficient_attention": 3,
    "aten::_scaled_dot_product_cudnn_attention": 3,
    "aten::_scaled_dot_product_efficient_attention_backward": 4,
    "aten::_scaled_dot_product_cudnn_attention_backward": 8,
    "aten::_efficient_attention_forward": 3,
    "aten::_efficient_attention_backward": 4,
}
# Attention ops with a sliding window: where their window_size_left / right are among the concrete inputs. Their
# flags are read strictly (a bool written "True" / "False", ints): another value means another signature, and the
# op's work is unknown rather than a guess.
MASKED_ATTENTION: dict[str, tuple[int, int]] = {
    "flash_attn::_flash_attn_forward": (6, 7),
    "flash_attn::_flash_attn_backward": (12, 13),
}
# Matmul ops: (index of the first operand, kind) — the second operand follows it. In-place forms (`addmm_`: what
# addbmm runs per batch) have their op's arguments; _int_mm is int8 × int8 → int32 (torchao's int8 quantisation),
# _scaled_mm_v2 torch.nn.functional.scaled_mm (its scales and recipes after the operands), _addmm_activation a
# Linear with its GELU / ReLU in cuBLASLt's epilogue; addbmm sums a batch of products into one matrix.
GEMM_OPS: dict[str, tuple[int, str]] = {
    "aten::mm": (0, "mm"),
    "aten::_scaled_mm": (0, "mm"),
    "aten::_scaled_mm_v2": (0, "mm"),
    "aten::_int_mm": (0, "mm"),
    "aten::addmm": (1, "mm"),
    "aten::addmm_": (1, "mm"),
    "aten::_addmm_activation": (1, "mm"),
    "aten::bmm": (0, "bmm"),
    "aten::baddbmm": (1, "bmm"),
    "aten::baddbmm_": (1, "bmm"),
    "aten::addbmm": (1, "bmm"),
    "aten::addbmm_": (1, "bmm"),
    "aten::matmul": (0, "matmul"),
    "aten::linear": (0, "linear"),
}
# Grouped matmuls (MoE experts): mat_a and mat_b are the first two inputs.
GROUPED_MM_OPS = ("aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::_scaled_grouped_mm_v2")
# Convolution ops: whether the op is a transposed convolution (None: its concrete input 6 says), and which of
# _CONV_ARGS's argument orders its signature has.
CONV_OPS: dict[str, tuple[bool | None, str]] = {
    "aten::conv1d": (False, "conv"),
    "aten::conv2d": (False, "conv"),
    "aten::conv3d": (False, "conv"),
    "aten::convolution": (None, "convolution"),
    "aten::_convolution": (None, "convolution"),
    "aten::cudnn_convolution": (False, "cudnn"),
    "aten::conv_transpose1d": (True, "transpose"),
    "aten::conv_transpose2d": (True, "transpose"),
    "aten::conv_transpose3d": (True, "transpose"),
}


def _conv_model(name: str) -> Callable[..., float | None]:
    transposed, order = CONV_OPS[name]
    args = _CONV_ARGS[order]
    if transposed is None:
        return lambda d, c=None: conv(d, c, _is_causal(c, 6), args)
    return lambda d, c=None: conv(d, c, transposed, args)


# int4 weight-only matmuls (tinygemm): bf16 activations, a packed 4-bit weight, its scales and zeros.
INT4_WEIGHT_OPS = ("aten::_weight_int4pack_mm", "aten::_weight_int4pack_mm_for_cpu")
# Matrix-vector and vector-vector products (cuBLAS gemv / dot): memory-bound, their FLOPs still useful work.
GEMV_OPS: dict[str, int] = {"aten::mv": 0, "aten::addmv": 1, "aten::addmv_": 1, "aten::dot": 0, "aten::vdot": 0}

MODELS: dict[str, Callable[..., float | None]] = {
    "aten::mm": _plain(mm),
    "aten::addmm": _plain(addmm),
    "aten::addmm_": _plain(addmm),
    "aten::_addmm_activation": _plain(addmm),
    "aten::bmm": _plain(bmm),
    "aten::baddbmm": _plain(baddbmm),
    "aten::baddbmm_": _plain(baddbmm),
    "aten::addbmm": _plain(baddbmm),
    "aten::addbmm_": _plain(baddbmm),
    "aten::matmul": _plain(matmul),
    "aten::linear": _plain(linear),
    "aten::_scaled_mm": _plain(mm),
    "aten::_scaled_mm_v2": _plain(mm),
    "aten::_int_mm": _plain(mm),
    "aten::mv": _plain(mv),
    "aten::addmv": _plain(addmv),
    "aten::addmv_": _plain(addmv),
    "aten::dot": _plain(dot),
    "aten::vdot": _plain(dot),
    "aten::_weight_int4pack_mm": _plain(int4_weight_mm),
    "aten::_weight_int4pack_mm_for_cpu": _plain(int4_weight_mm),
    **{name: _plain(grouped_mm) for name in GROUPED_MM_OPS},
    **{name: _sdpa(name) for name in ATTENTION_OPS},
    **{name: _conv_model(name) for name in CONV_OPS},
    "aten::convolution_backward": conv_backward,
}

# The matmul-like ops whose input dtype decides the default peak precision.
MATMUL_OPS = frozenset(MODELS)


def op_flops(name: str, input_dims: str | None, concrete_inputs: str | None = None) -> float | None:
    """FLOPs of one op from its JSON `Input Dims` (and `Concrete Inputs`), or None without a model."""
    model = MODELS.get(name)
    if model is None or not input_dims:
        return None
    try:
        dims = json.loads(input_dims)
        concrete = json.loads(concrete_inputs) if concrete_inputs else None
    except ValueError:
        return None
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    try:
        f = model(dims, concrete)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    return f if f is not None and math.isfinite(f) and f >= 0 else None


SHAPE_FIELDS = (
    "family",
    "shape",
    "pass",
    "batch",
    "m",
    "n",
    "k",
    "heads",
    "kv_heads",
    "q_len",
    "kv_len",
    "head_dim",
    "causal",
    "conv_input",
    "conv_weight",
    "stride",
    "padding",
    "dilation",
    "groups",
    "transposed",
)


def op_shape(name: str, input_dims: str | None, concrete_inputs: str | None = None) -> dict[str, Any] | None:
    """The problem shape of a matmul-class op, as its FLOP model reads it (the per-shape table): GEMM M, N, K (and
    batch), attention batch, heads (query and key/value), query / key length, head dim, causal and pass, convolution
    input, weight, stride, padding, dilation, groups. None when the op has no shape model or its dims are missing.
    Every value is an int, a bool or text; `shape` is the one-line description."""
    try:
        d = json.loads(input_dims) if input_dims else None
        concrete = json.loads(concrete_inputs) if concrete_inputs else None
    except ValueError:
        return None
    if not isinstance(d, list):
        return None
    concrete = concrete if isinstance(concrete, list) else None
    out: dict[str, Any] = dict.fromkeys(SHAPE_FIELDS)
    if name in GEMM_OPS:
        at, kind = GEMM_OPS[name]
        if len(d) < at + 2:
            return None
        a, b = _shape(d[at]), _shape(d[at + 1])
        if not a or not b:
            return None
        batch = 1
        if kind == "mm":
            if len(a) != 2 or len(b) != 2:
                return None
            m, k, n = a[0], a[1], b[1]
        elif kind == "bmm":
            if len(a) != 3 or len(b) != 3:
                return None
            batch, m, k, n = a[0], a[1], a[2], b[2]
        elif kind == "linear":
            if len(b) != 2:
                return None
            m, k, n = _prod(a[:-1]), a[-1], b[0]
        else:  # matmul: numpy broadcasting, 1-D operands promoted; a batch against a matrix is one GEMM (torch folds it)
            a2 = [1, a[0]] if len(a) == 1 else a
            b2 = [b[0], 1] if len(b) == 1 else b
            m, k, n = (_prod(a2[:-1]) if len(b2) == 2 else a2[-2]), a2[-1], b2[-1]
            ba, bb = (a2[:-2], b2[:-2]) if len(b2) > 2 else ([], [])
            nb = max(len(ba), len(bb))
            ba, bb = [1] * (nb - len(ba)) + ba, [1] * (nb - len(bb)) + bb
            batch = _prod([max(x, y) for x, y in zip(ba, bb, strict=True)])
        out.update(
            family="gemm", batch=batch, m=m, n=n, k=k, shape=(f"batch {batch} × " if batch > 1 else "") + f"M={m} N={n} K={k}"
        )
        return out
    if name in ATTENTION_OPS:
        q_at, _, layout, backward = ATTENTION_OPS[name]
        if len(d) < q_at + 3:
            return None
        q, kk, v = _shape(d[q_at]), _shape(d[q_at + 1]), _shape(d[q_at + 2])
        if not q or not kk or len(q) != 4 or len(kk) != 4:
            return None
        if layout == "bhsd":
            nb_, h, lq, e = q
            hk, s_len = kk[1], kk[2]
        else:
            nb_, lq, h, e = q
            s_len, hk = kk[1], kk[2]
        ev = v[-1] if v and len(v) == 4 else e
        mask = _mask(name, concrete)
        if mask is None:
            return None
        causal, left, right = mask
        sides = [str(w) if w >= 0 else "∞" for w in (left, right)]
        window = "" if left < 0 and (right < 0 or causal) else f" window {sides[0]}/{sides[1]}"
        out.update(
            family="attention",
            batch=nb_,
            heads=h,
            kv_heads=hk,
            q_len=lq,
            kv_len=s_len,
            head_dim=e,
            causal=causal,
            **{"pass": "backward" if backward else "forward"},
            shape=f"B={nb_} H={h}"
            + (f"/{hk}" if hk != h else "")
            + f" L={lq} S={s_len} D={e}"
            + (f"/{ev}" if ev != e else "")
            + (" causal" if causal else "")
            + window,
        )
        return out
    if name in CONV_OPS or name == "aten::convolution_backward":
        backward = name == "aten::convolution_backward"
        if backward:  # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, …, groups)
            d, concrete = d[1:], None if concrete is None else concrete[1:]
            transposed, args = _is_causal(concrete, 6), _CONV_ARGS["convolution"]
        else:
            t, order = CONV_OPS[name]
            transposed, args = (t if t is not None else _is_causal(concrete, 6)), _CONV_ARGS[order]
        x, w = (_shape(d[0]) if d else None), (_shape(d[1]) if len(d) > 1 else None)
        if not x or not w or len(x) < 3 or len(w) != len(x):
            return None
        nsp = len(x) - 2
        stride = _ints(concrete, args[0], nsp) or [1] * nsp
        padding = _ints(concrete, args[1], nsp) or [0] * nsp
        dilation = _ints(concrete, args[2], nsp) or [1] * nsp
        g = _ints(concrete, args[3], nsp)
        groups = max(g[0] if g else 1, 1)

        def dims(xs: list[int]) -> str:
            return "×".join(map(str, xs))

        out.update(
            family="conv",
            batch=x[0],
            conv_input=dims(x),
            conv_weight=dims(w),
            stride=dims(stride),
            padding=dims(padding),
            dilation=dims(dilation),
            groups=groups,
            transposed=bool(transposed),
            **{"pass": "backward" if backward else "forward"},
            shape=f"in {dims(x)} w {dims(w)}"
            + (f" stride {dims(stride)}" if any(v != 1 for v in stride) else "")
            + (f" pad {dims(padding)}" if any(padding) else "")
            + (f" groups {groups}" if groups != 1 else "")
            + (" transposed" if transposed else ""),
        )
        return out
    return None


# GEMMs whose output type is not their operands': _int_mm writes int32; _scaled_mm / _scaled_mm_v2 write their
# out_dtype (a ScalarType code among the concrete inputs, where their signatures put it: bf16 "15" in the FP8
# recordings of sample_traces/h200_hf), their operands' type when it is not given.
OUT_ELEMENT_BYTES = {"aten::_int_mm": 4}
OUT_DTYPE_AT = {"aten::_scaled_mm": 6, "aten::_scaled_mm_v2": 9}


def _out_elem(name: str, concrete_inputs: str | None, elem: int) -> int:
    if name in OUT_ELEMENT_BYTES:
        return OUT_ELEMENT_BYTES[name]
    at = OUT_DTYPE_AT.get(name)
    if at is None or not concrete_inputs:
        return elem
    try:
        concrete = json.loads(concrete_inputs)
        code = int(str(concrete[at]).strip()) if isinstance(concrete, list) and at < len(concrete) else None
    except ValueError:
        return elem
    return SCALAR_TYPE_BYTES.get(code, elem) if code is not None else elem


def op_bytes(name: str, input_dims: str | None, input_types: str | None, concrete_inputs: str | None = None) -> float | None:
    """Minimum DRAM bytes of a matmul-like op: read each operand once, write the output once (at the output's
    own element size where the op's output type differs from its operands', `OUT_ELEMENT_BYTES`).

    A lower bound on traffic, so the arithmetic intensity it gives is an upper bound: an op found
    memory-bound with it is memory-bound for sure."""
    if name not in MODELS or not input_dims:
        return None
    try:
        dims = json.loads(input_dims)
    except ValueError:
        return None
    elem = ELEMENT_BYTES.get(op_precision(input_types) or "", 2)
    out_elem = _out_elem(name, concrete_inputs, elem)
    shapes = [d for d in dims if _shape(d)]
    if len(shapes) < 2:
        return None
    if name in GEMV_OPS:  # the matrix (or vector) and the vector in, a vector (a scalar) out
        at = GEMV_OPS[name]
        a, x = (_shape(dims[at]), _shape(dims[at + 1])) if len(dims) >= at + 2 else (None, None)
        if not a or not x:
            return None
        return float(elem * (_prod(a) + _prod(x) + (a[0] if len(a) == 2 else 1)))
    if name in INT4_WEIGHT_OPS:  # activations, the 4-bit weight, the scales and zeros in; M × N out
        x, w, sz = shapes[0], _shape(dims[1]), _shape(dims[3]) if len(dims) > 3 else None
        if not w or not sz or len(sz) != 3:
            return None
        return float(elem * (_prod(x) + _prod(sz) + _prod(x[:-1]) * sz[1]) + _prod(w) * 4)  # packed int32
    if name == "aten::matmul" or (name in GEMM_OPS and GEMM_OPS[name][1] in ("mm", "bmm")):
        at = GEMM_OPS[name][0] if name in GEMM_OPS else 0
        a, b = (shapes[at], shapes[at + 1]) if len(shapes) >= at + 2 else shapes[:2]
        if len(a) < 2 or len(b) < 2:
            return None
        batch = 1 if name.startswith("aten::addbmm") else max(_prod(a[:-2]), _prod(b[:-2]))  # addbmm: one sum out
        return float(elem * (_prod(a) + _prod(b)) + out_elem * batch * a[-2] * b[-1])
    if name in GROUPED_MM_OPS:
        a, b = _shape(dims[0]), _shape(dims[1])
        got = _grouped_mnk(a, b) if a and b else None
        if got is None or not a or not b:
            return None
        batch, m, n, _ = got
        if len(a) == 2 and len(b) == 2:  # one M × N output per group: offs (_grouped_mm's third input) counts them
            offs = _shape(dims[2]) if name == "aten::_grouped_mm" and len(dims) > 2 else None
            if not offs or len(offs) != 1:
                return None
            batch = offs[0]
        return float(elem * (_prod(a) + _prod(b) + batch * m * n))
    if name == "aten::linear":
        x, w = shapes[0], shapes[1]
        return float(elem * (_prod(x) + _prod(w) + _prod(x[:-1]) * w[0]))
    # attention and convolution: operands in, one output of the query's / input's size out
    return float(elem * (sum(_prod(d) for d in shapes[:3]) + _prod(shapes[0])))


def element_bytes(type_name: Any) -> int | None:
    if not isinstance(type_name, str):
        return None
    t = type_name.lower()
    prec = DTYPE_PRECISION.get(t)
    if prec:
        return ELEMENT_BYTES.get(prec)
    return EXTRA_ELEMENT_BYTES.get(t)


class _Args:
    """One op's arguments: tensor shapes and element sizes, and concrete scalar values, by position."""

    def __init__(self, dims: list[Any], types: list[Any], concrete: list[Any], elem_hint: int | None) -> None:
        self.dims, self.types, self.concrete, self.elem_hint = dims, types, concrete, elem_hint

    def shape(self, i: int) -> list[int] | None:
        d = self.dims[i] if i < len(self.dims) else None
        return d if isinstance(d, list) and d and all(isinstance(v, int) and v >= 0 for v in d) else None

    def numel(self, i: int) -> int:
        s = self.shape(i)
        return math.prod(s) if s else 0

    def elem(self, i: int, default: int = 4) -> int:
        t = self.types[i] if i < len(self.types) else None
        return element_bytes(t) or self.elem_hint or default

    def nbytes(self, i: int) -> int:
        return self.numel(i) * self.elem(i)

    def value(self, i: int) -> Any:
        """A concrete argument parsed ('[0, 1]' → [0, 1], '15' → 15, 'True' → True), None when not recorded."""
        v = self.concrete[i] if i < len(self.concrete) else None
        if not isinstance(v, str) or v == "":
            return v if v != "" else None
        if v in ("True", "False"):
            return v == "True"
        try:
            return json.loads(v.replace("True", "true").replace("False", "false"))  # '[True, False]' too
        except ValueError:
            return v

    def flag(self, i: int, default: bool) -> bool:
        v = self.value(i)
        return v if isinstance(v, bool) else default

    def scalar_type_bytes(self, i: int) -> int | None:
        v = self.value(i)
        return SCALAR_TYPE_BYTES.get(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _norm_fwd(
    x: int, w: int | None, b: int | None, stat_rows: Callable[[_Args], int] | None = None, n_stats: int = 2
) -> Callable[[_Args], float | None]:
    """Normalisation forward: read x (+ weight, bias), write y the size of x (+ the saved statistics, fp32: mean and
    rstd per row or group; rstd alone for RMS norm)."""

    def model(a: _Args) -> float | None:
        if not a.shape(x):
            return None
        extra = sum(a.nbytes(i) for i in (w, b) if i is not None)
        stats = n_stats * 4 * stat_rows(a) if stat_rows else 0
        return float(2 * a.nbytes(x) + extra + stats)

    return model


def _norm_bwd(
    grad: int, x: int, small_in: Sequence[int], weight: int | None, n_weight_grads: int, mask_at: int | None
) -> Callable[[_Args], float | None]:
    """Normalisation backward: read grad and x (+ saved stats, weight), write grad_input the size of x and the weight /
    bias gradients (per output_mask when recorded)."""

    def model(a: _Args) -> float | None:
        if not a.shape(grad) or not a.shape(x):
            return None
        mask = a.value(mask_at) if mask_at is not None else None
        grads_w = n_weight_grads
        if isinstance(mask, list) and len(mask) == 1 + n_weight_grads:
            if not mask[0]:
                return None
            grads_w = sum(1 for m in mask[1:] if m is True)
        wb = a.nbytes(weight) if weight is not None else 0
        return float(
            a.nbytes(grad) + a.nbytes(x) + sum(a.nbytes(i) for i in small_in) + wb + a.numel(x) * a.elem(grad) + grads_w * wb
        )

    return model


def _layer_norm_rows(a: _Args) -> int:
    norm = a.value(1)
    inner = math.prod(norm) if isinstance(norm, list) and norm and all(isinstance(v, int) for v in norm) else 0
    if not inner:
        w = a.shape(2)
        inner = math.prod(w) if w else (a.shape(0) or [1])[-1]
    return a.numel(0) // max(inner, 1)


def _batch_norm(x: int, w: int, b: int, rm: int, rv: int, training_at: int) -> Callable[[_Args], float | None]:
    """Batch norm forward: training reads x twice (the statistics pass, then the normalising pass), eval once; writes
    y; per-channel weight, bias, running stats read (and written when training)."""

    def model(a: _Args) -> float | None:
        if not a.shape(x):
            return None
        train = a.flag(training_at, True)
        chan = sum(a.nbytes(i) for i in (w, b, rm, rv))
        return float((3 if train else 2) * a.nbytes(x) + chan + (a.nbytes(rm) + a.nbytes(rv) if train else 0))

    return model


def _batch_norm_bwd(a: _Args) -> float | None:
    """native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, …):
    training reads grad and x twice (the reductions for grad_weight / grad_bias, then grad_input), writes grad_input."""
    if not a.shape(0) or not a.shape(1):
        return None
    passes = 2 if a.flag(7, True) else 1
    chan = sum(a.nbytes(i) for i in (2, 5, 6))
    return float(passes * (a.nbytes(0) + a.nbytes(1)) + a.numel(1) * a.elem(0) + chan + 2 * a.nbytes(2))


def _softmax(half_to_float_at: int | None) -> Callable[[_Args], float | None]:
    """softmax / log_softmax: read x, write y the size of x (fp32 when half_to_float)."""

    def model(a: _Args) -> float | None:
        if not a.shape(0):
            return None
        out_elem = 4 if half_to_float_at is not None and a.flag(half_to_float_at, False) else a.elem(0)
        return float(a.nbytes(0) + a.numel(0) * out_elem)

    return model


def _softmax_bwd(a: _Args) -> float | None:
    """_softmax_backward_data(grad_output, output, dim, input_dtype): read both, write grad_input."""
    if not a.shape(0) or not a.shape(1):
        return None
    return float(a.nbytes(0) + a.nbytes(1) + a.numel(0) * (a.scalar_type_bytes(3) or a.elem(0)))


def _reduction(
    dim_at: int | None, keepdim_at: int | None, out_elem: int | None = None, with_indices: bool = False
) -> Callable[[_Args], float | None]:
    """Reductions: read the input once, write the reduced output — its size from `dim` when recorded (all dims when
    `dim` is empty or absent: one element)."""

    def model(a: _Args) -> float | None:
        shape = a.shape(0)
        if not shape:
            return None
        dims = a.value(dim_at) if dim_at is not None else None
        if isinstance(dims, int) and not isinstance(dims, bool):
            dims = [dims]
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            kept = {d % len(shape) for d in dims}
            out = math.prod(n for i, n in enumerate(shape) if i not in kept)
        else:
            out = 1
        elem = out_elem or a.elem(0)
        return float(a.nbytes(0) + out * elem + (out * 8 if with_indices else 0))

    return model


def _embedding(a: _Args) -> float | None:
    """embedding(weight [V, D], indices): reads the indices and only the rows they pick, writes those rows."""
    w, idx = a.shape(0), a.shape(1)
    if not w or not idx:
        return None
    rows = a.numel(1) * math.prod(w[1:]) * a.elem(0)
    return float(a.nbytes(1) + 2 * rows)


def _embedding_dense_bwd(a: _Args) -> float | None:
    """embedding_dense_backward(grad [..., D], indices, num_weights, …): reads grad and indices, zero-fills the
    [num_weights, D] gradient and adds the picked rows into it (read + write of those rows)."""
    g, n = a.shape(0), a.value(2)
    if not g or not a.shape(1) or not isinstance(n, int) or isinstance(n, bool):
        return None
    return float(a.nbytes(0) + a.nbytes(1) + n * g[-1] * a.elem(0) + 2 * a.numel(1) * g[-1] * a.elem(0))


def _copy(a: _Args) -> float | None:
    """copy_(dst, src): read src (broadcast: once), write dst, each in its own dtype."""
    if not a.shape(0):
        return None
    return float(a.nbytes(0) + (a.nbytes(1) if a.shape(1) else 0))


def _to_copy(dtype_at: int) -> Callable[[_Args], float | None]:
    """to / _to_copy(self, dtype, …): read self, write it in the target dtype (the same one when not given)."""

    def model(a: _Args) -> float | None:
        if not a.shape(0):
            return None
        return float(a.nbytes(0) + a.numel(0) * (a.scalar_type_bytes(dtype_at) or a.elem(0)))

    return model


def _fill(a: _Args) -> float | None:
    """fill_ / zero_ / random fills (self, …): self written, nothing read."""
    return float(a.nbytes(0)) if a.shape(0) else None


def _clone(a: _Args) -> float | None:
    return float(2 * a.nbytes(0)) if a.shape(0) else None


def _index_select(a: _Args) -> float | None:
    """index_select(self, dim, index): reads the index and the picked slices, writes them."""
    s, dim = a.shape(0), a.value(1)
    if not s or not a.shape(2) or not isinstance(dim, int) or isinstance(dim, bool):
        return None
    out = a.numel(0) // max(s[dim % len(s)], 1) * a.numel(2)
    return float(a.nbytes(2) + 2 * out * a.elem(0))


def _gather(a: _Args) -> float | None:
    """gather(self, dim, index): one element of self read per index element, written to an output of index's shape."""
    if not a.shape(0) or not a.shape(2):
        return None
    return float(a.nbytes(2) + 2 * a.numel(2) * a.elem(0))


def _scatter(src_at: int, accumulate: bool) -> Callable[[_Args], float | None]:
    """scatter_ / scatter_add_ / index_add_ (self, dim, index, src): read the index and src, write as many elements
    of self (scatter_add / index_add also read them)."""

    def model(a: _Args) -> float | None:
        if not a.shape(0) or not a.shape(2):
            return None
        n = a.numel(src_at) if a.shape(src_at) else a.numel(2)  # index_add_: src's slices, not the 1-D index
        return float(a.nbytes(2) + (a.nbytes(src_at) if a.shape(src_at) else 0) + (2 if accumulate else 1) * n * a.elem(0))

    return model


def _index(a: _Args) -> float | None:
    """index(self, indices): index tensors on the leading dims pick slices: read the indices and the picked
    elements, write them."""
    s, idx = a.shape(0), a.dims[1] if len(a.dims) > 1 else None
    if not s or not isinstance(idx, list):
        return None
    shapes = [d for d in idx if isinstance(d, list) and d and all(isinstance(v, int) for v in d)]
    if not shapes or len(idx) > len(s):
        return None
    picked = max(math.prod(d) for d in shapes)
    out = picked * math.prod(s[len(idx) :])
    return float(sum(math.prod(d) for d in shapes) * 8 + 2 * out * a.elem(0))


def _index_put(a: _Args) -> float | None:
    """index_put_(self, indices, values, accumulate): read the indices and values, write (accumulate: read and
    write) that many elements of self."""
    v = a.shape(2)
    idx = a.dims[1] if len(a.dims) > 1 and isinstance(a.dims[1], list) else []
    if not a.shape(0) or not v:
        return None
    idx_bytes = sum(math.prod(d) for d in idx if isinstance(d, list) and d and all(isinstance(x, int) for x in d)) * 8
    return float(idx_bytes + a.nbytes(2) + (2 if a.flag(3, False) else 1) * a.numel(2) * a.elem(0))


def _cat(a: _Args) -> float | None:
    """cat / stack(tensors, dim): every input read once, the joined output written (TensorList carries no dtype:
    the element size comes from the kernel name's OpaqueType<N> when known, else 4 bytes)."""
    ts = a.dims[0] if a.dims else None
    if not isinstance(ts, list):
        return None
    sizes = [math.prod(d) for d in ts if isinstance(d, list) and d and all(isinstance(v, int) for v in d)]
    if not sizes:
        return None
    return float(2 * sum(sizes) * (a.elem_hint or a.elem(0)))


BYTE_MODELS: dict[str, Callable[[_Args], float | None]] = {
    "aten::layer_norm": _norm_fwd(0, 2, 3, None),
    "aten::native_layer_norm": _norm_fwd(0, 2, 3, _layer_norm_rows),
    "aten::native_layer_norm_backward": _norm_bwd(0, 1, (3, 4), 5, 2, 7),
    "aten::rms_norm": _norm_fwd(0, 2, None, None),
    "aten::_fused_rms_norm": _norm_fwd(0, 2, None, _layer_norm_rows, n_stats=1),
    "aten::_fused_rms_norm_backward": _norm_bwd(0, 1, (3,), 4, 1, 5),
    "aten::group_norm": _norm_fwd(0, 2, 3, None),
    # native_group_norm(x, weight, bias, N, C, HxW, group, eps): mean and rstd per (sample, group)
    "aten::native_group_norm": _norm_fwd(0, 1, 2, lambda a: (a.shape(0) or [1])[0] * int(a.value(6) or 1)),
    "aten::native_group_norm_backward": _norm_bwd(0, 1, (2, 3), 4, 2, 9),
    "aten::batch_norm": _batch_norm(0, 1, 2, 3, 4, 5),
    "aten::_batch_norm_impl_index": _batch_norm(0, 1, 2, 3, 4, 5),
    "aten::native_batch_norm": _batch_norm(0, 1, 2, 3, 4, 5),
    "aten::cudnn_batch_norm": _batch_norm(0, 1, 2, 3, 4, 5),
    "aten::_native_batch_norm_legit": _batch_norm(0, 1, 2, 3, 4, 5),
    "aten::_native_batch_norm_legit_no_training": _batch_norm(0, 1, 2, 3, 4, 99),
    "aten::native_batch_norm_backward": _batch_norm_bwd,
    "aten::softmax": _softmax(None),
    "aten::log_softmax": _softmax(None),
    "aten::_softmax": _softmax(2),
    "aten::_log_softmax": _softmax(2),
    "aten::_softmax_backward_data": _softmax_bwd,
    "aten::_log_softmax_backward_data": _softmax_bwd,
    "aten::sum": _reduction(1, 2),
    "aten::mean": _reduction(1, 2),
    "aten::nansum": _reduction(1, 2),
    "aten::prod": _reduction(1, 2),
    "aten::amax": _reduction(1, 2),
    "aten::amin": _reduction(1, 2),
    "aten::max": _reduction(1, 2, with_indices=True),
    "aten::min": _reduction(1, 2, with_indices=True),
    "aten::argmax": _reduction(1, 2, out_elem=8),
    "aten::argmin": _reduction(1, 2, out_elem=8),
    "aten::logsumexp": _reduction(1, 2),
    "aten::any": _reduction(1, 2, out_elem=1),
    "aten::all": _reduction(1, 2, out_elem=1),
    "aten::norm": _reduction(2, 3),
    "aten::linalg_vector_norm": _reduction(2, 3),
    "aten::var": _reduction(1, 3),
    "aten::std": _reduction(1, 3),
    "aten::embedding": _embedding,
    "aten::embedding_dense_backward": _embedding_dense_bwd,
    "aten::copy_": _copy,
    "aten::to": _to_copy(1),
    "aten::_to_copy": _to_copy(1),
    "aten::clone": _clone,
    "aten::fill_": _fill,
    "aten::zero_": _fill,
    "aten::normal_": _fill,
    "aten::uniform_": _fill,
    "aten::random_": _fill,
    "aten::bernoulli_": _fill,
    "aten::contiguous": _clone,
    "aten::index_select": _index_select,
    "aten::gather": _gather,
    "aten::scatter_": _scatter(3, False),
    "aten::scatter": _scatter(3, False),
    "aten::scatter_add_": _scatter(3, True),
    "aten::scatter_add": _scatter(3, True),
    "aten::index_add_": _scatter(3, True),
    "aten::index": _index,
    "aten::index_put_": _index_put,
    "aten::_index_put_impl_": _index_put,
    "aten::cat": _cat,
    "aten::stack": _cat,
}


def op_traffic_bytes(
    name: str | None,
    input_dims: str | None,
    input_types: str | None,
    concrete_inputs: str | None = None,
    elem_hint: int | None = None,
) -> float | None:
    """Minimum DRAM bytes of a memory-bound op from its `Input Dims`, `Input type` and `Concrete Inputs`: the op's own
    model in BYTE_MODELS (norms, softmax, reductions, embedding, copies, gathers / scatters, cat), else the
    elementwise one: every tensor input read once, one output of their broadcast shape written (in-place ops: the
    first input read and written). `elem_hint`: bytes per element where the trace gives no dtype (TensorList)."""
    if not input_dims:
        return None
    try:
        dims = json.loads(input_dims)
        types = json.loads(input_types) if input_types else []
        concrete = json.loads(concrete_inputs) if concrete_inputs else []
    except ValueError:
        return None
    if not isinstance(dims, list):
        return None
    model = BYTE_MODELS.get(name or "")
    if model is not None:
        try:
            b = model(
                _Args(dims, types if isinstance(types, list) else [], concrete if isinstance(concrete, list) else [], elem_hint)
            )
        except (TypeError, ValueError, IndexError, ZeroDivisionError):
            b = None
        return b if b is not None and math.isfinite(b) and b >= 0 else None
    sizes, shapes, elems = [], [], []
    for i, d in enumerate(dims):
        if isinstance(d, list) and d and all(isinstance(v, int) and v >= 0 for v in d):
            elem = element_bytes(types[i] if isinstance(types, list) and i < len(types) else None) or 4
            sizes.append(math.prod(d) * elem)
            shapes.append(tuple(d))
            elems.append(elem)
    if not sizes:
        return None
    # the output has the inputs' broadcast shape (RMSNorm's weight [1024] × x [16, 559, 1024] writes x's size), in
    # the first input's element size; the first input's size where the shapes do not broadcast
    try:
        n_out = math.prod(_broadcast(shapes))
    except ValueError:
        n_out = math.prod(shapes[0])
    out = n_out * elems[0]
    if (name or "") in BOOL_OUTPUT_OPS:  # comparisons write one byte per element, whatever they read
        out = n_out
    return float(sum(sizes) + out)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast shape of tensor shapes (NumPy's and PyTorch's rule); ValueError where they do not broadcast."""
    rank = max(len(x) for x in shapes)
    out = [1] * rank
    for x in shapes:
        for i, v in enumerate(x, start=rank - len(x)):
            if v != out[i] and v != 1 and out[i] != 1:
                raise ValueError(shapes)
            out[i] = v if out[i] == 1 else out[i]
    return tuple(out)


# Out-of-place ops whose output is a bool tensor.
BOOL_OUTPUT_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "isnan",
        "isinf",
        "isfinite",
        "isposinf",
        "isneginf",
        "logical_and",
        "logical_or",
        "logical_xor",
        "logical_not",
        "signbit",
    )
)


def op_precision(input_types: str | None) -> str | None:
    """Precision of a matmul-like op from its first tensor input's dtype."""
    if not input_types:
        return None
    try:
        types = json.loads(input_types)
    except ValueError:
        return None
    for t in types if isinstance(types, list) else []:
        if isinstance(t, str) and t:
            p = DTYPE_PRECISION.get(t.lower())
            if p:
                return p
    return None
