"""Input formats: detection from content (not only the extension), one registry of the formats, and discovery of
the inputs of one run.

Every parser is a module (or package) exporting `sniff(Sniff) -> format | None` and `FORMATS` (its `Format`s:
name, label, `ingest`, whether it is auxiliary — placed on a trace's clock — or recognised but refused). Adding a
format is one module and one entry in `MODULES`; `detect` asks the modules in that order.
"""

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
from . import dcgm_exporter, dcgmi_dmon, kineto, ncu, nsys, nsys_rep, nvidia_smi_dmon, nvidia_smi_query, nvml_csv
from .base import BOM, Format, ParseOptions, Parser, Sniff, SourceInfo
from .nsys.arrow import export_kind as nsys_export_kind

__all__ = [
    "AUXILIARY",
    "FORMATS",
    "MODULES",
    "PARSERS",
    "Detected",
    "Format",
    "ParseOptions",
    "Parser",
    "SourceInfo",
    "detect",
    "discover",
    "ingest_one",
    "nsys_export_kind",
]

# The registry, in detection order: the report by its suffix, binary exports by their magic, then text formats
# from the most to the least specific first line.
MODULES = (nsys_rep, nsys, kineto, ncu, nvml_csv, dcgmi_dmon, dcgm_exporter, nvidia_smi_dmon, nvidia_smi_query)
FORMATS: dict[str, Format] = {f.name: f for m in MODULES for f in m.FORMATS}
PARSERS: dict[str, Parser] = {n: f.ingest for n, f in FORMATS.items() if f.ingest is not None}
# Formats with no GPU activity of their own (device counters, Nsight Compute): they are placed on a trace's
# clock and kernels by the align stage and cannot stand alone. Their parsers take ParseOptions.
AUXILIARY = frozenset(n for n, f in FORMATS.items() if f.auxiliary)
SUPPORTED = set(PARSERS)
# Nsight Systems exports: the SQLite file, a parquetdir folder, an arrowdir folder or `.arrows` stream (nsys-arrow).
NSYS_EXPORTS = frozenset({"nsys-sqlite", "nsys-parquetdir", "nsys-arrow"})
TRACES = frozenset({"kineto"}) | NSYS_EXPORTS
MAX_FOLDER_DEPTH = 12
HEAD_BYTES = 4096
WHITESPACE_LIMIT = 1 << 20  # leading whitespace skipped to find the first bytes of content


@dataclass(frozen=True)
class Detected:
    path: Path
    format: str


def _head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first `n` bytes of the (decompressed) content after any leading whitespace (and a UTF-8 BOM), looking
    at most WHITESPACE_LIMIT bytes into the file for it."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            raw = f.read(n)
            if raw[:3] == BOM:
                raw = raw[3:]
            skipped = 0
            while raw and not raw.strip() and skipped < WHITESPACE_LIMIT:
                skipped += len(raw)
                raw = f.read(n)
            return raw.lstrip() if skipped else raw
    except (OSError, EOFError, zlib.error) as e:
        if gz:
            raise BadInput(path, f"corrupt or truncated gzip ({e})") from None
        raise


def detect(path: Path) -> str | None:
    """The format of one file (or of a folder that is an nsys parquetdir / arrowdir export), from its content;
    'empty' for an empty file, 'json' for JSON of no known kind; None when it is nothing we know."""
    try:
        st = path.stat()
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        return nsys_export_kind(path)
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO or /dev/zero would block or never end
        raise BadInput(path, "not a regular file (a device, pipe or socket): give trace files or folders")
    if st.st_size == 0:
        return "empty"
    try:
        head = _head(path)
    except PermissionError:
        raise BadInput(path, "permission denied") from None
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror or e})") from None
    s = Sniff(path=path, size=st.st_size, head=head)
    for m in MODULES:
        fmt = m.sniff(s)
        if fmt is not None:
            return fmt
    if path.name.endswith((".json", ".json.gz")) and s.head.lstrip().startswith((b"{", b"[")):
        return "json"
    return None


def _usable(fmt: str | None) -> bool:
    return fmt in SUPPORTED or (fmt == "nsys-rep" and "nsys-sqlite" in SUPPORTED)


def _resolve_reports(found: list[Detected], cache_dir: Path | None) -> list[Detected]:
    """Replace each `.nsys-rep` by its export (sibling, cached, or made now); drop a report whose sibling
    export is also among the inputs, and keep one export of a report given in several (`run.sqlite` and
    `run_pqtdir` in one folder: the SQLite one, else the parquetdir)."""
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
            rank = next(
                i for i, s in enumerate(nsys_rep.sibling_exports(d.path.with_name(stem + ".nsys-rep"))) if s.name == d.path.name
            )
            key = (d.path.resolve().parent, stem)
            if key not in best or rank < best[key][0]:
                best[key] = (rank, d.path)
    keep = {p for _, p in best.values()}
    return [d for d in out if d.format not in NSYS_EXPORTS or nsys_rep.report_stem(d.path) is None or d.path in keep]


def _refusal(p: Path, fmt: str | None) -> str:
    """The one line saying why a file given explicitly cannot be read."""
    if fmt == "empty":
        return "empty file"
    if fmt in ("json", "json-other"):
        return kineto.what_json(p)
    if fmt is None and p.suffix in (".parquet", ".arrow") and nsys_export_kind(p.parent):
        return f"one table of an nsys export: give its folder ({p.parent})"
    if fmt in FORMATS and not _usable(fmt):
        return f"{FORMATS[fmt].label} input is not supported by this version yet"
    if fmt is None and p.name.endswith(".xplane.pb"):
        # what jax.profiler / the TensorFlow profiler (and XProf) write: a protobuf of XPlanes, not a trace we read
        return (
            "a JAX / TensorFlow profiler XPlane (.xplane.pb), not read by this tool: record the program with Nsight "
            "Systems (nsys profile --trace=cuda,nvtx) and give its report"
        )
    return (
        "unrecognised format (expected a PyTorch profiler trace, an nsys export or report, a counter log or an "
        "Nsight Compute CSV)"
    )


def discover(inputs: list[Path], cache_dir: Path | None = None) -> list[Detected]:
    """Expand folders and detect every file. Explicit files must be usable; folder members may be skipped.
    The inputs must be one run: traces of several recordings (the same rank twice) are refused with the runs
    found, and traces of both Kineto and nsys (never one process's) too."""
    found: list[Detected] = []
    from_folder = False
    for p in inputs:
        if not p.exists():
            raise BadInput(p, "no such file or directory")
        if p.is_dir() and (kind := nsys_export_kind(p)) is not None:
            found.append(Detected(p, kind))  # an nsys parquetdir / arrowdir export is one input
        elif p.is_dir():
            from_folder = True
            usable = []
            for m in _walk(p):
                fmt = detect(m)
                if fmt is not None and _usable(fmt):
                    usable.append(Detected(m, fmt))
            if not usable:
                raise BadInput(
                    p,
                    "folder holds no trace this version can read (PyTorch profiler .json/.json.gz, "
                    "nsys .sqlite / .nsys-rep / parquetdir / arrow export, counter logs)",
                )
            found.extend(usable)
        else:
            fmt = detect(p)
            if not _usable(fmt):
                raise BadInput(p, _refusal(p, fmt))
            found.append(Detected(p, fmt))  # type: ignore[arg-type]
    found = _resolve_reports(found, cache_dir)
    seen: set[Path] = set()
    unique = []
    for d in found:
        key = d.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(d)
    traces = [d for d in unique if d.format in TRACES]
    kinds = {"nsys" if d.format in NSYS_EXPORTS else d.format for d in traces}
    if len(kinds) > 1:
        # Kineto and nsys both need CUPTI: one process is never recorded by both, so these are different runs.
        names = ", ".join(sorted(d.path.name for d in traces))
        raise BadInput(
            ", ".join(str(p) for p in inputs),
            f"inputs mix PyTorch-profiler traces and Nsight Systems reports ({names}): they are "
            "different recordings; pass the files of one run",
        )
    if from_folder:
        _one_run(inputs, traces)
    return unique


def _one_run(inputs: list[Path], traces: list[Detected]) -> None:
    """Refuse a folder of several recordings: two Kineto traces that say they are the same rank are two runs.
    Says the runs it found (by folder) and how to pass one, or `batch` for all."""
    from .kineto.sniff import declared_rank

    by_rank: dict[int, list[Path]] = {}
    for d in traces:
        if d.format == "kineto" and (r := declared_rank(d.path)) is not None:
            by_rank.setdefault(r, []).append(d.path)
    dup = {r: ps for r, ps in by_rank.items() if len(ps) > 1}
    if not dup:
        return
    groups: dict[Path, list[str]] = {}
    for d in traces:
        groups.setdefault(d.path.parent, []).append(d.path.name)
    root = inputs[0] if len(inputs) == 1 else Path(os.path.commonpath([str(p) for p in inputs]))
    runs = "; ".join(f"{_rel(folder, root)} ({', '.join(sorted(names))})" for folder, names in sorted(groups.items()))
    r, paths = min(dup.items())
    raise BadInput(
        ", ".join(str(p) for p in inputs),
        f"holds several runs (rank {r} recorded {len(paths)} times): {runs}. Pass one run's files or "
        f"folder, or analyse each with `plasmient-report batch {root}`",
    )


def _rel(p: Path, root: Path) -> str:
    try:
        rel = p.relative_to(root if root.is_dir() else root.parent)
        return "./" if str(rel) == "." else f"{rel}/"
    except ValueError:
        return f"{p}/"


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


def ingest_one(d: Detected, con: duckdb.DuckDBPyConnection, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    """Run the format's parser on one input (counter-log parsers also get the options they need)."""
    fn: Callable[..., SourceInfo] = PARSERS[d.format]
    if d.format in AUXILIARY:
        return fn(d.path, con, source_id, options or ParseOptions())
    return fn(d.path, con, source_id)
