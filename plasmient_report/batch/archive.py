"""Batch inputs: a folder is read in place; a `.tar`, `.tar.gz`/`.tgz`, `.tar.zst`, `.tar.bz2`/`.tar.xz` or `.zip`
is unpacked safely into a work folder under the batch output (never into or beside the archive).

Safe means: only regular files and folders are written (symlinks, hard links and devices are skipped), every
member's path is rebuilt from its own parts (no absolute paths, no `..`), and the unpacked size is capped (a
total and the free disk left), so a hostile or broken archive fails with one line instead of escaping or filling
the disk. An archive already unpacked (same sha256) is not unpacked again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from .. import scratch
from ..errors import BadInput
from ..outdir import follow_umask, is_special

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".zip")
DEFAULT_MAX_UNPACKED_BYTES = 64 << 30  # all archives of one batch together
MIN_FREE_BYTES = 1 << 30  # never leave less than this free on the output's disk
MAX_MEMBERS = 200_000
JUNK = re.compile(r"(^|/)(__MACOSX(/|$)|\._|\.DS_Store$)")  # macOS metadata that zip tools add
STAMP = ".plasmient-unpacked.json"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Source:
    """One ARCHIVE argument, ready to be grouped into runs."""

    label: str  # a name for it, unique in the batch (the archive's or folder's name without suffixes)
    root: Path  # the folder that holds its files (the folder itself, or where the archive was unpacked)
    given: Path  # the path the user gave
    unpacked: bool  # True when `root` is our copy under the batch output


@dataclass
class Budget:
    """What all archives of one batch may unpack together, and what is left of it."""

    limit_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
    left_bytes: int = -1

    def __post_init__(self) -> None:
        if self.left_bytes < 0:
            self.left_bytes = self.limit_bytes


def label_of(path: Path) -> str:
    name = path.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "archive"


def kind_of(path: Path) -> str | None:
    """'folder', 'zip', 'tar' (any compression tarfile reads), 'tar.zst', or None when it is no archive.
    From the content, so a misnamed archive still opens and a gzipped trace is not taken for a tarball."""
    if path.is_dir():
        return "folder"
    special = is_special(path)
    if special is not None:  # opening a FIFO blocks, a device never ends: refused, never read
        raise BadInput(path, f"is {special}, not a folder or an archive of runs")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip" if zipfile.is_zipfile(path) else None
    if head == _ZSTD_MAGIC:
        try:
            with _zstd_reader(path) as r:
                block = r.read(512)
        except Exception:  # noqa: BLE001 — any decoder error means "not a readable .tar.zst"
            return None
        return "tar.zst" if _is_tar_header(block) else None
    try:
        return "tar" if tarfile.is_tarfile(path) else None
    except (OSError, EOFError, tarfile.TarError):
        return None


def _is_tar_header(block: bytes) -> bool:
    return len(block) >= 263 and block[257:262] == b"ustar"


@contextmanager
def _zstd_reader(path: Path) -> Iterator[IO[bytes]]:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - a core dependency
        raise BadInput(path, ".tar.zst needs the `zstandard` package (pip install zstandard)") from None
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        yield r  # type: ignore[misc]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def open_sources(paths: list[Path], work_dir: Path, budget: Budget | None = None) -> list[Source]:
    """Each ARCHIVE argument as a Source; archives unpacked under `work_dir` (one folder per archive)."""
    budget = budget or Budget()
    out: list[Source] = []
    used: set[str] = set()
    for given in paths:
        if not given.exists():
            raise BadInput(given, "no such file or directory")
        kind = kind_of(given)
        if kind is None:
            raise BadInput(
                given,
                "not a folder or an archive of runs (.tar, .tar.gz, .tar.zst, .zip); for one run use `plasmient-report INPUT...`",
            )
        label = label_of(given.resolve() if kind == "folder" else given)
        base, n = label, 2
        while label in used:
            label, n = f"{base}-{n}", n + 1
        used.add(label)
        if kind == "folder":
            out.append(Source(label, given.resolve(), given, unpacked=False))
        else:
            out.append(Source(label, unpack(given, kind, work_dir / label, budget), given, unpacked=True))
    return out


def unpack(archive: Path, kind: str, dest: Path, budget: Budget) -> Path:
    """Unpack into `dest` (replaced atomically); reuse it when the archive's sha256 is the one unpacked there."""
    digest = sha256_file(archive)
    stamp = dest / STAMP
    with contextlib.suppress(OSError, ValueError):  # no stamp, or a broken one: unpack again
        if json.loads(stamp.read_text(encoding="utf-8")).get("sha256") == digest:
            return _content_root(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".plasmient-unpack-{dest.name[:60]}-{uuid.uuid4().hex[:12]}"
    owner = scratch.current()
    if owner is not None:
        owner.register(tmp)  # a killed batch leaves no half-unpacked copy: the next run's sweep removes it
    try:
        os.mkdir(tmp)
        if kind == "zip":
            _unpack_zip(archive, tmp, budget)
        elif kind == "tar.zst":
            with _zstd_reader(archive) as r, tarfile.open(fileobj=r, mode="r|") as tf:
                _unpack_tar(archive, tf, tmp, budget)
        else:
            with tarfile.open(archive, mode="r|*") as tf:
                _unpack_tar(archive, tf, tmp, budget)
        (tmp / STAMP).write_text(json.dumps({"archive": archive.name, "sha256": digest}) + "\n", encoding="utf-8")
        follow_umask(tmp)
        if dest.exists():
            shutil.rmtree(dest)  # our own earlier copy (under the batch output), of another archive content
        os.replace(tmp, dest)
    except BadInput:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BadInput(
            archive, f"cannot unpack ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'corrupt'})"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if owner is not None:
            owner.unregister(tmp)
    return _content_root(dest)


def _content_root(dest: Path) -> Path:
    """Archives usually wrap everything in one top folder (`fleet/…`): run names start below it."""
    entries = [e for e in os.scandir(dest) if not e.name.startswith(".") and not JUNK.search(e.name)]
    if len(entries) == 1 and entries[0].is_dir(follow_symlinks=False):
        return Path(entries[0].path)
    return dest


def safe_member_path(name: str) -> PurePosixPath | None:
    """The member's path rebuilt from its parts, or None when it must not be written (absolute, `..`, junk)."""
    name = name.replace("\\", "/")
    if "\x00" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or JUNK.search("/".join(parts)):
        return None
    return PurePosixPath(*parts)


def _target(root: Path, rel: PurePosixPath) -> Path:
    target = root.joinpath(*rel.parts)
    # Parents we created are real folders (links are never written), so this holds; checked all the same.
    if root.resolve() not in target.resolve().parents:
        raise BadInput(None, f"archive member {rel} would land outside the unpack folder")
    return target


def _copy(src: IO[bytes], target: Path, archive: Path, budget: Budget, declared: int) -> None:
    if declared > budget.left_bytes:
        raise BadInput(archive, f"unpacks to more than the size limit ({_gib(budget.limit_bytes)}; raise --max-unpacked-gib)")
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(target, "wb") as f:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > budget.left_bytes:  # a lying header (zip bomb) is caught by what is really written
                raise BadInput(
                    archive, f"unpacks to more than the size limit ({_gib(budget.limit_bytes)}; raise --max-unpacked-gib)"
                )
            f.write(chunk)
            if written % (64 << 20) < len(chunk) and shutil.disk_usage(target.parent).free < MIN_FREE_BYTES:
                raise BadInput(archive, f"unpacking would leave less than {_gib(MIN_FREE_BYTES)} free on {target.parent}")
    budget.left_bytes -= written


def _gib(n: int) -> str:
    return f"{n / (1 << 30):g} GiB"


def _unpack_tar(archive: Path, tf: tarfile.TarFile, root: Path, budget: Budget) -> None:
    for count, m in enumerate(tf):
        if count >= MAX_MEMBERS:
            raise BadInput(archive, f"more than {MAX_MEMBERS} members")
        if not m.isfile():  # folders are made as needed; links, devices and fifos are never written
            continue
        rel = safe_member_path(m.name)
        if rel is None:
            continue
        src = tf.extractfile(m)
        if src is None:
            continue
        with src:
            _copy(src, _target(root, rel), archive, budget, m.size)


def _unpack_zip(archive: Path, root: Path, budget: Budget) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise BadInput(archive, f"more than {MAX_MEMBERS} members")
        for info in infos:
            if info.is_dir() or stat.S_ISLNK(info.external_attr >> 16):
                continue
            if info.flag_bits & 0x1:
                raise BadInput(archive, f"{info.filename} is encrypted")
            rel = safe_member_path(info.filename)
            if rel is None:
                continue
            with zf.open(info) as src:
                _copy(src, _target(root, rel), archive, budget, info.file_size)
