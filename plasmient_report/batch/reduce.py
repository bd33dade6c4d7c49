"""The reducer: every run's summary rows into the fleet summary — `summary.parquet` (one row per run, per rank, and
per file or folder in no run) and `index.html` (runs ranked by headroom, linking each run's report; failures and
what was not read, with why). Both written atomically."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow.parquet as pq

from .. import scratch
from ..outdir import umask
from . import summary
from .group import Unread
from .mapper import Outcome


def _atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Write through a temporary sibling renamed into place (registered with the run's scratch, so a kill leaves
    nothing the next run does not sweep); the file follows the umask."""
    tmp = path.with_name(f".plasmient-tmp-{path.name}-{uuid.uuid4().hex[:12]}")
    owner = scratch.current()
    if owner is not None:
        owner.register(tmp)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        if owner is not None:
            owner.unregister(tmp)


def reduce(outcomes: Sequence[Outcome], out_dir: Path, title: str, unread: Sequence[Unread] = ()) -> tuple[Path, Path]:
    from ..render import index

    rows = [row for o in outcomes for row in o.rows] + [summary.row_unread(u.path, u.why) for u in unread]
    table = summary.table(rows)
    summary_path, index_path = out_dir / "summary.parquet", out_dir / "index.html"
    _atomic(summary_path, lambda p: pq.write_table(table, p, compression="zstd"))
    ordered = table.to_pylist()
    _atomic(index_path, lambda p: index.write(ordered, p, title))
    return summary_path, index_path
