"""Shared fixtures: the corpus (skipped cleanly when absent), the project's samples, tiny synthetic traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
CORPUS = ROOT.parent / "shared" / "corpus"


def corpus_file(rel: str) -> Path:
    p = CORPUS / rel
    if not p.exists():
        pytest.skip(f"../shared/corpus not present ({rel}): corpus tests need the shared corpus beside the checkout")
    return p


def sample_file(rel: str) -> Path:
    p = SAMPLES / rel
    if not p.exists():
        pytest.fail(f"committed sample {rel} is missing from sample_traces/")
    return p


BASE = 1_790_000_000_000_000_000  # a baseTimeNanoseconds (2026-09)


def kernel(
    name: str, ts: float, dur: float, ext: int, corr: int, device: int = 0, stream: int = 7, cat: str = "kernel", **extra: Any
) -> dict[str, Any]:
    args = {"External id": ext, "device": device, "stream": stream, "correlation": corr, **extra}
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def cpu_op(
    name: str, ts: float, dur: float, ext: int, dims: Any = None, types: Any = None, tid: int = 1, **extra: Any
) -> dict[str, Any]:
    args: dict[str, Any] = {"External id": ext, **extra}
    if dims is not None:
        args["Input Dims"] = dims
    if types is not None:
        args["Input type"] = types
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(ts: float, ext: int, corr: int, tid: int = 1) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": 2.0,
        "args": {"External id": ext, "correlation": corr, "cbid": 211},
    }


def annotation(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": 0},
    }


def write_trace(
    path: Path,
    events: list[dict[str, Any]],
    rank: int | None = None,
    gpu: str = "NVIDIA H100 80GB HBM3",
    base: int | None = BASE,
    gz: bool = False,
) -> Path:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": gpu, "numSms": 132}], "traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    data = json.dumps(doc).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def unknown_gpu_trace(path: Path) -> Path:
    """A GPU the peak table does not know ("Acme Tensor Engine 9"), in a 1000 µs range `work`: a 4096³ bf16 GEMM
    kernel of 200 µs (its FLOPs known, its peak not), an fp32 elementwise add of 100 µs (memory-bound, ~0 FLOPs),
    700 µs with nothing resident.

    Truth, by construction, over the range: utilization 0.3; the add 0.1 memory-bound; 0.7 idle; the GEMM's 0.2 in
    no loss category — achieved and compute inefficiency together, which only a peak tells apart."""
    n = 2**26
    ev = [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::mm", 10.0, 5.0, ext=1, dims=[[4096, 4096], [4096, 4096]], types=["c10::BFloat16"] * 2),
        launch(11.0, 1, 10),
        kernel("nvjet_sm90_tst_gemm", 100.0, 200.0, ext=1, corr=10),
        cpu_op("aten::add_", 400.0, 5.0, ext=2, dims=[[n], [n], []], types=["float", "float", "Scalar"]),
        launch(401.0, 2, 11),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", 500.0, 100.0, ext=2, corr=11
        ),
    ]
    return write_trace(path, ev, gpu="Acme Tensor Engine 9")


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    """One 4096³ bf16 mm (1.1e11 FLOP) whose kernel runs 200 µs inside a 1000 µs profiled window.

    Truth: utilization (200 + 5) / 1000 = 0.205; achieved = 1.374e11 / (1e-3 s · 989.4e12) = 0.1389 on an H100 SXM (bf16)."""
    n = 4096
    ev = [
        annotation("phase:work", 0.0, 1000.0),
        cpu_op("aten::mm", 10.0, 20.0, ext=5, dims=[[n, n], [n, n]], types=["c10::BFloat16", "c10::BFloat16"]),
        launch(12.0, ext=5, corr=50),
        kernel("nvjet_sm90_tst_gemm", 100.0, 200.0, ext=5, corr=50),
        cpu_op("aten::add_", 990.0, 5.0, ext=6),
        launch(991.0, ext=6, corr=51),
        kernel("vectorized_elementwise_kernel", 995.0, 5.0, ext=6, corr=51),
    ]
    return write_trace(tmp_path / "tiny.pt.trace.json", ev)


def counter_value(ev: Any) -> float:
    """A counter event's value as the trace processor reads it: `counter_value` (int64) when set, else
    `double_counter_value`."""
    return float(ev.counter_value) if ev.HasField("counter_value") else ev.double_counter_value
