"""verdict.json: the stable machine-readable verdict (`plasmient.verdict/1`, every key in docs/verdict.md), the
typed verdict (`verdict_model.Verdict`) encoded.

Numbers are written finite or null: a NaN or an infinity that reached the verdict (a bad FLOP estimate, a division
by a zero window) is unknown, and JSON has no spelling for it that every reader accepts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..verdict_model import Verdict, to_dict


def finite(x: Any) -> Any:
    """`x` with every NaN / ±Infinity replaced by None, recursively (dicts, lists, tuples)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def document(verdict: Verdict | dict[str, Any]) -> dict[str, Any]:
    """The verdict as the JSON document (plain dicts and lists), finite numbers only."""
    return finite(to_dict(verdict) if isinstance(verdict, Verdict) else verdict)


def dumps(verdict: Verdict | dict[str, Any]) -> str:
    return json.dumps(document(verdict), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write(verdict: Verdict | dict[str, Any], path: Path) -> None:
    Path(path).write_text(dumps(verdict), encoding="utf-8")
