"""The align stage (SPEC §3, one clock): one clock record per source in the `clock` table, applied to every time
column once; native anchors, forced offsets, ranks aligned on the ends of the same collective, counter logs matched
to GPUs and placed by correlation with the trace's busy time, wrong time zones found.

Every recovered offset is checked against truth the tool does not produce:
- the recordings' own host clock: sample_traces/h200_align/run_info.json (each GEMM burst's wall-clock window,
  `time.time_ns()` on the traced host) and sample_traces/h200_single/kineto_run_info.json (each phase's window);
- every log of sample_traces/h200_align and ../shared/corpus/h200-single-kineto was written on the traced host's
  clock (nvidia-smi local time = UTC there), so its true offset is 0, and a copy we move by +37 s (or read in the
  wrong zone) must come back by exactly that;
- both ranks of ../shared/corpus/h200x2-small and sample_traces/h200x2_ddp ran on one host (one clock): their true
  offset is 0, and a rank we move by a known skew must come back by exactly that skew.
Tolerances come from the recordings, never from the tool's reported uncertainty: NVML refreshes its utilization
every 200 ms (measured below from the raw log: value changes come at multiples of it), nvidia-smi dmon stamps
whole seconds, and one all-reduce ends up to 16 µs apart on two ranks of one host (the unskewed recordings). The
reported uncertainty is itself checked: it must cover the true error, and not by claiming the moon.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from plasmient_report import align, parsers, peaks, pipeline, store
from plasmient_report.errors import BadInput

from . import contract
from .conftest import BASE, corpus_file, cpu_op, kernel, launch, sample_file, write_trace

ALIGN = "h200_align"
DMON_RESOLUTION_NS = 10**9  # nvidia-smi dmon -o DT prints HH:MM:SS
# One all-reduce's end on two ranks of one host, after alignment by ends: up to 16 µs apart (the unskewed
# recordings: 1.2 µs on h200x2-small, 15.9 µs on h200x2_ddp); a GPU engineer reads such timelines at µs.
RANK_TOLERANCE_NS = 25_000


def run(inputs: list[Path], **opts: object) -> pipeline.Result:
    res = pipeline.analyse(inputs, pipeline.Options(write_html=False, write_trace=False, **opts))  # type: ignore[arg-type]
    contract.check_store(res.con)  # one clock record per source, the same in `sources`
    return res


def clock(result: pipeline.Result, name: str) -> dict:
    return next(s for s in result.verdict["clock"]["sources"] if Path(s["path"]).name == name)


def nvml_refresh_ns(path: Path) -> int:
    """NVML's utilization refresh period, from the raw log alone: the shortest spacing between value changes of
    gpu_util (the log polls every 10 ms; the value changes only when NVML recomputes it)."""
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:] if ln]
    t = np.array([int(r[0]) for r in rows])
    u = np.array([r[1] for r in rows])
    changes = t[1:][u[1:] != u[:-1]]
    return int(np.round(np.min(np.diff(changes)) / 1e7) * 1e7)  # to the 10 ms polling step


def shifted_nvml(src: Path, dst: Path, shift_ns: int) -> Path:
    lines = src.read_text().splitlines()
    out = [lines[0]] + [f"{int(ln.split(',', 1)[0]) + shift_ns},{ln.split(',', 1)[1]}" for ln in lines[1:] if ln]
    dst.write_text("\n".join(out) + "\n")
    return dst


def shifted_query(src: Path, dst: Path, shift_s: float) -> Path:
    """nvidia-smi --query-gpu, its local-time column rewritten shift_s later."""
    lines = src.read_text().splitlines()
    out = [lines[0]]
    for ln in lines[1:]:
        ts, rest = ln.split(", ", 1)
        t = dt.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f") + dt.timedelta(seconds=shift_s)
        out.append(t.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] + ", " + rest)
    dst.write_text("\n".join(out) + "\n")
    return dst


def assert_honest(s: dict, err_ns: float, bound_ns: float) -> None:
    """The reported uncertainty covers the true error, and says something (no more than bound_ns)."""
    assert abs(err_ns) <= s["uncertainty_ns"] <= bound_ns, (err_ns, s["uncertainty_ns"], bound_ns)


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


# -------------------------------------------------------------------------------- the clock table itself


def _trace_with_memory(tmp_path: Path) -> Path:
    n = 4096
    mem = {
        "ph": "i",
        "s": "t",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": 100,
        "tid": 1,
        "ts": 40.0,
        "args": {
            "Device Type": 1,
            "Device Id": 0,
            "Bytes": 1 << 20,
            "Total Allocated": 1 << 20,
            "Total Reserved": 2 << 20,
            "Addr": 4096,
        },
    }
    ev = [
        cpu_op("aten::mm", 10.0, 20.0, ext=5, dims=[[n, n], [n, n]], types=["c10::BFloat16"] * 2),
        launch(12.0, ext=5, corr=50),
        kernel("nvjet_sm90_tst_gemm", 100.0, 200.0, ext=5, corr=50),
        mem,
    ]
    return write_trace(tmp_path / "mem.pt.trace.json", ev)


def test_one_clock_record_per_source_applied_once(tmp_path):
    # SPEC §3: utc_ns = baseTimeNanoseconds + round(ts · 1000); the clock adds its offset on top, once, to every
    # time column of the source's rows — memory_events.ts_ns too.
    trace = _trace_with_memory(tmp_path)
    res = run([trace], offsets=[f"{trace.name}=+2.5ms"])
    rows = res.con.execute("SELECT source_id, offset_ns, method, uncertainty_ns FROM clock").fetchall()
    assert rows == [(0, 2_500_000, "forced", 0)]
    got = res.con.execute("SELECT start_ns - round(raw_start * 1000)::BIGINT FROM kernels").fetchall()
    assert got == [(BASE + 2_500_000,)]
    ops = res.con.execute("SELECT min(start_ns) FROM ops").fetchone()[0]
    assert ops == BASE + 10_000 + 2_500_000  # aten::mm at ts 10 µs
    assert res.con.execute("SELECT ts_ns FROM memory_events").fetchall() == [(BASE + 40_000 + 2_500_000,)]
    with pytest.raises(RuntimeError, match="ran twice"):
        align.align(res.con)  # the offsets are in the times already: a second pass would add them again


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


# ------------------------------------------------------------------------------------------ native anchors


def test_native_anchor_matches_the_host_clock():
    # run_info.json: each burst of back-to-back GEMMs between two time.time_ns() readings on the traced host. On
    # the trace's own anchor (offset 0), every GEMM of burst k lies inside that window, and their count is its mm.
    info = json.loads(sample_file(f"{ALIGN}/run_info.json").read_text())
    res = run([sample_file(f"{ALIGN}/kineto_bursts.pt.trace.json.gz")])
    assert clock(res, "kineto_bursts.pt.trace.json.gz")["offset_ns"] == 0
    inside = 0
    for b in info["bursts"]:
        (n,) = res.con.execute(
            "SELECT count(*) FROM kernels WHERE kind = 'compute' AND start_ns >= ? AND end_ns <= ?",
            [b["wall_start_ns"], b["wall_end_ns"]],
        ).fetchone()
        assert n == b["mm"], b
        inside += n
    assert res.con.execute("SELECT count(*) FROM kernels WHERE kind = 'compute'").fetchone() == (inside,)
    # kineto_run_info.json: each phase's record_function range inside its host-clock window
    info = json.loads(sample_file("h200_single/kineto_run_info.json").read_text())
    res = run([sample_file("h200_single/kineto_single.pt.trace.json.gz")])
    for ph in info["phase_windows"]:
        s, e = res.con.execute(
            "SELECT min(start_ns), max(end_ns) FROM ranges WHERE name = ? AND NOT on_gpu", [ph["phase"]]
        ).fetchone()
        assert ph["wall_start_ns"] <= s and e <= ph["wall_end_ns"], ph


# ---------------------------------------------------------------------------------------------- ranks


def _skewed_copy(src: Path, dst: Path, skew_us: float) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + skew_us
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


RANK_PAIRS = {
    "h200x2-small": lambda: (
        corpus_file("h200x2-small/kineto/rank0.pt.trace.json.gz"),
        corpus_file("h200x2-small/kineto/rank1.pt.trace.json.gz"),
    ),
    "h200x2_ddp": lambda: (
        sample_file("h200x2_ddp/kineto/rank0.pt.trace.json.gz"),
        sample_file("h200x2_ddp/kineto/rank1.pt.trace.json.gz"),
    ),
}


@pytest.mark.parametrize(("pair", "skew_us"), [("h200x2-small", 850.0), ("h200x2_ddp", -2300.0)])
def test_rank_skew_recovered_from_collective_ends(tmp_path, pair, skew_us):
    # Both ranks on one host (true offset 0); rank 1 is moved by skew_us: it must come back by exactly −skew.
    r0, r1 = RANK_PAIRS[pair]()
    moved = _skewed_copy(r1, tmp_path / "rank1.pt.trace.json.gz", skew_us)
    res = run([r0, moved])
    src = clock(res, "rank1.pt.trace.json.gz")
    err = src["offset_ns"] - (-skew_us * 1000)
    assert src["method"] == "collectives" and abs(err) <= RANK_TOLERANCE_NS, err
    assert_honest(src, err, 2 * align.MIN_RANK_SHIFT_NS)
    assert clock(res, "rank0.pt.trace.json.gz")["offset_ns"] == 0  # the reference stays put
    ref = res.con.execute("SELECT reference_source_id FROM clock WHERE source_id = 1").fetchone()
    assert ref == (0,)
    # after alignment the ends of each all-reduce coincide as closely as on the unskewed recording
    ends = [
        d
        for (d,) in res.con.execute("""
        SELECT a.end_ns - b.end_ns FROM collectives a JOIN collectives b
          ON a.collective = b.collective AND a.seq = b.seq AND a.rank = 0 AND b.rank = 1""").fetchall()
    ]
    assert ends and abs(float(np.median(ends))) <= RANK_TOLERANCE_NS


@pytest.mark.parametrize("pair", list(RANK_PAIRS))
def test_ranks_on_one_host_keep_their_clock(pair):
    # One host, one clock: the ends' own spread is no clock error, and nothing is shifted.
    res = run(list(RANK_PAIRS[pair]()))
    for name in ("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"):
        assert (clock(res, name)["offset_ns"], clock(res, name)["method"]) == (0, "native")


# ------------------------------------------------------------------------------------- counter GPUs


def test_counter_gpu_matching_by_uuid_index_and_unmatched(tmp_path):
    # One-GPU trace (device 0) and a query log of a 2-GPU machine: GPU 0 matches by index, GPU 1 is reported.
    res = run([corpus_file("h200-single-kineto/kineto_single.json.gz"), corpus_file("h200x2-small/smi/query_gpu.csv")], tz="UTC")
    got = res.con.execute("SELECT DISTINCT gpu_index, rank, device FROM counters ORDER BY 1").fetchall()
    assert got == [(0, 0, 0), (1, None, None)]
    assert any("GPU 1" in n and "query_gpu.csv" in n and "matches no GPU" in n for n in res.verdict["notes"])
    con = store.connect()
    con.execute(
        "INSERT INTO kernels (kernel_id, source_id, rank, device, start_ns, end_ns, name, kind) VALUES "
        "(1, 0, 0, 0, 0, 10, 'k', 'compute'), (2, 1, 1, 0, 0, 10, 'k', 'compute')"
    )
    con.execute(
        "INSERT INTO sources (source_id, path, format, rank, rank_method) VALUES "
        "(0, 'a', 'nsys-sqlite', 0, 'distributedInfo'), (1, 'b', 'nsys-sqlite', 1, 'distributedInfo'), "
        "(2, 'q.csv', 'nvidia-smi-query', NULL, 'counters')"
    )
    # both ranks use device 0 (two hosts): the index is ambiguous, the UUID (or bus id) decides
    con.execute(
        "INSERT INTO devices (source_id, rank, device, gpu_uuid, bus_id) VALUES "
        "(0, 0, 0, 'GPU-aaaa', '0000:00:06.0'), (1, 1, 0, 'GPU-bbbb', '00000000:00:07.0')"
    )
    con.execute("INSERT INTO devices (source_id, device, gpu_uuid, bus_id) VALUES (2, 5, NULL, '00000000:00:07.0')")
    con.execute(
        "INSERT INTO counters (source_id, gpu_index, gpu_uuid, metric, start_ns, end_ns, value) VALUES "
        "(2, 0, 'gpu-aaaa', 'gpu_util', 0, 1, 0.5), (2, 5, NULL, 'gpu_util', 0, 1, 0.5), "
        "(2, 0, NULL, 'gpu_util', 0, 1, 0.5)"
    )
    notes = align.match_counter_gpus(con)
    got = con.execute("SELECT gpu_index, gpu_uuid, rank, device FROM counters ORDER BY 1, 2").fetchall()
    assert got == [(0, "gpu-aaaa", 0, 0), (0, None, None, None), (5, None, 1, 0)]
    assert any("several trace GPUs fit it equally" in n for n in notes)


def test_counter_gpu_of_another_model_is_not_matched_by_index(tmp_path):
    # The 2-rank H200 run (Kineto: GPU names, no UUIDs) with its own nvidia-smi log: matched by index. The same log
    # with its GPUs named "Tesla T4" (as a log of another machine would be) names GPUs 0 and 1 too, but an index says
    # nothing of which machine: a T4 is not an H200, and its samples stay unmatched, said in the notes.
    kin = sorted((corpus_file("h200x2-small/kineto")).glob("rank*.pt.trace.json.gz"))
    log = corpus_file("h200x2-small/smi/query_gpu.csv")
    ok = run([*kin, log], tz="UTC")
    assert ok.con.execute("SELECT count(DISTINCT rank) FROM counters WHERE rank IS NOT NULL").fetchone() == (2,)
    t4 = tmp_path / "query_gpu.csv"
    t4.write_text(log.read_text().replace("NVIDIA H200", "Tesla T4"))
    res = run([*kin, t4], tz="UTC")
    assert res.con.execute("SELECT count(*) FROM counters WHERE rank IS NOT NULL").fetchone() == (0,)
    (note,) = [n for n in res.notes if n.startswith("query_gpu.csv: GPU 0")]
    assert "Tesla T4: the trace's GPU 0 is NVIDIA H200; a log of another machine?" in note and "GPU 1 (" in note


def test_different_models_needs_two_known_different_names():
    table = peaks.load_table(None)
    assert peaks.different_models("Tesla T4", "NVIDIA H200", table)
    assert peaks.different_models("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3", table)  # PCIe and SXM: two products
    assert not peaks.different_models("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", table)
    assert not peaks.different_models("NVIDIA H100", "NVIDIA H100 PCIe", table)  # one name the other's start
    assert not peaks.different_models(None, "NVIDIA H200", table) and not peaks.different_models("Tesla T4", "Some GPU", table)


# ------------------------------------------------------------------------------- counter clock shifts


def test_own_clock_kept_when_it_agrees():
    res = run([sample_file(ALIGN)])
    for name in ("nvml_samples.csv", "nvidia_smi_query.csv", "nvidia_smi_dmon.txt"):
        assert clock(res, name)["offset_ns"] == 0, name  # true offset 0: nothing applied
    # its uncertainty is one NVML refresh, however often the log polled (every 10 ms here)
    refresh = nvml_refresh_ns(sample_file(f"{ALIGN}/nvml_samples.csv"))
    assert refresh == 200_000_000
    assert clock(res, "nvml_samples.csv")["uncertainty_ns"] == pytest.approx(refresh, rel=0.05)


def _nvml_37(tmp: Path) -> tuple[Path, dict[str, object], int]:
    return shifted_nvml(sample_file(f"{ALIGN}/nvml_samples.csv"), tmp / "nvml_samples.csv", 37 * 10**9), {}, -37 * 10**9


def _query_37(tmp: Path) -> tuple[Path, dict[str, object], int]:
    return (
        shifted_query(sample_file(f"{ALIGN}/nvidia_smi_query.csv"), tmp / "nvidia_smi_query.csv", 37),
        {"tz": "UTC"},
        -37 * 10**9,
    )


@pytest.mark.parametrize("make", [_nvml_37, _query_37], ids=["nvml", "query"])
def test_plus_37_s_recovered(tmp_path, make):
    # The log moved 37 s late by us: it must come back by −37 s, to within one NVML refresh.
    log, opts, truth = make(tmp_path)
    refresh = nvml_refresh_ns(sample_file(f"{ALIGN}/nvml_samples.csv"))
    res = run([sample_file(f"{ALIGN}/kineto_bursts.pt.trace.json.gz"), log], **opts)
    s = clock(res, log.name)
    err = s["offset_ns"] - truth
    assert s["method"] == "correlation" and abs(err) <= refresh, err
    assert_honest(s, err, 2 * refresh)
    assert (
        res.con.execute("SELECT min(end_ns) FROM counters").fetchone()[0]
        < res.con.execute("SELECT max(end_ns) FROM kernels").fetchone()[0]
    )  # the samples now sit on the trace


@pytest.mark.parametrize(("log", "tolerance_ns"), [("nvidia_smi_query.csv", None), ("nvidia_smi_dmon.txt", DMON_RESOLUTION_NS)])
def test_wrong_time_zone_recovered(log, tolerance_ns):
    # The UTC logs read as if written at UTC−3 land 3 h late: found as a whole-quarter-hour jump, then refined to
    # within one NVML refresh (query: 100 ms samples) or one dmon time stamp (whole seconds).
    tol = tolerance_ns or nvml_refresh_ns(sample_file(f"{ALIGN}/nvml_samples.csv"))
    res = run([sample_file(f"{ALIGN}/kineto_bursts.pt.trace.json.gz"), sample_file(f"{ALIGN}/{log}")], tz="Etc/GMT+3")
    s = clock(res, log)
    err = s["offset_ns"] - (-3 * 3600 * 10**9)
    assert s["time_zone"] == "Etc/GMT+3" and abs(err) <= tol, err
    assert_honest(s, err, 2 * tol)
    assert any("like a log read in the wrong time zone" in n and log in n for n in res.verdict["notes"])


def test_wrong_zone_on_a_short_trace_uses_the_exact_jump():
    # The corpus trace is 2 s long: too short for NVML's 200 ms refresh to place a log by correlation, but the
    # only quarter-hour that puts the log on the trace is −3 h, taken exactly.
    res = run(
        [corpus_file("h200-single-kineto/kineto_single.json.gz"), corpus_file("h200-single-kineto/nvidia_smi_query.csv")],
        tz="Etc/GMT+3",
    )
    s = clock(res, "nvidia_smi_query.csv")
    assert s["offset_ns"] == -3 * 3600 * 10**9 and s["method"] in ("zone", "correlation")


def test_short_trace_is_not_shifted_on_weak_evidence(tmp_path):
    # On the 2-s corpus trace several shifts fit the NVML log about equally: a +37 s error cannot be recovered
    # there, and the log must not be moved to a wrong place either — it is reported as ambiguous.
    moved = shifted_nvml(corpus_file("h200-single-kineto/nvml_samples.csv"), tmp_path / "nvml_samples.csv", 37 * 10**9)
    res = run([corpus_file("h200-single-kineto/kineto_single.json.gz"), moved])
    s = clock(res, "nvml_samples.csv")
    assert s["offset_ns"] == 0 and s["method"] == "native"
    assert any("ambiguous" in n and "nvml_samples.csv" in n for n in res.verdict["notes"])
    res0 = run([corpus_file("h200-single-kineto/kineto_single.json.gz"), corpus_file("h200-single-kineto/nvml_samples.csv")])
    assert clock(res0, "nvml_samples.csv")["offset_ns"] == 0


def test_synthesized_dcgm_log_placed_by_correlation(tmp_path):
    # A dcgmi dmon log without timestamps, written from the real NVML samples every 100 ms; its file mtime is
    # 37 s after its last line (copied later), so the synthesized clock is 37 s late.
    nvml = sample_file(f"{ALIGN}/nvml_samples.csv")
    rows = [ln.split(",") for ln in nvml.read_text().splitlines()[1:]]
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
    res = run([sample_file(f"{ALIGN}/kineto_bursts.pt.trace.json.gz"), p], dcgm_period_s=0.1)
    s = clock(res, "dcgmi.txt")
    assert s["anchor"] == "synthesized" and s["method"] == "correlation"
    # the truth: the k-th line was sampled at picked[k]; measure where the aligned samples ended up
    ends = [e for (e,) in res.con.execute("SELECT end_ns FROM counters WHERE metric = 'gpu_util' ORDER BY end_ns").fetchall()]
    err = sorted(e - int(r[0]) for e, r in zip(ends, picked, strict=True))[len(ends) // 2]
    refresh = nvml_refresh_ns(nvml)
    assert abs(err) <= refresh, err
    assert_honest(s, err, 2 * refresh)


def test_counter_logs_alone_need_a_trace():
    with pytest.raises(BadInput, match="counter logs need a trace to align to"):
        run([corpus_file("h200-single-kineto/nvml_samples.csv"), corpus_file("h200-single-kineto/nvidia_smi_dmon.txt")])


def test_cli_offset_tz_period(tmp_path):
    trace = sample_file(f"{ALIGN}/kineto_bursts.pt.trace.json.gz")
    log = sample_file(f"{ALIGN}/nvidia_smi_dmon.txt")
    out = tmp_path / "o"
    v = contract.check_cli(
        trace,
        log,
        "--out",
        out,
        "--json",
        "--tz",
        "UTC",
        "--offset",
        "nvidia_smi_dmon.txt=+250ms",
        "--dcgm-period",
        "0.5",
        "--no-html",
        "--no-trace",
        inputs=[trace, log],
        out=out,
        files=contract.OUTPUT_FILES_NO_HTML_TRACE,
    )
    assert isinstance(v, dict)
    s = next(x for x in v["clock"]["sources"] if x["path"].endswith("nvidia_smi_dmon.txt"))
    assert (s["offset_ns"], s["method"], s["time_zone"]) == (250_000_000, "forced", "UTC")
    line = contract.check_cli(log, "--out", tmp_path / "x", inputs=[log], out=tmp_path / "x", expect="bad")
    assert "counter logs need a trace to align to" in str(line)
    line = contract.check_cli(
        trace,
        log,
        "--tz",
        "Nowhere/X",
        "--out",
        tmp_path / "y",
        inputs=[trace, log],
        out=tmp_path / "y",
        expect="bad",
        names_input=False,
    )
    assert "unknown time zone" in str(line)


def test_every_source_of_a_run_has_one_clock_record():
    res = run([corpus_file("h200-single-kineto")])  # run() holds the store to it (contract.check_store)
    assert res.con.execute("SELECT count(*) FROM clock").fetchone() == (len(res.verdict["clock"]["sources"]),)
    assert parsers.AUXILIARY >= {s["format"] for s in res.verdict["clock"]["sources"] if s["format"] != "kineto"}


def _rank_trace(path: Path, rank: int, base: int) -> Path:
    ev = [
        cpu_op("aten::mm", 1.0, 5.0, ext=1, dims=[[64, 64], [64, 64]], types=["float"] * 2),
        launch(2.0, ext=1, corr=11),
        kernel("gemm_kernel", 10.0, 100.0, ext=1, corr=11),
    ]
    return write_trace(path, ev, rank=rank, base=base)


def test_traces_recorded_days_apart_are_not_one_run(tmp_path):
    # Construction: two one-kernel traces on calendar clocks, the second starting three days after the first (a real
    # case: TraceLens's H100 and MI300X recordings of one model, 9.4 days apart, given together). Ranks of one run
    # are profiled at the same time: refused, naming both, with the way out.
    a = _rank_trace(tmp_path / "a.json", 0, BASE)
    b = _rank_trace(tmp_path / "b.json", 1, BASE + 3 * 86_400 * 10**9)
    with pytest.raises(BadInput, match=r"a\.json and b\.json were not recorded together: the second starts 3\.0 days"):
        pipeline.analyse([a, b], pipeline.Options(write_html=False, write_trace=False))


def test_ranks_minutes_apart_are_one_run(tmp_path):
    # Two ranks whose profiles start ten minutes apart (a profiler schedule that started late on one rank, or a
    # clock ten minutes off): still one run, analysed as two ranks.
    a = _rank_trace(tmp_path / "a.json", 0, BASE)
    b = _rank_trace(tmp_path / "b.json", 1, BASE + 600 * 10**9)
    res = pipeline.analyse([a, b], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert res.verdict["run"]["ranks"] == [0, 1]
        # ... said: their windows do not overlap (b starts 600 s after a, whose span is ~110 µs: 10.0 min after it ends)
        said = [n for n in res.verdict["notes"] if "do not overlap in time" in n]
        assert len(said) == 1 and "a.json and b.json" in said[0] and "starts 10.0 min after" in said[0]
    finally:
        res.close()


def test_ranks_recorded_side_by_side_get_no_overlap_note(tmp_path):
    # Two ranks whose spans overlap (starting 50 µs apart): nothing to say.
    a = _rank_trace(tmp_path / "a.json", 0, BASE)
    b = _rank_trace(tmp_path / "b.json", 1, BASE + 50_000)
    res = pipeline.analyse([a, b], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert res.verdict["run"]["ranks"] == [0, 1]
        assert not [n for n in res.verdict["notes"] if "do not overlap" in n]
    finally:
        res.close()


def test_two_traces_that_both_declare_one_rank_are_refused(tmp_path):
    # Construction: two traces whose distributedInfo both say rank 1 (a real case: HTA's trace_compare base and
    # test traces, a recording and an edited copy of it): two recordings of that rank, not two ranks — refused
    # with the ways out, as a folder holding them is.
    a = _rank_trace(tmp_path / "base.json", 1, BASE)
    b = _rank_trace(tmp_path / "test.json", 1, BASE + 10**9)
    with pytest.raises(BadInput, match=r"base\.json and test\.json both say they are rank 1 \(distributedInfo\)"):
        pipeline.analyse([a, b], pipeline.Options(write_html=False, write_trace=False))
