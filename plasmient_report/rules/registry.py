"""The rule catalog (the built-in rules of the code table, codes.py, + the `plasmient_report.rules` entry-point
group), selection with `--select` / `--ignore` (IDs, ID prefixes or names, as ruff does; a preview rule only by its
own code or name), per-rule thresholds from `--rules-config`, and `run`: every selected rule over the store, each in
its own schema, findings into the `findings` table.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb

from ..errors import BadInput
from ..metrics import window_label
from ..vocab import MATERIAL_UNKNOWN_FLOPS
from . import context
from .base import COMMON_THRESHOLDS, ID_RE, LAYERS, Finding, Rule, Thresholds
from .codes import CODES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_POINT_GROUP = "plasmient_report.rules"
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
    """The rules of the code table, each from its file `rules/<layer>/<rule_name>.py`, with the table's code,
    layer, name and status."""
    out: list[Rule] = []
    for c in CODES:
        module = importlib.import_module(f"{__package__}.{c.module}")
        found = _rules_in(module)
        if len(found) != 1:
            raise RuntimeError(f"rules/{c.layer}/{c.rule_name}.py must define exactly one rule ({c.code}); found {len(found)}")
        r = found[0]
        if r.id and r.id != c.code:
            raise RuntimeError(f"rules/{c.layer}/{c.rule_name}.py says {r.id}; the code table says {c.code}")
        out.append(replace(r, id=c.code, layer=c.layer, name=c.name, status=c.status))
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
        for r in found:
            if not ID_RE.match(r.id) or r.layer not in LAYERS:
                notes.append(
                    f"rule plugin {ep.name!r} ({ep.value}): a rule needs a code like XY101 and a layer "
                    f"({r.id!r}, {r.layer!r}); skipped"
                )
                continue
            out.append(replace(r, origin=f"plugin {ep.name} ({ep.value})"))
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
    """`code` selects `r`: ALL, a code prefix or its name; a preview rule only by its whole code or name."""
    c = code.strip().upper()
    if c == r.id.upper() or c == r.name.upper():
        return True
    return r.status != "preview" and (c == "ALL" or r.id.upper().startswith(c))


def _codes(values: Iterable[str] | None) -> list[str]:
    return [c.strip() for v in values or () for c in str(v).split(",") if c.strip()]


@dataclass(frozen=True)
class Selection:
    rules: tuple[Rule, ...]
    thresholds: dict[str, Thresholds]
    notes: tuple[str, ...] = ()


def configure(select: Sequence[str] | None = None, ignore: Sequence[str] | None = None, config: Path | None = None) -> Selection:
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
            raise BadInput(
                config if code not in _codes(select) + _codes(ignore) else None,
                f"no rule matches {code!r} (see `plasmient-report rules`)",
            )
    chosen = [r for r in rules if any(_matches(c, r) for c in sel) and not any(_matches(c, r) for c in ign)]
    notes += [f"rule {r.id} {r.name} is deprecated" for r in chosen if r.status == "deprecated"]
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
                raise BadInput(config, f"[{code}] {name}: unknown threshold; {r.id} has {', '.join(sorted(merged))}")
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
    if not r.claims_loss:  # a risk, not lost time: nothing for the waterfall, whatever the rule filled in
        return replace(
            f,
            rule_id=r.id,
            name=r.name,
            layer=r.layer,
            category=None,
            lost_fraction=None,
            severity=f.severity or "info",
            evidence=_json_safe(f.evidence),
        )
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
    return replace(
        f,
        rule_id=r.id,
        name=r.name,
        layer=r.layer,
        category=category,
        lost_fraction=lost,
        severity=f.severity or _severity(lost),
        evidence=_json_safe(f.evidence),
    )


def run(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    ranges: Sequence[str],
    precision: str,
    peaks: Sequence[Any],
    peaks_file: Path | None = None,
    strict: bool = False,
    material_unknown: float = MATERIAL_UNKNOWN_FLOPS,
) -> tuple[list[Finding], list[str]]:
    """Run the selected rules over the analysed window, each in its own schema; write `findings`; return them
    (worst first) and notes. A window too short to judge (below `min_window_us` per GPU) gets no findings.
    `material_unknown`: the verdict's threshold (`[verdict] material_unknown_flops`) above which unknown work makes
    the achieved fraction a lower bound — the rules see the window as the verdict does."""
    notes = list(selection.notes)
    con.execute("DELETE FROM findings")
    ctx = context.prepare(con, ranges, precision, peaks, peaks_file, material_unknown)
    found: list[Finding] = []
    too_short: list[str] = []
    try:
        for r in selection.rules:
            t = selection.thresholds.get(r.id) or Thresholds({**COMMON_THRESHOLDS, **r.thresholds})
            if ctx.window_per_gpu_ns < t.min_window_us * 1e3:
                too_short.append(r.id)
                continue
            try:
                with context.own_schema(ctx, r.id):
                    for f in r.check(ctx, t) or ():
                        done = finish(f, r, ctx, t)
                        if done is not None:
                            found.append(done)
            except Exception as e:
                if strict:
                    raise
                notes.append(
                    f"rule {r.id} {r.name} failed and was skipped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                )
    finally:
        context.cleanup(con)
    if too_short:
        from .text import fmt_ns

        notes.append(
            f"the window is too short to judge ({fmt_ns(ctx.window_per_gpu_ns)} per GPU, "
            f"{ctx.kernel_count} GPU activit{'y' if ctx.kernel_count == 1 else 'ies'}): "
            f"{'no rule' if len(too_short) == len(selection.rules) else ', '.join(too_short)} ran "
            "(min_window_us)"
        )
    found.sort(key=lambda f: (-(f.lost_fraction if f.lost_fraction is not None else -1.0), f.rule_id, f.key))
    scope = "range" if ranges else "window"
    rn = window_label(ranges)
    if found:
        con.executemany(
            """INSERT INTO findings (rule_id, layer, severity, rank, lost_fraction, title, evidence, recommendation,
                                     category, fix, key, scope, range_name)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [
                [
                    f.rule_id,
                    f.layer,
                    f.severity,
                    f.rank,
                    f.lost_fraction,
                    f.title,
                    json.dumps(f.evidence, allow_nan=False),
                    f.recommendation,
                    f.category,
                    f.fix,
                    f.key,
                    scope,
                    rn,
                ]
                for f in found
            ],
        )
    return found, notes
