"""Command line: arguments in, pipeline call, exit codes out — no analysis here.

Exit codes: 0 success; 1 a regression (diff); 2 unusable input or arguments (one line, no traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import duckdb

from . import __version__
from .errors import BadInput

SUBCOMMANDS = ("report", "batch", "query", "peaks", "rules", "diff", "measure", "nsys-recipe-path")


class DefaultGroup(click.Group):
    """`plasmient-report INPUT...` is `plasmient-report report INPUT...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["report", *args]
        return super().parse_args(ctx, args)


def _fail(msg: str, debug: bool = False) -> NoReturn:
    click.echo(f"plasmient-report: error: {msg}", err=True)
    sys.exit(2)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="plasmient-report")
def main() -> None:
    """Utilization vs achieved fraction of peak from GPU traces, and where the rest went."""


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Output folder (default ./plasmient-out/<name>/).")
@click.option("--range", "ranges", multiple=True, help="Analyse only inside ranges of this name (glob; repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json to stdout instead of the box.")
@click.option("--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--no-trace", is_flag=True, help="Do not write trace.pftrace.")
@click.option("--peak-precision", type=click.Choice(["bf16", "fp16", "fp8", "int8", "tf32", "fp32", "fp64"]),
              help="Precision of the peak (default: the dominant matmul precision seen).")
@click.option("--peak-tflops", type=float, help="Use this peak (TFLOP/s) instead of the table's.")
@click.option("--peaks", "peaks_file", type=click.Path(path_type=Path), help="TOML file adding/overriding GPUs.")
@click.option("--gpu", help="GPU name when the trace does not name it (e.g. H100-SXM, 'NVIDIA A100-SXM4-80GB').")
@click.option("--model-flops", type=float, metavar="N",
              help="FLOPs per step (ProfilerStep#N) or per --range occurrence, e.g. 6·params·tokens; spread over "
                   "that window's compute kernels by time (use when shapes are missing: CUDA graphs, compiled code).")
@click.option("--tz", help="Time zone of local-time logs (nvidia-smi), e.g. Europe/Berlin (default: this machine's).")
@click.option("--offset", "offsets", multiple=True, metavar="SOURCE=±DURATION",
              help="Force a clock offset on one input (path or file name), e.g. dmon.txt=+37s (repeatable).")
@click.option("--dcgm-period", type=float, default=1.0, show_default=True,
              help="Sampling period (s) of logs that print no time (dcgmi dmon, nvidia-smi dmon without -o T).")
@click.option("--select", "rule_select", multiple=True, metavar="IDS",
              help="Run only these rules: IDs, ID prefixes or names, comma-separated (e.g. PR1,PR502; default ALL).")
@click.option("--ignore", "rule_ignore", multiple=True, metavar="IDS", help="Skip these rules (as --select).")
@click.option("--rules-config", type=click.Path(path_type=Path),
              help="TOML file: select / ignore, and per-rule thresholds ([PR101] min_lateness_us = 50).")
@click.option("--memory-budget", default="1.5GiB", show_default=True, metavar="SIZE",
              help="Peak memory to stay under, e.g. 800MB, 4GiB, or 'none': the store spills to a temporary folder "
                   "beyond it (traces of many GB).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def report(inputs: tuple[Path, ...], out_dir: Path | None, ranges: tuple[str, ...], as_json: bool, quiet: bool,
           no_html: bool, no_trace: bool, peak_precision: str | None, peak_tflops: float | None,
           peaks_file: Path | None, gpu: str | None, model_flops: float | None, tz: str | None,
           offsets: tuple[str, ...], dcgm_period: float,
           rule_select: tuple[str, ...], rule_ignore: tuple[str, ...], rules_config: Path | None,
           memory_budget: str, debug: bool) -> None:
    """Analyse INPUT files/folders and print the verdict (the main job)."""
    from . import pipeline
    from .render import terminal
    from .render import verdict as verdict_render

    opts = _options(ranges=ranges, peak_precision=peak_precision, peak_tflops=peak_tflops, peaks_file=peaks_file,
                    gpu=gpu, write_html=not no_html, write_trace=not no_trace, tz=tz, offsets=offsets,
                    dcgm_period_s=dcgm_period, rule_select=rule_select, rule_ignore=rule_ignore,
                    rules_config=rules_config, model_flops=model_flops, memory_budget=memory_budget)
    out_dir = out_dir or pipeline.default_out_dir(inputs)
    opts.cache_dir = Path(out_dir).absolute().parent / ".plasmient-cache"
    try:
        result = pipeline.analyse(list(inputs), opts, progress=_progress() if not quiet else None)
        try:
            out = pipeline.write_outputs(result, out_dir, inputs, opts)
        finally:
            result.close()
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
        return
    except (duckdb.Error, MemoryError, RecursionError) as e:
        if debug:
            raise
        _fail(f"{', '.join(map(str, inputs))}: could not analyse ({type(e).__name__}: {str(e).splitlines()[0]})")
        return
    except Exception as e:  # a bug of ours: still one line and exit 2 (the contract); --debug shows the traceback
        if debug:
            raise
        _fail(f"{', '.join(map(str, inputs))}: internal error ({_one_line(e)}); rerun with --debug and report it")
    if as_json:
        click.echo(verdict_render.dumps(result.verdict), nl=False)
    elif not quiet:
        terminal.render(result.verdict, footer=f"outputs: {out}/")


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def _options(*, peak_tflops: float | None, model_flops: float | None, dcgm_period_s: float, memory_budget: str,
             **kw: Any) -> Any:
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
    return pipeline.Options(peak_tflops=peak_tflops, model_flops=model_flops, dcgm_period_s=dcgm_period_s,
                            memory_budget=budget, **kw)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
               "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int | None:
    """'1.5GiB', '800MB', '2g', '1073741824' → bytes; 'none' / 'off' / '0' → None (no limit)."""
    import re

    t = text.strip().lower()
    if t in ("none", "off", "unlimited", "0"):
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", t)
    if not m or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 1.5GiB, 800MB, none)")
    n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if n < 256 << 20:
        raise ValueError(f"{text!r} is too small: at least 256MiB")
    return n


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None
    from rich.console import Console

    console = Console(stderr=True)

    def cb(what: str, i: int, n: int) -> None:
        console.print(f"[dim]{what} ({i}/{n})[/dim]", end="\r")

    return cb


@main.command()
@click.argument("db", type=click.Path(path_type=Path))
@click.argument("sql")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
def query(db: Path, sql: str, as_csv: bool) -> None:
    """Run SQL over a stored run (run.duckdb)."""
    from . import store

    if not db.exists():
        _fail(f"{db}: no such file")
    try:
        con = store.open_readonly(db)
        cur = con.execute(sql)
        if cur.description is None:
            return
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
    except duckdb.Error as e:
        _fail(f"{db}: {str(e).splitlines()[0]}")
        return
    if as_csv:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(*cols)
    for r in rows:
        t.add_row(*("" if x is None else str(x) for x in r))
    Console().print(t)


@main.command()
@click.argument("gpu", required=False)
@click.option("--peaks", "peaks_file", type=click.Path(path_type=Path), help="TOML file adding/overriding GPUs.")
def peaks(gpu: str | None, peaks_file: Path | None) -> None:
    """The peak table (dense TFLOP/s per precision, memory bandwidth), with sources."""
    from rich.console import Console
    from rich.table import Table

    from .peaks import PRECISIONS, load_table, lookup

    try:
        table = load_table(peaks_file)
        rows = [lookup(gpu, table)] if gpu else table
    except BadInput as e:
        _fail(str(e))
        return
    t = Table("gpu", *PRECISIONS, "GB/s", title="dense peak TFLOP/s (TOPS for int8)")
    for g in rows:
        t.add_row(g.key, *(f"{g.tflops[p]:g}" if p in g.tflops else "-" for p in PRECISIONS),
                  f"{g.memory_bandwidth_gbs:g}" if g.memory_bandwidth_gbs else "-")
    c = Console()
    c.print(t)
    for g in rows:
        c.print(f"[dim]{g.key}: {g.name} — {g.source}[/dim]")


@main.command()
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

        click.echo(json.dumps([{"id": r.id, "name": r.name, "layer": r.layer, "category": r.category,
                                "title": r.title, "thresholds": dict(r.thresholds), "origin": r.origin}
                               for r in catalog], indent=1))
        return
    w = max(len(r.name) for r in catalog) if catalog else 4
    click.echo(f"{'id':6} {'name':{w}} {'layer':8} {'explains':20} title")
    for r in catalog:
        click.echo(f"{r.id:6} {r.name:{w}} {r.layer:8} {(r.category or '-'):20} {r.title}")
    click.echo("\n`plasmient-report rules --explain ID` prints a rule's page; --select / --ignore / --rules-config "
               "choose and tune them.")


@main.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--fail-if-drop", "fail_if_drop", type=float, metavar="PTS",
              help="Exit 1 when the achieved fraction of peak fell by more than PTS percentage points.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def diff(base: Path, candidate: Path, fail_if_drop: float | None, as_json: bool, debug: bool) -> None:
    """Compare two runs (verdict.json files, output folders, or traces): numbers, losses, findings.

    The CI gate for pull requests: with --fail-if-drop, exit 1 on a regression of the achieved fraction of peak."""
    from . import diff as diff_stage

    if fail_if_drop is not None and not fail_if_drop >= 0:
        _fail("--fail-if-drop must be a number of percentage points (>= 0)")
    try:
        result = diff_stage.compare(diff_stage.load(base), diff_stage.load(candidate), fail_if_drop)
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
        return
    if as_json:
        import json

        click.echo(json.dumps(result, indent=1))
    else:
        diff_stage.render(result)
    gate = result["gate"]
    if gate["failed"]:
        click.echo(f"plasmient-report: regression: {gate['message']}", err=True)
        sys.exit(1)
    if gate["threshold_pts"] is not None and gate["drop_pts"] is None:
        _fail(gate["message"])


@main.command()
@click.argument("archives", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Output folder (default ./plasmient-out/batch-<name>/): runs/<run>/, summary.parquet, index.html.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool; ray: Ray tasks (pip install 'plasmient-report[ray]').")
@click.option("--address", help="Ray cluster address (with --executor ray; default: start a local Ray).")
@click.option("--jobs", type=int, help="Parallel runs (default: the CPU count; local Ray: its CPUs).")
@click.option("--group-by", "group_by", default="folder", show_default=True, metavar="folder|prefix|REGEX",
              help="Which files are one run: a folder of traces; names differing only by a rank number; or a regex "
                   "over each file's path whose group 'run' names the run.")
@click.option("--force", is_flag=True, help="Analyse every run again, even those whose inputs are unchanged.")
@click.option("--max-unpacked-gib", type=float, default=64.0, show_default=True,
              help="Refuse archives that unpack to more than this (all archives together).")
@click.option("--no-html", is_flag=True, help="No report.html per run.")
@click.option("--no-trace", is_flag=True, help="No trace.pftrace per run.")
@click.option("--quiet", is_flag=True, help="Print nothing unless runs failed (then their count).")
@click.option("--range", "ranges", multiple=True, help="As for the main job: analyse only inside these ranges.")
@click.option("--peak-precision", type=click.Choice(["bf16", "fp16", "fp8", "int8", "tf32", "fp32", "fp64"]))
@click.option("--peak-tflops", type=float)
@click.option("--peaks", "peaks_file", type=click.Path(path_type=Path))
@click.option("--gpu")
@click.option("--model-flops", type=float, metavar="N")
@click.option("--tz")
@click.option("--dcgm-period", type=float, default=1.0, show_default=True)
@click.option("--select", "rule_select", multiple=True, metavar="IDS")
@click.option("--ignore", "rule_ignore", multiple=True, metavar="IDS")
@click.option("--rules-config", type=click.Path(path_type=Path))
@click.option("--memory-budget", default="1.5GiB", show_default=True, metavar="SIZE",
              help="Peak memory of each worker (as for the main job; 'none' for no limit).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def batch(archives: tuple[Path, ...], out_dir: Path | None, executor: str, address: str | None, jobs: int | None,
          group_by: str, force: bool, max_unpacked_gib: float, no_html: bool, no_trace: bool, quiet: bool,
          ranges: tuple[str, ...], peak_precision: str | None, peak_tflops: float | None, peaks_file: Path | None,
          gpu: str | None, model_flops: float | None, tz: str | None, dcgm_period: float,
          rule_select: tuple[str, ...], rule_ignore: tuple[str, ...], rules_config: Path | None, memory_budget: str,
          debug: bool) -> None:
    """Analyse many runs: ARCHIVE is a folder, .tar, .tar.gz, .tar.zst or .zip of runs (docs/batch.md).

    Exit 0 when the batch ran, even if some runs failed (they are counted here and listed in summary.parquet
    and index.html); 2 when an archive or an argument is unusable."""
    from .batch import Progress, run_batch
    from .batch.archive import label_of

    if address and executor != "ray":
        _fail("--address needs --executor ray")
    if not max_unpacked_gib > 0:
        _fail("--max-unpacked-gib must be a positive number")
    opts = _options(ranges=ranges, peak_precision=peak_precision, peak_tflops=peak_tflops, peaks_file=peaks_file,
                    gpu=gpu, write_html=not no_html, write_trace=not no_trace, tz=tz, dcgm_period_s=dcgm_period,
                    rule_select=rule_select, rule_ignore=rule_ignore, rules_config=rules_config,
                    model_flops=model_flops, memory_budget=memory_budget)
    if out_dir is None:
        out_dir = Path("plasmient-out") / f"batch-{label_of(Path(archives[0]).absolute())}"
    progress = Progress(quiet)
    try:
        result = run_batch(list(archives), out_dir, opts, executor=executor, jobs=jobs, address=address,
                           group_by=group_by, force=force, max_unpacked_bytes=int(max_unpacked_gib * (1 << 30)),
                           on_done=progress, on_start=progress.start)
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
        return
    except Exception as e:  # not a run's error (those are rows of the summary): a bug of ours
        if debug:
            raise
        _fail(f"batch: internal error ({_one_line(e)}); rerun with --debug and report it")
    finally:
        progress.stop()
    runs, failed, skipped = len(result.outcomes), result.count("failed"), result.count("skipped")
    if not quiet or failed:
        click.echo(f"batch: {runs} run{'s' if runs != 1 else ''}: {result.count('analysed')} analysed, "
                   f"skipped {skipped} (unchanged), {failed} failed", err=True)
    if not quiet:  # (the failures were listed as they happened)
        click.echo(f"summary: {result.summary}\nindex:   {result.index}")


# ----------------------------------------------------------------------------- measure, nsys-recipe-path
# (docs: README "Measure your own GPU" and "Inside Nsight Systems: nsys recipe plasmient")

@main.command()
@click.option("--workload", type=click.Choice(["matmul", "memory", "launch", "attention", "all"]), default="all",
              show_default=True, help="Which workload to run: each is bound by one thing, by construction.")
@click.option("--gpu-index", type=int, default=0, show_default=True, help="CUDA device index of the GPU to measure.")
@click.option("--seconds", type=float, default=1.0, show_default=True,
              help="Profiled time per workload (the launch workload is capped at 50,000 launches).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Output folder (default ./plasmient-out/measure/): recording/ (traces, NVML samples, truth), "
                   "<workload>/ (verdict.json, report.html, …), summary.json.")
@click.option("--from", "from_dir", type=click.Path(path_type=Path),
              help="Analyse a recording made earlier by `measure` (its folder) instead of recording: no GPU needed.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--no-trace", is_flag=True, help="Do not write trace.pftrace.")
@click.option("--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def measure(workload: str, gpu_index: int, seconds: float, out_dir: Path | None, from_dir: Path | None,
            no_html: bool, no_trace: bool, quiet: bool, debug: bool) -> None:
    """Run known workloads on this GPU under the PyTorch profiler with NVML sampling, then analyse them: what
    nvidia-smi shows beside the fraction of peak achieved, and this GPU's measured ceilings.

    Needs torch with CUDA and nvidia-ml-py: pip install 'plasmient-report[measure]'."""
    from .workloads import command

    try:
        command.run(workload, gpu_index, seconds, out_dir, from_dir, quiet=quiet, write_html=not no_html,
                    write_trace=not no_trace)
    except BadInput as e:
        if debug:
            raise
        _fail(str(e))
    except Exception as e:  # a bug of ours (or of the GPU stack): one line, exit 2; --debug shows the traceback
        if debug:
            raise
        _fail(f"measure: internal error ({_one_line(e)}); rerun with --debug and report it")


@main.command("nsys-recipe-path")
def nsys_recipe_path() -> None:
    """Print the folder to put on NSYS_RECIPE_PATH for `nsys recipe plasmient --input DIR --output OUT`."""
    from .nsys_recipe import recipe_path

    click.echo(str(recipe_path()))


if __name__ == "__main__":
    main()
