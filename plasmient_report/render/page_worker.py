"""report.html drawn by a process of its own, while the run's process writes trace.pftrace and run.duckdb.

Drawing the page's charts (matplotlib) and rendering its template is pure Python: on a core the run does not use
it costs the run little (`wanted`: with at least MIN_CORES cores, or PLASMIENT_PAGE_WORKER=on). The run starts the
worker before its analysis (`PageWorker.start`): the worker imports matplotlib, compiles the templates and draws a
first figure (`html.warm_up`) while the trace is read, then waits. When the verdict is done the run reads from the
store what the page shows (`html.page_context`: the charts still to draw, as data) and sends it
(`PageWorker.send`); the worker draws the page into the staging folder's report.html and exits.
`PageWorker.finish` waits for it; if the worker could not start, died, or failed, the page is drawn in the run's
process instead, from the same context — the same bytes either way (tests/test_page_worker.py checks both ways).

The worker never opens the store or an input; it writes only the one file it is told to, in the output's staging
folder (`outdir.staged`), which the run swaps into place only when every output is there.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

# The worker's own memory (Python, numpy, matplotlib, jinja and the page: 75 MiB after its warm-up, ~90 MiB
# drawing a page of the bundled samples) is part of --memory-budget: the run's store gets this much less. Under a
# budget that would then leave the run less than the smallest it can keep to (pipeline.MIN_MEMORY_BUDGET), the page
# is drawn in the run's process instead.
RESERVE_BYTES = 128 << 20
# The run itself keeps two cores busy (its reader / writer threads beside DuckDB's): with fewer than this many the
# worker only competes with it. Measured on 2 cores (benchmarks/README.md, session 5): the 100 MiB Kineto trace
# 5.83 s with it against 6.33 s without, +78 MiB; the 486 MiB nsys export 17.60 against 17.45 s, +66 MiB. Since
# then the run got faster and on two cores the worker only costs (2.99 against 2.76 s, session 31). On 4 and 16
# cores (session 32, a 16-core VM whose Python is ~5x slower than that VM's): 8.35 against 8.47 s on 4 cores, 7.47
# against 8.05 s and 8.31 against 8.24 s on 16 (medians of six), +0.8-1.8 CPU-s and +80-85 MiB of peak RSS.
MIN_CORES = 4
ENV = "PLASMIENT_PAGE_WORKER"  # "on" / "off": use the worker or not, whatever the cores


def wanted() -> bool:
    """Whether a run should draw its page in a worker: PLASMIENT_PAGE_WORKER when set, else a core to spare."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("on", "off"):
        return forced == "on"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores >= MIN_CORES


_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the package this process runs
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from plasmient_report.render.page_worker import serve; serve(sys.stdin.buffer)"
)


class PageWorker:
    """One report.html drawn in a child process; `finish` always leaves the page written (or raises)."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, errors: IO[bytes] | None) -> None:
        self.proc = proc
        self.errors = errors
        self.writer: threading.Thread | None = None
        self.job: tuple[Path, dict[str, Any]] | None = None

    @classmethod
    def start(cls) -> PageWorker:
        """A worker warming up (a worker that cannot start is none: its page is drawn in this process)."""
        errors = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _ROOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
        except OSError:
            errors.close()
            return cls(None, None)
        return cls(proc, errors)

    def send(self, path: Path, ctx: dict[str, Any]) -> None:
        """Have the worker draw the page of `ctx` (html.page_context) into `path`; returns at once."""
        self.job = (Path(path), ctx)
        if self.proc is None or self.proc.stdin is None:
            return
        payload = pickle.dumps((str(path), ctx), protocol=pickle.HIGHEST_PROTOCOL)
        stdin = self.proc.stdin

        def write() -> None:  # a thread: the pipe blocks while the worker is still warming up
            with contextlib.suppress(OSError, ValueError):
                stdin.write(payload)
                stdin.close()

        self.writer = threading.Thread(target=write, name="plasmient-page", daemon=True)
        self.writer.start()

    def finish(self) -> None:
        """Wait for the page; draw it here when the worker did not."""
        assert self.job is not None
        path, ctx = self.job
        ok = False
        if self.proc is not None:
            if self.writer is not None:
                self.writer.join()
            ok = self.proc.wait() == 0 and path.is_file()
        self.close()
        if not ok:
            from . import html

            path.unlink(missing_ok=True)
            path.write_text(html.page(ctx), encoding="utf-8")

    def close(self) -> None:
        """Stop the worker (unused, or the run failed, or after its page), never leaving it behind."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    self.proc.stdin.close()
            self.proc = None
        if self.errors is not None:
            self.errors.close()
            self.errors = None


def serve(stdin: IO[bytes]) -> None:
    """The worker's body: warm up, then draw the one page it is sent (nothing sent: exit quietly). The worker's
    process ends with it: the run waits for that end (`PageWorker.finish`), so what the worker holds is frozen
    out of the interpreter's shutdown collections first, as `cli.run` does for the run's own process — over
    matplotlib's objects they are most of the worker's exit. Measured (benchmarks/README.md, session 31): the
    100 MiB Kineto trace's page drawn, then the process's end 0.087-0.098 s without, 0.014-0.015 s with."""
    from . import html

    html.warm_up()
    data = stdin.read()
    if not data:
        return
    path, ctx = pickle.loads(data)  # noqa: S301 - from the parent process that started this one, through a pipe
    text = html.page(ctx)
    Path(path).write_text(text, encoding="utf-8")
    gc.freeze()
