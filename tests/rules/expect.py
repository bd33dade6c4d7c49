"""Expected findings as structured facts derived from how a fixture was built — the rule, the rank, the lost
fraction within a stated tolerance, key evidence numbers with the truth's source — and the checker that matches
them against the findings of a verdict. Never a copy of the tool's own text: wording is checked only for what
must (or must never) be said, e.g. no `torch.compile` for a program without PyTorch."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmient_report import pipeline

from ..conftest import SAMPLES, sample_file

_UNSET: Any = object()


@dataclass(frozen=True)
class Near:
    """A number and its tolerance (absolute and/or relative), with where the truth comes from."""

    value: float
    rel: float = 0.0
    abs: float = 0.0
    truth: str = ""

    def holds(self, x: Any) -> bool:
        if x is None or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
            return False
        return abs(float(x) - self.value) <= max(self.abs, self.rel * abs(self.value))

    def __repr__(self) -> str:
        tol = " ".join(s for s in (f"±{self.abs:g}" if self.abs else "", f"±{self.rel:.0%}" if self.rel else "") if s)
        return f"{self.value:g} {tol} ({self.truth})"


@dataclass(frozen=True)
class Between:
    low: float
    high: float
    truth: str = ""

    def holds(self, x: Any) -> bool:
        return isinstance(x, (int, float)) and self.low <= float(x) <= self.high


@dataclass(frozen=True)
class Expect:
    """One finding that must be there. `evidence` maps a dotted path (`gaps.0.duration_ns`) to a value, a Near /
    Between, or a predicate; `says` / `never_says` are patterns its title, fix and recommendation must / must not
    contain (what the advice must fit, never our wording copied)."""

    rule: str
    rank: Any = _UNSET  # an int, None (a run-wide finding), or unset (any)
    key: str | None = None
    category: Any = _UNSET
    lost_fraction: Near | Between | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    says: Sequence[str] = ()
    never_says: Sequence[str] = ()


def dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, list):
            obj = obj[int(part)] if part.lstrip("-").isdigit() and -len(obj) <= int(part) < len(obj) else None
        elif isinstance(obj, dict):
            obj = obj.get(part)
        else:
            return None
    return obj


def _ok(want: Any, got: Any) -> bool:
    if isinstance(want, (Near, Between)):
        return want.holds(got)
    if callable(want):
        return bool(want(got))
    return got == want


def found(verdict: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in verdict["findings"] if f["rule"] == rule]


def check(verdict: dict[str, Any], expected: Sequence[Expect], silent: Sequence[str] = ()) -> None:
    """Every expected finding is there with its facts; the rules in `silent` found nothing."""
    for rule in silent:
        assert found(verdict, rule) == [], (rule, [f["title"] for f in found(verdict, rule)])
    for e in expected:
        cands = [
            f
            for f in found(verdict, e.rule)
            if (e.rank is _UNSET or f["rank"] == e.rank) and (e.key is None or f["key"] == e.key)
        ]
        assert cands, (
            f"{e.rule} (rank {e.rank if e.rank is not _UNSET else 'any'}, key {e.key}) did not fire; "
            f"found {[(f['rule'], f['rank'], f['key']) for f in verdict['findings']]}"
        )
        f = cands[0]
        if e.category is not _UNSET:
            assert f["category"] == e.category, (e.rule, f["category"])
        if e.lost_fraction is not None:
            assert e.lost_fraction.holds(f["lost_fraction"]), (e.rule, f["lost_fraction"], e.lost_fraction)
        for path, want in e.evidence.items():
            got = dig(f["evidence"], path)
            assert _ok(want, got), (e.rule, path, got, want)
        text = " ".join(str(f[k]) for k in ("title", "fix", "recommendation"))
        for pat in e.says:
            assert re.search(pat, text), (e.rule, pat, text)
        for pat in e.never_says:
            assert not re.search(pat, text), (e.rule, pat, text)
    claims_within_waterfall(verdict)


def claims_within_waterfall(v: dict[str, Any]) -> None:
    """No finding claims more than the waterfall lost in its category (or than was lost at all)."""
    losses = {x["category"]: x["fraction"] for x in v["losses"]}
    for f in v["findings"]:
        assert f["lost_fraction"] is None or f["lost_fraction"] >= 0
        if f["lost_fraction"] is None:
            continue
        if f["category"] and losses:
            assert f["lost_fraction"] <= losses.get(f["category"], 0.0) + 1e-9, f
        elif v["achieved_fraction_of_peak"] is not None and f["lost_fraction"] is not None:
            assert f["lost_fraction"] <= 1 - v["achieved_fraction_of_peak"] + 1e-9, f
    assert not any("failed" in n for n in v["notes"]), v["notes"]


def analyse(paths: Sequence[Path | str], **kw: Any) -> dict[str, Any]:
    res = pipeline.analyse([Path(p) for p in paths], pipeline.Options(**kw))
    try:
        return res.verdict
    finally:
        res.close()


# ---- the committed samples (sample_traces/README.md): analysed once per session -----------------------------

SINGLE = "h200_single/kineto_single.pt.trace.json.gz"


@functools.cache
def single_phase(phase: str) -> dict[str, Any]:
    """One phase of sample_traces/h200_single (five phases recorded on an H200; truth in ground_truth.json)."""
    return analyse([sample_file(SINGLE)], ranges=[f"phase:{phase}"])


@functools.cache
def ddp_sample() -> dict[str, Any]:
    """sample_traces/h200x2_ddp/kineto: two ranks, rank 1 sleeps 30 ms before every backward."""
    return analyse([sample_file("h200x2_ddp/kineto")])


def truth(rel: str) -> Any:
    import json

    return json.loads((SAMPLES / rel).read_text())


Builder = Callable[[Path], list[Path]]
