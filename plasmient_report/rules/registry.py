"""The rule catalog (built-in modules + the `plasmient_report.rules` entry-point group), selection with
`--select` / `--ignore` (IDs, ID prefixes or names, as ruff does), per-rule thresholds from `--rules-config`,
and `run`: every selected rule over the store, findings into the `findings` table.
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb

from ..errors import BadInput
from . import context
from .base import COMMON_THRESHOLDS, Finding, Rule, Thresholds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_POINT_GROUP = "plasmient_report.rules"
_FRAMEWORK_MODULES = {"base", "context", "registry", "sqlutil"}
SEVERITY_HIGH = 0.10  # lost_fraction at or above: "high"
SEVERITY_MEDIUM = 0.02  # at or above: "medium"; below: "low"; findings without a lost fraction: "info"


def _rules_in(obj: Any) -> list[Rule]:
    if isinstance(obj, Rule):
        return [obj]
    if isinstance(obj, ModuleType):
        return [v for v in vars(obj).values() if isinstance(v, Rule)]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        return [r for x in obj for r in _rules_in(x)]
    return []


def builtin_rules() -> list[Rule]:
    """Every rule module in this package (adding a rule = adding a module)."""
    from .. import rules as pkg

    out: list[Rule] = []
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name in _FRAMEWORK_MODULES or m.name.startswith("_"):
            continue
        out += _rules_in(importlib.import_module(f"{pkg.__name__}.{m.name}"))
    return sorted(out, key=lambda r: r.id)


def plugin_rules() -> tuple[list[Rule], list[str]]:
    """Rules from installed packages: an entry point in the group may name a Rule, a module, or a list."""
    out: list[Rule] = []
    notes: list[str] = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = _rules_in(ep.load())
        except Exception as e:  # a broken plugin must not break the report
            notes.append(f"rule plugin {ep.name!r} ({ep.value}) could not be loaded: {type(e).__name__}: {e}")
            continue
        if not found:
            notes.append(f"rule plugin {ep.name!r} ({ep.value}) defines no rules")
        out += [replace(r, origin=f"plugin {ep.name} ({ep.value})") if r.origin == "builtin" else r for r in found]
    return out, notes


def all_rules() -> tuple[list[Rule], list[str]]:
    rules = builtin_rules()
    plugins, notes = plugin_rules()
    seen = {r.id for r in rules}
    for r in plugins:
        if r.id in seen:
            notes.append(f"rule plugin rule {r.id} ({r.origin}) clashes with an existing rule ID and was skipped")
            continue
        seen.add(r.id)
        rules.append(r)
    return sorted(rules, key=lambda r: r.id), notes


def find_rule(code: str, rules: Sequence[Rule] | None = None) -> Rule | None:
    rules = rules if rules is not None else all_rules()[0]
    c = code.strip()
    return next((r for r in rules if r.id.upper() == c.upper() or r.name == c.lower()), None)


def _matches(code: str, r: Rule) -> bool:
    c = code.strip().upper()
    return c == "ALL" or r.id.upper().startswith(c) or r.name.upper() == c


def _codes(values: Iterable[str] | None) -> list[str]:
    return [c.strip() for v in values or () for c in str(v).split(",") if c.strip()]


@dataclass(frozen=True)
class Selection:
    rules: tuple[Rule, ...]
    thresholds: dict[str, Thresholds]
    notes: tuple[str, ...] = ()


def configure(select: Sequence[str] | None = None, ignore: Sequence[str] | None = None,
              config: Path | None = None) -> Selection:
    """Which rules run, with which thresholds. Bad codes, files or values are BadInput (exit 2)."""
    rules, notes = all_rules()
    cfg: dict[str, Any] = {}
    if config is not None:
        try:
            cfg = tomllib.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise BadInput(config, f"cannot read rules config ({e})") from None
    sel = _codes(select) or _codes(cfg.get("select")) or ["ALL"]
    ign = _codes(ignore) + _codes(cfg.get("ignore"))
    for code in sel + ign:
        if not any(_matches(code, r) for r in rules):
            raise BadInput(config if code not in _codes(select) + _codes(ignore) else None,
                           f"no rule matches {code!r} (see `plasmient-report rules`)")
    chosen = [r for r in rules if any(_matches(c, r) for c in sel) and not any(_matches(c, r) for c in ign)]
    per_rule: dict[str, dict[str, Any]] = {}
    for k, v in cfg.items():
        if k in ("select", "ignore", "verdict"):  # [verdict]: the judge's wording thresholds (judge.py)
            continue
        if k == "rules" and isinstance(v, dict):
            for kk, vv in v.items():
                per_rule[kk] = vv
            continue
        per_rule[k] = v
    thresholds: dict[str, Thresholds] = {r.id: Thresholds({**COMMON_THRESHOLDS, **r.thresholds}) for r in rules}
    for code, values in per_rule.items():
        r = find_rule(code, rules)
        if r is None:
            raise BadInput(config, f"[{code}]: no such rule (see `plasmient-report rules`)")
        if not isinstance(values, dict):
            raise BadInput(config, f"[{code}] must be a table of thresholds")
        merged = dict(thresholds[r.id])
        for name, value in values.items():
            if name not in merged:
                raise BadInput(config, f"[{code}] {name}: unknown threshold; {r.id} has "
                                       f"{', '.join(sorted(merged))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise BadInput(config, f"[{code}] {name} = {value!r}: a number is needed")
            merged[name] = float(value)
        thresholds[r.id] = Thresholds(merged)
    return Selection(rules=tuple(chosen), thresholds=thresholds, notes=tuple(notes))


def _severity(lost: float | None) -> str:
    if lost is None:
        return "info"
    return "high" if lost >= SEVERITY_HIGH else "medium" if lost >= SEVERITY_MEDIUM else "low"


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    x = context.plain(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


def finish(f: Finding, r: Rule, ctx: context.RuleContext, t: Thresholds) -> Finding | None:
    """Fill the rule's fields; cap the claim at what the waterfall lost; drop findings below the threshold."""
    category = f.category or r.category
    lost = f.lost_fraction
    if lost is not None:
        lost = max(0.0, float(lost))
        if category is not None:
            lost = min(lost, ctx.category_fraction(category))
        elif ctx.achieved is not None:
            lost = min(lost, max(0.0, 1.0 - ctx.achieved))
        else:
            lost = min(lost, 1.0)
        if lost < t.min_lost_fraction:
            return None
    return replace(f, rule_id=r.id, name=r.name, layer=r.layer, category=category, lost_fraction=lost,
                   severity=f.severity or _severity(lost), evidence=_json_safe(f.evidence))


def run(con: duckdb.DuckDBPyConnection, selection: Selection, ranges: Sequence[str], precision: str,
        peaks: Sequence[Any], peaks_file: Path | None = None, strict: bool = False) -> tuple[list[Finding], list[str]]:
    """Run the selected rules over the analysed window; write `findings`; return them (worst first) and notes."""
    notes = list(selection.notes)
    con.execute("DELETE FROM findings")
    ctx = context.prepare(con, ranges, precision, peaks, peaks_file)
    found: list[Finding] = []
    try:
        for r in selection.rules:
            t = selection.thresholds.get(r.id) or Thresholds({**COMMON_THRESHOLDS, **r.thresholds})
            try:
                for f in r.check(ctx, t) or ():
                    done = finish(f, r, ctx, t)
                    if done is not None:
                        found.append(done)
            except Exception as e:
                if strict:
                    raise
                notes.append(f"rule {r.id} {r.name} failed and was skipped: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}")
    finally:
        context.cleanup(con)
    found.sort(key=lambda f: (-(f.lost_fraction if f.lost_fraction is not None else -1.0), f.rule_id, f.key))
    scope = "range" if ranges else "window"
    rn = ranges[0] if ranges else None
    if found:
        con.executemany(
            """INSERT INTO findings (rule_id, layer, severity, rank, lost_fraction, title, evidence, recommendation,
                                     category, fix, key, scope, range_name)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [[f.rule_id, f.layer, f.severity, f.rank, f.lost_fraction, f.title,
              json.dumps(f.evidence, allow_nan=False), f.recommendation, f.category, f.fix, f.key, scope, rn]
             for f in found])
    return found, notes
