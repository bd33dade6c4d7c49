"""PR201 pipeline-bubble: pipeline stages from P2P send/recv, micro-batches counted, the measured bubble
against the GPipe / 1F1B figure (p−1)/(m+p−1), and the micro-batch count that would halve it."""

from __future__ import annotations

from collections.abc import Iterator

from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import pct

EXPLANATION = Explanation(
    what_it_does="""
        Pipeline parallelism: ranks that exchange activations and gradients with P2P send/recv are *stages* (the
        measurement library's collective kind `p2p`: send/recv launched inside an all-to-all op or range is an
        all-to-all, not a pipeline; one rank alone is no schedule). The rule orders them (the first stage sends
        before it receives; the others by when their first receive completes), counts micro-batches (the first
        stage's sends per step), measures each stage's bubble — the share of the pipeline's GPU time (first to last
        kernel on any stage) in which its GPU runs no compute, split into time in send/recv and time with no kernel
        — and compares it with the GPipe / 1F1B figure (p−1)/(m+p−1) for p stages and m micro-batches, and with the
        figure for the stages' measured imbalance. The measured figure also holds what the formula leaves out: P2P
        transfers, unequal stages, the loss and optimizer, launch gaps between steps.""",
    why_is_this_bad="""
        Each stage waits (p−1) micro-batch slots for the pipeline to fill and drain; during those slots its GPU
        only spins in a receive or is idle. The waterfall counts it as `pipeline_bubble`. A bubble well above
        the formula (by more than `excess_points`) means the stages are unbalanced or P2P latency is not hidden.""",
    example="""
        `pipeline bubble 21% with 2 stages × 4 micro-batches (theory 20%)` — raise the micro-batch count 4 → 9 to
        halve it.""",
    how_to_fix="""
        Raise the micro-batch count: m' = 2m + p − 1 halves the bubble (keep the global batch by making each
        micro-batch smaller). Use an interleaved 1F1B schedule (v virtual stages per rank divide the bubble by
        v), or zero-bubble schedules. If the measured bubble exceeds the formula, balance layers across stages
        (the slowest stage sets the pace) and overlap P2P with compute.""",
)

# Point-to-point operations of the measure stage's kind `p2p` (send/recv outside all-to-alls: collective_members).
P2P_SQL = """
SELECT rank, device, start_ns, end_ns, lower(collective) AS coll,
       CASE WHEN regexp_matches(lower(collective), 'recv') AND NOT regexp_matches(lower(collective), 'send') THEN 'recv'
            WHEN regexp_matches(lower(collective), 'send') AND NOT regexp_matches(lower(collective), 'recv') THEN 'send'
       END AS dir
FROM rule_collective_members
WHERE kind = 'p2p'"""

# Per stage rank, over the pipeline's GPU span (first kernel to last kernel on any stage, in the window): the
# time a compute kernel or copy runs, the time only NCCL (send/recv) runs — waiting on or talking to a peer —
# and, by difference, the time with no kernel at all.
STAGES_SQL = """
WITH k AS (
    SELECT k.rank, (k.class = 'communication')::INT AS is_nccl, greatest(k.start_ns, w.start_ns) AS s,
           least(k.end_ns, w.end_ns) AS e
    FROM rule_kernels k JOIN rule_windows w
      ON w.rank IS NOT DISTINCT FROM k.rank AND w.device = k.device AND k.start_ns < w.end_ns AND k.end_ns > w.start_ns
    WHERE k.rank IN (SELECT unnest(?::INTEGER[]))
), span AS (SELECT min(s) AS s0, max(e) AS e0 FROM k WHERE e > s
), ev AS (
    SELECT rank, s AS t, 1 - is_nccl AS dc, is_nccl AS dn FROM k WHERE e > s
    UNION ALL SELECT rank, e, is_nccl - 1, -is_nccl FROM k WHERE e > s
), agg AS (SELECT rank, t, sum(dc) AS dc, sum(dn) AS dn FROM ev GROUP BY rank, t
), run AS (
    SELECT rank, t, lead(t) OVER (PARTITION BY rank ORDER BY t) AS tn, sum(dc) OVER c AS nc, sum(dn) OVER c AS nn
    FROM agg WINDOW c AS (PARTITION BY rank ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT rank, coalesce(sum(tn - t) FILTER (WHERE nc > 0), 0) AS compute_ns,
       coalesce(sum(tn - t) FILTER (WHERE nc = 0 AND nn > 0), 0) AS p2p_ns,
       min(t) FILTER (WHERE nc > 0) AS first_compute_ns, (SELECT e0 - s0 FROM span) AS span_ns
FROM run WHERE tn IS NOT NULL GROUP BY rank"""


@rule(
    title="Pipeline stages idle in the schedule's bubble",
    category="pipeline_bubble",
    thresholds={"min_stages": 2, "excess_points": 0.05},
    explanation=EXPLANATION,
)
def pipeline_bubble(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    p2p = ctx.rows(f"""
        WITH p AS ({P2P_SQL})
        SELECT rank, count(*) AS n, count(*) FILTER (WHERE dir = 'send') AS n_send,
               count(*) FILTER (WHERE dir = 'recv') AS n_recv, arg_min(dir, start_ns) AS first_dir,
               min(end_ns) FILTER (WHERE dir = 'recv') AS first_recv_end, min(start_ns) AS first_p2p
        FROM p GROUP BY rank ORDER BY rank""")
    if len(p2p) < max(2, int(t.min_stages)):
        return
    stage_ranks = [r["rank"] for r in p2p]
    busy = {r["rank"]: r for r in ctx.rows(STAGES_SQL, [stage_ranks])}
    directed = any(r["n_send"] or r["n_recv"] for r in p2p)
    inf = float("inf")
    if directed:
        order = sorted(p2p, key=lambda r: (0 if r["first_dir"] == "send" else 1, r["first_recv_end"] or inf, r["rank"]))
    else:
        order = sorted(p2p, key=lambda r: (busy.get(r["rank"], {}).get("first_compute_ns") or inf, r["rank"]))
    p = len(order)
    first = order[0]
    marked = ctx.rows("SELECT count(*) AS n FROM rule_steps WHERE rank IS NOT DISTINCT FROM ?", [first["rank"]])[0]["n"]
    steps_first = marked or ctx.steps
    # Without step markers (ProfilerStep#N, or the occurrences of a --range) the sends of the window may span
    # several steps: the micro-batch count per step is not known, and no count is advised.
    steps_known = bool(marked) or ctx.step_unit is not None
    sends = first["n_send"] if directed and first["n_send"] else first["n"] / 2
    m = max(1, round(sends / max(steps_first, 1)))
    theory = (p - 1) / (m + p - 1)
    stages = []
    for i, r in enumerate(order):
        x = busy.get(r["rank"], {})
        w, b, q = x.get("span_ns") or 0, x.get("compute_ns") or 0, x.get("p2p_ns") or 0
        stages.append(
            {
                "stage": i,
                "rank": r["rank"],
                "p2p_ops": r["n"],
                "sends": r["n_send"],
                "recvs": r["n_recv"],
                "compute_ns": b,
                "p2p_only_ns": q,
                "idle_ns": max(w - b - q, 0),
                "span_ns": w,
                "bubble": 1 - b / w if w else None,
                "in_p2p": q / w if w else None,
                "idle": max(w - b - q, 0) / w if w else None,
            }
        )
    measured_list = [s["bubble"] for s in stages if s["bubble"] is not None]
    measured = sum(measured_list) / len(measured_list) if measured_list else None
    m_half = 2 * m + p - 1
    # Unequal stages: the slowest sets the pace, T ≈ (m+p−1)·t_max, so stage i idles 1 − m·t_i/T; the mean of
    # that is the bubble the schedule itself gives with these stages (t_i from each stage's kernel time).
    work = [s["compute_ns"] for s in stages if s["compute_ns"]]
    imbalance = max(work) / (sum(work) / len(work)) if len(work) == p and min(work) > 0 else None
    theory_unequal = 1 - (m / (m + p - 1)) / imbalance if imbalance and steps_known else None
    lost = ctx.lost_fraction(f"SELECT rank, device, start_ns, end_ns FROM ({P2P_SQL})", ["pipeline_bubble"])
    excess = steps_known and measured is not None and measured - theory > t.excess_points
    in_p2p = sum(s["in_p2p"] or 0 for s in stages) / len(stages)
    idle = sum(s["idle"] or 0 for s in stages) / len(stages)
    per_stage = ", ".join(f"stage {s['stage']} (rank {s['rank']}) {pct(s['bubble'])}" for s in stages)
    if steps_known:
        rec = (
            f"{p} stages × {m} micro-batches per {ctx.step_unit or 'step'}: the schedule's bubble is "
            f"(p−1)/(m+p−1) = {pct(theory)}; measured {pct(measured)} ({per_stage}). Raise the micro-batch count "
            f"{m} → {m_half} to halve it (≈{pct((p - 1) / (m_half + p - 1))}; keep the global batch by shrinking "
            "each micro-batch), or use an interleaved schedule (v virtual stages per rank divide it by v)."
        )
    else:
        rec = (
            f"{p} stages; the first sends {sends:.0f}× in the window, which has no step markers, so the "
            f"micro-batches per step are not known (if the window is one step, m = {m} and the schedule's bubble "
            f"is {pct(theory)}); measured {pct(measured)} ({per_stage}). Mark the steps (ProfilerStep#N, an NVTX "
            "range per step, or --range) to count micro-batches; more micro-batches per step or an interleaved "
            "schedule shrink the bubble."
        )
    if imbalance is not None and imbalance > 1.05 and theory_unequal is not None:
        slow = max(stages, key=lambda s: s["compute_ns"] or 0)
        rec += (
            f" The stages are unequal: stage {slow['stage']} (rank {slow['rank']}) computes {imbalance:.2f}× the "
            f"mean, and sets the pace — with these stages the schedule's bubble is {pct(theory_unequal)}; "
            "balancing layers across stages brings it back toward the formula."
        )
    if excess:
        rec += (
            f" The measured bubble is {pct(measured - theory)} above the formula: of the {pct(measured)}, "
            f"{pct(in_p2p)} is spent in send/recv (waiting on a peer: unequal stages or exposed P2P transfers — "
            f"balance layers across stages, overlap send/recv with compute) and {pct(idle)} with no kernel at all "
            "(the host is not launching fast enough — see PR501 / PR504; profiling overhead adds to it)."
        )
    yield Finding(
        title=(
            f"pipeline bubble {pct(measured)} with {p} stages × {m} micro-batches (theory {pct(theory)})"
            if steps_known
            else f"pipeline bubble {pct(measured)} with {p} stages (micro-batches per step unknown: no step markers)"
        ),
        recommendation=rec,
        fix=(
            f"micro-batches {m} → {m_half} halves the bubble"
            if steps_known
            else "pipeline bubble: mark steps to count micro-batches, then raise them"
        ),
        lost_fraction=lost,
        key="pipeline",
        evidence={
            "stages": stages,
            "num_stages": p,
            "micro_batches": m if steps_known else None,
            "sends_in_window": sends,
            "steps_known": steps_known,
            "steps": steps_first,
            "directions_known": directed,
            "theory_bubble": theory if steps_known else None,
            "measured_bubble": measured,
            "stage_imbalance": imbalance,
            "theory_bubble_unequal_stages": theory_unequal,
            "micro_batches_to_halve": m_half if steps_known else None,
            "in_p2p": in_p2p,
            "idle": idle,
            "stage_order": [s["rank"] for s in stages],
            "measured_minus_theory": (measured - theory) if measured is not None and steps_known else None,
        },
    )
