"""The main job under variants of its environment, interleaved: wall time, CPU and peak RSS of each variant.

    python benchmarks/ab_variants.py TRACE --rounds 6 base: blas16:OPENBLAS_NUM_THREADS=16 \
        pwoff:PLASMIENT_PAGE_WORKER=off c4:CPUS=0-3 lean:"ARGS=--no-html --no-trace"

A variant is `NAME:SETTINGS`, the settings comma-separated: `VAR=VALUE` sets an environment variable, `CPUS=LIST`
runs the job under `taskset -c LIST`, `ARGS=...` adds command-line arguments. Each run is a fresh process of
`python -m plasmient_report.cli TRACE --out DIR --quiet`; the variants take turns, in reversed order every other
round, so that a burst of load from other work, or the page cache a run frees for the next, favours none; the
package is byte-compiled first. Each run is measured as bench_main_job.py measures one (`run`): CPU is user +
system of the process and its children, peak RSS the larger of `ru_maxrss` and the process tree's RSS sampled
every 10 ms (the page worker is a child). Prints each variant's median and range; nothing asserts on timings
(benchmarks/README.md, session 32, ran it on a 16-core machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_main_job import run  # (this folder: the same fresh-process measurement)


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str], list[str]]:
    name, _, spec = text.partition(":")
    env: dict[str, str] = {}
    prefix: list[str] = []
    args: list[str] = []
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key == "CPUS":
            prefix = ["taskset", "-c", value]
        elif key == "ARGS":
            args += value.split()
        else:
            env[key] = value
    return name, env, prefix, args


def run_once(trace: str, out: Path, env: dict[str, str], prefix: list[str], args: list[str]) -> tuple[float, float, float]:
    """One fresh process (bench_main_job.run: wall, CPU with the children's, the process tree's peak RSS)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*prefix, sys.executable, "-m", "plasmient_report.cli", trace, "--out", str(out), "--quiet", *args]
    res = run(cmd, {**os.environ, **env})
    return res["wall_s"], res["cpu_s"], res["peak_rss"] / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("variants", nargs="+", help="NAME:SETTINGS (see the module's docstring)")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variants]
    # The package's bytecode compiled first, as `pip install` does: where PYTHONDONTWRITEBYTECODE is set every run
    # would otherwise compile its modules again (~0.1 s; benchmarks/README.md, session 32).
    spec = importlib.util.find_spec("plasmient_report")
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            subprocess.run([sys.executable, "-m", "compileall", "-q", where], check=True)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, *_ in variants}
    with tempfile.TemporaryDirectory(prefix="plasmient-ab-") as tmp:
        for i in range(a.rounds):
            for name, env, prefix, args in variants if i % 2 == 0 else variants[::-1]:
                results[name].append(run_once(a.trace, Path(tmp) / "out", env, prefix, args))
    for name, rows in results.items():
        walls, cpus, peaks = zip(*rows, strict=True)
        print(
            f"{name:10} wall {statistics.median(walls):.2f} s [{min(walls):.2f}-{max(walls):.2f}]  "
            f"cpu {statistics.median(cpus):.2f} s  peak {statistics.median(peaks):.0f} MiB [{min(peaks):.0f}-{max(peaks):.0f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
