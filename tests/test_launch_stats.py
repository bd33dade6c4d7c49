"""Launch statistics per stream (sql/launch_stats.sql, verdict `launch_stats`): launch delay, CPU launch cost and the
kernel-duration histogram, on the H200 recordings: the single-GPU program's launch-bound phase (1000 launches of a
1-element add, sample_traces/h200_single/ground_truth.json) and Llama decode (h200_hf/llama_generate)."""

from __future__ import annotations

import json
import re

import pytest

from plasmient_report import pipeline, verdict_tables
from plasmient_report.vocab import HISTOGRAM_BUCKETS

from .conftest import sample_file


@pytest.fixture(scope="module")
def truth():
    return json.loads(sample_file("h200_single/ground_truth.json").read_text())


@pytest.fixture(scope="module")
def launch_bound():
    r = pipeline.analyse(
        [sample_file("h200_single/kineto_single.pt.trace.json.gz")], pipeline.Options(ranges=["phase:launch_bound"])
    )
    return r.typed


def test_launch_bound_phase(launch_bound, truth):
    (s,) = launch_bound.launch_stats
    n = truth["config"]["launch_iters"]
    assert s.kernels == s.launched == s.launch_calls == n  # one launch per 1-element add, each in the trace
    # A 1-element add on an H200 runs about a microsecond: every kernel sits in the first two buckets (< 2 µs).
    short = sum(h.kernels for h in s.histogram if h.upper_ns is not None and h.upper_ns <= 2000)
    assert short == n and s.kernel_ns.p50 < 2000
    # Unprofiled, the phase's GPU span over its launches is the host's launch interval (truth: ~9.6 µs). The CPU
    # cost of one launch is most of it, and the kernel starts about one launch latency after the call starts.
    interval_ns = truth["phases"]["phase:launch_bound"]["gpu_span_ms_median"] * 1e6 / n
    assert 0.3 * interval_ns < s.launch_cost_ns.p50 < 1.5 * interval_ns
    assert 2_000 < s.launch_delay_ns.p50 < 50_000
    assert s.launch_cost_ns.p50 <= s.launch_cost_ns.p99 <= s.launch_cost_ns.max
    # the host spends longer launching than the GPU computing: the evidence PR501 rests on
    assert s.launch_time_ns > 5 * s.kernel_time_ns
    assert any(f.rule == "PR501" for f in launch_bound.findings)


def test_decode_is_many_short_kernels():
    """HF generate() decode, 4 layers × 16 new tokens at batch 4: the program's own CUDA events give 151.2 ms of
    GPU time for the call; the kernels in it are tiny GEMMs and elementwise ops."""
    truth = json.loads(sample_file("h200_hf/llama_generate.truth.json").read_text())
    v = pipeline.analyse([sample_file("h200_hf/llama_generate.pt.trace.json.gz")], pipeline.Options(ranges=["generate"])).typed
    s = v.launch_stats[0]
    assert sum(h.kernels for h in s.histogram) == s.kernels
    assert sum(h.time_ns for h in s.histogram) == s.kernel_time_ns
    assert s.kernel_ns.p50 < 10_000
    # launch-bound decode: the kernels fill a small part of the call's GPU time
    assert s.kernel_time_ns < 0.25 * truth["generate_gpu_ms"] * 1e6


def test_histogram_buckets_are_log2_from_one_microsecond():
    """The SQL bucket of a duration (duration_bucket) and the edges the verdict gives it agree."""
    import duckdb

    from plasmient_report import sql

    con = duckdb.connect()
    macro = re.search(r"CREATE OR REPLACE MACRO duration_bucket.*?;", sql.render("launch_stats"), re.DOTALL)
    assert macro is not None
    con.execute(macro.group(0))  # the macro alone
    for d in (0, 999, 1000, 1999, 2000, 3999, 31_999, 32_000, 10**9, 10**13):
        (b,) = con.execute("SELECT duration_bucket(?::BIGINT)", [d]).fetchone()
        lo, hi = verdict_tables.bucket_edges(b)
        assert lo <= d and (hi is None or d < hi), (d, b, lo, hi)
    assert verdict_tables.bucket_edges(0) == (0, 1000) and verdict_tables.bucket_edges(HISTOGRAM_BUCKETS - 1)[1] is None


def test_graph_replays_are_one_launch_each():
    """A Llama forward captured in a CUDA graph and replayed 5 times (h200_hf/cuda_graph.truth.json): every kernel
    is started by a graph launch, and the host pays for 5 launches, not one per kernel."""
    truth = json.loads(sample_file("h200_hf/cuda_graph.truth.json").read_text())
    v = pipeline.analyse([sample_file("h200_hf/cuda_graph.pt.trace.json.gz")], pipeline.Options(ranges=["graph_replays"])).typed
    s = v.launch_stats[0]
    assert s.graph_kernels == s.kernels and s.launch_calls == truth["replays"]
    assert s.kernels % truth["replays"] == 0  # the same graph each time
    # the kernels of one replay queue behind each other: the last waits most of a replay's GPU time for its start
    assert s.launch_delay_ns.max > 0.5 * truth["gpu_ms"] * 1e6 / truth["replays"]
