"""The contract every input is held to (issue 9), checked in-process and strictly.

For any input: the run succeeds with a verdict whose numbers keep their invariants, or it raises BadInput with
one line naming the file. Any other exception is a crash — the harness lets it through, never turns it into an
exit code (the CLI's last-resort catch of DuckDB / memory errors would hide bugs from the fuzzer). Inputs are
never modified, nothing is written beside them, and the output folder is complete or absent.
"""

from __future__ import annotations

import hashlib
import math
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plasmient_report import parsers, pipeline, store
from plasmient_report.errors import BadInput

OUTPUT_FILES = [".plasmient-output", "run.duckdb", "verdict.json"]  # with --no-html --no-trace


class Hang(BaseException):
    """The run took longer than its time limit (a BaseException: code under test must not swallow it)."""


class ContractViolation(AssertionError):
    """An input broke the contract: an exception other than a one-line BadInput, a changed input, a stray file."""


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


def _digest(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, _digest(p) if p.is_file() else "")
            for p in sorted(folder.rglob("*")) if not p.is_symlink()}


def check_verdict(v: dict[str, Any]) -> None:
    """Numbers that must hold for any verdict: utilization in [0, 1], achieved ≤ utilization (no useful work while
    idle), achieved + losses = 1, every rank of the job present or reported missing."""
    util = v["utilization"]["trace"]
    ach = v["achieved_fraction_of_peak"]
    if util is not None and not (0.0 <= util <= 1.0 + 1e-9):
        raise ContractViolation(f"utilization {util} outside [0, 1]")
    if ach is not None:
        if not math.isfinite(ach) or ach < 0 or (util is not None and ach > util + 1e-9):
            raise ContractViolation(f"achieved fraction {ach} outside [0, utilization={util}]")
        total = ach + sum(x["fraction"] for x in v["losses"])
        if abs(total - 1.0) > 1e-6:
            raise ContractViolation(f"achieved + losses = {total}, not 1")
    for r in v["ranks"]:
        a, u = r["achieved_fraction_of_peak"], r["utilization"]["trace"]
        if a is not None and u is not None and a > u + 1e-9:
            raise ContractViolation(f"rank {r['rank']}: achieved {a} > utilization {u}")
    cov = v["coverage"]
    world = cov.get("world_size")
    if world:
        present = set(v["run"]["ranks"])
        missing = set(cov.get("missing_ranks") or [])
        if present & missing:
            raise ContractViolation(f"ranks {sorted(present & missing)} both present and missing")
        lost = [r for r in range(world) if r not in present and r not in missing]
        if lost:
            raise ContractViolation(f"ranks {lost} of a world of {world} neither present nor reported missing")


def check_bad_input(e: BadInput, inputs: Sequence[Path]) -> str:
    msg = str(e)
    if not msg.strip() or "\n" in msg or "\r" in msg:
        raise ContractViolation(f"BadInput message is not one line: {msg!r}")
    if not any(p.name in msg for p in inputs):
        raise ContractViolation(f"BadInput message does not name the file: {msg!r}")
    return msg


def run_contract(inputs: Sequence[Path], work: Path, full: bool = True, limit_s: float = 60.0) -> str:
    """Run the main job (full: analyse + write the outputs; else the parsers only) on `inputs`, which live
    in `work/in/`, and check the contract. Returns 'ok' or 'bad input: <message>'; raises ContractViolation,
    Hang, or whatever crash the code under test raised."""
    folder = work / "in"
    out = work / "out"
    before = _snapshot(folder)
    before_work = sorted(p.name for p in work.iterdir())
    outcome = "ok"
    try:
        with time_limit(limit_s):
            if full:
                opts = pipeline.Options(write_html=False, write_trace=False, cache_dir=work / ".cache")
                res = pipeline.analyse(list(inputs), opts)
                try:
                    pipeline.write_outputs(res, out, list(inputs), opts)
                finally:
                    res.close()  # the store and its spill folder
                check_verdict(res.verdict)
            else:  # the parse stage alone: detection, then each input's parser
                con = store.connect()
                try:
                    for i, d in enumerate(parsers.discover(list(inputs), work / ".cache")):
                        parsers.ingest_one(d, con, i)
                finally:
                    con.close()
    except BadInput as e:
        outcome = "bad input: " + check_bad_input(e, inputs)
    after = _snapshot(folder)
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        raise ContractViolation(f"inputs or their folder changed: {changed[:4]}")
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
