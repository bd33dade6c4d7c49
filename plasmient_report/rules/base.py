"""What a rule is: a stable code, a name, a layer, a status, its explanation (the page users read, in ruff's fixed
sections), thresholds with defaults, and its query — a check that reads the store through SQL and returns findings.
Built-in rules get their code, layer and status from the table in `codes.py`; plugin rules give their own.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..vocab import CATEGORIES

if TYPE_CHECKING:
    from .context import RuleContext

LAYERS = ("cluster", "pipeline", "op", "kernel", "host", "device", "memory")
# stable: runs by default; preview: runs only when selected by its own code or name (not by a prefix or ALL);
# deprecated: runs as selected, and says it is deprecated.
STATUSES = ("stable", "preview", "deprecated")
# The page of every rule has these sections, in this order (ruff's rule pages are the model).
DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "How to fix")
# Pages of the first rule layout (plugins written for it) use these names: read as the sections above.
LEGACY_SECTIONS = {"What it detects": "What it does", "Why it costs peak": "Why is this bad?"}
LEGACY_ORDER = ("What it does", "Why is this bad?", "How to fix", "Example")
ID_RE = re.compile(r"^[A-Z]{1,4}[0-9]{3}$")
# Every rule also takes these thresholds: findings explaining less of the window than `min_lost_fraction` are
# dropped, and no rule runs on a window shorter than `min_window_us` per GPU (nothing can be judged from it).
COMMON_THRESHOLDS: dict[str, float] = {"min_lost_fraction": 0.005, "min_window_us": 100.0}


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

    def __iter__(self) -> Iterator[str]:
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


@dataclass(frozen=True)
class Explanation:
    """A rule's page: what it does, why that is bad, an example finding, and how to fix it (Markdown)."""

    what_it_does: str
    why_is_this_bad: str
    example: str
    how_to_fix: str

    @classmethod
    def parse(cls, text: str, code: str = "?") -> Explanation:
        """From Markdown with the four sections as `## ` headings, in order (the first layout's names accepted)."""
        parts = re.split(r"^## (.+?)\s*$", inspect.cleandoc(text or ""), flags=re.MULTILINE)
        heads = [LEGACY_SECTIONS.get(h.strip(), h.strip()) for h in parts[1::2]]
        bodies = dict(zip(heads, (b.strip() for b in parts[2::2]), strict=True))
        n = len(DOC_SECTIONS)
        if tuple(heads[:n]) not in (DOC_SECTIONS, LEGACY_ORDER):
            raise ValueError(
                f"rule {code}: its page needs the sections {', '.join(DOC_SECTIONS)} (as '## ' headings, in order); found {heads}"
            )
        return cls(*(bodies[h] for h in DOC_SECTIONS))

    def sections(self) -> tuple[tuple[str, str], ...]:
        return tuple(zip(DOC_SECTIONS, (self.what_it_does, self.why_is_this_bad, self.example, self.how_to_fix), strict=True))

    def markdown(self) -> str:
        return "\n\n".join(f"## {h}\n\n{inspect.cleandoc(b)}" for h, b in self.sections())


Check = Callable[["RuleContext", Thresholds], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str  # the code (PR101): from codes.py for built-in rules
    name: str  # kebab-case, like ruff's rule names: the rule's file name with '-' for '_'
    layer: str
    title: str
    category: str | None  # the waterfall category whose lost time its findings explain (None: several)
    thresholds: Mapping[str, float]
    explanation: Explanation
    check: Check  # the query: SQL over the store and the measurement library's views, run in its own schema
    status: str = "stable"
    origin: str = "builtin"
    # False: a risk, not lost time (PR701, memory near the device's limit): its findings claim no loss
    # (lost_fraction null, no category), the waterfall never counts them, and the rule sets their severity.
    claims_loss: bool = True

    @property
    def doc(self) -> str:
        return self.explanation.markdown()

    def category_text(self) -> str:
        if not self.claims_loss:
            return "none (a risk, not lost time)"
        return self.category or "(several)"

    def page(self) -> str:
        """The documentation page (`plasmient-report rules --explain ID`, docs/rules/ID.md)."""
        lines = [
            f"# {self.id} {self.name}",
            "",
            f"{self.title}.",
            "",
            f"Layer: {self.layer} · loss category: {self.category_text()} · status: {self.status}"
            + (f" · from: {self.origin}" if not self.origin.startswith("plasmient_report.") else ""),
            "",
        ]
        lines.append(self.explanation.markdown())
        lines += ["", "## Thresholds", ""]
        for k, v in self.thresholds.items():
            lines.append(f"- `{k}` = {v:g}")
        for k, v in COMMON_THRESHOLDS.items():
            if k not in self.thresholds:
                unused = (
                    "; unused here: its findings claim no lost time" if not self.claims_loss and k == "min_lost_fraction" else ""
                )
                lines.append(f"- `{k}` = {v:g} (every rule{unused})")
        lines += ["", f"Override in a `--rules-config` TOML file: `[{self.id}]` then `name = value`."]
        return "\n".join(lines) + "\n"


def check_doc(rule_id: str, doc: str) -> None:
    """A page must have the four sections, in order, as `## ` headings."""
    Explanation.parse(doc, rule_id)


def rule(
    id: str = "",
    name: str = "",
    layer: str = "",
    title: str = "",
    category: str | None = None,
    thresholds: Mapping[str, float] | None = None,
    explanation: Explanation | None = None,
    status: str = "stable",
    claims_loss: bool = True,
) -> Callable[[Check], Rule]:
    """Decorator: the function is the rule's query (its check). The page is `explanation`, else the function's
    docstring. Built-in rules leave `id`, `name` and `layer` to the code table (codes.py); plugins give them.
    `claims_loss=False`: the rule flags a risk, not lost time (no category; its findings' lost_fraction is null)."""

    def wrap(fn: Check) -> Rule:
        if id and not ID_RE.match(id):
            raise ValueError(f"rule id {id!r} must look like PR101")
        if layer and layer not in LAYERS:
            raise ValueError(f"rule {id}: layer {layer!r} is not one of {', '.join(LAYERS)}")
        if category is not None and not claims_loss:
            raise ValueError(f"rule {id}: a rule that claims no loss has no loss category")
        if category is not None and category not in CATEGORIES:
            raise ValueError(f"rule {id}: category {category!r} is not a loss category")
        if status not in STATUSES:
            raise ValueError(f"rule {id}: status {status!r} is not one of {', '.join(STATUSES)}")
        page = explanation or Explanation.parse(fn.__doc__ or "", id or fn.__name__)
        return Rule(
            id=id,
            name=name or fn.__name__.replace("_", "-"),
            layer=layer,
            title=title,
            category=category,
            thresholds=dict(thresholds or {}),
            explanation=page,
            check=fn,
            status=status,
            origin=fn.__module__,
            claims_loss=claims_loss,
        )

    return wrap
