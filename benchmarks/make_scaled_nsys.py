"""Build a long Nsight Systems export by replicating a real one: a SCALED REAL export, not a new recording.

The source's whole capture (kernels, runtime calls, memcpy / memset / sync, NVTX ranges and the GPU_METRICS
samples) is appended N times, each copy shifted in time after the previous one, with fresh correlation ids —
so the result reads like one capture N times as long, with N times the GPU-metric rows. Metadata (strings,
devices, processes, enums) is kept once; ANALYSIS_DETAILS is stretched to cover the copies.

    python benchmarks/make_scaled_nsys.py [SOURCE.sqlite] [--metric-rows 20e6 | --copies N] [-o OUT.sqlite]

Default source: /work/shared/corpus/h200-single-nsys/nsys_workload.sqlite (an H200 capture with GPU metrics at
10 kHz, 448,602 GPU_METRICS rows). Output defaults to .bench_data/ (git-ignored: never commit it).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = Path("/work/shared/corpus/h200-single-nsys/nsys_workload.sqlite")
# Tables whose rows are events in time: (table, time columns, id columns made unique per copy).
EVENT_TABLES = [
    ("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end"), ("correlationId",)),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "end"), ("correlationId",)),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", ("start", "end"), ("correlationId",)),
    ("CUPTI_ACTIVITY_KIND_MEMSET", ("start", "end"), ("correlationId",)),
    ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", ("start", "end"), ("correlationId",)),
    ("NVTX_EVENTS", ("start", "end"), ()),
    ("GPU_METRICS", ("timestamp", "rawTimestamp"), ()),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--metric-rows", type=float, default=20e6, help="aim for this many GPU_METRICS rows")
    g.add_argument("--copies", type=int)
    ap.add_argument("-o", "--out", type=Path)
    a = ap.parse_args()
    src = sqlite3.connect(f"file:{a.source}?mode=ro", uri=True)
    n_metrics = src.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0]
    if not n_metrics:
        raise SystemExit(f"{a.source}: no GPU_METRICS rows to scale (record with --gpu-metrics-devices)")
    copies = a.copies or max(1, round(a.metric_rows / n_metrics))
    out = a.out or ROOT / ".bench_data" / f"{a.source.stem}.x{copies}.sqlite"
    out.parent.mkdir(parents=True, exist_ok=True)
    tables = {t for (t,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    lo, hi = None, None
    max_corr = 0
    for t, (s, e), ids in EVENT_TABLES:
        if t not in tables:
            continue
        a_lo, a_hi = src.execute(f'SELECT min("{s}"), max("{e}") FROM "{t}" WHERE "{s}" > 0').fetchone()
        if a_lo is not None:
            lo = a_lo if lo is None else min(lo, a_lo)
            hi = a_hi if hi is None else max(hi, a_hi)
        for c in ids:
            max_corr = max(max_corr, src.execute(f'SELECT coalesce(max("{c}"), 0) FROM "{t}"').fetchone()[0])
    src.close()
    assert lo is not None and hi is not None
    span = (hi - lo) + 1_000_000  # 1 ms between copies
    t0 = time.time()
    tmp = out.with_suffix(".partial")
    shutil.copyfile(a.source, tmp)
    db = sqlite3.connect(tmp)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    for t, times, ids in EVENT_TABLES:
        if t not in tables:
            continue
        cols = [r[1] for r in db.execute(f'PRAGMA table_info("{t}")')]
        (n0,) = db.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()
        if n0 is None:
            continue
        for k in range(1, copies):
            sel = ", ".join(
                f'"{c}" + {k * span}' if c in times else f'"{c}" + {k * (max_corr + 1)}' if c in ids else f'"{c}"' for c in cols
            )
            db.execute(
                f'INSERT INTO "{t}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                f'SELECT {sel} FROM "{t}" WHERE rowid <= {n0}'
            )
        db.commit()
    if "ANALYSIS_DETAILS" in tables:
        db.execute(
            f"UPDATE ANALYSIS_DETAILS SET duration = duration + {(copies - 1) * span}, "
            f"stopTime = stopTime + {(copies - 1) * span}"
        )
        db.commit()
    (rows,) = db.execute("SELECT count(*) FROM GPU_METRICS").fetchone()
    (kernels,) = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    db.close()
    tmp.replace(out)
    print(
        f"{out}: {copies} copies of {a.source.name}: {rows:,} GPU_METRICS rows, {kernels:,} kernels, "
        f"{out.stat().st_size / 2**20:,.1f} MiB ({time.time() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
