"""PR402 gemm-wave-quantization: GEMMs whose tiles do not fill the GPU's SMs in whole waves — a nearly empty
last wave, padded tiles, or a GEMM smaller than one wave (small-GEMM waste). waves = blocks / (SMs · blocks
per SM); tiles come from the kernel name and the op's shapes when the kernel is persistent."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .base import Finding, Thresholds, rule
from .context import RuleContext
from .sqlutil import MATMUL_NAME_RE, fmt_ns, pct, short_kernel

# Per-SM limits by compute capability major.minor: (shared memory bytes per SM, max threads, max blocks).
SM_LIMITS = {"9.0": (233472, 2048, 32), "8.0": (167936, 2048, 32), "8.6": (102400, 1536, 16),
             "8.9": (102400, 1536, 24), "7.0": (98304, 2048, 32), "7.5": (65536, 1024, 16),
             "10.0": (233472, 2048, 32)}
REGS_PER_SM = 65536
TILE_RE = re.compile(r"(?<![0-9])(16|32|64|96|128|160|192|224|256|320|384|512)x(16|32|64|96|128|160|192|224|256|320|384|512)"
                     r"(?![0-9])")

GROUPS_SQL = f"""
SELECT md5(concat_ws('|', k.name, o.name, o.input_dims, k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y,
                     k.block_z, k.regs, k.smem, k.rank, k.device)) AS key,
       k.name, o.name AS op_name, o.input_dims, k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y, k.block_z,
       k.regs, k.smem, k.rank, k.device, k.kernel_id, k.start_ns, k.end_ns, k.flops
FROM rule_kernels k JOIN rule_ops o ON o.op_id = k.flops_op_id
WHERE k.kind = 'compute' AND coalesce(k.flops, 0) > 0 AND k.end_ns > k.start_ns AND k.grid_x IS NOT NULL
  AND regexp_matches(k.name, '{MATMUL_NAME_RE}')"""


def gemm_mnb(op: str | None, dims_json: str | None) -> tuple[int, int, int] | None:
    """(M, N, batch) of a matmul-like op from its input dims."""
    try:
        d = json.loads(dims_json or "null")
    except ValueError:
        return None
    if not isinstance(d, list):
        return None
    shapes = [x for x in d if isinstance(x, list) and x and all(isinstance(v, int) for v in x)]
    if op in ("aten::addmm", "aten::baddbmm") and len(shapes) >= 3:
        shapes = shapes[1:]
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if op == "aten::linear":
        return (math.prod(a[:-1]), b[0], 1) if len(b) == 2 else None
    if len(a) >= 2 and len(b) >= 2:
        batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
        return a[-2], b[-1], batch
    return None


def blocks_per_sm(cc: str | None, threads: int, regs: int | None, smem: int | None) -> int:
    smem_sm, max_threads, max_blocks = SM_LIMITS.get(cc or "", SM_LIMITS["9.0"])
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
    padding_efficiency: float
    tile: tuple[int, int] | None
    persistent: bool


def waves_of(g: dict[str, Any], sm_count: int, cc: str | None) -> Waves | None:
    blocks = (g["grid_x"] or 1) * (g["grid_y"] or 1) * (g["grid_z"] or 1)
    threads = (g["block_x"] or 1) * (g["block_y"] or 1) * (g["block_z"] or 1)
    slots = sm_count * blocks_per_sm(cc, threads, g["regs"], g["smem"])
    m = TILE_RE.search(g["name"] or "")
    mnb = gemm_mnb(g["op_name"], g["input_dims"])
    best: Waves | None = None
    if m and mnb:
        M, N, batch = mnb
        for tm, tn in ((int(m.group(1)), int(m.group(2))), (int(m.group(2)), int(m.group(1)))):
            tiles = math.ceil(M / tm) * math.ceil(N / tn) * batch
            persistent = blocks <= slots < tiles
            units = tiles if persistent else max(blocks, 1)
            w = units / slots
            we = w / math.ceil(w)
            pe = (M * N) / (math.ceil(M / tm) * tm * math.ceil(N / tn) * tn)
            cand = Waves(units, slots, w, we * pe, we, pe, (tm, tn), persistent)
            if best is None or cand.efficiency > best.efficiency:  # the orientation is unknown: assume the better
                best = cand
        return best
    if blocks >= slots and blocks % slots == 0:
        return Waves(blocks, slots, blocks / slots, 1.0, 1.0, 1.0, None, False)
    if not m and blocks == sm_count:  # a persistent grid without a known tile: nothing can be said
        return None
    w = blocks / slots
    return Waves(blocks, slots, w, w / math.ceil(w), w / math.ceil(w), 1.0, None, False)


@rule("PR402", name="gemm-wave-quantization", layer="kernel",
      title="GEMM tiles do not fill the SMs in whole waves (small GEMMs, tile quantisation)",
      category="compute_inefficiency", thresholds={"max_efficiency": 0.85, "max_findings": 5})
def gemm_wave_quantization(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    """
    ## What it detects
    For every matmul kernel shape (kernel, op input shapes, grid, block, registers, shared memory): how many
    waves its work makes on this GPU — waves = work units / (SMs × blocks per SM), with blocks per SM from
    the launch's registers, threads and shared memory; the work units are the kernel's blocks, or, for a
    persistent kernel (one block per SM looping over tiles), its tiles ⌈M/tm⌉·⌈N/tn⌉ from the tile size in the
    kernel name and the op's shapes. Efficiency = (waves / ⌈waves⌉) × (M·N over the padded tile area). Flags
    shapes below `max_efficiency`, including GEMMs smaller than one wave (idle SMs).

    ## Why it costs peak
    An SM that gets no tile in the last wave idles while the others finish: 133 tiles on 132 SMs take two full
    waves of time for 1.01 waves of work (50% efficient). Tiles that overhang the matrix edge compute zeros.
    Small GEMMs leave most SMs idle and pay launch and ramp-up costs for little math.

    ## How to fix
    Choose shapes that are multiples of the tile size and fill whole waves (hidden sizes, batch × sequence as
    multiples of 128/256; vocabulary padded to a multiple of 64 or 128). Batch many small GEMMs into one
    (`bmm`, grouped GEMM, fused QKV) or capture them in a CUDA graph. Let cuBLASLt pick split-K / stream-K
    kernels (newer cuBLAS does this for awkward shapes) or tune with `torch.compile(mode="max-autotune")`.

    ## Example
    `GEMM wave quantization: sm90_xmma_gemm… (aten::mm [[1664, 8192], [8192, 1408]]) makes 143 tiles on 132
    SMs = 1.08 waves (54% efficient)`.
    """
    groups = ctx.rows(f"""
        SELECT key, min(name) AS name, min(op_name) AS op_name, min(input_dims) AS input_dims,
               min(grid_x) AS grid_x, min(grid_y) AS grid_y, min(grid_z) AS grid_z,
               min(block_x) AS block_x, min(block_y) AS block_y, min(block_z) AS block_z,
               min(regs) AS regs, min(smem) AS smem, min(rank) AS rank, min(device) AS device,
               count(*) AS count, sum(end_ns - start_ns) AS time_ns, sum(flops) AS flops
        FROM ({GROUPS_SQL}) GROUP BY key ORDER BY time_ns DESC""")
    flagged = []
    for g in groups:
        gpu = ctx.gpus.get((g["rank"], g["device"])) or ctx.gpu(g["rank"])
        if gpu is None or not gpu.sm_count:
            continue
        w = waves_of(g, gpu.sm_count, gpu.compute_capability)
        if w is None or w.efficiency >= t.max_efficiency:
            continue
        flagged.append((g, w, gpu))
    if not flagged:
        return
    weights = ", ".join(f"('{g['key']}', {1 - w.efficiency!r})" for g, w, _ in flagged)
    lost = ctx.lost_ns(f"""
        SELECT NULL AS key, k.rank, k.device, k.start_ns, k.end_ns, v.weight
        FROM ({GROUPS_SQL}) k JOIN (VALUES {weights}) v(key, weight) ON v.key = k.key""",
                       ["compute_inefficiency"], weighted=True)
    lost_ns = sum(lost.values())
    flagged.sort(key=lambda x: -x[0]["time_ns"] * (1 - x[1].efficiency))
    g, w, gpu = flagged[0]
    small = w.waves < 1
    what = f"{short_kernel(g['name'], 48)} ({g['op_name']} {g['input_dims']})"
    unit = "tiles" if w.persistent or w.tile else "blocks"
    if small:
        title = (f"small GEMM: {what} makes {w.units} {unit} for {w.slots} SM slots "
                 f"({pct(1 - w.waves)} of the GPU idle)")
        fix = f"batch / enlarge small GEMMs: {pct(1 - w.waves)} of SMs idle"
        how = ("Batch such GEMMs into one (bmm, grouped GEMM, fused QKV projections), make them larger, or capture "
               "them in a CUDA graph so their launch cost disappears.")
    else:
        title = (f"GEMM wave quantization: {what} makes {w.units} {unit} on {w.slots} SM slots = "
                 f"{w.waves:.2f} waves ({pct(w.efficiency)} efficient)")
        full = math.floor(w.waves) * w.slots
        fix = f"GEMM shape: {w.waves:.2f} waves on {gpu.sm_count} SMs, pad/trim to whole waves"
        how = (f"The last wave runs {w.units - full} of {w.slots} slots. Make the work fill whole waves: shapes that "
               f"are multiples of the tile{f' ({w.tile[0]}×{w.tile[1]})' if w.tile else ''} and give "
               f"{full} or {math.ceil(w.waves) * w.slots} {unit}, or let cuBLASLt / torch.compile(mode='max-autotune') "
               "choose a split-K / stream-K kernel.")
    rec = (f"{what} ran {g['count']}× for {fmt_ns(g['time_ns'])}: {w.units} {unit} on {gpu.sm_count} SMs × "
           f"{w.slots // (gpu.sm_count or 1)} block(s) per SM = {w.waves:.2f} waves, {pct(w.wave_efficiency)} wave efficiency"
           + (f", {pct(w.padding_efficiency)} of the padded tile area used" if w.padding_efficiency < 0.999 else "")
           + f". About {pct(1 - w.efficiency)} of its time is wasted. " + how
           + (f" {len(flagged) - 1} more GEMM shape(s) in the evidence." if len(flagged) > 1 else ""))
    yield Finding(title=title, recommendation=rec, fix=fix, lost_fraction=ctx.fraction(lost_ns), key="gemm-waves",
                  evidence={"gemms": [{"kernel": x["name"], "op": x["op_name"], "input_dims": x["input_dims"],
                                       "count": x["count"], "time_ns": x["time_ns"], "units": y.units,
                                       "unit": "tiles" if y.persistent or y.tile else "blocks", "slots": y.slots,
                                       "sm_count": z.sm_count, "waves": y.waves, "efficiency": y.efficiency,
                                       "wave_efficiency": y.wave_efficiency,
                                       "padding_efficiency": y.padding_efficiency,
                                       "tile": list(y.tile) if y.tile else None, "persistent": y.persistent}
                                      for x, y, z in flagged[: int(t.max_findings)]]})
