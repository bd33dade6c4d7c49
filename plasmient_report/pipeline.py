"""One run, five stages over one store: ingest → align → measure → judge (rules, then the verdict) → render."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from . import align as align_stage
from . import interrupt, judge, kernel_flops, metrics, outdir, parsers, rules, sql, store, vocab
from . import scratch as scratch_mod
from .errors import BadInput, path_text
from .parsers import _io
from .peaks import load_table
from .render.page_worker import PageWorker
from .sql import native as sql_native
from .store import one
from .verdict_model import Verdict

# Peak RSS the main job aims to stay under, whatever the trace size (--memory-budget): DuckDB gets the budget
# less what the interpreter, the libraries and the Arrow batches passed to Python take, and spills the rest. The
# reserve also covers what DuckDB's process holds beyond its own limit (its allocator's freed pages, state outside
# its buffer pool): on a 2 GiB Kineto trace a 1 GiB limit peaked at 1.7–2.0 GiB, a 768 MiB one at 1.18 GiB
# (benchmarks/README.md, session 25).
DEFAULT_MEMORY_BUDGET = 1536 << 20
PYTHON_RESERVE = 768 << 20
MIN_DUCKDB_MEMORY = 256 << 20
# The smallest --memory-budget a run can keep to: DuckDB's minimum and the reserve beside it. Below it DuckDB still
# gets its minimum, and the run's peak went over the budget: the 486 MiB nsys export peaked at 572 MiB under
# 512 MiB, the 100 MiB Kineto trace at 332 MiB under 256 MiB; the 1.8 GiB Kineto trace peaked at 760 MiB under
# 1 GiB (benchmarks/README.md, session 45). The command line refuses a smaller budget (cli.parse_size).
MIN_MEMORY_BUDGET = MIN_DUCKDB_MEMORY + PYTHON_RESERVE
# Of the reserve, what the measurement library's numpy blocks may hold beside a full DuckDB (sql/native.py); a
# larger block runs as SQL, which spills.
NATIVE_ALLOWANCE = 256 << 20


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
    tokens_per_step: float | None = None  # --tokens-per-step: throughput per step (judge; changes no measurement)
    samples_per_step: float | None = None  # --samples-per-step
    memory_budget: int | None = DEFAULT_MEMORY_BUDGET  # --memory-budget: peak RSS to stay under (None: no limit)

    def parse_options(self) -> parsers.ParseOptions:
        return parsers.ParseOptions(tz=self.tz, dcgm_period_s=self.dcgm_period_s)


class TraceWriter:
    """trace.pftrace written on a thread of its own, from a cursor of the store, while the rules and the verdict
    run on the main one: the trace reads only what the measure stage wrote (and the peaks' GPU names), so it is
    the same file either way (tests/test_pipeline_trace.py), and most of its time is DuckDB's and numpy's, which
    run beside the rules' queries (measured: benchmarks/README.md, session 8). The file goes to the run's
    scratch folder; `take` waits for it and moves it into the output's staging folder. A run that fails or is
    interrupted `cancel`s it: its queries interrupted, the thread joined, the file removed."""

    def __init__(self, con: duckdb.DuckDBPyConnection, peaks: Sequence[metrics.GpuPeak], folder: Path) -> None:
        from .render import perfetto

        self.path = folder / f"trace-{uuid.uuid4().hex[:12]}.pftrace"
        self.cursor = store.cursor(con)
        interrupt.watch(self.cursor)
        self.error: BaseException | None = None
        facts = perfetto.RunFacts.of_peaks(peaks)

        def body() -> None:
            try:
                perfetto.write(self.cursor, facts, self.path)
            except BaseException as e:  # handed to the main thread by take()
                self.error = e

        self.thread = threading.Thread(target=body, name="plasmient-trace", daemon=True)
        self.thread.start()

    def take(self, dest: Path) -> None:
        """Wait for the trace, then move it to `dest` (a rename on the same file system, else a copy); raises
        what the writer raised."""
        self.thread.join()
        self._close_cursor()
        if self.error is not None:
            self.path.unlink(missing_ok=True)
            raise self.error
        try:
            os.replace(self.path, dest)
        except OSError:  # another file system (the scratch folder is in TMPDIR)
            shutil.copyfile(self.path, dest)
            self.path.unlink(missing_ok=True)

    def cancel(self) -> None:
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.cursor.interrupt()
            self.thread.join()
        self._close_cursor()
        self.path.unlink(missing_ok=True)

    def _close_cursor(self) -> None:
        with contextlib.suppress(duckdb.Error):
            self.cursor.close()


@dataclass
class Result:
    """One analysed run: its store and its typed verdict (`typed`; `verdict` is the same as the JSON document)."""

    con: duckdb.DuckDBPyConnection
    typed: Verdict | None
    notes: list[str] = field(default_factory=list)
    spill_dir: Path | None = None
    scratch: scratch_mod.Scratch | None = None  # the scratch folder this result owns (analyse() outside a run)
    trace: TraceWriter | None = None  # trace.pftrace being written (analyse(write_trace_early=True))
    comments: list[str] = field(default_factory=list)  # the library's comments, still to add (sql.deferred_comments)

    @property
    def verdict(self) -> dict[str, Any]:
        """The verdict as verdict.json holds it (plain dicts and lists); renderers read `typed`."""
        from .render.verdict import document

        return document(self.typed) if self.typed is not None else {}

    def close(self) -> None:
        """Close the store and remove its spill folder (the outputs are written by then)."""
        if self.trace is not None:
            self.trace.cancel()  # (a trace not taken: the run failed, or its outputs were not written)
            self.trace = None
        with contextlib.suppress(duckdb.Error):
            sql_native.allow(self.con, None)
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        if self.spill_dir is not None:
            shutil.rmtree(self.spill_dir, ignore_errors=True)
            self.spill_dir = None
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None


def open_store(opts: Options, where: scratch_mod.Scratch) -> tuple[duckdb.DuckDBPyConnection, Path]:
    """The run's store: a DuckDB file in the run's scratch folder from the start (it becomes run.duckdb by a
    checkpoint and a move, `store.save`), under the memory budget (when one is set), spilling beside it — never
    DuckDB's default `.tmp` in the working folder. The scratch folder is swept by the next run if this one is
    killed."""
    spill = where.path / f"store-{uuid.uuid4().hex[:12]}"
    limit = None if opts.memory_budget is None else max(MIN_DUCKDB_MEMORY, opts.memory_budget - PYTHON_RESERVE)
    con = store.connect_run(spill, limit)
    if limit is not None:
        sql_native.allow(con, NATIVE_ALLOWANCE)
    interrupt.watch(con)  # a signal interrupts its queries (DuckDB holds the main thread while one runs)
    return con, spill


@contextlib.contextmanager
def run_store(inputs: Sequence[Path], opts: Options) -> Iterator[duckdb.DuckDBPyConnection]:
    """A store for one run, closed (and its scratch folder removed) on exit."""
    with scratch_mod.run() as where:
        con, spill = open_store(opts, where)
        try:
            yield con
        finally:
            Result(con=con, typed=None, spill_dir=spill).close()


Progress = Callable[[str, int, int], None]


def _sentences(items: Sequence[str]) -> str | None:
    """A parser's notes as one text: joined with '; ' without doubling their full stops (not 'collected.; Not')."""
    parts = [s.strip().rstrip(".;").strip() for s in items if s and s.strip()]
    return "; ".join(parts) or None


def ingest(
    con: duckdb.DuckDBPyConnection,
    inputs: Sequence[Path],
    progress: Progress | None = None,
    cache_dir: Path | None = None,
    parse_options: parsers.ParseOptions | None = None,
) -> None:
    found = parsers.discover(list(inputs), cache_dir)
    # The inputs' hashes on a thread of their own while they are parsed (hashlib lets go of the GIL): 0.07 s of
    # a 100 MB trace off the run's path.
    hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plasmient-sha256")
    stop = threading.Event()  # a failed ingest does not wait for the rest of a large file's hash
    hashes: list[Future[str]] = []
    try:
        hashes = [hashing.submit(_io.sha256_of, d.path, stop=stop) for d in found]
        _ingest_found(con, found, hashes, progress, parse_options)
    finally:
        stop.set()
        for h in hashes:
            h.cancel()
        hashing.shutdown(wait=True)
    # The parsers' staging tables and sorts are gone: their pages go back to the system, not into the peak of the
    # measure stage on top of its own (store.release_freed_memory; likewise after the measure stage and before the
    # outputs). Measured (benchmarks/README.md, session 33), eight interleaved rounds: the 100 MiB Kineto trace's
    # peak RSS 350 -> 324 MiB, 2.56 -> 2.58 s; the 486 MiB nsys export's 765 -> 737 MiB, 10.57 -> 10.51 s (later,
    # on a noisier VM, 11.16 -> 11.55 s: each purge makes the next stage fault its pages in again, ~0.1 s at most).
    store.release_freed_memory()
    if progress:
        progress("ingest", len(found), len(found))
    _drop_unplaced(con)
    n = one(con, "SELECT count(*) FROM kernels")
    if (not n or n[0] == 0) and all(d.format in parsers.AUXILIARY for d in found):
        raise BadInput(
            ", ".join(str(p) for p in inputs),
            "counter logs need a trace to align to (give the PyTorch profiler / Nsight Systems trace of the same run)",
        )
    if not n or n[0] == 0:
        raise BadInput(", ".join(str(p) for p in inputs), "no GPU kernels or copies in any input")
    con.execute("""UPDATE sources SET first_ns = t.s, last_ns = t.e FROM (
                       SELECT source_id, min(start_ns) s, max(end_ns) e FROM kernels GROUP BY source_id) t
                   WHERE sources.source_id = t.source_id""")


def _drop_unplaced(con: duckdb.DuckDBPyConnection) -> None:
    """GPU activities no parser could place on a GPU (device NULL) are left out, counted in their source's notes.
    Every measurement is per GPU, and such a row would be measured as a GPU of its own beside the real ones (a
    waterfall summing past 100%, "2 ranks alike" from one: fuzzing found it in the Kineto parser, session 37). The
    parsers leave them out themselves and say why; this holds for any parser."""
    rows = con.execute(
        "SELECT source_id, count(*) FROM kernels WHERE device IS NULL GROUP BY source_id ORDER BY source_id"
    ).fetchall()
    if not rows:
        return
    con.execute("DELETE FROM kernels WHERE device IS NULL")
    for sid, n in rows:
        con.execute(
            "UPDATE sources SET notes = concat_ws('; ', notes, ?) WHERE source_id = ?",
            [f"{n} GPU activities on no known GPU left out", sid],
        )


def _ingest_found(
    con: duckdb.DuckDBPyConnection,
    found: Sequence[parsers.Detected],
    hashes: Sequence[Future[str]],
    progress: Progress | None,
    parse_options: parsers.ParseOptions | None,
) -> None:
    for i, d in enumerate(found):
        if progress:
            progress(f"ingest {d.path.name}", i, len(found))
        info = parsers.ingest_one(d, con, i, parse_options)
        con.execute(
            """INSERT INTO sources (source_id, path, format, format_version, host, rank, rank_method, world_size,
                                    clock_anchor, base_time_ns, sha256, size_bytes, events, notes, time_zone,
                                    sample_period_ns, incomplete, dropped_events)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [
                i,
                path_text(d.path),
                info.format,
                info.format_version,
                info.host,
                info.rank,
                "multi" if info.multi_rank else info.rank_method,
                info.world_size,
                info.clock_anchor,
                info.base_time_ns,
                hashes[i].result(),
                _io.size_of(d.path),
                info.events,
                _sentences(info.notes),
                info.time_zone,
                info.sample_period_ns,
                _sentences(info.incomplete),
                info.dropped_events,
            ],
        )
        if info.gpu_events == 0 and d.format not in parsers.AUXILIARY:
            if len(found) == 1:
                calls, work = one(
                    con,
                    "SELECT count(*), count(*) FILTER (WHERE regexp_matches(name, ?) OR regexp_matches(name, ?)) "
                    "FROM api_calls WHERE source_id = ?",
                    [vocab.LAUNCH_API_RE, vocab.COPY_API_RE, i],
                ) or (0, 0)
                how = (
                    "the profiler's GPU tracer (CUPTI) lost its records"
                    if d.format in parsers.NSYS_EXPORTS
                    else "torch.profiler without ProfilerActivity.CUDA, or its GPU tracer (CUPTI / roctracer) lost its records"
                )
                raise BadInput(
                    d.path,
                    f"trace has {calls} GPU runtime calls, {work} of them launches or copies, but no GPU kernels or "
                    f"copies: the GPU activities were not recorded ({how})"
                    if work
                    else f"trace has {calls} GPU runtime calls but no launch or copy among them, and no GPU kernels or "
                    "copies: the program gave the GPU no work while it was recorded"
                    if calls
                    else info.no_gpu_reason or "trace has no GPU kernels or copies (a CPU-only profile?)",
                )


def measure(con: duckdb.DuckDBPyConnection, opts: Options) -> judge.RunContext:
    """The measure stage: ops and their models, kernel → op links, FLOPs and bytes per kernel (written once), the
    peaks, the analysed windows, then the sweep (the SQL library, plasmient_report/sql/)."""
    notes: list[str] = []
    kernel_flops.prepare_ops(con)
    kernel_flops.link_kernels(con)
    table = load_table(opts.peaks_file)

    def windows(cur: duckdb.DuckDBPyConnection) -> dict[str, list[int]]:
        return metrics.build_windows(cur, list(opts.ranges), step_occurrences=opts.model_flops is not None)

    def attribute() -> tuple[str, list[metrics.GpuPeak]]:
        kernel_flops.op_candidates(con)
        notes.extend(kernel_flops.ncu_candidates(con))
        return metrics.assign_peaks(con, table, opts.peak_precision, opts.gpu, opts.peak_tflops)

    if opts.model_flops is None:
        # The windows read the kernels' times, their launches and the ranges, and write tables of their own: they are
        # built on a cursor beside the kernels' FLOPs and bytes and the peaks (which write the kernels' FLOP columns,
        # the candidates' temp tables and the peak tables). --model-flops spreads its FLOPs over the windows'
        # occurrences: it needs them first. Measured (benchmarks/README.md, session 32): the 100 MiB Kineto trace's
        # measure stage 0.67 -> 0.62 s (six pairs); the 486 MiB nsys export's 2.2-2.4 s either way (both sides keep
        # two cores busy there).
        with store.aside(con, windows) as built:
            precision, gpu_peaks = attribute()
            notes.extend(kernel_flops.write(con))
            missing = built()
    else:
        precision, gpu_peaks = attribute()
        missing = windows(con)
    if opts.ranges:
        have = {r for (r,) in con.execute("SELECT DISTINCT range_name FROM windows WHERE scope='range'").fetchall()}
        absent = [p for p in opts.ranges if p not in have]
        if len(absent) == len(opts.ranges):
            names = [
                n
                for (n,) in con.execute(
                    "SELECT name FROM ranges WHERE domain IS DISTINCT FROM 'python' GROUP BY name ORDER BY min(start_ns) LIMIT 12"
                ).fetchall()
            ]
            raise BadInput(
                None,
                f"no range matches {', '.join(repr(a) for a in absent)}; ranges in the trace "
                f"include: {', '.join(names) or '(none)'}",
            )
    if opts.model_flops is not None:
        label = opts.ranges[0] if opts.ranges else metrics.STEP_LABEL
        notes.append(kernel_flops.user_candidates(con, opts.model_flops, label))
        notes.extend(kernel_flops.write(con))
    metrics.sweep(con)
    return judge.RunContext(
        inputs=[], ranges=list(opts.ranges), precision=precision, peaks=gpu_peaks, missing_ranges=missing, notes=notes
    )


def analyse(
    inputs: Sequence[Path],
    opts: Options,
    progress: Progress | None = None,
    write_trace_early: bool = False,
    defer_comments: bool = False,
) -> Result:
    """The pure per-run function: inputs in, store + verdict out (nothing written to disk but scratch files).

    Inside a run (`scratch.run()`, as the CLI and batch call it) the store spills into that run's scratch folder;
    outside one, the Result owns a scratch folder of its own, removed by `Result.close()` (or when it is
    collected). With `write_trace_early` (callers that go on to `write_outputs`) and `opts.write_trace`,
    trace.pftrace is written into the scratch folder while the rules run (TraceWriter). With `defer_comments`
    (callers that go on to `write_outputs`, which adds them), the measurement library's comments are kept in
    `Result.comments` instead of added to the store now (sql.deferred_comments)."""
    selection = rules.configure(opts.rule_select, opts.rule_ignore, opts.rules_config)  # bad codes: fail early
    judge.thresholds_from(opts.rules_config)  # and bad verdict thresholds
    running = scratch_mod.current()
    own = scratch_mod.Scratch.create() if running is None else None
    where = running or own
    assert where is not None
    con, spill = open_store(opts, where)
    trace: TraceWriter | None = None
    deferring: contextlib.AbstractContextManager[list[str]] = (
        sql.deferred_comments() if defer_comments else contextlib.nullcontext([])
    )
    try:
        with scratch_mod.active(where) if own is not None else contextlib.nullcontext(), deferring as comments:
            ingest(con, inputs, progress, opts.cache_dir, opts.parse_options())
            if progress:
                progress("align clocks", 0, 0)
            notes = align_stage.align(con, opts.offsets, int(opts.counter_search_s * 1e9))
            if progress:
                progress("measure", 0, 0)
            ctx = measure(con, opts)
            store.release_freed_memory()  # (the sweep's working memory: see ingest)
            ctx.inputs = [path_text(p) for p in inputs]
            ctx.tokens_per_step, ctx.samples_per_step = opts.tokens_per_step, opts.samples_per_step
            ctx.model_flops = opts.model_flops
            # (beside the rules only with room in DuckDB's memory limit for both: the 4 GiB Kineto trace's writer
            # ran out of it beside them under --memory-budget 1GiB; else written after the verdict, write_outputs)
            if write_trace_early and opts.write_trace and store.room_beside(con):
                trace = TraceWriter(con, ctx.peaks, where.path)
            if progress:
                progress("rules", 0, 0)
            verdict_thresholds = judge.thresholds_from(opts.rules_config)
            _, rule_notes = rules.run(
                con,
                selection,
                ctx.ranges,
                ctx.precision,
                ctx.peaks,
                opts.peaks_file,
                material_unknown=verdict_thresholds.material_unknown_flops,
            )
            ctx.notes = ctx.notes + notes + rule_notes
            if progress:
                progress("verdict", 0, 0)
            verdict = judge.build(con, ctx, verdict_thresholds)
    except BaseException:
        Result(con=con, typed=None, spill_dir=spill, scratch=own, trace=trace).close()
        raise
    result = Result(con=con, typed=verdict, notes=notes, spill_dir=spill, scratch=own, trace=trace, comments=comments)
    if own is not None:
        weakref.finalize(result, own.close)
    return result


@contextlib.contextmanager
def few_collections(young: int = 50_000) -> Iterator[None]:
    """Python's cycle collector less often while a run works: it holds few objects at once (the data is in DuckDB
    and Arrow), but makes and drops many (drawing the charts, rendering the page), and collected every 700 new
    objects: ~300 collections, 0.08 s of a 100 MiB trace's run. What is loaded before is frozen out of them."""
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, previous[1], previous[2])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


def default_out_dir(inputs: Sequence[Path]) -> Path:
    first = Path(inputs[0])
    name = first.name
    for suffix in (".gz", ".json", ".pt.trace", ".sqlite", ".nsys-rep"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path("plasmient-out") / (name or "run")


OUTPUT_FILES = ("verdict.json", "report.html", "trace.pftrace", "run.duckdb")


@contextlib.contextmanager
def _writing(out: Path) -> Iterator[None]:
    """A file-system error while writing the outputs (disk full, quota) is the output's problem, said in one line."""
    try:
        yield
    except OSError as e:
        if e.strerror is None:
            raise
        raise BadInput(out, f"cannot write the outputs ({e.strerror})") from None


def _finish_quietly(cur: duckdb.DuckDBPyConnection, comments: list[str]) -> None:
    """The library's deferred comments, then `store.finish`, on a cursor beside report.html's drawing; if it fails,
    `store.save` does the same work again and says why."""
    with contextlib.suppress(duckdb.Error):
        sql.apply_comments(cur, comments)
        store.finish(cur)


def write_outputs(
    result: Result,
    out_dir: Path,
    inputs: Sequence[Path],
    opts: Options,
    extra_files: Callable[[Path], dict[str, str]] | None = None,
    progress: Progress | None = None,
    page_worker: PageWorker | None = None,
) -> Path:
    """Render into a staging folder beside `out_dir`, then swap it into place (outdir.staged): never half-written,
    and an existing folder is replaced only when it is an earlier output of this tool. `extra_files` (name →
    text, from the staging folder holding the rendered outputs) are written with them (batch's manifest), so they
    appear together or not at all. With a `page_worker` (render/page_worker.py), report.html is drawn by it while
    this process writes the other outputs."""
    from .render import verdict as verdict_render

    out = outdir.check_run_out(out_dir, inputs)
    # report.html's data is read from the store first (the page worker draws it meanwhile), then trace.pftrace.
    # Drawn here, report.html comes after trace.pftrace: the Perfetto writer's batches then come and go before
    # matplotlib is loaded (~65 MiB resident for the rest of the run), not on top of it.
    worker = page_worker if opts.write_html else None
    html_step = [("report.html", opts.write_html)]
    steps = [
        ("verdict.json", True),
        *(html_step if worker else []),
        ("trace.pftrace", opts.write_trace),
        *([] if worker else html_step),
        ("run.duckdb", True),
    ]
    todo = [name for name, on in steps if on]
    store.release_freed_memory()  # (the rules' and the verdict's working memory: see ingest)
    with outdir.staged(out, "run") as tmp, _writing(out):
        try:
            for i, name in enumerate(todo):
                if progress:
                    progress(f"write {name}", i, len(todo))
                assert result.typed is not None
                if name == "verdict.json":
                    verdict_render.write(result.typed, tmp / name)
                elif name == "report.html":
                    from .render import html

                    if worker is not None:
                        worker.send(tmp / name, html.page_context(result.con, result.typed))
                    else:
                        ctx = html.page_context(result.con, result.typed)

                        # The page is drawn in Python while the store is finished (its comments, a checkpoint: ~0.15
                        # s of DuckDB) on a cursor: nothing else reads the store by now (the trace is taken). The
                        # comments are ~680 short statements, each waiting for the GIL after it: quick_handoffs.
                        def draw(ctx: dict[str, Any] = ctx, to: Path = tmp / name) -> None:
                            to.write_text(html.page(ctx), encoding="utf-8")

                        if "run.duckdb" in todo:
                            with store.quick_handoffs():
                                store.beside(result.con, functools.partial(_finish_quietly, comments=result.comments), draw)
                        else:
                            draw()
                elif name == "trace.pftrace":
                    if result.trace is not None:  # written while the rules ran
                        trace, result.trace = result.trace, None
                        try:
                            trace.take(tmp / name)
                        finally:
                            trace.cancel()  # (a no-op once taken; after an error, the file removed)
                    else:
                        from .render import perfetto

                        perfetto.write(result.con, result.verdict, tmp / name)  # (reads the document's GPU names)
                else:
                    sql.apply_comments(result.con, result.comments)  # (what is left of them)
                    store.save(result.con, tmp / name)  # the store file, checkpointed and moved there: no copy
            if worker is not None:
                worker.finish()
        except BaseException:
            if worker is not None:
                worker.close()  # stopped before the staging folder it writes into is removed
            raise
        for name, text in (extra_files(tmp) if extra_files else {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return out
