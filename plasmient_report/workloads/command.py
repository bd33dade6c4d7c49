"""`plasmient-report measure`: record the workloads on this GPU (or take an earlier recording with `--from`), then
analyse and print. The recording is written to a temporary folder and renamed into `OUT/recording/` when complete,
so an interrupted run leaves no half recording; an `OUT` that holds something else is refused."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import BadInput
from . import NAMES, recorder, report

DEFAULT_OUT = Path("plasmient-out") / "measure"
MAX_SECONDS = 600.0


def _say(quiet: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if not quiet:
            print(f"measure: {msg}", file=sys.stderr, flush=True)

    return say


def _check_out(out: Path) -> None:
    """OUT is new, empty, or an earlier measure output (its recording is then replaced): never anything else."""
    if out.exists() and not out.is_dir():
        raise BadInput(out, "exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / "recording" / recorder.INFO).is_file():
        raise BadInput(out, "is not empty and holds no earlier measure recording; choose another --out")


def run(
    workload: str,
    gpu_index: int,
    seconds: float,
    out_dir: Path | None,
    from_dir: Path | None,
    quiet: bool = False,
    write_html: bool = True,
    write_trace: bool = True,
) -> list[report.Row]:
    """Record (unless `from_dir`) and analyse; BadInput (one line) for anything unusable."""
    say = _say(quiet)
    names = NAMES if workload == "all" else (workload,)
    if from_dir is not None:
        rec = report.load(from_dir)
        if workload != "all":
            kept = [w for w in rec.workloads if w["name"] == workload]
            if not kept:
                raise BadInput(
                    from_dir,
                    f"the recording has no {workload!r} workload "
                    f"(it has {', '.join(w['name'] for w in rec.workloads) or 'none'})",
                )
            rec = report.Recording(rec.folder, {**rec.info, "workloads": kept})
        out = Path(out_dir) if out_dir else Path("plasmient-out") / f"measure-{_label(rec.folder)}"
        a, f = out.absolute(), rec.folder.absolute()
        if a == f or f in a.parents or a in f.parents and a != f.parent:
            raise BadInput(out, "the output folder would be inside or over the recording; choose another --out")
        return report.analyse(rec, out, quiet=quiet, write_html=write_html, write_trace=write_trace)
    if not 0 < seconds <= MAX_SECONDS:
        raise BadInput(None, f"--seconds must be more than 0 and at most {MAX_SECONDS:g}")
    recorder.require(gpu_index)
    out = Path(out_dir) if out_dir else DEFAULT_OUT
    _check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".recording.partial-{os.getpid()}"
    try:
        recorder.record(names, gpu_index, seconds, tmp, progress=say)
        final = out / "recording"
        if final.exists():
            old = out / f".recording.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"recorded into {out / 'recording'}/; analysing …")
    return report.analyse(report.load(out / "recording"), out, quiet=quiet, write_html=write_html, write_trace=write_trace)


def _label(folder: Path) -> str:
    f = folder.absolute()
    return (f.parent.name if f.name == "recording" else f.name) or "recording"
