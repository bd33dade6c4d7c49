"""report.html drawn by the page worker (render/page_worker.py): the same bytes as drawn in the run's process, the
page written whatever happens to the worker, and no worker left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plasmient_report import pipeline
from plasmient_report.render import html
from plasmient_report.render.page_worker import PageWorker

from .conftest import sample_file

# A committed recording with steps, counters-free, with a peak: waterfall, timeline, steps, roofline charts.
SAMPLE = "h200_single/kineto_single.pt.trace.json.gz"


@pytest.fixture(scope="module")
def analysed():
    res = pipeline.analyse([sample_file(SAMPLE)], pipeline.Options())
    try:
        yield res
    finally:
        res.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_worker_draws_the_same_page(analysed, tmp_path: Path) -> None:
    here = html.render(analysed.con, analysed.typed)
    worker = PageWorker.start()
    assert worker.proc is not None
    proc = worker.proc
    ctx = html.page_context(analysed.con, analysed.typed)
    assert any(isinstance(v, html.Chart) for v in ctx.values())  # the charts travel as data, drawn by the worker
    worker.send(tmp_path / "report.html", ctx)
    worker.finish()
    assert proc.returncode == 0  # drawn by the worker, not by the fallback
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == here


def test_page_written_when_the_worker_dies(analysed, tmp_path: Path) -> None:
    worker = PageWorker.start()
    assert worker.proc is not None
    worker.proc.kill()
    worker.proc.wait()
    worker.send(tmp_path / "report.html", html.page_context(analysed.con, analysed.typed))
    worker.finish()  # drawn here instead
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == html.render(analysed.con, analysed.typed)


def test_page_written_when_no_worker_starts(analysed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a, **k):
        raise OSError("no processes here")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    worker = PageWorker.start()
    assert worker.proc is None
    worker.send(tmp_path / "report.html", html.page_context(analysed.con, analysed.typed))
    worker.finish()
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == html.render(analysed.con, analysed.typed)


def test_unused_worker_is_stopped() -> None:
    worker = PageWorker.start()
    assert worker.proc is not None
    pid = worker.proc.pid
    worker.close()
    assert not _alive(pid)


def test_cli_run_with_and_without_the_worker(tmp_path: Path) -> None:
    # The CLI draws through the worker by default and in its own process under a small --memory-budget: the same
    # page both ways (the input path, as given, is the same).
    trace = sample_file(SAMPLE)
    # (PLASMIENT_PAGE_WORKER=on: used whatever this machine's cores; the run draws the page itself under a budget
    # that the worker's share would take below the smallest the run can keep to: 1 GiB is)
    env = dict(os.environ, PYTHONPATH=str(Path(html.__file__).resolve().parents[2]), PLASMIENT_PAGE_WORKER="on")
    pages = []
    for name, extra in (("worker", []), ("here", ["--memory-budget", "1GiB"])):
        out = tmp_path / name
        run = subprocess.run(
            [sys.executable, "-m", "plasmient_report.cli", str(trace), "--out", str(out), "--quiet", *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
            "report.html",
            "run.duckdb",
            "trace.pftrace",
            "verdict.json",
        ]
        pages.append((out / "report.html").read_text(encoding="utf-8"))
    assert pages[0] == pages[1]


def test_the_worker_is_wanted_with_cores_to_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    from plasmient_report.render import page_worker

    monkeypatch.delenv(page_worker.ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(2)), raising=False)
    assert not page_worker.wanted()
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(page_worker.MIN_CORES)), raising=False)
    assert page_worker.wanted()
    monkeypatch.setenv(page_worker.ENV, "off")
    assert not page_worker.wanted()
    monkeypatch.setenv(page_worker.ENV, "on")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert page_worker.wanted()


def test_the_worker_ends_with_its_objects_frozen_out_of_the_last_collections(analysed, tmp_path: Path) -> None:
    """The worker's body (`serve`) draws the page it is sent, then leaves what it holds out of the interpreter's
    shutdown collections (the run waits for the worker's end; page_worker.serve says why): the page is written
    first and is the one the run's process draws."""
    import pickle

    page = tmp_path / "report.html"
    job = pickle.dumps((str(page), html.page_context(analysed.con, analysed.typed)))
    code = (
        "import atexit, gc, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from plasmient_report.render.page_worker import serve\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count(), flush=True))\n"
        "serve(sys.stdin.buffer)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], input=job, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert int(r.stdout.decode().split()[-1]) > 10_000  # matplotlib's, jinja's, numpy's objects
    assert page.read_text(encoding="utf-8") == html.render(analysed.con, analysed.typed)
