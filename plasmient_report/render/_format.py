"""Number formats and wording shared by the renderers, so the terminal box and the HTML say the same thing: the
headline achieved fraction (unknown / a lower bound), category labels, range occurrences as steps × ranks, long
names shortened in the middle."""

from __future__ import annotations

import math
from typing import Any

from ..verdict_model import RangeSummary, StepSummary, Verdict
from ..vocab import KERNEL_NAMESPACES, kernel_label

try:  # the one list of labels of the measure stage (CONTRACTS.md)
    from ..vocab import CATEGORY_LABELS as _LABELS  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - before the measure stage defines them
    _LABELS = {"unknown_flops": "unknown FLOPs", "startup": "start-up"}


# Hardware counters (utilization.sm_active / tensor_active, hardware_estimate.metric) in words.
HARDWARE_LABELS = {"tensor_active": "tensor cores active", "sm_active": "SM active"}


def hardware_label(metric: str) -> str:
    return HARDWARE_LABELS.get(metric, metric.replace("_", " "))


def pct(x: float | None) -> str:
    """A fraction as a percentage: one decimal below 1%, none above; 'n/a' when unknown."""
    if x is None:
        return "n/a"
    if 0 < x < 0.01:
        return f"{x:.1%}"
    return f"{x:.0%}"


# On a GPU with no peak, the time of work with a FLOP estimate is in no loss category: it is achieved and compute
# inefficiency together, which only a peak tells apart (docs/verdict.md). The renderers show it as a line of its own.
UNSPLIT = "achieved_or_inefficiency"
UNSPLIT_LABEL = "achieved + inefficiency"
UNSPLIT_TEXT = "work with a FLOP estimate, achieved and compute inefficiency together: only a peak tells them apart"


def category_label(category: str) -> str:
    """`unknown_flops` → 'unknown FLOPs', `startup` → 'start-up', `memory_bound` → 'memory bound'."""
    if category == UNSPLIT:
        return UNSPLIT_LABEL
    return _LABELS.get(category) or category.replace("_", " ")


def unsplit_fraction(verdict: Verdict | dict[str, Any]) -> float:
    """The share of the window in no loss while the achieved fraction is unknown: 1 − Σ losses (0 when achieved is
    known, or the losses account for the whole window)."""
    v = _verdict(verdict)
    if v.achieved_fraction_of_peak is not None or not v.losses:
        return 0.0
    rest = 1.0 - math.fsum(x.fraction for x in v.losses)
    return rest if rest >= 5e-4 else 0.0


def _verdict(v: Verdict | dict[str, Any]) -> Verdict:
    if isinstance(v, Verdict):
        return v
    from ..verdict_model import from_dict

    return from_dict(v, strict=False)


def achieved_text(verdict: Verdict | dict[str, Any]) -> str:
    """The headline achieved fraction: 'unknown' when it is null, '≥ 12%' when it is a lower bound (two decimals
    below 1%: '≥ 0.12%', what the estimated kernels alone achieved)."""
    v = _verdict(verdict)
    achieved = v.achieved_fraction_of_peak
    if achieved is None:
        return "unknown"
    if v.achieved_is_lower_bound:
        return "≥ " + (f"{achieved:.2%}" if 0 < achieved < 0.01 else pct(achieved))
    return pct(achieved)


def bounded_pct(x: float | None, lower_bound: bool) -> str:
    """A table's achieved fraction: '≥ 12%' when it is a lower bound, 'n/a' when unknown."""
    return ("≥ " if lower_bound and x is not None else "") + pct(x)


def achieved_why(verdict: Verdict | dict[str, Any]) -> str | None:
    """Why the achieved fraction is unknown or a lower bound, in one phrase (None when it is neither)."""
    v = _verdict(verdict)
    cov = v.coverage
    if v.achieved_fraction_of_peak is None:
        if v.peak.tflops is None:
            return "no peak known for this GPU (give --gpu or --peak-tflops)"
        return "no kernel has a FLOP estimate (give --model-flops or an Nsight Compute CSV; the note says what else)"
    if v.achieved_is_lower_bound:
        unknown = cov.unknown_flops_time_fraction
        if unknown is not None:
            return f"a lower bound: {pct(unknown)} of compute time has no FLOP estimate"
        return f"a lower bound: only {pct(cov.kernels_with_flops_time_fraction)} of compute time has a FLOP estimate"
    return None


def range_ranks(r: RangeSummary, v: Verdict) -> int:
    """How many ranks ran the range: the verdict says, or the run's ranks less those without it."""
    if r.ranks is not None:
        return r.ranks
    missing = set(r.missing_ranks)
    return max(1, len([x for x in set(v.run.ranks) if x not in missing])) if v.run.ranks else 1


def range_occurrences(r: RangeSummary, v: Verdict) -> str:
    """'5' on one rank; '5 × 2 ranks' when every rank ran it 5 times; '9 over 2 ranks' when they differ."""
    ranks = range_ranks(r, v)
    if ranks <= 1:
        return f"{r.count:,}"
    if r.count % ranks == 0:
        return f"{r.count // ranks:,} × {ranks} ranks"
    return f"{r.count:,} over {ranks} ranks"


def range_per_occurrence_ns(r: RangeSummary) -> float | None:
    """Mean window of one occurrence on one rank (the range's window_ns is summed over occurrences and ranks)."""
    if r.per_occurrence_ns is not None:
        return r.per_occurrence_ns
    if r.window_ns and r.count:
        return r.window_ns / r.count
    return None


def range_name(name: str) -> str:
    return name if name.strip() else "(unnamed range)"


def middle_ellipsis(text: str, width: int) -> str:
    """`text` cut to `width` characters in the middle: long kernel names that share a prefix stay apart."""
    if len(text) <= width:
        return text
    head = (width - 1) * 2 // 5
    tail = width - 1 - head
    return text[:head] + "…" + text[-tail:]


def _strip(name: str) -> str:
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    return KERNEL_NAMESPACES.sub("", n)


def kernel_name(name: str, width: int) -> str:
    """A kernel's name for a table cell: `vocab.kernel_label` (a C++ template kernel as its function and the
    functor that tells it apart), shortened in the middle past `width` characters."""
    return middle_ellipsis(kernel_label(name), width)


def kernel_names(names: list[str], width: int) -> dict[str, str]:
    """Each name's cell text (`kernel_name`); names that would read the same are shown in full, shortened in
    the middle instead, so no two rows look alike (the full name is always the cell's title)."""
    short = {n: kernel_name(n, width) for n in names}
    seen: dict[str, int] = {}
    for text in short.values():
        seen[text] = seen.get(text, 0) + 1
    return {n: (t if seen[t] == 1 else middle_ellipsis(_strip(n), width)) for n, t in short.items()}


def ms(ns: float | None) -> str:
    """A duration in ms with a precision that suits it: '134.9 ms', '0.412 ms'; 'n/a' when unknown."""
    if ns is None:
        return "n/a"
    x = ns / 1e6
    return f"{x:,.3f} ms" if x < 1 else f"{x:,.1f} ms" if x < 10_000 else f"{x / 1e3:,.1f} s"


def rate(x: float | None, unit: str) -> str:
    """A throughput: '1.21M tokens/s', '812 samples/s'."""
    if x is None:
        return "n/a"
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:,.3g}{prefix} {unit}/s"
    return f"{x:,.3g} {unit}/s"


def signed_pct(x: float) -> str:
    """A relative change: '+0.5%', '+35%', '-2.1%', '0.0%'; from +100% on as a ratio: '×3.0' (it is no share)."""
    if abs(x) < 0.0005:
        return "0.0%"
    if x >= 1:
        return f"×{1 + x:,.1f}"
    return f"{x:+.1%}" if abs(x) < 0.1 else f"{x:+.0%}"


def step_counts(s: StepSummary) -> str:
    """'3 steps', '5 steps × 2 ranks'."""
    n = s.per_rank if s.ranks > 1 else s.steps
    text = f"{n:,} step{'s' if n != 1 else ''}"
    return text + (f" × {s.ranks} ranks" if s.ranks > 1 else "")


def timed_steps(s: StepSummary) -> int:
    """How many steps the step-time statistics are over: the whole ones (all when the recording cut every one)."""
    return s.steps - s.cut_step_count or s.steps


def step_time_text(s: StepSummary) -> str:
    """The mean GPU step time and its spread (the standard deviation): '134.9 ms ± 0.795 ms'."""
    spread = f" ± {ms(s.stddev_ns)}" if s.stddev_ns and timed_steps(s) > 1 else ""
    return ms(s.mean_ns) + spread


def step_outliers_text(s: StepSummary) -> str:
    """The slowest step, how many are flagged slow, and how many the recording cut: 'slowest ProfilerStep#3 (rank
    1) +0.5%'."""
    parts = []
    w = s.slowest
    # (a slowest step within 0.5% of the median is no outlier: nothing to say)
    if w is not None and timed_steps(s) > 1 and (w.excess_over_median is None or w.excess_over_median >= 0.005):
        where = f" on rank {w.rank}" if s.ranks > 1 else ""
        parts.append(
            f"slowest {range_name(w.name)}{where} {ms(w.gpu_ns)}"
            + (f" ({signed_pct(w.excess_over_median)} over the median)" if w.excess_over_median is not None else "")
        )
    # (the slowest step, said above, is among the slow ones when it is slow)
    said = w is not None and timed_steps(s) > 1 and w.excess_over_median is not None and w.excess_over_median > s.slow_threshold
    more = s.slow_step_count - (1 if said else 0)
    if more > 0:
        what = "more" if said else f"step{'s' if more != 1 else ''}"
        parts.append(f"{more} {what} {s.slow_threshold:.0%}+ over the median")
    if s.slowest_rank is not None:
        parts.append(
            f"rank {s.slowest_rank.rank} {signed_pct(s.slowest_rank.excess_over_fastest)} per step over the fastest rank"
        )
    if s.cut_step_count:
        n = s.cut_step_count
        whole = "" if n == s.steps else ", left out of the step time"
        parts.append(f"{n} step{'s' if n != 1 else ''} cut by the profiler's recording (a lower bound{whole})")
    return "; ".join(parts)
