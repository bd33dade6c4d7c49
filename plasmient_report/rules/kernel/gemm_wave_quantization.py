"""PR402 gemm-wave-quantization: GEMMs (and convolutions, as the implicit GEMMs they run as) whose tiles do not
fill the GPU's SMs in whole waves — a nearly empty last wave, padded tiles, or a GEMM smaller than one wave.
waves = blocks / (SMs · blocks per SM); tiles come from the kernel name and the op's shapes when the kernel is
persistent. A HIP grid launched with a global work size counts work-items (context.grid_unit_sql): it is divided by
its block size first."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...flops import GEMM_OPS
from ...vocab import AMOUNT_FIXED_SCALE, MATMUL_NAME_RE
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext, grid_blocks_sql, grid_unit_sql
from ..text import fmt_ns, pct, short_kernel

EXPLANATION = Explanation(
    what_it_does="""
        For every matmul kernel shape (kernel, op input shapes, grid, block, registers, shared memory): how many
        waves its work makes on this GPU — waves = work units / (SMs × blocks per SM), with blocks per SM from the
        launch's registers, threads and shared memory; the work units are the kernel's blocks (a HIP grid of
        work-items — hipExtModuleLaunchKernel's, hipBLASLt's — divided by the block size; a HIP kernel replayed
        from a graph, its grid's unit unknown, is left out), or, for a persistent kernel (one block per SM looping over
        tiles), its tiles ⌈M/tm⌉·⌈N/tn⌉ from the tile size in the kernel name and the op's shapes. A convolution
        is the implicit GEMM it runs as: M = batch × output pixels, N = output channels (stride, padding and
        dilation from the op's concrete inputs); a convolution whose output size the trace does not give, a
        transposed or backward one, is counted by its blocks alone (no padding figure), and said so. Efficiency =
        (waves / ⌈waves⌉) × (M·N over the padded tile area). When the trace gives no registers or shared memory,
        the figure that holds for every occupancy from 1 block per SM to the most the threads allow is used (the
        better one): only what holds whatever the occupancy is flagged. Flags shapes below `max_efficiency`.""",
    why_is_this_bad="""
        An SM that gets no tile in the last wave idles while the others finish: 133 tiles on 132 SMs take two full
        waves of time for 1.01 waves of work (50% efficient). Tiles that overhang the matrix edge compute zeros.
        Small GEMMs leave most SMs idle and pay launch and ramp-up costs for little math.""",
    example="""
        `GEMM wave quantization: sm90_xmma_gemm… (aten::mm [[1664, 8192], [8192, 1408]]) makes 143 tiles on 132
        SM slots = 1.08 waves (54% efficient)`.""",
    how_to_fix="""
        Choose shapes that are multiples of the tile size and fill whole waves (hidden sizes, batch × sequence as
        multiples of 128/256; vocabulary padded to a multiple of 64 or 128). Batch many small GEMMs into one
        (`bmm`, grouped GEMM, fused QKV) or capture them in a graph. Let cuBLASLt / hipBLASLt pick split-K /
        stream-K kernels (newer releases do this for awkward shapes) or autotune (`torch.compile(mode=
        "max-autotune")` in PyTorch); a convolution's algorithm is cuDNN's / MIOpen's to choose
        (`torch.backends.cudnn.benchmark = True` tries each for the shape).""",
)

# Per-SM limits: (shared memory bytes per SM, max threads, max blocks). NVIDIA by compute capability; AMD CDNA
# per CU (64 KiB LDS; 2048 work-items = 32 wavefronts of 64), keyed apart: AMD's "9.0" / "9.4" are gfx90a / gfx942.
SM_LIMITS = {
    "9.0": (233472, 2048, 32),
    "8.0": (167936, 2048, 32),
    "8.6": (102400, 1536, 16),
    "8.9": (102400, 1536, 24),
    "7.0": (98304, 2048, 32),
    "7.5": (65536, 1024, 16),
    "10.0": (233472, 2048, 32),
    "12.0": (102400, 1536, 32),
}
AMD_LIMITS = {"9.5": (163840, 2048, 32)}
AMD_DEFAULT = (65536, 2048, 32)
REGS_PER_SM = 65536
MAX_TILE_AREA = 256 * 256  # the largest GEMM tile a block computes (CUTLASS / cuBLAS / Tensile)
TILE_RE = re.compile(
    r"(?<![0-9])(16|32|64|96|112|128|160|192|224|256|320|384|512)x"
    r"(16|32|64|96|112|128|160|192|224|256|320|384|512)(?![0-9])"
)
CONV_OP_RE = re.compile(r"(?i)conv")
# Forward convolution ops whose arguments are (input, weight, bias, stride, padding, dilation, …).
CONV_FORWARD_OPS = {"aten::conv1d": 1, "aten::conv2d": 2, "aten::conv3d": 3, "aten::convolution": 0, "aten::_convolution": 0}

GROUPS_SQL = f"""
SELECT md5(concat_ws('|', k.name, o.name, o.input_dims, o.concrete_inputs, k.grid_x, k.grid_y, k.grid_z, k.block_x,
                     k.block_y, k.block_z, k.regs, k.smem, k.rank, k.device, kl.launch_name)) AS key,
       k.name, o.name AS op_name, o.input_dims, o.concrete_inputs, k.grid_x, k.grid_y, k.grid_z, k.block_x,
       k.block_y, k.block_z, k.regs, k.smem, k.rank, k.device, k.kernel_id, k.start_ns, k.end_ns, k.flops,
       kl.launch_name
FROM rule_kernels k JOIN rule_ops o ON o.op_id = k.flops_op_id LEFT JOIN kernel_launch kl ON kl.kernel_id = k.kernel_id
WHERE k.kind = 'compute' AND coalesce(k.flops, 0) > 0 AND k.end_ns > k.start_ns AND k.grid_x IS NOT NULL
  AND regexp_matches(k.name, '{MATMUL_NAME_RE}')"""


def _json(text: str | None) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError:
        return None


def gemm_mnb(op: str | None, dims_json: str | None) -> tuple[int, int, int] | None:
    """(M, N, batch) of a matmul-like op from its input dims."""
    d = _json(dims_json)
    if not isinstance(d, list):
        return None
    shapes = [x for x in d if isinstance(x, list) and x and all(isinstance(v, int) for v in x)]
    at = GEMM_OPS[op][0] if op in GEMM_OPS else 0  # addmm and its kin: the operands after `self`
    if at and len(shapes) >= at + 2:
        shapes = shapes[at:]
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if op == "aten::linear":
        return (math.prod(a[:-1]), b[0], 1) if len(b) == 2 else None
    if len(a) >= 2 and len(b) >= 2:
        batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
        return a[-2], b[-1], batch
    return None


def _ints(x: Any, n: int) -> list[int] | None:
    v = _json(x) if isinstance(x, str) else x
    if isinstance(v, int):
        v = [v] * n
    if isinstance(v, list) and len(v) == 1 and n > 1:
        v = v * n
    return v if isinstance(v, list) and len(v) == n and all(isinstance(i, int) for i in v) else None


def conv_mnb(op: str | None, dims_json: str | None, concrete_json: str | None) -> tuple[int, int, int] | None:
    """(M, N, groups) of a forward convolution as an implicit GEMM: M = batch × output pixels, N = output channels
    per group. None when the output size cannot be known (no stride / padding / dilation in the trace, a transposed
    convolution, another op's argument order)."""
    if op not in CONV_FORWARD_OPS:
        return None
    dims, concrete = _json(dims_json), _json(concrete_json)
    if not isinstance(dims, list) or len(dims) < 2 or not isinstance(concrete, list) or len(concrete) < 6:
        return None
    x, w = dims[0], dims[1]
    if not (isinstance(x, list) and isinstance(w, list) and len(x) == len(w) and len(x) >= 3):
        return None
    nd = len(x) - 2
    if CONV_FORWARD_OPS[op] and CONV_FORWARD_OPS[op] != nd:
        return None
    if op in ("aten::convolution", "aten::_convolution") and (len(concrete) < 9 or str(concrete[6]) != "False"):
        return None  # transposed, or the flag is not in the trace
    stride, pad, dil = (_ints(concrete[i], nd) for i in (3, 4, 5))
    groups_at = 6 if op.startswith("aten::conv") and op[-2:-1].isdigit() else 8
    g = _json(concrete[groups_at]) if len(concrete) > groups_at and isinstance(concrete[groups_at], str) else None
    groups = g if isinstance(g, int) and g > 0 else None
    if stride is None or pad is None or dil is None or groups is None:
        return None
    out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    if any(o <= 0 for o in out) or w[0] % groups:
        return None
    return x[0] * math.prod(out), w[0] // groups, groups


def blocks_per_sm(limits: tuple[int, int, int], threads: int, regs: int | None, smem: int | None) -> int:
    smem_sm, max_threads, max_blocks = limits
    n = max_blocks
    if threads:
        n = min(n, max_threads // threads)
        if regs:
            n = min(n, REGS_PER_SM // (regs * threads))
    if smem:
        n = min(n, smem_sm // smem)
    return max(n, 1)


@dataclass(frozen=True)
class Waves:
    units: int  # work units scheduled: tiles (persistent kernels) or blocks
    slots: int  # SMs · blocks per SM
    waves: float
    efficiency: float  # wave efficiency × tile padding efficiency
    wave_efficiency: float
    padding_efficiency: float | None  # None: not known (a convolution whose output size the trace lacks)
    tile: tuple[int, int] | None
    persistent: bool
    occupancy_known: bool  # blocks per SM from the launch's registers / shared memory (else the best case taken)
    shape: str  # gemm, conv (an implicit GEMM) or blocks (the grid alone)


def _one(
    blocks: int,
    slots: int,
    m: re.Match[str] | None,
    mnk: tuple[int, int, int] | None,
    sm_count: int,
    occupancy_known: bool,
    shape: str,
) -> Waves | None:
    best: Waves | None = None
    if m and mnk:
        M, N, batch = mnk
        for tm, tn in ((int(m.group(1)), int(m.group(2))), (int(m.group(2)), int(m.group(1)))):
            tiles = math.ceil(M / tm) * math.ceil(N / tn) * batch
            persistent = blocks <= slots < tiles
            units = tiles if persistent else max(blocks, 1)
            w = units / slots
            we = w / math.ceil(w)
            pe = (M * N) / (math.ceil(M / tm) * tm * math.ceil(N / tn) * tn)
            cand = Waves(units, slots, w, we * pe, we, pe, (tm, tn), persistent, occupancy_known, shape)
            if best is None or cand.efficiency > best.efficiency:  # the orientation is unknown: assume the better
                best = cand
        return best
    # No tile in the name: a grid smaller than the GPU may be a persistent kernel looping over its tiles (its M×N
    # needs more tiles than it has blocks, even at the largest tile) — or its size is not known: nothing is said.
    if mnk is not None and mnk[0] * mnk[1] * mnk[2] > blocks * MAX_TILE_AREA:
        return None
    if mnk is None and blocks < sm_count:
        return None
    if blocks >= slots and blocks % slots == 0:
        return Waves(
            blocks, slots, blocks / slots, 1.0, 1.0, None if shape == "blocks" else 1.0, None, False, occupancy_known, shape
        )
    if not m and blocks == sm_count:  # a persistent grid without a known tile: nothing can be said
        return None
    w = blocks / slots
    return Waves(
        blocks,
        slots,
        w,
        w / math.ceil(w),
        w / math.ceil(w),
        None if shape == "blocks" else 1.0,
        None,
        False,
        occupancy_known,
        shape,
    )


def waves_of(g: dict[str, Any], sm_count: int, cc: str | None, amd: bool = False) -> Waves | None:
    """The waves of one kernel shape; None when nothing can be said (a persistent grid without a known tile).
    `g["blocks"]`: its blocks, the grid in its unit (context.grid_blocks_sql)."""
    threads = (g["block_x"] or 1) * (g["block_y"] or 1) * (g["block_z"] or 1)
    blocks = int(g["blocks"])
    limits = AMD_LIMITS.get(cc or "", AMD_DEFAULT) if amd else SM_LIMITS.get(cc or "", SM_LIMITS["9.0"])
    m = TILE_RE.search(g["name"] or "")
    if g["op_name"] and CONV_OP_RE.search(g["op_name"]):
        mnk = conv_mnb(g["op_name"], g["input_dims"], g.get("concrete_inputs"))
        shape = "conv" if mnk else "blocks"
    else:
        mnk, shape = gemm_mnb(g["op_name"], g["input_dims"]), "gemm"
    if shape == "blocks":
        m = None  # the GEMM's M×N is not known: the blocks alone
    known = bool(g["regs"] or g["smem"])
    if known:
        return _one(blocks, sm_count * blocks_per_sm(limits, threads, g["regs"], g["smem"]), m, mnk, sm_count, True, shape)
    # no registers / shared memory in the trace: every occupancy from 1 block per SM to the threads' limit is
    # possible; keep the best efficiency among them (only what holds whatever the occupancy is flagged)
    cands = [
        _one(blocks, sm_count * n, m, mnk, sm_count, False, shape)
        for n in range(1, blocks_per_sm(limits, threads, None, None) + 1)
    ]
    found = [c for c in cands if c is not None]
    if len(found) < len(cands):
        return None
    return max(found, key=lambda c: c.efficiency) if found else None


def _tuner(shape: str, hip: bool, pytorch: bool) -> tuple[str, str]:
    """Who picks this kernel, and what it should pick instead: a convolution's algorithm is cuDNN's / MIOpen's
    (PyTorch's benchmark mode tries them all for each shape), any other GEMM's is the BLAS library's (split-K /
    stream-K kernels for awkward shapes) or torch.compile's autotuner's."""
    if shape in ("conv", "blocks"):
        lib = "MIOpen" if hip else "cuDNN"
        return (f"{lib}'s benchmark mode (torch.backends.cudnn.benchmark = True)" if pytorch else lib), "another algorithm"
    blas = "hipBLASLt" if hip else "cuBLASLt"
    return (f"{blas} / torch.compile(mode='max-autotune')" if pytorch else blas), "a split-K / stream-K kernel"


def _unit_text(unit: str, amd: bool) -> str:
    """A grid's unit as the evidence names it: work-items or blocks, and of which API."""
    return "work-items (HIP)" if unit == "work-items" else "blocks (HIP)" if amd else "blocks (CUDA)"


@rule(
    title="GEMM tiles do not fill the SMs in whole waves (small GEMMs, tile quantisation)",
    category="compute_inefficiency",
    thresholds={"max_efficiency": 0.85, "max_findings": 5},
    explanation=EXPLANATION,
)
def gemm_wave_quantization(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    groups = ctx.rows(f"""
        SELECT *, {grid_blocks_sql("grid_unit", "")} AS blocks FROM (
        SELECT key, min(name) AS name, min(op_name) AS op_name, min(input_dims) AS input_dims,
               min(concrete_inputs) AS concrete_inputs,
               min(grid_x) AS grid_x, min(grid_y) AS grid_y, min(grid_z) AS grid_z,
               min(block_x) AS block_x, min(block_y) AS block_y, min(block_z) AS block_z,
               min(regs) AS regs, min(smem) AS smem, min(rank) AS rank, min(device) AS device,
               count(*) AS count, sum(end_ns - start_ns) AS time_ns, exact_sum(flops, {AMOUNT_FIXED_SCALE!r}) AS flops,
               {grid_unit_sql(ctx.hip, "min(launch_name)")} AS grid_unit
        FROM ({GROUPS_SQL}) GROUP BY key) ORDER BY time_ns DESC, key""")
    amd = ctx.hip
    flagged = []
    conv_blocks_only = 0
    for g in groups:
        gpu = ctx.gpus.get((g["rank"], g["device"])) or ctx.gpu(g["rank"])
        # (no blocks: a HIP grid in an unknown unit, or a grid the trace does not give — no waves)
        if gpu is None or not gpu.sm_count or g["blocks"] is None:
            continue
        w = waves_of(g, gpu.sm_count, gpu.compute_capability, amd=amd)
        if w is not None and w.shape == "blocks":
            conv_blocks_only += 1
        if w is None or w.efficiency >= t.max_efficiency:
            continue
        flagged.append((g, w, gpu))
    if not flagged:
        return
    weights = ", ".join(f"('{g['key']}', {1 - w.efficiency!r})" for g, w, _ in flagged)
    lost = ctx.lost_ns(
        f"""
        SELECT NULL AS key, k.rank, k.device, k.start_ns, k.end_ns, v.weight
        FROM ({GROUPS_SQL}) k JOIN (VALUES {weights}) v(key, weight) ON v.key = k.key""",
        ["compute_inefficiency"],
        weighted=True,
    )
    lost_ns = sum(lost.values())
    flagged.sort(key=lambda x: -x[0]["time_ns"] * (1 - x[1].efficiency))
    g, w, gpu = flagged[0]
    small = w.waves < 1
    what = f"{short_kernel(g['name'], 48)} ({g['op_name']} {g['input_dims']})"
    unit = "tiles" if w.persistent or w.tile else "blocks"
    graph = "a graph" if not ctx.program.pytorch else f"a {ctx.program.api} graph"
    tuner, instead = _tuner(w.shape, hip=ctx.program.runtime == "hip", pytorch=ctx.program.pytorch)
    sm = "CU" if ctx.program.runtime == "hip" else "SM"  # (AMD's compute units)
    occ = "" if w.occupancy_known else f" (blocks per {sm} not in the trace: the best case taken)"
    if small:
        title = f"small GEMM: {what} makes {w.units} {unit} for {w.slots} {sm} slots ({pct(1 - w.waves)} of the GPU idle)"
        fix = f"batch / enlarge small GEMMs: {pct(1 - w.waves)} of {sm}s idle"
        how = (
            "Batch such GEMMs into one (bmm, grouped GEMM, fused QKV projections), make them larger, or capture "
            f"them in {graph} so their launch cost disappears."
        )
    elif w.padding_efficiency is not None and w.padding_efficiency < w.wave_efficiency:
        # the tiles overhanging the matrix edge lose more than the last wave: name that, not the waves
        tile = f" ({w.tile[0]}×{w.tile[1]})" if w.tile else ""
        title = (
            f"GEMM tile padding: {what} uses {pct(w.padding_efficiency)} of its padded tile area{tile} "
            f"({w.waves:.2f} waves, {pct(w.wave_efficiency)} wave efficiency; {pct(w.efficiency)} efficient)"
        )
        fix = f"GEMM shape: {pct(1 - w.padding_efficiency)} of its tile area is padding; pad dims to the tile"
        how = (
            f"The tiles overhang the matrix edge (a dimension not a multiple of the tile{tile}, or smaller than "
            f"it): shapes that are multiples of the tile, a kernel with a smaller tile for this shape ({tuner}), "
            "or a layout that folds a small dimension into a large one (batch it into M)."
        )
    else:
        title = (
            f"GEMM wave quantization: {what} makes {w.units} {unit} on {w.slots} {sm} slots = "
            f"{w.waves:.2f} waves ({pct(w.efficiency)} efficient)"
        )
        full = math.floor(w.waves) * w.slots
        fix = f"GEMM shape: {w.waves:.2f} waves on {gpu.sm_count} {sm}s, pad/trim to whole waves"
        how = (
            f"The last wave runs {w.units - full} of {w.slots} slots. Make the work fill whole waves: shapes that "
            f"are multiples of the tile{f' ({w.tile[0]}×{w.tile[1]})' if w.tile else ''} and give "
            f"{full} or {math.ceil(w.waves) * w.slots} {unit}, or let {tuner} choose {instead}."
        )
    pad = w.padding_efficiency
    conv = (
        " (a convolution, as its implicit GEMM)"
        if w.shape == "conv"
        else (
            " (a convolution: its output size is not in the trace, so only its blocks are counted)" if w.shape == "blocks" else ""
        )
    )
    rec = (
        f"{what}{conv} ran {g['count']}× for {fmt_ns(g['time_ns'])}: {w.units} {unit} on {gpu.sm_count} {sm}s × "
        f"{w.slots // (gpu.sm_count or 1)} block(s) per {sm}{occ} = {w.waves:.2f} waves, "
        f"{pct(w.wave_efficiency)} wave efficiency"
        + (f", {pct(pad)} of the padded tile area used" if pad is not None and pad < 0.999 else "")
        + f". About {pct(1 - w.efficiency)} of its time is wasted. "
        + how
        + (f" {len(flagged) - 1} more GEMM shape(s) in the evidence." if len(flagged) > 1 else "")
    )
    yield Finding(
        title=title,
        recommendation=rec,
        fix=fix,
        lost_fraction=ctx.fraction(lost_ns),
        key="gemm-waves",
        evidence={
            "gemms": [
                {
                    "kernel": x["name"],
                    "op": x["op_name"],
                    "input_dims": x["input_dims"],
                    "count": x["count"],
                    "time_ns": x["time_ns"],
                    "units": y.units,
                    "unit": "tiles" if y.persistent or y.tile else "blocks",
                    "slots": y.slots,
                    "sm_count": z.sm_count,
                    "waves": y.waves,
                    "efficiency": y.efficiency,
                    "wave_efficiency": y.wave_efficiency,
                    "padding_efficiency": y.padding_efficiency,
                    "tile": list(y.tile) if y.tile else None,
                    "persistent": y.persistent,
                    "occupancy_known": y.occupancy_known,
                    "shape": y.shape,
                    # (one trace can mix hipBLASLt's work-item grids with CK's and Triton's block grids)
                    "grid_unit": _unit_text(x["grid_unit"], amd),
                }
                for x, y, z in flagged[: int(t.max_findings)]
            ],
            "convolutions_by_blocks_only": conv_blocks_only,
        },
    )
