"""`plasmient-report batch`: open the archives, group files into runs, map every run through the per-run
pipeline on an executor, reduce to the fleet summary. The command line calls `run_batch` and nothing else."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import BadInput
from . import archive, executors, group, reduce
from .mapper import Outcome, Task, options_fingerprint


@dataclass(frozen=True)
class BatchResult:
    out_dir: Path
    outcomes: list[Outcome]  # one per run, in the order they finished
    unassigned: list[str]  # traces / logs that no run took
    summary: Path
    index: Path
    unread: list[group.Unread] = field(default_factory=list)  # files and folders in no run, with why

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return sorted((o for o in self.outcomes if o.status == "failed"), key=lambda o: o.run_id)


OnDone = Callable[[Outcome, int, int], None]  # outcome, runs finished so far, runs in all


def run_batch(
    archives: Sequence[Path],
    out_dir: Path,
    opts: Any,
    *,
    executor: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    group_by: str = "folder",
    force: bool = False,
    max_unpacked_bytes: int = archive.DEFAULT_MAX_UNPACKED_BYTES,
    on_done: OnDone | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> BatchResult:
    """Raises BadInput for unusable archives or arguments (nothing analysed); a run's failure is its row."""
    if executor not in executors.EXECUTORS:
        raise BadInput(None, f"--executor must be one of {', '.join(executors.EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise BadInput(None, "--jobs must be at least 1")
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise BadInput(None, "--executor ray needs Ray: pip install 'plasmient-report[ray]'") from None
        if address:
            executors.check_reachable(address)
    grouping_rule = group.parse_group_by(group_by)
    out = _check_out(archives, Path(out_dir))
    opts = _checked_options(opts)

    _make_out(out)
    sources = archive.open_sources(list(archives), out / "inputs", archive.Budget(max_unpacked_bytes))
    grouping = group.group(sources, grouping_rule, out)
    if not grouping.runs:
        first = f"; {grouping.unread[0].path}: {grouping.unread[0].why}" if grouping.unread else ""
        more = f" (and {len(grouping.unread) - 1} more)" if len(grouping.unread) > 1 else ""
        raise BadInput(
            ", ".join(map(str, archives)),
            f"no runs found (no PyTorch profiler traces or nsys reports; see --group-by){first}{more}",
        )
    fingerprint = options_fingerprint(opts)
    tasks = [Task(run, str(out), opts, fingerprint, force) for run in grouping.runs]
    if on_start:
        on_start(len(tasks), len(grouping.unread))
    done = 0

    def finished(o: Outcome) -> None:
        nonlocal done
        done += 1
        if on_done:
            on_done(o, done, len(tasks))

    outcomes = executors.run(executor, tasks, finished, jobs, address)
    title = "plasmient · batch · " + ", ".join(s.label for s in sources)
    summary_path, index_path = reduce.reduce(outcomes, out, title, grouping.unread)
    return BatchResult(out, outcomes, grouping.unassigned, summary_path, index_path, grouping.unread)


def _check_out(archives: Sequence[Path], out_dir: Path) -> Path:
    """The batch output folder, absolute: new, empty, or an earlier batch output of this tool (outdir); never
    inside or over an input. Every archive must exist and be a folder or a regular file."""
    from ..outdir import check_batch_out, is_special

    out = check_batch_out(out_dir)
    for a in archives:
        p = Path(a).absolute()
        if not os.path.lexists(p):
            raise BadInput(a, "no such file or directory")
        special = is_special(p)
        if special is not None:
            raise BadInput(a, f"is {special}, not a folder or an archive of runs")
        r = p.resolve()
        o = out.resolve()
        if r == o or (r.is_dir() and r in o.parents) or o in r.parents:
            raise BadInput(out_dir, f"the output folder would be inside or over the input {a}; choose another --out")
    return out


def _make_out(out: Path) -> None:
    """Create the batch folder (following the umask) with its marker, so a later batch may resume into it."""
    from ..outdir import read_marker, write_marker

    out.mkdir(parents=True, exist_ok=True)
    if read_marker(out) is None:
        write_marker(out, "batch")


def _checked_options(opts: Any) -> Any:
    """Options with absolute file paths (tasks run in the batch folder) and their files checked once, here, so a
    bad --select or --peaks is one error line instead of a failure in every run."""
    from .. import judge, rules
    from ..peaks import load_table

    absolute = {k: Path(getattr(opts, k)).absolute() for k in ("peaks_file", "rules_config") if getattr(opts, k)}
    opts = replace(opts, **absolute)
    rules.configure(opts.rule_select, opts.rule_ignore, opts.rules_config)
    judge.thresholds_from(opts.rules_config)
    load_table(opts.peaks_file)
    return opts


class Progress:
    """Runs done / total and failures on stderr: a live line on a terminal; otherwise one line per failure only."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.live: Any = None
        self.task: Any = None
        self.failed = 0
        self.skipped = 0

    def start(self, total: int, unassigned: int) -> None:
        if self.quiet:
            return
        if unassigned:
            _err(
                f"batch: {unassigned} file{'s' if unassigned != 1 else ''} or folder{'s' if unassigned != 1 else ''}"
                " in no run (listed, with why, in summary.parquet and index.html; see --group-by)"
            )
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.live = Progress(
                TextColumn("batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("runs"),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.task = self.live.add_task("batch", total=total, note="")
            self.live.start()

    def __call__(self, outcome: Outcome, done: int, total: int) -> None:
        self.failed += outcome.status == "failed"
        self.skipped += outcome.status == "skipped"
        if self.quiet:
            return
        if outcome.status == "failed":
            line = f"batch: [{done}/{total}] {outcome.run_id} failed: {outcome.error}"
            if self.live is not None:
                self.live.console.print(line, markup=False, highlight=False)
            else:
                _err(line)
        if self.live is not None:
            note = f"{self.failed} failed" + (f", {self.skipped} skipped (unchanged)" if self.skipped else "")
            self.live.update(self.task, completed=done, note=note)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
