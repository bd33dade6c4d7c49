"""A FLOP or byte estimate no kernel can have (above vocab.MAX_KERNEL_AMOUNT: 1e21, 55 hours of the fastest GPU in
peaks.toml at its peak) is left out: the kernel's work is unknown, and the notes say so (kernel_flops.write).
Fuzzing found 10^30 FLOPs overflowing the fixed-point sums (a HUGEINT) in the verdict's roofline."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plasmient_report import metrics, pipeline, vocab

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_single" / "kineto_single.pt.trace.json.gz"


def test_a_matmul_of_impossible_size_is_unknown_work_not_a_crash(tmp_path: Path) -> None:
    doc = json.loads(gzip.open(SAMPLE).read())
    mms = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm" and (e.get("args") or {}).get("Input Dims")]
    assert mms, "the H200 sample has aten::mm ops with shapes"
    target = mms[0]
    target["args"]["Input Dims"] = [[2**40, 2**40], [2**40, 2**40]]  # 2 * 2^120 FLOPs by the matmul model
    trace = tmp_path / "huge.pt.trace.json"
    trace.write_text(json.dumps(doc))
    res = pipeline.analyse([trace], pipeline.Options())
    try:
        con = res.con
        (too_big,) = con.execute(
            "SELECT count(*) FROM kernels WHERE flops > ? OR bytes > ?", [vocab.MAX_KERNEL_AMOUNT, vocab.MAX_KERNEL_AMOUNT]
        ).fetchone() or (None,)
        assert too_big == 0
        # the op's kernels (its GEMM; the op also launched a copy): no FLOP estimate, no owner, classed as work of unknown FLOPs
        rows = con.execute(
            """SELECT k.flops, k.flops_op_id, c.class FROM kernels k JOIN kernel_class c USING (kernel_id)
               JOIN kernel_launch l USING (kernel_id) JOIN ops o ON o.op_id = l.op_id
               WHERE o.name = 'aten::mm' AND o.external_id = ? AND k.kind = 'compute'""",
            [target["args"]["External id"]],
        ).fetchall()
        assert rows and all(f is None and owner is None and cls == "unknown" for f, owner, cls in rows)
        assert any("FLOP estimates left out" in n for n in res.verdict["notes"])
        achieved = res.verdict["achieved_fraction_of_peak"]
        assert achieved is not None and 0 <= achieved <= 1
        assert achieved + sum(metrics.loss_fractions(con, "window", None, None).values()) == pytest.approx(1.0, abs=1e-9)
    finally:
        res.close()
