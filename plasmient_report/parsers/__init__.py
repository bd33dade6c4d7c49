"""Input formats: detection from content (not only the extension) and one ingest module per format."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ..errors import BadInput
from . import dcgm_exporter, dcgmi_dmon, kineto, ncu, nsys, nvidia_smi_dmon, nvidia_smi_query, nvml_csv
from ._nsys_arrow import export_kind as nsys_export_kind
from .base import ParseOptions, Parser, SourceInfo

__all__ = ["AUXILIARY", "PARSERS", "Detected", "ParseOptions", "Parser", "SourceInfo", "detect", "discover", "ingest_one"]

# Formats recognised but whose parser lands in a later version: named in the error, never misread.
NOT_YET = {
    "nsys-rep": "Nsight Systems report",
    "ncu-csv": "Nsight Compute CSV",
    "dcgmi-dmon": "dcgmi dmon log",
    "nvidia-smi-dmon": "nvidia-smi dmon log",
    "nvidia-smi-query": "nvidia-smi --query-gpu CSV",
    "nvml-csv": "NVML samples CSV",
    "dcgm-exporter": "dcgm-exporter scrape",
}
# One parser per format: adding a format = one module here and one entry below.
PARSERS: dict[str, Parser] = {"kineto": kineto.ingest, "nsys-sqlite": nsys.ingest,
                              "nsys-parquetdir": nsys.ingest, "nsys-arrow": nsys.ingest,
                              "nvml-csv": nvml_csv.ingest, "nvidia-smi-dmon": nvidia_smi_dmon.ingest,
                              "nvidia-smi-query": nvidia_smi_query.ingest, "dcgmi-dmon": dcgmi_dmon.ingest,
                              "dcgm-exporter": dcgm_exporter.ingest, "ncu-csv": ncu.ingest}
# Formats with no GPU activity of their own (device counters, Nsight Compute): they are placed on a trace's
# clock and kernels by the align stage and cannot stand alone. Their parsers take ParseOptions.
AUXILIARY = frozenset({"nvml-csv", "nvidia-smi-dmon", "nvidia-smi-query", "dcgmi-dmon", "dcgm-exporter", "ncu-csv"})
SUPPORTED = set(PARSERS)
# Nsight Systems exports: the SQLite file, a parquetdir folder, an arrowdir folder or `.arrows` stream (nsys-arrow).
NSYS_EXPORTS = frozenset({"nsys-sqlite", "nsys-parquetdir", "nsys-arrow"})
MAX_FOLDER_DEPTH = 12


@dataclass(frozen=True)
class Detected:
    path: Path
    format: str


def _head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(n)
        except (OSError, EOFError, zlib.error) as e:
            raise BadInput(path, f"corrupt or truncated gzip ({e})") from None
    return raw


def _kineto_keys(head: bytes) -> bool:
    h = head.lstrip()
    return h.startswith(b"{") and any(k in head for k in (b'"schemaVersion"', b'"distributedInfo"',
                                                           b'"deviceProperties"', b'"displayTimeUnit"'))


def detect(path: Path) -> str | None:
    """The format of one file (or of a folder that is an nsys parquetdir / arrowdir export), from its content;
    None when it is nothing we know."""
    try:
        st = path.stat()
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        return nsys_export_kind(path)
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO or /dev/zero would block or never end
        raise BadInput(path, "not a regular file (a device, pipe or socket): give trace files or folders")
    size = st.st_size
    if size == 0:
        return "empty"
    if path.suffix == ".nsys-rep":
        return "nsys-rep"
    try:
        head = _head(path)
    except PermissionError:
        raise BadInput(path, "permission denied") from None
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if (kind := nsys_export_kind(path)) is not None:
        return kind
    if kineto.looks_like_kineto(head) or (path.name.endswith((".json", ".json.gz")) and _kineto_keys(head)):
        return "kineto"
    text = head.decode("utf-8", "replace")
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if first.startswith('"ID","Process ID"') or first.startswith("==PROF==") or ncu.looks_like_ncu(text):
        return "ncu-csv"
    if first.startswith("wall_ns,"):
        return "nvml-csv"
    if first.startswith("#Entity") or first.startswith("# Entity") or dcgmi_dmon.looks_like_dcgmi(first):
        return "dcgmi-dmon"
    if "DCGM_FI_" in text:
        return "dcgm-exporter"
    if (first.startswith("#") and " gpu " in f" {first} " and ("pwr" in first or " sm " in first)) or \
            nvidia_smi_dmon.looks_like_dmon(first):
        return "nvidia-smi-dmon"
    if first.startswith("timestamp,") or first.startswith("timestamp, ") or nvidia_smi_query.looks_headerless(first):
        return "nvidia-smi-query"
    if path.name.endswith((".json", ".json.gz")) and head.lstrip().startswith((b"{", b"[")):
        return "json"
    return None


def _usable(fmt: str | None) -> bool:
    return fmt in SUPPORTED or (fmt == "nsys-rep" and "nsys-sqlite" in SUPPORTED)


def _resolve_reports(found: list[Detected], cache_dir: Path | None) -> list[Detected]:
    """Replace each `.nsys-rep` by its export (sibling, cached, or made now); drop a report whose sibling
    export is also among the inputs, and keep one export of a report given in several (`run.sqlite` and
    `run_pqtdir` in one folder: the SQLite one, else the parquetdir)."""
    from . import nsys_rep

    out: list[Detected] = []
    paths = {d.path.resolve() for d in found}
    for d in found:
        if d.format != "nsys-rep":
            out.append(d)
            continue
        if any(s.resolve() in paths for s in nsys_rep.sibling_exports(d.path)):
            continue  # its export is an input too (a folder holding both): read that
        db = nsys_rep.resolve(d.path, cache_dir)
        if db.resolve() in paths and db.resolve() != d.path.resolve():
            continue
        out.append(Detected(db, nsys_export_kind(db) or "nsys-sqlite"))
    best: dict[tuple[Path, str], tuple[int, Path]] = {}
    for d in out:
        stem = nsys_rep.report_stem(d.path) if d.format in NSYS_EXPORTS else None
        if stem is not None:
            rank = next(i for i, s in enumerate(nsys_rep.sibling_exports(d.path.with_name(stem + ".nsys-rep")))
                        if s.name == d.path.name)
            key = (d.path.resolve().parent, stem)
            if key not in best or rank < best[key][0]:
                best[key] = (rank, d.path)
    keep = {p for _, p in best.values()}
    return [d for d in out if d.format not in NSYS_EXPORTS or nsys_rep.report_stem(d.path) is None or d.path in keep]


def discover(inputs: list[Path], cache_dir: Path | None = None) -> list[Detected]:
    """Expand folders and detect every file. Explicit files must be usable; folder members may be skipped."""
    found: list[Detected] = []
    for p in inputs:
        if not p.exists():
            raise BadInput(p, "no such file or directory")
        if p.is_dir() and (kind := nsys_export_kind(p)) is not None:
            found.append(Detected(p, kind))  # an nsys parquetdir / arrowdir export is one input
        elif p.is_dir():
            members = _walk(p)
            usable = []
            for m in members:
                fmt = detect(m)
                if fmt is not None and _usable(fmt):
                    usable.append(Detected(m, fmt))
            if not usable:
                raise BadInput(p, "folder holds no trace this version can read (PyTorch profiler .json/.json.gz, "
                                  "nsys .sqlite / .nsys-rep / parquetdir / arrow export, counter logs)")
            found.extend(usable)
        else:
            fmt = detect(p)
            if fmt == "empty":
                raise BadInput(p, "empty file")
            if fmt in NOT_YET and not _usable(fmt):
                raise BadInput(p, f"{NOT_YET[fmt]} input is not supported by this version yet")
            if fmt == "json":
                raise BadInput(p, "JSON but not a PyTorch profiler trace (no 'traceEvents' or Kineto key in its first "
                                  "4 KiB)")
            if fmt is None and p.suffix in (".parquet", ".arrow") and nsys_export_kind(p.parent):
                raise BadInput(p, f"one table of an nsys export: give its folder ({p.parent})")
            if fmt is None or not _usable(fmt):
                raise BadInput(p, "unrecognised format (expected a PyTorch profiler trace, an nsys export or report, "
                                  "a counter log or an Nsight Compute CSV)")
            found.append(Detected(p, fmt))
    found = _resolve_reports(found, cache_dir)
    seen: set[Path] = set()
    unique = []
    for d in found:
        key = d.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(d)
    traces = {"nsys" if d.format in NSYS_EXPORTS else d.format for d in unique
              if d.format == "kineto" or d.format in NSYS_EXPORTS}
    if len(traces) > 1:
        # Kineto and nsys both need CUPTI: one process is never recorded by both, so these are different runs.
        names = ", ".join(sorted(d.path.name for d in unique if d.format == "kineto" or d.format in NSYS_EXPORTS))
        raise BadInput(", ".join(str(p) for p in inputs),
                       f"inputs mix PyTorch-profiler traces and Nsight Systems reports ({names}): they are "
                       "different recordings; pass the files of one run")
    return unique


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    visited: set[tuple[int, int]] = set()

    def rec(d: Path, depth: int) -> None:
        if depth > MAX_FOLDER_DEPTH:
            return
        try:
            st = d.stat()
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key in visited:  # symlink loops
            return
        visited.add(key)
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if e.name.startswith("."):
                continue
            p = Path(e.path)
            try:
                if e.is_dir() and nsys_export_kind(p) is not None:
                    out.append(p)  # an nsys parquetdir / arrowdir export: one input, its tables not walked
                elif e.is_dir():
                    rec(p, depth + 1)
                elif e.is_file():
                    out.append(p)
            except OSError:
                continue

    rec(root, 0)
    return out


def ingest_one(d: Detected, con: duckdb.DuckDBPyConnection, source_id: int,
               options: ParseOptions | None = None) -> SourceInfo:
    """Run the format's parser on one input (counter-log parsers also get the options they need)."""
    fn: Callable[..., SourceInfo] = PARSERS[d.format]
    if d.format in AUXILIARY:
        return fn(d.path, con, source_id, options or ParseOptions())
    return fn(d.path, con, source_id)
