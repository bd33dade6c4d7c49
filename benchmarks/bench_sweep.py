"""Benchmark the per-GPU sweep (utilization, achieved fraction, loss waterfall) over a store of many kernels.

The store is synthetic but shaped like a training run: R ranks x S streams of back-to-back kernels with random
durations and gaps, a third of them matmuls with FLOPs, launch calls for each, one ProfilerStep range per
1000 kernels. Prints time and peak RSS of `metrics.build_windows` + `metrics.sweep`. No assertions.

    python benchmarks/bench_sweep.py [--kernels 1000000] [--ranks 8]
"""

from __future__ import annotations

import argparse
import resource
import time

from plasmient_report import metrics, store
from plasmient_report.peaks import choose_peak, load_table


def build(con, n: int, ranks: int) -> None:
    per = n // ranks
    con.execute(f"""
        INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, name, kind, correlation, flops)
        WITH k AS (
            SELECT r.range AS rank, i.range AS i, (hash(r.range * 1000003 + i.range) % 1000)::BIGINT AS h
            FROM range({ranks}) r, range({per}) i
        ), t AS (
            SELECT *, 1790000000000000000 + sum(2000 + h * 20 + (h % 7) * 3000)
                   OVER (PARTITION BY rank ORDER BY i ROWS UNBOUNDED PRECEDING) AS s
            FROM k
        )
        SELECT rank * {per} + i, rank, rank, 0, 7 + (i % 2), s, s + 2000 + h * 20,
               CASE WHEN i % 3 = 0 THEN 'sm90_xmma_gemm_bf16' ELSE 'vectorized_elementwise_kernel' END,
               CASE WHEN i % 97 = 0 THEN 'nccl' ELSE 'compute' END, i,
               CASE WHEN i % 3 = 0 THEN (2000 + h * 20) * 4.0e5 END
        FROM t""")
    con.execute("""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind, correlation)
        SELECT source_id, rank, 1, 1, start_ns - 5000, start_ns - 3000, 'cudaLaunchKernel', 'runtime', correlation
        FROM kernels""")
    con.execute("""
        INSERT INTO ranges (source_id, rank, pid, thread, domain, name, start_ns, end_ns, on_gpu)
        SELECT rank, rank, 1, 1, 'user_annotation', 'ProfilerStep#' || (correlation // 1000),
               min(start_ns) - 6000, max(end_ns), false
        FROM kernels GROUP BY rank, correlation // 1000""")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    a = ap.parse_args()
    con = store.connect()
    t = time.time()
    build(con, a.kernels, a.ranks)
    print(f"store: {a.kernels:,} kernels on {a.ranks} ranks built in {time.time() - t:.1f} s")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = choose_peak("NVIDIA H200", "bf16", load_table())
    gpus = [metrics.GpuPeak(r, 0, "NVIDIA H200", peak) for r in range(a.ranks)]
    for ranges in ([], ["ProfilerStep#*"]):
        t = time.time()
        metrics.build_windows(con, ranges)
        metrics.sweep(con, gpus)
        dt = time.time() - t
        n_loss = con.execute("SELECT count(*) FROM losses").fetchall()[0][0]
        w = con.execute("SELECT count(*) FROM windows").fetchall()[0][0]
        print(
            f"sweep ({'--range ProfilerStep#*' if ranges else 'whole window'}): {dt:.2f} s, {w:,} windows, "
            f"{n_loss:,} loss intervals, {a.kernels / dt / 1e6:.2f} M kernels/s"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB (after building the store: {rss0:.0f} MiB)")
    print(
        con.execute(
            "SELECT rank, round(utilization, 4), round(achieved_fraction_of_peak, 4) FROM metrics "
            "WHERE scope = 'window' ORDER BY rank NULLS FIRST LIMIT 3"
        ).fetchall()
    )


if __name__ == "__main__":
    main()
