"""Reading input bytes safely: gzip with a decompressed-size guard, UTF-8 checks, one clear error."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import threading
import zlib
from pathlib import Path

from ..errors import BadInput

# A decompressed trace larger than this is refused (gzip-bomb guard); override with the env var.
MAX_DECOMPRESSED_BYTES = int(os.environ.get("PLASMIENT_MAX_DECOMPRESSED_BYTES", str(32 << 30)))
# ... and so is one that inflates more than this ratio while being larger than 1 GiB.
MAX_RATIO = 200


def sha256_of(path: Path, limit: int | None = None, stop: threading.Event | None = None) -> str:
    """The file's sha256; for a folder input (an nsys parquetdir / arrowdir export), that of its files' names
    and contents in name order. `stop` set: it gives up (returns "")."""
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for p in files:
        if path.is_dir():
            h.update(p.name.encode() + b"\x00")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                if stop is not None and stop.is_set():
                    return ""
                h.update(chunk)
    return h.hexdigest()


def size_of(path: Path) -> int:
    """Bytes of a file, or of the files of a folder input (an nsys parquetdir / arrowdir export)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_maybe_gzip(path: Path) -> bytes | bytearray:
    """The file's bytes, decompressed if gzip. Pre-sizes the buffer from the gzip trailer to keep peak RSS ~1x."""
    size = path.stat().st_size
    if size == 0:
        raise BadInput(path, "empty file")
    if not is_gzip(path):
        return path.read_bytes()
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END) if size >= 4 else None
        isize = struct.unpack("<I", f.read(4))[0] if size >= 22 else 0
    # The trailer is a hint, not a promise (it is the size mod 4 GiB, and a hostile file can lie): never
    # pre-allocate more than the inflation the guard would let through.
    buf = bytearray(min(isize, MAX_RATIO * size, MAX_DECOMPRESSED_BYTES) if isize else 1 << 20)
    view = memoryview(buf)
    n = 0
    try:
        with gzip.open(path, "rb") as g:
            while True:
                if n == len(buf):
                    view.release()
                    buf.extend(bytes(max(len(buf), 1 << 20)))
                    view = memoryview(buf)
                got = g.readinto(view[n:])
                if not got:
                    break
                n += got
                if n > MAX_DECOMPRESSED_BYTES or (n > (1 << 30) and n > MAX_RATIO * size):
                    raise BadInput(
                        path,
                        f"gzip inflates to more than {n >> 20} MiB (decompressed-size guard; "
                        "set PLASMIENT_MAX_DECOMPRESSED_BYTES to allow it)",
                    )
    except (OSError, EOFError, zlib.error) as e:
        raise BadInput(path, f"corrupt or truncated gzip ({e})") from None
    finally:
        view.release()
    if n < len(buf):
        del buf[n:]
    if n == 0:
        raise BadInput(path, "gzip holds an empty file")
    return buf


class GuardedReader:
    """A binary stream over a plain or gzip file that refuses to inflate past the decompressed-size guard
    and turns gzip errors into BadInput."""

    def __init__(self, path: Path) -> None:
        self.path = path
        size = path.stat().st_size
        if size == 0:
            raise BadInput(path, "empty file")
        self.size = size
        self.gz = is_gzip(path)
        self.f = gzip.open(path, "rb") if self.gz else open(path, "rb")
        self.n = 0

    def read(self, k: int = -1) -> bytes:
        try:
            b = self.f.read(k)
        except (OSError, EOFError, zlib.error) as e:
            raise BadInput(self.path, f"corrupt or truncated gzip ({e})") from None
        self.n += len(b)
        if self.gz and (self.n > MAX_DECOMPRESSED_BYTES or (self.n > (1 << 30) and self.n > MAX_RATIO * self.size)):
            raise BadInput(
                self.path,
                f"gzip inflates to more than {self.n >> 20} MiB (decompressed-size guard; "
                "set PLASMIENT_MAX_DECOMPRESSED_BYTES to allow it)",
            )
        return b

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> GuardedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
