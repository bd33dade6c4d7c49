"""Executors: where the mapper runs — a local process pool (default) or Ray tasks. A choice at the edge: both run
the same `mapper.map_run` on the same tasks and hand each outcome to `on_done` as it finishes."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from ..errors import BadInput
from ..interrupt import interrupted, raise_on_termination
from .mapper import Outcome, Task, lost, map_run

OnDone = Callable[[Outcome], None]
Mapper = Callable[[Task], Outcome]
EXECUTORS = ("local", "ray")
CONNECT_TIMEOUT_S = 10
STOP_GRACE_S = 10.0  # an interrupted worker's time to remove its scratch and staging folders before SIGKILL
PR_SET_PDEATHSIG = 1
WAKE_S = 0.5


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run(
    executor: str,
    tasks: Sequence[Task],
    on_done: OnDone,
    jobs: int | None = None,
    address: str | None = None,
    mapper: Mapper = map_run,
) -> list[Outcome]:
    if executor == "ray":
        return run_ray(tasks, on_done, jobs, address, mapper)
    return run_local(tasks, on_done, jobs or default_jobs(), mapper)


def _die_with_parent() -> None:
    """Linux: the kernel sends this worker SIGTERM when the batch process dies, even by SIGKILL — no orphan keeps
    writing `runs/`."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return


def worker_init(parent_pid: int) -> None:
    """Every pool worker: Ctrl-C is the parent's to handle (the terminal sends SIGINT to the whole process group);
    SIGTERM — from the parent stopping the batch, or the parent's death — interrupts the run, which removes its
    scratch and staging folders on the way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_on_termination(sigint=False)
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the line above: do not start
        os._exit(128 + signal.SIGTERM)


def guarded(mapper: Mapper, task: Task) -> Outcome:
    """The mapper in a worker: an interruption ends the worker process once the run has cleaned up (the parent is
    stopping, or gone; nothing is sent back)."""
    try:
        out = mapper(task)
    except KeyboardInterrupt as e:
        os._exit(128 + int(getattr(e, "signum", signal.SIGINT)))
    signum = interrupted()
    if signum is not None:  # interrupted inside a library, which made it a run's error: not this run's outcome
        os._exit(128 + signum)
    return out


def stop_workers(pool: ProcessPoolExecutor, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every worker of `pool`, wait `grace_s` for them to clean up, SIGKILL those still there."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)


def run_local(tasks: Sequence[Task], on_done: OnDone, jobs: int, mapper: Mapper = map_run) -> list[Outcome]:
    """A process pool of `jobs` workers (spawned: no state inherited from this process). A worker that dies
    (killed, out of memory) breaks the pool: the runs it left are retried one at a time, each in a fresh
    one-worker pool, so only the run that kills its worker is reported failed."""
    outcomes: list[Outcome] = []
    left = _pool_pass(list(tasks), min(jobs, max(1, len(tasks))), mapper, on_done, outcomes)
    for task in left:  # isolation: a pool per run
        if not _pool_pass([task], 1, mapper, on_done, outcomes):
            continue
        out = lost(task.run, "the worker process died while analysing this run (out of memory, or a crash)")
        outcomes.append(out)
        on_done(out)
    return outcomes


def _pool_pass(tasks: list[Task], workers: int, mapper: Mapper, on_done: OnDone, outcomes: list[Outcome]) -> list[Task]:
    """Run tasks on one pool; return those left unfinished when the pool broke."""
    if not tasks:
        return []
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=worker_init, initargs=(os.getpid(),))
    pending: dict[Future[Outcome], Task] = {}
    left: list[Task] = []
    try:
        for t in tasks:
            pending[pool.submit(guarded, mapper, t)] = t
        while pending:
            # With a timeout: a signal delivered to another thread (the pool's) runs its Python handler only when the
            # main thread wakes up; an endless wait would leave Ctrl-C pending until a run finishes.
            done, _ = wait(pending, timeout=WAKE_S, return_when=FIRST_COMPLETED)
            if not done:
                _wake_manager(pool)
            for fut in done:
                task = pending.pop(fut)
                try:
                    out = fut.result()
                except BrokenProcessPool:
                    left.append(task)
                    continue
                except Exception as e:  # noqa: BLE001 — the mapper catches a run's errors; this is a failure to
                    out = lost(task.run, f"{type(e).__name__}: {e}")  # ship the result back (pickling): still one run's
                outcomes.append(out)
                on_done(out)
    except BaseException:  # interrupted (Ctrl-C, SIGTERM) or a bug: the workers stop now, not after their runs
        stop_workers(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    if left:
        # A worker died and broke the pool. A surviving worker can be stuck for good putting its result on the
        # result queue (its lock left taken); SIGTERM only makes it try again. The pool's own shutdown would then
        # wait for it forever, so it is stopped first, and killed after the grace period.
        stop_workers(pool, STOP_GRACE_S)
    pool.shutdown(wait=True, cancel_futures=True)
    return sorted(left, key=lambda t: t.run.run_id)


def _wake_manager(pool: ProcessPoolExecutor) -> None:
    """The pool's manager thread waits on the exit of the workers it knew when it began to wait. Workers are spawned
    as runs are submitted, so one started just after it began can die unnoticed until something wakes the manager:
    the pool then never breaks and the runs never end (seen in tests/test_batch.py with every other worker busy).
    Woken every WAKE_S while runs are pending, it looks at every worker again. (CPython's own wake-up; nothing
    happens where a version has none.)"""
    wakeup = getattr(pool, "_executor_manager_thread_wakeup", None)
    if wakeup is not None:
        with contextlib.suppress(Exception):  # closed: the pool is shutting down, its manager awake already
            wakeup.wakeup()


def run_ray(
    tasks: Sequence[Task], on_done: OnDone, jobs: int | None, address: str | None, mapper: Mapper = map_run
) -> list[Outcome]:
    """One Ray task per run (1 CPU each) on the cluster at `address`, or on a local Ray started here (with `jobs`
    CPUs) when there is none; a Ray already initialised in this process is used as it is. Every node must see
    the batch output folder at the same path (a shared file system) and have plasmient-report installed."""
    try:
        import ray
    except ImportError:
        raise BadInput(None, "--executor ray needs Ray: pip install 'plasmient-report[ray]'") from None
    started = False
    if not ray.is_initialized():
        if address:
            check_reachable(address)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise BadInput(
                None,
                f"cannot start or reach Ray{' at ' + address if address else ''} "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})",
            ) from None
        started = True
    outcomes: list[Outcome] = []
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(mapper)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    out = ray.get(ref)
                except Exception as e:  # noqa: BLE001 — a lost worker or node: that run's failure, not the batch's
                    out = lost(refs[ref].run, f"Ray task failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
                outcomes.append(out)
                on_done(out)
    finally:
        if started:
            ray.shutdown()
    return outcomes


def check_reachable(address: str) -> None:
    """Ray retries an unreachable GCS for minutes; a `host:port` (or `ray://host:port`) that refuses a TCP
    connection is one error line now. Other forms (`auto`, `local`) are left to Ray."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)", address.strip())
    if not m:
        return
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise BadInput(None, f"cannot reach Ray at {address} ({e.strerror or type(e).__name__})") from None
