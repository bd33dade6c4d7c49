"""The peak table: names from real traces match the right entry; every entry cites a source; the per-precision
API; user-given names resolve or are refused with the candidates; a GPU is identified from its properties.

Figures were checked against the vendors' datasheets / whitepapers named in each entry's `source`; the tests here
check the table's structure and the lookups, and pin a few figures to those documents (comments say which)."""

from __future__ import annotations

import re

import pytest

from plasmient_report.errors import BadInput
from plasmient_report.peaks import PRECISIONS, choose_peak, identify, load_table, lookup, match_gpu

TABLE = load_table()


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H800", "H800-SXM"),
        ("NVIDIA H800 PCIe", "H800-PCIe"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA A100-PG509-200", "A100-40GB-SXM"),  # HTA's traces (an A100 SXM board of Meta's)
        ("NVIDIA A800-SXM4-80GB", "A800-80GB-SXM"),
        ("NVIDIA A800 80GB PCIe", "A800-80GB-PCIe"),
        ("NVIDIA A800 40GB Active", "A800-40GB-PCIe"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L20", "L20"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2"),
        ("Tesla V100-DGXS-32GB", "V100-SXM2"),
        ("Tesla V100-PCIE-32GB", "V100-PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S-PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB300", "GB300"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080-Ti"),
        ("TITAN RTX", "TITAN-RTX"),
        ("NVIDIA GeForce RTX 3080", "RTX-3080"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 4090 D", "RTX-4090-D"),
        ("NVIDIA GeForce RTX 4090D", "RTX-4090-D"),
        ("NVIDIA GeForce RTX 5090", "RTX-5090"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI300A", "MI300A"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("AMD Instinct MI250X", "MI250X"),
        ("AMD Instinct MI250", "MI250"),
        ("AMD Instinct MI210", "MI210"),
    ],
)
def test_name_matching(name, key):
    g = match_gpu(name, TABLE)
    assert g is not None and g.key == key


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce RTX 3080 Ti", "AMD Instinct MI250X / MI250", "AMD Radeon Graphics", "NVIDIA RTX 6000"]
)
def test_names_no_entry_is_sure_of_match_none(name):
    # a 3080 Ti is not a 3080; "MI250X / MI250" could be either die; "RTX 6000" (Turing Quadro) is not the Ada card
    assert match_gpu(name, TABLE) is None


def test_required_gpus_sources_and_identification_fields():
    keys = {g.key for g in TABLE}
    for k in (
        "V100-SXM2",
        "A100-40GB-SXM",
        "A100-80GB-SXM",
        "A10",
        "L4",
        "L40S",
        "H100-SXM",
        "H100-PCIe",
        "H100-NVL",
        "H200",
        "GH200",
        "B200",
        "GB200",
        "MI250X",
        "MI300X",
        "MI325X",
        # issue 14
        "H800-SXM",
        "H20",
        "A800-80GB-SXM",
        "L20",
        "L40",
        "GH200-144GB",
        "B300",
        "GB300",
        "MI210",
        "MI250",
        "MI300A",
        "MI355X",
        "RTX-A6000",
        "RTX-6000-Ada",
        "RTX-2080-Ti",
        "RTX-3090",
        "RTX-4090",
        "RTX-5090",
    ):
        assert k in keys, k
    assert len(keys) == len(TABLE), "duplicate keys"
    for g in TABLE:
        assert re.search(r"https?://", g.source), g.key
        assert g.memory_bandwidth_gbs and g.memory_bandwidth_gbs > 100
        assert set(g.tflops) <= set(PRECISIONS) and g.tflops
        assert g.vendor in ("NVIDIA", "AMD") and g.compute_capability and g.sm_count and g.memory_gb
        re.compile(g.match)


def test_precisions_a_chip_lacks_are_absent():
    # No bf16 / tf32 units before Ampere (V100, T4, RTX 2080 Ti); no fp8 before Hopper / Ada / CDNA 3.
    for k in ("V100-SXM2", "V100-PCIe", "V100S-PCIe", "T4", "RTX-2080-Ti"):
        g = next(x for x in TABLE if x.key == k)
        assert "bf16" not in g.tflops and "tf32" not in g.tflops and "fp8" not in g.tflops, k
    for k in ("A100-80GB-SXM", "A800-80GB-SXM", "A10", "RTX-3090", "RTX-A6000", "MI250X", "MI250", "MI210"):
        assert "fp8" not in next(x for x in TABLE if x.key == k).tflops, k
    for k in ("MI250X", "MI250", "MI210"):  # CDNA 2 has no TF32
        assert "tf32" not in next(x for x in TABLE if x.key == k).tflops, k


def test_figures_are_self_consistent():
    for g in TABLE:
        t = g.tflops
        if "bf16" in t and "fp16" in t:
            assert t["bf16"] == t["fp16"], g.key  # one tensor rate for both on every chip listed
        if "fp8" in t and "fp16" in t:
            assert t["fp8"] == pytest.approx(2 * t["fp16"], rel=0.02), g.key
        if "fp16" in t and "fp32" in t:
            assert t["fp16"] >= t["fp32"], g.key


def test_h200_dense_bf16_is_datasheet_value():
    # NVIDIA H200 datasheet: 1,979 TFLOPS bf16 with sparsity → 989.4 dense; 4.8 TB/s.
    p = choose_peak("NVIDIA H200", "bf16", TABLE)
    assert p.flop_s == pytest.approx(989.4e12)
    assert p.bandwidth_bytes_s == pytest.approx(4.8e12)


def test_new_entries_pinned_to_their_documents():
    f = {g.key: g for g in TABLE}
    # NVIDIA H800 datasheet: FP64 1 TFLOPS (cut), FP8 3,958 TFLOPS sparse
    assert f["H800-SXM"].tflops["fp64"] == 1.0 and f["H800-SXM"].tflops["fp8"] == pytest.approx(1978.9)
    # Ada whitepaper, RTX 4090: 82.6 TFLOPS FP32; 165.2 FP16 tensor with FP32 accumulate; 1008 GB/s
    assert f["RTX-4090"].tflops["fp32"] == 82.6 and f["RTX-4090"].tflops["fp16"] == 165.2
    assert f["RTX-4090"].memory_bandwidth_gbs == 1008
    # RTX 4090 D: the 4090's AD102 with 114 of its 128 SMs at the same 2.52 GHz boost: the 4090's rates x 114/128
    # (to the 0.1 TFLOPS the whitepaper rounds to: FP32 14,592 x 2 x 2.52 GHz = 73.54)
    for p in ("fp32", "bf16", "fp16", "fp8", "int8"):
        assert f["RTX-4090-D"].tflops[p] == pytest.approx(f["RTX-4090"].tflops[p] * 114 / 128, abs=0.1), p
    assert f["RTX-4090-D"].sm_count == 114 and f["RTX-4090-D"].memory_bandwidth_gbs == 1008
    # TITAN RTX: 130 Tensor TFLOPS (576 Tensor Cores x 1.77 GHz x 128 FLOP), 16.3 FP32, 672 GB/s; Turing: no bf16
    g = f["TITAN-RTX"]
    assert g.tflops["fp16"] == pytest.approx(576 * 1.77e9 * 128 / 1e12, abs=0.1) and g.tflops["fp32"] == 16.3
    assert "bf16" not in g.tflops and "tf32" not in g.tflops and g.memory_bandwidth_gbs == 672
    # AMD MI250 datasheet: 362.1 TFLOPS FP16 per package of two GCDs → 181.05 per GCD; 3.2768 TB/s → 1638.4
    assert f["MI250"].tflops["fp16"] == pytest.approx(362.1 / 2)
    assert f["MI250"].memory_bandwidth_gbs == pytest.approx(3276.8 / 2)


def test_unknown_gpu_is_said_and_override_works():
    p = choose_peak("AMD Radeon Graphics", "bf16", TABLE)
    assert not p.known and p.flop_s is None and "unknown GPU" in p.source
    p = choose_peak("AMD Radeon Graphics", "bf16", TABLE, tflops_override=383.0)
    assert p.flop_s == pytest.approx(383e12)
    p = choose_peak(None, "bf16", TABLE, gpu_override="H100-SXM")
    assert p.flop_s == pytest.approx(989.4e12)
    p = choose_peak(None, "bf16", TABLE)
    assert not p.known and "not named" in p.source


def test_missing_precision_falls_back_and_says_so():
    p = choose_peak("Tesla V100-SXM2-16GB", "bf16", TABLE)
    assert p.precision == "fp16" and p.flop_s == pytest.approx(125e12) and "fp16 used" in p.source


# ------------------------------------------------------------------------------- per-precision API


def test_flop_s_for_each_precision():
    p = choose_peak("NVIDIA H100 80GB HBM3", "bf16", TABLE)
    assert p.flop_s_for("fp8") == pytest.approx(1978.9e12)
    assert p.flop_s_for("bf16") == pytest.approx(989.4e12)
    assert p.flop_s_for("tf32") == pytest.approx(494.7e12)
    assert p.flop_s_for("fp32") == pytest.approx(67e12)
    assert p.available_precisions == PRECISIONS
    v = choose_peak("Tesla V100-SXM2-32GB", "fp32", TABLE)
    assert v.available_precisions == ("fp64", "fp32", "fp16")
    assert v.precision_for("tf32") == "fp32" and v.flop_s_for("tf32") == pytest.approx(15.7e12)
    assert v.flop_s_for("tf32", fallback=False) is None
    assert v.flop_s_for("fp8") is None and v.precision_for("fp8") is None
    assert v.flop_s_for("fp64_tensor") == pytest.approx(7.8e12)  # no fp64 tensor cores: the fp64 rate
    forced = choose_peak("Tesla V100-SXM2-32GB", "fp32", TABLE, tflops_override=100.0)
    assert forced.forced and forced.flop_s_for("fp8") == forced.flop_s_for("fp64") == pytest.approx(100e12)
    unknown = choose_peak("Some GPU", "bf16", TABLE)
    assert unknown.flop_s_for("bf16") is None and unknown.available_precisions == ()


# ----------------------------------------------------------------------------- user-given names


def test_lookup_by_key_alias_or_name():
    assert lookup("H100-SXM", TABLE).key == "H100-SXM"
    assert lookup("h100 sxm", TABLE).key == "H100-SXM"
    assert lookup("A6000", TABLE).key == "RTX-A6000"
    assert lookup("NVIDIA H100 80GB HBM3", TABLE).key == "H100-SXM"  # a device name as a trace writes it
    assert lookup("MI355", TABLE).key == "MI355X"  # a prefix only one entry has
    assert lookup("rtx 4090", TABLE).key == "RTX-4090"


@pytest.mark.parametrize(
    ("query", "candidates"),
    [
        ("H100", {"H100-SXM", "H100-PCIe", "H100-NVL"}),
        ("A100", {"A100-80GB-PCIe", "A100-40GB-PCIe", "A100-80GB-SXM", "A100-40GB-SXM"}),
        ("MI3", {"MI300X", "MI300A", "MI325X"}),
    ],
)
def test_ambiguous_names_are_refused_with_the_candidates(query, candidates):
    with pytest.raises(BadInput) as e:
        lookup(query, TABLE)
    msg = str(e.value)
    assert "ambiguous" in msg and all(c in msg for c in candidates)
    with pytest.raises(BadInput, match="ambiguous"):
        choose_peak("NVIDIA H200", "bf16", TABLE, gpu_override=query)


def test_unknown_name_is_refused():
    with pytest.raises(BadInput, match="unknown GPU"):
        lookup("Voodoo 5", TABLE)
    with pytest.raises(BadInput, match="unknown GPU"):
        choose_peak("NVIDIA H200", "bf16", TABLE, gpu_override="Voodoo 5")
    # ... unless the user also gives the figure
    p = choose_peak(None, "bf16", TABLE, gpu_override="Voodoo 5", tflops_override=1.0)
    assert p.gpu == "Voodoo 5" and p.flop_s == pytest.approx(1e12)


# ------------------------------------------------------------------------------ identification


def test_identify_from_properties():
    # Properties as real traces record them (TraceLens / HTA traces): MI300X, an MI250 GCD.
    mi300 = identify("AMD", "9.4", 304, 206141652992)
    assert mi300.gpu is not None and mi300.gpu.key == "MI300X"
    gcd = identify("AMD", "9.0", 104, 68702699520)
    assert gcd.gpu is not None and {"MI250", "MI210"} <= set(gcd.candidates)  # same figures: one answer
    # an H200 (132 SMs, 143771 MiB) fits the SXM and the NVL board, whose peaks differ: not guessed
    h200 = identify("NVIDIA", "9.0", 132, 143771 * 2**20)
    assert h200.gpu is None and {"H200", "H200-NVL"} <= set(h200.candidates) and "give --gpu" in h200.sentence
    # TraceLens's B200 trace's properties: 148 SMs are an HGX B200's (a GB200 reports 152): identified
    b200 = identify("NVIDIA", "10.0", 148, 191503138816)
    assert b200.gpu is not None and b200.gpu.key == "B200"
    assert identify("NVIDIA", "10.0", 152, 184 * 2**30).gpu.key == "GB200"  # type: ignore[union-attr]
    assert identify("NVIDIA", "8.9", 128, 24 * 2**30).gpu.key == "RTX-4090"  # type: ignore[union-attr]
    none = identify("NVIDIA", "7.5", 999, None)
    assert none.gpu is None and "no GPU in the peak table" in none.sentence
    few = identify(None, None, 80, None)
    assert few.gpu is None and "too few" in few.sentence


def test_user_peaks_file_overrides_and_adds(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(
        '[[gpu]]\nkey = "H100-SXM"\nname = "my H100"\nmatch = "H100"\nbf16 = 900.0\n'
        'memory_bandwidth_gbs = 3000\nsource = "measured"\n'
        '[[gpu]]\nkey = "X1"\naliases = ["xone"]\nbf16 = 10.0\n'
    )
    t = load_table(f)
    assert lookup("H100-SXM", t).tflops == {"bf16": 900.0}
    assert lookup("xone", t).key == "X1"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nkey = "Y"\nmatch = "(("\n')
    with pytest.raises(BadInput, match="bad"):
        load_table(bad)


def test_pascal_gp100_parts_match_their_own_entries():
    # Names as the CUDA driver reports them (HTA's step_based test trace: "Quadro GP100", compute capability 6.0,
    # 56 SMs); the Quadro must not take a Tesla P100's figures, nor a PCIe P100 the SXM2's.
    from plasmient_report.peaks import load_table, match_gpu

    table = load_table(None)
    for name, key in (
        ("Quadro GP100", "Quadro-GP100"),
        ("Tesla P100-SXM2-16GB", "P100-SXM2"),
        ("Tesla P100-PCIE-16GB", "P100-PCIe"),
    ):
        g = match_gpu(name, table)
        assert g is not None and g.key == key, (name, g)


def test_a_name_whose_properties_contradict_its_entry_is_said(tmp_path):
    # PyTorch's inductor profiler tests record a device named just "NVIDIA H100" with 101,997,215,744 bytes (95 GiB)
    # and 132 SMs: no 80 GB H100 SXM, which the generic name matches. The peaks stay the name's (said so), and the
    # H100 entry its properties fit is named; a MIG slice (42 SMs, 40 GB of an 80 GB A100) is said likewise. Names
    # whose properties fit their entry (real traces: H200 143,771 MiB; H800 84,943,110,144 B) say nothing.
    from plasmient_report.peaks import CONTRADICTED_MARK, contradiction

    said = contradiction("NVIDIA H100", "NVIDIA", "9.0", 132, 101997215744)
    assert said and CONTRADICTED_MARK in said and "95 GiB" in said and "H100 NVL" in said and "--gpu" in said
    assert "; " not in said  # one note (the sources' notes are joined by "; ")
    mig = contradiction("NVIDIA A100-SXM4-80GB", "NVIDIA", "8.0", 42, 40 * 10**9)
    assert mig and "42 SMs" in mig and "108 SMs" in mig
    # A shipping B300, as public Kineto traces of one describe it (TraceLens's MoE evals: 'NVIDIA B300 SXM6 AC',
    # compute capability 10.3, 148 SMs, 287,431,131,136 bytes): it fits its entry, no note (the chip's full 160 SMs
    # made one on every B300 trace); a MIG slice of it still does not.
    assert contradiction("NVIDIA B300 SXM6 AC", "NVIDIA", "10.3", 148, 287431131136) is None
    # a GB300 reports 152 (public benchmark write-ups of GB300 machines: "GB300, 152 SMs")
    assert contradiction("NVIDIA GB300", "NVIDIA", "10.3", 152, 275 * 2**30) is None
    # a GB200 reports 152 too ("NVIDIA GB200, 152 SMs" in public GB200 write-ups), a B200 148
    assert contradiction("NVIDIA GB200", "NVIDIA", "10.0", 152, 184 * 2**30) is None
    assert contradiction("NVIDIA B200", "NVIDIA", "10.0", 148, 179 * 2**30) is None
    assert CONTRADICTED_MARK in (contradiction("NVIDIA B300 SXM6 AC", "NVIDIA", "10.3", 20, 34 * 2**30) or "")
    assert contradiction("NVIDIA H200", "NVIDIA", "9.0", 132, 143771 * 2**20) is None
    assert contradiction("NVIDIA H800", "NVIDIA", "9.0", 132, 84943110144) is None
    assert contradiction("NVIDIA H100 80GB HBM3", "NVIDIA", "9.0", 132, 85 * 10**9) is None
    # less memory than the entry: a smaller variant of the same figures (PARAM's ResNet trace: a 16 GB V100 SXM2)
    assert contradiction("Tesla V100-SXM2-16GB", "NVIDIA", "7.0", 80, 16945512448) is None

    # through the pipeline: the verdict's notes say it
    import json

    from plasmient_report import pipeline

    from .conftest import kernel, launch

    doc = {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 101997215744, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
        ],
        "traceEvents": [launch(1.0, ext=1, corr=1), kernel("work_kernel", 5.0, 100.0, ext=1, corr=1)],
    }
    p = tmp_path / "h100.json"
    p.write_text(json.dumps(doc))
    res = pipeline.analyse([p], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert [n for n in res.verdict["notes"] if CONTRADICTED_MARK in n]
    finally:
        res.close()


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3080 Laptop GPU", "GeForce RTX 2080 Ti with Max-Q Design"]
)
def test_a_laptop_gpu_does_not_take_its_desktop_namesakes_peaks(name: str) -> None:
    # The laptop RTX 4090 is an AD103 of 76 SMs, not the desktop's AD102 of 128: no entry of the table is it, so no
    # peak is known (rather than a 1.7x too high one).
    assert match_gpu(name, TABLE) is None
