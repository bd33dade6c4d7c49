"""The contract every run is held to, checked one way by every test (SPEC §1 and §4; issues 9, 15 and 17).

The numbers, for any verdict and any store — `check_verdict(v)`, `check_store(con)`, `check_result(res)`:
- every number is finite or null;
- utilization lies in [0, 1] and the achieved fraction in [0, utilization] (no useful work while idle), for the run
  and for every (rank, device);
- the waterfall closes: achieved + Σ losses = 1 for the run, for every (rank, device) and for every range (where the
  achieved fraction is unknown, the losses alone stay ≤ 1); in the store, per analysed window and GPU,
  achieved_ns + unmeasured_ns + Σ losses.lost_ns = window_ns;
- every rank of the job is present or reported missing, never silently absent;
- every source has exactly one clock record, and `sources` carries the same offset.

The command's manners — `cli(...)`, then `succeeded(run, out)` or `refused(run, inputs)`; `Watch(inputs)` around it:
- exit 0 with a complete output folder, or exit 2 (bad input) with exactly one line on stderr naming the file and
  no output folder; never a traceback, never the last-resort "internal error" line;
- nothing half-written: no staging folder left beside the output;
- inputs unmodified, and nothing written into or beside them.

Every breach raises ContractViolation (an AssertionError: pytest reports it as a failure), with what broke.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

ROOT = Path(__file__).resolve().parent.parent
# The outputs of one run (`report`), with and without --no-html --no-trace.
OUTPUT_FILES = (".plasmient-output", "report.html", "run.duckdb", "trace.pftrace", "verdict.json")
OUTPUT_FILES_NO_HTML_TRACE = (".plasmient-output", "run.duckdb", "verdict.json")
# What a run may create beside its output folder only while it runs (outdir.py: staging, the write probe).
LEFTOVER_PREFIXES = (".plasmient-staging-", ".plasmient-probe-", ".out.")
# achieved + Σ losses comes out of one sweep in fixed point (sql exact_sum): equal to 1 up to float rounding.
CLOSE = 1e-9


class ContractViolation(AssertionError):
    """A run broke the contract: a number out of its range, a waterfall that does not close, an exit code or an error
    message out of shape, a changed input, a stray or half-written file."""


def _fail(msg: str) -> None:
    raise ContractViolation(msg)


# ------------------------------------------------------------------------------------------------ numbers


def _numbers(x: Any, where: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield where, float(x)
    elif isinstance(x, Mapping):
        for k, v in x.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{where}[{i}]")


def check_waterfall(entry: Mapping[str, Any], what: str) -> None:
    """One waterfall (the run, a ranks[] or a ranges[] entry): losses ≥ 0, and achieved + Σ losses = 1 (Σ ≤ 1 where
    the achieved fraction is unknown: the rest is time nothing could measure)."""
    fractions = [x["fraction"] for x in entry["losses"]]
    if any(f < 0 for f in fractions):
        _fail(f"{what}: a negative loss: {entry['losses']}")
    ach = entry["achieved_fraction_of_peak"]
    total = sum(fractions) + (ach or 0.0)
    if ach is not None and abs(total - 1.0) > CLOSE:
        _fail(f"{what}: achieved {ach} + losses = {total!r}, not 1")
    if ach is None and total > 1.0 + CLOSE:
        _fail(f"{what}: losses sum to {total!r} > 1")


def _check_fractions(entry: Mapping[str, Any], what: str) -> None:
    util = entry["utilization"]["trace"] if isinstance(entry["utilization"], Mapping) else entry["utilization"]
    ach = entry["achieved_fraction_of_peak"]
    if util is not None and not 0.0 <= util <= 1.0 + CLOSE:
        _fail(f"{what}: utilization {util} outside [0, 1]")
    if ach is not None and not (0.0 <= ach and (util is None or ach <= util + CLOSE)):
        _fail(f"{what}: achieved fraction {ach} outside [0, utilization = {util}]")


def check_verdict(v: Mapping[str, Any]) -> None:
    """The invariants of any verdict (see the module's docstring)."""
    for where, x in _numbers(v):
        if not math.isfinite(x):
            _fail(f"verdict{where} = {x}: numbers are finite or null")
    _check_fractions(v, "run")
    check_waterfall(v, "run")
    for r in v["ranks"]:
        what = f"rank {r['rank']} device {r.get('device')}"
        _check_fractions(r, what)
        check_waterfall(r, what)
    for r in v["ranges"]:
        what = f"range {r['name']!r}"
        if r.get("utilization") is not None:
            _check_fractions({"utilization": r["utilization"], "achieved_fraction_of_peak": r["achieved_fraction_of_peak"]}, what)
        check_waterfall(r, what)
    cov = v["coverage"]
    world = cov.get("world_size")
    if world:
        present = set(v["run"]["ranks"])
        missing = set(cov.get("missing_ranks") or [])
        if present & missing:
            _fail(f"ranks {sorted(present & missing)} both present and reported missing")
        lost = [r for r in range(world) if r not in present and r not in missing]
        if lost:
            _fail(f"ranks {lost} of a world of {world} neither present nor reported missing")
        if cov.get("missing_rank_count") is not None and cov["missing_rank_count"] != len(set(range(world)) - present):
            _fail(f"missing_rank_count {cov['missing_rank_count']} but ranks {sorted(set(range(world)) - present)} absent")


def check_store(con: duckdb.DuckDBPyConnection) -> None:
    """The store's own books close: per analysed window and GPU, the peak-time achieved, the time nothing could
    measure and the losses add up to the window; one clock record per source, copied to `sources`."""
    rows = con.execute("""
        SELECT m.scope, m.range_name, m.rank, m.device, m.window_ns,
               coalesce(m.achieved_ns, 0) + coalesce(m.unmeasured_ns, 0) + coalesce(l.lost_ns, 0) AS booked
        FROM metrics m LEFT JOIN (SELECT scope, range_name, rank, device, sum(lost_ns) AS lost_ns FROM losses
                                  GROUP BY ALL) l
          ON l.scope = m.scope AND l.range_name IS NOT DISTINCT FROM m.range_name
         AND l.rank IS NOT DISTINCT FROM m.rank AND l.device IS NOT DISTINCT FROM m.device
        WHERE m.device IS NOT NULL AND m.window_ns > 0""").fetchall()
    for scope, name, rank, device, window, booked in rows:
        if abs(booked - window) > CLOSE * window + 1:
            _fail(
                f"{scope} {name or ''} rank {rank} device {device}: achieved + unmeasured + lost = {booked} ns, "
                f"window {window} ns"
            )
    bad = con.execute("""
        SELECT s.source_id, s.path, c.offset_ns, s.offset_ns FROM sources s LEFT JOIN clock c USING (source_id)
        WHERE c.source_id IS NULL OR c.offset_ns IS DISTINCT FROM s.offset_ns
           OR c.method IS DISTINCT FROM s.offset_method""").fetchall()
    if bad:
        _fail(f"sources without their one clock record (or a copy that differs): {bad[:3]}")


def check_result(res: Any) -> None:
    """A pipeline.Result: its verdict and its store."""
    check_verdict(res.verdict)
    check_store(res.con)


# ------------------------------------------------------------------------------------- the command's manners


@dataclass(frozen=True)
class Run:
    """What a command did: its exit code and its two streams."""

    code: int
    stdout: str
    stderr: str


def cli(
    *args: object, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 300, in_process: bool = False
) -> Run:
    """`plasmient-report ARGS`: in a subprocess (the real entry point, signals and all), or in this process through
    click's runner (faster; an exception other than SystemExit is a crash and is raised, traceback and all)."""
    argv = [str(a) for a in args]
    if in_process:
        from click.testing import CliRunner

        from plasmient_report.cli import main

        r = CliRunner().invoke(main, argv)
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise r.exception
        return Run(r.exit_code, r.stdout, r.stderr)
    if env is None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(env),
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr)


def one_line(message: str, names: Sequence[Path | str] = ()) -> str:
    """A refusal's message: exactly one line, no traceback, naming one of `names` (file paths or names) when given."""
    lines = [x for x in message.strip().splitlines() if x.strip()]
    if len(lines) != 1:
        _fail(f"not one line: {message!r}")
    if "Traceback" in message:
        _fail(f"a traceback: {message!r}")
    if names and not any(str(n) in lines[0] or Path(n).name in lines[0] for n in names):
        _fail(f"the message names none of {[Path(n).name for n in names]}: {lines[0]!r}")
    return lines[0]


def _staging_left(out: Path) -> list[str]:
    parent = out.parent
    if not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(LEFTOVER_PREFIXES))


def refused(run: Run, inputs: Sequence[Path | str] = (), out: Path | None = None, code: int = 2) -> str:
    """Exit `code` (2: bad input) with one line on stderr naming an input (when given), no internal error, and no
    output folder or staging folder left. Returns the line."""
    if run.code != code:
        _fail(f"exit {run.code}, expected {code}: stdout {run.stdout[-400:]!r} stderr {run.stderr[-800:]!r}")
    line = one_line(run.stderr, inputs)
    if "internal error" in line:
        _fail(f"the last-resort line (a bug, not a refusal): {line!r}")
    if out is not None:
        if out.exists():
            _fail(f"a refused run left {out}")
        if _staging_left(out):
            _fail(f"a refused run left staging folders beside {out}: {_staging_left(out)}")
    return line


def succeeded(run: Run, out: Path | None = None, files: Sequence[str] | None = OUTPUT_FILES) -> dict[str, Any] | None:
    """Exit 0, no traceback, and (with `out`) an output folder holding exactly `files`, whose verdict.json keeps the
    numbers' invariants. Returns that verdict (None without `out`)."""
    if run.code != 0:
        _fail(f"exit {run.code}: {run.stderr[-1500:]}")
    if "Traceback" in run.stderr:
        _fail(f"a traceback on stderr: {run.stderr[-1500:]}")
    if out is None:
        return None
    if files is not None:
        got = sorted(p.name for p in out.iterdir())
        if got != sorted(files):
            _fail(f"the output folder holds {got}, expected {sorted(files)}")
    if _staging_left(out):
        _fail(f"staging folders left beside {out}: {_staging_left(out)}")
    v = json.loads((out / "verdict.json").read_text())
    check_verdict(v)
    return v


def _digest(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _tree(folder: Path) -> dict[str, str]:
    """Every path under `folder` (symlinks not followed) with the digest of its content: '' for folders, the kind for
    links and special files (a FIFO is never opened: that would block)."""
    out: dict[str, str] = {}
    for root, dirs, names in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder)] = ""
        for n in names:
            p = Path(root) / n
            mode = os.lstat(p).st_mode
            out[os.path.relpath(p, folder)] = (
                _digest(p) if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else f"special {stat.S_IFMT(mode):o}"
            )
    return out


class Watch:
    """What must not change while a run reads `inputs`: each input file's bytes and each input's folder (a folder
    input itself; a file input's parent), nothing added or removed there. `Watch(inputs)` before, `.check()` after."""

    def __init__(self, inputs: Sequence[Path], *folders: Path) -> None:
        watched = {p if p.is_dir() else p.parent for p in map(Path, inputs) if p.parent != Path("/dev")}
        self.folders = sorted({f for f in watched if f.is_dir()} | set(folders))
        self.before = {f: _tree(f) for f in self.folders}
        self.files = {p: _digest(p) for p in map(Path, inputs) if p.is_file()}

    def check(self) -> None:
        for p, d in self.files.items():
            if not p.is_file() or _digest(p) != d:
                _fail(f"an input changed: {p}")
        for f, before in self.before.items():
            after = _tree(f)
            if after != before:
                changed = sorted(set(after.items()) ^ set(before.items()))
                _fail(f"written into or beside an input ({f}): {changed[:4]}")


def check_cli(
    *args: object,
    inputs: Sequence[Path],
    out: Path | None,
    expect: str = "ok",
    files: Sequence[str] | None = OUTPUT_FILES,
    names_input: bool = True,
    **kw: Any,
) -> dict[str, Any] | str | None:
    """Run the command on `inputs` and hold it to the whole contract. `expect`: 'ok' (exit 0; returns the verdict),
    'bad' (exit 2; returns the line), 'either'. The caller's args carry the inputs and --out. A refusal names the
    input it is about unless `names_input` is False (a bad option, not a bad file)."""
    watch = Watch(inputs)
    run = cli(*args, **kw)
    watch.check()
    if "internal error" in run.stderr:
        _fail(f"the last-resort line (a bug, not a refusal): {run.stderr.strip()}")
    if run.code == 2 and expect in ("bad", "either"):
        return refused(run, inputs if names_input else (), out)
    if run.code == 0 and expect in ("ok", "either"):
        return succeeded(run, out, files)
    _fail(f"expected {expect}, got exit {run.code}: {run.stderr.strip()[-800:] or run.stdout[-400:]}")
    return None
