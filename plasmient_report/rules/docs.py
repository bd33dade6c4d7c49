"""docs/rules/: one page per built-in rule (`<CODE>.md`, the rule's own page) and an index of the code table,
generated from the rules (`python -m plasmient_report.rules --write`); a test fails when they drift."""

from __future__ import annotations

from pathlib import Path

from .registry import builtin_rules

INDEX_HEAD = """# Rules

Generated from the rules themselves by `python -m plasmient_report.rules --write` (the code table is
`plasmient_report/rules/codes.py`; each rule lives in `plasmient_report/rules/<layer>/<rule_name>.py` and its
fixtures in `tests/rules/<CODE>/`). `plasmient-report rules` prints this table, `plasmient-report rules --explain
CODE` a page; `--select` / `--ignore` pick rules by code, code prefix or name, `--rules-config FILE.toml` sets
thresholds. A preview rule runs only when selected by its own code or name.

| code | name | layer | status | loss category | what it flags |
|---|---|---|---|---|---|
"""


def pages() -> dict[str, str]:
    """File name (relative to docs/rules/) → its text."""
    rules = builtin_rules()
    out = {f"{r.id}.md": r.page() for r in rules}
    out["README.md"] = INDEX_HEAD + "".join(
        f"| [{r.id}]({r.id}.md) | {r.name} | {r.layer} | {r.status} | {r.category_text()} | {r.title} |\n" for r in rules
    )
    return out


def write(folder: Path) -> list[Path]:
    """Write the pages into `folder`; stale pages of codes that no longer exist are removed."""
    folder.mkdir(parents=True, exist_ok=True)
    want = pages()
    for old in folder.glob("*.md"):
        if old.name not in want:
            old.unlink()
    written = []
    for name, text in want.items():
        p = folder / name
        p.write_text(text, encoding="utf-8")
        written.append(p)
    return written
