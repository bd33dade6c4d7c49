"""A 2-stage GPipe pipeline on two GPUs (one rank per stage), profiled with torch.profiler (Kineto).

Each stage: 4 bf16 Linear(4096, 4096) layers (--layers, --hidden); micro-batch = 2048 tokens (--tokens); M micro-batches
per step; all forwards (activations sent rank 0 -> 1), then all backwards (gradients sent 1 -> 0), then the
optimizer.
Theory (equal stages, free P2P): bubble = (p-1)/(m+p-1).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096, help="hidden size d (Linear(d, d) layers)")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per micro-batch")
    ap.add_argument("--layers", type=int, default=4, help="layers per stage")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    d, tok, layers, m = a.hidden, a.tokens, a.layers, a.micro
    torch.manual_seed(rank)
    stage = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)]).cuda().to(torch.bfloat16)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-6)
    xs = [torch.randn(tok, d, device="cuda", dtype=torch.bfloat16) for _ in range(m)]

    def step() -> None:
        ins, outs = [], []
        for i in range(m):
            if rank == 0:
                inp = xs[i]
            else:
                inp = torch.empty(tok, d, device="cuda", dtype=torch.bfloat16)
                dist.recv(inp, 0)
                inp.requires_grad_()
            out = stage(inp)
            if rank == 0:
                dist.send(out.detach(), 1)
            ins.append(inp)
            outs.append(out)
        for i in reversed(range(m)):
            if rank == 1:
                outs[i].float().pow(2).mean().backward()
                dist.send(ins[i].grad, 0)
            else:
                g = torch.empty_like(outs[i])
                dist.recv(g, 1)
                outs[i].backward(g)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=3),
    ) as prof:
        for _ in range(5):
            step()
            prof.step()
    torch.cuda.synchronize()
    os.makedirs(a.out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(a.out, f"rank{rank}.pt.trace.json.gz"))
    if rank == 0:
        with open(os.path.join(a.out, "truth.json"), "w") as f:
            json.dump(
                {
                    "stages": 2,
                    "micro_batches": m,
                    "theory_bubble": 1 / (m + 1),
                    "layers_per_stage": layers,
                    "d": d,
                    "tokens_per_micro_batch": tok,
                    "unprofiled_step_ms": times,
                    "torch": torch.__version__,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                },
                f,
                indent=1,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
