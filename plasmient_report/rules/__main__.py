"""`python -m plasmient_report.rules --write`: regenerate docs/rules/ from the rules; without --write, list what
would change (exit 1 when something would)."""

from __future__ import annotations

import sys
from pathlib import Path

from .docs import pages, write

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"


def main(argv: list[str]) -> int:
    if "--write" in argv:
        for p in write(DOCS):
            print(p)
        return 0
    stale = [n for n, text in pages().items() if not (DOCS / n).exists() or (DOCS / n).read_text(encoding="utf-8") != text]
    for n in stale:
        print(f"docs/rules/{n} is stale")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
