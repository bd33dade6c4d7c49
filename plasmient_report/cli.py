"""Command line: arguments in, pipeline call, exit codes out — no analysis here.

Exit codes: 0 success; 1 a regression (diff); 2 unusable input or arguments (one line, no traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import duckdb

from . import __version__
from .errors import BadInput

SUBCOMMANDS = ("report", "query", "peaks")


class DefaultGroup(click.Group):
    """`plasmient-report INPUT...` is `plasmient-report report INPUT...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["report", *args]
        return super().parse_args(ctx, args)


def _fail(msg: str, debug: bool = False) -> None:
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
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def report(inputs: tuple[Path, ...], out_dir: Path | None, ranges: tuple[str, ...], as_json: bool, quiet: bool,
           no_html: bool, no_trace: bool, peak_precision: str | None, peak_tflops: float | None,
           peaks_file: Path | None, gpu: str | None, debug: bool) -> None:
    """Analyse INPUT files/folders and print the verdict (the main job)."""
    from . import pipeline
    from .render import terminal
    from .render import verdict as verdict_render

    if peak_tflops is not None and not peak_tflops > 0:
        _fail("--peak-tflops must be a positive number")
    opts = pipeline.Options(ranges=ranges, peak_precision=peak_precision, peak_tflops=peak_tflops,
                            peaks_file=peaks_file, gpu=gpu, write_html=not no_html, write_trace=not no_trace)
    out_dir = out_dir or pipeline.default_out_dir(inputs)
    opts.cache_dir = Path(out_dir).absolute().parent / ".plasmient-cache"
    try:
        result = pipeline.analyse(list(inputs), opts, progress=_progress() if not quiet else None)
        out = pipeline.write_outputs(result, out_dir, inputs, opts)
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
    if as_json:
        click.echo(verdict_render.dumps(result.verdict), nl=False)
    elif not quiet:
        terminal.render(result.verdict, footer=f"outputs: {out}/")


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

    from .peaks import PRECISIONS, load_table, match_gpu

    try:
        table = load_table(peaks_file)
    except BadInput as e:
        _fail(str(e))
        return
    rows = table
    if gpu:
        g = match_gpu(gpu, table)
        if g is None:
            _fail(f"unknown GPU {gpu!r}; known: {', '.join(x.key for x in table)}")
            return
        rows = [g]
    t = Table("gpu", *PRECISIONS, "GB/s", title="dense peak TFLOP/s (TOPS for int8)")
    for g in rows:
        t.add_row(g.key, *(f"{g.tflops[p]:g}" if p in g.tflops else "-" for p in PRECISIONS),
                  f"{g.memory_bandwidth_gbs:g}" if g.memory_bandwidth_gbs else "-")
    c = Console()
    c.print(t)
    for g in rows:
        c.print(f"[dim]{g.key}: {g.name} — {g.source}[/dim]")


if __name__ == "__main__":
    main()
