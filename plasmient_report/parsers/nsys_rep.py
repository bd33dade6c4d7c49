"""`.nsys-rep` reports: use a sibling export (SQLite, else parquetdir / arrowdir / arrow stream) when it is
newer, else export one with `nsys` (on PATH or `$NSYS`) into a cache beside the output — never beside the
input — else say the exact command."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ..errors import BadInput
from .base import Format, Sniff

EXPORT_TIMEOUT_S = int(os.environ.get("PLASMIENT_NSYS_EXPORT_TIMEOUT", "1800"))
# What `nsys export` names a report's exports (its defaults: `<report>.sqlite`, `<report>_pqtdir`,
# `<report>_arwdir`, `<report>.arrows`; `_parquetdir` / `_arrowdir` as people write them), most preferred first.
EXPORT_SUFFIXES = (".sqlite", "_pqtdir", "_parquetdir", "_arwdir", "_arrowdir", ".arrows")


def sibling_exports(rep: Path) -> list[Path]:
    """The exports of a report that sit beside it, by name (present or not), most preferred first."""
    return [rep.with_name(rep.stem + s) for s in EXPORT_SUFFIXES]


def report_stem(path: Path) -> str | None:
    """The report name an export's name says it came from (`run_pqtdir` → `run`), None for other names."""
    for s in EXPORT_SUFFIXES:
        if path.name.endswith(s) and len(path.name) > len(s):
            return path.name[: -len(s)]
    return None


def nsys_binary() -> str | None:
    env = os.environ.get("NSYS")
    if env and Path(env).exists():
        return env
    return shutil.which("nsys")


def export_command(nsys: str, rep: Path, out: Path) -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--lazy", "false", "--force-overwrite", "true", "--output", str(out), str(rep)]


def resolve(rep: Path, cache_dir: Path | None) -> Path:
    """The export to read for a `.nsys-rep`: a sibling export newer than the report, else a (cached) SQLite export."""
    from .nsys.arrow import export_kind

    sibling = rep.with_suffix(".sqlite")
    for cand in sibling_exports(rep):
        if (
            cand.exists()
            and cand.stat().st_mtime >= rep.stat().st_mtime
            and (cand.suffix == ".sqlite" or export_kind(cand) is not None)
        ):
            return cand
    nsys = nsys_binary()
    suggested = export_command("nsys", rep, sibling)
    if nsys is None:
        raise BadInput(
            rep, f"reading a .nsys-rep needs its SQLite export and no `nsys` is on PATH (or $NSYS); run: {shlex.join(suggested)}"
        )
    key = hashlib.sha256(f"{rep.resolve()}:{rep.stat().st_size}:{rep.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(cache_dir or Path.cwd() / ".plasmient-cache") / key
    target = cache / (rep.stem + ".sqlite")
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / (rep.stem + ".partial.sqlite")
    try:
        proc = subprocess.run(export_command(nsys, rep, tmp), capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(rep, f"`nsys export` failed ({e}); run: {shlex.join(suggested)}") from None
    if proc.returncode != 0 or not tmp.exists():
        last = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise BadInput(rep, f"`nsys export` failed ({last[0]}); run: {shlex.join(suggested)}")
    os.replace(tmp, target)
    return target


def sniff(s: Sniff) -> str | None:
    return "nsys-rep" if s.path.suffix == ".nsys-rep" else None


# Resolved to its export by `parsers.discover` (never ingested itself).
FORMATS = (Format("nsys-rep", "Nsight Systems report"),)
