"""An idle gap is a sync stall only when the host sync that returned in it was blocking when the GPU went idle: one
called after the GPU had gone idle waited for nothing. Found on public traces (TraceLens): an HF TimeSformer
pipeline on an H100 read "sync stall 58%, one 218 ms wait after torch.cuda.synchronize()" of a 14 µs
cudaDeviceSynchronize called in the middle of 218 ms of video preprocessing; a vLLM MI300X trace read "sync stall
49%" of a 4 µs hipEventSynchronize returning 90 µs into a 151 ms gap."""

from __future__ import annotations

import pytest

from .conftest import cpu_op, kernel, launch, write_trace
from .rules.expect import analyse
from .rules.traces import runtime


@pytest.mark.parametrize(("sync_at", "stall"), [(95.0, True), (3000.0, False)])
def test_only_a_blocking_sync_makes_a_stall(tmp_path, sync_at: float, stall: bool) -> None:
    # Construction: kernel 1 runs 0–100 µs; the host then preprocesses (a cpu op 100–5,000 µs) and launches kernel 2
    # at 5,000 µs (it runs 5,010–5,110 µs): a 4,910 µs idle gap. A cudaDeviceSynchronize of 14 µs either begins at
    # 95 µs, blocking until kernel 1 ends (returns at 109 µs: the gap is the queue run dry behind it), or is called
    # at 3,000 µs inside the preprocessing, with the GPU long idle (it waited for nothing: the gap is the host's work).
    ev = [launch(1.0, ext=1, corr=1), kernel("k1", 0.0, 100.0, ext=1, corr=1)]
    ev += [cpu_op("preprocess", 100.0, 4900.0, 2), runtime("cudaDeviceSynchronize", sync_at, 14.0)]
    ev += [launch(5000.0, ext=3, corr=3), kernel("k2", 5010.0, 100.0, ext=3, corr=3)]
    v = analyse([write_trace(tmp_path / f"s{sync_at:.0f}.json", ev)], write_html=False, write_trace=False)
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    gap = 4910 / 5110  # the idle gap's share of the 0–5,110 µs window
    if stall:
        assert cats.get("sync_stall", 0) == pytest.approx(gap, abs=0.01), cats
    else:
        assert "sync_stall" not in cats and cats.get("host_other", 0) == pytest.approx(gap, abs=0.01), cats
        assert not [f for f in v["findings"] if f["rule"] == "PR502"]
