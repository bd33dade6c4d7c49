#!/usr/bin/env python3
"""Our numbers against TraceLens's own reference report, on the traces that report was made from.

TraceLens (github.com/AMD-AGI/TraceLens) keeps, for its end-to-end test, the perf report it generates from two
public Kineto traces of Qwen1.5-0.5B-Chat (H100 and MI300X: `tests/traces/{h100,mi300}/Qwen_Qwen1.5-0.5B-Chat__
1016005.json.gz`), as CSVs (`tests/traces/compare_test_e2e/reference/{h100,mi300}_perf_report_csvs/`). That is an
independent measurement of the same files by another tool: its GPU busy time (`gpu_timeline.csv`: the union of
the GPU's activities inside the profiler step), and its FLOPs per GEMM and attention call (`GEMM.csv`,
`SDPA_fwd.csv`: `GFLOPS_first` × `name_count`, from the ops' shapes).

    python benchmarks/cross_check_tracelens.py PATH/TO/TraceLens     # a checkout (or `git worktree`) of TraceLens

For each GPU it runs the CLI on the trace and prints, side by side: busy time in `ProfilerStep#*` (our range
window's `busy_ns`), the GEMMs' FLOPs and the attention FLOPs (our kernels' `flops`, by the op that carries them).
A checking aid, not a test (the traces are not ours to commit); nothing asserts.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

TRACE = "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
GPUS = ("h100", "mi300")


def reference(root: Path, gpu: str) -> dict[str, float]:
    ref = root / "tests" / "traces" / "compare_test_e2e" / "reference" / f"{gpu}_perf_report_csvs"
    timeline = {r["type"]: float(r["time ms"]) for r in csv.DictReader(open(ref / "gpu_timeline.csv"))}

    def flops(sheet: str) -> float:
        rows = csv.DictReader(open(ref / sheet))
        return sum(float(r["GFLOPS_first"]) * 1e9 * int(r["name_count"]) for r in rows)

    # TraceLens counts addmm's bias add (M·N FLOPs) in a GEMM's FLOPs; 2·M·N·K is the matmul's own work
    bias = sum(
        int(r["param: M"]) * int(r["param: N"]) * int(r["name_count"])
        for r in csv.DictReader(open(ref / "GEMM.csv"))
        if r["param: bias"] == "True"
    )
    return {
        "busy_ms": timeline["busy_time"],
        "total_ms": timeline["total_time"],
        "gemm_flops": flops("GEMM.csv"),
        "gemm_bias_flops": float(bias),
        "sdpa_flops": flops("SDPA_fwd.csv"),
    }


def ours(trace: Path, out: Path) -> dict[str, float]:
    subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", str(trace), "--out", str(out), "--quiet", "--no-html", "--no-trace"],
        check=True,
    )
    con = duckdb.connect(str(out / "run.duckdb"), read_only=True)
    busy, window = con.execute(
        "SELECT busy_ns / 1e6, window_ns / 1e6 FROM metrics WHERE scope = 'range' AND device IS NOT NULL"
    ).fetchone() or (None, None)
    by_op = dict(
        con.execute(
            "SELECT o.name, sum(k.flops) FROM kernels k JOIN ops o ON o.op_id = k.flops_op_id WHERE k.flops > 0 GROUP BY 1"
        ).fetchall()
    )
    attention = sum(f for n, f in by_op.items() if "attention" in n)
    return {"busy_ms": busy, "window_ms": window, "gemm_flops": sum(by_op.values()) - attention, "sdpa_flops": attention}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tracelens", type=Path, help="a checkout of github.com/AMD-AGI/TraceLens")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for gpu in GPUS:
            trace = a.tracelens / "tests" / "traces" / gpu / TRACE
            if not trace.exists():
                print(f"{gpu}: {trace} not found")
                continue
            ref, got = reference(a.tracelens, gpu), ours(trace, Path(tmp) / gpu)
            print(
                f"{gpu}: busy in the step, TraceLens {ref['busy_ms']:.6f} ms, ours {got['busy_ms']:.6f} ms "
                f"(Δ {(got['busy_ms'] - ref['busy_ms']) * 1e6:+.0f} ns); its window {ref['total_ms']:.3f} ms (the "
                f"step's GPU annotation), ours {got['window_ms']:.3f} ms (the work the step launched)"
            )
            gemm = ref["gemm_flops"] - ref["gemm_bias_flops"]
            print(
                f"{gpu}: GEMM FLOPs, TraceLens {ref['gemm_flops'] / 1e9:.3f} G ({gemm / 1e9:.3f} G without addmm's bias "
                f"adds), ours {got['gemm_flops'] / 1e9:.3f} G (Δ {(got['gemm_flops'] - gemm) / gemm:+.2e})"
            )
            print(f"{gpu}: attention FLOPs, TraceLens {ref['sdpa_flops'] / 1e9:.3f} G, ours {got['sdpa_flops'] / 1e9:.3f} G")


if __name__ == "__main__":
    main()
