"""Number formats shared by the renderers, so the terminal box, the HTML and the docs print the same text."""

from __future__ import annotations

from typing import Any


def pct(x: float | None) -> str:
    """A fraction as a percentage: one decimal below 1%, none above; 'n/a' when unknown."""
    if x is None:
        return "n/a"
    if 0 < x < 0.01:
        return f"{x:.1%}"
    return f"{x:.0%}"


def achieved_text(verdict: dict[str, Any]) -> str:
    """The headline achieved fraction: '≥' when it is a lower bound (low FLOP coverage), '?' near zero."""
    achieved = verdict.get("achieved_fraction_of_peak")
    text = pct(achieved)
    if verdict.get("achieved_is_lower_bound") and achieved is not None:
        text = "≥" + text if achieved >= 0.005 else "?"
    return text
