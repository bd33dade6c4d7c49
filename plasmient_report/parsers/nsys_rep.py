"""`.nsys-rep` reports: use a sibling SQLite export when it is newer, else export one with `nsys`
(on PATH or `$NSYS`) into a cache beside the output — never beside the input — else say the exact command."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ..errors import BadInput

EXPORT_TIMEOUT_S = int(os.environ.get("PLASMIENT_NSYS_EXPORT_TIMEOUT", "1800"))


def nsys_binary() -> str | None:
    env = os.environ.get("NSYS")
    if env and Path(env).exists():
        return env
    return shutil.which("nsys")


def export_command(nsys: str, rep: Path, out: Path) -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--lazy", "false", "--force-overwrite", "true",
            "--output", str(out), str(rep)]


def resolve(rep: Path, cache_dir: Path | None) -> Path:
    """The SQLite export to read for a `.nsys-rep`."""
    sibling = rep.with_suffix(".sqlite")
    if sibling.exists() and sibling.stat().st_mtime >= rep.stat().st_mtime:
        return sibling
    nsys = nsys_binary()
    suggested = export_command("nsys", rep, sibling)
    if nsys is None:
        raise BadInput(rep, "reading a .nsys-rep needs its SQLite export and no `nsys` is on PATH (or $NSYS); "
                            f"run: {shlex.join(suggested)}")
    key = hashlib.sha256(f"{rep.resolve()}:{rep.stat().st_size}:{rep.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(cache_dir or Path.cwd() / ".plasmient-cache") / key
    target = cache / (rep.stem + ".sqlite")
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / (rep.stem + ".partial.sqlite")
    try:
        proc = subprocess.run(export_command(nsys, rep, tmp), capture_output=True, text=True,
                              timeout=EXPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(rep, f"`nsys export` failed ({e}); run: {shlex.join(suggested)}") from None
    if proc.returncode != 0 or not tmp.exists():
        last = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise BadInput(rep, f"`nsys export` failed ({last[0]}); run: {shlex.join(suggested)}")
    os.replace(tmp, target)
    return target
