"""One run, five stages over one store: ingest → align → measure → judge (rules, then the verdict) → render."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from . import align as align_stage
from . import judge, metrics, parsers, rules, store
from .errors import BadInput
from .parsers import _io
from .peaks import load_table
from .store import one

# Peak RSS the main job aims to stay under, whatever the trace size (--memory-budget): DuckDB gets the budget
# less what the interpreter, the libraries and the Arrow batches passed to Python take, and spills the rest.
DEFAULT_MEMORY_BUDGET = 1536 << 20
PYTHON_RESERVE = 512 << 20
MIN_DUCKDB_MEMORY = 256 << 20


@dataclass
class Options:
    ranges: Sequence[str] = ()
    peak_precision: str | None = None
    peak_tflops: float | None = None
    peaks_file: Path | None = None
    gpu: str | None = None
    write_html: bool = True
    write_trace: bool = True
    rule_select: Sequence[str] = ()  # --select: rule IDs, ID prefixes or names (default: all)
    rule_ignore: Sequence[str] = ()  # --ignore
    rules_config: Path | None = None  # --rules-config FILE.toml: select / ignore / per-rule thresholds
    cache_dir: Path | None = None  # where `.nsys-rep` exports are cached (beside the output, never the input)
    tz: str | None = None  # --tz: zone of local-time logs (nvidia-smi); None = this machine's zone
    offsets: Sequence[str] = ()  # --offset SOURCE=±DURATION (forced clock offsets)
    dcgm_period_s: float = 1.0  # --dcgm-period: sampling period of logs that print no time
    counter_search_s: float = align_stage.DEFAULT_SEARCH_NS / 1e9  # counter-log alignment: ± search range
    model_flops: float | None = None  # --model-flops: FLOPs per step / per --range occurrence (the MFU convention)
    memory_budget: int | None = DEFAULT_MEMORY_BUDGET  # --memory-budget: peak RSS to stay under (None: no limit)

    def parse_options(self) -> parsers.ParseOptions:
        return parsers.ParseOptions(tz=self.tz, dcgm_period_s=self.dcgm_period_s)


@dataclass
class Result:
    con: duckdb.DuckDBPyConnection
    verdict: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    spill_dir: Path | None = None

    def close(self) -> None:
        """Close the store and remove its spill folder (the outputs are written by then)."""
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        if self.spill_dir is not None:
            _remove_spill_dir(self.spill_dir)
            self.spill_dir = None


_SPILL_DIRS: set[Path] = set()


def _remove_spill_dir(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)
    _SPILL_DIRS.discard(d)


@atexit.register
def _remove_spill_dirs() -> None:
    for d in list(_SPILL_DIRS):
        _remove_spill_dir(d)


def open_store(opts: Options) -> tuple[duckdb.DuckDBPyConnection, Path | None]:
    """The run's store: a DuckDB file in a private temporary folder (it becomes run.duckdb by a move), under the
    memory budget, spilling into the same folder; removed by Result.close(), when the Result is collected, or at
    exit."""
    spill = Path(tempfile.gettempdir()) / f"plasmient-spill-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    _SPILL_DIRS.add(spill)
    limit = None if opts.memory_budget is None else max(MIN_DUCKDB_MEMORY, opts.memory_budget - PYTHON_RESERVE)
    return store.connect_run(spill, limit), spill


@contextlib.contextmanager
def run_store(inputs: Sequence[Path], opts: Options) -> Iterator[duckdb.DuckDBPyConnection]:
    """A store for one run, closed (and its spill folder removed) on exit."""
    con, spill = open_store(opts)
    try:
        yield con
    finally:
        Result(con=con, verdict={}, spill_dir=spill).close()


Progress = Callable[[str, int, int], None]


def ingest(con: duckdb.DuckDBPyConnection, inputs: Sequence[Path], progress: Progress | None = None,
           cache_dir: Path | None = None, parse_options: parsers.ParseOptions | None = None) -> None:
    found = parsers.discover(list(inputs), cache_dir)
    for i, d in enumerate(found):
        if progress:
            progress(f"ingest {d.path.name}", i, len(found))
        info = parsers.ingest_one(d, con, i, parse_options)
        con.execute(
            """INSERT INTO sources (source_id, path, format, format_version, host, rank, rank_method, world_size,
                                    clock_anchor, base_time_ns, sha256, size_bytes, events, notes, time_zone,
                                    sample_period_ns, incomplete, dropped_events)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [i, str(d.path), info.format, info.format_version, info.host, info.rank,
             "multi" if info.multi_rank else info.rank_method, info.world_size,
             info.clock_anchor, info.base_time_ns, _io.sha256_of(d.path), _io.size_of(d.path), info.events,
             "; ".join(info.notes) or None, info.time_zone, info.sample_period_ns,
             "; ".join(info.incomplete) or None, info.dropped_events])
        if info.gpu_events == 0 and d.format not in parsers.AUXILIARY:
            if len(found) == 1:
                raise BadInput(d.path, "trace has no GPU kernels or copies (a CPU-only profile?)")
    if progress:
        progress("ingest", len(found), len(found))
    n = one(con, "SELECT count(*) FROM kernels")
    if (not n or n[0] == 0) and all(d.format in parsers.AUXILIARY for d in found):
        raise BadInput(", ".join(str(p) for p in inputs), "counter logs need a trace to align to (give the "
                                                          "PyTorch profiler / Nsight Systems trace of the same run)")
    if not n or n[0] == 0:
        raise BadInput(", ".join(str(p) for p in inputs), "no GPU kernels or copies in any input")
    con.execute("""UPDATE sources SET first_ns = t.s, last_ns = t.e FROM (
                       SELECT source_id, min(start_ns) s, max(end_ns) e FROM kernels GROUP BY source_id) t
                   WHERE sources.source_id = t.source_id""")


def measure(con: duckdb.DuckDBPyConnection, opts: Options) -> judge.RunContext:
    metrics.model_op_flops(con)
    metrics.nest_ops(con)
    metrics.attribute_kernel_flops(con)
    metrics.model_kernel_bytes(con)
    user_note = None
    if opts.model_flops is not None:
        user_note = metrics.apply_model_flops(con, opts.model_flops, list(opts.ranges))
    table = load_table(opts.peaks_file)
    precision, gpu_peaks = metrics.assign_peaks(con, table, opts.peak_precision, opts.gpu, opts.peak_tflops)
    missing = metrics.build_windows(con, list(opts.ranges))
    if opts.ranges:
        have = {r for (r,) in con.execute("SELECT DISTINCT range_name FROM windows WHERE scope='range'").fetchall()}
        absent = [p for p in opts.ranges if p not in have]
        if len(absent) == len(opts.ranges):
            names = [n for (n,) in con.execute(
                "SELECT name FROM ranges WHERE domain IS DISTINCT FROM 'python' GROUP BY name ORDER BY min(start_ns) "
                "LIMIT 12").fetchall()]
            raise BadInput(None, f"no range matches {', '.join(repr(a) for a in absent)}; ranges in the trace "
                                 f"include: {', '.join(names) or '(none)'}")
    metrics.sweep(con, gpu_peaks)
    return judge.RunContext(inputs=[], ranges=list(opts.ranges), precision=precision, peaks=gpu_peaks,
                            missing_ranges=missing, notes=[user_note] if user_note else [])


def analyse(inputs: Sequence[Path], opts: Options, progress: Progress | None = None) -> Result:
    """The pure per-run function: inputs in, store + verdict out (nothing written to disk)."""
    selection = rules.configure(opts.rule_select, opts.rule_ignore, opts.rules_config)  # bad codes: fail early
    judge.thresholds_from(opts.rules_config)  # and bad verdict thresholds
    con, spill = open_store(opts)
    try:
        ingest(con, inputs, progress, opts.cache_dir, opts.parse_options())
        notes = align_stage.align(con, opts.offsets, int(opts.counter_search_s * 1e9))
        ctx = measure(con, opts)
        ctx.inputs = [str(p) for p in inputs]
        _, rule_notes = rules.run(con, selection, ctx.ranges, ctx.precision, ctx.peaks, opts.peaks_file)
        ctx.notes = ctx.notes + notes + rule_notes
        verdict = judge.build(con, ctx, judge.thresholds_from(opts.rules_config))
    except BaseException:
        Result(con=con, verdict={}, spill_dir=spill).close()
        raise
    result = Result(con=con, verdict=verdict, notes=notes, spill_dir=spill)
    if spill is not None:
        weakref.finalize(result, _remove_spill_dir, spill)
    return result


def default_out_dir(inputs: Sequence[Path]) -> Path:
    first = Path(inputs[0])
    name = first.name
    for suffix in (".gz", ".json", ".pt.trace", ".sqlite", ".nsys-rep"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path("plasmient-out") / (name or "run")


def write_outputs(result: Result, out_dir: Path, inputs: Sequence[Path], opts: Options) -> Path:
    """Render into a temporary sibling folder, then rename it into place: never half-written."""
    from .render import verdict as verdict_render

    out_dir = Path(out_dir).absolute()
    resolved_inputs = [Path(p).resolve() for p in inputs]
    for p in resolved_inputs:
        if out_dir == p or (p.is_dir() and p in out_dir.parents) or out_dir in p.parents:
            raise BadInput(out_dir, "output folder would be inside or over an input; choose another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        verdict_render.write(result.verdict, tmp / "verdict.json")
        if opts.write_html:
            from .render import html

            html.write(result.con, result.verdict, tmp / "report.html")
        if opts.write_trace:
            from .render import perfetto

            perfetto.write(result.con, result.verdict, tmp / "trace.pftrace")
        store.save(result.con, tmp / "run.duckdb")  # checkpointed and moved there: no copy
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old.{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
