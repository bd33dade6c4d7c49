"""Output folders: which `--out` may be written or replaced, and the atomic swap that puts a run's outputs there.

The rule (SPEC §1): never delete what the tool did not write. An existing folder is replaced only when it is an
earlier output of this tool — it carries the marker file `.plasmient-output`, which lists the files the tool wrote —
or when it is empty. Anything else is refused in one line (`BadInput`, exit 2): another non-empty folder, a file,
`.`, `~`, `/`, a mount point, a path under a regular file, a read-only file system. The new outputs are rendered in a
staging folder beside the target (registered with the run's scratch, so a killed run's staging is swept) and
swapped in with one rename; nothing of the old folder is left behind under another name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import __version__, scratch
from .errors import BadInput

MARKER = ".plasmient-output"
MARKER_SCHEMA = "plasmient.output/1"
STAGING_PREFIX = ".plasmient-staging-"
# What an output folder of an earlier version (before the marker) holds: accepted as ours when it holds nothing
# else and its verdict.json is a plasmient verdict.
LEGACY_RUN_FILES = frozenset({"verdict.json", "report.html", "trace.pftrace", "run.duckdb", "batch-manifest.json"})
LEGACY_BATCH_ENTRIES = frozenset({"runs", "inputs", "summary.parquet", "index.html", ".plasmient-cache"})


def umask() -> int:
    """This process's umask (read without changing it for long: set and put back at once)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def follow_umask(root: Path) -> None:
    """Folders 0777 and files 0666 less the umask, under `root` (temporary-folder helpers create 0700 / 0600)."""
    mask = umask()
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, 0o666 & ~mask)
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                dirnames.remove(name)


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's content, or None when `folder` has no readable marker of this tool."""
    try:
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != MARKER_SCHEMA or doc.get("kind") not in ("run", "batch", "export"):
        return None
    return doc


def write_marker(folder: Path, kind: str, files: Sequence[str] = ()) -> None:
    doc = {"schema": MARKER_SCHEMA, "tool": "plasmient-report", "version": __version__, "kind": kind, "files": sorted(files)}
    (folder / MARKER).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _is_legacy_run(folder: Path, names: set[str]) -> bool:
    if not names or not names <= LEGACY_RUN_FILES or "verdict.json" not in names:
        return False
    try:
        with open(folder / "verdict.json", encoding="utf-8") as f:
            head = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return '"plasmient.verdict/1"' in head


def _is_legacy_batch(names: set[str]) -> bool:
    return bool(names) and names <= LEGACY_BATCH_ENTRIES and ("runs" in names or "summary.parquet" in names)


def _first_existing(p: Path) -> Path:
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _check_place(out: Path, shown: Path) -> None:
    """Refusals that hold whatever the folder holds: the path itself and where it would be created."""
    if any(part == "~" for part in shown.parts):
        raise BadInput(shown, "a folder named '~' (the shell did not expand it): give the full path")
    resolved = out.resolve()
    if resolved == Path(resolved.anchor):
        raise BadInput(shown, "refusing to write the output into the file-system root; choose another --out")
    try:
        home: Path | None = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no home folder known (a service account): nothing to protect there
        home = None
    if home is not None and (resolved == home or resolved in home.parents):
        raise BadInput(shown, "refusing to write the output over the home folder; choose another --out")
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise BadInput(
            shown, "refusing to write the output over the current folder (or a folder holding it); choose another --out"
        )
    if os.path.islink(out):
        raise BadInput(shown, "is a symbolic link; give the folder itself")
    if os.path.lexists(out):
        if not out.is_dir():
            raise BadInput(shown, "exists and is not a folder; choose another --out")
        if os.path.ismount(out):
            raise BadInput(shown, "is a mount point; choose a folder inside it")
    base = _first_existing(out.parent)
    if not base.is_dir():
        raise BadInput(shown, f"{base} is not a folder, so nothing can be created under it")
    try:
        ro = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
    except OSError:
        ro = False
    if ro:
        raise BadInput(shown, f"{base} is on a read-only file system")
    if not os.access(base, os.W_OK | os.X_OK):
        raise BadInput(shown, f"no permission to write in {base}")
    # What the checks above cannot see (a pseudo file system, an ACL, a full inode table): try it, with an empty
    # folder of our own name that is removed at once.
    probe = base / f".plasmient-probe-{uuid.uuid4().hex[:12]}"
    try:
        os.mkdir(probe)
    except OSError as e:
        raise BadInput(shown, f"cannot create folders in {base} ({e.strerror})") from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def check_run_out(out_dir: Path, inputs: Sequence[Path] = ()) -> Path:
    """The absolute output folder of one run, or BadInput when it must not be written (see the module doc)."""
    shown = Path(out_dir)
    out = Path(os.path.abspath(out_dir))
    _check_place(out, shown)
    for p in inputs:
        r = Path(p).resolve()
        o = out.resolve()
        if o == r or (r.is_dir() and r in o.parents) or o in r.parents:
            raise BadInput(shown, "output folder would be inside or over an input; choose another --out")
    if out.is_dir():
        _check_replaceable(out, shown, "run")
    return out


def check_export_out(out_dir: Path, inputs: Sequence[Path] = ()) -> Path:
    """The absolute folder of an export (`plasmient-report export`), or BadInput: new, empty, or an earlier export
    (replaced whole, like a run's output)."""
    shown = Path(out_dir)
    out = Path(os.path.abspath(out_dir))
    _check_place(out, shown)
    for p in inputs:
        r = Path(p).resolve()
        if out.resolve() == r or out.resolve() in r.parents:
            raise BadInput(shown, "the export folder would replace its own input; choose another folder")
    if out.is_dir():
        _check_replaceable(out, shown, "export")
    return out


def check_batch_out(out_dir: Path) -> Path:
    """The absolute batch output folder (written into, run by run, resumably), or BadInput."""
    shown = Path(out_dir)
    out = Path(os.path.abspath(out_dir))
    _check_place(out, shown)
    if out.is_dir():
        _check_replaceable(out, shown, "batch")
    return out


def _check_replaceable(out: Path, shown: Path, kind: str) -> None:
    try:
        names = {e.name for e in os.scandir(out)}
    except OSError as e:
        raise BadInput(shown, f"cannot read the existing folder ({e.strerror})") from None
    if not names:
        return
    marker = read_marker(out)
    if marker is not None:
        if marker["kind"] != kind:
            what = {"batch": "a batch", "export": "an export"}.get(kind, "a single run")
            raise BadInput(shown, f"is the output of a plasmient-report {marker['kind']}, not of {what}; choose another folder")
        if kind in ("run", "export"):
            listed = set(marker.get("files") or ()) | {MARKER}
            foreign = sorted(names - listed)
            if foreign:
                raise BadInput(
                    shown,
                    f"is an earlier output, but holds files this tool did not write "
                    f"({', '.join(foreign[:3])}{' …' if len(foreign) > 3 else ''}): move them "
                    "or choose another --out",
                )
        return
    if kind == "run" and _is_legacy_run(out, names):
        return
    if kind == "batch" and _is_legacy_batch(names):
        return
    raise BadInput(
        shown,
        "exists and is not an earlier output of plasmient-report (no .plasmient-output marker): "
        "refusing to replace it; choose another --out or remove it yourself",
    )


# ------------------------------------------------------------------------------------------------ the swap


def _made_dirs(parent: Path) -> list[Path]:
    """Create `parent` (and its missing parents, following the umask); return what this call created, deepest
    first. Another process may create the same folders at the same moment (batch workers staging into `runs/`):
    one that appeared meanwhile is theirs, not an error and not ours to remove."""
    missing: list[Path] = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        made.append(d)
    return made[::-1]


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def staging_info(staging: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((staging / "staging.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def recover_staging(staging: Path) -> None:
    """A staging folder a dead run left: put back an old output it was holding mid-swap, then remove it. Only
    folders this module names (`.plasmient-staging-…`) are touched."""
    if not staging.name.startswith(STAGING_PREFIX) or not staging.is_dir() or staging.is_symlink():
        return
    info = staging_info(staging) or {}
    target = info.get("target")
    old = staging / "old"
    if target and old.is_dir() and not os.path.lexists(target):
        with contextlib.suppress(OSError):
            os.rename(old, target)
    shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def staged(out: Path, kind: str = "run") -> Iterator[Path]:
    """Yield an empty folder to render into; on success it becomes `out` (replacing an earlier output, checked
    again now) with its marker, in one rename. On failure or interruption nothing is left: no staging, no folder
    created for it."""
    out = Path(out)
    try:
        made = _made_dirs(out.parent)
    except OSError as e:
        raise BadInput(out, f"cannot create the output folder ({e.strerror})") from None
    staging = out.parent / f"{STAGING_PREFIX}{out.name[:60]}-{uuid.uuid4().hex[:12]}"
    owner = scratch.current()
    if owner is not None:
        owner.register(staging)  # before it exists: a kill at any moment leaves nothing unswept
    try:
        try:
            try:
                os.mkdir(staging)
            except FileNotFoundError:  # a sibling run that failed removed the parent it had made, empty then: again
                made += _made_dirs(out.parent)
                os.mkdir(staging)
        except OSError as e:
            raise BadInput(out, f"cannot create folders in {out.parent} ({e.strerror})") from None
        (staging / "staging.json").write_text(json.dumps({"target": str(out), "pid": os.getpid()}) + "\n", encoding="utf-8")
        new = staging / "new"
        os.mkdir(new)
        yield new
        write_marker(new, kind, [e.name for e in os.scandir(new) if e.name != MARKER])
        follow_umask(new)
        if os.path.lexists(out):
            check = {"run": check_run_out, "export": check_export_out}.get(kind, check_batch_out)
            check(out)  # it may have changed while we analysed
            if not _exchange(new, out):
                os.rename(out, staging / "old")
                os.rename(new, out)
        else:
            os.rename(new, out)
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.lexists(staging):  # e.g. a file in it we may not delete: say so rather than leave it silently
            raise BadInput(staging, "could not remove the staging folder")
    except BaseException:
        recover_staging(staging)
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
    finally:
        if owner is not None:
            owner.unregister(staging)


def remove_output(folder: Path) -> None:
    """Delete an output folder of this tool (a stale batch run); anything without our marker is left alone."""
    if (
        folder.is_dir()
        and not folder.is_symlink()
        and (read_marker(folder) or _is_legacy_run(folder, {e.name for e in os.scandir(folder)}))
    ):
        shutil.rmtree(folder, ignore_errors=True)


def is_special(path: Path) -> str | None:
    """'a FIFO', 'a device', 'a socket' for paths that must never be opened for reading as a file (they block or
    never end); None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None
