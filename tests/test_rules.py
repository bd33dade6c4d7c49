"""The rule engine (SPEC §5): every rule fires on a fixture built to show its problem — a real trace segment
where one exists — and stays silent on one that does not; findings never claim more than the waterfall lost;
selection, thresholds, plugins and the catalog work as documented."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plasmient_report import align as align_stage
from plasmient_report import pipeline, rules, store
from plasmient_report.metrics import CATEGORIES
from plasmient_report.rules import DOC_SECTIONS, LAYERS, Finding, rule

from .conftest import annotation, corpus_file, cpu_op, kernel, launch, sample_file, write_trace

SINGLE = "h200-single-kineto/kineto_single.json.gz"


def analyse(paths: list[Path], **kw: Any) -> dict[str, Any]:
    return pipeline.analyse([Path(p) for p in paths], pipeline.Options(**kw)).verdict


@functools.cache
def corpus_phase(phase: str | None) -> dict[str, Any]:
    """A verdict for one phase of the H200 corpus trace (../shared/corpus/README.md), analysed once."""
    return analyse([corpus_file(SINGLE)], ranges=[f"phase:{phase}"] if phase else [])


@functools.cache
def ddp_sample() -> dict[str, Any]:
    d = Path(sample_file("h200x2_ddp/kineto/rank0.pt.trace.json.gz")).parent
    return analyse([d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"])


@functools.cache
def two_rank_corpus() -> dict[str, Any]:
    return analyse([corpus_file("h200x2-small/kineto")])


def found(v: dict[str, Any], rule_id: str) -> list[dict[str, Any]]:
    return [f for f in v["findings"] if f["rule"] == rule_id]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plasmient_report.cli", *args], capture_output=True, text=True,
                          timeout=300)


def _claims_within_waterfall(v: dict[str, Any]) -> None:
    losses = {x["category"]: x["fraction"] for x in v["losses"]}
    for f in v["findings"]:
        assert f["lost_fraction"] is None or f["lost_fraction"] >= 0
        if f["category"] and losses:
            assert f["lost_fraction"] <= losses.get(f["category"], 0.0) + 1e-9, f
        elif v["achieved_fraction_of_peak"] is not None and f["lost_fraction"] is not None:
            assert f["lost_fraction"] <= 1 - v["achieved_fraction_of_peak"] + 1e-9, f


# ---- synthetic traces --------------------------------------------------------------------------------------

def nccl_kernel(name: str, ts: float, dur: float, ext: int, corr: int, collective: str, ranks: str = "[0, 1]",
                stream: int = 20, nelems: int = 1 << 20, pg: str = "0") -> dict[str, Any]:
    return kernel(name, ts, dur, ext, corr, stream=stream, **{
        "Collective name": collective, "Process Group Name": pg, "Process Group Ranks": ranks, "Group size": 2,
        "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "BFloat16"})


def allreduce_traces(tmp: Path, skew_us: float = 0.0, overlap: bool = False, n: int = 3) -> list[Path]:
    """Two ranks, n steps of a 4096³ bf16 mm (200 µs) then one all-reduce, a step every 1000 + `skew_us` µs.
    Rank 1's mm takes `skew_us` longer, so it reaches each all-reduce that late; with `overlap`, both ranks run a
    compute kernel on another stream while the all-reduce transfers."""
    paths = []
    d = 4096
    for rank in (0, 1):
        ev: list[dict[str, Any]] = []
        corr = 1000 * (rank + 1)
        for i in range(n):
            t0 = i * (1000.0 + skew_us)
            late = skew_us if rank == 1 else 0.0
            ev.append(cpu_op("aten::mm", t0, 2.0, ext=corr, dims=[[d, d], [d, d]], types=["c10::BFloat16"] * 2))
            ev.append(launch(t0 + 0.5, ext=corr, corr=corr))
            ev.append(kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", t0 + 3.0, 197.0 + late,
                             ext=corr, corr=corr))
            ar_start = t0 + 200.0 + late
            ar_end = t0 + 200.0 + skew_us + 150.0  # ends together on both ranks
            ev.append(nccl_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                  ar_start, ar_end - ar_start, ext=corr + 1, corr=corr + 1, collective="allreduce"))
            if overlap:
                ev.append(kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", ar_start,
                                 ar_end - ar_start, ext=corr + 2, corr=corr + 2, stream=8))
            corr += 10
        ev.append(annotation("train", 0.0, n * (1000.0 + skew_us)))
        paths.append(write_trace(tmp / f"rank{rank}.json", ev, rank=rank))
    return paths


def gpipe_traces(tmp: Path, stages: int = 2, micro: int = 4, tf: float = 100.0, tb: float = 200.0,
                 c: float = 10.0, rank_of_stage: list[int] | None = None) -> list[Path]:
    """A GPipe schedule (all forwards, then all backwards), one trace per rank, times in µs: each micro-batch's
    forward takes `tf` and backward `tb` on every stage; activations and gradients reach the next stage `c`
    after they are produced (P2P send/recv kernels with the trace's `Collective name` send / recv). Each
    direction of each stage pair gets its own process-group name: alignment and the waterfall pair collectives
    by (process group, collective, seq), which would mistake one stage's sends for another's in one group."""
    p, m = stages, micro
    ranks = rank_of_stage or list(range(p))
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    ev: list[list[dict[str, Any]]] = [[] for _ in range(p)]
    ids = iter(range(10, 10**6))
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    send = recv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"

    def pair(s: int, t: int) -> str:
        return str(sorted([ranks[s], ranks[t]]))

    def pg(s: int, t: int) -> str:  # one group per direction and stage pair
        return f"pp{min(s, t)}{'fwd' if t > s else 'bwd'}"

    for s in range(p):
        prev_end, recv_posted = 0.0, 0.0
        for i in range(m):
            arrive = f_end[s - 1][i] + c if s else 0.0
            start = max(prev_end, arrive)
            if s:
                k = next(ids)
                ev[s].append(nccl_kernel(recv, recv_posted, arrive - recv_posted, k, k, "recv", pair(s, s - 1),
                                         stream=21, pg=pg(s - 1, s)))
                recv_posted = arrive
            f_end[s][i] = start + tf
            k = next(ids)
            ev[s].append(kernel(gemm, start, tf, k, k))
            if s < p - 1:
                k = next(ids)
                ev[s].append(nccl_kernel(send, f_end[s][i], c, k, k, "send", pair(s, s + 1), pg=pg(s, s + 1)))
            prev_end = f_end[s][i]
    for s in reversed(range(p)):
        prev_end = f_end[s][m - 1]
        recv_posted = prev_end
        for i in reversed(range(m)):
            arrive = b_end[s + 1][i] + c if s < p - 1 else 0.0
            start = max(prev_end, arrive)
            if s < p - 1:
                k = next(ids)
                ev[s].append(nccl_kernel(recv, recv_posted, max(arrive - recv_posted, 1.0), k, k, "recv",
                                         pair(s, s + 1), stream=21, pg=pg(s + 1, s)))
                recv_posted = arrive
            b_end[s][i] = start + tb
            k = next(ids)
            ev[s].append(kernel(gemm, start, tb, k, k))
            if s:
                k = next(ids)
                ev[s].append(nccl_kernel(send, b_end[s][i], c, k, k, "send", pair(s, s - 1), pg=pg(s, s - 1)))
            prev_end = b_end[s][i]
    step_end = max(max(x) for x in b_end) + 1.0
    paths = []
    for s in range(p):
        ev[s].append(annotation("ProfilerStep#1", 0.0, step_end))
        paths.append(write_trace(tmp / f"stage{s}_rank{ranks[s]}.json", ev[s], rank=ranks[s]))
    return paths


# ---- the catalog -------------------------------------------------------------------------------------------

def test_catalog_ids_layers_pages():
    catalog = rules.builtin_rules()
    ids = [r.id for r in catalog]
    assert len(ids) == len(set(ids)) >= 14
    # SPEC §5's list, one rule (or family member) each.
    assert {"PR101", "PR102", "PR201", "PR301", "PR302", "PR401", "PR402", "PR403", "PR501", "PR502", "PR503",
            "PR504", "PR601", "PR602"} <= set(ids)
    for r in catalog:
        assert r.layer in LAYERS and (r.category is None or r.category in CATEGORIES)
        page = r.page()
        positions = [page.index(f"## {s}") for s in DOC_SECTIONS]
        assert positions == sorted(positions), r.id
        assert "## Thresholds" in page and "min_lost_fraction" in page


def test_rules_command_lists_and_explains():
    r = cli("rules")
    assert r.returncode == 0
    for rid in ("PR101", "PR201", "PR502", "PR602"):
        assert rid in r.stdout
    r = cli("rules", "--explain", "PR101")
    assert r.returncode == 0
    assert r.stdout.startswith("# PR101 straggler-rank") and "## How to fix" in r.stdout and "min_lateness_us" in r.stdout
    assert cli("rules", "--explain", "host-sync-stall").stdout.startswith("# PR502")
    bad = cli("rules", "--explain", "PR999")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    listing = json.loads(cli("rules", "--json").stdout)
    assert {x["id"] for x in listing} >= {"PR101", "PR602"}


# ---- PR101 straggler-rank ----------------------------------------------------------------------------------

def test_straggler_names_rank0_in_two_rank_corpus():
    # ../shared/corpus/h200x2-small/PROVENANCE.txt: rank 1's first all-reduce lasts ~0.997 s because it waited
    # for rank 0 (start skew): rank 0 is the late one, rank 1 the waiting one.
    v = two_rank_corpus()
    f = found(v, "PR101")
    assert [x["rank"] for x in f] == [0]
    ev = f[0]["evidence"]
    assert ev["max_lateness_ns"] == pytest.approx(0.997e9, rel=0.01)
    assert ev["waiting_ranks"][0]["rank"] == 1 and ev["startup_skew"] is True
    cw = next(x["fraction"] for x in v["losses"] if x["category"] == "collective_wait")
    assert f[0]["lost_fraction"] == pytest.approx(cw, rel=0.01)
    assert next(x for x in v["losses"] if x["category"] == "collective_wait")["recommendation"] == f[0]["fix"]


def test_straggler_names_late_rank_in_ddp_sample():
    # sample_traces/h200x2_ddp/ground_truth.json: rank 1 sleeps 30 ms before each backward (5 profiled steps),
    # so rank 0 waits in the first all-reduce of every step.
    truth = json.loads(sample_file("h200x2_ddp/ground_truth.json").read_text())
    v = ddp_sample()
    f = found(v, "PR101")
    assert [x["rank"] for x in f] == [truth["late_rank"]]
    ev = f[0]["evidence"]
    assert ev["late_share"] == 1.0 and ev["collectives"] == ["allreduce"] and not ev["startup_skew"]
    assert ev["lateness_per_step_ns"] == pytest.approx(truth["late_sleep_s"] * 1e9, rel=0.20)
    assert ev["steps_seen"] == truth["profiled_steps"]
    # The punctual rank's wait: ≈ the injected delay per step, and its largest loss.
    punctual = ev["waiting_ranks"][0]
    assert punctual["rank"] == 0
    assert punctual["wait_ns"] / truth["profiled_steps"] == pytest.approx(truth["late_sleep_s"] * 1e9, rel=0.20)
    r0 = next(r for r in v["ranks"] if r["rank"] == 0)
    assert r0["losses"][0]["category"] == "collective_wait"
    assert "rank 1 is late to 100% of all-reduces" in f[0]["fix"]


def test_straggler_silent_when_ranks_are_punctual(tmp_path):
    v = analyse(allreduce_traces(tmp_path, skew_us=0.0))
    assert found(v, "PR101") == []
    assert found(corpus_phase("train_step"), "PR101") == []  # one rank, no collectives


def test_straggler_synthetic_lateness(tmp_path):
    # Rank 1's compute runs 300 µs longer before each of 3 all-reduces: rank 0 waits 300 µs in each.
    v = analyse(allreduce_traces(tmp_path, skew_us=300.0))
    f = found(v, "PR101")
    assert [x["rank"] for x in f] == [1]
    assert f[0]["evidence"]["mean_lateness_ns"] == pytest.approx(300e3, rel=0.02)
    assert f[0]["evidence"]["collectives_late"] == 3


# ---- PR102 exposed-communication ---------------------------------------------------------------------------

def test_exposed_communication_in_ddp_sample():
    f = found(ddp_sample(), "PR102")
    assert len(f) == 1 and f[0]["evidence"]["overlap"] < 0.5
    assert f[0]["evidence"]["top_collectives"][0]["collective"] == "allreduce"


def test_exposed_communication_silent_when_overlapped(tmp_path):
    assert found(analyse(allreduce_traces(tmp_path, overlap=True)), "PR102") == []


# ---- PR201 pipeline-bubble (no real pipeline recording yet: a synthetic GPipe schedule) --------------------

@pytest.mark.parametrize(("stages", "micro", "order"), [(2, 4, None), (3, 6, [2, 0, 1])])
def test_pipeline_bubble_synthetic_gpipe(tmp_path, stages, micro, order):
    # Truth from the construction: equal stage times → GPipe bubble (p−1)/(m+p−1); the 10 µs P2P hop per
    # stage boundary adds (p−1)·2·10 µs per step on top of it (21.1% measured for 2 × 4, 26.2% for 3 × 6).
    # No real pipeline recording is committed yet; a 2-stage GPipe run on two H200s (m = 4 and 8) was checked
    # by hand: stages, micro-batches and the formula are found, the measured bubble is far above theory there
    # (54% vs 20%) because profiling slows the host and stage 1's blocking recv leaves its GPU idle.
    v = analyse(gpipe_traces(tmp_path, stages=stages, micro=micro, rank_of_stage=order))
    f = found(v, "PR201")
    assert len(f) == 1
    ev = f[0]["evidence"]
    theory = (stages - 1) / (micro + stages - 1)
    assert ev["num_stages"] == stages and ev["micro_batches"] == micro
    assert ev["theory_bubble"] == pytest.approx(theory)
    assert ev["stage_order"] == (order or list(range(stages)))
    step_us = (micro + stages - 1) * 300.0 + 2 * (stages - 1) * 10.0  # the pipeline's GPU span
    assert ev["measured_bubble"] == pytest.approx(1 - micro * 300.0 / step_us, abs=1e-6)
    assert abs(ev["measured_bubble"] - theory) < 0.03
    assert ev["micro_batches_to_halve"] == 2 * micro + stages - 1
    assert f"{micro} → {2 * micro + stages - 1}" in f[0]["fix"]
    _claims_within_waterfall(v)


def test_pipeline_bubble_silent_without_pipeline():
    assert found(ddp_sample(), "PR201") == []  # data parallel: all-reduces, no send/recv
    # One rank's SendRecv kernels of an all-to-all (torchrec) are not pipeline stages.
    v = analyse([corpus_file("public-kineto-hta/trace_diff__test__test.json.gz")])
    assert found(v, "PR201") == []


# ---- PR301 / PR302 memory-bound kernels and unfused chains --------------------------------------------------

def test_memory_bound_phase_names_the_elementwise_kernels():
    v = corpus_phase("memory_bound")
    f = found(v, "PR301")
    kernels = {x["evidence"]["kernel_short"] for x in f}
    assert {"vectorized_elementwise_kernel [MulFunctor]", "vectorized_elementwise_kernel [CUDAFunctorOnSelf_add]"} <= kernels
    assert {op for x in f for op in x["evidence"]["ops"]} >= {"aten::mul_", "aten::add_"}
    # ../shared/corpus/README.md: in-place elementwise over 1 GiB fp32 streams 4.17 TB/s (87% of 4.8 TB/s).
    for x in f:
        assert x["evidence"]["hbm_fraction"] == pytest.approx(4.17 / 4.8, abs=0.06)
    chain = found(v, "PR302")
    assert chain and chain[0]["evidence"]["ops"] == ["aten::mul_", "aten::add_"]
    assert chain[0]["evidence"]["repeats"] == 40 and chain[0]["evidence"]["kernels"] == 80
    # The chain explains the whole memory-bound loss; its fix is the waterfall line's recommendation.
    mb = next(x for x in v["losses"] if x["category"] == "memory_bound")
    assert chain[0]["lost_fraction"] == pytest.approx(mb["fraction"], rel=0.01)
    assert mb["recommendation"] == chain[0]["fix"]
    _claims_within_waterfall(v)


def test_memory_bound_rules_silent_on_compute_bound_and_tiny_kernels():
    for phase in ("compute_bound", "launch_bound"):
        v = corpus_phase(phase)
        assert found(v, "PR301") == [] and found(v, "PR302") == [], phase


# ---- PR401 matmul-without-tensor-cores --------------------------------------------------------------------

def test_fp32_sgemm_is_flagged(tmp_path):
    n = 4096
    ev = [annotation("step", 0.0, 5200.0),
          cpu_op("aten::mm", 10.0, 20.0, ext=1, dims=[[n, n], [n, n]], types=["float", "float"]),
          launch(12.0, ext=1, corr=11),
          kernel("ampere_sgemm_128x64_nn", 100.0, 5000.0, ext=1, corr=11)]
    v = analyse([write_trace(tmp_path / "fp32.json", ev)])
    f = found(v, "PR401")
    assert len(f) == 1 and f[0]["evidence"]["kernels"][0]["kernel"] == "ampere_sgemm_128x64_nn"
    assert "TF32" in f[0]["recommendation"] and f[0]["evidence"]["peak_tflops"]["tf32"] > 0
    _claims_within_waterfall(v)


def test_fp32_on_v100_recommends_fp16():
    # A real public trace (HolisticTraceAnalysis tests) on a V100: volta_sgemm kernels, and no TF32 on Volta.
    v = analyse([corpus_file("public-kineto-hta/trace_diff__test__test.json.gz")])
    f = found(v, "PR401")
    assert f and "volta_sgemm" in f[0]["evidence"]["kernels"][0]["kernel"]
    assert "fp16" in f[0]["fix"] and "TF32" not in f[0]["fix"]


def test_tensor_core_rule_silent_on_bf16():
    assert found(corpus_phase("compute_bound"), "PR401") == []
    assert found(corpus_phase("train_step"), "PR401") == []


# ---- PR402 gemm-wave-quantization -------------------------------------------------------------------------

def test_wave_quantization(tmp_path):
    # 1664×1408 output in 128×128 tiles = 13·11 = 143 tiles, one block per SM (200 kB shared memory) on 132
    # SMs: 1.08 waves, the second nearly empty → 143 / 264 = 54% efficient.
    m, k, n = 1664, 8192, 1408
    name = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
    ev = [annotation("step", 0.0, 130.0),
          cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[m, k], [k, n]], types=["c10::BFloat16"] * 2),
          launch(2.0, ext=1, corr=11),
          kernel(name, 10.0, 100.0, ext=1, corr=11, grid=[143, 1, 1], block=[384, 1, 1],
                 **{"registers per thread": 168, "shared memory": 200000})]
    v = analyse([write_trace(tmp_path / "waves.json", ev)])
    f = found(v, "PR402")
    assert len(f) == 1
    g = f[0]["evidence"]["gemms"][0]
    assert g["units"] == 143 and g["slots"] == 132
    assert g["waves"] == pytest.approx(143 / 132) and g["efficiency"] == pytest.approx(143 / 264)
    _claims_within_waterfall(v)


def test_wave_quantization_silent_on_big_square_gemm():
    # 8192³ with 320×128 persistent tiles: 1664 tiles = 12.6 waves on 132 SMs (≈ 96% efficient).
    assert found(corpus_phase("compute_bound"), "PR402") == []


# ---- PR403 pageable-or-sync-memcpy ------------------------------------------------------------------------

def test_pageable_memcpy_in_public_trace(tmp_path):
    # HolisticTraceAnalysis' AlexNet benchmark trace (A100): 16 'Memcpy HtoD (Pageable -> Device)'. Their loss
    # is tiny next to a 43 s mostly idle window, so the rule's reporting threshold is lowered (--rules-config).
    cfg = tmp_path / "rules.toml"
    cfg.write_text("[PR403]\nmin_lost_fraction = 0\n")
    v = analyse([corpus_file("public-kineto-hta/alexnet__benchmark_result_2869224_1695835535_trace.json.gz")],
                rules_config=cfg)
    f = found(v, "PR403")
    assert len(f) == 1
    copies = f[0]["evidence"]["pageable_copies"]
    assert copies[0]["direction"] == "HtoD" and sum(c["count"] for c in copies) == 16
    assert "pin_memory=True" in f[0]["recommendation"]


def test_memcpy_rule_silent_on_pinned_async_copies():
    # host_stall's .item() copies are 'Memcpy DtoH (Device -> Pinned)' via cudaMemcpyAsync.
    assert found(corpus_phase("host_stall"), "PR403") == []


# ---- PR501 launch-bound-stream ----------------------------------------------------------------------------

def test_launch_bound_phase():
    # ../shared/corpus/README.md: 3000 × tiny.add_(1.0) on a 1-element tensor.
    v = corpus_phase("launch_bound")
    f = found(v, "PR501")
    assert len(f) == 1
    ev = f[0]["evidence"]
    assert ev["kernels"] == 3000 and ev["launches_per_step"] == 3000
    assert ev["median_kernel_ns"] < 2000 and ev["median_gap_ns"] > ev["median_kernel_ns"]
    assert "CUDA graph" in f[0]["fix"] and "3,000" in f[0]["fix"]
    lb = next(x for x in v["losses"] if x["category"] == "launch_bound")
    assert f[0]["lost_fraction"] > 0.8 * lb["fraction"] and lb["recommendation"] == f[0]["fix"]


def test_launch_bound_silent_on_compute_bound():
    assert found(corpus_phase("compute_bound"), "PR501") == []


# ---- PR502 host-sync-stall --------------------------------------------------------------------------------

def test_host_stall_names_item_and_sync():
    # ../shared/corpus/README.md: 10 × (1024³ mm, .item(), 20 ms time.sleep) — the GPU idles after each sync.
    v = corpus_phase("host_stall")
    f = found(v, "PR502")
    top = f[0]
    ev = top["evidence"]
    assert ev["as_written"] == ".item()" and ev["sync_call"] == "cudaStreamSynchronize"
    assert ev["op"] == "aten::_local_scalar_dense" and ev["outer_op"] == "aten::item"
    assert ev["d2h_copies"] and ev["syncs"] >= 9
    assert ev["mean_idle_ns"] == pytest.approx(20e6, rel=0.1)
    assert ".item()" in top["title"] and "cudaStreamSynchronize" in top["title"]
    ss = next(x for x in v["losses"] if x["category"] == "sync_stall")
    assert top["lost_fraction"] == pytest.approx(ss["fraction"], rel=0.01) and ss["recommendation"] == top["fix"]


def test_sync_rule_silent_without_stalls():
    for phase in ("compute_bound", "memory_bound"):
        assert found(corpus_phase(phase), "PR502") == [], phase


# ---- PR503 input-bound-step -------------------------------------------------------------------------------

def test_input_bound_steps(tmp_path):
    # 3 steps: 800 µs in a single-process DataLoader with the GPU idle, then 200 µs of compute.
    ev = []
    for i in range(3):
        t0 = i * 1000.0
        ev.append(annotation(f"ProfilerStep#{i}", t0, 1000.0))
        ev.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 1.0, 798.0))
        ev.append(cpu_op("aten::add_", t0 + 800.0, 5.0, ext=i + 1))
        ev.append(launch(t0 + 801.0, ext=i + 1, corr=100 + i))
        ev.append(kernel("vectorized_elementwise_kernel", t0 + 805.0, 190.0, ext=i + 1, corr=100 + i))
    v = analyse([write_trace(tmp_path / "loader.json", ev)])
    f = found(v, "PR503")
    assert len(f) == 1
    ev_ = f[0]["evidence"]
    assert ev_["single_process"] is True and ev_["suggested_workers"] >= 2
    assert ev_["wait_per_step_ns"] == pytest.approx(800e3, rel=0.05)
    assert "num_workers=" in f[0]["fix"]


def test_input_bound_silent_without_loader():
    assert found(corpus_phase("compute_bound"), "PR503") == []
    assert found(corpus_phase("train_step"), "PR503") == []


# ---- PR504 gpu-idle-gap -----------------------------------------------------------------------------------

def test_idle_gaps_in_host_stall():
    f = found(corpus_phase("host_stall"), "PR504")
    assert len(f) == 1
    gaps = f[0]["evidence"]["gaps"]
    assert gaps[0]["duration_ns"] == pytest.approx(20.5e6, rel=0.05)
    assert gaps[0]["after_op"] == "aten::item" and gaps[0]["host"] == "nothing traced on the host"
    assert f[0]["evidence"]["gap_count"] >= 10


def test_idle_gaps_silent_on_compute_bound():
    assert found(corpus_phase("compute_bound"), "PR504") == []


# ---- PR601 clock-throttling (counters) --------------------------------------------------------------------

def _throttle_run(tmp_path: Path, busy_mhz: float, with_counters: bool = True) -> list[Finding]:
    """An 8192³ bf16 mm kernel for 2 ms, with NVML-like counters (every 100 µs) inserted into the store."""
    n = 8192
    ev = [annotation("step", 0.0, 2400.0),
          cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
          launch(2.0, ext=1, corr=11),
          kernel("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 200.0, 2000.0, ext=1, corr=11)]
    path = write_trace(tmp_path / "clk.json", ev)
    con = store.connect()
    pipeline.ingest(con, [path])
    align_stage.align(con)
    if with_counters:
        base = con.execute("SELECT min(start_ns) FROM ranges").fetchall()[0][0]
        rows = []
        for i in range(24):
            s = base + i * 100_000
            busy = 200_000 <= i * 100_000 < 2_200_000
            rows += [(0, 0, "sm_clock_mhz", s, s + 100_000, busy_mhz if busy else 1980.0),
                     (0, 0, "power_w", s, s + 100_000, 690.0 if busy else 120.0),
                     (0, 0, "power_limit_w", s, s + 100_000, 700.0)]
        con.executemany("INSERT INTO counters (source_id, device, metric, start_ns, end_ns, value) "
                        "VALUES (?, ?, ?, ?, ?, ?)", rows)
    ctx = pipeline.measure(con, pipeline.Options())
    found_, notes = rules.run(con, rules.configure(["PR601"]), ctx.ranges, ctx.precision, ctx.peaks, strict=True)
    assert notes == []
    return found_


def test_clock_throttling_from_counters(tmp_path):
    f = _throttle_run(tmp_path, busy_mhz=1500.0)
    assert len(f) == 1 and f[0].rule_id == "PR601"
    assert f[0].evidence["clock_drop"] == pytest.approx(1 - 1500 / 1980, abs=0.01)
    assert "power-capped" in f[0].recommendation
    assert 0 < f[0].lost_fraction < 1


@pytest.mark.parametrize("inputs", [
    ["h200-single-kineto/kineto_single.json.gz", "h200-single-kineto/nvml_samples.csv"],
    ["h200-single-nsys/nsys_workload.sqlite"],
])
def test_clock_throttling_in_real_counters(inputs):
    # ../shared/corpus/h200-single-kineto/nvml_samples.csv: while the 8192³ matmuls run the H200's SM clock sits
    # at 1635 MHz against the 1980 MHz it boosts to when lightly loaded (power ~370 W, far from 700 W); the
    # nsys recording's GPU metrics (10 kHz) show the same kind of drop.
    v = analyse([corpus_file(p) for p in inputs], ranges=["phase:compute_bound"], rule_select=["PR601"])
    f = found(v, "PR601")
    assert len(f) == 1
    assert 0.10 < f[0]["evidence"]["clock_drop"] < 0.30
    assert "power-capped" not in f[0]["recommendation"]
    _claims_within_waterfall(v)


def test_clock_throttling_silent(tmp_path):
    assert _throttle_run(tmp_path, busy_mhz=1980.0) == []  # full clock while busy
    assert _throttle_run(tmp_path, busy_mhz=1500.0, with_counters=False) == []  # no counters: silent


# ---- PR602 utilization-vs-achieved-gap --------------------------------------------------------------------

def test_headline_gap():
    f = found(corpus_phase("memory_bound"), "PR602")
    assert len(f) == 1 and f[0]["evidence"]["utilization"] > 0.95
    assert f[0]["evidence"]["busy_losses"]["memory_bound"] > 0.9
    assert found(corpus_phase("compute_bound"), "PR602") == []  # 99% busy, 76% useful: gap below 25 points
    assert found(corpus_phase("launch_bound"), "PR602") == []  # not busy


# ---- the engine ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("phase", ["compute_bound", "memory_bound", "launch_bound", "host_stall", "train_step", None])
def test_findings_never_claim_more_than_lost(phase):
    v = corpus_phase(phase)
    _claims_within_waterfall(v)
    assert not any("failed" in n for n in v["notes"]), v["notes"]
    for f in v["findings"]:
        assert f["severity"] in ("high", "medium", "low", "info") and f["title"] and f["recommendation"]
        json.dumps(f["evidence"], allow_nan=False)


def test_multi_rank_claims_and_no_failures():
    for v in (ddp_sample(), two_rank_corpus()):
        _claims_within_waterfall(v)
        assert not any("failed" in n for n in v["notes"]), v["notes"]


def test_select_and_ignore(tmp_path):
    path = corpus_file(SINGLE)
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["PR5"])
    assert {f["rule"] for f in v["findings"]} == {"PR502", "PR504"}
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["PR5"], rule_ignore=["PR504"])
    assert {f["rule"] for f in v["findings"]} == {"PR502"}
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["host-sync-stall"])
    assert {f["rule"] for f in v["findings"]} == {"PR502"}
    # The CLI, and the findings table of the stored run.
    out = tmp_path / "out"
    r = cli(str(path), "--range", "phase:host_stall", "--out", str(out), "--select", "PR502,PR504",
            "--ignore", "PR504", "--json")
    assert r.returncode == 0, r.stderr
    assert {f["rule"] for f in json.loads(r.stdout)["findings"]} == {"PR502"}
    rows = cli("query", str(out / "run.duckdb"), "SELECT rule_id, category, fix FROM findings", "--csv").stdout
    assert rows.splitlines()[1].startswith('PR502,sync_stall,"drop .item()')
    bad = cli(str(path), "--out", str(tmp_path / "o2"), "--select", "PR999")
    assert bad.returncode == 2 and "PR999" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_rules_config_thresholds(tmp_path):
    path = corpus_file(SINGLE)
    cfg = tmp_path / "rules.toml"
    cfg.write_text('ignore = ["PR602"]\n[PR504]\nmin_gap_ms = 25\n[rules.PR502]\nmax_findings = 1\n')
    v = analyse([path], ranges=["phase:host_stall"], rules_config=cfg)
    assert found(v, "PR504") == [] and len(found(v, "PR502")) == 1  # no gap reaches 25 ms
    for text, msg in (("[PR504]\nmin_gap = 3\n", "unknown threshold"), ("[PR999]\nx = 1\n", "no such rule"),
                      ("[PR504]\nmin_gap_ms = 'big'\n", "a number"), ("[PR504\n", "cannot read")):
        cfg.write_text(text)
        r = cli(str(path), "--out", str(tmp_path / "o"), "--rules-config", str(cfg))
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (text, r.stderr)


@rule("XT901", name="every-kernel-count", layer="kernel", title="Counts kernels (a test plugin)", category=None,
      thresholds={"min_kernels": 1})
def _plugin_rule(ctx, t):
    """
    ## What it detects
    Nothing useful: it counts kernels.

    ## Why it costs peak
    It does not.

    ## How to fix
    Nothing to fix.

    ## Example
    `42 kernels`.
    """
    n = ctx.rows("SELECT count(*) AS n FROM rule_kernels")[0]["n"]
    if n >= t.min_kernels:
        yield Finding(title=f"{n} kernels", recommendation="none", fix="none", lost_fraction=None, key="count",
                      evidence={"kernels": n})


def test_third_party_rules_through_entry_points(monkeypatch, tiny_trace):
    from importlib import metadata

    class EP:
        def __init__(self, name: str, target: Any) -> None:
            self.name, self.value, self._t = name, f"tests:{name}", target

        def load(self) -> Any:
            if isinstance(self._t, Exception):
                raise self._t
            return self._t

    def fake(group: str) -> list[EP]:
        assert group == rules.ENTRY_POINT_GROUP
        return [EP("good", _plugin_rule), EP("broken", ImportError("no module named nope"))]

    monkeypatch.setattr(metadata, "entry_points", fake)
    catalog, notes = rules.all_rules()
    assert "XT901" in {r.id for r in catalog} and any("broken" in n for n in notes)
    v = analyse([tiny_trace], rule_select=["XT901"])
    assert [(f["rule"], f["evidence"]["kernels"], f["severity"]) for f in v["findings"]] == [("XT901", 2, "info")]
    assert any("broken" in n for n in v["notes"])


def test_rule_docs_are_checked():
    with pytest.raises(ValueError, match="sections"):
        @rule("XT902", name="undocumented", layer="host", title="t", category=None)
        def _bad(ctx, t):
            """## What it detects
            only one section"""
            return []
    with pytest.raises(ValueError, match="PR101"):
        rule("bad id", name="x", layer="host", title="t", category=None)(_plugin_rule.check)


def test_box_shows_findings_and_differing_ranks(tmp_path):
    d = sample_file("h200x2_ddp/kineto/rank0.pt.trace.json.gz").parent
    r = cli(str(d / "rank0.pt.trace.json.gz"), str(d / "rank1.pt.trace.json.gz"), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.replace("│", " ").split())
    assert "rank 1 is late to 100% of all-reduces" in out  # the collective-wait line's fix
    assert "largest loss" in out and "collective wait 71%" in out  # ranks differ: one line each
    assert "also found" in out and "PR504" in out


def test_box_merges_alike_ranks(tmp_path):
    r = cli(*map(str, allreduce_traces(tmp_path, skew_us=0.0)), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "2 ranks alike" in r.stdout


def test_straggler_per_step_figures():
    # The per-step wait is the total over the ProfilerStep#N count (5 in the sample).
    ev = found(ddp_sample(), "PR101")[0]["evidence"]
    assert math.isclose(ev["wait_caused_per_step_ns"] * ev["steps_seen"], ev["wait_caused_ns"], rel_tol=1e-9)


@pytest.mark.parametrize(("run", "m"), [("m4", 4), ("m8", 8)])
def test_pipeline_bubble_on_a_real_gpipe_recording(run, m):
    # sample_traces/README.md (h200x2_pipeline): 2 stages of a GPipe schedule recorded on two H200s.
    truth = json.loads(sample_file(f"h200x2_pipeline/{run}/truth.json").read_text())
    d = sample_file(f"h200x2_pipeline/{run}/rank0.pt.trace.json.gz").parent
    v = analyse([d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"])
    f = found(v, "PR201")
    assert f, "the pipeline-bubble rule must fire on a real pipeline"
    ev = f[0]["evidence"]
    assert ev["num_stages"] == truth["stages"] == 2 and ev["micro_batches"] == truth["micro_batches"] == m
    assert ev["theory_bubble"] == pytest.approx(truth["theory_bubble"])
    assert ev["stage_order"] == [0, 1]
    # The profiled trace's bubble is above theory (the profiler slows the host: README), never below it.
    assert ev["measured_bubble"] >= truth["theory_bubble"]
    assert ev["micro_batches_to_halve"] > m


@pytest.mark.parametrize(("run", "m"), [("d8192_m4", 4), ("d8192_m8", 8)])
def test_pipeline_bubble_near_theory_when_compute_dominates(run, m):
    # sample_traces/README.md (h200x2_pipeline/d8192_*): the same GPipe script with d = 8192 and 8192-token
    # micro-batches (~5 ms of forward per micro-batch and stage), so the profiler's host overhead is small. Stage 1
    # also computes the loss (a fp32 square-mean over 8192x8192 per micro-batch), so the stages are unequal: the
    # slowest sets the pace and the schedule's bubble is 1 - (m/(m+1)) / (t_max / t_mean), not 1/(m+1).
    truth = json.loads(sample_file(f"h200x2_pipeline/{run}/truth.json").read_text())
    d = sample_file(f"h200x2_pipeline/{run}/rank0.pt.trace.json.gz").parent
    ev = found(analyse([d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"]), "PR201")[0]["evidence"]
    assert ev["num_stages"] == 2 and ev["micro_batches"] == truth["micro_batches"] == m
    assert ev["stage_order"] == [0, 1]
    assert 1.05 < ev["stage_imbalance"] < 1.25  # stage 1's loss: measured 1.12
    # measured within 2 points of the unequal-stage schedule, and within 12 points of the plain formula
    assert ev["measured_bubble"] == pytest.approx(ev["theory_bubble_unequal_stages"], abs=0.02)
    assert truth["theory_bubble"] <= ev["measured_bubble"] <= truth["theory_bubble"] + 0.12
    # the rest is P2P: almost no idle time without a kernel (the host keeps up)
    assert ev["idle"] < 0.03
