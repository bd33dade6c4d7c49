"""Records a Kineto trace plus device-counter logs whose busy pattern is long and irregular enough to place the
logs on the trace's clock by correlation (the align stage's tests): ~24 s profiled on one GPU, bursts of
back-to-back 16384x16384x16384 bf16 mm lasting 0.4-2.0 s, separated by idle gaps of 0.4-1.6 s (a fixed
pseudo-random sequence), while NVML is sampled every 10 ms and `nvidia-smi dmon -o DT` / `--query-gpu -lms 100`
log from 3 s before to 3 s after.

    python sample_traces/generate/counter_alignment.py --out DIR

Writes DIR/kineto_bursts.pt.trace.json.gz, nvml_samples.csv, nvidia_smi_dmon.txt, nvidia_smi_query.csv and
run_info.json (each burst's wall-clock window in epoch ns: the ground truth; all logs share the host clock, so
the true offset of every log is 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from single_gpu import NvmlSampler, SmiLoggers, clock_snapshot, nvml_index_for_cuda0  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda", 0)
    A = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    B = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        torch.mm(A, B)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        torch.mm(A, B)
    torch.cuda.synchronize()
    t_mm = (time.perf_counter() - t0) / 10
    rng = random.Random(a.seed)
    plan = []
    total = 0.0
    while total < a.seconds:
        burst, gap = rng.uniform(0.4, 2.0), rng.uniform(0.4, 1.6)
        plan.append((burst, gap))
        total += burst + gap

    nvml_idx, uuid = nvml_index_for_cuda0()
    info = {
        "n": a.n,
        "mm_seconds": t_mm,
        "seed": a.seed,
        "nvml_index": nvml_idx,
        "cuda0_uuid": uuid,
        "TZ_env": os.environ.get("TZ"),
        "clock": [clock_snapshot("before_loggers")],
    }
    sampler = NvmlSampler(nvml_idx, 0.010)
    smi = SmiLoggers(a.out, nvml_idx)
    sampler.start()
    time.sleep(3.0)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False)
    info["profile_start_wall_ns"] = time.time_ns()
    prof.start()
    bursts = []
    for burst, gap in plan:
        k = max(1, round(burst / t_mm))
        s = time.time_ns()
        for _ in range(k):
            torch.mm(A, B)
        torch.cuda.synchronize()
        e = time.time_ns()
        bursts.append({"wall_start_ns": s, "wall_end_ns": e, "mm": k})
        time.sleep(gap)
    prof.stop()
    info["profile_stop_wall_ns"] = time.time_ns()
    time.sleep(3.0)
    rows = sampler.stop(os.path.join(a.out, "nvml_samples.csv"))
    smi.stop()
    info["clock"].append(clock_snapshot("after_loggers"))
    info["bursts"] = bursts
    info["nvml_rows"] = rows
    raw = os.path.join(a.out, "kineto_bursts.pt.trace.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    with open(os.path.join(a.out, "run_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({"bursts": len(bursts), "mm_ms": t_mm * 1e3, "nvml_rows": rows}))


if __name__ == "__main__":
    main()
