"""Files into runs: which files of a batch input are one run (the unit the mapper analyses).

`--group-by folder` (default): a run is a folder that directly holds a trace (PyTorch-profiler traces, nsys
`.sqlite`/`.nsys-rep`), with all the traces in it (its ranks); counter logs and Nsight Compute CSVs join the
nearest enclosing run folder. `--group-by prefix`: within a folder, files whose names differ only by a rank
number (`jobA_rank0.pt.trace.json.gz`, `jobA.rank1.…`) are one run, named by the rest (`jobA`); counter logs
join the run whose name starts theirs (`jobA_nvidia_smi.csv`). `--group-by REGEX`: a regular expression
searched in each file's path (relative to the archive root, `/`-separated); its group `run` (or its first
group, or the whole match) names the run; files it does not match belong to no run.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .. import parsers
from ..errors import BadInput, path_text
from ..outdir import is_special
from .archive import JUNK, Source

TRACE_FORMATS = frozenset({"kineto", "nsys-sqlite", "nsys-rep", "nsys-parquetdir", "nsys-arrow"})
TRACE_SUFFIXES = (
    ".pt.trace.json.gz",
    ".pt.trace.json",
    ".trace.json.gz",
    ".trace.json",
    ".json.gz",
    ".json",
    ".sqlite",
    ".nsys-rep",
    ".qdrep",
)
RANK_MARK = re.compile(r"(?i)(?:^|[._-])rank[._-]?\d+")
MAX_DEPTH = 16


@dataclass(frozen=True)
class Run:
    """One run of the batch: what the mapper analyses as one `plasmient-report INPUT...` call."""

    run_id: str  # stable name: `<archive label>/<folder or prefix>`
    slug: str  # its output folder under `runs/`
    inputs: tuple[str, ...]  # paths given to the pipeline: relative to the batch output folder when unpacked there


@dataclass(frozen=True)
class Unread:
    """A file or folder of a batch input that is in no run, and why: listed in summary.parquet and index.html, so
    nothing of an archive disappears silently."""

    path: str  # `<archive label>/<path in it>`
    why: str


@dataclass(frozen=True)
class Grouping:
    runs: list[Run]
    unassigned: list[str]  # traces and logs that no run took (say so; --group-by may fix it)
    unread: list[Unread] = field(default_factory=list)  # those, and folders that could not be read or held no input


@dataclass(frozen=True)
class _File:
    rel: PurePosixPath  # relative to the source root
    role: str  # 'trace' (or unreadable: the run will report it) | 'aux'


def parse_group_by(value: str) -> str | re.Pattern[str]:
    if value in ("folder", "prefix"):
        return value
    try:
        return re.compile(value)
    except re.error as e:
        raise BadInput(None, f"--group-by: not 'folder', 'prefix' or a valid regular expression ({e})") from None


def group(sources: list[Source], group_by: str | re.Pattern[str], out_dir: Path) -> Grouping:
    runs: dict[str, list[str]] = {}
    unassigned: list[str] = []
    unread: list[Unread] = []
    why_loose = (
        "the regular expression of --group-by matches no file of it"
        if isinstance(group_by, re.Pattern)
        else "a counter log or Nsight Compute CSV with no trace of its run to join (see --group-by)"
    )
    for src in sources:
        files, skipped = _scan(src.root)
        unread.extend(Unread(f"{src.label}/{rel}" if rel != "." else src.label, why) for rel, why in skipped)
        if isinstance(group_by, re.Pattern):
            keyed, loose = _by_regex(files, group_by)
        elif group_by == "prefix":
            keyed, loose = _by_prefix(files)
        else:
            keyed, loose = _by_folder(files)
        for key, members in keyed.items():
            run_id = path_text(f"{src.label}/{key}" if key else src.label)  # printable: it is a name in the summary
            paths = [_input_path(src, f.rel, out_dir) for f in members]
            runs.setdefault(run_id, []).extend(paths)
        unassigned.extend(path_text(f"{src.label}/{f.rel}") for f in loose)
        unread.extend(
            Unread(
                path_text(f"{src.label}/{f.rel}"), why_loose if f.role == "aux" else "a trace that no run took (see --group-by)"
            )
            for f in loose
        )
    slugs: set[str] = set()
    out = []
    for run_id in sorted(runs):
        slug = _unique(_slug(run_id), slugs)
        out.append(Run(run_id, slug, tuple(sorted(set(runs[run_id])))))
    return Grouping(out, sorted(unassigned), sorted(unread, key=lambda u: u.path))


def _input_path(src: Source, rel: PurePosixPath, out_dir: Path) -> str:
    p = src.root.joinpath(*rel.parts)
    if src.unpacked:
        # Relative to the batch output: the same text on every executor and node, whatever the --out path.
        return Path(os.path.relpath(p, out_dir)).as_posix()
    return str(p)


def _scan(root: Path) -> tuple[list[_File], list[tuple[str, str]]]:
    """Every trace or log under `root` (sorted), with its role; hidden files and macOS metadata skipped. Also the
    folders that were not searched or held no input, as (path relative to root, why)."""
    out: list[_File] = []
    skipped: list[tuple[str, str]] = []
    root_depth = len(root.parts)

    def rel(d: Path | str) -> str:
        r = Path(d).relative_to(root).as_posix()
        return path_text(r)

    def walk_error(e: OSError) -> None:
        skipped.append((rel(e.filename) if e.filename else ".", f"cannot read ({e.strerror})"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        d = Path(dirpath)
        deep = len(d.parts) - root_depth >= MAX_DEPTH
        visible = sorted(n for n in dirnames if not n.startswith(".") and not JUNK.search(n + "/"))
        if deep and visible:
            skipped.extend((rel(d / n), f"more than {MAX_DEPTH} folders deep: not searched") for n in visible)
        dirnames[:] = [] if deep else visible
        for name in list(dirnames):
            if parsers.nsys_export_kind(d / name) is not None:  # an nsys parquetdir / arrowdir: one trace
                dirnames.remove(name)
                out.append(_File(PurePosixPath((d / name).relative_to(root).as_posix()), "trace"))
        found = 0
        others: list[str] = []
        for name in sorted(filenames):
            if name.startswith(".") or JUNK.search(name):
                continue
            p = d / name
            special = is_special(p)
            if special is not None:
                skipped.append((rel(p), f"{special}: not read"))
                continue
            if not p.is_file():
                continue
            role = _role(p)
            if role is not None:
                found += 1
                out.append(_File(PurePosixPath(p.relative_to(root).as_posix()), role))
            else:
                others.append(path_text(name))
        if not found and others and not dirnames:
            shown = ", ".join(others[:3]) + (" …" if len(others) > 3 else "")
            skipped.append(
                (rel(d), f"no trace or counter log among its {len(others)} file{'s' if len(others) != 1 else ''} ({shown})")
            )
    return out, skipped


def _role(p: Path) -> str | None:
    try:
        fmt = parsers.detect(p)
    except BadInput:
        return "trace"  # unreadable or corrupt: it still makes (or joins) a run, which then reports the error
    if fmt in TRACE_FORMATS:
        return "trace"
    if fmt in parsers.AUXILIARY:
        return "aux"
    if fmt == "empty" and p.name.lower().endswith(TRACE_SUFFIXES):
        return "trace"
    return None  # READMEs, run_info.json, machine notes: not inputs


def _by_folder(files: list[_File]) -> tuple[dict[str, list[_File]], list[_File]]:
    run_dirs = {f.rel.parent for f in files if f.role == "trace"}
    keyed: dict[str, list[_File]] = {}
    loose: list[_File] = []
    for f in files:
        home = next((d for d in (f.rel.parent, *f.rel.parent.parents) if d in run_dirs), None)
        if home is None:
            loose.append(f)
        else:
            keyed.setdefault("" if str(home) == "." else home.as_posix(), []).append(f)
    return keyed, loose


def run_prefix(name: str) -> str:
    """`jobA_rank3.pt.trace.json.gz` → `jobA`; `rank0.pt.trace.json.gz` → ``; `nsys_ddp.sqlite` → `nsys_ddp`."""
    low = name.lower()
    stem = next((name[: -len(s)] for s in TRACE_SUFFIXES if low.endswith(s)), name)
    return RANK_MARK.sub("", stem).strip("._- ")


def _by_prefix(files: list[_File]) -> tuple[dict[str, list[_File]], list[_File]]:
    keyed: dict[str, list[_File]] = {}
    loose: list[_File] = []
    prefixes: dict[PurePosixPath, set[str]] = {}
    for f in files:
        if f.role == "trace":
            prefixes.setdefault(f.rel.parent, set()).add(run_prefix(f.rel.name))
    for f in files:
        folder = f.rel.parent
        if f.role == "trace":
            prefix = run_prefix(f.rel.name)
        else:
            matches = [p for p in prefixes.get(folder, ()) if p and re.match(re.escape(p) + r"([._-]|$)", f.rel.name)]
            if not matches:
                loose.append(f)
                continue
            prefix = max(matches, key=len)
        parts = [x for x in (("" if str(folder) == "." else folder.as_posix()), prefix) if x]
        keyed.setdefault("/".join(parts), []).append(f)
    return keyed, loose


def _by_regex(files: list[_File], rx: re.Pattern[str]) -> tuple[dict[str, list[_File]], list[_File]]:
    keyed: dict[str, list[_File]] = {}
    loose: list[_File] = []
    for f in files:
        m = rx.search(f.rel.as_posix())
        if m is None:
            loose.append(f)
            continue
        key = m.group("run") if "run" in rx.groupindex else (m.group(1) if rx.groups else m.group(0))
        keyed.setdefault((key or "").strip("/"), []).append(f)
    return keyed, loose


def _slug(run_id: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id.replace("/", "__")).lstrip("._") or "run"
    if len(s) > 120:
        s = s[:100] + "-" + hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return s


def _unique(slug: str, used: set[str]) -> str:
    # Case-insensitive: two runs must not share a folder on a case-insensitive file system either.
    cand, n = slug, 2
    while cand.lower() in used:
        cand, n = f"{slug}-{n}", n + 1
    used.add(cand.lower())
    return cand
