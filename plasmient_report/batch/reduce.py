"""The reducer: every run's summary rows into the fleet summary — `summary.parquet` (one row per run and per
rank) and `index.html` (runs ranked by headroom, linking each run's report). Both written atomically."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from . import summary
from .mapper import Outcome


def _atomic(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def reduce(outcomes: Sequence[Outcome], out_dir: Path, title: str) -> tuple[Path, Path]:
    from ..render import index

    rows = [row for o in outcomes for row in o.rows]
    table = summary.table(rows)
    summary_path, index_path = out_dir / "summary.parquet", out_dir / "index.html"
    _atomic(summary_path, lambda p: pq.write_table(table, p, compression="zstd"))
    ordered = table.to_pylist()
    _atomic(index_path, lambda p: index.write(ordered, p, title))
    return summary_path, index_path
