"""PR503 input-bound-step: the GPU waits for the DataLoader (the waterfall's `input_bound`), with the share per
step, whether loading runs in the training process (num_workers=0), and whether host memory is pinned."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ...vocab import DATALOADER_RE
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext
from ..text import fmt_ns, pct

EXPLANATION = Explanation(
    what_it_does="""
        GPU idle time while the host is inside a data-loading range (`enumerate(DataLoader)#…__next__`, or any
        range named `dataloader`): the waterfall's `input_bound`. The finding gives the share of the window and
        the data wait per step, whether the loader runs in the training process (`_SingleProcessDataLoaderIter`
        means `num_workers=0`), whether host→device copies come from pageable memory (no `pin_memory`), and a
        worker count that would hide the loading (at most `suggest_max_workers`).""",
    why_is_this_bad="""
        While the training process decodes, augments and collates the next batch, the GPU has nothing to do.
        With `num_workers=0` every step pays the full loading time; with too few workers the GPU still outruns
        them.""",
    example="""
        `input-bound: the GPU waits 31% of the window for the DataLoader (num_workers=0)` — about 3 workers would
        hide the loading.""",
    how_to_fix="""
        PyTorch: `DataLoader(num_workers=N, pin_memory=True, prefetch_factor=2–4, persistent_workers=True)` with N
        large enough that loading one batch per worker takes no longer than N GPU steps; move heavy augmentation to
        the GPU (DALI, torchvision v2 on CUDA tensors); pre-process and cache datasets; copy batches with
        `non_blocking=True`. Other loaders: more loader threads or processes, a prefetch queue of a few batches,
        pinned staging buffers and asynchronous copies.""",
)

INPUT_SQL = f"""
WITH ib AS (SELECT rank, device, start_ns, end_ns, lost_ns FROM rule_losses WHERE category = 'input_bound'),
ld AS (SELECT rank, name, start_ns, end_ns FROM rule_ranges
       WHERE NOT on_gpu AND domain IS DISTINCT FROM 'python' AND regexp_matches(name, '{DATALOADER_RE}'))
SELECT ib.*, ld.name AS loader FROM ib ASOF LEFT JOIN ld ON ld.rank IS NOT DISTINCT FROM ib.rank AND ld.start_ns <= ib.start_ns"""


@rule(
    title="Steps wait for input data (DataLoader)",
    category="input_bound",
    thresholds={"suggest_max_workers": 16},
    explanation=EXPLANATION,
)
def input_bound_step(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    rows = ctx.rows(f"""
        SELECT loader, count(*) AS stalls, sum(lost_ns) AS lost_ns, sum(end_ns - start_ns) AS idle_ns,
               list(DISTINCT rank ORDER BY rank) AS ranks
        FROM ({INPUT_SQL}) GROUP BY loader ORDER BY lost_ns DESC, loader""")
    if not rows:
        return
    lost_ns = sum(r["lost_ns"] for r in rows)
    idle_ns = sum(r["idle_ns"] for r in rows)
    names = [r["loader"] for r in rows if r["loader"]]
    single = any("SingleProcess" in n for n in names)
    multi = any("MultiProcessing" in n for n in names)
    pageable = ctx.rows(
        "SELECT count(*) AS n FROM rule_kernels WHERE kind = 'memcpy' AND copy_kind = 'HtoD' AND name ILIKE '%pageable%'"
    )[0]["n"]
    per_step = ctx.per_step(idle_ns / max(len(ctx.rank_window_ns), 1))
    rank_windows = sum(ctx.rank_window_ns.values()) / max(len(ctx.rank_window_ns), 1)
    work_per_step = max(ctx.per_step(rank_windows) - per_step, 1.0)
    workers = min(int(t.suggest_max_workers), max(2, math.ceil(per_step / work_per_step) + 1))
    state = (
        "num_workers=0: loading runs in the training process"
        if single
        else "worker processes are not keeping up"
        if multi
        else "the loader's worker count is not in the trace"
    )
    pin = f"; {pageable} host→device copies come from pageable memory (pin_memory is off)" if pageable else ""
    head = (
        f"The GPU waited {fmt_ns(idle_ns)} ({pct(ctx.fraction(lost_ns))} of the window"
        + (f", {fmt_ns(per_step)} {ctx.per_step_text()}" if ctx.step_unit else "")
        + ") for the data loader "
        f"({', '.join(names[:2]) or 'dataloader ranges'})"
    )
    if ctx.program.pytorch:
        rec = (
            f"{head}: {state}{pin}. Use DataLoader(num_workers={workers}"
            + (" or more" if multi else "")
            + ", pin_memory=True, prefetch_factor=4, persistent_workers=True) and copy batches with "
            "non_blocking=True; move heavy augmentation to the GPU or cache pre-processed data."
        )
        fix = f"DataLoader(num_workers={workers}, pin_memory=True, prefetch)"
    else:
        rec = (
            f"{head}{pin}. Load ahead of the GPU: about {workers} loader threads or processes, a prefetch queue "
            "of a few batches, pinned staging buffers and asynchronous copies; cache pre-processed data."
        )
        fix = f"load ahead: ~{workers} loader workers, prefetch, pinned buffers"
    yield Finding(
        title=f"input-bound: the GPU waits {pct(ctx.fraction(lost_ns))} of the window for "
        + ("the DataLoader" if ctx.program.pytorch else "data loading")
        + (" (num_workers=0)" if single else ""),
        recommendation=rec,
        fix=fix,
        lost_fraction=ctx.fraction(lost_ns),
        key="dataloader",
        evidence={
            "loaders": rows,
            "idle_ns": idle_ns,
            "wait_per_step_ns": per_step if ctx.step_unit else None,
            "single_process": single,
            "pageable_htod_copies": pageable,
            "suggested_workers": workers,
        },
    )
