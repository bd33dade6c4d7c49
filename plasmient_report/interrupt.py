"""How a run stops on a signal. SIGINT (Ctrl-C), SIGTERM and SIGHUP raise `errors.Interrupted` in the main thread, so
every `finally` runs (scratch and staging folders removed) and the CLI exits 128 + the signal with one line.

DuckDB holds the main thread in C code for the length of a query, where no Python handler runs, and it may turn
an interruption into its own error (RuntimeError 'Query interrupted', InterruptException) or, when the signal lands
as a query starts, swallow it. So the signal is also remembered (`interrupted()`: the CLI asks before calling an
error a failure), and a watcher thread woken by the signal interrupts the queries of the stores registered with
`watch()` until the run is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from typing import Any

from .errors import Interrupted

REPEAT_S = 0.25  # the watcher interrupts the stores again this often while the run winds down

_received: list[int] = []
_stores: weakref.WeakSet[Any] = weakref.WeakSet()
_watcher: dict[str, Any] = {}


def interrupted() -> int | None:
    """The signal that interrupted this process, if one did."""
    return _received[-1] if _received else None


def watch(con: Any) -> None:
    """Interrupt this DuckDB connection's queries when the run is signalled."""
    with contextlib.suppress(TypeError):
        _stores.add(con)


def _interrupt_stores() -> None:
    for con in list(_stores):
        with contextlib.suppress(Exception):  # closed, or busy closing: nothing to interrupt
            con.interrupt()


def _watch(fd: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        signums = [b for b in data if b in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", -1))]
        if not signums:
            continue
        _received.append(signums[-1])
        while not stop.is_set():  # until the run ends: a query that starts after the signal is interrupted too
            _interrupt_stores()
            stop.wait(REPEAT_S)


def raise_on_termination(sigint: bool = True) -> dict[int, object]:
    """Make SIGTERM and SIGHUP (and SIGINT, unless `sigint` is False) raise `Interrupted` in the main thread, and
    start the watcher. Returns what `restore_handlers` needs; does nothing outside the main thread."""
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def handler(signum: int, frame: object) -> None:
        _received.append(signum)
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT if sigint else None):
        if sig is None:
            continue
        if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started with Ctrl-C ignored (a background job): keep it so
        previous[sig] = signal.signal(sig, handler)
    if not _watcher:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # pragma: no cover - not the main thread of the main interpreter
            os.close(r)
            os.close(w)
            return previous
        stop = threading.Event()
        t = threading.Thread(target=_watch, args=(r, stop), name="plasmient-interrupt", daemon=True)
        t.start()
        _watcher.update(r=r, w=w, old_fd=old_fd, stop=stop, thread=t)
    return previous


def restore_handlers(previous: dict[int, object]) -> None:
    for sig, h in previous.items():
        signal.signal(sig, h)  # type: ignore[arg-type]
    if _watcher and threading.current_thread() is threading.main_thread():
        w = _watcher.pop("w")
        signal.set_wakeup_fd(_watcher.pop("old_fd"))
        _watcher.pop("stop").set()
        os.close(w)  # the watcher's read returns b"": it ends
        _watcher.pop("thread").join(timeout=2)
        with contextlib.suppress(OSError):
            os.close(_watcher.pop("r"))
        _watcher.clear()
