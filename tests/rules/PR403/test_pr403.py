"""PR403 pageable-or-sync-memcpy: fires on pageable host↔device copies (PyTorch and plain CUDA advice), silent on
pinned asynchronous copies."""

from __future__ import annotations

from ...conftest import annotation, write_trace
from ..expect import Expect, Near, analyse, check, single_phase
from ..traces import memcpy, runtime


def _copy(name: str, t0: float, call_us: float, lag_us: float, dur_us: float, nbytes: int, corr: int, ext: int):
    """A cudaMemcpyAsync call of `call_us` at t0 and its copy `lag_us` later on the GPU."""
    call = runtime("cudaMemcpyAsync", t0, call_us, corr=corr, ext=ext)
    return [call, memcpy(name, t0 + lag_us, dur_us, nbytes, corr=corr, ext=ext)]


def _pageable(tmp_path, ops: bool):
    # Construction: 4 HtoD copies of 64 MB from pageable memory, 10 ms each (6.4 GB/s), in a 50 ms window.
    ev = [annotation("step", 0.0, 50_000.0)]
    for i in range(4):
        t0 = 1000.0 + i * 12_000.0
        ev.append(runtime("cudaMemcpyAsync", t0, 10_005.0, corr=100 + i, ext=10 + i))
        ev.append(memcpy("Memcpy HtoD (Pageable -> Device)", t0 + 2.0, 10_000.0, 64_000_000, corr=100 + i, ext=10 + i))
        if ops:
            from ...conftest import cpu_op

            ev.append(cpu_op("aten::copy_", t0 - 1.0, 10_010.0, ext=10 + i))
    return analyse([write_trace(tmp_path / "copies.json", ev)])


def test_fires_on_pageable_copies(tmp_path):
    check(
        _pageable(tmp_path, ops=True),
        [
            Expect(
                "PR403",
                category="memcpy",
                evidence={
                    "pageable_copies.0.direction": "HtoD",
                    "pageable_copies.0.count": 4,
                    "pageable_copies.0.gb_s": Near(6.4, rel=0.01, truth="construction: 64 MB / 10 ms"),
                },
                says=[r"pin_memory=True"],
            )
        ],
    )


def test_cuda_advice_without_pytorch(tmp_path):
    check(
        _pageable(tmp_path, ops=False),
        [Expect("PR403", says=[r"cudaHostAlloc|cudaMallocHost"], never_says=[r"pin_memory", r"non_blocking", r"DataLoader"])],
    )


def test_silent_on_pinned_async_copies():
    # the host-stall phase's .item() copies are 'Memcpy DtoH (Device -> Pinned)' via cudaMemcpyAsync
    check(single_phase("host_stall"), [], silent=["PR403"])


def test_the_headline_bandwidth_is_the_bytes_over_the_time(tmp_path):
    # Construction (pipit's cloverleaf export has this shape: 254 HtoD copies of 225 MB at 24 GB/s beside 25 DtoH
    # copies of 2 KB, latency-bound at 1.1 GB/s, which the headline said): 4 HtoD copies of 64 MB, 10 ms each, and
    # 4 DtoH copies of 2 KB, 2 µs each. Together 256.008 MB in 40.008 ms: 6.4 GB/s, not the small copies' 1.0.
    ev = [annotation("step", 0.0, 60_000.0)]
    for i in range(4):
        t0 = 1000.0 + i * 12_000.0
        ev += _copy("Memcpy HtoD (Pageable -> Device)", t0, 10_005.0, 2.0, 10_000.0, 64_000_000, 100 + i, 10 + i)
        ev += _copy("Memcpy DtoH (Device -> Pageable)", t0 + 10_100.0, 5.0, 1.0, 2.0, 2_000, 200 + i, 20 + i)
    v = analyse([write_trace(tmp_path / "mixed.json", ev)])
    (f,) = [x for x in v["findings"] if x["rule"] == "PR403"]
    assert "(8 pageable, 6.4 GB/s)" in f["fix"], f["fix"]


def test_pinned_copies_are_not_told_to_pin(tmp_path):
    # Construction: 4 async HtoD copies of 64 MB from pinned memory, 10 ms each, in a 50 ms window (the public H100
    # nsysai export: 1.84 s of pinned HtoD copies, 97% of its window, read "pinned memory, async copies"). PR403 is
    # silent; the waterfall's copy line does not advise what is done already.
    ev = [annotation("step", 0.0, 50_000.0)]
    for i in range(4):
        ev += _copy("Memcpy HtoD (Pinned -> Device)", 1000.0 + i * 12_000.0, 5.0, 6.0, 10_000.0, 64_000_000, 100 + i, 10 + i)
    v = analyse([write_trace(tmp_path / "pinned.json", ev)])
    assert not [x for x in v["findings"] if x["rule"] == "PR403"]
    (line,) = [x for x in v["losses"] if x["category"] == "memcpy"]
    assert line["recommendation"].startswith("host copies already pinned"), line
