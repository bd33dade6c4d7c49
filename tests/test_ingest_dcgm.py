"""dcgmi dmon and dcgm-exporter parsers. No real dcgmi / exporter log exists in the corpus, so these files are
hand-written in tests/data/ following the documented layouts (../shared/corpus/FORMATS.md §C.1, §C.2):
DCGM 3.x and 2.x headers, repeated headers, N/A, GPU-I entities, field ids, timestamp prefixes, Ctrl-C trailer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plasmient_report import parsers, store
from plasmient_report.parsers import Detected, ParseOptions

DATA = Path(__file__).parent / "data"


def ingest(name: str | Path, **opts: object):
    path = DATA / name if isinstance(name, str) else name
    con = store.connect()
    info = parsers.ingest_one(Detected(path, parsers.detect(path)), con, 0, ParseOptions(**opts))  # type: ignore[arg-type]
    return con, info


def series(con, metric: str, entity: str = "GPU 0") -> list[tuple[int, float]]:
    return con.execute(
        "SELECT end_ns, value FROM counters WHERE metric = ? AND entity = ? ORDER BY end_ns", [metric, entity]
    ).fetchall()


def test_dcgm3_layout_without_timestamps(tmp_path):
    p = tmp_path / "dmon.txt"
    p.write_bytes((DATA / "dcgmi_dmon_3x.txt").read_bytes())
    end = 1_796_062_371 * 10**9
    os.utime(p, ns=(end, end))
    con, info = ingest(p, dcgm_period_s=0.1)
    assert info.format == "dcgmi-dmon" and info.format_version == "DCGM 3.x layout"
    assert info.clock_anchor == "synthesized"
    util = series(con, "gpu_util")
    # GPUTL is percent; three iterations 100 ms apart ending at the file's mtime.
    assert util == [(end - 200_000_000, 0.97), (end - 100_000_000, 0.96), (end, 0.12)]
    assert series(con, "sm_active")[0][1] == pytest.approx(0.913)
    assert series(con, "pcie_tx_bytes_s")[0][1] == 1048576
    assert series(con, "power_w", "GPU 1")[0][1] == pytest.approx(71.234)
    assert len(series(con, "gpu_util", "GPU 1")) == 2  # the first one was N/A
    # A MIG instance is kept under its entity, with no GPU index (it is not a GPU).
    assert con.execute("SELECT DISTINCT gpu_index FROM counters WHERE entity = 'GPU-I 1'").fetchall() == [(None,)]
    assert "1 malformed lines skipped (first at line 14)" in info.notes  # the cut-off last row
    assert any("dmon was stopped" in n for n in info.notes)
    assert con.execute("SELECT min(end_ns - start_ns), max(end_ns - start_ns) FROM counters").fetchone() == (
        100_000_000,
        100_000_000,
    )


def test_dcgm2_layout_with_epoch_prefix():
    con, info = ingest("dcgmi_dmon_2x_epoch.txt")
    assert info.format_version == "DCGM 2.x layout" and info.clock_anchor == "prefixed"
    assert series(con, "gr_engine_active") == [
        (1764525600 * 10**9, 0.429),
        (1764525600_500_000_000, 0.812),
        (1764525601 * 10**9, 0.1),
    ]
    assert series(con, "sm_active", "GPU 1") == [(1764525600 * 10**9, 0.0), (1764525600_500_000_000, 0.0)]
    assert not info.notes  # the blank timestamp-only line and the repeated header are not malformed


def test_dcgm_numeric_field_ids_and_iso_prefix():
    con, info = ingest("dcgmi_dmon_ids_iso.txt")
    t0 = 1796062360_100_000_000  # 2026-11-30T18:12:40.100Z
    assert series(con, "gpu_util") == [(t0, 0.45), (t0 + 100_000_000, 0.50), (t0 + 300_000_000, 0.0)]
    assert series(con, "fb_used_bytes")[0][1] == 18159 * 2**20
    assert series(con, "power_w")[1][1] == pytest.approx(360.0)
    assert "1 malformed lines skipped (first at line 5)" in info.notes
    assert info.time_zone is None  # the prefix carries its zone (Z): no local time involved


def test_exporter_scrapes_separated_by_comment():
    con, info = ingest("dcgm_exporter_scrapes.prom")
    assert info.format == "dcgm-exporter" and info.clock_anchor == "prefixed"
    assert series(con, "gpu_util") == [(1764525600 * 10**9, 0.87), (1764525615 * 10**9, 0.91)]
    assert series(con, "sm_active", "GPU 1")[1][1] == pytest.approx(0.01)
    assert series(con, "energy_j")[0][1] == pytest.approx(123456.789)  # mJ counter → J
    assert series(con, "tensor_active", "GPU 1") == []  # NaN is missing, not 0
    devs = con.execute("SELECT device, gpu_uuid, bus_id, name FROM devices ORDER BY device").fetchall()
    assert devs[1] == (1, "GPU-bda44c91-b877-1310-b6d3-feee3ff1b19a", "00000000:00:07.0", "NVIDIA H200")
    assert any("DCGM_EXP_XID_ERRORS_COUNT" in n for n in info.notes)


def test_exporter_tab_prefixed_scrapes_and_mig():
    con, info = ingest("dcgm_exporter_tabs.prom")
    assert series(con, "gpu_util") == [(1764525600 * 10**9, 0.40), (1764525630 * 10**9, 0.60)]
    assert series(con, "sm_active", "GPU-I 3") == [(1764525600 * 10**9, 0.25)]


def test_exporter_range_query_json():
    con, info = ingest("dcgm_exporter_range.json")
    assert info.clock_anchor == "native" and info.format_version == "Prometheus query JSON"
    assert series(con, "gpu_util") == [(1764525600 * 10**9, 0.1), (1764525615 * 10**9, 0.2), (1764525645 * 10**9, 0.3)]
    assert [v for _, v in series(con, "tensor_active")] == [0.1, 0.2, 0.3, 0.4]
    assert con.execute("SELECT DISTINCT end_ns - start_ns FROM counters").fetchall() == [(15 * 10**9,)]
