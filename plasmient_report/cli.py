"""Command line: arguments in, pipeline call, exit codes out — no analysis here.

Exit codes: 0 success; 1 a regression (`diff --fail-if-drop`); 2 unusable input or arguments (one line naming the
file, no traceback unless --debug); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM; 129 SIGHUP) — nothing
half-written is left, and the run's scratch folder is removed.

A subcommand is one decorated function below (`@main.command(...)`): adding one is adding a function.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import click
import duckdb

from . import __version__
from .errors import BadInput, Interrupted, path_text
from .interrupt import interrupted, raise_on_termination, restore_handlers

# Arrow's buffers from the C library's allocator, not pyarrow's default mimalloc (set before pyarrow is first imported;
# a user's ARROW_DEFAULT_MEMORY_POOL wins; the page worker inherits it). mimalloc hands freed memory back to the
# system within milliseconds, so the next batch's buffers are fresh pages again: inside a run, one `take` of 531 k
# sweep points cost 146 ms on its first call against 7 ms from the system pool. Measured on the 2-vCPU VM
# (benchmarks/README.md, session 30), eight interleaved pairs of the 100 MiB Kineto trace: 3.93-4.34 s (median
# 4.16) against 4.14-4.55 s (4.24), peak 333-358 against 349-367 MiB; the 486 MiB nsys export and both 2 GB
# inputs under a 1.5 GiB budget the same or faster, within the budget.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
# numpy's OpenBLAS with no threads of its own (set before numpy is first imported; a user's OPENBLAS_NUM_THREADS wins;
# the page worker and batch's worker processes inherit it). The tool multiplies no matrices larger than
# matplotlib's 3x3 transforms, but on import OpenBLAS starts one thread per further core, and each spins ~0.1 s
# before it sleeps: ~0.1 CPU-s on two cores, (cores - 1) x ~0.1 on larger machines, in every process that loads
# numpy. Measured (benchmarks/README.md, session 32): the 100 MiB Kineto trace 3.63 -> 3.50 CPU-s, the same wall
# time (twelve interleaved pairs).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

EXAMPLES = """\b
Examples:
  plasmient-report trace.pt.trace.json.gz             # the box; outputs in ./plasmient-out/trace/
  plasmient-report rank*.pt.trace.json.gz dmon.txt    # the ranks of one run, with a counter log
  plasmient-report run.nsys-rep --range 'ProfilerStep#*' --out report/
  plasmient-report batch fleet.tar.zst --out fleet/   # many runs: summary.parquet + index.html
  plasmient-report diff base/ cand/ --fail-if-drop 2  # CI gate: exit 1 on a regression
  plasmient-report rules --explain PR101              # a rule's page
  plasmient-report measure --workload matmul          # this GPU, known workloads: what the tool says of them
  plasmient-report query plasmient-out/trace/run.duckdb "SELECT name, count(*) FROM kernels GROUP BY 1"
  plasmient-report export plasmient-out/trace --csv sheets/     # every table as CSV (or --parquet DIR)

\b
Exit codes: 0 ok, 1 a diff regression, 2 unusable input or arguments (one line), 130 interrupted.
Docs: README.md, docs/verdict.md (every key of verdict.json), docs/batch.md."""


class DefaultGroup(click.Group):
    """`plasmient-report INPUT...` is `plasmient-report report INPUT...`; interruptions end every command the
    same way (one line, exit 128 + signal)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["report", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "INPUT... [OPTIONS]")
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...")

    def invoke(self, ctx: click.Context) -> Any:
        previous = raise_on_termination()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / SIGHUP (errors.Interrupted): the cleanups have run
            signum = getattr(e, "signum", signal.SIGINT)
            click.echo(
                "plasmient-report: interrupted"
                if signum == signal.SIGINT
                else f"plasmient-report: terminated ({signal.Signals(signum).name})",
                err=True,
            )
            sys.exit(128 + int(signum))
        finally:
            restore_handlers(previous)


def _fail(msg: str, debug: bool = False) -> NoReturn:
    signum = interrupted()
    if signum is not None:  # an error that a library made of an interruption (DuckDB: 'Query interrupted')
        raise Interrupted(signum)
    click.echo(f"plasmient-report: error: {path_text(msg)}", err=True)
    sys.exit(2)


@click.group(
    cls=DefaultGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110}
)
@click.version_option(__version__, prog_name="plasmient-report")
def main() -> None:
    """Utilization vs achieved fraction of peak from GPU traces, and where the rest went.

    INPUT is any mix of files and folders: Nsight Systems (.nsys-rep, .sqlite, parquetdir / arrow exports),
    PyTorch profiler / Kineto JSON (.json, .json.gz), dcgmi dmon, dcgm-exporter, nvidia-smi dmon and
    --query-gpu logs, Nsight Compute CSV. `plasmient-report report --help` lists the main job's options."""


PRECISIONS = ["bf16", "fp16", "fp8", "int8", "tf32", "fp32", "fp64"]


class Progress:
    """Ingest and the long stages as a live line on stderr (rich), on a terminal only; silent otherwise."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.live = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task: Any = None

    @classmethod
    def make(cls, quiet: bool) -> Progress | None:
        return cls() if not quiet and sys.stderr.isatty() else None

    def __call__(self, what: str, i: int, n: int) -> None:
        if self.task is None:
            self.live.start()
            self.task = self.live.add_task(path_text(what), total=n or None)
        self.live.update(self.task, description=path_text(what), completed=i, total=n or None)

    def stop(self) -> None:
        if self.task is not None:
            self.live.stop()
            self.task = None


F = TypeVar("F", bound=Callable[..., Any])


def analysis_options(batch: bool) -> Callable[[F], F]:
    """The options of the analysis itself, one definition for the main job and `batch` (which applies each to every
    run): they reach the command as one `analysis` dict of pipeline.Options fields, checked by `_options`."""
    each = " for every run" if batch else ""
    options = [
        click.option(
            "--range",
            "ranges",
            multiple=True,
            metavar="NAME",
            help="Analyse only inside ranges of this name (NVTX / record_function; glob, e.g. 'ProfilerStep#*'; repeatable).",
        ),
        click.option("--no-html", is_flag=True, help=f"Do not write report.html{' per run' if batch else ''}."),
        click.option("--no-trace", is_flag=True, help=f"Do not write trace.pftrace{' per run' if batch else ''}."),
        click.option(
            "--peak-precision",
            type=click.Choice(PRECISIONS),
            help=f"Precision of the peak (default: {'each run' if batch else 'the trace'}'s dominant matmul precision).",
        ),
        click.option(
            "--peak-tflops", type=float, metavar="TFLOPS", help=f"Use this peak (TFLOP/s){each} instead of the table's."
        ),
        click.option(
            "--peaks",
            "peaks_file",
            type=click.Path(path_type=Path),
            metavar="FILE.toml",
            help="TOML file adding/overriding GPUs.",
        ),
        click.option(
            "--gpu", metavar="NAME", help="GPU name when the trace does not name it (e.g. H100-SXM, 'NVIDIA A100-SXM4-80GB')."
        ),
        click.option(
            "--model-flops",
            type=float,
            metavar="N",
            help="FLOPs per step (ProfilerStep#N) or per --range occurrence, e.g. 6·params·tokens; spread over "
            f"that window's compute kernels by time (use when shapes are missing: CUDA graphs, compiled code){each}.",
        ),
        click.option(
            "--tz",
            metavar="ZONE",
            help="Time zone of local-time logs (nvidia-smi), e.g. Europe/Berlin (default: this machine's).",
        ),
        click.option(
            "--dcgm-period",
            "dcgm_period_s",
            type=float,
            default=1.0,
            show_default=True,
            metavar="SECONDS",
            help="Sampling period (s) of logs that print no time (dcgmi dmon, nvidia-smi dmon without -o T).",
        ),
        click.option(
            "--select",
            "rule_select",
            multiple=True,
            metavar="IDS",
            help="Run only these rules: IDs, ID prefixes or names, comma-separated (e.g. PR1,PR502; default ALL).",
        ),
        click.option("--ignore", "rule_ignore", multiple=True, metavar="IDS", help="Skip these rules (as --select)."),
        click.option(
            "--rules-config",
            type=click.Path(path_type=Path),
            metavar="FILE.toml",
            help="TOML file: select / ignore, and per-rule thresholds ([PR101] min_lateness_us = 50).",
        ),
        click.option(
            "--memory-budget",
            default="1.5GiB",
            show_default=True,
            metavar="SIZE",
            help=f"Peak memory{' of each worker' if batch else ''} to stay under, e.g. 2GiB, 4GiB, or 'none' (at least "
            "1GiB): the store spills to the run's scratch folder beyond it (traces of many GB).",
        ),
    ]
    names = [
        *("ranges", "no_html", "no_trace", "peak_precision", "peak_tflops", "peaks_file", "gpu", "model_flops", "tz"),
        *("dcgm_period_s", "rule_select", "rule_ignore", "rules_config", "memory_budget"),
    ]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def collected(**kw: Any) -> Any:
            analysis = {k: kw.pop(k) for k in names}
            analysis["write_html"], analysis["write_trace"] = not analysis.pop("no_html"), not analysis.pop("no_trace")
            return command(analysis=analysis, **kw)

        for option in reversed(options):
            collected = option(collected)
        return cast(F, collected)

    return decorate


@main.command(short_help="Analyse traces of one run (the default command).", epilog=EXAMPLES)
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="INPUT...")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Output folder (default ./plasmient-out/<name>/): verdict.json, report.html, trace.pftrace, "
    "run.duckdb. An existing folder is replaced only when it is an earlier output of this tool.",
)
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json to stdout instead of the box.")
@click.option("--quiet", is_flag=True, help="Print nothing on success (errors still go to stderr).")
@analysis_options(batch=False)
@click.option(
    "--tokens-per-step",
    type=float,
    metavar="N",
    help="Tokens one rank processes per step (or per --range occurrence): adds tokens/s to the steps.",
)
@click.option(
    "--samples-per-step",
    type=float,
    metavar="N",
    help="Samples one rank processes per step (or per --range occurrence): adds samples/s to the steps.",
)
@click.option(
    "--markdown",
    "markdown_file",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Also write the verdict as GitHub-flavoured markdown (a PR comment, $GITHUB_STEP_SUMMARY); '-' "
    "prints it to stdout instead of the box.",
)
@click.option(
    "--offset",
    "offsets",
    multiple=True,
    metavar="SOURCE=±DURATION",
    help="Force a clock offset on one input (path or file name), e.g. dmon.txt=+37s (repeatable).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def report(
    inputs: tuple[Path, ...],
    out_dir: Path | None,
    as_json: bool,
    quiet: bool,
    analysis: dict[str, Any],
    tokens_per_step: float | None,
    samples_per_step: float | None,
    markdown_file: Path | None,
    offsets: tuple[str, ...],
    debug: bool,
) -> None:
    """Analyse INPUT files and folders of one run and print the verdict (the main job):

    plasmient-report [report] INPUT... [OPTIONS]"""
    from . import outdir, pipeline, scratch
    from .render import markdown
    from .render import verdict as verdict_render

    opts = _options(**analysis, offsets=offsets)
    for flag, n in (("--tokens-per-step", tokens_per_step), ("--samples-per-step", samples_per_step)):
        if n is not None and not n > 0:
            _fail(f"{flag} must be a positive number")
    opts.tokens_per_step, opts.samples_per_step = tokens_per_step, samples_per_step
    _check_markdown(markdown_file, as_json)
    shown = ", ".join(map(str, inputs))
    progress = Progress.make(quiet)
    try:
        # Refused before the analysis, not after minutes of it (and checked again when the outputs are swapped in).
        out = outdir.check_run_out(out_dir or pipeline.default_out_dir(inputs), inputs)
        opts.cache_dir = out.parent / ".plasmient-cache"
        with scratch.run(), _page_worker(opts) as worker, pipeline.few_collections():
            try:
                result = pipeline.analyse(list(inputs), opts, progress=progress, write_trace_early=True, defer_comments=True)
                try:
                    out = pipeline.write_outputs(result, out, inputs, opts, progress=progress, page_worker=worker)
                finally:
                    result.close()
            finally:
                if progress:
                    progress.stop()
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except (duckdb.Error, MemoryError, RecursionError) as e:
        if debug:
            raise
        _fail(_could_not_analyse(shown, e, analysis.get("memory_budget")))
    except Exception as e:  # a bug of ours: still one line and exit 2 (the contract); --debug shows the traceback
        if debug:
            raise
        _fail(f"{shown}: internal error ({_one_line(e)}); rerun with --debug and report it")
    assert result.typed is not None
    to_stdout = markdown_file is not None and str(markdown_file) == "-"
    if markdown_file is not None:
        _write_markdown(markdown_file, markdown.verdict(result.typed))
    if as_json:
        click.echo(verdict_render.dumps(result.typed), nl=False)
    elif not quiet and not to_stdout:
        from .render import terminal  # (rich: ~40 ms of start-up that --quiet and --json runs do without)

        terminal.render(result.typed, footer=f"outputs: {path_text(out)}/")


def _check_markdown(path: Path | None, as_json: bool) -> None:
    """--markdown FILE refused before any work when it cannot be written: a folder, a missing parent folder, or '-'
    beside --json (both would print to stdout)."""
    if path is None:
        return
    if str(path) == "-":
        if as_json:
            _fail("--markdown - and --json both print to stdout: give --markdown a file")
        return
    if path.is_dir():
        _fail(f"{path}: --markdown needs a file, not a folder")
    if not path.absolute().parent.is_dir():
        _fail(f"{path}: --markdown: no folder {path.absolute().parent}")


def _write_markdown(path: Path, text: str) -> None:
    """--markdown FILE: '-' is stdout; $GITHUB_STEP_SUMMARY is appended to (the runner's summary collects several
    steps); any other file is written whole, in one rename (never half-written)."""
    import tempfile

    if str(path) == "-":
        click.echo(text, nl=False)
        return
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        if summary and os.path.abspath(summary) == os.path.abspath(path):
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
            return
        fd, tmp = tempfile.mkstemp(prefix=".plasmient-md-", dir=path.absolute().parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        _fail(f"{path}: cannot write the markdown ({e.strerror})")


def _umask() -> int:
    from .outdir import umask

    return umask()


def _could_not_analyse(shown: str, e: BaseException, budget: str | None) -> str:
    """The one line of a run DuckDB (or Python) could not finish; out of DuckDB's memory, what to do about it."""
    first = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if isinstance(e, duckdb.OutOfMemoryException) and budget is not None:
        return (
            f"{shown}: could not analyse within --memory-budget {budget} ({first}); rerun with a larger --memory-budget (or none)"
        )
    return f"{shown}: could not analyse ({first})"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


@contextlib.contextmanager
def _page_worker(opts: Any) -> Any:
    """The process drawing report.html (render/page_worker.py), started now so it warms up during the analysis;
    none without report.html, under a memory budget too small for a second process, or without a core to spare."""
    from .pipeline import MIN_MEMORY_BUDGET
    from .render.page_worker import RESERVE_BYTES, PageWorker, wanted

    # (the worker's share of the budget must leave the run the smallest budget it can keep to)
    tight = opts.memory_budget is not None and opts.memory_budget - RESERVE_BYTES < MIN_MEMORY_BUDGET
    worker = PageWorker.start() if opts.write_html and not tight and wanted() else None
    if worker is not None and worker.proc is not None and opts.memory_budget is not None:
        opts.memory_budget -= RESERVE_BYTES  # the worker's memory is part of the budget: the store gets less
    try:
        yield worker
    finally:
        if worker is not None:
            worker.close()


def _options(*, peak_tflops: float | None, model_flops: float | None, dcgm_period_s: float, memory_budget: str, **kw: Any) -> Any:
    """The analysis options of the main job and of `batch`, checked (exit 2 with one line on a bad one)."""
    from . import pipeline

    if peak_tflops is not None and not peak_tflops > 0:
        _fail("--peak-tflops must be a positive number")
    if model_flops is not None and not model_flops >= 0:
        _fail("--model-flops must be a non-negative number")
    if not dcgm_period_s > 0:
        _fail("--dcgm-period must be a positive number of seconds")
    try:
        budget = parse_size(memory_budget)
    except ValueError as e:
        _fail(f"--memory-budget: {e}")
    return pipeline.Options(
        peak_tflops=peak_tflops, model_flops=model_flops, dcgm_period_s=dcgm_period_s, memory_budget=budget, **kw
    )


def parse_size(text: str) -> int | None:
    """'1.5GiB', '1100MB', '2g', '1073741824' → bytes; 'none' / 'off' / '0' → None (no limit); under 1 GiB refused."""
    from .store import size_bytes

    if text.strip().lower() in ("none", "off", "unlimited", "0"):
        return None
    n = size_bytes(text)
    if n is None:
        raise ValueError(f"not a size: {text!r} (e.g. 1.5GiB, 2GB, none)")
    from .pipeline import MIN_DUCKDB_MEMORY, MIN_MEMORY_BUDGET, PYTHON_RESERVE

    if n < MIN_MEMORY_BUDGET:  # (a smaller budget would not be kept to: the run's peak goes over it)
        raise ValueError(
            f"{text!r} is too small: at least {MIN_MEMORY_BUDGET >> 20}MiB, a budget the run can keep to (DuckDB's "
            f"minimum of {MIN_DUCKDB_MEMORY >> 20} MiB and {PYTHON_RESERVE >> 20} MiB beside it for the interpreter, "
            "its libraries and what DuckDB holds beyond its limit)"
        )
    return n


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None
    from rich.console import Console

    console = Console(stderr=True)

    def cb(what: str, i: int, n: int) -> None:
        console.print(f"[dim]{what} ({i}/{n})[/dim]", end="\r")

    return cb


def _store_path(db: Path) -> Path:
    """The run.duckdb to query: the file, or an output folder's; a verdict.json or another file is refused with
    what to give instead."""
    if db.is_dir():
        if (db / "run.duckdb").is_file():
            return db / "run.duckdb"
        _fail(f"{db}: a folder without run.duckdb (query needs the store a run wrote: <out>/run.duckdb)")
    if not db.exists():
        _fail(f"{db}: no such file")
    try:
        with open(db, "rb") as f:
            head = f.read(16)
    except OSError as e:
        _fail(f"{db}: cannot read ({e.strerror})")
    if head[8:12] != b"DUCK":
        sibling = db.parent / "run.duckdb"
        hint = f"; try {sibling}" if sibling.is_file() else ""
        what = "a JSON file (verdict.json?)" if head.lstrip()[:1] in (b"{", b"[") else "not a DuckDB database"
        _fail(f"{db}: {what}: query needs the run's store, run.duckdb, from the same output folder{hint}")
    return db


@main.command(short_help="Run SQL over a stored run (run.duckdb).")
@click.argument("db", type=click.Path(path_type=Path), metavar="RUN.duckdb")
@click.argument("sql")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
def query(db: Path, sql: str, as_csv: bool) -> None:
    """Run SQL over a stored run: RUN.duckdb is the run.duckdb of an output folder (or the folder itself); the
    tables are documented in docs/schema.md.

    \b
    Example:
      plasmient-report query plasmient-out/trace/run.duckdb "SELECT name, count(*) FROM kernels GROUP BY 1"
    """
    from . import store

    db = _store_path(db)
    try:
        con = store.open_readonly(db)
        cur = con.execute(sql)
        if cur.description is None:
            return
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
    except duckdb.Error as e:
        _fail(f"{db}: {str(e).splitlines()[0]}")
    if as_csv:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
        return
    from rich.table import Table

    t = Table(*cols)
    for r in rows:
        t.add_row(*("" if x is None else str(x) for x in r))
    _wide_console(t).print(t)


def _wide_console(renderable: Any) -> Any:
    """A console as wide as the table needs (at least the terminal's): piped output is not cut at 80 columns."""
    from rich.console import Console

    probe = Console()
    need = probe.measure(renderable).maximum
    return Console(width=max(probe.width, need)) if need > probe.width else probe


@main.command(short_help="Export a stored run's tables as CSV or Parquet (spreadsheets).")
@click.argument("run", type=click.Path(path_type=Path), metavar="RUN")
@click.option("--csv", "csv_dir", type=click.Path(path_type=Path), metavar="DIR", help="Write one CSV file per table here.")
@click.option(
    "--parquet", "parquet_dir", type=click.Path(path_type=Path), metavar="DIR", help="Write one Parquet file per table here."
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def export(run: Path, csv_dir: Path | None, parquet_dir: Path | None, debug: bool) -> None:
    """Export the tables of a stored run — RUN is an output folder or its run.duckdb — one file per table: kernels,
    ops, shapes, steps, collectives, losses, findings, metrics, … (README.md in DIR lists them). DIR must be new,
    empty or an earlier export (then replaced whole).

    \b
    Example:
      plasmient-report export plasmient-out/trace --csv sheets/"""
    from . import export as export_stage

    targets = [(f, d) for f, d in (("csv", csv_dir), ("parquet", parquet_dir)) if d is not None]
    if not targets:
        _fail("export: give --csv DIR and/or --parquet DIR")
    try:
        done = export_stage.export(run, targets)
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except duckdb.Error as e:
        if debug:
            raise
        _fail(f"{run}: could not export ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    for folder, files in done:
        click.echo(
            f"{path_text(folder)}/: {len(files)} tables ({', '.join(f'{n} {r:,}' for n, r in files[:6])}"
            f"{' …' if len(files) > 6 else ''})"
        )


@main.command(short_help="The peak table, with sources.")
@click.argument("gpu", required=False)
@click.option(
    "--peaks", "peaks_file", type=click.Path(path_type=Path), metavar="FILE.toml", help="TOML file adding/overriding GPUs."
)
def peaks(gpu: str | None, peaks_file: Path | None) -> None:
    """The peak table (dense TFLOP/s per precision, memory bandwidth), with sources. With GPU: the entry that name
    means (as --gpu reads it; an ambiguous name is refused with the entries it could mean)."""
    from rich.table import Table

    from .peaks import PRECISIONS, load_table, lookup

    try:
        table = load_table(peaks_file)
        rows = [lookup(gpu, table)] if gpu else table  # an ambiguous name is refused with its candidates
    except BadInput as e:
        _fail(str(e))
    t = Table("gpu", *PRECISIONS, "GB/s", title="dense peak TFLOP/s (TOPS for int8)")
    t.columns[0].no_wrap = True
    for g in rows:
        t.add_row(
            g.key,
            *(f"{g.tflops[p]:g}" if p in g.tflops else "-" for p in PRECISIONS),
            f"{g.memory_bandwidth_gbs:g}" if g.memory_bandwidth_gbs else "-",
        )
    c = _wide_console(t)
    c.print(t)
    for g in rows:
        c.print(f"[dim]{g.key}: {g.name} — {g.source}[/dim]", highlight=False, soft_wrap=True)
        ic = g.interconnect
        if ic:  # the links NCCL's bus bandwidth is measured against (both ways; one way is half)
            links = ", ".join(
                x
                for x in (
                    f"{ic.link} {ic.link_gbs:g} GB/s" if ic.link_gbs else "",
                    f"{ic.pcie} {ic.pcie_gbs:g} GB/s" if ic.pcie_gbs else "",
                )
                if x
            )
            c.print(f"[dim]  links: {links} — {ic.source}[/dim]", highlight=False, soft_wrap=True)


@main.command(short_help="The rule catalog; --explain ID prints a rule's page.")
@click.option("--explain", "explain", metavar="ID", help="Print the documentation page of one rule (ID or name).")
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def rules(explain: str | None, as_json: bool) -> None:
    """The rule catalog (like `ruff rule`): IDs, layers, titles; --explain ID prints a rule's page."""
    from . import rules as rule_engine

    catalog, notes = rule_engine.all_rules()
    for n in notes:
        click.echo(f"plasmient-report: warning: {n}", err=True)
    if explain:
        r = rule_engine.find_rule(explain, catalog)
        if r is None:
            _fail(f"no rule {explain!r} (see `plasmient-report rules`)")
            return
        click.echo(r.page(), nl=False)
        return
    if as_json:
        import json

        click.echo(
            json.dumps(
                [
                    {
                        "id": r.id,
                        "name": r.name,
                        "layer": r.layer,
                        "status": r.status,
                        "category": r.category,
                        "claims_loss": r.claims_loss,
                        "title": r.title,
                        "thresholds": dict(r.thresholds),
                        "origin": r.origin,
                    }
                    for r in catalog
                ],
                indent=1,
            )
        )
        return
    w = max(len(r.name) for r in catalog) if catalog else 4
    click.echo(f"{'code':6} {'name':{w}} {'layer':8} {'status':10} {'explains':20} title")
    for r in catalog:
        explains = (r.category or "-") if r.claims_loss else "no loss: a risk"
        click.echo(f"{r.id:6} {r.name:{w}} {r.layer:8} {r.status:10} {explains:20} {r.title}")
    click.echo(
        "\n`plasmient-report rules --explain ID` prints a rule's page (docs/rules/ID.md); --select / --ignore / "
        "--rules-config choose and tune them; a preview rule runs only when selected by its own code."
    )


@main.command(short_help="Compare two runs; exit 1 on a regression (the CI gate).")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option(
    "--fail-if-drop",
    "fail_if_drop",
    type=float,
    metavar="PTS",
    help="Exit 1 when the achieved fraction of peak fell by more than PTS percentage points; exit 2 when "
    "either side's achieved fraction is unknown or only a lower bound (the gate cannot decide).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--markdown",
    "markdown_file",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Also write the comparison as GitHub-flavoured markdown (a PR comment, $GITHUB_STEP_SUMMARY); "
    "'-' prints it instead of the table.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def diff(base: Path, candidate: Path, fail_if_drop: float | None, as_json: bool, markdown_file: Path | None, debug: bool) -> None:
    """Compare two runs: BASE and CANDIDATE are verdict.json files, output folders, or traces (analysed now).
    Prints the headline numbers, the losses, per-rank and per-range numbers, and new / resolved findings.

    \b
    The CI gate for pull requests, with --fail-if-drop PTS:
      exit 0  the achieved fraction of peak fell by at most PTS points (or rose)
      exit 1  it fell by more (a regression)
      exit 2  a verdict is malformed, or either achieved fraction is unknown or a lower bound"""
    from . import diff as diff_stage

    if fail_if_drop is not None and not fail_if_drop >= 0:
        _fail("--fail-if-drop must be a number of percentage points (>= 0)")
    _check_markdown(markdown_file, as_json)
    try:
        result = diff_stage.compare(diff_stage.load(base), diff_stage.load(candidate), fail_if_drop)
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except (duckdb.Error, MemoryError, RecursionError) as e:
        if debug:
            raise
        _fail(_could_not_analyse(f"{base}, {candidate}", e, None))
    except Exception as e:  # a bug of ours: one line and exit 2, never 1 (the regression code)
        if debug:
            raise
        _fail(f"diff: internal error ({_one_line(e)}); rerun with --debug and report it")
    if markdown_file is not None:
        from .render import markdown

        _write_markdown(markdown_file, markdown.diff(result))
    if as_json:
        import json

        click.echo(json.dumps(result, indent=1))
    elif markdown_file is None or str(markdown_file) != "-":
        diff_stage.render(result)
    gate = result["gate"]
    if gate["failed"]:
        click.echo(f"plasmient-report: regression: {gate['message']}", err=True)
        sys.exit(1)
    if gate["undecided"]:
        _fail(gate["message"])


@main.command(short_help="Analyse many runs: a folder or archive of runs -> a fleet summary.")
@click.argument("archives", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="ARCHIVE...")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Output folder (default ./plasmient-out/batch-<name>/): runs/<run>/, summary.parquet, "
    "index.html. Must be new, empty, or an earlier batch output of this tool (then resumed).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: a process pool; ray: Ray tasks (pip install 'plasmient-report[ray]').",
)
@click.option("--address", help="Ray cluster address (with --executor ray; default: start a local Ray).")
@click.option("--jobs", type=int, help="Parallel runs (default: the CPU count; local Ray: its CPUs).")
@click.option(
    "--group-by",
    "group_by",
    default="folder",
    show_default=True,
    metavar="folder|prefix|REGEX",
    help="Which files are one run: a folder of traces; names differing only by a rank number; or a regex "
    "over each file's path whose group 'run' names the run.",
)
@click.option("--force", is_flag=True, help="Analyse every run again, even those whose inputs are unchanged.")
@click.option(
    "--max-unpacked-gib",
    type=float,
    default=64.0,
    show_default=True,
    help="Refuse archives that unpack to more than this (all archives together).",
)
@click.option("--quiet", is_flag=True, help="Print nothing unless runs failed (then their count).")
@analysis_options(batch=True)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def batch(
    archives: tuple[Path, ...],
    out_dir: Path | None,
    executor: str,
    address: str | None,
    jobs: int | None,
    group_by: str,
    force: bool,
    max_unpacked_gib: float,
    quiet: bool,
    analysis: dict[str, Any],
    debug: bool,
) -> None:
    """Analyse many runs: ARCHIVE is a folder, .tar, .tar.gz, .tar.zst or .zip of runs (docs/batch.md).

    Exit 0 when the batch ran, even if some runs failed (they are counted here and listed in summary.parquet
    and index.html, as are folders that held no run); 2 when an archive or an argument is unusable; 130 when
    interrupted (the workers stop with it). A rerun resumes: runs whose inputs and outputs are unchanged are
    skipped."""
    from . import scratch
    from .batch import Progress as BatchProgress
    from .batch import run_batch
    from .batch.archive import label_of

    if address and executor != "ray":
        _fail("--address needs --executor ray")
    if not max_unpacked_gib > 0:
        _fail("--max-unpacked-gib must be a positive number")
    opts = _options(**analysis)
    if out_dir is None:
        out_dir = Path("plasmient-out") / f"batch-{label_of(Path(archives[0]).absolute())}"
    progress = BatchProgress(quiet)
    try:
        with scratch.run():
            result = run_batch(
                list(archives),
                out_dir,
                opts,
                executor=executor,
                jobs=jobs,
                address=address,
                group_by=group_by,
                force=force,
                max_unpacked_bytes=int(max_unpacked_gib * (1 << 30)),
                on_done=progress,
                on_start=progress.start,
            )
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except Exception as e:  # not a run's error (those are rows of the summary): a bug of ours
        if debug:
            raise
        _fail(f"batch: internal error ({_one_line(e)}); rerun with --debug and report it")
    finally:
        progress.stop()
    runs, failed, skipped = len(result.outcomes), result.count("failed"), result.count("skipped")
    if not quiet or failed:
        unread = len(result.unread)
        click.echo(
            f"batch: {runs} run{'s' if runs != 1 else ''}: {result.count('analysed')} analysed, "
            f"skipped {skipped} (unchanged), {failed} failed"
            + (
                f"; {unread} file{'s' if unread != 1 else ''} / folder{'s' if unread != 1 else ''} in no run (listed in "
                "the summary)"
                if unread
                else ""
            ),
            err=True,
        )
    if not quiet:  # (the failures were listed as they happened)
        click.echo(f"summary: {path_text(result.summary)}\nindex:   {path_text(result.index)}")


# ----------------------------------------------------------------------------- measure, nsys-recipe-path
# (docs: README "Measure your own GPU" and "Inside Nsight Systems: nsys recipe plasmient")


@main.command(short_help="Run known workloads on this GPU and analyse them (needs torch + CUDA).")
@click.option(
    "--workload",
    type=click.Choice(["matmul", "memory", "launch", "attention", "all"]),
    default="all",
    show_default=True,
    help="Which workload to run: each is bound by one thing, by construction.",
)
@click.option("--gpu-index", type=int, default=0, show_default=True, help="CUDA device index of the GPU to measure.")
@click.option(
    "--seconds",
    type=float,
    default=1.0,
    show_default=True,
    help="Profiled time per workload (the launch workload is capped at 50,000 launches).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Output folder (default ./plasmient-out/measure/): recording/ (traces, NVML samples, truth), "
    "<workload>/ (verdict.json, report.html, …), summary.json.",
)
@click.option(
    "--from",
    "from_dir",
    type=click.Path(path_type=Path),
    help="Analyse a recording made earlier by `measure` (its folder) instead of recording: no GPU needed.",
)
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--no-trace", is_flag=True, help="Do not write trace.pftrace.")
@click.option("--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def measure(
    workload: str,
    gpu_index: int,
    seconds: float,
    out_dir: Path | None,
    from_dir: Path | None,
    no_html: bool,
    no_trace: bool,
    quiet: bool,
    debug: bool,
) -> None:
    """Run known workloads on this GPU under the PyTorch profiler with NVML sampling, then analyse them: what
    nvidia-smi shows beside the fraction of peak achieved, and this GPU's measured ceilings.

    Needs torch with CUDA and nvidia-ml-py: pip install 'plasmient-report[measure]'."""
    from .workloads import command

    try:
        command.run(
            workload, gpu_index, seconds, out_dir, from_dir, quiet=quiet, write_html=not no_html, write_trace=not no_trace
        )
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except Exception as e:  # a bug of ours (or of the GPU stack): one line, exit 2; --debug shows the traceback
        if debug:
            raise
        _fail(f"measure: internal error ({_one_line(e)}); rerun with --debug and report it")


@main.command("nsys-recipe-path", short_help="The folder to put on NSYS_RECIPE_PATH for `nsys recipe plasmient`.")
def nsys_recipe_path() -> None:
    """Print the folder to put on NSYS_RECIPE_PATH for `nsys recipe plasmient --input DIR --output OUT`."""
    from .nsys_recipe import recipe_path

    click.echo(str(recipe_path()))


def run() -> None:
    """The console script `plasmient-report` (and `python -m plasmient_report.cli`): the command line, then an exit
    without the interpreter's last cycle collections over every object the run loaded. Python collects all of them
    again while it shuts down (the modules of DuckDB, Arrow, numpy, matplotlib: ~100 k objects), ~0.1 s of every
    run on the 2-vCPU VM. Frozen (`gc.freeze`), they are left out of those collections; they are still freed, and
    what must happen at exit happens regardless: the run removes its scratch folder itself, and weakref.finalize
    and atexit callbacks still run. Measured (benchmarks/README.md, session 31), interleaved: the 100 MiB Kineto
    trace median 2.73 -> 2.62 s, 3.67 -> 3.56 CPU-s (six runs each); the bundled sample 1.86 -> 1.73 s (eight).
    Only here, where the process ends: `main` called by a process that goes on (tests, a program embedding the
    tool) freezes nothing."""
    try:
        main(prog_name="plasmient-report")
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
