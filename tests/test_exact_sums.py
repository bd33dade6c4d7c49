"""The run's sums of FLOPs and bytes are taken in fixed point (vocab.AMOUNT_FIXED_SCALE, exact_sum): the same to the
last digit whatever order DuckDB's threads add the rows in, so two runs of one trace write the same verdict."""

from __future__ import annotations

import math

from plasmient_report import pipeline

from .conftest import cpu_op, kernel, launch, write_trace

GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def test_flops_are_summed_exactly_whatever_the_order(tmp_path):
    # Construction: one GEMM kernel launched 100 times by aten::mm, alternately 2^18 × 2^17 · 2^17 × 2^18 (2·m·n·k
    # = 2^54 FLOPs) and 1 × 1 · 1 × 1 (2 FLOPs). Past 2^54, doubles are 4 or more apart: a 2 added to the running
    # sum rounds away, so a sum in time order (or in most orders) loses them; only adding every small one first
    # keeps them. The exact sum, rounded once (math.fsum), is what every run must print.
    big, one = (2**18, 2**17, 2**18), (1, 1, 1)
    ev, flops = [], []
    for i in range(100):
        m, k, n = big if i % 2 == 0 else one
        flops.append(2.0 * m * n * k)
        t = 1000.0 * i
        ev += [
            cpu_op("aten::mm", t + 1.0, 5.0, ext=i + 1, dims=[[m, k], [k, n]], types=["float", "float"]),
            launch(t + 2.0, i + 1, 10 + i),
            kernel(GEMM, t + 10.0, 500.0, ext=i + 1, corr=10 + i),
        ]
    res = pipeline.analyse([write_trace(tmp_path / "t.json", ev)], pipeline.Options())
    try:
        v = res.verdict
    finally:
        res.close()
    want = math.fsum(flops)  # 50 · 2^54 + 100, rounded once
    (k,) = [x for x in v["top_kernels"] if x["name"] == GEMM]
    (o,) = [x for x in v["top_ops"] if x["op"] == "aten::mm"]
    assert k["flops"] == want and o["flops"] == want, (k["flops"] - want, o["flops"] - want)
