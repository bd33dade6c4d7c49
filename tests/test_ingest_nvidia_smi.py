"""Device-counter parsers on real logs (NVML CSV, nvidia-smi dmon and --query-gpu): values in the vocabulary's
units, intervals [t − period, t], time sources, time zones, GPU identity, and malformed lines counted."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import pytest

from plasmient_report import parsers, store
from plasmient_report.errors import BadInput
from plasmient_report.parsers import Detected, ParseOptions

from .conftest import corpus_file, sample_file

UTC_1812_43 = int(dt.datetime(2026, 11, 30, 18, 12, 43, tzinfo=dt.timezone.utc).timestamp()) * 10**9


def ingest(path: Path, **opts: object) -> tuple[object, parsers.SourceInfo]:
    con = store.connect()
    fmt = parsers.detect(path)
    info = parsers.ingest_one(Detected(path, fmt), con, 0, ParseOptions(**opts))  # type: ignore[arg-type]
    return con, info


def metric(con, name: str) -> list[tuple]:
    return con.execute(
        "SELECT gpu_index, start_ns, end_ns, value FROM counters WHERE metric = ? ORDER BY gpu_index, end_ns", [name]
    ).fetchall()


def test_detects_every_counter_format():
    cases = {
        "h200-single-kineto/nvml_samples.csv": "nvml-csv",
        "h200-single-kineto/nvidia_smi_dmon.txt": "nvidia-smi-dmon",
        "h200-single-kineto/nvidia_smi_query.csv": "nvidia-smi-query",
        "h200-single-kineto/ncu_raw.csv": "ncu-csv",  # starts with ==WARNING== lines
        "h200x2-small/smi/dmon_default.txt": "nvidia-smi-dmon",
        "h200x2-small/ncu/details_metrics.csv": "ncu-csv",
    }
    for rel, fmt in cases.items():
        assert parsers.detect(corpus_file(rel)) == fmt, rel


def test_nvml_csv_corpus():
    # wall_ns,gpu_util_pct,mem_util_pct,sm_clock_mhz,mem_clock_mhz,power_mw,mem_used_bytes — NVML every ~10 ms.
    con, info = ingest(corpus_file("h200-single-kineto/nvml_samples.csv"))
    assert info.format == "nvml-csv" and info.clock_anchor == "native"
    util = metric(con, "gpu_util")
    assert len(util) == 1165 and max(v for *_, v in util) == 1.0  # 100 % → 1.0
    assert util[0][2] == 1796062359989842094  # end = wall_ns as written
    assert 9e6 < util[0][2] - util[0][1] < 11e6  # the interval is one sampling period
    power = metric(con, "power_w")
    assert power[0][3] == pytest.approx(79.285)  # 79285 mW
    assert metric(con, "fb_used_bytes")[0][3] == 648347648
    # NVML refreshes utilization every ~200 ms: the effective period, not the 10 ms sampling, is what aligns.
    assert 150e6 < info.sample_period_ns < 260e6
    assert con.execute("SELECT DISTINCT time_source FROM counters").fetchall() == [("native",)]


def test_nvml_csv_own_sample():
    # sample_traces/h200_single: wall_ns,gpu_util,mem_util,sm_clock_mhz,power_w (utilisation in percent).
    con, info = ingest(sample_file("h200_single/nvml_samples.csv"))
    util = [v for *_, v in metric(con, "gpu_util")]
    assert max(util) == pytest.approx(0.14) and min(util) == 0.0
    assert metric(con, "power_w")[0][3] == pytest.approx(172.04)


def test_dmon_with_date_and_time_is_local_time():
    path = corpus_file("h200-single-kineto/nvidia_smi_dmon.txt")
    con, info = ingest(path, tz="UTC")
    util = metric(con, "gpu_util")
    assert len(util) == 15
    hit = [u for u in util if u[3] > 0]
    assert hit == [(0, UTC_1812_43 - 10**9, UTC_1812_43, pytest.approx(0.10))]  # `sm` 10 % at 18:12:43
    assert info.time_zone == "UTC" and info.clock_anchor == "anchored"
    assert any("read as UTC (given with --tz)" in n for n in info.notes)
    assert metric(con, "fb_used_bytes")[-1][3] == 17545 * 2**20
    # The same log read as Berlin time (UTC+1 in November) lies one hour earlier.
    con2, info2 = ingest(path, tz="Europe/Berlin")
    assert metric(con2, "gpu_util")[3][2] == UTC_1812_43 - 3600 * 10**9


def test_dmon_default_zone_is_named():
    con, info = ingest(corpus_file("h200-single-kineto/nvidia_smi_dmon.txt"))
    assert info.time_zone and any("this machine's zone" in n for n in info.notes)


def test_dmon_two_gpus_all_groups():
    con, info = ingest(corpus_file("h200x2-small/smi/dmon_o_DT.txt"), tz="UTC")
    assert con.execute("SELECT DISTINCT gpu_index FROM counters ORDER BY 1").fetchall() == [(0,), (1,)]
    names = {m for (m,) in con.execute("SELECT DISTINCT metric FROM counters").fetchall()}
    assert {"pcie_rx_bytes_s", "power_violation", "thermal_violation", "ecc_sbe_errors", "mem_temp_c"} <= names
    assert any("ccpm" in n for n in info.notes)  # columns not read are said


def test_dmon_without_time_is_synthesized_from_mtime(tmp_path):
    src = corpus_file("h200x2-small/smi/dmon_default.txt")
    p = tmp_path / "dmon_default.txt"
    p.write_bytes(src.read_bytes())
    end = 1_796_062_842 * 10**9
    os.utime(p, ns=(end, end))
    con, info = ingest(p, dcgm_period_s=0.5)
    assert info.clock_anchor == "synthesized" and info.time_zone is None
    rows = metric(con, "power_w")
    assert len(rows) == 10  # 5 iterations × 2 GPUs
    assert [r[2] for r in rows if r[0] == 0] == [end - k * 500_000_000 for k in (4, 3, 2, 1, 0)]


def test_dmon_time_only_takes_the_date_from_mtime(tmp_path):
    # `-o T`: drop the Date column of a real -o DT log; the file's mtime supplies the day.
    lines = corpus_file("h200-single-kineto/nvidia_smi_dmon.txt").read_text().splitlines()
    out = ["#" + ln.split(None, 1)[1] if ln.startswith("#") else " " + ln.split(None, 1)[1] for ln in lines]
    p = tmp_path / "dmon_T.txt"
    p.write_text("\n".join(out) + "\n")
    mtime = UTC_1812_43 + 60 * 10**9
    os.utime(p, ns=(mtime, mtime))
    con, info = ingest(p, tz="UTC")
    assert info.format_version == "-o T"
    assert [r[2] for r in metric(con, "gpu_util") if r[3] > 0] == [UTC_1812_43]


def test_dmon_truncated_line_is_counted():
    # The logger was killed mid-line: ' 20261130    19:00:55       0' (line 7).
    con, info = ingest(sample_file("h200_single/nsys_nvidia_smi_dmon.txt"))
    assert "1 malformed lines skipped (first at line 7)" in info.notes


def test_query_csv_units_identity_and_devices():
    con, info = ingest(corpus_file("h200x2-small/smi/query_gpu.csv"), tz="UTC")
    assert info.format == "nvidia-smi-query"
    devs = con.execute("SELECT device, gpu_uuid, bus_id, name, memory_bytes FROM devices ORDER BY device").fetchall()
    assert devs[0] == (0, "GPU-f46f87d3-8051-1a7e-6457-1c5b17b0ee15", "00000000:00:06.0", "NVIDIA H200", 143771 * 2**20)
    assert devs[1][1] == "GPU-bda44c91-b877-1310-b6d3-feee3ff1b19a"
    first = con.execute("SELECT end_ns, value FROM counters WHERE metric = 'power_w' ORDER BY end_ns LIMIT 1").fetchone()
    # '2026/11/30 18:19:53.121, 0, …, 78.10 W'
    assert first == (
        int(dt.datetime(2026, 11, 30, 18, 19, 53, 121000, tzinfo=dt.timezone.utc).timestamp() * 1e6) * 1000,
        pytest.approx(78.10),
    )
    assert 480e6 < info.sample_period_ns < 520e6  # -lms 500


def test_query_csv_without_header_guesses_from_units(tmp_path):
    body = corpus_file("h200x2-small/smi/query_gpu.csv").read_text().splitlines()[1:]
    p = tmp_path / "noheader.csv"
    p.write_text("\n".join(body) + "\n")
    assert parsers.detect(p) == "nvidia-smi-query"
    con, info = ingest(p, tz="UTC")
    assert any("no header" in n for n in info.notes)
    assert con.execute("SELECT count(*) FROM counters WHERE metric = 'gpu_util'").fetchone()[0] == 40
    # Without header and without units the columns cannot be told apart: refused, in one line.
    p2 = tmp_path / "noheader_nounits.csv"
    p2.write_text("\n".join(", ".join(x.split()[0] if i > 0 else x for i, x in enumerate(ln.split(", "))) for ln in body) + "\n")
    with pytest.raises(BadInput, match="without a header and without units"):
        ingest(p2)


def test_query_csv_repeated_header_and_na(tmp_path):
    text = corpus_file("h200-single-kineto/nvidia_smi_query.csv").read_text().splitlines()
    rows = text[:5] + [text[0]] + [re.sub(r"[0-9.]+ W", "[N/A]", text[5])] + text[6:10]
    p = tmp_path / "appended.csv"
    p.write_text("\n".join(rows) + "\n")
    con, info = ingest(p, tz="UTC")
    assert con.execute("SELECT count(*) FROM counters WHERE metric = 'gpu_util'").fetchone()[0] == 9
    assert con.execute("SELECT count(*) FROM counters WHERE metric = 'power_w'").fetchone()[0] == 8


def test_unknown_zone_is_bad_input():
    with pytest.raises(BadInput, match="unknown time zone"):
        ingest(corpus_file("h200-single-kineto/nvidia_smi_query.csv"), tz="Mars/Olympus")


def _drop_columns(text: str, drop: set[str]) -> str:
    """The CSV without the columns named in `drop` (header names without their units)."""
    lines = text.splitlines()
    header = [h.strip() for h in lines[0].split(",")]
    keep = [i for i, h in enumerate(header) if re.sub(r"\s*\[.*\]$", "", h) not in drop]
    return "\n".join(", ".join(ln.split(",")[i].strip() for i in keep) for ln in lines) + "\n"


def test_query_csv_without_identity_columns_tells_gpus_apart_by_order(tmp_path):
    # The 2-GPU H200 log (-lms 500) with its index, uuid and pci.bus_id columns removed: nvidia-smi prints each
    # sample's rows GPU after GPU, here stamped 1-22 ms apart, the samples ~500 ms apart. Truth: the original
    # file's index column, row by row (each row's time is its own in this file).
    src = corpus_file("h200x2-small/smi/query_gpu.csv").read_text()
    truth = {}
    for ln in src.splitlines()[1:]:
        cells = [c.strip() for c in ln.split(",")]
        t = dt.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
        truth[int(t.timestamp() * 1e6) * 1000] = int(cells[1])
    p = tmp_path / "no_index.csv"
    p.write_text(_drop_columns(src, {"index", "uuid", "pci.bus_id"}))
    con, info = ingest(p, tz="UTC")
    assert any("2 rows per sample, taken as GPUs 0–1" in n for n in info.notes)
    got = {t: g for g, _, t, _ in metric(con, "power_w")}
    assert len(got) == len(truth) == 40 and got == truth
    assert con.execute("SELECT count(DISTINCT device) FROM devices").fetchone()[0] == 2


def test_query_csv_of_one_gpu_without_index_stays_one_gpu(tmp_path):
    # One H200 at -lms 100 to 200: no cut of its rows into runs looks like samples of several GPUs.
    p = tmp_path / "one.csv"
    p.write_text(_drop_columns(corpus_file("h200-single-kineto/nvidia_smi_query.csv").read_text(), {"index"}))
    con, info = ingest(p, tz="UTC")
    assert "no index/uuid/pci.bus_id column: samples taken to be of GPU 0" in info.notes
    assert {g for g, *_ in metric(con, "gpu_util")} == {0}


def test_query_csv_header_in_the_order_asked_and_a_cut_last_row(tmp_path):
    # `--query-gpu=name,pstate,timestamp,…`: the timestamp need not come first. The writer was killed mid-row: the
    # last row ends after a comma (its empty field is missing, the rest of it read).
    src = corpus_file("h200x2-small/smi/query_gpu.csv").read_text().splitlines()

    def moved(ln: str) -> str:
        c = [x.strip() for x in ln.split(",")]
        return ", ".join([c[3], c[1], c[0], *c[4:]])

    p = tmp_path / "reordered.csv"
    p.write_text("\n".join(moved(ln) for ln in src[:-1]) + "\n" + moved(src[-1]).rsplit(",", 1)[0] + ",")
    assert parsers.detect(p) == "nvidia-smi-query"
    con, info = ingest(p, tz="UTC")
    assert len(metric(con, "gpu_util")) == 40
    assert len(metric(con, "temp_c")) == 39  # (the cut row's temperature.gpu is empty)
    first = con.execute("SELECT gpu_index, end_ns, value FROM counters WHERE metric = 'power_w' ORDER BY end_ns LIMIT 1")
    t = dt.datetime(2026, 11, 30, 18, 19, 53, 121000, tzinfo=dt.timezone.utc)  # '2026/11/30 18:19:53.121, 0, …, 78.10 W'
    assert first.fetchone() == (0, int(t.timestamp() * 1e6) * 1000, pytest.approx(78.10))


def test_a_csv_with_a_timestamp_but_no_query_field_is_not_claimed(tmp_path):
    # A DCGM recorder's own CSV (a public MIG profiling repository's header): not nvidia-smi's, refused as unknown.
    p = tmp_path / "dcgm.csv"
    p.write_text("EntityId,GRACT,FBUSD,TimeStamp\n0,0.000,0,1661698242\n0,0.000,3,1661698243\n")
    assert parsers.detect(p) is None
