"""PR301 memory-bound-kernel and PR302 unfused-elementwise-chain: where the waterfall's `memory_bound` time
goes — the hot kernels below the ridge point (with the bandwidth they reach), and runs of elementwise kernels
launched by consecutive ops on the same tensor shape, each a full HBM round trip that fusion would remove."""

from __future__ import annotations

import re
from collections.abc import Iterator

from .base import Finding, Thresholds, rule
from .context import RuleContext
from .sqlutil import (
    ELEMENTWISE_KERNEL_RE,
    NOT_ELEMENTWISE_RE,
    drop,
    fmt_bytes,
    fmt_ns,
    pct,
    repeat_unit,
    short_kernel,
)

OPTIMIZER_RE = r"(?i)(adam|adagrad|\bsgd|lamb\b|lion\b|rmsprop|optimizer|_foreach_)"


def _memory_bound_kernels(ctx: RuleContext) -> str:
    """The kernels of class `memory` (the measure stage's kernel_class: below the ridge point, or known to do ~0
    FLOPs), with their byte estimate (kernels.bytes: the op's byte model, split by duration)."""
    return f"""
        WITH g AS {ctx.gpus_sql()},
        k AS (
            SELECT k.*, k.end_ns - k.start_ns AS dur, g.peak, g.bw
            FROM rule_kernels k LEFT JOIN g ON g.rank IS NOT DISTINCT FROM k.rank AND g.device = k.device
            WHERE k.class = 'memory' AND k.end_ns > k.start_ns
        )
        SELECT k.*, CASE WHEN k.bytes > 0 THEN k.bytes END AS est_bytes, o.name AS op_name
        FROM k LEFT JOIN rule_ops o ON o.op_id = k.op_id"""


@rule("PR301", name="memory-bound-kernel", layer="op", title="Hot kernels run below the ridge point (memory-bound)",
      category="memory_bound",
      thresholds={"max_findings": 3, "roofline_fraction": 0.6, "poor_bandwidth": 0.3, "min_median_kernel_us": 5.0})
def memory_bound_kernel(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    """
    ## What it detects
    The kernels that carry the waterfall's `memory_bound` time: kernels of class `memory` (the measure stage's
    kernel_class) — a FLOP estimate whose arithmetic intensity (FLOPs per DRAM byte) is below the ridge point
    P(precision) / bandwidth of their GPU, or known to do ~0 useful FLOPs (elementwise, normalisation, softmax,
    reductions, copies, optimizer). For each of the hottest (by lost time) it gives its time, the ops that
    launched it, and the DRAM bandwidth it reaches (bytes estimated from the op's input shapes: every input read
    once, one output written) against the HBM peak; an estimate above the HBM peak is flagged (L2 reuse or an
    over-count), not stated as reached. Kernels that may do matmul-class work without an estimate (GEMM,
    attention, custom or compiled kernels) are `unknown`, not memory-bound: see the waterfall's `unknown_flops`.

    ## Why it costs peak
    A memory-bound kernel keeps the GPU 100% *utilized* while its tensor cores idle: its speed is set by HBM,
    not by FLOP/s. Near the bandwidth roofline it cannot go faster — only moving fewer bytes helps. Far below
    it, the kernel wastes even the bandwidth it has.

    ## How to fix
    Near the roofline: move fewer bytes — fuse the kernel with its neighbours (PR302; `torch.compile` fuses
    elementwise chains and normalisations), keep activations in bf16 / fp8, fold the work into the epilogue of
    the GEMM that produces its input, use fused optimizers. Far below the roofline: too little parallelism or
    uncoalesced / strided access — larger tensors, contiguous layouts, vectorised kernels. Kernels shorter
    than `min_median_kernel_us` are left to PR501: their cost is the launch, not the memory.

    ## Example
    `memory-bound kernel vectorized_elementwise_kernel [MulFunctor] (aten::mul_): 50% of the window at
    ≈4.2 TB/s (89% of HBM)` — the kernel streams at the roofline: fuse it, don't tune it.
    """
    con = ctx.con
    try:
        mb = _memory_bound_kernels(ctx)
        lost = ctx.lost_ns(f"SELECT name AS key, rank, device, start_ns, end_ns FROM ({mb})", ["memory_bound"])
        if not lost:
            return
        names = list(lost)
        stats = {r["name"]: r for r in ctx.rows(f"""
            SELECT name, count(*) AS count, sum(dur) AS time_ns, median(dur) AS median_ns,
                   sum(est_bytes) FILTER (WHERE est_bytes IS NOT NULL) AS bytes,
                   sum(dur) FILTER (WHERE est_bytes IS NOT NULL) AS time_with_bytes_ns, max(bw) AS peak_bw,
                   list(DISTINCT rank ORDER BY rank) AS ranks, min(grid_x * coalesce(grid_y, 1) * coalesce(grid_z, 1)) AS blocks
            FROM ({mb}) WHERE name IN (SELECT unnest(?::VARCHAR[])) GROUP BY name
            HAVING median(dur) >= ?""", [names, t.min_median_kernel_us * 1e3])}
        top = sorted(((k, v) for k, v in lost.items() if k in stats), key=lambda kv: -kv[1])[: int(t.max_findings)]
        names = [k for k, _ in top]
        ops: dict[str, list[str]] = {}
        for r in ctx.rows(f"""
                SELECT name, op_name, sum(dur) AS time_ns FROM ({mb})
                WHERE name IN (SELECT unnest(?::VARCHAR[])) AND op_name IS NOT NULL
                GROUP BY name, op_name ORDER BY time_ns DESC""", [names]):
            ops.setdefault(r["name"], []).append(r["op_name"])
    finally:
        drop(con, "_rule_op_bytes")
    for name, lost_ns in top:
        s = stats.get(name)
        if s is None:
            continue
        short = short_kernel(name)
        op_names = ops.get(name, [])[:3]
        bw = s["bytes"] / (s["time_with_bytes_ns"] / 1e9) if s["bytes"] and s["time_with_bytes_ns"] else None
        frac = bw / s["peak_bw"] if bw and s["peak_bw"] else None
        share = ctx.fraction(s["time_ns"])
        by = f" ({', '.join(op_names)})" if op_names else ""
        # A byte estimate implying more than the HBM peak (L2-resident reuse, or a model that over-counts) is
        # flagged as such, like FLOPs above peak: never stated as a bandwidth reached.
        above = bool(frac and frac > 1.0)
        bw_text = (f" (its byte estimate implies {pct(frac)} of HBM: L2 reuse or an over-count)" if above else
                   f" at ≈{bw / 1e12:.2f} TB/s ({pct(frac)} of HBM)" if bw and frac else "")
        title = f"memory-bound kernel {short}{by}: {pct(share)} of the window{bw_text}"
        head = (f"{short}{by} ran {s['count']}× for {fmt_ns(s['time_ns'])} (median {fmt_ns(s['median_ns'])}) with "
                "no tensor-core work" + (f"; its byte estimate (≈{fmt_bytes(s['bytes'])}) would mean "
                                         f"≈{(bw or 0) / 1e12:.2f} TB/s, above the {s['peak_bw'] / 1e12:.1f} TB/s HBM peak: "
                                         "the data is reused from L2, or the byte model over-counts"
                                         if above else
                                         f", streaming ≈{fmt_bytes(s['bytes'])} at ≈{bw / 1e12:.2f} TB/s, "
                                         f"{pct(frac)} of the {s['peak_bw'] / 1e12:.1f} TB/s HBM peak"
                                         if bw and frac else "") + ". ")
        frac_for_advice = None if above else frac
        if any(re.search(OPTIMIZER_RE, x) for x in [short, *op_names]):
            rec = head + ("It is the optimizer step: memory-bound by nature (it streams parameters, gradients and "
                          "optimizer states once per step). Make it rarer or smaller — more tokens per step (larger "
                          "batch, gradient accumulation), 8-bit / low-precision optimizer states, or shard it "
                          "across data-parallel ranks (ZeRO / FSDP).")
            fix = f"optimizer step ({op_names[0] if op_names else short}): fewer steps or smaller states"
        elif frac_for_advice is not None and frac_for_advice >= t.roofline_fraction:
            rec = head + ("It already runs at the bandwidth roofline: it cannot get faster, only move fewer bytes — "
                          "fuse it with the elementwise ops around it (torch.compile), keep the tensor in bf16 "
                          "(half the bytes), or fold it into the producing GEMM's epilogue.")
            fix = f"fuse {op_names[0] if op_names else short.split(' ')[0]}: already at {pct(frac)} of HBM bandwidth"
        elif frac_for_advice is not None and frac_for_advice < t.poor_bandwidth:
            rec = head + (f"That is far below the roofline ({pct(frac)}): too few blocks ({s['blocks']}) or "
                          "strided / uncoalesced access — use larger, contiguous tensors and vectorised kernels, "
                          "or fuse it away.")
            fix = f"{short.split(' ')[0]} reaches only {pct(frac)} of HBM BW"
        else:
            rec = head + ("Fuse it with its neighbours (torch.compile) or raise its arithmetic intensity "
                          "(bigger tiles, bf16 data) to move fewer bytes per FLOP.")
            fix = f"fuse {op_names[0] if op_names else short.split(' ')[0]}; raise arithmetic intensity"
        yield Finding(title=title, recommendation=rec, fix=fix, lost_fraction=ctx.fraction(lost_ns), key=name,
                      rank=s["ranks"][0] if len(s["ranks"] or []) == 1 and len(ctx.rank_window_ns) > 1 else None,
                      evidence={"kernel": name, "kernel_short": short, "ops": op_names, "count": s["count"],
                                "time_ns": s["time_ns"], "median_ns": s["median_ns"], "window_share": share,
                                "bytes_estimate": s["bytes"], "bandwidth_bytes_s": bw, "hbm_fraction": frac,
                                "hbm_peak_bytes_s": s["peak_bw"], "ranks": s["ranks"], "blocks": s["blocks"],
                                "bandwidth_above_hbm_peak": above})


CHAINS_SQL = f"""
WITH k AS (
    SELECT k.rank, k.device, k.stream, k.start_ns, k.end_ns, k.op_id, o.name AS op_name,
           CAST(json_extract(o.input_dims, '$[0]') AS VARCHAR) AS dims0,
           k.kind = 'compute' AND regexp_matches(k.name, '{ELEMENTWISE_KERNEL_RE}')
               AND NOT regexp_matches(k.name, '{NOT_ELEMENTWISE_RE}') AS ew
    FROM rule_kernels k LEFT JOIN rule_ops o ON o.op_id = k.op_id
), s AS (
    SELECT *, lag(ew) OVER w AS prev_ew, lag(op_id) OVER w AS prev_op, lag(dims0) OVER w AS prev_dims,
              lag(end_ns) OVER w AS prev_end
    FROM k WINDOW w AS (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns)
), c AS (
    -- a kernel continues the chain when it and the previous kernel on its stream are elementwise, came from
    -- different ops, on the same shape, close in time
    SELECT *, sum(CASE WHEN ew AND coalesce(prev_ew, false) AND op_id IS NOT NULL AND op_id IS DISTINCT FROM prev_op
                            AND dims0 IS NOT DISTINCT FROM prev_dims AND start_ns - prev_end <= $max_gap
                       THEN 0 ELSE 1 END)
              OVER (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS chain
    FROM s
), chains AS (
    SELECT rank, device, stream, chain, count(*) AS n, string_agg(op_name, ' → ' ORDER BY start_ns) AS ops,
           sum(end_ns - start_ns) AS busy_ns, min(dims0) AS dims0
    FROM c WHERE ew GROUP BY rank, device, stream, chain
    HAVING count(*) >= $min_chain AND sum(end_ns - start_ns) / count(*) >= $min_kernel
)"""


@rule("PR302", name="unfused-elementwise-chain", layer="op",
      title="Chains of elementwise kernels from consecutive ops are not fused", category="memory_bound",
      thresholds={"min_chain": 2, "max_gap_us": 1000.0, "max_findings": 3, "min_median_kernel_us": 5.0})
def unfused_elementwise_chain(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    """
    ## What it detects
    Runs of elementwise kernels (TensorIterator `elementwise_kernel`s, Triton pointwise, copies) that follow
    each other on one stream, each launched by a *different* op on a tensor of the same shape — e.g.
    `x.mul_(a).add_(b)` as two kernels. The chain is named by its op sequence, with repeats folded
    (`aten::mul_ → aten::add_` ×40).

    ## Why it costs peak
    Each kernel of the chain reads its input from HBM and writes its output back, so a chain of n ops moves
    the tensor ~n times where one fused kernel would move it once. Elementwise kernels are memory-bound: their
    time is their bytes, so fusing n of them saves up to (1 − 1/n) of the chain's time.

    ## How to fix
    `torch.compile` (Inductor) fuses such chains into one Triton kernel. By hand: fused ops (`torch.addcmul`,
    `torch.lerp`, fused optimizers / norms / activations, `F.gelu(x + b)` in a fused epilogue), or a custom
    kernel. Also keep the tensor in bf16: half the bytes per pass. (Chains whose kernels average less than
    `min_median_kernel_us` are launch-bound — PR501 — not memory-bound.)

    ## Example
    `unfused elementwise chain aten::mul_ → aten::add_ ×40: 80 kernels, 40.6 ms` — fusing each pair halves
    the traffic (≈20 ms back); one fused kernel for the run would read the tensor once.
    """
    params = {"max_gap": t.max_gap_us * 1e3, "min_chain": int(t.min_chain), "min_kernel": t.min_median_kernel_us * 1e3}
    con = ctx.con
    # Chains once into temp tables (keyed by a hash of the op sequence), then named and charged.
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _rule_chain_kernels AS {CHAINS_SQL}
                    SELECT c.rank, c.device, c.stream, c.chain, c.start_ns, c.end_ns, md5(ch.ops) AS key
                    FROM c JOIN chains ch USING (rank, device, stream, chain) WHERE c.ew""", params)
    try:
        chains = ctx.rows(f"""{CHAINS_SQL}
            SELECT md5(ops) AS key, min(ops) AS ops, count(*) AS occurrences, sum(n) AS kernels,
                   sum(busy_ns) AS busy_ns, max(n) AS longest, min(dims0) AS dims0, list(DISTINCT rank ORDER BY rank) AS ranks
            FROM chains GROUP BY md5(ops) ORDER BY busy_ns DESC""", params)
        lost = ctx.lost_ns("SELECT key, rank, device, start_ns, end_ns FROM _rule_chain_kernels", ["memory_bound"])
    finally:
        drop(con, "_rule_chain_kernels")
    chains.sort(key=lambda c: -lost.get(c["key"], 0.0))
    for c in chains[: int(t.max_findings)]:
        lost_ns = lost.get(c["key"], 0.0)
        seq = c["ops"].split(" → ") if c["ops"] else []
        unit, reps = repeat_unit(seq)
        name = " → ".join(unit) + (f" ×{reps}" if reps > 1 else "")
        per_chain = c["kernels"] / c["occurrences"]
        unit_save = 1 - 1 / len(unit) if len(unit) > 1 else 0.0
        run_save = 1 - 1 / per_chain
        if len(unit) > 1:
            how = (f"fusing each {' → '.join(unit)} into one kernel cuts its HBM traffic by {pct(unit_save)} "
                   f"(≈{fmt_ns(c['busy_ns'] * unit_save)} back)")
            if reps > 1:
                how += f"; one fused kernel for the whole run of {per_chain:.0f} would move the tensor once"
        else:
            what = unit[0] if unit else "elementwise"  # ops not recorded: the kernels' chain alone
            how = (f"the run of {per_chain:.0f} {what} kernels could be one: up to {pct(run_save)} less traffic "
                   f"(≈{fmt_ns(c['busy_ns'] * run_save)})")
        shape = f" on a tensor of shape {c['dims0']}" if c["dims0"] else ""
        rec = (f"{c['occurrences']} chain{'s' if c['occurrences'] > 1 else ''} of elementwise kernels from "
               f"consecutive ops ({name}){shape}: {c['kernels']} kernels, {fmt_ns(c['busy_ns'])}, each a full HBM "
               f"round trip. {how[0].upper() + how[1:]}. torch.compile fuses such chains; by hand use fused ops "
               "(torch.addcmul / lerp, fused norms and activations) or a custom kernel.")
        yield Finding(
            title=f"unfused elementwise chain {name}: {c['kernels']} kernels, {fmt_ns(c['busy_ns'])}",
            recommendation=rec,
            fix=f"fuse {' → '.join(unit)} (torch.compile): −{pct(unit_save if len(unit) > 1 else run_save)} bytes",
            lost_fraction=ctx.fraction(lost_ns), key=(c["ops"] or name or "elementwise")[:500],
            evidence={"chain": name, "ops": unit, "repeats": reps, "occurrences": c["occurrences"],
                      "kernels": c["kernels"], "longest_chain": c["longest"], "time_ns": c["busy_ns"],
                      "shape": c["dims0"], "saving_if_unit_fused": unit_save, "saving_if_run_fused": run_save,
                      "ranks": c["ranks"]})
