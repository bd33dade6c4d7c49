"""PR601 clock-throttling: fires on counters whose SM clock drops while the GPU is busy (synthetic NVML-like rows, and
the committed NVML log of the compute-bound phase), silent at full clock or without counters."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from plasmient_report import align as align_stage
from plasmient_report import pipeline, rules, store

from ...conftest import annotation, corpus_file, cpu_op, kernel, launch, sample_file, write_trace
from ..expect import Between, Expect, Near, analyse, check, truth

MAX_MHZ = 1980.0  # sample_traces/README.md: the H200's max SM clock


def _throttle_run(tmp_path: Path, busy_mhz: float, with_counters: bool = True, hip: bool = False) -> list[rules.Finding]:
    """An 8192³ bf16 mm kernel for 2 ms, with NVML-like counters (every 100 µs) inserted into the store; with `hip`
    the kernel is launched by hipLaunchKernel (a ROCm program)."""
    n = 8192
    go = launch(2.0, ext=1, corr=11)
    if hip:
        go["name"] = "hipLaunchKernel"
    ev = [
        annotation("step", 0.0, 2400.0),
        cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
        go,
        kernel("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 200.0, 2000.0, ext=1, corr=11),
    ]
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
            rows += [
                (0, 0, "sm_clock_mhz", s, s + 100_000, busy_mhz if busy else MAX_MHZ),
                (0, 0, "power_w", s, s + 100_000, 690.0 if busy else 120.0),
                (0, 0, "power_limit_w", s, s + 100_000, 700.0),
            ]
        con.executemany(
            "INSERT INTO counters (source_id, device, metric, start_ns, end_ns, value) VALUES (?, ?, ?, ?, ?, ?)", rows
        )
    ctx = pipeline.measure(con, pipeline.Options())
    found, notes = rules.run(con, rules.configure(["PR601"]), ctx.ranges, ctx.precision, ctx.peaks, strict=True)
    assert notes == []
    return found


def test_a_rocm_program_gets_amds_words(tmp_path):
    # The construction of test_fires_on_a_clock_drop, launched through HIP: AMD GPUs have compute units and a GFX
    # clock, and amd-smi, not nvidia-smi, reads their throttling (before: "ran its SMs", `nvidia-smi -q`).
    (f,) = _throttle_run(tmp_path, busy_mhz=1500.0, hip=True)
    text = f.title + f.recommendation + (f.fix or "")
    assert "GFX clock" in f.title and "compute units" in f.recommendation and "amd-smi" in f.recommendation
    assert "SM" not in text.replace("amd-smi", "") and "nvidia-smi" not in text


def test_fires_on_a_clock_drop(tmp_path):
    # Construction: 1500 MHz while busy against 1980 MHz idle, power at 690 of 700 W.
    f = _throttle_run(tmp_path, busy_mhz=1500.0)
    assert len(f) == 1 and f[0].rule_id == "PR601"
    assert Near(1 - 1500 / MAX_MHZ, abs=0.01, truth="construction").holds(f[0].evidence["clock_drop"])
    assert "power-capped" in f[0].recommendation and 0 < (f[0].lost_fraction or 0) < 1


def _nvml_drop(csv_path: Path, run_info: dict, phase: str) -> float:
    """The truth: the NVML samples (every 10 ms) within one sample period of the phase's wall-clock window
    (the run info's phase_windows), their median against the 1980 MHz maximum."""
    w = next(p for p in run_info["phase_windows"] if p["phase"] == phase)
    with open(csv_path) as fh:
        rows = list(csv.DictReader(fh))
    inside = [
        float(r["sm_clock_mhz"])
        for r in rows
        if w["wall_start_ns"] - 10_000_000 <= int(r["wall_ns"]) <= w["wall_end_ns"] + 10_000_000
    ]
    return 1 - statistics.median(inside) / MAX_MHZ


def test_silent_on_the_committed_nvml_log():
    # sample_traces/h200_single/nvml_samples.csv holds 1980 MHz throughout the compute-bound phase: no drop.
    drop = _nvml_drop(
        sample_file("h200_single/nvml_samples.csv"), truth("h200_single/kineto_run_info.json"), "phase:compute_bound"
    )
    assert drop < 0.05  # the threshold max_clock_drop
    v = analyse(
        [sample_file("h200_single/kineto_single.pt.trace.json.gz"), sample_file("h200_single/nvml_samples.csv")],
        ranges=["phase:compute_bound"],
        rule_select=["PR601"],
    )
    check(v, [], silent=["PR601"])


def test_fires_on_the_corpus_nvml_log():
    # ../shared/corpus/h200-single-kineto/nvml_samples.csv: the same five phases recorded again; while the 8192³
    # matmuls run its SM clock reads 1635–1770 MHz against the 1980 MHz the H200 boosts to (power ~370 W, far from
    # the 700 W limit: not power-capped).
    d = corpus_file("h200-single-kineto")
    v = analyse([d / "kineto_single.json.gz", d / "nvml_samples.csv"], ranges=["phase:compute_bound"], rule_select=["PR601"])
    check(
        v,
        [
            Expect(
                "PR601",
                evidence={
                    "clock_drop": Between(1 - 1770 / MAX_MHZ, 1 - 1635 / MAX_MHZ + 0.05, truth="nvml_samples.csv: 1635–1770 MHz")
                },
                never_says=[r"power-capped"],
            )
        ],
    )


def test_silent_at_full_clock_or_without_counters(tmp_path):
    assert _throttle_run(tmp_path, busy_mhz=MAX_MHZ) == []
    assert _throttle_run(tmp_path, busy_mhz=1500.0, with_counters=False) == []


def _both_ways(con, ranges: list[str]) -> tuple[list[dict], list[dict]]:
    """The per-GPU busy clock of PR601 by its SQL definition and by numpy, on a measured store."""
    from plasmient_report.rules import context
    from plasmient_report.rules.device import clock_throttling as pr601

    ctx = pipeline.measure(con, pipeline.Options(ranges=ranges))
    rctx = context.prepare(con, ranges, ctx.precision, ctx.peaks)
    names = ", ".join(f"'{m}'" for m in pr601.METRICS)
    con.execute(f"CREATE OR REPLACE TABLE _rule_clk AS {pr601.SAMPLES_SQL.format(metrics=names)}")
    return pr601.per_gpu_sql(rctx, 0.05), pr601.per_gpu_clock(rctx, 0.05)


def _same_rows(sql: list[dict], native: list[dict]) -> None:
    assert len(sql) == len(native) and sql
    for a, b in zip(sql, native, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) or isinstance(b[k], float):
                assert b[k] == pytest.approx(a[k], rel=1e-9), k  # sums added in another order
            else:
                assert a[k] == b[k], k


@pytest.mark.parametrize(
    "inputs,ranges",
    [
        (["h200_single/kineto_single.pt.trace.json.gz", "h200_single/nvml_samples.csv"], []),
        (["h200_single/kineto_single.pt.trace.json.gz", "h200_single/nvml_samples.csv"], ["phase:compute_bound"]),
    ],
)
def test_numpy_clock_is_the_sql_definition_on_the_samples(inputs, ranges):
    con = store.connect()
    pipeline.ingest(con, [sample_file(x) for x in inputs])
    align_stage.align(con)
    _same_rows(*_both_ways(con, ranges))


@pytest.mark.parametrize("rel", ["h200-single-nsys/nsys_workload.sqlite", "h200-single-kineto"])
def test_numpy_clock_is_the_sql_definition_on_the_corpus(rel):
    # the corpus nsys export's GPU metrics at 10 kHz (its sm_clock_mhz samples), and the corpus NVML log
    p = corpus_file(rel)
    inputs = [p] if p.is_file() else [p / "kineto_single.json.gz", p / "nvml_samples.csv"]
    con = store.connect()
    pipeline.ingest(con, inputs)
    align_stage.align(con)
    _same_rows(*_both_ways(con, []))
