"""PR403 pageable-or-sync-memcpy: fires on pageable host↔device copies (PyTorch and plain CUDA advice), silent on
pinned asynchronous copies."""

from __future__ import annotations

from ...conftest import annotation, write_trace
from ..expect import Expect, Near, analyse, check, single_phase
from ..traces import memcpy, runtime


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
