"""Kineto ingest: every table filled correctly from real traces; times by SPEC §3; links op → launch → kernel."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plasmient_report import pipeline, store
from plasmient_report.errors import BadInput

from .conftest import CORPUS, corpus_file, kernel, write_trace


def ingest(*paths: Path):
    con = store.connect()
    pipeline.ingest(con, list(paths))
    return con


def test_single_h200_trace_tables_match_the_json():
    path = corpus_file("h200-single-kineto/kineto_single.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    con = ingest(path)
    counts = dict(con.execute("SELECT kind, count(*) FROM kernels GROUP BY kind").fetchall())
    assert counts["memcpy"] == sum(e["cat"] == "gpu_memcpy" for e in ev)
    assert counts["memset"] == sum(e["cat"] == "gpu_memset" for e in ev)
    assert counts["compute"] == sum(e["cat"] == "kernel" for e in ev)
    assert con.execute("SELECT count(*) FROM ops").fetchone()[0] == sum(e["cat"] == "cpu_op" for e in ev)
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == sum(
        e["cat"] in ("cuda_runtime", "cuda_driver") for e in ev)
    # SPEC §3: utc_ns = baseTimeNanoseconds + round(ts·1000), exact to the ns.
    first = min((e for e in ev if e["cat"] == "kernel"), key=lambda e: e["ts"])
    got = con.execute("SELECT min(start_ns) FROM kernels WHERE kind = 'compute'").fetchone()[0]
    assert got == doc["baseTimeNanoseconds"] + round(first["ts"] * 1000)
    # Device properties land in `devices`.
    assert con.execute("SELECT name, sm_count FROM devices").fetchall() == [("NVIDIA H200", 132)]
    # Ranges: CPU-side phase annotations, and the GPU copies flagged on_gpu.
    phases = {n for (n,) in con.execute("SELECT name FROM ranges WHERE NOT on_gpu AND name LIKE 'phase:%'").fetchall()}
    assert phases == {f"phase:{p}" for p in ("compute_bound", "memory_bound", "launch_bound", "host_stall",
                                              "train_step")}


def test_every_kernel_links_to_its_launch_and_op():
    con = ingest(corpus_file("h200-single-kineto/kineto_single.json.gz"))
    from plasmient_report import metrics

    metrics.model_op_flops(con)
    metrics.nest_ops(con)
    metrics.attribute_kernel_flops(con)
    unlinked = con.execute("""
        SELECT count(*) FROM kernels k WHERE kind = 'compute' AND NOT EXISTS (
            SELECT 1 FROM api_calls a WHERE a.source_id = k.source_id AND a.correlation = k.correlation)""").fetchone()[0]
    assert unlinked == 0
    # The 8192³ mm kernels belong to aten::mm ops (External id link).
    rows = con.execute("""
        SELECT o.name, count(*) FROM kernels k JOIN ops o ON o.op_id = k.op_id
        WHERE k.name LIKE 'nvjet%' GROUP BY o.name""").fetchall()
    assert dict(rows).get("aten::mm", 0) >= 30
    # Nesting: every aten::mm in the compute phase sits inside something or is top level, depth >= 0.
    assert con.execute("SELECT count(*) FROM ops WHERE depth IS NULL").fetchone()[0] == 0


def test_nccl_collectives_from_two_ranks():
    d = corpus_file("h200x2-small/kineto")
    con = ingest(d)
    assert sorted(r for (r,) in con.execute("SELECT DISTINCT rank FROM kernels").fetchall()) == [0, 1]
    rows = con.execute("""SELECT rank, collective, count(*), min(group_ranks), min(bytes) FROM collectives
                          GROUP BY ALL ORDER BY ALL""").fetchall()
    by = {(r, c): (n, g, b) for r, c, n, g, b in rows}
    assert by[(0, "allreduce")][0] == by[(1, "allreduce")][0] >= 3
    assert by[(0, "allreduce")][1] == "[0, 1]"
    assert by[(0, "allreduce")][2] == 4194304 * 2  # 2048² bf16 elements
    # Sequence numbers pair the same collective across ranks.
    seqs = con.execute("""SELECT rank, list(seq ORDER BY start_ns) FROM collectives WHERE collective = 'allreduce'
                          GROUP BY rank ORDER BY rank""").fetchall()
    assert seqs[0][1] == seqs[1][1] == list(range(len(seqs[0][1])))


@pytest.mark.parametrize("name", [
    "alexnet__benchmark_result_2869224_1695835535_trace.json.gz",  # 2023, epoch-µs ts, cuda_sync
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",       # ROCm
    "nccl_parser_config__nccl_data.json.gz",
    "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "trace_diff__test__test.json.gz",                              # 2022 format
    "trace_filter__sampled_rank-0.json.gz",
    "trace_filter__sampled_rank-1.json.gz",
    "triton_example__triton_example.json.gz",                      # args of unexpected types (grid as text)
])
def test_public_kineto_traces_ingest(name):
    path = corpus_file(f"public-kineto-hta/{name}")
    con = ingest(path)
    n, lo, hi = con.execute("SELECT count(*), min(start_ns), max(end_ns) FROM kernels").fetchone()
    assert n > 0
    # Every trace here was recorded between 2020 and 2027: times must be UTC epoch ns.
    assert 1.58e18 < lo < hi < 1.83e18


def test_epoch_us_trace_without_base(tmp_path):
    ts = 1_695_835_542_481_129.0  # epoch µs (2023), as old traces write it
    p = write_trace(tmp_path / "old.json", [kernel("k", ts, 10.0, 1, 1)], base=None)
    con = ingest(p)
    assert con.execute("SELECT start_ns, end_ns FROM kernels").fetchone() == (
        1_695_835_542_481_129_000, 1_695_835_542_481_139_000)
    assert con.execute("SELECT clock_anchor FROM sources").fetchone()[0] == "epoch_us"


def test_cpu_only_trace_is_refused_with_one_line():
    with pytest.raises(BadInput, match="no GPU kernels"):
        ingest(corpus_file("public-kineto-hta/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))


def test_corpus_dir_exists_or_skip():
    if not CORPUS.exists():
        pytest.skip("../shared/corpus not present")
    assert (CORPUS / "FORMATS.md").exists()
