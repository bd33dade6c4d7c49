"""What every parser returns about one input file (the `sources` row), and the parser signature."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb


@dataclass
class SourceInfo:
    """One input's self-description. `rank` is None when the file holds several ranks (set per row)
    or none is known (then the aligner numbers it by input order)."""

    format: str
    format_version: str | None = None
    rank: int | None = None
    rank_method: str = "order"
    world_size: int | None = None
    base_time_ns: int | None = None
    clock_anchor: str = "native"
    events: int = 0
    host: str | None = None
    gpu_events: int = 0
    multi_rank: bool = False
    notes: list[str] = field(default_factory=list)


class Parser(Protocol):
    def __call__(self, path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> SourceInfo: ...
