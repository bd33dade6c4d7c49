"""How findings write numbers and names: durations, shares, byte counts, short kernel names, and op chains folded
into their repeating unit. Wording only; no queries.
"""

from __future__ import annotations

from ..vocab import kernel_label

__all__ = ["fmt_bytes", "fmt_ns", "pct", "repeat_unit", "short_kernel"]


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    ns = float(ns)
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.1f} ms" if a >= 1e7 else f"{ns / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    if 0 < abs(x) < 0.01:
        return f"{x:.1%}"
    return f"{x:.0%}"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "n/a"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def short_kernel(name: str | None, width: int = 72) -> str:
    """`void at::native::vectorized_elementwise_kernel<4, AUnaryFunctor<…MulFunctor<float>>…>(…)` →
    `vectorized_elementwise_kernel [MulFunctor]` (`vocab.kernel_label`), cut at `width`."""
    if not name:
        return "?"
    out = kernel_label(name)
    return out if len(out) <= width else out[: width - 1] + "…"


def repeat_unit(seq: list[str]) -> tuple[list[str], int]:
    """The shortest unit whose repetition makes `seq` (a chain of op names): ([mul_, add_], 40)."""
    n = len(seq)
    for k in range(1, n // 2 + 1):
        if n % k == 0 and seq[:k] * (n // k) == seq:
            return seq[:k], n // k
    return seq, 1
