"""Small synthetic Kineto traces for the rule fixtures, built event by event so that the truth of each is known
from its construction (times in µs, as Kineto writes them). Built on tests/conftest.py's helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..conftest import BASE, annotation, cpu_op, kernel, launch, write_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def runtime(name: str, ts: float, dur: float, corr: int = 0, ext: int = 0, tid: int = 1) -> dict[str, Any]:
    """A CUDA runtime call on the host (a sync, a free, a copy call …)."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": ext, "correlation": corr},
    }


def memory(ts: float, nbytes: int, allocated: int, reserved: int, addr: int, device: int = 0, tid: int = 1) -> dict[str, Any]:
    """A caching-allocator `[memory]` instant (profile_memory=True): the block's signed size and the allocator's
    totals after it, as torch >= 1.10 writes them."""
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "args": {
            "Total Reserved": reserved,
            "Total Allocated": allocated,
            "Bytes": nbytes,
            "Device Id": device,
            "Device Type": 1,
            "Addr": addr,
        },
    }


def memcpy(name: str, ts: float, dur: float, nbytes: int, corr: int, ext: int = 0, stream: int = 7) -> dict[str, Any]:
    return kernel(name, ts, dur, ext, corr, stream=stream, cat="gpu_memcpy", bytes=nbytes)


def write_gpu_trace(
    path: Path,
    events: list[dict[str, Any]],
    gpu: str,
    sms: int,
    major: int,
    minor: int,
    warp: int = 32,
    rocm: bool = False,
    memory_bytes: int | None = 192 * 2**30,
    rank: int | None = None,
    world_size: int = 2,
) -> Path:
    """A trace whose deviceProperties give the GPU's SM / CU count, architecture and memory (`totalGlobalMem`;
    None: left out) — write_trace gives only an H100's name and SM count. `rank`: one rank of a `world_size` run."""
    props: dict[str, Any] = {"id": 0, "name": gpu, "numSms": sms, "computeMajor": major, "computeMinor": minor, "warpSize": warp}
    if memory_bytes is not None:
        props["totalGlobalMem"] = memory_bytes
    doc: dict[str, Any] = {"schemaVersion": 1, "baseTimeNanoseconds": BASE, "traceEvents": events, "deviceProperties": [props]}
    if rocm:
        doc["roctracer_version"] = "4.1"
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    path.write_text(json.dumps(doc))
    return path


def nccl_kernel(
    name: str,
    ts: float,
    dur: float,
    ext: int,
    corr: int,
    collective: str,
    ranks: str = "[0, 1]",
    stream: int = 20,
    nelems: int = 1 << 20,
    pg: str = "0",
) -> dict[str, Any]:
    return kernel(
        name,
        ts,
        dur,
        ext,
        corr,
        stream=stream,
        **{
            "Collective name": collective,
            "Process Group Name": pg,
            "Process Group Ranks": ranks,
            "Group size": 2,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "dtype": "BFloat16",
        },
    )


def allreduce_traces(
    tmp: Path, skew_us: float = 0.0, overlap: bool = False, n: int = 3, first_only_us: float = 0.0
) -> list[Path]:
    """Two ranks, n steps of a 4096³ bf16 mm (200 µs) then one all-reduce (150 µs of transfer), a step every
    1000 + `skew_us` µs. Rank 1's mm takes `skew_us` longer, so it reaches each all-reduce that late; with `overlap`,
    both ranks run a compute kernel on another stream while the all-reduce transfers; `first_only_us` makes rank 1
    that late to the first all-reduce only (start-up skew)."""
    paths = []
    d = 4096
    for rank in (0, 1):
        ev: list[dict[str, Any]] = []
        corr = 1000 * (rank + 1)
        shift = 0.0
        for i in range(n):
            t0 = i * (1000.0 + skew_us) + shift
            late = (skew_us + (first_only_us if i == 0 else 0.0)) if rank == 1 else 0.0
            ev.append(cpu_op("aten::mm", t0, 2.0, ext=corr, dims=[[d, d], [d, d]], types=["c10::BFloat16"] * 2))
            ev.append(launch(t0 + 0.5, ext=corr, corr=corr))
            ev.append(kernel(GEMM, t0 + 3.0, 197.0 + late, ext=corr, corr=corr))
            ar_start = t0 + 200.0 + late
            ar_end = t0 + 200.0 + skew_us + (first_only_us if i == 0 else 0.0) + 150.0  # ends together on both ranks
            ev.append(
                nccl_kernel(
                    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    ar_start,
                    ar_end - ar_start,
                    ext=corr + 1,
                    corr=corr + 1,
                    collective="allreduce",
                )
            )
            if overlap:
                ev.append(kernel(GEMM, ar_start, ar_end - ar_start, ext=corr + 2, corr=corr + 2, stream=8))
            corr += 10
            if i == 0:
                shift = first_only_us
        ev.append(annotation("train", 0.0, n * (1000.0 + skew_us) + first_only_us))
        paths.append(write_trace(tmp / f"rank{rank}.json", ev, rank=rank))
    return paths


def gpipe_traces(
    tmp: Path,
    stages: int = 2,
    micro: int = 4,
    tf: float = 100.0,
    tb: float = 200.0,
    c: float = 10.0,
    rank_of_stage: list[int] | None = None,
    steps_marked: bool = True,
) -> list[Path]:
    """A GPipe schedule (all forwards, then all backwards), one trace per rank, times in µs: each micro-batch's
    forward takes `tf` and backward `tb` on every stage; activations and gradients reach the next stage `c`
    after they are produced (P2P send/recv kernels with the trace's `Collective name` send / recv). Each
    direction of each stage pair gets its own process-group name: the library pairs collectives by (process group,
    collective, seq), which would mistake one stage's sends for another's in one group. With `steps_marked`, the
    step is a ProfilerStep#1 range."""
    p, m = stages, micro
    ranks = rank_of_stage or list(range(p))
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    ev: list[list[dict[str, Any]]] = [[] for _ in range(p)]
    ids = iter(range(10, 10**6))
    send = recv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"

    def pair(s: int, t: int) -> str:
        return str(sorted([ranks[s], ranks[t]]))

    def pg(s: int, t: int) -> str:  # one group per direction and stage pair
        return f"pp{min(s, t)}{'fwd' if t > s else 'bwd'}"

    for s in range(p):
        prev_end, recv_posted = 0.0, 0.0
        for i in range(m):
            arrive = f_end[s - 1][i] + c if s else 0.0
            start = max(prev_end, arrive)
            if s:
                k = next(ids)
                ev[s].append(
                    nccl_kernel(recv, recv_posted, arrive - recv_posted, k, k, "recv", pair(s, s - 1), stream=21, pg=pg(s - 1, s))
                )
                recv_posted = arrive
            f_end[s][i] = start + tf
            k = next(ids)
            ev[s].append(kernel(GEMM, start, tf, k, k))
            if s < p - 1:
                k = next(ids)
                ev[s].append(nccl_kernel(send, f_end[s][i], c, k, k, "send", pair(s, s + 1), pg=pg(s, s + 1)))
            prev_end = f_end[s][i]
    for s in reversed(range(p)):
        prev_end = f_end[s][m - 1]
        recv_posted = prev_end
        for i in reversed(range(m)):
            arrive = b_end[s + 1][i] + c if s < p - 1 else 0.0
            start = max(prev_end, arrive)
            if s < p - 1:
                k = next(ids)
                ev[s].append(
                    nccl_kernel(
                        recv,
                        recv_posted,
                        max(arrive - recv_posted, 1.0),
                        k,
                        k,
                        "recv",
                        pair(s, s + 1),
                        stream=21,
                        pg=pg(s + 1, s),
                    )
                )
                recv_posted = arrive
            b_end[s][i] = start + tb
            k = next(ids)
            ev[s].append(kernel(GEMM, start, tb, k, k))
            if s:
                k = next(ids)
                ev[s].append(nccl_kernel(send, b_end[s][i], c, k, k, "send", pair(s, s - 1), pg=pg(s, s - 1)))
            prev_end = b_end[s][i]
    step_end = max(max(x) for x in b_end) + 1.0
    paths = []
    for s in range(p):
        ev[s].append(annotation("ProfilerStep#1" if steps_marked else "pipeline", 0.0, step_end))
        paths.append(write_trace(tmp / f"stage{s}_rank{ranks[s]}.json", ev[s], rank=ranks[s]))
    return paths
