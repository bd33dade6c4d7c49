"""verdict.json: the stable machine-readable verdict (`plasmient.verdict/1`, every key in docs/verdict.md).

Numbers are written finite or null: a NaN or an infinity that reached the document (a bad FLOP estimate, a division
by a zero window) is unknown, and JSON has no spelling for it that every reader accepts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(x: Any) -> Any:
    """`x` with every NaN / ±Infinity replaced by None, recursively (dicts, lists, tuples)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def dumps(verdict: dict[str, Any]) -> str:
    return json.dumps(finite(verdict), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write(verdict: dict[str, Any], path: Path) -> None:
    Path(path).write_text(dumps(verdict), encoding="utf-8")
