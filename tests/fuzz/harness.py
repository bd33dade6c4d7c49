"""The contract every input is held to (issue 9), checked in-process and strictly (tests/contract.py).

For any input: the run succeeds with a verdict whose numbers keep their invariants, or it raises BadInput with
one line naming the file. Any other exception is a crash — the harness lets it through, never turns it into an
exit code (the CLI's last-resort catch of DuckDB / memory errors would hide bugs from the fuzzer). Inputs are
never modified, nothing is written beside them, and the output folder is complete or absent.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plasmient_report import parsers, pipeline, store
from plasmient_report.errors import BadInput

from ..contract import ContractViolation, Watch, check_result, one_line

__all__ = ["ContractViolation", "Hang", "check_bad_input", "run_contract", "time_limit"]

OUTPUT_FILES = [".plasmient-output", "run.duckdb", "verdict.json"]  # with --no-html --no-trace


class Hang(BaseException):
    """The run took longer than its time limit (a BaseException: code under test must not swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread after `seconds` (no-op off the main thread or where SIGALRM is missing)."""
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds:g} s")

    try:
        old = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_bad_input(e: BadInput, inputs: Sequence[Path]) -> str:
    """A BadInput raised in-process: the message the CLI prints, held to the one-line contract."""
    return one_line(str(e), inputs)


def run_contract(inputs: Sequence[Path], work: Path, full: bool = True, limit_s: float = 60.0) -> str:
    """Run the main job (full: analyse + write the outputs; else the parsers only) on `inputs`, which live
    in `work/in/`, and check the contract. Returns 'ok' or 'bad input: <message>'; raises ContractViolation,
    Hang, or whatever crash the code under test raised."""
    folder = work / "in"
    out = work / "out"
    watch = Watch([], folder)
    before_work = sorted(p.name for p in work.iterdir())
    outcome = "ok"
    try:
        with time_limit(limit_s):
            if full:
                opts = pipeline.Options(write_html=False, write_trace=False, cache_dir=work / ".cache")
                res = pipeline.analyse(list(inputs), opts)
                try:
                    pipeline.write_outputs(res, out, list(inputs), opts)
                    check_result(res)
                finally:
                    res.close()  # the store and its spill folder
            else:  # the parse stage alone: detection, then each input's parser
                con = store.connect()
                try:
                    for i, d in enumerate(parsers.discover(list(inputs), work / ".cache")):
                        parsers.ingest_one(d, con, i)
                finally:
                    con.close()
    except BadInput as e:
        outcome = "bad input: " + check_bad_input(e, inputs)
    watch.check()
    names = sorted(p.name for p in work.iterdir())
    expected = sorted(set(before_work) | ({"out"} if full and outcome == "ok" else set()))
    if names != expected and names != sorted([*expected, ".cache"]):
        raise ContractViolation(f"stray files beside the output: {sorted(set(names) - set(expected))}")
    if outcome == "ok" and full:
        got = sorted(p.name for p in out.iterdir())
        if got != OUTPUT_FILES:
            raise ContractViolation(f"output folder holds {got}")
    if outcome != "ok" and out.exists():
        raise ContractViolation("an output folder was left behind by a failed run")
    return outcome
