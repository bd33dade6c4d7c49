"""Where the time and memory of one run go: wall and CPU time (all threads) and peak RSS of every pipeline
stage, every measure step and every rule, on one input. A profiling aid for large traces (nothing asserts on it;
on a shared machine read the CPU column).

    python benchmarks/profile_stages.py TRACE [--range NAME] [--memory-budget 1.5GB] [--renders]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plasmient_report import align, judge, metrics, pipeline, rules, store  # noqa: E402
from plasmient_report.render.verdict import document  # noqa: E402
from plasmient_report.rules import context  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def timed(what: str):
    t0, c0 = time.perf_counter(), time.process_time()
    yield
    print(
        f"{what:42} {time.perf_counter() - t0:8.2f} s  cpu {time.process_time() - c0:7.2f} s   "
        f"rss {rss_mib():7.0f} MiB   peak {peak_mib():7.0f} MiB",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", type=Path)
    ap.add_argument("--range", dest="ranges", action="append", default=[])
    ap.add_argument("--memory-budget", default=None, help="as the CLI's --memory-budget (e.g. 1.5GB)")
    ap.add_argument("--renders", action="store_true", help="also time report.html and trace.pftrace")
    a = ap.parse_args()
    opts = pipeline.Options(ranges=a.ranges)
    if a.memory_budget:
        from plasmient_report.cli import parse_size

        opts.memory_budget = parse_size(a.memory_budget)
    t_all = time.perf_counter()
    with pipeline.run_store(a.inputs, opts) as con:
        with timed("ingest"):
            pipeline.ingest(con, a.inputs, None, None, opts.parse_options())
        with timed("align"):
            align.align(con, opts.offsets, int(opts.counter_search_s * 1e9))
        for step in ("model_op_flops", "nest_ops", "attribute_kernel_flops", "model_kernel_bytes"):
            with timed(f"measure.{step}"):
                getattr(metrics, step)(con)
        from plasmient_report.peaks import load_table

        with timed("measure.assign_peaks"):
            precision, peaks = metrics.assign_peaks(con, load_table(None), None, None, None)
        with timed("measure.build_windows"):
            missing = metrics.build_windows(con, a.ranges)
        with timed("measure.sweep"):
            metrics.sweep(con, peaks)
        selection = rules.configure((), (), None)
        ctx = context.prepare(con, a.ranges, precision, peaks)
        for r in selection.rules:
            t = rules.registry.Thresholds({**rules.registry.COMMON_THRESHOLDS, **r.thresholds})
            with timed(f"rule {r.id} {r.name}"):
                list(r.check(ctx, t) or ())
        context.cleanup(con)
        with timed("rules (all, via rules.run)"):
            rules.run(con, selection, a.ranges, precision, peaks)
        rc = judge.RunContext(
            inputs=[str(p) for p in a.inputs], ranges=a.ranges, precision=precision, peaks=peaks, missing_ranges=missing, notes=[]
        )
        with timed("judge"):
            verdict = judge.build(con, rc)
        if a.renders:
            import tempfile

            from plasmient_report.render import html, perfetto

            with tempfile.TemporaryDirectory() as d:
                with timed("render.html"):
                    html.write(con, verdict, Path(d) / "report.html")
                with timed("render.perfetto"):
                    perfetto.write(con, document(verdict), Path(d) / "trace.pftrace")
                with timed("store.save (run.duckdb)"):
                    store.save(con, Path(d) / "run.duckdb")
    print(f"{'total':42} {time.perf_counter() - t_all:8.2f} s  cpu {time.process_time():7.2f} s   peak {peak_mib():7.0f} MiB")
    doc = document(verdict)
    print(f"achieved {doc['achieved_fraction_of_peak']}  utilization {doc['utilization']['trace']}")


if __name__ == "__main__":
    main()
