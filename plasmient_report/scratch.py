"""The run's scratch folder: every temporary file of a run lives under one folder that the next run sweeps when its
owner is dead — the NDJSON segments of the Kineto reader, DuckDB's spill files, SQLite's and `nsys export`'s
temporary files (TMPDIR points here while the run lives), and, by registration, the staging folders a run keeps
beside its `--out`.

Layout: `$TMPDIR/plasmient-<uid>/<id>.lock` (the owner: pid, process start time, registered paths; held with an
exclusive `flock` for the life of the run) and `$TMPDIR/plasmient-<uid>/<id>/` (the files). The lock is created
first and removed last, so a folder without its lock is always a leftover. A lock that can be taken, whose process
is gone (or is another process with the same pid), belongs to a dead run: its folder and its registered paths are
removed. SIGKILL leaves nothing that survives the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

YOUNG_S = 60.0  # a lock file younger than this with no owner written yet is being created: leave it
_current: Scratch | None = None
_lock = threading.Lock()


def _system_tmp() -> Path:
    # The system's temporary folder as it was before any run redirected `tempfile.tempdir`.
    return Path(_SYSTEM_TMP)


# Child processes of a run (batch workers) inherit TMPDIR pointing into the parent's scratch folder; they keep their
# own scratch beside the parent's, in the system's temporary folder, which the parent passes on here.
SYSTEM_TMP_ENV = "PLASMIENT_SYSTEM_TMPDIR"
_SYSTEM_TMP = os.environ.get(SYSTEM_TMP_ENV) or tempfile.gettempdir()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, it names one
    process even after the pid is reused. None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int, started: int | None) -> bool:
    """True when process `pid` exists and (when known) is the one that started at `started`."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    state = _state(pid)
    if state in ("Z", "X"):  # a zombie (its parent died and nobody reaped it yet) runs no more code: dead
        return False
    if started is None:
        return True
    now = start_time(pid)
    return now is None or now == started


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode() if fields else None


def root() -> Path:
    """This user's scratch root (created 0700). When the usual one is unusable (another user's, a link), a fresh
    private one is made — it is then not shared with other runs, so nothing is swept there."""
    base = _system_tmp() / f"plasmient-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    try:
        with contextlib.suppress(FileExistsError):  # already there: its kind and owner are checked below
            os.mkdir(base, 0o700)
    except OSError:
        return Path(tempfile.mkdtemp(prefix="plasmient-", dir=_system_tmp()))
    st = os.lstat(base)
    import stat as _stat

    if not _stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return Path(tempfile.mkdtemp(prefix="plasmient-", dir=_system_tmp()))
    return base


class Scratch:
    """One run's scratch folder. Create with `Scratch.create()`; `close()` removes it and what it registered."""

    def __init__(self, base: Path, run_id: str, fd: int) -> None:
        self.base = base
        self.id = run_id
        self.path = base / run_id
        self.lock_path = base / f"{run_id}.lock"
        self._fd = fd
        self._registered: list[str] = []
        self._mutex = threading.Lock()
        self.closed = False

    @classmethod
    def create(cls, base: Path | None = None) -> Scratch:
        base = base or root()
        sweep(base)
        run_id = f"run-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        lock_path = base / f"{run_id}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        s = cls(base, run_id, fd)
        s._write_owner()
        os.mkdir(s.path, 0o700)
        return s

    def _write_owner(self) -> None:
        doc = {"pid": os.getpid(), "start_time": start_time(os.getpid()), "created": time.time(), "registered": self._registered}
        data = (json.dumps(doc) + "\n").encode()
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, data)

    def register(self, path: Path) -> None:
        """A path outside the scratch folder that a dead run's sweep must remove (a staging folder beside `--out`,
        an atomic-write temporary file). Its name must start with `.plasmient-`: the sweep removes nothing else."""
        with self._mutex:
            self._registered.append(str(Path(path).absolute()))
            self._write_owner()

    def unregister(self, path: Path) -> None:
        with self._mutex:
            p = str(Path(path).absolute())
            if p in self._registered:
                self._registered.remove(p)
                self._write_owner()

    def mkdtemp(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.path))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for p in list(self._registered):
            _remove_registered(Path(p))
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.lock_path.unlink()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _remove_registered(p: Path) -> None:
    from .outdir import STAGING_PREFIX, recover_staging

    if not p.name.startswith(".plasmient-"):
        return  # never anything the tool did not name
    if p.name.startswith(STAGING_PREFIX):
        recover_staging(p)
    elif p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def _owner_dead(lock_path: Path) -> dict[str, Any] | None:
    """The owner record of a lock whose run is dead, else None (alive, being created, or not ours)."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # held: the run lives
            except OSError:
                pass  # no flock on this file system: the pid decides
        raw = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        try:
            young = time.time() - lock_path.stat().st_mtime < YOUNG_S
        except OSError:
            return None
        return None if young else {"registered": []}
    pid, started = doc.get("pid"), doc.get("start_time")
    if isinstance(pid, int) and alive(pid, started if isinstance(started, int) else None):
        return None
    return doc


def sweep(base: Path | None = None) -> list[Path]:
    """Remove what dead runs left under `base` (and the paths they registered). Returns what was removed."""
    base = base or root()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    names = {e.name for e in entries}
    for e in entries:
        if e.name.endswith(".lock") and e.is_file(follow_symlinks=False):
            doc = _owner_dead(Path(e.path))
            if doc is None:
                continue
            for p in doc.get("registered") or []:
                if isinstance(p, str):
                    _remove_registered(Path(p))
            run_dir = base / e.name[: -len(".lock")]
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(e.path)
            removed.append(run_dir)
        elif e.name.startswith("run-") and e.is_dir(follow_symlinks=False) and f"{e.name}.lock" not in names:
            # Its lock is gone (created first, removed last) — unless the listing missed a lock made while it was
            # read (a directory read is no snapshot): asked again now, a run being created keeps its folder.
            if os.path.lexists(base / f"{e.name}.lock"):
                continue
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(Path(e.path))
    removed += _sweep_legacy()
    return removed


def _sweep_legacy() -> list[Path]:
    """Spill folders of earlier versions (`$TMPDIR/plasmient-spill-<pid>-…`) whose process is gone."""
    removed = []
    with contextlib.suppress(OSError):
        for e in os.scandir(_system_tmp()):
            if e.name.startswith("plasmient-spill-") and e.is_dir(follow_symlinks=False):
                parts = e.name.split("-")
                if len(parts) >= 3 and parts[2].isdigit() and not alive(int(parts[2]), None):
                    shutil.rmtree(e.path, ignore_errors=True)
                    removed.append(Path(e.path))
    return removed


def current() -> Scratch | None:
    """The scratch folder of the run in progress in this process (None outside a run)."""
    return _current


@contextmanager
def active(s: Scratch) -> Iterator[Scratch]:
    """Make `s` the run's scratch: `tempfile` and child processes (TMPDIR) put their files in it."""
    global _current
    with _lock:
        prev, prev_tempdir, prev_env = _current, tempfile.tempdir, os.environ.get("TMPDIR")
        tmp = s.path / "tmp"
        tmp.mkdir(exist_ok=True)
        _current, tempfile.tempdir = s, str(tmp)
        os.environ.setdefault(SYSTEM_TMP_ENV, _SYSTEM_TMP)
        os.environ["TMPDIR"] = str(tmp)
    try:
        yield s
    finally:
        with _lock:
            _current, tempfile.tempdir = prev, prev_tempdir
            if prev_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = prev_env


@contextmanager
def run() -> Iterator[Scratch]:
    """A scratch folder for one run (sweeping dead runs' first), active while the block runs, removed after it —
    whether it ends, fails or is interrupted. Inside a run already, that run's folder is used."""
    if _current is not None and not _current.closed:
        yield _current
        return
    s = Scratch.create()
    try:
        with active(s):
            yield s
    finally:
        s.close()
