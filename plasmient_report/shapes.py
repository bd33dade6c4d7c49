"""The per-shape table's input (sql/op_shapes.sql): each distinct shape of a matmul-class op, read by the FLOP
models' own reading of the op's inputs (flops.op_shape), evaluated once per distinct (name, dims, types, concrete
inputs), never per event; then sql/shapes.sql (each kernel's shape op, the per-shape macro)."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from . import sql
from .flops import ATTENTION_OPS, CONV_OPS, GEMM_OPS, SHAPE_FIELDS, op_shape

SHAPE_OPS = sorted({*GEMM_OPS, *ATTENTION_OPS, *CONV_OPS, "aten::convolution_backward"})


def _dtype(name: str, input_types: str | None) -> str | None:
    """The dtype of the op's first matrix operand, `c10::` dropped."""
    try:
        types = json.loads(input_types) if input_types else None
    except ValueError:
        return None
    if not isinstance(types, list):
        return None
    at = (
        GEMM_OPS[name][0]
        if name in GEMM_OPS
        else ATTENTION_OPS[name][0]
        if name in ATTENTION_OPS
        else 1
        if name == "aten::convolution_backward"
        else 0
    )
    t = types[at] if at < len(types) else None
    if not isinstance(t, str) or not t:
        return None
    for prefix in ("c10::", "at::"):
        t = t.removeprefix(prefix)
    return t


def fill(con: duckdb.DuckDBPyConnection) -> None:
    """Fill `op_shapes` from the matmul-class ops of the trace, then install `shapes` (each kernel's shape op and
    the per-shape macro)."""
    sql.install(con, "op_shapes")
    keys = con.execute(
        """
        SELECT DISTINCT o.name, o.input_dims, o.input_types, o.concrete_inputs FROM ops o
        WHERE o.name IN (SELECT unnest(?::VARCHAR[]))""",
        [SHAPE_OPS],
    ).fetchall()
    rows = []
    for name, dims, types, concrete in keys:
        s = op_shape(name, dims, concrete)
        if s is not None:
            rows.append(
                {
                    "name": name,
                    "input_dims": dims,
                    "input_types": types,
                    "concrete_inputs": concrete,
                    "dtype": _dtype(name, types),
                    **s,
                }
            )
    cols = [
        "name",
        "input_dims",
        "input_types",
        "concrete_inputs",
        "family",
        "shape",
        "dtype",
        *[f for f in SHAPE_FIELDS if f not in ("family", "shape")],
    ]
    if rows:
        table = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows])
        con.register("_op_shapes_in", table)
        try:
            con.execute(f"INSERT INTO op_shapes ({', '.join(cols)}) SELECT {', '.join(cols)} FROM _op_shapes_in")
        finally:
            con.unregister("_op_shapes_in")
    sql.install(con, "shapes")
