"""PR302 unfused-elementwise-chain: runs of elementwise kernels launched by consecutive ops on the same tensor
shape, each a full HBM round trip that fusion would remove."""

from __future__ import annotations

from collections.abc import Iterator

from ...vocab import ELEMENTWISE_KERNEL_RE, NOT_ELEMENTWISE_RE
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_ns, pct, repeat_unit

EXPLANATION = Explanation(
    what_it_does="""
        Runs of elementwise kernels (TensorIterator `elementwise_kernel`s, Triton pointwise, copies) that follow
        each other on one stream, each launched by a *different* op on a tensor of the same shape (the op's first
        input dims) and at most `max_gap_us` apart — e.g. `x.mul_(a).add_(b)` as two kernels. The chain is named by
        its op sequence, with repeats folded (`aten::mul_ → aten::add_` ×40); it needs `min_chain` kernels and a
        mean kernel time of at least `min_median_kernel_us`.""",
    why_is_this_bad="""
        Each kernel of the chain reads its input from HBM and writes its output back, so a chain of n ops moves
        the tensor ~n times where one fused kernel would move it once. Elementwise kernels are memory-bound: their
        time is their bytes, so fusing n of them saves up to (1 − 1/n) of the chain's time.""",
    example="""
        `unfused elementwise chain aten::mul_ → aten::add_ ×40: 80 kernels, 40.6 ms` — fusing each pair halves
        the traffic (≈20 ms back); one fused kernel for the run would read the tensor once.""",
    how_to_fix="""
        `torch.compile` (Inductor) fuses such chains into one Triton kernel. By hand: fused ops (`torch.addcmul`,
        `torch.lerp`, fused optimizers / norms / activations, `F.gelu(x + b)` in a fused epilogue), or a custom
        kernel. Also keep the tensor in bf16: half the bytes per pass. (Chains whose kernels average less than
        `min_median_kernel_us` are launch-bound — PR501 — not memory-bound.)""",
)


# Every elementwise kernel with its chain number on its stream. The patterns are tested once per kernel name (a
# trace has tens of names for tens of thousands of kernels), and only elementwise kernels look up their op (the
# others only break chains: their op's name and shape are never read).
EW_SQL = f"""
WITH n AS (
    SELECT name, regexp_matches(name, '{ELEMENTWISE_KERNEL_RE}') AND NOT regexp_matches(name, '{NOT_ELEMENTWISE_RE}') AS ew
    FROM (SELECT DISTINCT name FROM rule_kernels)
), k AS (
    SELECT k.rank, k.device, k.stream, k.start_ns, k.end_ns, k.op_id, k.kind = 'compute' AND n.ew AS ew
    FROM rule_kernels k LEFT JOIN n ON n.name = k.name
), s AS (
    SELECT *, lag(ew) OVER w AS prev_ew, lag(op_id) OVER w AS prev_op, lag(end_ns) OVER w AS prev_end
    FROM k WINDOW w AS (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns)
), d AS (
    -- the first input's shape of each op an elementwise kernel came from, joined to the kernels between the two
    -- windows and not carried through them (every kernel of a stream is one window partition: its strings held
    -- with it ran the 4 GiB Kineto trace's 1.09 M-kernel stream out of DuckDB's 256 MiB)
    SELECT op_id, CAST(json_extract(input_dims, '$[0]') AS VARCHAR) AS dims0 FROM rule_ops
    WHERE op_id IN (SELECT op_id FROM k WHERE ew)
), j AS (
    -- a kernel continues the chain when it and the previous kernel on its stream are elementwise, came from
    -- different ops, on the same shape, close in time
    SELECT s.rank, s.device, s.stream, s.start_ns, s.end_ns, s.op_id, s.ew,
           s.ew AND coalesce(s.prev_ew, false) AND s.op_id IS NOT NULL AND s.op_id IS DISTINCT FROM s.prev_op
               AND d.dims0 IS NOT DISTINCT FROM pd.dims0 AND s.start_ns - s.prev_end <= $max_gap AS goes_on
    FROM s LEFT JOIN d ON s.ew AND d.op_id = s.op_id
    LEFT JOIN d pd ON s.prev_ew AND pd.op_id = s.prev_op
), c AS (
    SELECT *, sum(CASE WHEN goes_on THEN 0 ELSE 1 END)
              OVER (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS chain
    FROM j
)
SELECT c.rank, c.device, c.stream, c.chain, c.start_ns, c.end_ns, o.name AS op_name, d.dims0
FROM c LEFT JOIN (SELECT op_id, name FROM rule_ops) o ON o.op_id = c.op_id LEFT JOIN d ON d.op_id = c.op_id
WHERE c.ew"""
# The chains (with enough kernels, long enough on average) of the elementwise kernels above (`_rule_chain_ew`).
CHAINS_SQL = """
SELECT rank, device, stream, chain, count(*) AS n, string_agg(op_name, ' → ' ORDER BY start_ns) AS ops,
       sum(end_ns - start_ns) AS busy_ns, min(dims0) AS dims0
FROM _rule_chain_ew GROUP BY rank, device, stream, chain
HAVING count(*) >= $min_chain AND sum(end_ns - start_ns) / count(*) >= $min_kernel"""


@rule(
    title="Chains of elementwise kernels from consecutive ops are not fused",
    category="memory_bound",
    thresholds={"min_chain": 2, "max_gap_us": 1000.0, "max_findings": 3, "min_median_kernel_us": 5.0},
    explanation=EXPLANATION,
)
def unfused_elementwise_chain(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    params = {"max_gap": t.max_gap_us * 1e3, "min_chain": int(t.min_chain), "min_kernel": t.min_median_kernel_us * 1e3}
    con = ctx.con
    # The elementwise kernels and their chains once into temp tables (keyed by a hash of the op sequence), then
    # named and charged.
    con.execute(f"CREATE OR REPLACE TABLE _rule_chain_ew AS {EW_SQL}", {"max_gap": params["max_gap"]})
    # (each chain's key hashed once, not once per kernel)
    con.execute(
        f"CREATE OR REPLACE TABLE _rule_chains AS SELECT *, md5(ops) AS key FROM ({CHAINS_SQL})",
        {k: params[k] for k in ("min_chain", "min_kernel")},
    )
    chains = ctx.rows(
        """
        SELECT key, min(ops) AS ops, count(*) AS occurrences, sum(n) AS kernels,
               sum(busy_ns) AS busy_ns, max(n) AS longest, min(dims0) AS dims0, list(DISTINCT rank ORDER BY rank) AS ranks
        FROM _rule_chains GROUP BY key ORDER BY busy_ns DESC, key"""
    )
    lost = ctx.lost_ns(
        """SELECT ch.key, c.rank, c.device, c.start_ns, c.end_ns
           FROM _rule_chain_ew c JOIN _rule_chains ch USING (rank, device, stream, chain)""",
        ["memory_bound"],
    )
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
            how = (
                f"fusing each {' → '.join(unit)} into one kernel cuts its HBM traffic by {pct(unit_save)} "
                f"(≈{fmt_ns(c['busy_ns'] * unit_save)} back)"
            )
            if reps > 1:
                how += f"; one fused kernel for the whole run of {per_chain:.0f} would move the tensor once"
        else:
            # One op repeated: on the same tensor one kernel would read it once; on different tensors of one shape
            # (a per-parameter loop) a multi-tensor kernel saves the launches, not the bytes.
            what = unit[0] if unit else "elementwise"  # ops not recorded: the kernels' chain alone
            how = (
                f"the run of {per_chain:.0f} {what} kernels could be one: up to {pct(run_save)} less traffic "
                f"(≈{fmt_ns(c['busy_ns'] * run_save)}) if they update the same tensor; if each touches its own "
                "tensor (a loop over parameters), a multi-tensor (foreach) kernel removes the launches but not the "
                "bytes"
            )
        shape = f" on a tensor of shape {c['dims0']}" if c["dims0"] else ""
        tool = (
            "torch.compile fuses such chains; by hand use fused ops (torch.addcmul / lerp, torch._foreach_*, "
            "fused norms and activations) or a custom kernel."
            if ctx.program.pytorch
            else "A fused kernel for the chain (or the producing GEMM's epilogue) moves the tensor once."
        )
        rec = (
            f"{c['occurrences']} chain{'s' if c['occurrences'] > 1 else ''} of elementwise kernels from "
            f"consecutive ops ({name}){shape}: {c['kernels']} kernels, {fmt_ns(c['busy_ns'])}, each a full HBM "
            f"round trip. {how[0].upper() + how[1:]}. {tool}"
        )
        how_fix = "torch.compile" if ctx.program.pytorch else "one kernel"
        fix = (
            f"fuse {' → '.join(unit)} ({how_fix}): −{pct(unit_save)} bytes"
            if len(unit) > 1
            # (whether the run updates one tensor or many — a loop over parameters — the trace does not say: the
            # launches are saved either way, the bytes only on one tensor)
            else f"{what} ×{per_chain:.0f} in a row: one multi-tensor (foreach) kernel; fewer bytes only if on one tensor"
        )
        yield Finding(
            title=f"unfused elementwise chain {name}: {c['kernels']} kernels, {fmt_ns(c['busy_ns'])}",
            recommendation=rec,
            fix=fix,
            lost_fraction=ctx.fraction(lost_ns),
            key=(c["ops"] or name or "elementwise")[:500],
            evidence={
                "chain": name,
                "ops": unit,
                "repeats": reps,
                "occurrences": c["occurrences"],
                "kernels": c["kernels"],
                "longest_chain": c["longest"],
                "time_ns": c["busy_ns"],
                "shape": c["dims0"],
                "saving_if_unit_fused": unit_save,
                "saving_if_run_fused": run_save,
                "ranks": c["ranks"],
            },
        )
