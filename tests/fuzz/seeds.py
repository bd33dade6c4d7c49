"""Fuzz seeds: the committed real recordings, cut down to a few hundred events so that one run takes a blink.

Each family (one per parser) has one or more seeds: (file name, bytes). The file name matters, since detection
looks at the extension too. Seeds are built once per process from `sample_traces/` and `tests/data/`.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
DATA = ROOT / "tests" / "data"
SEED_DIR = DATA / "fuzz_seeds"

FAMILIES = ("kineto", "nsys", "nvml", "smi_dmon", "smi_query", "dcgmi", "exporter", "ncu")
# Families whose files cannot stand alone (counter logs, Nsight Compute): they are fuzzed beside a trace.
AUXILIARY = frozenset({"nvml", "smi_dmon", "smi_query", "dcgmi", "exporter", "ncu"})

KINETO_KERNELS = 60  # GPU events kept from a Kineto trace
KINETO_MAX_EVENTS = 400
NSYS_KERNELS = 120  # kernels kept from an nsys export (other tables cut at the same time)
TEXT_LINES = 80  # lines kept from a counter log


def _kineto_cut(path: Path) -> bytes:
    """The trace's head keys, its metadata events, and the events overlapping the window of its first kernels."""
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    # skip the warm-up: start at the middle kernel, so that steps and collectives are in the window
    gpu = gpu[len(gpu) // 2 :][:KINETO_KERNELS]
    lo = gpu[0]["ts"] - 2000.0
    hi = max(e["ts"] + e.get("dur", 0) for e in gpu)
    kept: list[dict[str, Any]] = []
    for e in events:
        if e.get("ph") == "M" or not isinstance(e.get("ts"), (int, float)):
            continue
        if e["ts"] < hi and e["ts"] + (e.get("dur") or 0) > lo:
            kept.append(e)
    kept.sort(key=lambda e: (e.get("cat") not in ("kernel", "gpu_memcpy", "user_annotation", "cuda_runtime"), e["ts"]))
    doc["traceEvents"] = meta + sorted(kept[:KINETO_MAX_EVENTS], key=lambda e: e["ts"])
    return json.dumps(doc).encode()


def _nsys_cut(path: Path) -> bytes:
    """A copy with every event table cut at the end of its NSYS_KERNELS-th kernel, vacuumed."""
    tmp = Path(tempfile.mkdtemp(prefix="plasmient-seed-"))
    try:
        db = tmp / "cut.sqlite"
        shutil.copyfile(path, db)
        con = sqlite3.connect(db)
        ((t_cut,),) = con.execute(
            f'SELECT max("end") FROM (SELECT "end" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT {NSYS_KERNELS})'
        ).fetchall()
        tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            cols = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
            if "start" in cols:
                con.execute(f'DELETE FROM "{t}" WHERE start > ?', [t_cut])
            elif "timestamp" in cols and t != "DIAGNOSTIC_EVENT":
                con.execute(f'DELETE FROM "{t}" WHERE timestamp > ?', [t_cut])
        con.commit()
        con.execute("VACUUM")
        con.close()
        return db.read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _head_lines(path: Path, n: int = TEXT_LINES) -> bytes:
    return b"\n".join(path.read_bytes().splitlines()[:n]) + b"\n"


@functools.cache
def seeds(family: str) -> tuple[tuple[str, bytes], ...]:
    """The seeds of one family: (file name, bytes)."""
    if family == "kineto":
        return (
            ("rank0.pt.trace.json", _kineto_cut(SAMPLES / "h200x2_ddp/kineto/rank0.pt.trace.json.gz")),
            ("kineto_single.pt.trace.json", _kineto_cut(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz")),
        )
    if family == "nsys":
        return (("nsys_ddp.sqlite", _nsys_cut(SAMPLES / "h200x2_ddp/nsys/nsys_ddp.sqlite")),)
    if family == "nvml":
        return (("nvml_samples.csv", _head_lines(SAMPLES / "h200_single/nvml_samples.csv")),)
    if family == "smi_dmon":
        return (("nvidia_smi_dmon.txt", _head_lines(SAMPLES / "h200_single/nvidia_smi_dmon.txt")),)
    if family == "smi_query":
        return (("nvidia_smi_query.csv", _head_lines(SAMPLES / "h200_single/nvidia_smi_query.csv")),)
    if family == "dcgmi":
        return tuple((p.name, p.read_bytes()) for p in sorted(DATA.glob("dcgmi_dmon_*.txt")))
    if family == "exporter":
        return tuple((p.name, p.read_bytes()) for p in sorted(DATA.glob("dcgm_exporter_*")))
    if family == "ncu":
        return tuple((p.name, p.read_bytes()) for p in sorted(SEED_DIR.glob("ncu_*.csv")))
    raise KeyError(family)


@functools.cache
def companion_trace() -> tuple[str, bytes]:
    """The (unmutated) trace an auxiliary file is analysed beside: the cut single-GPU Kineto trace, whose
    recording the counter-log samples come from."""
    return seeds("kineto")[1]


def place_inputs(folder: Path, name: str, data: bytes, family: str, full: bool) -> list[Path]:
    """Write one (mutated) input into `folder`; a counter log run through the whole job gets its trace beside it.
    Returns the inputs, the trace first."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_bytes(data)
    inputs = [p]
    if family in AUXILIARY and full:
        tname, tdata = companion_trace()
        (folder / tname).write_bytes(tdata)
        inputs.insert(0, folder / tname)
    return inputs
