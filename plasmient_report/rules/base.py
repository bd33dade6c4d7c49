"""What a rule is: a stable ID, a layer, a documentation page, thresholds with defaults, and a check that
queries the store and returns findings. Rule modules build their rules with `rule(...)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..vocab import CATEGORIES

if TYPE_CHECKING:
    from .context import RuleContext

LAYERS = ("cluster", "pipeline", "op", "kernel", "host", "device")
# The page of every rule has these sections, in this order (ruff's rule pages are the model).
DOC_SECTIONS = ("What it detects", "Why it costs peak", "How to fix", "Example")
ID_RE = re.compile(r"^[A-Z]{1,4}[0-9]{3}$")
# Every rule also takes this threshold: findings explaining less of the window than this are dropped.
COMMON_THRESHOLDS: dict[str, float] = {"min_lost_fraction": 0.005}


class Thresholds(Mapping[str, float]):
    """A rule's thresholds: its defaults with the user's overrides (`--rules-config`), read as attributes."""

    def __init__(self, values: Mapping[str, float]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> float:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> float:
        return self._values[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Thresholds({self._values!r})"


@dataclass(frozen=True)
class Finding:
    """One rule result. A rule fills title, evidence, recommendation, fix, lost_fraction (and rank, key);
    the engine fills rule_id, name, layer and category from the rule, and severity from lost_fraction."""

    title: str
    recommendation: str
    fix: str
    lost_fraction: float | None
    evidence: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    key: str = ""  # what the finding is about, stable across runs (a kernel name, a rank): `diff` matches on it
    severity: str | None = None
    rule_id: str = ""
    name: str = ""
    layer: str = ""
    category: str | None = None


Check = Callable[["RuleContext", Thresholds], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    name: str  # kebab-case, like ruff's rule names
    layer: str
    title: str
    category: str | None  # the waterfall category whose lost time its findings explain (None: several)
    thresholds: Mapping[str, float]
    doc: str
    check: Check
    origin: str = "builtin"

    def page(self) -> str:
        """The documentation page (`plasmient-report rules --explain ID`)."""
        lines = [f"# {self.id} {self.name}", "", f"{self.title}.", "",
                 f"Layer: {self.layer} · loss category: {self.category or '(several)'} · from: {self.origin}", ""]
        lines.append(self.doc.strip())
        lines += ["", "## Thresholds", ""]
        for k, v in {**COMMON_THRESHOLDS, **self.thresholds}.items():
            lines.append(f"- `{k}` = {v:g}")
        lines += ["", f"Override in a `--rules-config` TOML file: `[{self.id}]` then `name = value`."]
        return "\n".join(lines) + "\n"


def _dedent(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)


def check_doc(rule_id: str, doc: str) -> None:
    """A page must have the four sections, in order, as `## ` headings."""
    heads = re.findall(r"^## (.+?)\s*$", doc, re.MULTILINE)
    if tuple(heads[: len(DOC_SECTIONS)]) != DOC_SECTIONS:
        raise ValueError(f"rule {rule_id}: documentation needs the sections {', '.join(DOC_SECTIONS)} "
                         f"(as '## ' headings, in order); found {heads}")


def rule(id: str, name: str, layer: str, title: str, category: str | None,
         thresholds: Mapping[str, float] | None = None) -> Callable[[Check], Rule]:
    """Decorator: the function is the rule's check and its docstring the rule's page."""

    def wrap(fn: Check) -> Rule:
        if not ID_RE.match(id):
            raise ValueError(f"rule id {id!r} must look like PR101")
        if layer not in LAYERS:
            raise ValueError(f"rule {id}: layer {layer!r} is not one of {', '.join(LAYERS)}")
        if category is not None and category not in CATEGORIES:
            raise ValueError(f"rule {id}: category {category!r} is not a loss category")
        doc = _dedent(fn.__doc__ or "")
        check_doc(id, doc)
        return Rule(id=id, name=name, layer=layer, title=title, category=category,
                    thresholds=dict(thresholds or {}), doc=doc, check=fn, origin=fn.__module__)

    return wrap
