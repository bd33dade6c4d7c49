#!/usr/bin/env python3
"""2-rank DDP sample-trace generator with one known-late rank, for plasmient-report.

    torchrun --standalone --nproc_per_node 2 ddp_late_rank.py --mode kineto --out DIR
    nsys profile ... torchrun --standalone --nproc_per_node 2 ddp_late_rank.py --mode nsys --out DIR

Model: an MLP of `--layers` bf16 nn.Linear(d, d, bias=False) with ReLU between, wrapped in DDP.
Each parameter (d*d bf16 = 32 MiB at d=4096) is larger than DDP's 25 MiB bucket cap, so after DDP's
first-iteration bucket rebuild every step issues one gradient all-reduce per layer.

Each step: zero_grad; forward + MSE loss; torch.cuda.synchronize(); rank 1 (only) does
time.sleep(--late-s) (30 ms); backward (DDP all-reduces); SGD step; torch.cuda.synchronize().
Because both ranks synchronize after the forward, rank 0 reaches its first gradient all-reduce of each
step ~late_s before rank 1 does: its first NCCL all-reduce kernel of the step spins ~late_s longer.

Kineto mode: torch.profiler with schedule(wait=0, warmup=1, active=steps) and prof.step() per step, so
the trace holds ProfilerStep#1..#steps (ProfilerStep#0 is the profiler's warm-up step, not recorded);
each rank writes rank<N>.pt.trace.json.gz.  nsys mode: NVTX ranges "step#<i>" and emit_nvtx(record_shapes).
Rank 0 writes ddp_ground_truth.json (unprofiled timings of both ranks, with and without the sleep).
"""

import argparse
import contextlib
import gzip
import json
import os
import shutil
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class MLP(nn.Module):
    def __init__(self, d, layers):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(d, d, bias=False) for _ in range(layers)])

    def forward(self, x):
        for i, lin in enumerate(self.lins):
            x = lin(x)
            if i < len(self.lins) - 1:
                x = F.relu(x)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["none", "kineto", "nsys"], default="kineto")
    ap.add_argument("--out", default="out_ddp")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--late-rank", type=int, default=1)
    ap.add_argument("--late-s", type=float, default=0.030)
    a = ap.parse_args()

    cpu = os.environ.get("GEN_DEVICE") == "cpu"  # smoke test of the code paths only
    dist.init_process_group("gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cpu:
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(1234 + rank)

    dt = torch.float32 if cpu else torch.bfloat16  # CPU smoke test: no bf16 mse_loss on CPU
    model = MLP(a.d, a.layers).to(dev, dtype=dt)
    ddp = DDP(model, device_ids=None if cpu else [local])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(a.tokens, a.d, device=dev, dtype=dt)
    y = torch.randn(a.tokens, a.d, device=dev, dtype=dt)
    mark = contextlib.nullcontext

    def step(late):
        opt.zero_grad(set_to_none=True)
        with mark("forward"):
            loss = F.mse_loss(ddp(x), y)
        torch.cuda.synchronize()
        if late and rank == a.late_rank:
            with mark("late_rank_sleep"):
                time.sleep(a.late_s)
        with mark("backward"):
            loss.backward()
        with mark("optimizer"):
            opt.step()
        torch.cuda.synchronize()

    # warm-up (also lets DDP rebuild its buckets after the first iteration)
    for _ in range(4):
        step(late=False)
    dist.barrier()

    # unprofiled ground truth: wall time per step and per-rank time inside backward
    def timed(late, n):
        walls = []
        for _ in range(n):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(late)
            walls.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(walls), walls

    if a.mode == "nsys":  # keep the nsys report to the annotated steps; truth comes from the kineto run
        no_late_ms = late_ms = None
        no_late_all = late_all = []
    else:
        no_late_ms, no_late_all = timed(False, a.steps)
        late_ms, late_all = timed(True, a.steps)
    mine = {
        "rank": rank,
        "step_wall_ms_median_no_sleep": no_late_ms,
        "step_wall_ms_no_sleep": no_late_all,
        "step_wall_ms_median_with_sleep": late_ms,
        "step_wall_ms_with_sleep": late_all,
        "gpu": None if cpu else torch.cuda.get_device_name(local),
    }
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    n_buckets = None
    try:
        n_buckets = {k: v for k, v in ddp._get_ddp_logging_data().items() if "bucket" in k}
    except Exception:
        pass

    d, M, L = a.d, a.tokens, a.layers
    flops_step = (6 * L - 2) * M * d * d
    if rank == 0 and a.mode != "nsys":
        gt = {
            "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "nccl": None if cpu else ".".join(map(str, torch.cuda.nccl.version())),
            "world_size": world,
            "config": vars(a),
            "late_rank": a.late_rank,
            "late_sleep_s": a.late_s,
            "late_where": "rank %d sleeps late_s on the host after the forward (both ranks synchronize "
            "after the forward) and before loss.backward(), every step" % a.late_rank,
            "expected_effect": "the other rank(s) reach the first DDP gradient all-reduce of every step "
            "~late_s early: that rank's first NCCL AllReduce kernel of the step lasts "
            "~late_s longer than on the late rank; per-step time of both ranks grows "
            "by ~late_s",
            "profiled_steps": a.steps,
            "kineto_profiler_steps": "ProfilerStep#1..#%d (schedule wait=0, warmup=1, active=%d)" % (a.steps, a.steps),
            "allreduce_per_step_expected": L,
            "ddp_bucket_sizes": n_buckets,
            "flops_per_step_per_rank": flops_step,
            "flops_convention": "fwd 2*M*d*d per linear; bwd weight-grad 2*M*d*d per linear; bwd input-grad "
            "2*M*d*d for all but the first linear (input x needs no grad): (6L-2)*M*d^2",
            "unprofiled_per_rank": gathered,
        }
        with open(os.path.join(a.out, "ddp_ground_truth.json"), "w") as f:
            json.dump(gt, f, indent=1)
        print(json.dumps(gathered, indent=1), flush=True)
    dist.barrier()

    if a.mode == "kineto":
        from torch.profiler import ProfilerActivity, profile, record_function, schedule

        mark = record_function
        raw = os.path.join(a.out, "rank%d.pt.trace.json" % rank)

        def ready(p):
            p.export_chrome_trace(raw)

        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(wait=0, warmup=1, active=a.steps, repeat=1),
            on_trace_ready=ready,
            record_shapes=True,
            with_flops=True,
            with_stack=False,
        ) as prof:
            for _ in range(a.steps + 1):
                step(late=True)
                prof.step()
        with open(raw, "rb") as fi, gzip.open(raw + ".gz", "wb") as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(raw)
        print("rank %d wrote %s.gz" % (rank, raw), flush=True)
    elif a.mode == "nsys":

        @contextlib.contextmanager
        def nvtx_mark(name):
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()

        mark = nvtx_mark
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            for i in range(a.steps):
                with nvtx_mark("step#%d" % i):
                    step(late=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
