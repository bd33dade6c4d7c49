"""Helpers the rule modules share: kernel-name patterns, short kernel names, unit formatting, and the ops' byte
models (flops.op_traffic_bytes, from `Input Dims` / `Input type` / `Concrete Inputs`), evaluated once per distinct shape.
"""

from __future__ import annotations

import re

import duckdb

from ..kernel_flops import evaluate_op_bytes, op_byte_shapes_sql
from ..vocab import ELEMENTWISE_KERNEL_RE, MATMUL_NAME_RE, NON_TENSOR_CORE_RE, NOT_ELEMENTWISE_RE, TENSOR_CORE_RE

__all__ = ["ELEMENTWISE_KERNEL_RE", "MATMUL_NAME_RE", "NON_TENSOR_CORE_RE", "NOT_ELEMENTWISE_RE", "TENSOR_CORE_RE",
           "drop", "fmt_bytes", "fmt_ns", "pct", "register_op_bytes", "repeat_unit", "short_kernel"]


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
    `vectorized_elementwise_kernel [MulFunctor]`."""
    if not name:
        return "?"
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    n = re.sub(r"at::native::|\(anonymous namespace\)::|<unnamed>::|at_cuda_detail::|cub::detail::|std::|c10::", "", n)
    depth = 0
    for i, ch in enumerate(n):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            n = n[:i]
            break
    base, _, inner = n.partition("<")
    base = base.split("::")[-1] or base
    tags = [t for t in re.findall(r"([A-Za-z_]\w*(?:Functor\w*|KernelImpl|_kernel_cuda|_kernel_impl))", inner)
            if t not in ("AUnaryFunctor", "BUnaryFunctor", "BinaryFunctor", "UnaryFunctor")]
    out = f"{base} [{tags[-1].split('::')[-1]}]" if tags else base
    return out if len(out) <= width else out[: width - 1] + "…"


def register_op_bytes(con: duckdb.DuckDBPyConnection, ops_table: str, view: str = "_rule_op_bytes") -> None:
    """Register `view(op_id, traffic_bytes)` for the ops of `ops_table` that launched kernels (one model
    evaluation per distinct (name, dims, types, concrete inputs), not per op)."""
    evaluate_op_bytes(con, op_byte_shapes_sql(ops_table, "rule_kernels"), f"{view}_b")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {view} AS SELECT op_id, b AS traffic_bytes FROM {view}_b")
    con.execute(f"DROP TABLE {view}_b")


def drop(con: duckdb.DuckDBPyConnection, *tables: str) -> None:
    for t in tables:
        con.execute(f"DROP TABLE IF EXISTS {t}")


def repeat_unit(seq: list[str]) -> tuple[list[str], int]:
    """The shortest unit whose repetition makes `seq` (a chain of op names): ([mul_, add_], 40)."""
    n = len(seq)
    for k in range(1, n // 2 + 1):
        if n % k == 0 and seq[:k] * (n // k) == seq:
            return seq[:k], n // k
    return seq, 1
