"""What every parser returns about one input file (the `sources` row), the parser signature, and what detection
looks at (`Sniff`) and registers (`Format`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
    # A source with no GPU activity whose format says why (an nsys export recorded without CUDA tracing): the
    # refusal gives this instead of guessing.
    no_gpu_reason: str | None = None


@dataclass(frozen=True)
class ParseOptions:
    """What some formats need beyond the file: the zone of local-time logs (None: this machine's zone) and
    the sampling period of logs that print no time (dcgmi dmon, nvidia-smi dmon without -o T)."""

    tz: str | None = None
    dcgm_period_s: float = 1.0


class Parser(Protocol):
    def __call__(self, path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> SourceInfo: ...


BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Sniff:
    """What detection looks at: the path, its first bytes (decompressed when gzip, a UTF-8 BOM dropped) and
    their text. A parser's `sniff(s)` names the format it recognises, or None."""

    path: Path
    size: int
    head: bytes

    @property
    def text(self) -> str:
        return self.head.decode("utf-8", "replace")

    @property
    def first_line(self) -> str:
        t = self.text
        return t.lstrip().splitlines()[0] if t.strip() else ""

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Format:
    """One input format: its name (the `sources.format` value), a label for messages, how it is read, whether it
    stands alone (a trace) or is placed on a trace (`auxiliary`: counter logs, Nsight Compute), and, for a format
    recognised but not analysed, the one line that says so (then `ingest` is None)."""

    name: str
    label: str
    ingest: Any = None
    auxiliary: bool = False
    refusal: str | None = None
