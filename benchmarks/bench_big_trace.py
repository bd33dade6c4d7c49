"""The main job on one large trace, bounded vs unbounded memory: wall time, CPU time and peak RSS of each
(every run in a fresh child process: peak RSS from wait4), and whether their numbers agree.

    python benchmarks/bench_big_trace.py TRACE [--budget 1.5GiB] [--runs bounded,unbounded] [--outputs]

TRACE: e.g. a scaled real trace from `benchmarks/make_scaled_trace.py --target-mb 2000` (Kineto), or an nsys
export scaled by `benchmarks/make_scaled_nsys.py`. Nothing asserts on timings; exits 1 when the numbers of the
bounded and unbounded runs differ beyond float tolerance (1e-9 relative).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# The child reports its own peak RSS and CPU time (all threads) when it exits.
CHILD = """
import atexit, resource, sys
def report():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    sys.stderr.write(f"\\nBENCH {ru.ru_maxrss} {ru.ru_utime + ru.ru_stime}\\n")
atexit.register(report)
from plasmient_report.cli import main
sys.argv = ["plasmient-report", *sys.argv[1:]]
main()
"""


def run(trace: Path, budget: str, outputs: bool, out: Path) -> dict:
    cmd = [sys.executable, "-c", CHILD, str(trace), "--out", str(out), "--json", "--memory-budget", budget]
    if not outputs:
        cmd += ["--no-html", "--no-trace"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    err = p.stderr.decode()
    if p.returncode != 0:
        raise SystemExit(f"{trace} with --memory-budget {budget} failed ({p.returncode}): {err[-2000:]}")
    rss_kib, cpu = err.rsplit("BENCH ", 1)[1].split()
    sizes = {q.name: q.stat().st_size for q in out.iterdir()}
    return {
        "wall_s": wall,
        "cpu_s": float(cpu),
        "peak_rss_mib": int(rss_kib) / 1024,
        "outputs": sizes,
        "verdict": json.loads(p.stdout),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--budget", default="1.5GiB")
    ap.add_argument("--runs", default="bounded,unbounded")
    ap.add_argument("--outputs", action="store_true", help="also write report.html and trace.pftrace")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    a = ap.parse_args()
    size = a.trace.stat().st_size
    print(
        f"trace {a.trace} ({size / 2**20:,.1f} MiB on disk); python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = {}
    for kind in a.runs.split(","):
        budget = a.budget if kind == "bounded" else "none"
        with tempfile.TemporaryDirectory() as d:
            r = run(a.trace, budget, a.outputs, Path(d) / "out")
        results[kind] = r
        print(
            f"{kind:10} --memory-budget {budget:7} wall {r['wall_s']:7.1f} s  cpu {r['cpu_s']:7.1f} s  "
            f"peak RSS {r['peak_rss_mib']:6.0f} MiB  {r['wall_s'] / (size / 2**20) * 1000:5.1f} ms/MiB  "
            f"achieved {r['verdict']['achieved_fraction_of_peak']}  outputs {r['outputs']}",
            flush=True,
        )
    if a.json:
        a.json.write_text(json.dumps({k: {x: y for x, y in v.items() if x != "verdict"} for k, v in results.items()}, indent=1))
    if len(results) == 2:
        bad = compare(results["bounded"]["verdict"], results["unbounded"]["verdict"])
        print("numbers equal (1e-9 relative)" if not bad else f"numbers DIFFER: {bad[:10]}")
        if bad:
            raise SystemExit(1)


def compare(a: object, b: object, path: str = "") -> list[str]:
    """Paths where two verdicts differ (floats to 1e-9 relative; notes and paths ignored)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in ("notes",):
                continue
            out += compare(a.get(k), b.get(k), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [x for i, (p, q) in enumerate(zip(a, b, strict=True)) for x in compare(p, q, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float | int) or isinstance(b, float) and isinstance(a, float | int):
        return [] if math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


if __name__ == "__main__":
    main()
