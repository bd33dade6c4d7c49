"""The judge stage's rule engine (SPEC §5), laid out like ruff's: the table of codes (`codes.py`: code, layer, file,
status), one rule per file named after it (`<layer>/<rule_name>.py`: its explanation — the page — and its query,
SQL over the store and the measurement library's views, run in a schema of its own), `docs/rules/<CODE>.md`
generated from the pages, and a fixture folder per rule (`tests/rules/<CODE>/`).

Add a built-in rule: write `rules/<layer>/<rule_name>.py`, add its line to `codes.py`, add `tests/rules/<CODE>/`,
run `python -m plasmient_report.rules --write`. Add a rule from your own package (entry-point group
`plasmient_report.rules`):

    from plasmient_report.rules import Explanation, Finding, rule

    @rule("XY101", name="my-rule", layer="kernel", title="What it flags", category="memory_bound",
          thresholds={"min_share": 0.1}, explanation=Explanation(what_it_does=..., why_is_this_bad=...,
                                                                   example=..., how_to_fix=...))
    def my_rule(ctx, t):
        for row in ctx.rows("SELECT ... FROM rule_kernels ..."):
            yield Finding(title=..., recommendation=..., fix=..., lost_fraction=ctx.lost_fraction(...))

(or put the page in the function's docstring, as `## What it does` … `## How to fix` sections).
"""

from __future__ import annotations

from .base import (
    COMMON_THRESHOLDS,
    DOC_SECTIONS,
    LAYERS,
    STATUSES,
    Explanation,
    Finding,
    Rule,
    Thresholds,
    rule,
)
from .codes import CODES, Code
from .context import Program, RuleContext
from .registry import ENTRY_POINT_GROUP, Selection, all_rules, builtin_rules, configure, find_rule, run

__all__ = [
    "CODES",
    "COMMON_THRESHOLDS",
    "DOC_SECTIONS",
    "ENTRY_POINT_GROUP",
    "LAYERS",
    "STATUSES",
    "Code",
    "Explanation",
    "Finding",
    "Program",
    "Rule",
    "RuleContext",
    "Selection",
    "Thresholds",
    "all_rules",
    "builtin_rules",
    "configure",
    "find_rule",
    "rule",
    "run",
]
