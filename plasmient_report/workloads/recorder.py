"""Recording a `measure` run on one GPU: the GPU's ceilings (a large bf16 GEMM, a device copy), then for each
workload its unprofiled step time (the truth: analytic FLOPs / this time) and one profiled run under the PyTorch
profiler with NVML sampled every 10 ms. Writes a recording folder that `report.py` analyses:

    recording/measure.json                       settings, GPU, versions, ceilings, per workload its truth
    recording/<workload>/<workload>.pt.trace.json.gz
    recording/<workload>/nvml_samples.csv

Needs torch with CUDA and nvidia-ml-py; `require()` says in one line what is missing.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import BadInput
from . import kernels

SCHEMA = "plasmient.measure/1"
INFO = "measure.json"
NVML_PERIOD_S = 0.010
LEAD_S = 0.3  # NVML samples before the profiled run starts and after it ends
CALIBRATE_S = 0.05  # a calibration span is at least this long
CEILING_STEPS, CEILING_REPS = 20, 3
GEMM_N = 8192
COPY_BYTES = 1 << 30
EXTRA = "pip install 'plasmient-report[measure]'"


def require(gpu_index: int) -> None:
    """Raise BadInput, one line, when torch, CUDA, the GPU or nvidia-ml-py (NVML) is missing."""
    try:
        import torch
    except ImportError:
        raise BadInput(None, f"measure needs PyTorch with CUDA and nvidia-ml-py ({EXTRA}): torch is not installed") from None
    try:
        import pynvml
    except ImportError:
        raise BadInput(None, f"measure needs nvidia-ml-py for NVML sampling ({EXTRA}): pynvml is not importable") from None
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise BadInput(None, f"measure needs a CUDA GPU: PyTorch {torch.__version__} ({build}) sees none")
    n = torch.cuda.device_count()
    if not 0 <= gpu_index < n:
        raise BadInput(None, f"--gpu-index {gpu_index}: PyTorch sees {n} GPU{'s' if n != 1 else ''} (indices 0 to {n - 1})")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise BadInput(None, f"measure needs NVML, the NVIDIA driver's management library: {e}") from None


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_spans(fn: Callable[[], None], device: str, reps: int) -> list[float]:
    """Seconds per call of fn(), `reps` times, each timed on the GPU (CUDA events) from an idle start."""
    import torch

    out = []
    for _ in range(reps):
        _sync(device)
        if device.startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        else:  # a CPU dry run of the code paths: wall time
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def calibrate(w: kernels.Workload, device: str) -> tuple[int, list[float]]:
    """Steps per span (doubled until a span lasts CALIBRATE_S) and each rep's seconds per step, unprofiled."""
    from functools import partial

    w.run(3)  # warm-up: cuBLAS handles, the allocator, kernel selection
    k = 1
    while True:
        (t,) = time_spans(partial(w.run, k), device, 1)
        if t >= CALIBRATE_S or k >= w.max_steps:
            break
        k = min(w.max_steps, k * 2)
    return k, [t / k for t in time_spans(partial(w.run, k), device, 3)]


def ceilings(device: str) -> dict[str, Any]:
    """What this GPU does at best (unprofiled): a GEMM_N³ bf16 matmul and a device-to-device copy of COPY_BYTES,
    each CEILING_STEPS back to back, the best of CEILING_REPS."""
    import torch

    def gemm() -> list[float]:
        g = torch.Generator(device=device)
        g.manual_seed(1)
        mm = kernels.Matmul(device, GEMM_N, generator=g)
        mm.run(3)
        return time_spans(lambda: mm.run(CEILING_STEPS), device, CEILING_REPS)

    def copy() -> list[float]:
        src = torch.empty(COPY_BYTES, device=device, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        dst.copy_(src)

        def steps() -> None:
            for _ in range(CEILING_STEPS):
                dst.copy_(src)

        return time_spans(steps, device, CEILING_REPS)

    mm_s = gemm()
    cp_s = copy()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "gemm": {
            "what": f"torch.mm {GEMM_N}³ bf16, {CEILING_STEPS} back to back, best of {CEILING_REPS}",
            "flops": 2.0 * GEMM_N**3 * CEILING_STEPS,
            "seconds": mm_s,
            "tflops": 2.0 * GEMM_N**3 * CEILING_STEPS / min(mm_s) / 1e12,
        },
        "copy": {
            "what": f"dst.copy_(src) of {COPY_BYTES / (1 << 30):g} GiB, {CEILING_STEPS} back to back, best of "
            f"{CEILING_REPS} (read + write)",
            "bytes": 2.0 * COPY_BYTES * CEILING_STEPS,
            "seconds": cp_s,
            "tb_per_s": 2.0 * COPY_BYTES * CEILING_STEPS / min(cp_s) / 1e12,
        },
    }


def _gzip(raw: Path) -> Path:
    gz = raw.with_name(raw.name + ".gz")
    with open(raw, "rb") as fi, gzip.open(gz, "wb", compresslevel=6) as fo:
        shutil.copyfileobj(fi, fo, 1 << 22)
    raw.unlink()
    return gz


def profile_one(w: kernels.Workload, steps: int, device: str, nvml_index: int | None, folder: Path) -> dict[str, Any]:
    """One profiled run of `steps` steps inside record_function('phase:<name>'), NVML sampled around it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from .nvml import NvmlSampler

    folder.mkdir(parents=True, exist_ok=True)
    sampler = NvmlSampler(nvml_index, NVML_PERIOD_S) if nvml_index is not None else None
    if sampler:
        sampler.start()
    time.sleep(LEAD_S)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prof = profile(activities=activities, record_shapes=True, with_stack=False)
    _sync(device)
    t0 = time.time_ns()
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        prof.start()
        with record_function(f"phase:{w.name}"):
            w.run(steps)
            _sync(device)
        prof.stop()
    t1 = time.time_ns()
    time.sleep(LEAD_S)
    samples = sampler.stop(folder / "nvml_samples.csv") if sampler else 0
    raw = folder / f"{w.name}.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    trace = _gzip(raw)
    del prof
    return {
        "trace": trace.name,
        "nvml": "nvml_samples.csv" if sampler else None,
        "nvml_samples": samples,
        "profile_start_wall_ns": t0,
        "profile_stop_wall_ns": t1,
        "profiled_wall_s": (t1 - t0) / 1e9,
    }


def record(
    names: Sequence[str],
    gpu_index: int,
    seconds: float,
    folder: Path,
    progress: Callable[[str], None] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Record the workloads into `folder` (created) and write its measure.json; returns that document.
    `device` other than cuda:N is for a dry run of the code paths only (no NVML, no GPU numbers)."""
    import torch

    say = progress or (lambda _m: None)
    device = device or f"cuda:{gpu_index}"
    on_gpu = device.startswith("cuda")
    info: dict[str, Any] = {
        "schema": SCHEMA,
        "tool_version": __version__,
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": ["plasmient-report", *sys.argv[1:]] if sys.argv else None,
        "settings": {"seconds": seconds, "nvml_period_s": NVML_PERIOD_S, "lead_s": LEAD_S},
    }
    nvml_index = None
    if on_gpu:
        from .nvml import driver_version, nvml_index_for_cuda

        torch.cuda.set_device(gpu_index)
        props = torch.cuda.get_device_properties(gpu_index)
        nvml_index, uuid = nvml_index_for_cuda(gpu_index)
        info["gpu"] = {
            "cuda_index": gpu_index,
            "name": torch.cuda.get_device_name(gpu_index),
            "uuid": uuid,
            "nvml_index": nvml_index,
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
        }
        info["versions"] = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": driver_version(),
            "python": platform.python_version(),
            "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
        }
        say(f"ceilings of {info['gpu']['name']}: {GEMM_N}³ bf16 GEMM, {COPY_BYTES >> 30} GiB copy …")
        info["ceilings"] = ceilings(device)
    else:
        info["gpu"] = {"cuda_index": None, "name": None}
        info["versions"] = {"torch": torch.__version__, "python": platform.python_version()}
    folder.mkdir(parents=True, exist_ok=True)
    info["workloads"] = []
    for name in names:
        g = torch.Generator(device=device)
        g.manual_seed(0)
        kw: dict[str, Any] = {"generator": g} if name in ("matmul", "attention") else {}
        w = kernels.make(name, device, **kw)
        k, per_step = calibrate(w, device)
        step_s = statistics.median(per_step)
        steps = max(1, min(w.max_steps, round(seconds / step_s)))
        say(f"recording {name}: {w.what}; {steps:,} steps ({step_s * 1e6:,.1f} µs each unprofiled)")
        rec = profile_one(w, steps, device, nvml_index, folder / name)
        info["workloads"].append(
            {
                "name": name,
                "what": w.what,
                "bound_by": w.bound_by,
                "precision": w.precision,
                "tensor_cores": w.tensor_cores,
                "flops_per_step": w.flops_per_step,
                "bytes_per_step": w.bytes_per_step,
                "steps": steps,
                "capped": steps == w.max_steps and w.max_steps * step_s < seconds,
                "unprofiled_step_s": step_s,
                "unprofiled_step_s_reps": per_step,
                "calibration_steps": k,
                **{k2: (f"{name}/{v}" if k2 in ("trace", "nvml") and v else v) for k2, v in rec.items()},
            }
        )
        del w
        if on_gpu:
            torch.cuda.empty_cache()
    (folder / INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info
