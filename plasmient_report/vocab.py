"""The vocabulary the measurements share: loss categories and their layers, kernel classes, the name patterns that
say what a kernel, a host call or a range is, precision hints, dtype sizes, and the few time constants of the
sweep. One definition each: the SQL library (`plasmient_report/sql/`), the FLOP models, the rules and the
renderers read them from here. Patterns are RE2 (DuckDB's `regexp_matches`): no look-around.
"""

from __future__ import annotations

import re

# ------------------------------------------------------------------------------------------------ loss waterfall

# SPEC §4 loss categories and their layers, in the order the waterfall lists them.
CATEGORIES: dict[str, str] = {
    "collective_wait": "cluster",
    "collective_transfer": "cluster",
    "pipeline_bubble": "pipeline",
    "memory_bound": "op",
    "unknown_flops": "op",
    "compute_inefficiency": "kernel",
    "memcpy": "kernel",
    "launch_bound": "host",
    "sync_stall": "host",
    "input_bound": "host",
    "startup": "host",
    "host_other": "host",
    "no_coverage": "device",
}
# How a renderer names each category (everything else: the name with spaces).
CATEGORY_LABELS: dict[str, str] = {c: c.replace("_", " ") for c in CATEGORIES} | {
    "unknown_flops": "unknown FLOPs",
    "startup": "start-up",
    "memcpy": "memcpy / memset",
}
# Categories of idle time (no kernel resident; the cause read from the host) and of busy time.
IDLE_CATEGORIES = ("launch_bound", "sync_stall", "input_bound", "startup", "host_other")
BUSY_CATEGORIES = (
    "collective_wait",
    "collective_transfer",
    "pipeline_bubble",
    "memory_bound",
    "unknown_flops",
    "compute_inefficiency",
    "memcpy",
)

# ------------------------------------------------------------------------------------------------ kernel classes

# One class per GPU activity (sql/kernel_class.sql): `compute` — a FLOP estimate at or above the ridge point of its
# GPU and precision; `memory` — below the ridge, or known to do ~0 useful FLOPs (elementwise, norms, reductions,
# copies, optimizer: ops with a byte model); `unknown` — may do matmul-class work and nothing estimates it;
# `communication` — NCCL / RCCL / NVSHMEM / DeepEP / symmetric-memory / custom all-reduce / MSCCL++; `copy` — memcpy /
# memset.
KERNEL_CLASSES = ("compute", "memory", "unknown", "communication", "copy")

# Communication kernels by what they are, not only NCCL: the parsers' kind 'nccl' plus these names (DeepEP's
# all-to-all kernels also as `dpsk::ep::`, the namespace of DeepSeek's own build in its published profiles).
COMM_KERNEL_RE = (
    r"(?i)(nccl|rccl|nvshmem|deep_?ep::|dpsk::ep::|multimem_all_?reduce|one_?shot_all_?reduce|"
    r"two_?shot_all_?reduce|symmetric_?memory|cross_device_reduce|custom_?all_?reduce|quick_?all_?reduce|"
    r"mscclpp|msccl|lamport|allreduce_?fusion_?kernel)"
)
# Point-to-point NCCL kernels (pipeline traffic, unless they implement an all-to-all).
P2P_KERNEL_RE = r"(?i)(sendrecv|_send|_recv|send_|recv_)"
P2P_COLLECTIVE_RE = r"(?i)(send|recv)"
# Collectives whose ranks all end together (the align stage pairs their ends across ranks); send/recv cannot be
# paired by sequence number alone (one rank's sends are its peer's recvs).
SYMMETRIC_COLLECTIVE_RE = r"(?i)(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|barrier)"
# Ops / ranges whose send/recv kernels are an all-to-all (DLRM / MoE expert parallelism), not a pipeline.
ALL_TO_ALL_RE = r"(?i)(all_?to_?all|alltoall)"
# Collectives by how NCCL's bus bandwidth counts them (nccl-tests doc/PERFORMANCE.md): busbw = algbw × 2(n−1)/n for
# all-reduce; × (n−1)/n for all-gather, reduce-scatter, all-to-all (and gather / scatter); × 1 for broadcast, reduce
# and send / recv. Anything else (barrier, …) has no bus bandwidth.
ALL_REDUCE_RE = r"(?i)all_?reduce"
GATHER_SCATTER_RE = r"(?i)(all_?gather|reduce_?scatter|^_?gather|^_?scatter)"
ONE_TO_ONE_RE = r"(?i)(broadcast|^_?reduce(_oop)?$|send|recv)"

# Compiled kernels known to do no matmul work: Inductor's pointwise, reduction and persistent-reduction kernels.
COMPILED_NO_MATMUL_KERNEL_RE = r"(?i)^(triton_(poi|red|per)_|triton_for_)"
# Kernels that may do matmul-class work (GEMM, attention, convolution, grouped / MoE GEMM, templates).
MATMUL_CLASS_KERNEL_RE = (
    r"(?i)(gemm|gemv|nvjet|xmma|cutlass|cublas|matmul|_mma|mma_|hmma|wgmma|gmma|imma|flash|fmha|"
    r"attn|attention|sdpa|convolv|convolution|conv[0-9]d|_conv_|conv2d|conv3d|winograd|fprop|dgrad|"
    r"wgrad|implicit_?gemm|cudnn|sm[0-9]{2,3}_|ampere_|volta_|turing_|hopper_|blackwell_|Cijk_|"
    r"fused_moe|moe_gemm|grouped_?gemm|group_gemm|deep_?gemm|triton_tem_|_scaled_mm|marlin|machete)"
)
# The matmul pattern is read on a kernel's own name, its template arguments and parameters left out
# (`kernel_base_name`): `finalizeKernel<KernelParams<cutlass::bfloat16_t>>` is not a CUTLASS GEMM.
BASE_NAME_CUT_RE = r"[<(].*$"
# Kernels known to do no matmul work although their names hold a matmul word: inference servers' (vLLM's
# `reshape_and_cache_flash_kernel`, TensorRT-LLM's MoE routing / finalize and block-scale quantization, fp8
# quantization, fused activations and rotary embeddings) and cuDNN's batch norm (`cudnn::bn_fw_tr_1C11_kernel_NCHW`,
# `cudnn::bn_bw_…`, `cudnn::batchnorm_…`: a ResNet's norms, read as matmul-class work by `cudnn`): read before the
# matmul pattern.
NO_MATMUL_KERNEL_RE = (
    r"(?i)(reshape_and_cache|routingIndices|moe::dev::routing|moe_align_block|finalizeKernel|cudnn::bn_|"
    r"cudnn::batch_?norm|"
    r"quantize_with_block_size|scaled_fp8_quant|per_token_group_quant|per_token_quant|dynamic_per_token|"
    r"silu_and_mul|gelu_and_mul|act_and_mul|rotary_embedding|fused_add_rms_norm|rms_norm_kernel|"
    # MIOpen's tensor ops (set / scale / cast / add a sub-tensor, bias adds): elementwise helpers of its convolutions
    r"^SubTensorOp|^Op[1-5]dTensor|^OpTensor(Fwd|Leading))"
)


def kernel_base_name(name: str) -> str:
    """A kernel's own name: `(anonymous namespace)` dropped, then everything from its template arguments or
    parameter list on."""
    return re.sub(BASE_NAME_CUT_RE, "", name.replace("(anonymous namespace)", ""))


# Attention's helper kernels (FlashAttention's and cuDNN's backward: rowsum(dO·O) before, the fp32 dQ accumulator
# cast after) run no tensor-core work (ncu: 0 tensor ops, sample_traces/h200_attention): no FLOPs of the op's.
# Convolution ops (aten::convolution, conv2d, _convolution, cudnn_convolution, conv_transpose2d, their backward);
# not aten::convert_*.
CONV_OP_RE = r"(?i)conv(olution|[0-9]d|_|$)"
AUX_ATTENTION_KERNEL_RE = r"(?i)(dot_do_o|convert_dq|convert_dkv)"
# Library / framework kernels known to do ~0 useful FLOPs: elementwise, reductions, norms, softmax, copies, indexing,
# sorting, random numbers, optimizers (PyTorch's `at::native` and `at_cuda_detail`, cub, thrust).
KNOWN_NO_MATMUL_KERNEL_RE = (
    r"(?i)(at::native::|at_cuda_detail|cub::|thrust::|elementwise|pointwise|reduce_kernel|"
    r"reduction|layer_?norm|rms_?norm|group_?norm|batch_?norm|softmax|_copy|copy_kernel|"
    r"CatArray|Fill|Functor|index|gather|scatter|embedding|sort|scan|radix|multi_tensor|adam|"
    r"memset|memcpy|transpose|permute|dropout|philox|distribution|topk|nonzero|arange)"
)
# Framework op namespaces whose ops are known: an op of these that is not matmul-class launches no matmul work.
KNOWN_OP_RE = r"^(aten|prims|c10d|nccl|record_param_comms|cudnn|autograd)::"
# Ops that do matmul-class work (their kernels are unknown when the op has no FLOP figure).
MATMUL_CLASS_OP_RE = (
    r"(?i)(::(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|einsum|_scaled_mm|_int_mm|_grouped_mm|"
    r"_scaled_grouped_mm|addmv|mv|dot|conv[a-z0-9_]*|cudnn_convolution[a-z_]*|miopen_convolution[a-z_]*|"
    r"_convolution[a-z_]*|convolution[a-z_]*|[a-z_]*attention[a-z_]*|_flash_attention[a-z_]*|"
    r"_efficient_attention[a-z_]*|lstm|gru|rnn_tanh|rnn_relu|_cudnn_rnn[a-z_]*)$)"
)

# --------------------------------------------------------------------------------------------------- precision

# Kernel-name hints, in the order they are tried (the first that matches wins): names say the input type before
# the accumulator (`sm80_xmma_gemm_bf16bf16_bf16f32_f32` is bf16, `turing_fp16_s1688gemm_fp16` fp16), so the
# narrow types come first. ROCm Tensile names carry the types as `_BBS_` (bf16 in, fp32 compute) etc.
PRECISION_HINTS: tuple[tuple[str, str], ...] = (
    ("fp8", r"(?i)(fp8|e4m3|e5m2|f8f6f4|_f8_|f8f8|qmma|_fp8)"),
    # (CUTLASS's int8 tensor-op GEMMs: `tensorop_i16832gemm_s8`, the m16n8k32 int8 MMA)
    ("int8", r"(?i)(int8|i8816|i8i8|i16832|imma|_s8s8|_i8_|gemm_s8_)"),
    ("bf16", r"(?i)(bf16|bfloat16|_BBS_|_BSS_|_BBH_)"),
    # (not a bare `f16`: cuDNN's SDPA kernels say `_f16_` for bf16 too)
    ("fp16", r"(?i)(fp16|half|h884|h1688|h16816|hgemm|_HHS_|_HSS_|_HHH_|s884gemm)"),
    ("tf32", r"(?i)(tf32|s1688|s16816|xf32)"),
    ("fp64", r"(?i)(fp64|dgemm|d884|d16816|dmma|_DDD_|double)"),
    # (cuDNN / CUTLASS templates on float: `winogradForwardData4x4<float, float>`)
    ("fp32", r"(?i)(sgemm|ffma|f32f32_f32f32|_SSS_|fp32|scudnn|implicit_convolve_sgemm|<float[,>])"),
)
# Dtypes as traces spell them (Kineto `Input type`, lower-cased) → the precision their matmuls run at.
DTYPE_PRECISION: dict[str, str] = {
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8",
    "c10::float8_e4m3fnuz": "fp8",
    "c10::float8_e5m2fnuz": "fp8",
    "c10::float8_e8m0fnu": "fp8",
    "signed char": "int8",
    "int8": "int8",
    "char": "int8",
}
DEFAULT_PRECISION = "bf16"

# ------------------------------------------------------------------------------------------------- dtype sizes

ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
EXTRA_ELEMENT_BYTES = {
    "long int": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "bool": 1,
    "unsigned char": 1,
    "uint8": 1,
}
# c10::ScalarType numbers as Kineto records a `dtype` argument in Concrete Inputs, → bytes per element.
SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1, 25: 1, 26: 1}
# The element size a kernel's name gives away where the op's arguments carry no dtype (cat's TensorList):
# PyTorch's CatArrayBatchedCopy and other byte-moving kernels are templated on OpaqueType<sizeof(T)>.
KERNEL_ELEMENT_BYTES_RE = r"OpaqueType<([0-9]+)"

# --------------------------------------------------------------------------------------------- host timeline

# Calls that block the host until the GPU is done (a sync stall follows when the host is slow to launch again).
SYNC_API_RE = (
    r"(?i)(synchronize|^cudaMemcpy(2D|3D|ToSymbol|FromSymbol)?(_v[0-9]+)?$|^cuMemcpy[DH]to[DH](_v[0-9]+)?$|"
    r"^hipMemcpy(2D|3D|ToSymbol|FromSymbol|WithStream|HtoD|DtoH|DtoD)?$)"
)
# The overhead records (profiler_overhead) that are one-time set-up, and the GPU idle under them start-up (a buffer
# flush or a full command buffer is not). The profiler's own: CUPTI asking for its activity buffers (at the first
# activities), instrumenting a module, creating its resources; nsys's CUDA / NVTX profiling initialization — named
# `profiler: NAME`, not paid unprofiled.
PROFILER_SETUP_RE = r"(?i)(buffer request|instrumentation|resource|profiling initialization)"
# CUPTI reports the driver's too: loading a kernel's module at its first launch (lazy loading, CUDA 11.7+), the
# driver's JIT compiling PTX. The program pays those unprofiled: start-up by their own names.
DRIVER_SETUP_RE = r"(?i)(lazy function loading|module loading|driver compiler)"
PROFILER_PREFIX = "profiler: "  # (host_activity names them so: `profiler: Activity Buffer Request`)
# HIP launch calls whose grid is a global work size, in work-items (hipBLASLt's and rocBLAS's Tensile GEMMs launch
# so): a kernel's blocks (workgroups) are its grid over its block size. Every other launch — hipLaunchKernel,
# hipModuleLaunchKernel (CK, Triton, PyTorch's own kernels), and CUDA's — gives its grid in blocks (a grid of 1 with
# blocks of 256 in TraceLens's SGLang MI300X trace; sgl_kernel's act_and_mul, one block per token, 15,360 of them).
WORK_ITEM_GRID_LAUNCH_RE = r"(?i)^(hipExtModuleLaunchKernel|hipHccModuleLaunchKernel)$"
# Calls that put work on the GPU (kernel and graph launches, async memsets). Async copies are copies, not launches:
# a pageable cudaMemcpyAsync blocks the host for the copy.
LAUNCH_API_RE = (
    r"(?i)(launchkernel|cuLaunch|graphlaunch|cudaLaunch|hipLaunch|hipModuleLaunch|hipExtLaunch|"
    r"memsetasync)"
)
# Calls that make a stream wait for an event (or a memory value) another stream or process sets: work launched after
# them waits on the GPU, not on the host.
STREAM_WAIT_API_RE = r"(?i)(streamwaitevent|streamwaitvalue)"
# Launches of a captured CUDA / HIP graph: one call starts all the graph's kernels.
GRAPH_LAUNCH_API_RE = r"(?i)graphlaunch"
# Calls that copy or set device memory (sync or async: cudaMemcpy*, cuMemcpy*, hipMemcpy*, memsets).
COPY_API_RE = r"(?i)(memcpy|memset)"
# Stream capture: launches between these calls on one thread are recorded into a graph, not run.
CAPTURE_BEGIN_API_RE = r"(?i)^(cuda|hip)StreamBeginCapture"
CAPTURE_END_API_RE = r"(?i)^(cuda|hip)StreamEndCapture"
# One-time set-up calls: context and module loading, library handles, device queries, stream / event creation,
# allocations and frees (the caching allocator's growth is a one-time cost too).
STARTUP_API_RE = (
    r"(?i)(^cuInit|ctxcreate|primaryctx|ctxretain|modulelo|libraryload|^cudaFree$|^cudaFree_|^cuMemFree|"
    r"malloc|hostalloc|hostregister|^cuMemAlloc|^cuMemCreate|^cuMemMap|^cuMemSetAccess|^cuMemAddressReserve|"
    r"streamcreate|eventcreate|getdeviceproperties|getdevicecount|^cudaSetDevice|cudnncreate|cublascreate|"
    r"cublasltcreate|devicegetstreampriorityrange|cudaDeviceReset|^hipInit|^hipFree$)"
)
# A set-up call (STARTUP_API_RE) is steady-state host work, not start-up, when calls of its name keep coming all
# through the rank's GPU work: at least this many inside its span (first kernel to last), in at least this many of
# its tenths (a burst of frees in the first iterations is set-up; one free per step is not).
STARTUP_RECURRING_MIN_CALLS = 10
STARTUP_RECURRING_BINS = 10
STARTUP_RECURRING_MIN_BINS = 6
# The set-up calls that can recur so (allocations, frees, device queries, stream / event creation); module and
# library loading stays start-up wherever it comes: a kernel's first use loads its module once (lazy loading).
STARTUP_RECURRABLE_API_RE = (
    r"(?i)(free|malloc|memalloc|memcreate|memmap|memsetaccess|addressreserve|hostalloc|hostregister|"
    r"getdeviceproperties|getdevicecount|streamcreate|eventcreate|setdevice)"
)
# The first CUDA call of a process creates its context: it is start-up when it lasts at least this long.
STARTUP_FIRST_CALL_MIN_NS = 1_000_000
# A launch call this long while the GPU idles is a kernel's first launch loading its module (lazy loading, JIT):
# start-up, not the per-launch cost (launches take µs; PR504's slow_launch_ms says the same of its gaps).
SLOW_LAUNCH_NS = 1_000_000
# Host ranges of data loading.
DATALOADER_RE = r"(?i)(dataloader|data_loader|enumerate\(DataLoader)"
# A sync that returned up to 20 µs before an idle stretch began caused it (the runtime's return trails the GPU).
SYNC_TOLERANCE_NS = 20_000
# An idle gap is launch-bound wholly (the host's per-op path of Python, dispatcher and launch) only when it is about
# one launch long and the host launches in it; in a longer gap only the time inside launch calls is.
LAUNCH_GAP_MAX_NS = 100_000

# The range label of a training step: torch.profiler's ProfilerStep#N ranges, #N folded.
STEP_LABEL = "ProfilerStep#*"
# Kernel-duration histograms (sql/launch_stats.sql): log2 buckets from 1 µs — bucket 0 holds kernels under 1 µs,
# bucket b ≥ 1 those of [2^(b-1), 2^b) µs; the last bucket holds everything longer.
HISTOGRAM_BASE_NS = 1_000
HISTOGRAM_BUCKETS = 24

# The share of unknown work above which the achieved fraction is a lower bound (`unknown_is_material`; the verdict's
# default, `[verdict] material_unknown_flops` overrides it there).
MATERIAL_UNKNOWN_FLOPS = 0.10


def unknown_is_material(unknown_ns: float | None, with_flops_ns: float | None, threshold: float = MATERIAL_UNKNOWN_FLOPS) -> bool:
    """Whether kernels without a FLOP estimate make the achieved fraction a lower bound: their time is more than
    `threshold` of theirs and the estimated kernels' together. At the rate the estimated kernels achieved, the
    unknown ones would add unknown / estimated of the FLOPs; kernels known to do no useful FLOPs (elementwise,
    copies) say nothing of that rate, so their time does not dilute the share (MoE experts' unknown GEMMs beside
    weight gathers that take 88% of the kernel time are 10% of it, and would add 28% to the FLOPs)."""
    unknown = float(unknown_ns or 0)
    return unknown > 0 and unknown > threshold * (unknown + float(with_flops_ns or 0))


# --------------------------------------------------------------------------------------------------- plausibility

# Sums of doubles are taken in fixed point (exact_sum in sql/vocab.sql), so that a run's numbers are the same to the
# last digit whatever order the rows arrive in: times in ns at 2^-20 ns, rates (fractions of peak) at 2^-40; FLOPs,
# bytes and a kernel's peak-time equivalent (a tiny kernel's is a fraction of a ns) at 2^-40 (powers of two: x *
# scale is exact, values from 2^13 up lose nothing, and 10^21 FLOPs still fit a HUGEINT 10^5 times over).
NS_FIXED_SCALE = float(2**20)
RATE_FIXED_SCALE = float(2**40)
AMOUNT_FIXED_SCALE = float(2**40)

# The most FLOPs, or bytes, one kernel is given: more is no count of any kernel's work (55 hours of the fastest GPU
# in peaks.toml, 5 PFLOP/s, at its peak; a zettabyte) but a broken `flops` argument or shape, and it would not fit
# the sums above (fuzzing: 10^30 FLOPs overflowed a HUGEINT). Such an estimate is left out: the work is unknown.
MAX_KERNEL_AMOUNT = 1e21

# 1.5x the fastest HBM in peaks.toml (8 TB/s): no kernel moves more; a byte estimate implying more is wrong.
MAX_PLAUSIBLE_BANDWIDTH_BYTES_S = 12e12

# ----------------------------------------------------------------------------------------- rule-side patterns

# Elementwise / pointwise kernels (PyTorch's TensorIterator kernels, Triton pointwise, copies, cat).
ELEMENTWISE_KERNEL_RE = (
    r"(?i)(elementwise|pointwise|triton_poi|_copy_kernel|CatArrayBatchedCopy|FillFunctor|"
    r"Functor)"
)
NOT_ELEMENTWISE_RE = (
    r"(?i)(reduce|norm|softmax|gemm|gemv|nccl|sort|scan|gather|scatter|index|embedding|adam|"
    r"multi_tensor)"
)
# Names of GEMM kernels that run on CUDA cores, not tensor cores.
NON_TENSOR_CORE_RE = r"(?i)(sgemm|simt|_ffma|f32f32_f32f32_f32)"
# Markers of tensor-core GEMM / attention kernels.
TENSOR_CORE_RE = (
    r"(?i)(tensorop|tf32|bf16|f16|fp16|h16|s16816|s1688|h1688|h884|i8816|e4m3|e5m2|wgmma|hmma|gmma|"
    r"nvjet|flash|fmha|sdpa|_mma|mma_)"
)
# GEMM kernels by name (matrix products only: the FLOP split of an op and the GEMM rules).
MATMUL_NAME_RE = r"(?i)(gemm|gemv|nvjet|xmma|cutlass|cublas|matmul|sm[0-9]{2,3}_|ampere_|volta_|turing_|hopper_|Cijk_)"
# Kernel names that do matrix work: an op's FLOPs are split over these (by duration) when it has any.
# cuBLAS's matrix-vector and dot kernels (`gemv2T_kernel_val`, `gemvx::kernel`, `dot_kernel`): CUDA cores at any
# precision.
GEMV_KERNEL_RE = r"(?i)(gemv|dot_kernel)"
MATMUL_KERNEL_RE = (
    r"(?i)(gemm|nvjet|xmma|cutlass|cublas|matmul|_mma|mma_|wgmma|hmma|flash|fmha|attn|attention|"
    r"convolv|convolution|conv[0-9]d|winograd|implicit|fprop|dgrad|wgrad|sm[0-9]{2,3}_|ampere_|volta_|"
    r"turing_|hopper_|Cijk_)"
)


# ------------------------------------------------------------------------------------------- kernel names

KERNEL_NAMESPACES = re.compile(
    r"at::native::|at::cuda::|\(anonymous namespace\)::|<unnamed>::|at_cuda_detail::|cub::detail::|c10::|std::"
)
_KERNEL_TAG = re.compile(r"([A-Za-z_]\w*(?:Functor\w*|KernelImpl|_kernel_cuda|_kernel_impl|Epilogue))")
_GENERIC_TAGS = ("AUnaryFunctor", "BUnaryFunctor", "BinaryFunctor", "UnaryFunctor")
# Launchers that say nothing of the kernel they run: CUTLASS 2's `Kernel` / `Kernel2`, CUTLASS 3's `device_kernel`
# (its GEMMs, FlashAttention-3, vLLM's scaled_mm) and CK tile's `kentry` (ROCm's aiter / SGLang attention and
# norms). Their first template argument names the kernel.
_GENERIC_LAUNCHERS = ("Kernel", "Kernel2", "device_kernel", "kentry")
_FIRST_TEMPLATE_ARG = re.compile(r"\s*([A-Za-z_][\w:]*)")


_MANGLED_LITERAL = re.compile(r"L[a-z]n?\d+E")  # an integer / bool template argument: Li64E, Lb0E
_ANONYMOUS = re.compile(r"_GLOBAL__N_\d*")  # the anonymous namespace's mangled name
_SUBSTITUTION = re.compile(r"S(?:t|[abdios]|[0-9A-Z]*_)")  # std::, std:: abbreviations, an earlier component


def _source_names(s: str, i: int) -> tuple[list[str], int] | None:
    """The <source-name>s (`24add_rmsnorm_quant_kernel`) of an Itanium-mangled name from `i` on, stepping over
    substitutions (`S_`, `S2_`, `St`), up to what is not one; with where that is."""
    parts: list[str] = []
    while i < len(s):
        if s[i].isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            n = int(s[i:j])
            if n == 0 or j + n > len(s):
                return None
            parts.append(s[j : j + n])
            i = j + n
        elif m := _SUBSTITUTION.match(s, i):
            i = m.end()
        else:
            break
    return parts, i


def demangled_head(name: str) -> tuple[str, str | None] | None:
    """An Itanium-mangled kernel name (ROCm's traces keep them: `_ZN5aiter24add_rmsnorm_quant_kernelIDF16b…`) read as
    far as a label needs: the function's own name, and the class its first type template argument names (what a
    generic launcher such as CK's `ck_tile::kentry` runs). None when it is not such a name or does not read."""
    if not name.startswith("_Z"):
        return None
    i, nested = 2, name.startswith("_ZN")
    if nested:
        i = 3
        while i < len(name) and name[i] in "rVKRO":  # cv / ref qualifiers of a member function
            i += 1
    got = _source_names(name, i)
    if got is None:
        return None
    parts, i = got
    parts = [p for p in parts if not _ANONYMOUS.fullmatch(p)]
    if not parts:
        return None
    first: str | None = None
    if i < len(name) and name[i] == "I":  # template arguments: skip literal ones, then read a class type's name
        j = i + 1
        while m := _MANGLED_LITERAL.match(name, j):
            j = m.end()
        if j < len(name) and name[j] == "N":
            j += 1
        arg = _source_names(name, j)
        if arg and arg[0]:
            first = arg[0][-1]
    return parts[-1], first


def kernel_label(name: str) -> str:
    """A kernel's name as people say it: `void at::native::vectorized_elementwise_kernel<4, AUnaryFunctor<…
    MulFunctor<float>>…>(…)` → `vectorized_elementwise_kernel [MulFunctor]` (the function, and the functor or
    implementation that tells it apart); a generic launcher by what it launches (`cutlass::Kernel2<cutlass_80_tensorop_
    i16832gemm_s8_…>` → `Kernel2 [cutlass_80_tensorop_i16832gemm_s8_…]`); a name without templates keeps everything
    but its argument list. The one definition for rules' texts and every renderer (which shorten it further to fit)."""
    n = name.strip()
    if (head := demangled_head(n)) is not None:
        fn, launched = head
        return f"{fn} [{launched}]" if launched and fn in _GENERIC_LAUNCHERS else fn
    if n.startswith("void "):
        n = n[5:]
    n = KERNEL_NAMESPACES.sub("", n)
    depth = 0
    for i, ch in enumerate(n):  # cut the argument list: the first '(' outside the template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            n = n[:i] if n[:i].strip() else n  # (a name that is all parentheses, '(no op)', is no argument list)
            break
    if "<" not in n:
        return n
    base, _, inner = n.partition("<")
    base = base.split("::")[-1] or base
    if base in _GENERIC_LAUNCHERS and (first := _FIRST_TEMPLATE_ARG.match(inner)):
        return f"{base} [{first.group(1).split('::')[-1]}]"
    tags = [t for t in _KERNEL_TAG.findall(inner) if t not in _GENERIC_TAGS]
    return f"{base} [{tags[-1].split('::')[-1]}]" if tags else base


def kernel_word(label: str) -> str:
    """A kernel label (`kernel_label`) in one word for a short fix line: its function (`vectorized_elementwise_kernel`),
    but a generic launcher's whole label (`kentry [Rmsnorm2dFwd]`: 'kentry' alone says nothing)."""
    word = label.split(" ")[0]
    return label if word in _GENERIC_LAUNCHERS and "[" in label else word


def sql_constants() -> dict[str, str]:
    """Every upper-case constant of this module as a SQL literal, for the SQL library's `{{NAME}}` placeholders."""
    out: dict[str, str] = {}
    for name, value in globals().items():
        if not name.isupper():
            continue
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, (int, float)):
            out[name] = repr(value)
        elif isinstance(value, str):
            out[name] = "'" + value.replace("'", "''") + "'"
    return out


# ------------------------------------------------------------------------------------- what program it is
# (sql/program.sql: the rules word their advice for the program, not for PyTorch alone)

# PyTorch's own kernels (ATen, its CUDA helpers, Inductor's compiled kernels) and its host-side markers.
PYTORCH_KERNEL_RE = r"(at::native::|at_cuda_detail|c10::|^triton_(poi|red|per|tem)_)"
PYTORCH_RANGE_RE = r"^(ProfilerStep#|enumerate\(DataLoader|Optimizer\.(step|zero_grad)|Torch-Compiled Region|## )"
# TensorRT: its NVTX domain, its engine ranges and its kernels' suffixes / names.
TENSORRT_RE = r"(?i)(^TensorRT$|ExecutionContext::|_trt$|genericReformat|^trt_|tensorrt)"
# Inference servers that reserve most of the GPU for their KV cache by design (vLLM's gpu_memory_utilization,
# SGLang's mem_fraction_static): their kernels (vllm::…), custom ops or Python frames (with_stack) name them.
# A training step's work: autograd's backward ops and nodes, a backward range, an optimizer step. A trace with framework
# ops and none of these is inference (its collectives are tensor / expert parallelism, not gradient traffic).
BACKWARD_RE = r"(?i)(^autograd::engine::evaluate_function|backward|optimizer\.(step|zero_grad))"
VLLM_RE = r"(^|[^a-z])vllm(::|/|\.|_C|[^a-z]|$)"
SGLANG_RE = r"(^|[^a-z])sglang(::|/|\.|[^a-z]|$)"
# HIP runtime calls: a ROCm program.
HIP_API_RE = r"^hip"
# CPU ops that are annotations or compiled regions, not framework ops: never a kernel's op to fuse.
ANNOTATION_OP_RE = r"(?i)(^Torch-Compiled Region|^CompiledFunction|^## |^ProfilerStep#|^enumerate\(|Optimizer\.|\.py\(|^<)"


# Said in a Kineto source's note when host events reached outside the profiler's recording and were cut to it;
# the note of cut ranges also says CUT_RANGES_MARK, and the verdict repeats it (a step's time changes with it).
OUTSIDE_RECORDING_MARK = "outside the recording"  # (of the profiler)
CUT_RANGES_MARK = "a cut range is measured over its recorded part"
