"""The judge stage's rule engine (SPEC §5): one module per rule (or small family), each a query over the
store that names the cause of lost peak — the rank, the kernel, the op — with evidence and a fix with numbers.

Write a rule (in this package, or in your own package under the `plasmient_report.rules` entry-point group):

    from plasmient_report.rules import Finding, rule

    @rule("XY101", name="my-rule", layer="kernel", title="What it flags", category="memory_bound",
          thresholds={"min_share": 0.1})
    def my_rule(ctx, t):
        '''## What it detects ... ## Why it costs peak ... ## How to fix ... ## Example ...'''
        for row in ctx.rows("SELECT ... FROM rule_kernels ..."):
            yield Finding(title=..., recommendation=..., fix=..., lost_fraction=ctx.lost_fraction(...))
"""

from __future__ import annotations

from .base import COMMON_THRESHOLDS, DOC_SECTIONS, LAYERS, Finding, Rule, Thresholds, rule
from .context import RuleContext
from .registry import ENTRY_POINT_GROUP, Selection, all_rules, builtin_rules, configure, find_rule, run

__all__ = ["COMMON_THRESHOLDS", "DOC_SECTIONS", "ENTRY_POINT_GROUP", "LAYERS", "Finding", "Rule", "RuleContext",
           "Selection", "Thresholds", "all_rules", "builtin_rules", "configure", "find_rule", "rule", "run"]
