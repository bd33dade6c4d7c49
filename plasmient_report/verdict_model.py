"""The typed verdict (`plasmient.verdict/1`): msgspec Structs for every object of verdict.json, each field with its
unit and meaning. `verdict.schema.json` and `docs/verdict.md` are generated from these classes
(`python -m plasmient_report.verdict_model --write`), and `load_verdict` is how every reader of a verdict on disk
(`diff`, `batch` resume and reduce) gets one: checked, typed, or one line of `BadInput`.

The judge builds a `Verdict` (judge.build) and render/verdict.py encodes it, so verdict.json is this model by
construction; a test reads every sample's verdict.json back with unknown fields forbidden. Changes are additive: a
field added later has a default, so verdicts written by earlier versions still load.
"""

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec

from .errors import BadInput

SCHEMA = "plasmient.verdict/1"
MAX_VERDICT_BYTES = 256 << 20


def _d(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class _Struct(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base: unknown fields are an error (see `load_verdict` for verdicts of a newer version)."""


class Tool(_Struct, kw_only=True):
    """What wrote the verdict."""

    name: Annotated[str, _d("always `plasmient-report`")]
    version: Annotated[str, _d("the tool's version")]


class GpuEntry(_Struct, kw_only=True):
    """One GPU of the run, as the trace names it."""

    rank: Annotated[int | None, _d("rank (process) the GPU belongs to")]
    device: Annotated[int | None, _d("CUDA device ordinal in that rank's process")]
    name: Annotated[
        str | None,
        _d(
            "GPU name as the trace gives it; where it gives none, or one no peak-table entry knows (HIP's 'AMD Radeon "
            "Graphics'), the model its device properties single out (compute capability / gfx version, SM or CU count, "
            "memory: said in the notes); null when the trace names none and nothing is singled out"
        ),
    ]


class RunInfo(_Struct, kw_only=True):
    """What was analysed."""

    inputs: Annotated[list[str], _d("input paths as given on the command line")]
    ranks: Annotated[list[int | None], _d("ranks with GPU activity in the inputs")]
    gpus: Annotated[list[GpuEntry], _d("one entry per (rank, device) with GPU activity")]
    window_ns: Annotated[
        int | None,
        _d(
            "ns: the analysed window, summed over the ranks' windows (each rank's "
            "profiled window; with --range: the union of its occurrences)"
        ),
    ]
    range: Annotated[list[str] | None, _d("the --range patterns, or null for the whole profiled window")]
    occurrences: Annotated[int | None, _d("occurrences of the range in the window (1 without --range)")]


class WindowUtilization(_Struct, kw_only=True):
    """Utilization of one window: from the trace, and measured by counter logs when given."""

    trace: Annotated[float | None, _d("fraction 0–1 of the window with at least one kernel or copy resident (from the trace)")]
    measured: Annotated[
        float | None,
        _d(
            "fraction 0–1: mean GPU utilization sampled by NVML / DCGM / nvidia-smi "
            "over the window (null without a counter log covering it)"
        ),
    ]
    measured_source: Annotated[str | list[str] | None, _d("the counter log(s) the measured value comes from")]
    sm_active: Annotated[
        float | None, _d("fraction 0–1: mean SM activity (DCGM PROF_SM_ACTIVE / nsys GPU metrics), when recorded")
    ]
    tensor_active: Annotated[
        float | None,
        _d("fraction 0–1: mean tensor-core activity (DCGM PROF_PIPE_TENSOR_ACTIVE / nsys GPU metrics), when recorded"),
    ]


class MeasuredSource(_Struct, kw_only=True):
    """One counter log's own mean over the window, to compare the logs with each other and with the trace."""

    path: Annotated[str, _d("the counter log")]
    format: Annotated[str, _d("its format (nvml-csv, nvidia-smi-dmon, dcgmi-dmon, …)")]
    gpu_util: Annotated[float | None, _d("fraction 0–1: its mean GPU utilization over the part of the window it covers")]
    coverage: Annotated[float | None, _d("fraction 0–1 of the window its samples cover")]
    samples: Annotated[int, _d("samples inside the window")]
    sample_period_ns: Annotated[int | None, _d("ns: its sampling period")]


class Utilization(WindowUtilization, kw_only=True):
    """The run's utilization (as `WindowUtilization`) and every counter log's own mean."""

    measured_by_source: Annotated[list[MeasuredSource], _d("per counter log, its mean over the window")] = []


class PrecisionShare(_Struct, kw_only=True):
    """The achieved fraction of peak of one precision (the shares add up to the headline)."""

    precision: Annotated[str, _d("bf16, fp16, fp8, tf32, fp32, fp64, int8")]
    flops: Annotated[float | None, _d("FLOP: useful work of that precision in the window")]
    peak_tflops: Annotated[float | None, _d("TFLOP/s: the GPU's dense peak at that precision")]
    fraction: Annotated[float | None, _d("fraction: flops / (window · peak_tflops) — its part of the achieved fraction of peak")]


class HardwareEstimate(_Struct, kw_only=True):
    """A hardware counter's view of the useful work, beside the FLOP count (e.g. tensor-core activity)."""

    metric: Annotated[str, _d("the counter, e.g. `tensor_active`")]
    value: Annotated[float | None, _d("fraction 0–1: its mean over the window")]
    source: Annotated[str | None, _d("the log or recorder it comes from")]
    what: Annotated[str, _d("one sentence saying what the number means and how far to trust it")]


class Peak(_Struct, kw_only=True):
    """The peak the achieved fraction is measured against."""

    gpu: Annotated[str | None, _d("peak-table entry used (null: no peak known for this GPU)")]
    gpus: Annotated[list[str] | None, _d("all peak-table entries when the ranks' GPUs differ (else null)")]
    precision: Annotated[str | None, _d("precision of the peak: --peak-precision, else the dominant matmul precision seen")]
    precisions: Annotated[list[str], _d("the matmul precisions present in the window")] = []
    tflops: Annotated[float | None, _d("TFLOP/s: dense peak at that precision (10^12 FLOP/s)")]
    memory_bandwidth_tbs: Annotated[float | None, _d("TB/s: the GPU's peak memory bandwidth (10^12 B/s)")]
    source: Annotated[str | None, _d("where the peak comes from (datasheet, --peak-tflops, --peaks FILE)")]


class Loss(_Struct, kw_only=True):
    """One line of the loss waterfall: a share of the window's peak lost to one cause."""

    category: Annotated[
        str,
        _d(
            "collective_wait, collective_transfer, pipeline_bubble, memory_bound, "
            "unknown_flops, compute_inefficiency, memcpy, launch_bound, sync_stall, "
            "input_bound, startup, host_other, no_coverage (SPEC §4)"
        ),
    ]
    layer: Annotated[str, _d("cluster, pipeline, op, kernel, host, device")]
    fraction: Annotated[
        float, _d("fraction 0–1 of the window's peak lost here; with the achieved fraction the losses add up to 1")
    ]
    recommendation: Annotated[str | None, _d("one-line fix: the explaining finding's, else the category's generic one")]


class Headroom(_Struct, kw_only=True):
    """How far below peak the run is."""

    factor: Annotated[float | None, _d("1 / achieved fraction of peak (null when achieved is unknown or 0)")]
    text: Annotated[str, _d("the same in words, as the box prints it")]


class Finding(_Struct, kw_only=True):
    """A rule's finding: a cause, with evidence and a fix (`plasmient-report rules --explain RULE`)."""

    rule: Annotated[str, _d("rule ID, e.g. PR101")]
    layer: Annotated[str, _d("cluster, pipeline, op, kernel, host, device, memory")]
    category: Annotated[str | None, _d("the loss category it explains (null: none)")]
    severity: Annotated[str, _d("high, medium, low, info")]
    rank: Annotated[int | None, _d("the rank it is about (null: the run)")]
    lost_fraction: Annotated[float | None, _d("fraction 0–1 of the window's peak it accounts for")]
    title: Annotated[str, _d("one-line statement of what was found, with its numbers")]
    evidence: Annotated[dict[str, Any], _d("the rule's evidence (rule-specific keys; times in ns)")] = {}
    recommendation: Annotated[str | None, _d("what to do, in a sentence or two")]
    fix: Annotated[str | None, _d("the one-line fix shown in the box")]
    key: Annotated[str | None, _d("stable key that tells two findings of one rule apart (diff matches on rule, rank, key)")] = (
        None
    )


class RankSummary(_Struct, kw_only=True):
    """One (rank, device): its own numbers; its achieved fraction and losses add up to 1."""

    rank: Annotated[int | None, _d("rank")]
    device: Annotated[int | None, _d("CUDA device ordinal in that rank's process")]
    host: Annotated[str | None, _d("host name the rank ran on, when the trace says")] = None
    gpu: Annotated[str | None, _d("GPU name of this device, as the trace gives it")] = None
    utilization: Annotated[WindowUtilization, _d("utilization of this rank's window")]
    achieved_fraction_of_peak: Annotated[float | None, _d("fraction: useful FLOP/s over this GPU's peak (null: unknown)")]
    achieved_is_lower_bound: Annotated[bool, _d("true when this GPU's work without a FLOP estimate is material")] = False
    window_ns: Annotated[int | None, _d("ns: this rank's analysed window")]
    flops: Annotated[float | None, _d("FLOP: useful work counted in the window")]
    losses: Annotated[list[Loss], _d("this rank's waterfall")]


class RangeSummary(_Struct, kw_only=True):
    """One named range (NVTX / record_function): its occurrences' windows combined over the ranks."""

    name: Annotated[str, _d("the range name")]
    count: Annotated[int, _d("occurrences over all ranks (steps × ranks when every rank ran it)")]
    ranks: Annotated[int | None, _d("ranks that ran the range")] = None
    window: Annotated[
        str | None,
        _d("`gpu` when the GPU-window rule placed the range, `cpu` when it launched nothing and keeps its CPU interval"),
    ] = None
    window_ns: Annotated[int | None, _d("ns: the occurrences' windows summed over ranks")]
    per_occurrence_ns: Annotated[float | None, _d("ns: mean window of one occurrence on one rank")] = None
    utilization: Annotated[float | None, _d("fraction 0–1 of the range's window with a kernel resident")]
    utilization_measured: Annotated[
        float | None, _d("fraction 0–1: measured GPU utilization over the range's window (counter logs)")
    ] = None
    achieved_fraction_of_peak: Annotated[
        float | None, _d("fraction: useful FLOP/s over peak in the range's window (null: unknown)")
    ]
    achieved_is_lower_bound: Annotated[bool, _d("true when the range's work without a FLOP estimate is material")] = False
    flops: Annotated[float | None, _d("FLOP: useful work counted in the range's window")]
    missing_ranks: Annotated[list[int], _d("ranks of the run on which the range does not occur")] = []
    losses: Annotated[list[Loss], _d("the range's waterfall")] = []


class ClockSource(_Struct, kw_only=True):
    """One input on the common clock."""

    path: Annotated[str, _d("the input file")]
    format: Annotated[str, _d("detected format (kineto, nsys-sqlite, nvml-csv, …)")]
    format_version: Annotated[str | None, _d("format / recorder version, when the file says")]
    rank: Annotated[int | None, _d("rank the input belongs to (null: all, or unknown)")]
    rank_method: Annotated[str | None, _d("how the rank was found (distributedInfo, file name, …)")]
    anchor: Annotated[str | None, _d("what ties the file's clock to UTC (baseTimeNanoseconds, …)")]
    offset_ns: Annotated[int | None, _d("ns: offset added to this input's times to put it on the common clock")]
    method: Annotated[str | None, _d("how the offset was found (anchor, cross-correlation, --offset, …)")]
    uncertainty_ns: Annotated[int | None, _d("ns: uncertainty of the offset")]
    time_zone: Annotated[str | None, _d("time zone of local-time logs")]
    sample_period_ns: Annotated[int | None, _d("ns: sampling period of a counter log")]
    notes: Annotated[str | None, _d("what the parser noticed about the file")]


class Clock(_Struct, kw_only=True):
    """How the inputs were put on one clock."""

    sources: Annotated[list[ClockSource], _d("one entry per input file")]


class IncompleteSource(_Struct, kw_only=True):
    """An input whose recorder says data is missing."""

    path: Annotated[str, _d("the input")]
    what: Annotated[str, _d("what the recorder says it lost")]


class Coverage(_Struct, kw_only=True):
    """How much of the run the numbers rest on."""

    kernels: Annotated[int, _d("GPU kernels in the inputs")]
    kernels_with_flops_time_fraction: Annotated[
        float | None, _d("fraction 0–1 of compute-kernel time in the window with a FLOP estimate")
    ]
    run_kernels_with_flops_time_fraction: Annotated[float | None, _d("the same over the whole run")]
    kernels_flops_from_model: Annotated[
        int, _d("kernels whose FLOPs come from a shape model of their op (flops.py; flops_source 'model')")
    ]
    kernels_flops_from_trace: Annotated[int, _d("kernels whose FLOPs come from the trace's own `flops` arg (flops_source 'op')")]
    kernels_flops_from_ncu: Annotated[int, _d("kernels whose FLOPs come from Nsight Compute")]
    kernels_flops_from_user: Annotated[
        int, _d("kernels whose FLOPs come from --model-flops spread by time (flops_source 'user')")
    ] = 0
    communication_time_fraction: Annotated[float | None, _d("fraction 0–1 of kernel time in communication kernels")]
    unknown_flops_time_fraction: Annotated[
        float | None, _d("fraction 0–1 of compute time in kernels that may do matmul-class work with no FLOP estimate")
    ] = None
    kernels_linked_to_ops_fraction: Annotated[
        float | None, _d("fraction 0–1 of kernels linked to the CPU op that launched them")
    ] = None
    kernel_names: Annotated[int | None, _d("distinct kernel names in the window (`top_kernels` holds the first 20)")] = None
    op_names: Annotated[int | None, _d("distinct ops whose kernels ran in the window (`top_ops` holds the first 20)")] = None
    shapes: Annotated[
        int | None, _d("distinct GEMM / attention / convolution shapes in the window (`shapes` holds the first 30)")
    ] = None
    world_size: Annotated[int | None, _d("ranks of the job, as the traces say")]
    missing_ranks: Annotated[list[int], _d("ranks of the job with no GPU activity in the inputs (first 1024)")]
    missing_rank_count: Annotated[int, _d("how many ranks are missing")]
    dropped_events: Annotated[int | None, _d("events the recorders say they dropped")]
    incomplete_sources: Annotated[list[IncompleteSource], _d("inputs whose recorder says data is missing")]


class KernelGroup(_Struct, kw_only=True):
    """One kernel name's work in the window (kernels cut by the window counted pro rata)."""

    name: Annotated[str, _d("kernel name")]
    kind: Annotated[str, _d("kernel class: compute, memory, unknown, communication, copy")]
    count: Annotated[int, _d("kernels of that name")]
    time_ns: Annotated[float, _d("ns: their time in the window")]
    time_share: Annotated[float, _d("fraction 0–1 of all kernel time in the window")]
    flops: Annotated[float | None, _d("FLOP: their useful work (null: no estimate)")]
    bytes: Annotated[float | None, _d("B: their memory traffic from the byte models (null: none)")]
    achieved_flop_s: Annotated[float | None, _d("FLOP/s: flops over the time of the kernels that have one")]
    achieved_fraction_of_peak: Annotated[float | None, _d("fraction: achieved_flop_s over the peak")]
    arithmetic_intensity: Annotated[float | None, _d("FLOP/B over the kernels that have both")]
    bound: Annotated[
        str,
        _d(
            "compute or memory (against the ridge point of the kernel's precision), unknown (no "
            "FLOP estimate for matmul-class work), communication, copy"
        ),
    ]
    achieved_bandwidth_bytes_s: Annotated[float | None, _d("B/s: bytes over the time of the kernels with a byte figure")] = None
    kernel_class: Annotated[
        str | None, _d("the measure stage's class of most of the time: compute, memory, unknown, communication, copy")
    ] = None
    bandwidth_fraction_of_hbm: Annotated[
        float | None,
        _d("fraction: achieved_bandwidth_bytes_s over the GPU's memory bandwidth (above 1 is flagged, never stated as fact)"),
    ] = None
    bandwidth_above_hbm_peak: Annotated[
        bool, _d("the byte estimate implies more than the memory bandwidth (L2 reuse or an over-counting byte model)")
    ] = False


class OpGroup(_Struct, kw_only=True):
    """One op's kernels in the window: the op that owns their FLOPs, else the op that launched them."""

    op: Annotated[str, _d("op name (`(no op)` for kernels linked to none)")]
    kind: Annotated[str, _d("kernel class of most of its time")]
    kernels: Annotated[int, _d("kernels it ran")]
    calls: Annotated[int | None, _d("distinct op calls whose kernels ran in the window")] = None
    time_ns: Annotated[float, _d("ns: their time in the window")]
    time_share: Annotated[float, _d("fraction 0–1 of all kernel time in the window")]
    flops: Annotated[float | None, _d("FLOP: useful work")]
    bytes: Annotated[float | None, _d("B: memory traffic")]
    achieved_flop_s: Annotated[float | None, _d("FLOP/s")]
    achieved_fraction_of_peak: Annotated[float | None, _d("fraction of peak")]
    arithmetic_intensity: Annotated[float | None, _d("FLOP/B")]
    bound: Annotated[str, _d("as for top_kernels")]
    achieved_bandwidth_bytes_s: Annotated[float | None, _d("B/s")] = None
    kernel_class: Annotated[str | None, _d("as for top_kernels")] = None
    bandwidth_fraction_of_hbm: Annotated[float | None, _d("as for top_kernels")] = None
    bandwidth_above_hbm_peak: Annotated[bool, _d("as for top_kernels")] = False


class CollectiveGroup(_Struct, kw_only=True):
    """One collective, process group, group size and message size in the window: count, time and NCCL's bandwidths
    (nccl-tests doc/PERFORMANCE.md), from the transfer part of each operation (its kernel less its wait)."""

    collective: Annotated[str | None, _d("the collective (allreduce, all_gather, _reduce_scatter_base, sendrecv, …)")]
    kind: Annotated[str, _d("collective, all_to_all, or p2p (send/recv outside an all-to-all)")]
    process_group: Annotated[str | None, _d("the process group (else the group's ranks; empty: the trace names none)")]
    group_size: Annotated[int | None, _d("n, ranks in the group (null: unknown)")]
    group_size_source: Annotated[str | None, _d("`trace` (recorded) or `ranks seen` (counted in the inputs)")]
    bytes: Annotated[
        int | None,
        _d(
            "B: message size S as nccl-tests counts it — the larger of the input and output "
            "buffers (null: the trace does not say)"
        ),
    ]
    ops: Annotated[int, _d("operations: one per rank and instance, starting in the window")]
    instances: Annotated[int, _d("distinct operations (sequence numbers)")]
    ranks: Annotated[int, _d("ranks they ran on")]
    time_ns: Annotated[int, _d("ns: their kernel time, waiting included, summed over ranks")]
    mean_ns: Annotated[float, _d("ns: mean kernel time of one operation")]
    wait_ns: Annotated[int, _d("ns: the part spent waiting for peers (the waterfall's collective_wait definition)")]
    transfer_ns: Annotated[int, _d("ns: the rest, data moving")]
    mean_transfer_ns: Annotated[float, _d("ns: mean transfer time of one operation")]
    wait_known: Annotated[
        bool,
        _d(
            "false when the wait cannot be measured (P2P, operations seen on one rank): the "
            "transfer time includes waiting and the bandwidths are lower bounds"
        ),
    ]
    algbw_bytes_s: Annotated[float | None, _d("B/s: algorithm bandwidth, bytes / transfer time")]
    busbw_factor: Annotated[
        float | None,
        _d("busbw / algbw: 2(n−1)/n all-reduce; (n−1)/n all-gather, reduce-scatter, all-to-all; 1 broadcast, reduce, send/recv"),
    ]
    busbw_bytes_s: Annotated[float | None, _d("B/s: bus bandwidth, algbw × busbw_factor — comparable with the link")]
    link: Annotated[
        str | None,
        _d(
            "the link they run on: the GPUs' fabric (NVLink, Infinity Fabric) or PCIe on one "
            "host, `network` across hosts; null: unknown"
        ),
    ]
    placement: Annotated[
        str | None,
        _d(
            "`one host` (host names), `one host (assumed)` (no host names; every rank on "
            "another device ordinal), `several hosts`; null: unknown"
        ),
    ]
    link_bytes_s: Annotated[
        float | None, _d("B/s: one direction of that link (datasheet; null: unknown, always for the network)")
    ]
    busbw_fraction_of_link: Annotated[
        float | None,
        _d("fraction: busbw over link_bytes_s (above 1: the link is faster than the table assumes, e.g. an NVLink bridge)"),
    ]
    link_source: Annotated[str | None, _d("where the link figure comes from (peaks.toml)")] = None


class RankLateness(_Struct, kw_only=True):
    """How late one rank arrived to one step's collectives (a cell of the report's lateness heatmap)."""

    step: Annotated[str | None, _d("the step (ProfilerStep#N); null: collectives outside any step")]
    step_occurrence: Annotated[int | None, _d("the step's occurrence number on the rank (0…)")]
    rank: Annotated[int | None, _d("the rank")]
    ops: Annotated[int, _d("its collective operations in the step whose wait is measured")]
    lateness_ns: Annotated[
        int, _d("ns: summed lateness — how long the first rank to arrive waited for this one, over the step's collectives")
    ]
    max_lateness_ns: Annotated[int, _d("ns: its worst lateness to one collective of the step")]
    wait_ns: Annotated[int, _d("ns: its own wait for its peers in the step")]
    last_arrivals: Annotated[int, _d("collectives of the step it arrived last to")]


class CollectiveStats(_Struct, kw_only=True):
    """The collectives table: per collective kind, group and message size; and the lateness per step and rank."""

    groups: Annotated[list[CollectiveGroup], _d("the groups by time in the window, largest first (the first 50)")]
    groups_total: Annotated[int, _d("groups in the window")]
    lateness: Annotated[
        list[RankLateness],
        _d(
            "per step and rank (collectives seen on two or more ranks); without "
            "steps, or when steps × ranks exceed 4096, one row per rank for the "
            "whole profile (step null)"
        ),
    ]
    lateness_per_step: Annotated[bool, _d("true when `lateness` holds one row per step and rank")]
    steps_label: Annotated[
        str | None, _d("the range whose occurrences are the steps (ProfilerStep#*, the --range); null: the whole profile")
    ] = None


class MemoryPeak(_Struct, kw_only=True):
    """One GPU's device memory from the allocator's records (Kineto `profile_memory=True`) or the CUDA driver's
    allocation records (Nsight Systems `--cuda-memory-usage=true`): its peaks and when."""

    rank: Annotated[int | None, _d("the rank")]
    device: Annotated[int | None, _d("the GPU")]
    source: Annotated[
        str,
        _d(
            "`allocator`: the caching allocator's [memory] events (Kineto); `driver`: the CUDA driver's allocations and"
            " frees (nsys): reserved is the device memory the process held, allocated unknown (null)"
        ),
    ]
    events: Annotated[int, _d("allocator events recorded")]
    first_ns: Annotated[int, _d("ns (UTC epoch): first event")]
    last_ns: Annotated[int, _d("ns (UTC epoch): last event")]
    absolute: Annotated[
        bool,
        _d(
            "false when the trace lacks the allocator's totals (torch < 1.10): allocated is then relative to the profile's"
            " start; source `driver`: the report missed the process's first allocations, reserved is unknown (null)"
        ),
    ]
    peak_allocated_bytes: Annotated[int | None, _d("B: the most memory live tensors held")]
    peak_allocated_ns: Annotated[int | None, _d("ns (UTC epoch): when that peak was first reached")]
    peak_reserved_bytes: Annotated[
        int | None, _d("B: the most memory the caching allocator held from the driver (null: not recorded)")
    ]
    peak_reserved_ns: Annotated[int | None, _d("ns (UTC epoch): when that peak was first reached")]
    allocated_at_start_bytes: Annotated[int | None, _d("B: allocated before the first event")]
    reserved_at_start_bytes: Annotated[int | None, _d("B: reserved after the first event")]
    allocated_at_end_bytes: Annotated[int | None, _d("B: allocated after the last event")]
    device_memory_bytes: Annotated[int | None, _d("B: the device's memory (null: not in the trace)")]
    peak_allocated_fraction: Annotated[float | None, _d("fraction: peak allocated / device memory")]
    peak_reserved_fraction: Annotated[
        float | None, _d("fraction: peak reserved / device memory — how close the rank ran to the limit")
    ]


class Quantiles(_Struct, kw_only=True):
    """A distribution of durations."""

    p50: Annotated[int | None, _d("ns: median")]
    p99: Annotated[int | None, _d("ns: 99th percentile")]
    max: Annotated[int | None, _d("ns: largest")]


class DurationBucket(_Struct, kw_only=True):
    """One bucket of the kernel-duration histogram (log2 buckets from 1 µs)."""

    lower_ns: Annotated[int, _d("ns: the bucket's lower edge (0 for the first)")]
    upper_ns: Annotated[int | None, _d("ns: its upper edge, exclusive (null: the last bucket, open-ended)")]
    kernels: Annotated[int, _d("kernels in it")]
    time_ns: Annotated[int, _d("ns: their time")]


class StreamLaunchStats(_Struct, kw_only=True):
    """One stream's launches in the window: delay, CPU cost, kernel durations — the evidence of launch-bound work."""

    rank: Annotated[int | None, _d("the rank")]
    device: Annotated[int | None, _d("the GPU")]
    stream: Annotated[int | None, _d("the stream")]
    kernels: Annotated[int, _d("GPU activities on it in the window (kernels and memsets; copies aside)")]
    launched: Annotated[int, _d("those whose launching call is in the trace")]
    graph_kernels: Annotated[int, _d("those started by a CUDA graph launch")]
    launch_calls: Annotated[int | None, _d("distinct launching calls (a graph launch once)")]
    launch_delay_ns: Annotated[
        Quantiles,
        _d(
            "ns: the launching call's start to the kernel's start — near the launch "
            "latency when the GPU waits on the host, long when the host runs ahead"
        ),
    ]
    launch_cost_ns: Annotated[Quantiles, _d("ns: the launching call's duration, the host's cost of one launch")]
    kernel_ns: Annotated[Quantiles, _d("ns: kernel durations")]
    kernel_time_ns: Annotated[int, _d("ns: kernel time, summed")]
    launch_time_ns: Annotated[int | None, _d("ns: host time in launching calls, summed")]
    histogram: Annotated[list[DurationBucket], _d("kernel durations in log2 buckets from 1 µs (buckets with kernels)")]


class Step(_Struct, kw_only=True):
    """One step: an occurrence of the analysed range (a ProfilerStep, or an occurrence of a --range) on one GPU, over
    its own GPU window (SPEC §1); its achieved fraction and losses add up to 1."""

    range: Annotated[str, _d("the range pattern (`ProfilerStep#*`, a --range)")]
    name: Annotated[str, _d("the occurrence's own name (e.g. `ProfilerStep#5`)")]
    rank: Annotated[int | None, _d("rank")]
    device: Annotated[int | None, _d("CUDA device ordinal in that rank's process")]
    occurrence: Annotated[int, _d("occurrence on its rank (0…, by CPU start)")]
    start_ns: Annotated[int, _d("ns (UTC, the common clock): start of its GPU window")]
    gpu_ns: Annotated[int, _d("ns: GPU step time, the length of its GPU window")]
    cpu_ns: Annotated[int, _d("ns: the length of its CPU interval (the host's view of the step)")]
    window: Annotated[
        str,
        _d(
            "`gpu` (placed by the work it launched), `cpu` (launched nothing: its CPU interval), "
            "`gpu_annotation` (only Kineto's GPU-stream copy of the range)"
        ),
    ]
    utilization: Annotated[float | None, _d("fraction 0–1 of the step's window with a kernel or copy resident")]
    achieved_fraction_of_peak: Annotated[
        float | None, _d("fraction: useful FLOP/s over peak in the step's window (null: unknown)")
    ]
    achieved_is_lower_bound: Annotated[bool, _d("true when the step's work without a FLOP estimate is material")] = False
    flops: Annotated[float | None, _d("FLOP: useful work of the activities that start in the step")]
    largest_loss: Annotated[str | None, _d("the loss category that took most of the step's peak")]
    largest_loss_fraction: Annotated[float | None, _d("fraction 0–1 of the step's peak it took")]
    excess_over_median: Annotated[
        float | None,
        _d("fraction: how much longer than the median step of the range (all ranks) it is; 0.2 = 20% slower, negative = faster"),
    ]
    slow: Annotated[
        bool,
        _d(
            "true when it is slower than the median step by more than the threshold (`step_summary[].slow_threshold`): an outlier"
        ),
    ] = False
    cut: Annotated[
        bool,
        _d(
            "true when the profiler's recording cut it (its range began before the recording or ended after it): "
            "measured over the recorded part, so gpu_ns and cpu_ns are lower bounds"
        ),
    ] = False
    tokens_per_s: Annotated[float | None, _d("tokens/s: --tokens-per-step over gpu_ns (null without it)")] = None
    samples_per_s: Annotated[float | None, _d("samples/s: --samples-per-step over gpu_ns (null without it)")] = None
    mfu: Annotated[
        float | None,
        _d(
            "fraction: model FLOPs utilization, --model-flops over (gpu_ns · the GPU's dense "
            "peak at the headline precision) (null without --model-flops)"
        ),
    ] = None


class StepRef(_Struct, kw_only=True):
    """A step pointed at: the slowest, or an outlier."""

    rank: Annotated[int | None, _d("rank")]
    device: Annotated[int | None, _d("CUDA device ordinal")]
    occurrence: Annotated[int, _d("occurrence on its rank (0…)")]
    name: Annotated[str, _d("the occurrence's name")]
    gpu_ns: Annotated[int, _d("ns: its GPU step time")]
    excess_over_median: Annotated[float | None, _d("fraction over the median step (0.2 = 20% slower)")]


class RankSteps(_Struct, kw_only=True):
    """One rank's steps: its mean step time (the slowest rank sets the pace of a synchronous job)."""

    rank: Annotated[int | None, _d("rank")]
    device: Annotated[int | None, _d("CUDA device ordinal")]
    steps: Annotated[int, _d("its steps")]
    mean_ns: Annotated[float, _d("ns: its mean GPU step time")]
    excess_over_fastest: Annotated[float, _d("fraction: its mean over the fastest rank's mean, minus 1")]


class StepSummary(_Struct, kw_only=True):
    """The steps of one range over all ranks: mean and spread of the GPU step time, the slowest steps and ranks,
    and throughput when the work per step is given."""

    range: Annotated[str, _d("the range pattern (`ProfilerStep#*`, a --range)")]
    steps: Annotated[int, _d("step rows (occurrences × GPUs)")]
    per_rank: Annotated[int, _d("occurrences on the rank with the most")]
    ranks: Annotated[int, _d("ranks with steps")]
    mean_ns: Annotated[float, _d("ns: mean GPU step time of the whole steps (of all when every step was cut)")]
    median_ns: Annotated[float, _d("ns: median GPU step time of the whole steps (of all when every step was cut)")]
    min_ns: Annotated[int, _d("ns: the fastest whole step")]
    max_ns: Annotated[int, _d("ns: the slowest whole step")]
    stddev_ns: Annotated[float, _d("ns: sample standard deviation of the whole steps' times (0 for one step)")]
    spread: Annotated[float | None, _d("fraction: stddev_ns / mean_ns (coefficient of variation)")]
    utilization: Annotated[float | None, _d("fraction 0–1: the steps' busy time over their windows")]
    achieved_fraction_of_peak: Annotated[
        float | None, _d("fraction: the steps' achieved peak-time over their windows (null: unknown)")
    ]
    slowest: Annotated[StepRef | None, _d("the slowest whole step")]
    slow_threshold: Annotated[
        float, _d("fraction: a step slower than the median by more than this is flagged `slow` ([verdict] slow_step)")
    ]
    slow_steps: Annotated[list[StepRef], _d("the steps flagged slow, slowest first (first 20)")] = []
    slow_step_count: Annotated[int, _d("how many steps are flagged slow")] = 0
    cut_step_count: Annotated[
        int,
        _d(
            "how many steps the profiler's recording cut (`steps[].cut`): their times are lower bounds, left out of the "
            "step-time statistics unless every step was cut"
        ),
    ] = 0
    by_rank: Annotated[list[RankSteps], _d("per rank (and GPU): mean step time, slowest first (first 64)")] = []
    slowest_rank: Annotated[
        RankSteps | None,
        _d(
            "the rank with the longest mean step, when it is slower than the "
            "fastest by more than [verdict] slow_rank (null otherwise, or "
            "with one rank)"
        ),
    ] = None
    tokens_per_step: Annotated[float | None, _d("--tokens-per-step: tokens one rank processes per step")] = None
    samples_per_step: Annotated[float | None, _d("--samples-per-step: samples one rank processes per step")] = None
    tokens_per_s: Annotated[float | None, _d("tokens/s of one rank: tokens_per_step over the mean step time")] = None
    tokens_per_s_all_ranks: Annotated[float | None, _d("tokens/s of the job: tokens_per_s × ranks")] = None
    samples_per_s: Annotated[float | None, _d("samples/s of one rank: samples_per_step over the mean step time")] = None
    samples_per_s_all_ranks: Annotated[float | None, _d("samples/s of the job: samples_per_s × ranks")] = None
    model_flops: Annotated[
        float | None, _d("FLOP: --model-flops, the model's FLOPs per step of one rank (the MFU convention, e.g. 6·params·tokens)")
    ] = None
    mfu: Annotated[
        float | None,
        _d(
            "fraction: model FLOPs utilization, model_flops × steps over Σ (step time · the "
            "GPU's dense peak at the headline precision): beside the achieved fraction, "
            "which counts the kernels' own FLOPs"
        ),
    ] = None


class Shape(_Struct, kw_only=True):
    """One problem shape of matmul-class work in the window (TraceLens's per-shape view): an op (the one that owns its
    kernels' FLOPs), its shape and dtype, and how its kernels did (kernels cut by the window counted pro rata)."""

    family: Annotated[str, _d("gemm, attention or conv")]
    op: Annotated[
        str,
        _d("the op whose inputs give the shape (aten::mm, aten::linear, aten::scaled_dot_product_attention, aten::conv2d, …)"),
    ]
    shape: Annotated[str, _d("the shape in one line: `M=… N=… K=…`; `B=… H=…[/kv heads] L=… S=… D=… [causal]`; `in N×C×… w …`")]
    dtype: Annotated[str | None, _d("dtype of its first matrix operand as the trace spells it (BFloat16, Float8_e4m3fn, float)")]
    precision: Annotated[str | None, _d("the precision whose peak its FLOPs are measured against (kernel_class)")]
    layout: Annotated[
        str | None,
        _d("GEMM: the operands' transposes as its kernel names spell them (cuBLAS `tn`, nvjet `NTN`); null when they do not say"),
    ] = None
    pass_: Annotated[str | None, _d("attention: forward or backward")] = msgspec.field(default=None, name="pass")
    batch: Annotated[int | None, _d("GEMM: batch of a batched matmul (1 otherwise); attention: batch; conv: N")] = None
    m: Annotated[int | None, _d("GEMM: rows of the output (a linear's leading dims folded)")] = None
    n: Annotated[int | None, _d("GEMM: columns of the output")] = None
    k: Annotated[int | None, _d("GEMM: the reduction dimension")] = None
    heads: Annotated[int | None, _d("attention: query heads")] = None
    kv_heads: Annotated[int | None, _d("attention: key / value heads (fewer than heads: GQA / MQA)")] = None
    q_len: Annotated[int | None, _d("attention: query length L")] = None
    kv_len: Annotated[int | None, _d("attention: key / value length S")] = None
    head_dim: Annotated[int | None, _d("attention: head dimension")] = None
    causal: Annotated[bool | None, _d("attention: causal masking")] = None
    conv_input: Annotated[str | None, _d("conv: input dims N×C×spatial")] = None
    conv_weight: Annotated[str | None, _d("conv: weight dims")] = None
    stride: Annotated[str | None, _d("conv: stride per spatial dim")] = None
    padding: Annotated[str | None, _d("conv: padding per spatial dim")] = None
    groups: Annotated[int | None, _d("conv: groups")] = None
    transposed: Annotated[bool | None, _d("conv: a transposed convolution")] = None
    calls: Annotated[int, _d("op calls with this shape whose kernels ran in the window")]
    kernels: Annotated[int, _d("their kernels (helper kernels of the op included)")]
    time_ns: Annotated[float, _d("ns: their kernels' time in the window")]
    time_share: Annotated[float | None, _d("fraction 0–1 of all kernel time in the window")]
    time_per_call_ns: Annotated[float | None, _d("ns: kernel time per call")]
    flops: Annotated[float | None, _d("FLOP: their useful work")]
    bytes: Annotated[float | None, _d("B: their memory traffic from the byte model")]
    achieved_flop_s: Annotated[float | None, _d("FLOP/s: flops over their kernel time")]
    achieved_bandwidth_bytes_s: Annotated[float | None, _d("B/s: bytes over their kernel time")]
    fraction_of_peak: Annotated[
        float | None, _d("fraction: their FLOPs against the peak of each kernel's own precision, over their kernel time")
    ]
    arithmetic_intensity: Annotated[float | None, _d("FLOP/B")]
    bound: Annotated[
        str | None,
        _d(
            "compute or memory: arithmetic intensity against the ridge point of its precision (kernel_class), of the "
            "kernels that do its FLOPs (most of their time; helper kernels such as layout transposes have none)"
        ),
    ]
    kernel_class: Annotated[str | None, _d("the class of most of its time: compute, memory, unknown")]
    kernel: Annotated[str | None, _d("the kernel of most of its time")]
    kernel_names: Annotated[int, _d("distinct kernel names it ran")]
    parent_op: Annotated[
        str | None,
        _d(
            "the op that called it for most of its time, e.g. an autograd node or a module's op; annotations (profiler "
            "steps, compiled regions, `## name ##` ranges) are passed over; null when nothing else called it"
        ),
    ]


class Verdict(_Struct, kw_only=True):
    """verdict.json: the run's verdict, stable and machine-readable (SPEC §6)."""

    schema: Annotated[str, _d("always `plasmient.verdict/1`")]
    tool: Annotated[Tool, _d("what wrote it")]
    run: Annotated[RunInfo, _d("what was analysed")]
    utilization: Annotated[Utilization, _d("the run's utilization")]
    achieved_fraction_of_peak: Annotated[
        float | None,
        _d("fraction: useful FLOP/s over the peak, over the window (null = unknown: no peak, or no FLOP estimate at all)"),
    ]
    achieved_is_lower_bound: Annotated[
        bool, _d("true when work without a FLOP estimate is material: the true achieved fraction is higher")
    ] = False
    achieved_by_precision: Annotated[list[PrecisionShare], _d("the achieved fraction per precision")] = []
    hardware_estimate: Annotated[HardwareEstimate | None, _d("a hardware counter's view of the useful work, when recorded")] = (
        None
    )
    peak: Annotated[Peak, _d("the peak used")]
    losses: Annotated[list[Loss], _d("the loss waterfall, largest first (fractions of the window's peak)")]
    headroom: Annotated[Headroom, _d("1 / achieved")]
    verdict: Annotated[
        str,
        _d(
            "verdict word, one of: 'idle' ('idle (graph capture)' when most launches went into a graph capture), "
            "'communication-bound', 'healthy', 'busy, not useful', 'underused'; where the achieved fraction is not a "
            "number to judge by: 'busy (no peak known)', 'busy (achieved unknown)' / 'underused (achieved unknown)' "
            "(no FLOP estimate at all), 'busy (achieved: lower bound)' (work without a FLOP estimate is material); "
            "'too short to judge' (a window under the rules' min_window_us per GPU: measured, not judged); 'no data'"
        ),
    ]
    findings: Annotated[list[Finding], _d("the rules' findings, worst first")]
    ranks: Annotated[list[RankSummary], _d("one entry per (rank, device)")]
    ranges: Annotated[list[RangeSummary], _d("per named range (top-level ranges without --range)")]
    clock: Annotated[Clock, _d("the clock alignment")]
    coverage: Annotated[Coverage, _d("what the numbers rest on")]
    top_kernels: Annotated[list[KernelGroup], _d("the first 20 kernel names by time in the window")] = []
    top_ops: Annotated[list[OpGroup], _d("the first 20 ops by kernel time in the window")] = []
    shapes: Annotated[
        list[Shape],
        _d(
            "per shape: the first 30 GEMM / attention / convolution shapes by time in the "
            "window (the store's `shape_roofline` macro has all)"
        ),
    ] = []
    collective_stats: Annotated[
        CollectiveStats | None, _d("the collectives table and the lateness heatmap (null: no collectives)")
    ] = None
    memory: Annotated[list[MemoryPeak], _d("per GPU with allocator events: peak allocated and reserved memory")] = []
    launch_stats: Annotated[
        list[StreamLaunchStats],
        _d("per stream, most kernels first (the first 64): launch delay, launch cost and the short-kernel histogram"),
    ] = []
    steps: Annotated[
        list[Step],
        _d("per step: each occurrence of the analysed range on each GPU (first 4096; the store's `steps` table has all)"),
    ] = []
    step_summary: Annotated[
        list[StepSummary], _d("per analysed range with steps: step time, spread, slowest steps and ranks, throughput")
    ] = []
    notes: Annotated[list[str], _d("what the reader should know (missing data, lower bounds, assumptions)")] = []


# ------------------------------------------------------------------------------------------------ reading


def _non_finite(x: Any, path: str = "") -> Iterator[str]:
    if isinstance(x, float) and not math.isfinite(x):
        yield path or "(top)"
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _non_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _non_finite(v, f"{path}[{i}]")


def _prune_unknown(doc: Any, t: Any) -> Any:
    """`doc` without the keys `t` does not know (a verdict of a newer version: changes are additive)."""
    from msgspec import inspect as mi

    info = mi.type_info(t) if not isinstance(t, mi.Type) else t
    if isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        for sub in info.types:
            if isinstance(sub, (mi.StructType, mi.ListType)) and isinstance(
                doc, dict if isinstance(sub, mi.StructType) else list
            ):
                return _prune_unknown(doc, sub)
        return doc
    if isinstance(info, mi.StructType) and isinstance(doc, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        return {k: _prune_unknown(v, fields[k]) for k, v in doc.items() if k in fields}
    if isinstance(info, mi.ListType) and isinstance(doc, list):
        return [_prune_unknown(v, info.item_type) for v in doc]
    return doc


def from_dict(doc: Any, source: object = None, strict: bool = True) -> Verdict:
    """A verdict document (a dict, as judge builds it or JSON decodes it) as a `Verdict`; BadInput naming
    `source` when it is not one. With `strict=False`, keys this version does not know are dropped first."""
    where = source if source is not None else "verdict"
    if not isinstance(doc, dict):
        raise BadInput(where, "not a plasmient verdict (not a JSON object)")
    if doc.get("schema") != SCHEMA:
        raise BadInput(where, f"not a plasmient verdict (schema {doc.get('schema')!r}, expected {SCHEMA!r})")
    bad = next(_non_finite(doc), None)
    if bad is not None:
        raise BadInput(where, f"malformed verdict: {bad} is not a finite number")
    if not strict:
        doc = _prune_unknown(doc, Verdict)
    try:
        return msgspec.convert(doc, Verdict, strict=True)
    except msgspec.ValidationError as e:
        raise BadInput(where, f"malformed verdict: {e}") from None


def load_verdict(path: Path) -> Verdict:
    """verdict.json on disk as a `Verdict` (or an output folder's). Malformed, wrong-typed, non-finite, of another
    schema, unreadable: one BadInput line naming the file (the CLI exits 2), never a traceback."""
    path = Path(path)
    target = path / "verdict.json" if path.is_dir() else path
    try:
        size = target.stat().st_size
        if size > MAX_VERDICT_BYTES:
            raise BadInput(target, f"too large for a verdict ({size} bytes)")
        data = target.read_bytes()
    except OSError as e:
        raise BadInput(target, f"cannot read ({e.strerror})") from None
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise BadInput(target, f"not valid JSON ({e})") from None
    return from_dict(doc, target, strict=False)


def to_dict(v: Verdict) -> dict[str, Any]:
    """A `Verdict` as the plain document (the JSON form)."""
    out: dict[str, Any] = msgspec.to_builtins(v)
    return out


# ------------------------------------------------------------------------------------- schema and docs


def json_schema() -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(Verdict)
    schema["$id"] = "https://plasmient.dev/schema/verdict-1.json"
    schema["title"] = "plasmient.verdict/1"
    return schema


def schema_text() -> str:
    import json

    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"


def _type_name(t: Any) -> str:
    from msgspec import inspect as mi

    if isinstance(t, mi.UnionType):
        names = [_type_name(x) for x in t.types]
        return " or ".join(n for n in names if n != "null") + (" or null" if "null" in names else "")
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.ListType):
        item = _type_name(t.item_type)
        return f"list of ({item})" if " or " in item else f"list of {item}"
    if isinstance(t, mi.DictType):
        return "object"
    if isinstance(t, mi.StructType):
        return "object"
    scalar: dict[type, str] = {
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.StrType: "string",
        mi.BoolType: "boolean",
        mi.AnyType: "any",
    }
    return scalar.get(type(t), type(t).__name__)


def _struct_of(t: Any) -> Any:
    from msgspec import inspect as mi

    if isinstance(t, mi.StructType):
        return t
    if isinstance(t, mi.ListType):
        return _struct_of(t.item_type)
    if isinstance(t, mi.UnionType):
        for x in t.types:
            s = _struct_of(x)
            if s is not None:
                return s
    return None


def key_rows() -> list[tuple[str, str, str, bool]]:
    """Every key of the verdict as (dotted path, type, meaning, required), depth first."""
    from msgspec import inspect as mi

    rows: list[tuple[str, str, str, bool]] = []

    def walk(info: mi.StructType, prefix: str) -> None:
        for f in info.fields:
            t = f.type
            desc = ""
            if isinstance(t, mi.Metadata):
                desc = (t.extra_json_schema or {}).get("description", "") if hasattr(t, "extra_json_schema") else ""
                desc = desc or getattr(t, "description", "") or ""
                t = t.type
            path = f"{prefix}{f.encode_name}"
            rows.append((path, _type_name(t), desc, f.required))
            sub = _struct_of(t)
            if sub is not None:
                walk(
                    sub,
                    path
                    + (
                        "[]."
                        if isinstance(t, mi.ListType)
                        or (isinstance(t, mi.UnionType) and any(isinstance(x, mi.ListType) for x in t.types))
                        else "."
                    ),
                )

    top = mi.type_info(Verdict)
    assert isinstance(top, mi.StructType)
    walk(top, "")
    return rows


DOC_HEAD = """# verdict.json (`plasmient.verdict/1`)

Every key of the verdict, its type, unit and meaning. Generated from `plasmient_report/verdict_model.py` (the typed
verdict) by `python -m plasmient_report.verdict_model --write`, which also writes the JSON Schema
`plasmient_report/verdict.schema.json`; a test fails when this page, the schema or the model drift apart.

- Fractions are 0–1 of the analysed window (`run.window_ns`), not percentages. Times are in ns, work in FLOP,
  rates in FLOP/s or B/s, peaks in TFLOP/s (10^12) and TB/s.
- Numbers are finite or null — never NaN or Infinity. Null means unknown: `achieved_fraction_of_peak` is null when
  no peak is known for the GPU or no kernel has a FLOP estimate; a number with `achieved_is_lower_bound: true` is
  a lower bound (work without a FLOP estimate is material).
- The achieved fraction and the `losses` add up to 1 for the run, for every entry of `ranks` and for every range.
  On a GPU with no peak (achieved null for want of one) the time of work with a FLOP estimate is in no loss: it
  is achieved and compute inefficiency together, which only a peak tells apart — there the losses add up to 1
  minus that share (report.html and the terminal show it as its own line).
- Changes are additive: keys are never renamed or removed; a key added later is optional (its default is shown
  as *optional*). Readers should ignore keys they do not know; `load_verdict` does.
- Read it typed in Python: `from plasmient_report.verdict_model import load_verdict`.

| key | type | meaning |
|---|---|---|
"""


DOC_TAIL = """
## Notes

- `top_kernels` and `top_ops` hold the first 20 groups by kernel time inside the analysed window (kernels cut by
  the window counted pro rata). Bytes come from the byte models of `plasmient_report/flops.py` (`op_bytes` for
  matmul-like ops, `op_traffic_bytes` for norms, softmax, reductions, embedding, copies, gathers / scatters, cat
  and elementwise ops), evaluated once per distinct shape; `bound` compares arithmetic intensity with the ridge
  point (peak / bandwidth) of the GPU. `report.html` shows the same two tables ("Top kernels", "Top ops").
- `steps` has one entry per occurrence of the analysed range on each GPU — `ProfilerStep#*`, or each `--range`, or
  without either the top-level range that repeats on a rank and covers the most GPU time — over its own GPU window
  (SPEC §1; `run.duckdb`'s `steps` and `step_losses` hold every step and each step's waterfall). `step_summary`
  has one entry per such range. Throughput needs `--tokens-per-step` / `--samples-per-step` (work of one rank's
  step); MFU needs `--model-flops`.
- `shapes` groups the window's GEMM / attention / convolution kernels by the op they ran for (the outermost op with
  a shape model among the launching op and its callers) and its input shapes (`flops.op_shape`); helper kernels of
  the op count in its time, its workspace memsets do not. `run.duckdb`'s `shape_roofline(scope, range)` macro has
  every shape of every window; `plasmient-report export` writes them.
- `findings[].evidence` is each rule's own record (its keys are listed on the rule's page,
  `plasmient-report rules --explain ID`); everything else above is stable.
- The store behind the verdict (`run.duckdb`) is documented in docs/schema.md.
"""


def doc_text() -> str:
    lines = [DOC_HEAD.rstrip("\n")]
    for path, type_name, desc, required in key_rows():
        opt = "" if required else " *optional*"
        lines.append(f"| `{path}` | {type_name}{opt} | {desc.replace('|', '/')} |")
    return "\n".join(lines) + "\n" + DOC_TAIL


SCHEMA_PATH = Path(__file__).with_name("verdict.schema.json")
DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "verdict.md"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
        DOC_PATH.write_text(doc_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_PATH} and {DOC_PATH}")
        return 0
    print(doc_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
