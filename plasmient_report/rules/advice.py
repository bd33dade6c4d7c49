"""Advice that fits the program (sql/program.sql via `context.Program`): the same fix said in PyTorch's words for a
PyTorch trace, in CUDA's / HIP's runtime calls for a C++ program, in TensorRT's for an engine. A trace with no
PyTorch in it is never told to use torch.compile, `.item()` or a DataLoader. Wording only; no queries.
"""

from __future__ import annotations

from .context import Program


def graph_capture(p: Program) -> str:
    """Replace many launches by one graph launch."""
    if p.pytorch:
        g = "HIP graph (ROCm runs torch.cuda.CUDAGraph as one)" if p.runtime == "hip" else "CUDA graph"
        text = (
            f"capture the steady-state loop in a {g} — torch.cuda.CUDAGraph / "
            "torch.cuda.make_graphed_callables, or torch.compile(mode='reduce-overhead')"
        )
    elif p.tensorrt:
        text = (
            "capture the engine's enqueue in a CUDA graph (cudaStreamBeginCapture around enqueueV3, then one "
            "cudaGraphLaunch per inference)"
        )
    else:
        x = p.prefix
        text = (
            f"capture the launch sequence in a {p.api} graph ({x}StreamBeginCapture … {x}StreamEndCapture, "
            f"{x}GraphInstantiate once, then one {x}GraphLaunch per iteration)"
        )
    if p.graphs:
        text += "; the program already launches graphs — these kernels run outside them"
    return text


def fuse_small(p: Program) -> str:
    """Fewer, larger kernels."""
    if p.pytorch:
        return "fuse the small ops (torch.compile, foreach / fused kernels) and batch small tensors into larger ones"
    if p.tensorrt:
        return "let TensorRT fuse more layers (formats or precisions that force reformat kernels between layers stop fusion)"
    return "fuse small kernels into fewer, larger ones and batch small work items together"


def fuse_memory(p: Program) -> str:
    """Move fewer bytes: fuse a memory-bound kernel with its neighbours."""
    if p.pytorch:
        return "fuse it with the elementwise ops around it (torch.compile)"
    if p.tensorrt:
        return "let TensorRT fuse it into its producer (pointwise layers fuse when their formats and precisions match)"
    return (
        "fuse it with its neighbours — one kernel for the chain, or an epilogue of the GEMM that produces its "
        "input (CUTLASS / cuBLASLt epilogues)"
    )


def half_precision(p: Program, precision: str | None = None) -> str | None:
    """Fewer bits per element for a memory-bound kernel whose data is in `precision` (from its name or its op's
    dtype; None: not known): None where it is already 8 bits or fewer (an fp8 cast) — there is nothing to halve."""
    if precision in ("fp8", "int8", "fp4", "int4"):
        return None
    if precision in ("bf16", "fp16"):
        return "keep it in fp8 where accuracy allows (half the bytes)"
    if precision in ("fp32", "tf32", "fp64"):
        return "keep the tensor in bf16 (half the bytes)" if p.pytorch else "store the data in 16 bits (half the bytes)"
    return (
        "keep the tensor in bf16 if it is fp32 (half the bytes)"
        if p.pytorch
        else "store the data in 16 bits if it is 32-bit (half the bytes)"
    )


def sync_fix(p: Program) -> str:
    """Take a host sync out of the hot path."""
    if p.pytorch:
        return (
            "keep the value on the GPU (accumulate, log every N steps), use tensor ops instead of Python control "
            "flow on it, or read it back asynchronously (.to('cpu', non_blocking=True) into pinned memory + a "
            "CUDA event)"
        )
    x = p.prefix
    return (
        f"queue the next iteration's work before waiting, order work between streams with events "
        f"({x}EventRecord + {x}StreamWaitEvent) instead of host syncs, and copy results back asynchronously "
        f"({x}MemcpyAsync into pinned memory, then wait on an event only when the host needs them)"
    )


def pinned_copies(p: Program) -> str:
    """Copies that overlap compute."""
    if p.pytorch:
        return (
            "pin the host side (DataLoader(pin_memory=True), tensor.pin_memory()) and copy with "
            ".to(device, non_blocking=True) so copies overlap compute"
        )
    x = p.prefix
    return (
        f"allocate the host buffers pinned ({x}HostAlloc / {x}MallocHost, or {x}HostRegister an existing buffer) "
        f"and copy with {x}MemcpyAsync on a stream so copies overlap compute"
    )


def async_readback(p: Program) -> str:
    if p.pytorch:
        return "read results back asynchronously (pinned buffer + CUDA event) rather than with a blocking copy"
    return (
        f"read results back with {p.prefix}MemcpyAsync into pinned memory and an event, rather than a blocking {p.prefix}Memcpy"
    )


def tensor_cores(p: Program, has_tf32: bool, half: str) -> str:
    """Run fp32 matmuls on tensor cores."""
    dtype = "torch.bfloat16" if half == "bf16" else "torch.float16"
    if p.pytorch:
        if has_tf32:
            return (
                f"Enable TF32 — torch.set_float32_matmul_precision('high') — or run under torch.autocast('cuda', dtype={dtype})."
            )
        return (
            f"Run the matmuls in {half} on tensor cores: torch.autocast('cuda', dtype={dtype}) "
            "(with a GradScaler for fp16 training)."
        )
    if p.tensorrt:
        return (
            f"Build the engine with {'TF32 and ' if has_tf32 else ''}{half.upper()} enabled "
            "(BuilderFlag::kTF32 / kFP16 / kBF16) so its layers may pick tensor-core kernels."
        )
    if p.runtime == "hip":
        return f"Use {half} inputs (or hipBLASLt's XF32 compute type where the GPU has it) so the GEMMs run on the matrix cores."
    if has_tf32:
        return (
            "Allow TF32: cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH) or the compute type "
            f"CUBLAS_COMPUTE_32F_FAST_TF32 (cuDNN: CUDNN_TENSOR_OP_MATH), or keep the operands in {half}."
        )
    return f"Keep the operands in {half} and use a tensor-core GEMM (cuBLAS with CUBLAS_COMPUTE_32F and 16-bit inputs)."


def warm_up_profile(p: Program) -> str:
    """Leave one-time costs out of the profiled region."""
    if p.pytorch:
        return (
            "profile after warm-up steps (torch.profiler schedule(wait=1, warmup=1, active=N)), or analyse a "
            "--range that excludes set-up"
        )
    return (
        "start profiling after a warm-up iteration (nsys --capture-range=cudaProfilerApi with cudaProfilerStart "
        "after warm-up, or --delay), or analyse a --range that excludes set-up"
    )


def overlap_communication(p: Program) -> str:
    if p.pytorch and p.training is False:
        # inference: no backward to hide gradient traffic in — the forward's tensor / expert-parallel collectives
        return (
            "These are the forward pass's collectives (tensor or expert parallelism; no gradients to bucket): "
            "overlap them with the next GEMM (async tensor parallelism / fused GEMM + all-reduce or reduce-scatter "
            "kernels, sequence parallelism), or shard over fewer GPUs if the model fits, or on a faster link."
        )
    if p.pytorch:
        return (
            "Overlap it with compute: DDP — smaller bucket_cap_mb so all-reduces start during the backward, "
            "gradient_as_bucket_view=True; FSDP — forward_prefetch / backward_prefetch; or send less "
            "(bf16 gradients)."
        )
    return (
        "Overlap it with compute: issue the communication on its own stream and give the GPU independent work "
        "meanwhile (split the work into chunks and start each transfer as soon as its chunk is ready), or send "
        "less (16-bit payloads)."
    )
