"""`RuleContext.lost_ns` has two queries: the general one (each key's intervals merged by the library's
interval_union, the losses looked up at the merged ends) and the sorted one that many unweighted intervals take
(`_lost_ns_sorted`: one sorted pass, a number per key). They must give the same numbers, bit for bit — the store's
findings are compared that way — and the keys in the same order where there are few of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plasmient_report import align as align_stage
from plasmient_report import pipeline, store
from plasmient_report.rules import context

from ..conftest import kernel, launch, write_trace


def _measured(tmp_path: Path) -> tuple[Any, context.RuleContext]:
    # Construction: 2 × 1,500 kernels on two streams of one GPU, some overlapping across the streams, with host
    # gaps of varying length between them (idle losses of several categories) — more intervals than
    # LOST_SORTED_MIN_INTERVALS.
    ev: list[dict[str, Any]] = []
    corr, t = 0, 0.0
    for i in range(1500):
        for stream, name in ((7, "void gemm_kernel<float, 128>"), (8, "void at::native::elementwise_kernel<4>")):
            corr += 1
            ev.append(launch(t, corr, corr))
            ev.append(kernel(name if i % 3 else name + " [tail]", t + 3 + stream, 2.0 + (i % 5), corr, corr, stream=stream))
        t += 9.0 + (i % 7) * 4.5
    path = write_trace(tmp_path / "many.json", ev)
    con = store.connect()
    pipeline.ingest(con, [path])
    align_stage.align(con)
    m = pipeline.measure(con, pipeline.Options())
    con.execute("SET threads = 1")  # one order of sums, as compare_outputs runs
    return con, context.prepare(con, [], m.precision, m.peaks)


@pytest.mark.parametrize(
    "key,ordered",
    [("name", True), ("NULL", True), ("stream::VARCHAR || '/' || (kernel_id % 3)::VARCHAR", True), ("kernel_id % 97", False)],
)
def test_the_sorted_query_is_the_general_one(tmp_path, monkeypatch, key, ordered):
    con, ctx = _measured(tmp_path)
    try:
        cats = sorted(c for c, ns in ctx.category_ns.items() if ns > 0)
        assert len(cats) >= 2, ctx.category_ns
        # widened kernels: the intervals of a key overlap and merge
        sql = f"SELECT {key} AS key, rank, device, start_ns - 2500 AS start_ns, end_ns + 1500 AS end_ns FROM rule_kernels"
        assert con.execute(f"SELECT count(*) FROM ({sql})").fetchone()[0] >= context.LOST_SORTED_MIN_INTERVALS
        for some in [cats, *([c] for c in cats)]:
            monkeypatch.setattr(context, "LOST_SORTED_MIN_INTERVALS", 0)
            fast = ctx.lost_ns(sql, some)
            monkeypatch.setattr(context, "LOST_SORTED_MIN_INTERVALS", 10**12)
            general = ctx.lost_ns(sql, some)
            assert fast == general, some  # floats compared exactly
            if ordered:
                assert list(fast) == list(general), some
        assert any(ctx.lost_ns(sql, cats).values())
    finally:
        context.cleanup(con)
        con.close()
