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
    # Local-time logs (nvidia-smi): the IANA zone their times were read in (said in the verdict).
    time_zone: str | None = None
    # Counter logs: the effective sampling period (how often the values change), for alignment.
    sample_period_ns: int | None = None
    # What the recorder itself says it lost (CUPTI buffer overflow, dropped records, events not collected):
    # the verdict's coverage reports it. dropped_events when it gives a number.
    incomplete: list[str] = field(default_factory=list)
    dropped_events: int | None = None


@dataclass(frozen=True)
class ParseOptions:
    """What some formats need beyond the file: the zone of local-time logs (None: this machine's zone) and
    the sampling period of logs that print no time (dcgmi dmon, nvidia-smi dmon without -o T)."""

    tz: str | None = None
    dcgm_period_s: float = 1.0


class Parser(Protocol):
    def __call__(self, path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> SourceInfo: ...
