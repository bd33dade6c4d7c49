"""torch <= 1.9 records the DataLoader's `__next__` as an op (category Operator), not a user annotation: the GPU idle
inside it is still input-bound. And a profile begun mid-run can open on a long copy: that is a copy, not the
context's creation. Found on the kineto repo's ResNet50 sample (V100, torch 1.9, num_workers=0): its six 62–73 ms
idle gaps, each wholly inside `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`, read "nothing traced
on the host", and its first call (a 2 ms pageable cudaMemcpyAsync of the batch, the profile opening at
ProfilerStep#5) one-time start-up."""

from __future__ import annotations

import pytest

from .conftest import cpu_op, kernel, launch, write_trace
from .rules.expect import analyse
from .rules.traces import runtime

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def test_an_old_traces_dataloader_op_is_input_bound(tmp_path):
    # Construction: a 2,000 µs cudaMemcpyAsync opens the profile (0–2,000 µs, its copy 100–1,900 µs on the GPU);
    # kernel 1 runs 2,010–2,110 µs; the DataLoader op holds the host 2,120–9,000 µs; kernel 2 runs 9,020–9,120 µs.
    ev = [runtime("cudaMemcpyAsync", 0.0, 2000.0)]
    ev += [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
            "ts": 100.0, "dur": 1800.0, "args": {"device": 0, "stream": 7, "bytes": 1 << 20}}]  # fmt: skip
    ev += [launch(2001.0, ext=1, corr=1), kernel("k1", 2010.0, 100.0, ext=1, corr=1)]
    ev += [cpu_op(LOADER, 2120.0, 6880.0, 2), launch(9010.0, ext=3, corr=3), kernel("k2", 9020.0, 100.0, ext=3, corr=3)]
    v = analyse([write_trace(tmp_path / "old.json", ev)], write_html=False, write_trace=False)
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    # the gap 2,110–9,020 µs (6,910 µs) of the 0–9,120 µs window is inside the DataLoader op
    assert cats.get("input_bound", 0) == pytest.approx(6910 / 9120, abs=0.01), cats
    assert "startup" not in cats, cats
    # and PR504 names the DataLoader as what the host was in, not "nothing traced on the host"
    (gap,) = [f for f in v["findings"] if f["rule"] == "PR504"]
    assert gap["evidence"]["gaps"][0]["host"] == f"host in range {LOADER}", gap["evidence"]["gaps"][0]
