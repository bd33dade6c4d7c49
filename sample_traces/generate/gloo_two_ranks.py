"""A two-rank DDP job over gloo on ONE GPU (both ranks share cuda:0), each rank under its own nsys (see
rank_nsys.sh): 4 x Linear(2048, 2048) fp32, batch 4096, SGD; 3 warm-up steps, then 6 steps in NVTX ranges
`step#i`; rank 1 sleeps 20 ms before every backward (range `late_rank_sleep`), so rank 0 waits in the all-reduce.
Truth per step per rank: FLOPs (6L-2)*M*d^2 = 22 * 4096 * 2048^2 = 3.78e11 (fp32, no TF32)."""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
torch.cuda.set_device(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)]).cuda()
ddp = DDP(model, device_ids=[0], bucket_cap_mb=16)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
x = torch.randn(4096, 2048, device="cuda")


def step(i, mark):
    if mark:
        torch.cuda.nvtx.range_push(f"step#{i}")
    opt.zero_grad(set_to_none=True)
    loss = ddp(x).pow(2).mean()
    torch.cuda.synchronize()
    if rank == 1:
        torch.cuda.nvtx.range_push("late_rank_sleep")
        time.sleep(0.020)
        torch.cuda.nvtx.range_pop()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if mark:
        torch.cuda.nvtx.range_pop()


for i in range(3):
    step(i, False)
dist.barrier()
t0 = time.perf_counter()
for i in range(6):
    step(i, True)
dist.barrier()
print(f"rank {rank}: 6 steps in {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
dist.destroy_process_group()
