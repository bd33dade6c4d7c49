"""sync_stall charges an idle gap to the host sync that began it; when the syncs hardly waited, the idle time is the
host's own work after them (a sync that returns at once cannot be what keeps a GPU idle for milliseconds): the
verdict says how long they actually waited (a real case: TraceLens's H100 timesformer trace, a 0.04 ms sync
charged with 223 ms; and our own h200_single recording, whose syncs wait ~5 ms before 200 ms host sleeps)."""

from __future__ import annotations

import re

import pytest

from .conftest import kernel, launch, write_trace
from .rules.expect import analyse
from .rules.traces import runtime


def test_a_sync_that_hardly_waited_is_said_to_recover_little(tmp_path):
    # Construction: a 100 µs kernel; the host syncs at 50 µs (waits 51 µs, returns at 101), then does 10 ms of its
    # own work before launching the next kernel at 10,101 µs. The gap (10,000 µs) is sync_stall; the sync waited 51.
    ev = [launch(1.0, ext=1, corr=1), kernel("k1", 0.0, 100.0, ext=1, corr=1), runtime("cudaDeviceSynchronize", 50.0, 51.0)]
    ev += [launch(10_095.0, ext=2, corr=2), kernel("k2", 10_101.0, 100.0, ext=2, corr=2)]
    v = analyse([write_trace(tmp_path / "t.json", ev)], write_html=False, write_trace=False)
    assert next(x["fraction"] for x in v["losses"] if x["category"] == "sync_stall") > 0.9
    (said,) = [n for n in v["notes"] if n.startswith("sync stall")]
    waited, charged = (float(x) for x in re.findall(r"waited ([\d.,]+) ms of the ([\d.,]+) ms", said)[0])
    assert waited == pytest.approx(0.05, abs=0.01)  # construction: 51 µs, at most the gap
    assert charged == pytest.approx(9.994, abs=0.02)  # the gap less the launch call's own time (6 µs, launch-bound)


def test_a_sync_that_waited_for_the_gpu_says_nothing_more(tmp_path):
    # The host syncs right after launching 10 ms of GPU work (it waits 9,990 µs), then launches the next kernel
    # 90 µs after the sync returns: the wait is the whole story, nothing to add.
    ev = [launch(1.0, ext=1, corr=1), kernel("k1", 5.0, 10_000.0, ext=1, corr=1), runtime("cudaDeviceSynchronize", 10.0, 9_996.0)]
    ev += [launch(10_080.0, ext=2, corr=2), kernel("k2", 10_096.0, 100.0, ext=2, corr=2)]
    v = analyse([write_trace(tmp_path / "t.json", ev)], write_html=False, write_trace=False)
    assert not [n for n in v["notes"] if n.startswith("sync stall")]
