"""The mapper: one run through the main job's pure per-run function (`pipeline.analyse`, then `write_outputs`)
into `runs/<run>/`, returning its summary rows. Same code on every executor (a local process, a Ray task).

Resumable: a finished run leaves `batch-manifest.json` (its inputs' sha256, the tool version, the options'
fingerprint) next to its outputs, written last; a run whose manifest still matches is not analysed again.
A run that fails — bad input, a DuckDB error, anything — comes back as a failed row; it never stops the batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..verdict_model import Verdict, load_verdict
from .group import Run

MANIFEST = "batch-manifest.json"
MANIFEST_SCHEMA = "plasmient.batch-manifest/1"


@dataclass(frozen=True)
class Task:
    run: Run
    out_dir: str  # the batch output folder, absolute (a shared path when tasks run on other nodes)
    options: Any  # pipeline.Options (kept untyped here so importing this module stays light)
    options_sha256: str
    force: bool = False  # analyse even when the manifest matches


@dataclass(frozen=True)
class Outcome:
    run_id: str
    status: str  # 'analysed' | 'skipped' (unchanged) | 'failed'
    error: str | None
    rows: list[dict[str, Any]]  # summary rows (summary.SCHEMA)
    worker: dict[str, Any] = field(default_factory=dict)  # pid, max_rss_bytes, seconds, cpu_seconds: for benchmarks


def options_fingerprint(opts: Any) -> str:
    """sha256 of everything that changes a run's numbers: analysis options (with the content of the files they
    name), and the tool version. Output switches (--no-html) are not in it: missing outputs are checked instead."""

    def file_sha(p: Path | None) -> str | None:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest() if p else None

    doc = {
        "tool": __version__,
        "ranges": list(opts.ranges),
        "peak_precision": opts.peak_precision,
        "peak_tflops": opts.peak_tflops,
        "peaks": file_sha(opts.peaks_file),
        "gpu": opts.gpu,
        "rule_select": list(opts.rule_select),
        "rule_ignore": list(opts.rule_ignore),
        "rules_config": file_sha(opts.rules_config),
        "tz": opts.tz,
        "offsets": list(opts.offsets),
        "dcgm_period_s": opts.dcgm_period_s,
        "counter_search_s": opts.counter_search_s,
        "model_flops": opts.model_flops,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _sha256(path: str) -> str:
    from ..parsers._io import sha256_of

    return sha256_of(Path(path))  # a folder input (nsys parquetdir / arrowdir): its files' names and contents


@contextmanager
def _working_dir(path: str) -> Iterator[None]:
    # Inputs unpacked from an archive are named relative to the batch output, so verdicts read the same on
    # every executor and node; the task runs there and puts the worker's directory back afterwards.
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _one_line(e: BaseException) -> str:
    from ..errors import BadInput

    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, BadInput):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _expected_outputs(opts: Any) -> list[str]:
    return (
        ["verdict.json", "run.duckdb"]
        + (["report.html"] if opts.write_html else [])
        + (["trace.pftrace"] if opts.write_trace else [])
    )


def map_run(task: Task) -> Outcome:
    """Analyse one run (or reuse its outputs) and return its summary rows. Never raises for a bad run (an
    interruption still propagates: the run's scratch and staging folders are removed on the way out)."""
    from .. import scratch

    t0, cpu0 = time.monotonic(), time.process_time()
    with _working_dir(task.out_dir), scratch.run():
        outcome = _map_run(task)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    worker = {
        "pid": os.getpid(),
        "max_rss_bytes": rss,
        "seconds": time.monotonic() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }
    return Outcome(outcome.run_id, outcome.status, outcome.error, outcome.rows, worker)


def _map_run(task: Task) -> Outcome:
    from . import summary

    run, opts = task.run, task.options
    inputs = list(run.inputs)
    run_dir = Path("runs") / run.slug
    try:
        hashes = [_sha256(p) for p in inputs]
    except OSError as e:
        return _failed(run, run_dir, f"{e.filename}: cannot read ({e.strerror})", None)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "run_id": run.run_id,
        "tool_version": __version__,
        "options_sha256": task.options_sha256,
        "inputs": [{"path": p, "sha256": h} for p, h in zip(inputs, hashes, strict=True)],
    }
    if not task.force:
        verdict = _reusable(run_dir, manifest, opts)
        if verdict is not None:
            return Outcome(run.run_id, "skipped", None, summary.rows_ok(run.run_id, verdict, inputs, hashes, _report(run_dir)))
    try:
        verdict = _analyse(run, run_dir, opts, manifest)
    except Exception as e:  # noqa: BLE001 — any failure of one run is that run's row, never the batch's end
        return _failed(run, run_dir, _one_line(e), hashes)
    return Outcome(run.run_id, "analysed", None, summary.rows_ok(run.run_id, verdict, inputs, hashes, _report(run_dir)))


def _report(run_dir: Path) -> str:
    """What the index links: the run's report.html, or its verdict.json when it has none."""
    return (run_dir / ("report.html" if (run_dir / "report.html").is_file() else "verdict.json")).as_posix()


def _output_sizes(folder: Path, opts: Any) -> dict[str, int]:
    return {name: (folder / name).stat().st_size for name in _expected_outputs(opts)}


def _reusable(run_dir: Path, manifest: dict[str, Any], opts: Any) -> Verdict | None:
    """The earlier run's verdict when its outputs can be reused: the manifest matches (same inputs, options and
    tool version), and the outputs it lists are there as they were written — each expected file present with
    the size recorded, verdict.json with the sha256 recorded and a valid verdict. Anything else: analyse again."""
    from ..errors import BadInput

    try:
        old = json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(old, dict) or {k: old.get(k) for k in manifest} != manifest:
        return None
    recorded = old.get("outputs")
    if not isinstance(recorded, dict):
        return None  # a manifest of an earlier version, which recorded no outputs: cannot verify them
    try:
        sizes = _output_sizes(run_dir, opts)
        data = (run_dir / "verdict.json").read_bytes()
    except OSError:
        return None
    if any(recorded.get(name) != size for name, size in sizes.items()):
        return None
    if old.get("verdict_sha256") != hashlib.sha256(data).hexdigest():
        return None
    try:
        return load_verdict(run_dir / "verdict.json")
    except BadInput:
        return None


def _analyse(run: Run, run_dir: Path, opts: Any, manifest: dict[str, Any]) -> Verdict:
    from dataclasses import replace

    from .. import pipeline, store

    inputs = [Path(p) for p in run.inputs]
    # .nsys-rep exports are cached under the batch output, one folder per run (runs never share a partial file).
    run_opts = replace(opts, cache_dir=Path(".plasmient-cache") / run.slug)

    def with_manifest(staging: Path) -> dict[str, str]:
        # Written last, in the same staging folder as the outputs: they are swapped in together or not at all.
        doc = {
            **manifest,
            "outputs": _output_sizes(staging, run_opts),
            "verdict_sha256": hashlib.sha256((staging / "verdict.json").read_bytes()).hexdigest(),
        }
        return {MANIFEST: json.dumps(doc, indent=1) + "\n"}

    # One DuckDB thread per run: the batch is parallel across runs, and a single thread adds sums in one order,
    # so a run's numbers are the same to the last digit on every executor and every rerun.
    with store.threads(1):
        result = pipeline.analyse(inputs, run_opts, defer_comments=True)
        try:
            pipeline.write_outputs(result, run_dir, inputs, run_opts, extra_files=with_manifest)
        finally:
            result.close()  # the store, and its spill folder
    # The rows come from the verdict as written, exactly as a later skipped rerun reads it.
    return load_verdict(run_dir / "verdict.json")


def _failed(run: Run, run_dir: Path, error: str, hashes: list[str] | None) -> Outcome:
    from ..outdir import remove_output
    from . import summary

    # Outputs of an earlier success would now be stale: a failed run has no folder (only our own is removed).
    remove_output(run_dir)
    return Outcome(run.run_id, "failed", error, [summary.row_failed(run.run_id, error, list(run.inputs), hashes)])


def lost(run: Run, error: str) -> Outcome:
    """The outcome of a run whose worker died (killed, out of memory, a crash in native code)."""
    from . import summary

    return Outcome(run.run_id, "failed", error, [summary.row_failed(run.run_id, error, list(run.inputs), None)])
