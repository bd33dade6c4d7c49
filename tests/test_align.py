"""One clock (SPEC §3): forced offsets, ranks aligned on collective ends, counter logs matched to GPUs and shifted by
correlation with the trace's busy time, wrong time zones found — recovered offsets checked against known truth.

Truth: every log of sample_traces/h200_align and ../shared/corpus/h200-single-kineto was written on the traced
host's own clock (time.time_ns / nvidia-smi in UTC; the trace is within 0.2 ms of it, see its run_info.json), so
each log's true offset is 0 and a log shifted by +37 s must come back by −37 s."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from plasmient_report import align, parsers, pipeline, store
from plasmient_report.errors import BadInput

from .conftest import corpus_file, sample_file


def run(inputs: list[Path], **opts: object) -> pipeline.Result:
    return pipeline.analyse(inputs, pipeline.Options(**opts))  # type: ignore[arg-type]


def clock(result: pipeline.Result, name: str) -> dict:
    return next(s for s in result.verdict["clock"]["sources"] if Path(s["path"]).name == name)


def shifted_nvml(src: Path, dst: Path, shift_ns: int) -> Path:
    lines = src.read_text().splitlines()
    out = [lines[0]] + [f"{int(ln.split(',', 1)[0]) + shift_ns},{ln.split(',', 1)[1]}" for ln in lines[1:] if ln]
    dst.write_text("\n".join(out) + "\n")
    return dst


# ------------------------------------------------------------------------------------------- durations

def test_parse_offset_and_durations():
    assert align.parse_duration_ns("+37s") == 37 * 10**9
    assert align.parse_duration_ns("-850us") == -850_000
    assert align.parse_duration_ns("1.5ms") == 1_500_000
    assert align.parse_duration_ns("-3h") == -3 * 3600 * 10**9
    assert align.parse_duration_ns("2") == 2 * 10**9
    assert align.parse_offset("logs/dmon.txt=+2min") == align.ForcedOffset("logs/dmon.txt", 120 * 10**9)
    with pytest.raises(BadInput):
        align.parse_offset("dmon.txt")
    with pytest.raises(BadInput):
        align.parse_duration_ns("soon")


def test_forced_offset_moves_every_time_column(tiny_trace):
    base = run([tiny_trace])
    moved = run([tiny_trace], offsets=[f"{tiny_trace.name}=-1.5ms"])
    for table in ("kernels", "ops", "api_calls", "ranges"):
        a = base.con.execute(f"SELECT min(start_ns), max(end_ns) FROM {table}").fetchone()
        b = moved.con.execute(f"SELECT min(start_ns), max(end_ns) FROM {table}").fetchone()
        assert (b[0] - a[0], b[1] - a[1]) == (-1_500_000, -1_500_000), table
    src = clock(moved, tiny_trace.name)
    assert (src["offset_ns"], src["method"], src["uncertainty_ns"]) == (-1_500_000, "forced", 0)
    with pytest.raises(BadInput, match="no input is named"):
        run([tiny_trace], offsets=["nope.json=+1s"])


# ---------------------------------------------------------------------------------------------- ranks

def _skewed_copy(src: Path, dst: Path, skew_us: float) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + skew_us
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def test_rank_skew_recovered_from_collective_ends(tmp_path):
    # Real 2-rank job (both ranks on one host: true offset 0). Rank 1 is moved 850 µs late.
    r0 = corpus_file("h200x2-small/kineto/rank0.pt.trace.json.gz")
    r1 = _skewed_copy(corpus_file("h200x2-small/kineto/rank1.pt.trace.json.gz"), tmp_path / "rank1.pt.trace.json.gz",
                      850.0)
    res = run([r0, r1])
    src = clock(res, "rank1.pt.trace.json.gz")
    assert src["method"] == "collectives"
    assert abs(src["offset_ns"] - (-850_000)) <= 50_000  # recovered within 50 µs
    assert 0 < src["uncertainty_ns"] < 10_000  # the median residual after alignment (µs)
    note = next(n for n in res.verdict["notes"] if n.startswith("rank 1 aligned to rank 0"))
    assert "9 collectives" in note and "median residual" in note
    ends = res.con.execute("""
        SELECT a.end_ns - b.end_ns FROM collectives a JOIN collectives b
          ON a.collective = b.collective AND a.seq = b.seq AND a.rank = 0 AND b.rank = 1""").fetchall()
    assert max(abs(d) for (d,) in ends) < 10_000  # after alignment the ends coincide within µs
    assert clock(res, "rank0.pt.trace.json.gz")["offset_ns"] == 0  # the reference stays put


def test_unskewed_ranks_stay_within_microseconds():
    res = run([corpus_file("h200x2-small/kineto/rank0.pt.trace.json.gz"),
               corpus_file("h200x2-small/kineto/rank1.pt.trace.json.gz")])
    assert abs(clock(res, "rank1.pt.trace.json.gz")["offset_ns"]) < 10_000


# ------------------------------------------------------------------------------------- counter GPUs

def test_counter_gpu_matching_by_uuid_index_and_unmatched(tmp_path):
    # One-GPU trace (device 0) and a query log of a 2-GPU machine: GPU 0 matches by index, GPU 1 is reported.
    res = run([corpus_file("h200-single-kineto/kineto_single.json.gz"), corpus_file("h200x2-small/smi/query_gpu.csv")],
              tz="UTC")
    got = res.con.execute("SELECT DISTINCT gpu_index, rank, device FROM counters ORDER BY 1").fetchall()
    assert got == [(0, 0, 0), (1, None, None)]
    assert any("GPU 1 matches no GPU of the trace" in n for n in res.verdict["notes"])
    con = store.connect()
    con.execute("INSERT INTO kernels (kernel_id, source_id, rank, device, start_ns, end_ns, name, kind) VALUES "
                "(1, 0, 0, 0, 0, 10, 'k', 'compute'), (2, 1, 1, 0, 0, 10, 'k', 'compute')")
    con.execute("INSERT INTO sources (source_id, path, format, rank, rank_method) VALUES "
                "(0, 'a', 'nsys-sqlite', 0, 'distributedInfo'), (1, 'b', 'nsys-sqlite', 1, 'distributedInfo'), "
                "(2, 'q.csv', 'nvidia-smi-query', NULL, 'counters')")
    # both ranks use device 0 (two hosts): the index is ambiguous, the UUID (or bus id) decides
    con.execute("INSERT INTO devices (source_id, rank, device, gpu_uuid, bus_id) VALUES "
                "(0, 0, 0, 'GPU-aaaa', '0000:00:06.0'), (1, 1, 0, 'GPU-bbbb', '00000000:00:07.0')")
    con.execute("INSERT INTO devices (source_id, device, gpu_uuid, bus_id) VALUES (2, 5, NULL, '00000000:00:07.0')")
    con.execute("INSERT INTO counters (source_id, gpu_index, gpu_uuid, metric, start_ns, end_ns, value) VALUES "
                "(2, 0, 'gpu-aaaa', 'gpu_util', 0, 1, 0.5), (2, 5, NULL, 'gpu_util', 0, 1, 0.5), "
                "(2, 0, NULL, 'gpu_util', 0, 1, 0.5)")
    notes = align.match_counter_gpus(con)
    got = con.execute("SELECT gpu_index, gpu_uuid, rank, device FROM counters ORDER BY 1, 2").fetchall()
    assert got == [(0, "gpu-aaaa", 0, 0), (0, None, None, None), (5, None, 1, 0)]
    assert any("several trace GPUs fit it equally" in n for n in notes)


# ------------------------------------------------------------------------------- counter clock shifts

def test_own_clock_kept_when_it_agrees():
    res = run([sample_file("h200_align")])
    for name in ("nvml_samples.csv", "nvidia_smi_query.csv", "nvidia_smi_dmon.txt"):
        src = clock(res, name)
        assert src["offset_ns"] == 0, name  # true offset 0: nothing applied
    assert clock(res, "nvml_samples.csv")["uncertainty_ns"] == pytest.approx(200e6, rel=0.1)  # one NVML refresh


@pytest.mark.parametrize("log", ["nvml_samples.csv"])
def test_plus_37_s_recovered(tmp_path, log):
    trace = sample_file("h200_align/kineto_bursts.pt.trace.json.gz")
    moved = shifted_nvml(sample_file(f"h200_align/{log}"), tmp_path / log, 37 * 10**9)
    res = run([trace, moved])
    src = clock(res, log)
    assert src["method"] == "correlation"
    # within one sampling period: NVML is polled every 10 ms but refreshes its utilization every ~200 ms
    period = src["uncertainty_ns"]
    assert 150e6 < period < 250e6
    assert abs(src["offset_ns"] - (-37 * 10**9)) <= period
    assert res.con.execute("SELECT min(end_ns) FROM counters").fetchone()[0] < \
        res.con.execute("SELECT max(end_ns) FROM kernels").fetchone()[0]  # the samples now sit on the trace


def test_plus_37_s_on_query_log(tmp_path):
    # nvidia-smi --query-gpu -lms 100, its local-time column rewritten 37 s later.
    import datetime as dt

    src = sample_file("h200_align/nvidia_smi_query.csv").read_text().splitlines()
    out = [src[0]]
    for ln in src[1:]:
        ts, rest = ln.split(", ", 1)
        t = dt.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f") + dt.timedelta(seconds=37)
        out.append(t.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] + ", " + rest)
    p = tmp_path / "nvidia_smi_query.csv"
    p.write_text("\n".join(out) + "\n")
    res = run([sample_file("h200_align/kineto_bursts.pt.trace.json.gz"), p], tz="UTC")
    s = clock(res, "nvidia_smi_query.csv")
    assert s["method"] == "correlation" and abs(s["offset_ns"] + 37 * 10**9) <= s["uncertainty_ns"]


@pytest.mark.parametrize("log", ["nvidia_smi_query.csv", "nvidia_smi_dmon.txt"])
def test_wrong_time_zone_recovered(log):
    # The UTC logs read as if written at UTC−3 land 3 h late: found as a whole-quarter-hour jump, then refined.
    res = run([sample_file("h200_align/kineto_bursts.pt.trace.json.gz"), sample_file(f"h200_align/{log}")],
              tz="Etc/GMT+3")
    s = clock(res, log)
    assert s["time_zone"] == "Etc/GMT+3"
    assert abs(s["offset_ns"] - (-3 * 3600 * 10**9)) <= s["uncertainty_ns"]
    assert any("like a log read in the wrong time zone" in n and log in n for n in res.verdict["notes"])


def test_wrong_zone_on_a_short_trace_uses_the_exact_jump():
    # The corpus trace is 2 s long: too short for NVML's 200 ms refresh to place a log by correlation, but the
    # only quarter-hour that puts the log on the trace is −3 h, taken exactly.
    res = run([corpus_file("h200-single-kineto/kineto_single.json.gz"),
               corpus_file("h200-single-kineto/nvidia_smi_query.csv")], tz="Etc/GMT+3")
    s = clock(res, "nvidia_smi_query.csv")
    assert s["offset_ns"] == -3 * 3600 * 10**9 and s["method"] in ("zone", "correlation")


def test_short_trace_is_not_shifted_on_weak_evidence(tmp_path):
    # On the 2-s corpus trace several shifts fit the NVML log about equally: a +37 s error cannot be recovered
    # there, and the log must not be moved to a wrong place either — it is reported as ambiguous.
    moved = shifted_nvml(corpus_file("h200-single-kineto/nvml_samples.csv"), tmp_path / "nvml_samples.csv",
                         37 * 10**9)
    res = run([corpus_file("h200-single-kineto/kineto_single.json.gz"), moved])
    s = clock(res, "nvml_samples.csv")
    assert s["offset_ns"] == 0 and s["method"] == "native"
    assert any("ambiguous" in n and "nvml_samples.csv" in n for n in res.verdict["notes"])
    res0 = run([corpus_file("h200-single-kineto/kineto_single.json.gz"),
                corpus_file("h200-single-kineto/nvml_samples.csv")])
    assert clock(res0, "nvml_samples.csv")["offset_ns"] == 0


def test_synthesized_dcgm_log_placed_by_correlation(tmp_path):
    # A dcgmi dmon log without timestamps, written from the real NVML samples every 100 ms; its file mtime is
    # 37 s after its last line (copied later), so the synthesized clock is 37 s late.
    rows = [ln.split(",") for ln in sample_file("h200_align/nvml_samples.csv").read_text().splitlines()[1:]]
    t0 = int(rows[0][0])
    picked, nxt = [], t0
    for r in rows:
        if int(r[0]) >= nxt:
            picked.append(r)
            nxt += 100_000_000
    lines = ["#Entity   GPUTL          POWER", "ID                       W"]
    lines += [f"GPU 0     {int(r[1]):<14} {float(r[4]):.3f}" for r in picked]
    p = tmp_path / "dcgmi.txt"
    p.write_text("\n".join(lines) + "\n")
    last = int(picked[-1][0])
    os.utime(p, ns=(last + 37 * 10**9, last + 37 * 10**9))
    res = run([sample_file("h200_align/kineto_bursts.pt.trace.json.gz"), p], dcgm_period_s=0.1)
    s = clock(res, "dcgmi.txt")
    assert s["anchor"] == "synthesized" and s["method"] == "correlation"
    # the truth: the k-th line was sampled at picked[k]; measure where the aligned samples ended up
    ends = [e for (e,) in res.con.execute("SELECT end_ns FROM counters WHERE metric = 'gpu_util' ORDER BY end_ns")
            .fetchall()]
    err = sorted(e - int(r[0]) for e, r in zip(ends, picked, strict=True))[len(ends) // 2]
    assert abs(err) <= s["uncertainty_ns"], err


def test_counter_logs_alone_need_a_trace():
    with pytest.raises(BadInput, match="counter logs need a trace to align to"):
        run([corpus_file("h200-single-kineto/nvml_samples.csv"), corpus_file("h200-single-kineto/nvidia_smi_dmon.txt")])


def test_cli_offset_tz_period(tmp_path):
    import subprocess
    import sys

    trace = sample_file("h200_align/kineto_bursts.pt.trace.json.gz")
    log = sample_file("h200_align/nvidia_smi_dmon.txt")
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-m", "plasmient_report.cli", str(trace), str(log), "--out", str(out), "--json",
                        "--tz", "UTC", "--offset", "nvidia_smi_dmon.txt=+250ms", "--dcgm-period", "0.5",
                        "--no-html", "--no-trace"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    s = next(x for x in v["clock"]["sources"] if x["path"].endswith("nvidia_smi_dmon.txt"))
    assert (s["offset_ns"], s["method"], s["time_zone"]) == (250_000_000, "forced", "UTC")
    bad = subprocess.run([sys.executable, "-m", "plasmient_report.cli", str(log), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "counter logs need a trace to align to" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    badtz = subprocess.run([sys.executable, "-m", "plasmient_report.cli", str(trace), str(log), "--tz", "Nowhere/X",
                            "--out", str(tmp_path / "y")], capture_output=True, text=True, timeout=300)
    assert badtz.returncode == 2 and "unknown time zone" in badtz.stderr


def test_all_sources_get_a_clock_record():
    res = run([corpus_file("h200-single-kineto")])
    for s in res.verdict["clock"]["sources"]:
        assert s["offset_ns"] is not None and s["method"], s
    assert parsers.AUXILIARY >= {s["format"] for s in res.verdict["clock"]["sources"] if s["format"] != "kineto"}
