"""PR602 utilization-vs-achieved-gap: fires on the committed memory-bound phase (busy ~99%, useful ~0.05%), silent
when the busy time is useful (compute-bound phase), when the GPU is not busy (launch-bound phase), and when the
achieved fraction is only a lower bound (unknown-FLOP GEMMs)."""

from __future__ import annotations

from ...conftest import annotation, kernel, launch, write_trace
from ..expect import Between, Expect, Near, analyse, check, single_phase, truth


def test_fires_on_the_memory_bound_phase():
    # ground_truth.json: the phase achieves 0.00053 of the bf16 peak while its kernels run back to back.
    t = truth("h200_single/ground_truth.json")["phases"]["phase:memory_bound"]
    check(
        single_phase("memory_bound"),
        [
            Expect(
                "PR602",
                evidence={
                    "utilization": Between(0.95, 1.0, truth="20 back-to-back kernels"),
                    "achieved_fraction_of_peak": Near(t["expected_fraction_of_bf16_peak"], abs=0.002, truth="ground_truth.json"),
                    "busy_losses.memory_bound": Between(0.9, 1.0, truth="elementwise kernels only"),
                },
            )
        ],
    )


def test_silent_when_useful_idle_or_unknown(tmp_path):
    check(single_phase("compute_bound"), [], silent=["PR602"])  # ground truth 0.79 of peak: the gap is small
    check(single_phase("launch_bound"), [], silent=["PR602"])  # not busy
    # Construction: a GEMM with no shapes busy 95% of the window: its FLOPs are unknown, so nothing calls it waste.
    ev = [
        annotation("work", 0.0, 1000.0),
        launch(2.0, ext=0, corr=11),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 50.0, 950.0, ext=0, corr=11),
    ]
    check(analyse([write_trace(tmp_path / "unknown.json", ev)], ranges=["work"]), [], silent=["PR602", "PR301"])


def test_the_rules_read_the_lower_bound_as_the_verdict_does(tmp_path):
    # sample_traces/h200_hf/moe_batched, the whole profile: 98% busy, 0.14% achieved; its unknown GEMMs are 22% of
    # the time of unknown and estimated kernels together (h200_hf/README.md), so at the default threshold (10%) the
    # achieved fraction is a lower bound and PR602 claims nothing. A rules config raising
    # `[verdict] material_unknown_flops` to 0.3 makes it a plain figure: the rules see it so too, and PR602 fires.
    from ...conftest import sample_file

    path = sample_file("h200_hf/moe_batched.pt.trace.json.gz")
    default = analyse([path])
    assert default["achieved_is_lower_bound"]
    check(default, [], silent=["PR602"])
    config = tmp_path / "rules.toml"
    config.write_text("[verdict]\nmaterial_unknown_flops = 0.3\n")
    raised = analyse([path], rules_config=config)
    assert not raised["achieved_is_lower_bound"]
    check(raised, [Expect("PR602", says=[r"busy"])])
