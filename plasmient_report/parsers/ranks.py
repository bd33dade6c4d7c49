"""Rank numbering, in one place: what each format says about the rank of the process it recorded.

A Kineto trace names its rank in `distributedInfo`, else in its file name (`rank3.pt.trace.json.gz`); an
nsys report in the environment it captured (launcher variables, most specific first). Sources that say
nothing keep rank None and the align stage numbers them in input order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

MAX_RANKS = 1 << 20  # a rank or world size beyond this is no rank (a corrupt distributedInfo or environment)

# Environment variables that carry the job rank, most specific first; LOCAL_RANK only as the last resort.
RANK_VARS = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "PALS_RANKID",
    "MV2_COMM_WORLD_RANK",
    "LOCAL_RANK",
)
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def valid_rank(r: object) -> int | None:
    return r if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANKS else None


def valid_world_size(n: object) -> int | None:
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_RANKS else None


def from_filename(path: Path) -> int | None:
    """`…rank3…` / `…rank-3…` / `…rank_3…` in the file name."""
    m = _RANK_IN_NAME.search(path.name)
    return valid_rank(int(m.group(1))) if m and len(m.group(1)) < 8 else None


def _int(s: object) -> int | None:
    try:
        return int(str(s).strip())
    except (TypeError, ValueError):
        return None


def from_env(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(rank, variable) from a process environment, the most specific launcher variable first."""
    for var in RANK_VARS:
        r = valid_rank(_int(env.get(var)))
        if r is not None:
            return r, var
    return None


def world_from_env(env: Mapping[str, str]) -> int | None:
    for var in WORLD_VARS:
        n = valid_world_size(_int(env.get(var)))
        if n is not None:
            return n
    return None
