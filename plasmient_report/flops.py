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

Dims = list[Any]

DTYPE_PRECISION = {
    "c10::bfloat16": "bf16", "bfloat16": "bf16",
    "c10::half": "fp16", "half": "fp16", "float16": "fp16",
    "float": "fp32", "float32": "fp32",
    "double": "fp64", "float64": "fp64",
    "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
    "c10::float8_e5m2fnuz": "fp8",
    "signed char": "int8", "int8": "int8", "char": "int8",
}


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


def linear(d: Dims) -> float | None:
    x, w = _shape(d[0]), _shape(d[1])
    if not x or not w or len(w) != 2:
        return None
    return 2.0 * _prod(x[:-1]) * x[-1] * w[0]


def _is_causal(concrete: list[Any] | None, index: int) -> bool:
    if not concrete or index >= len(concrete):
        return False
    return str(concrete[index]).strip().lower() in ("true", "1")


def _attention(q: list[int] | None, k: list[int] | None, v: list[int] | None, causal: bool,
               layout: str = "bhsd") -> float | None:
    """2·B·H·L·S·(E + Ev), halved when causal. Layout 'bhsd' (SDPA) or 'bshd' (flash/efficient internals)."""
    if not q or not k or len(q) != 4 or len(k) != 4:
        return None
    if layout == "bhsd":
        b, h, lq, e = q
        s = k[2]
    else:
        b, lq, h, e = q
        s = k[1]
    ev = v[-1] if v and len(v) == 4 else e
    flops = 2.0 * b * h * lq * s * (e + ev)
    if causal:
        # Causal masking keeps the lower triangle: L·S − L·(L−1)/2 of L·S scores when L == S.
        flops *= 0.5 if lq == s else max(0.0, 1.0 - lq / (2.0 * s))
    return flops


def _sdpa(q_at: int, causal_at: int, layout: str = "bhsd", backward: bool = False) -> Callable[..., float | None]:
    def model(d: Dims, concrete: list[Any] | None = None) -> float | None:
        if len(d) < q_at + 3:
            return None
        f = _attention(_shape(d[q_at]), _shape(d[q_at + 1]), _shape(d[q_at + 2]),
                       _is_causal(concrete, causal_at), layout)
        return None if f is None else (2.5 * f if backward else f)

    return model


def conv(d: Dims, concrete: list[Any] | None = None, transposed: bool = False) -> float | None:
    """Convolution: 2 · N · C_out · prod(out spatial) · C_in/groups · prod(kernel)."""
    x, w = _shape(d[0]), _shape(d[1])
    if not x or not w or len(x) < 3 or len(w) != len(x):
        return None
    nsp = len(x) - 2
    groups = 1
    stride, padding, dilation = [1] * nsp, [0] * nsp, [1] * nsp
    if concrete:
        def ints(i: int) -> list[int] | None:
            if i >= len(concrete):
                return None
            try:
                v = json.loads(concrete[i]) if isinstance(concrete[i], str) and concrete[i] else concrete[i]
            except ValueError:
                return None
            if isinstance(v, int):
                return [v] * nsp
            if isinstance(v, list) and all(isinstance(t, int) for t in v):
                return list(v) if len(v) == nsp else [v[0]] * nsp
            return None

        stride = ints(3) or stride
        padding = ints(4) or padding
        dilation = ints(5) or dilation
        g = ints(8 if transposed else 6)
        groups = g[0] if g else 1
    n, cin = x[0], x[1]
    ksp = w[2:]
    if transposed:
        cout = w[1] * groups
        # FLOPs of a transposed conv equal those of the forward conv it is the gradient of (on the input grid).
        return 2.0 * n * cin * _prod(x[2:]) * (cout // max(groups, 1)) * _prod(ksp)
    cout = w[0]
    out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (ksp[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    if any(o <= 0 for o in out):
        return None
    return 2.0 * n * cout * _prod(out) * (cin // max(groups, 1)) * _prod(ksp)


def _plain(f: Callable[[Dims], float | None]) -> Callable[..., float | None]:
    return lambda d, concrete=None: f(d)


MODELS: dict[str, Callable[..., float | None]] = {
    "aten::mm": _plain(mm),
    "aten::addmm": _plain(addmm),
    "aten::bmm": _plain(bmm),
    "aten::baddbmm": _plain(baddbmm),
    "aten::matmul": _plain(matmul),
    "aten::linear": _plain(linear),
    "aten::_scaled_mm": _plain(mm),
    "aten::scaled_dot_product_attention": _sdpa(0, 5),
    "aten::_scaled_dot_product_flash_attention": _sdpa(0, 4),
    "aten::_scaled_dot_product_efficient_attention": _sdpa(0, 6),
    "aten::_scaled_dot_product_cudnn_attention": _sdpa(0, 6),
    "aten::_scaled_dot_product_flash_attention_backward": _sdpa(1, 11, backward=True),
    "aten::_scaled_dot_product_efficient_attention_backward": _sdpa(1, 11, backward=True),
    "aten::_scaled_dot_product_cudnn_attention_backward": _sdpa(1, 14, backward=True),
    "aten::_flash_attention_forward": _sdpa(0, 8, layout="bshd"),
    "aten::_flash_attention_backward": _sdpa(1, 11, layout="bshd", backward=True),
    "aten::_efficient_attention_forward": _sdpa(0, 99, layout="bshd"),
    "aten::_efficient_attention_backward": _sdpa(1, 99, layout="bshd", backward=True),
    "aten::conv1d": conv,
    "aten::conv2d": conv,
    "aten::conv3d": conv,
    "aten::convolution": lambda d, c=None: conv(d, c, transposed=_is_causal(c, 6)),
    "aten::_convolution": lambda d, c=None: conv(d, c, transposed=_is_causal(c, 6)),
    "aten::cudnn_convolution": conv,
    "aten::conv_transpose1d": lambda d, c=None: conv(d, c, transposed=True),
    "aten::conv_transpose2d": lambda d, c=None: conv(d, c, transposed=True),
    "aten::conv_transpose3d": lambda d, c=None: conv(d, c, transposed=True),
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


ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def op_bytes(name: str, input_dims: str | None, input_types: str | None) -> float | None:
    """Minimum DRAM bytes of a matmul-like op: read each operand once, write the output once.

    A lower bound on traffic, so the arithmetic intensity it gives is an upper bound: an op found
    memory-bound with it is memory-bound for sure."""
    if name not in MODELS or not input_dims:
        return None
    try:
        dims = json.loads(input_dims)
    except ValueError:
        return None
    elem = ELEMENT_BYTES.get(op_precision(input_types) or "", 2)
    shapes = [d for d in dims if _shape(d)]
    if len(shapes) < 2:
        return None
    if name in ("aten::mm", "aten::bmm", "aten::matmul", "aten::_scaled_mm") or name.endswith(("addmm", "baddbmm")):
        a, b = (shapes[1], shapes[2]) if name.endswith(("addmm", "baddbmm")) and len(shapes) >= 3 else shapes[:2]
        if len(a) < 2 or len(b) < 2:
            return None
        batch = max(_prod(a[:-2]), _prod(b[:-2]))
        return float(elem * (_prod(a) + _prod(b) + batch * a[-2] * b[-1]))
    if name == "aten::linear":
        x, w = shapes[0], shapes[1]
        return float(elem * (_prod(x) + _prod(w) + _prod(x[:-1]) * w[0]))
    # attention and convolution: operands in, one output of the query's / input's size out
    return float(elem * (sum(_prod(d) for d in shapes[:3]) + _prod(shapes[0])))


_EXTRA_ELEMENT_BYTES = {"long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "bool": 1,
                        "unsigned char": 1, "uint8": 1}


def element_bytes(type_name: Any) -> int | None:
    if not isinstance(type_name, str):
        return None
    t = type_name.lower()
    prec = DTYPE_PRECISION.get(t)
    if prec:
        return ELEMENT_BYTES.get(prec)
    return _EXTRA_ELEMENT_BYTES.get(t)


def op_traffic_bytes(name: str | None, input_dims: str | None, input_types: str | None) -> float | None:
    """DRAM bytes of an elementwise-like op: every tensor input read once, one output the size of the first
    input written (in-place ops: the first input read and written). `copy_(dst, src)`: src read, dst written."""
    if not input_dims:
        return None
    try:
        dims = json.loads(input_dims)
        types = json.loads(input_types) if input_types else []
    except ValueError:
        return None
    if not isinstance(dims, list):
        return None
    sizes = []
    for i, d in enumerate(dims):
        if isinstance(d, list) and d and all(isinstance(v, int) and v >= 0 for v in d):
            elem = element_bytes(types[i] if isinstance(types, list) and i < len(types) else None) or 4
            sizes.append(math.prod(d) * elem)
    if not sizes:
        return None
    if name in ("aten::copy_",):
        return float(sum(sizes))
    return float(sum(sizes) + sizes[0])


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
