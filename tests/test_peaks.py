"""The peak table: names from real traces match the right entry; every entry cites a source."""

from __future__ import annotations

import pytest

from plasmient_report.peaks import PRECISIONS, choose_peak, load_table, match_gpu

TABLE = load_table()


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI250X", "MI250X"),
])
def test_name_matching(name, key):
    g = match_gpu(name, TABLE)
    assert g is not None and g.key == key


def test_required_gpus_and_sources():
    keys = {g.key for g in TABLE}
    for k in ("V100-SXM2", "A100-40GB-SXM", "A100-80GB-SXM", "A10", "L4", "L40S", "H100-SXM", "H100-PCIe",
              "H100-NVL", "H200", "GH200", "B200", "GB200", "MI250X", "MI300X", "MI325X"):
        assert k in keys
    for g in TABLE:
        assert g.source and g.memory_bandwidth_gbs
        assert set(g.tflops) <= set(PRECISIONS)


def test_h200_dense_bf16_is_datasheet_value():
    # NVIDIA H200 datasheet: 1,979 TFLOPS bf16 with sparsity → 989.4 dense; 4.8 TB/s.
    p = choose_peak("NVIDIA H200", "bf16", TABLE)
    assert p.flop_s == pytest.approx(989.4e12)
    assert p.bandwidth_bytes_s == pytest.approx(4.8e12)


def test_unknown_gpu_is_said_and_override_works():
    p = choose_peak("AMD Radeon Graphics", "bf16", TABLE)
    assert not p.known and p.flop_s is None and "unknown GPU" in p.source
    p = choose_peak("AMD Radeon Graphics", "bf16", TABLE, tflops_override=383.0)
    assert p.flop_s == pytest.approx(383e12)
    p = choose_peak(None, "bf16", TABLE, gpu_override="H100-SXM")
    assert p.flop_s == pytest.approx(989.4e12)


def test_missing_precision_falls_back_and_says_so():
    p = choose_peak("Tesla V100-SXM2-16GB", "bf16", TABLE)
    assert p.precision == "fp16" and p.flop_s == pytest.approx(125e12) and "fp16 used" in p.source
