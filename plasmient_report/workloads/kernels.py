"""The workloads, each bound by one thing, with the FLOPs and bytes of one step worked out from the operation
(the truth the tool's numbers are checked against). Shared by `plasmient-report measure` and the sample-trace
generator (`sample_traces/generate/single_gpu.py`, whose compute / memory / launch phases they are).

Conventions: a matmul is 2·M·N·K FLOPs; an elementwise fp32 op is one FLOP per element, on CUDA cores; attention
counts its two matmuls (QKᵀ and PV, 2·B·H·L·S·D each) over the scores it keeps (causal: the lower triangle with
its diagonal, L·(L+1)/2 of L²). Bytes are the compulsory DRAM traffic (each operand read once, each result written
once). torch is imported only when a workload is built: this module loads without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BF16_BYTES = 2
FP32_BYTES = 4


@dataclass
class Workload:
    """One workload: `step()` launches one step's kernels (asynchronously); `run(n)` launches n steps."""

    name: str
    what: str  # one line: the operation and its shapes
    bound_by: str  # what limits it, in the loss waterfall's words (what the tool should name)
    precision: str  # precision of its FLOPs
    tensor_cores: bool  # whether its FLOPs run on tensor cores
    flops_per_step: float
    bytes_per_step: float
    max_steps: int  # a cap on steps per recording, so that the trace stays small

    def step(self) -> None:
        raise NotImplementedError

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


class Matmul(Workload):
    """torch.mm of two n×n bf16 matrices: tensor-core bound."""

    def __init__(self, device: str = "cuda", n: int = 8192, generator: Any = None) -> None:
        import torch

        super().__init__(
            name="matmul",
            what=f"torch.mm {n}×{n} @ {n}×{n}, bf16",
            bound_by="compute",
            precision="bf16",
            tensor_cores=True,
            flops_per_step=2.0 * n**3,
            bytes_per_step=3.0 * n * n * BF16_BYTES,
            max_steps=100_000,
        )
        self.A = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)
        self.B = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)

    def step(self) -> None:
        import torch

        torch.mm(self.A, self.B)


class Memory(Workload):
    """x.mul_(1.0001).add_(1e-6) in place on a large fp32 tensor: two elementwise kernels, HBM bound."""

    def __init__(self, device: str = "cuda", nbytes: int = 1 << 30) -> None:
        import torch

        n = nbytes // FP32_BYTES
        super().__init__(
            name="memory",
            what=f"x.mul_(1.0001).add_(1e-6), x = {nbytes / (1 << 30):g} GiB fp32",
            bound_by="memory",
            precision="fp32",
            tensor_cores=False,
            flops_per_step=2.0 * n,  # one mul and one add per element
            bytes_per_step=2.0 * 2 * n * FP32_BYTES,  # two in-place kernels, each reads and writes x
            max_steps=100_000,
        )
        self.x = torch.full((n,), 1.0, device=device, dtype=torch.float32)

    def step(self) -> None:
        self.x.mul_(1.0001).add_(1e-6)


class Launch(Workload):
    """tiny.add_(1.0) on a one-element tensor: every kernel is ~1 µs of work behind a launch; launch bound."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        super().__init__(
            name="launch",
            what="tiny.add_(1.0), tiny = 1 fp32 element",
            bound_by="launch",
            precision="fp32",
            tensor_cores=False,
            flops_per_step=1.0,
            bytes_per_step=2.0 * FP32_BYTES,
            max_steps=50_000,
        )  # ~1 KB of trace per launch: 50k launches is ~50 MB of JSON
        self.tiny = torch.zeros(1, device=device, dtype=torch.float32)

    def step(self) -> None:
        self.tiny.add_(1.0)


class Attention(Workload):
    """F.scaled_dot_product_attention forward, bf16, causal (PyTorch picks the kernel, flash on Hopper)."""

    def __init__(
        self,
        device: str = "cuda",
        batch: int = 4,
        heads: int = 16,
        seq: int = 4096,
        head_dim: int = 128,
        causal: bool = True,
        generator: Any = None,
    ) -> None:
        import torch

        kept = (seq + 1) / (2 * seq) if causal else 1.0  # causal keeps L·(L+1)/2 of the L² scores
        super().__init__(
            name="attention",
            what=f"F.scaled_dot_product_attention B={batch} H={heads} L={seq} D={head_dim}, bf16"
            + (", causal" if causal else ""),
            bound_by="compute",
            precision="bf16",
            tensor_cores=True,
            flops_per_step=2 * (2.0 * batch * heads * seq * seq * head_dim) * kept,
            bytes_per_step=4.0 * batch * heads * seq * head_dim * BF16_BYTES,  # q, k, v read; o written
            max_steps=100_000,
        )
        shape = (batch, heads, seq, head_dim)
        self.q, self.k, self.v = (torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator) for _ in range(3))
        self.causal = causal

    def step(self) -> None:
        import torch.nn.functional as F

        F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal)


BUILDERS = {"matmul": Matmul, "memory": Memory, "launch": Launch, "attention": Attention}


def make(name: str, device: str = "cuda", **kw: Any) -> Workload:
    """The workload of that name (kernels.BUILDERS), its tensors on `device`."""
    return BUILDERS[name](device=device, **kw)
