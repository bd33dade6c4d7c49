"""verdict.json: the stable machine-readable verdict (`plasmient.verdict/1`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def dumps(verdict: dict[str, Any]) -> str:
    return json.dumps(verdict, indent=2, sort_keys=False, allow_nan=False) + "\n"


def write(verdict: dict[str, Any], path: Path) -> None:
    Path(path).write_text(dumps(verdict), encoding="utf-8")
