"""Benchmark `plasmient-report batch`: an archive of many multi-rank runs through both executors.

The archive is made from the committed real H200 recordings in sample_traces/ by copying: each run is one of
four 2-rank recordings — DDP with a late rank (Kineto), the same DDP job under nsys (`.sqlite`), and a 2-stage
GPipe pipeline with 4 and with 8 micro-batches (Kineto) — cycled until there are `--runs` runs (default 52; run
folders `run-NNN/`). Copies are byte-identical, which changes nothing: every run is analysed in full.

For each executor (local process pool, then Ray on a local instance started before the clock starts) it runs the
batch into a fresh folder with the default outputs (verdict.json, report.html, trace.pftrace, run.duckdb), then
once more into the same folder (every run skipped as unchanged: the cost of resuming). It prints wall time, runs
per minute, runs per minute per core (cores = --jobs), the mean wall and CPU time of one run inside its worker
(and 60 / CPU s, runs per minute per core when nothing else competes for the cores), each worker's peak RSS
(`ru_maxrss` read inside the worker after each run; max and median over workers) and the peak of the summed RSS
of the driver and all its descendants (psutil, sampled every 0.2 s: pool workers, or a local Ray's GCS, raylet
and workers). No assertions.

    pip install '.[bench,ray]'
    python benchmarks/bench_batch.py [--runs 52] [--jobs N] [--executors local,ray] [--keep DIR] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from plasmient_report.batch import executors, run_batch
from plasmient_report.pipeline import Options

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
KINDS = {
    "ddp_kineto": ["h200x2_ddp/kineto/rank0.pt.trace.json.gz", "h200x2_ddp/kineto/rank1.pt.trace.json.gz"],
    "ddp_nsys": ["h200x2_ddp/nsys/nsys_ddp.sqlite"],
    "pipeline_m4": ["h200x2_pipeline/m4/rank0.pt.trace.json.gz", "h200x2_pipeline/m4/rank1.pt.trace.json.gz"],
    "pipeline_m8": ["h200x2_pipeline/m8/rank0.pt.trace.json.gz", "h200x2_pipeline/m8/rank1.pt.trace.json.gz"],
}


def make_archive(runs: int, dest: Path) -> Path:
    src = dest.parent / "fleet"
    kinds = list(KINDS)
    for i in range(runs):
        d = src / f"run-{i:03d}-{kinds[i % len(kinds)]}"
        d.mkdir(parents=True)
        for f in KINDS[kinds[i % len(kinds)]]:
            shutil.copy2(SAMPLES / f, d)
    with tarfile.open(dest, "w:gz") as tf:
        tf.add(src, arcname="fleet")
    shutil.rmtree(src)
    return dest


class MemorySampler:
    """Peak total RSS of this process and all its descendants (pool workers; a local Ray's GCS, raylet and
    workers), sampled every 0.2 s with psutil — what the batch costs the machine, whoever else runs on it."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._sample())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def one_batch(executor: str, arc: Path, out: Path, jobs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with MemorySampler() as mem:
        res = run_batch([arc], out, Options(), executor=executor, jobs=jobs)
    wall = time.perf_counter() - t0
    workers: dict[int, int] = {}
    for o in res.outcomes:
        pid = o.worker.get("pid")
        if pid is not None:
            workers[pid] = max(workers.get(pid, 0), o.worker.get("max_rss_bytes", 0))
    analysed = [o.worker["seconds"] for o in res.outcomes if o.status == "analysed" and "seconds" in o.worker]
    cpu = [o.worker["cpu_seconds"] for o in res.outcomes if o.status == "analysed" and "cpu_seconds" in o.worker]
    n = len(res.outcomes)
    return {
        "executor": executor,
        "runs": n,
        "analysed": res.count("analysed"),
        "skipped": res.count("skipped"),
        "failed": res.count("failed"),
        "wall_s": wall,
        "runs_per_min": n / wall * 60,
        "runs_per_min_per_core": n / wall * 60 / jobs,
        "mean_run_s": statistics.mean(analysed) if analysed else None,
        "mean_run_cpu_s": statistics.mean(cpu) if cpu else None,
        # CPU-bound estimate, independent of other load on the machine: one core does 60 / (CPU s per run) runs a minute
        "runs_per_min_per_core_cpu": 60 / statistics.mean(cpu) if cpu else None,
        "load_average_1min_after": os.getloadavg()[0],
        "workers": len(workers),
        "worker_peak_rss_mib_max": max(workers.values()) / 2**20 if workers else None,
        "worker_peak_rss_mib_median": statistics.median(workers.values()) / 2**20 if workers else None,
        "tree_rss_peak_mib": mem.peak / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=52)
    ap.add_argument("--jobs", type=int, default=executors.default_jobs())
    ap.add_argument("--executors", default="local,ray")
    ap.add_argument("--keep", type=Path, help="keep the archive and outputs in this folder")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    arc = make_archive(a.runs, work / "fleet.tar.gz")
    vm = psutil.virtual_memory()
    print(
        f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs "
        f"({len(os.sched_getaffinity(0))} usable), {vm.total / 2**30:.1f} GiB RAM; Python {platform.python_version()}; "
        f"jobs {a.jobs}; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"archive: {a.runs} runs x 2 ranks (cycled over {', '.join(KINDS)}), {arc.stat().st_size / 2**20:.1f} MiB")
    results = []
    for executor in a.executors.split(","):
        ray_start_s = None
        if executor == "ray":
            import ray

            t = time.perf_counter()
            ray.init(num_cpus=a.jobs, include_dashboard=False, log_to_driver=False)
            ray_start_s = time.perf_counter() - t
        try:
            out = work / f"out-{executor}"
            for label in ("fresh", "rerun"):
                r = one_batch(executor, arc, out, a.jobs)
                r.update(pass_=label, ray_start_s=ray_start_s)
                results.append(r)
                print(json.dumps(r))
        finally:
            if executor == "ray":
                ray.shutdown()
    print()
    print(
        "| executor | pass | runs | wall s | runs/min | runs/min/core (wall) | s/run in worker (wall / CPU) | "
        "runs/min/core (CPU) | workers | worker peak RSS MiB (max / median) | all processes, peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mean = f"{r['mean_run_s']:.2f} / {r['mean_run_cpu_s']:.2f}" if r["mean_run_s"] else "-"
        per_core_cpu = f"{r['runs_per_min_per_core_cpu']:.1f}" if r["runs_per_min_per_core_cpu"] else "-"
        rss = (
            f"{r['worker_peak_rss_mib_max']:.0f} / {r['worker_peak_rss_mib_median']:.0f}" if r["worker_peak_rss_mib_max"] else "-"
        )
        print(
            f"| {r['executor']} | {r['pass_']} | {r['runs']} ({r['failed']} failed) | {r['wall_s']:.1f} | "
            f"{r['runs_per_min']:.1f} | {r['runs_per_min_per_core']:.1f} | {mean} | {per_core_cpu} | {r['workers']} | "
            f"{rss} | {r['tree_rss_peak_mib']:.0f} |"
        )
    print(f"driver peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
