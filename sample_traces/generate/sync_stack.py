#!/usr/bin/env python3
"""Host-sync sample with Python stacks (torch.profiler with_stack=True), for plasmient-report.

    python sync_stack.py --out DIR [--steps 6]

A small training loop on one GPU (bf16 MLP, AdamW) where two named Python functions block the host on the
GPU every step:

  log_metrics(loss)       loss.item()                     -> aten::item -> aten::_local_scalar_dense -> sync
  check_finite(model)     torch.isfinite(grad).all().item() for one gradient (a 'debug' check)

and the step itself also sleeps 5 ms after each sync (host work that the GPU waits for). Recorded with
record_shapes=True and with_stack=True, so the trace carries `python_function` events
(`sync_stack.py(NN): log_metrics`). Writes DIR/sync_stack.pt.trace.json.gz and DIR/truth.json with the file
name, function and line of each sync site (taken from the code objects at run time) and the unprofiled step
time with and without the two syncs.
"""

import argparse
import gzip
import inspect
import json
import os
import shutil
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEVICE = os.environ.get("GEN_DEVICE", "cuda")


def make(d: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(d, d, bias=False), nn.GELU()) for _ in range(layers)]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEVICE == "cuda")
    return model, opt


def log_metrics(loss: torch.Tensor, history: list[float]) -> None:
    history.append(loss.item())  # SYNC SITE 1
    time.sleep(0.005)


def check_finite(model: nn.Module) -> bool:
    g = next(model.parameters()).grad
    ok = bool(torch.isfinite(g).all().item())  # SYNC SITE 2
    time.sleep(0.005)
    return ok


def step(model, opt, x, y, history, syncs: bool) -> None:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = F.mse_loss(model(x).float(), y)
    loss.backward()
    if syncs:
        check_finite(model)
    opt.step()
    if syncs:
        log_metrics(loss, history)


def site(fn, marker: str) -> dict:
    src, first = inspect.getsourcelines(fn)
    line = first + next(i for i, s in enumerate(src) if marker in s)
    # def_line: what the profiler's python_function events name (`sync_stack.py(40): log_metrics`)
    return {
        "function": fn.__name__,
        "file": os.path.basename(inspect.getsourcefile(fn)),
        "line": line,
        "def_line": fn.__code__.co_firstlineno,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4096)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model, opt = make(a.d, a.layers)
    x = torch.randn(a.batch, a.d, device=DEVICE)
    y = torch.randn(a.batch, a.d, device=DEVICE)
    history: list[float] = []
    for _ in range(5):  # warm-up: allocator, cuBLAS, optimizer state
        step(model, opt, x, y, history, True)
    torch.cuda.synchronize()

    def timed(syncs: bool) -> float:
        ts = []
        for _ in range(8):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(model, opt, x, y, history, syncs)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_sync, t_nosync = timed(True), timed(False)
    from torch.profiler import ProfilerActivity, profile, schedule

    raw = os.path.join(a.out, "sync_stack.pt.trace.json")
    # the trace is exported when the cycle ends (the profiler clears its events after that)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        with_stack=True,
        schedule=schedule(wait=0, warmup=1, active=a.steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(raw),
    ) as prof:
        for _ in range(a.steps + 1):
            step(model, opt, x, y, history, True)
            prof.step()
    torch.cuda.synchronize()
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    truth = {
        "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "steps_profiled": a.steps,
        "sync_sites": [site(log_metrics, "SYNC SITE 1"), site(check_finite, "SYNC SITE 2")],
        "host_sleep_after_each_sync_s": 0.005,
        "unprofiled_step_s": {"with_syncs": t_sync, "without_syncs": t_nosync},
        "model": {"d": a.d, "layers": a.layers, "batch": a.batch, "dtype": "bf16 autocast"},
    }
    with open(os.path.join(a.out, "truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps(truth, indent=1))


if __name__ == "__main__":
    main()
