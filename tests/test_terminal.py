"""The verdict box (render/terminal.py) and the command line's manners: what a newcomer reads first. Real verdicts
from the samples and the corpus; hand-edited ones only for keys no trace of ours produces yet (CONTRACTS.md)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from plasmient_report import pipeline
from plasmient_report.render import terminal

from .conftest import ROOT, corpus_file, sample_file


def box_text(verdict: dict) -> str:
    console = Console(width=terminal.WIDTH + 1, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    terminal.render(verdict, console=console)
    return console.export_text()


def analysed(*paths: Path, **opts: object) -> dict:
    res = pipeline.analyse(list(paths), pipeline.Options(**opts))  # type: ignore[arg-type]
    try:
        return json.loads(json.dumps(res.verdict))
    finally:
        res.close()


@pytest.fixture(scope="module")
def ddp() -> dict:
    return analysed(sample_file("h200x2_ddp/kineto"))


@pytest.fixture(scope="module")
def single() -> dict:
    return analysed(sample_file("h200_single/kineto_single.pt.trace.json.gz"))


def test_range_rows_across_ranks_are_steps_times_ranks(ddp: dict) -> None:
    # The DDP sample: 5 profiler steps on each of 2 ranks (sample_traces/README.md). The verdict counts 10
    # occurrences and sums their windows over both ranks; the box says 5 × 2 ranks and the time of one step.
    r = next(x for x in ddp["ranges"] if x["name"] == "ProfilerStep#*")
    assert r["count"] == 10
    text = box_text(ddp)
    row = next(line for line in text.splitlines() if "ProfilerStep#*" in line)
    assert "5 × 2 ranks" in row
    per_step_ms = r["window_ns"] / 10 / 1e6
    assert f"{per_step_ms:,.1f}" in row
    # Truth for the step time: each rank's window is ~202 ms of 5 steps (run.window_ns is the two summed).
    assert 35 < per_step_ms < 45


def test_several_chosen_ranges_get_a_row_each() -> None:
    # sample_traces/h200_hf/flash_ops: four ranges; asked for by name, each gets its row (the headline is the
    # first's step); one range asked for is the headline itself, no table. Truth: the program's CUDA events
    # (flash_ops.truth.json) — fa_full 63.84 ms, fa_local 19.24 ms.
    path = sample_file("h200_hf/flash_ops.pt.trace.json.gz")
    truth = json.loads(sample_file("h200_hf/flash_ops.truth.json").read_text())["phases"]
    text = box_text(analysed(path, ranges=["fa_full", "fa_local"]))
    for name in ("fa_full", "fa_local"):
        row = next(line for line in text.splitlines() if line.strip(" │").startswith(name))
        ms = float(row.split()[3])
        assert ms == pytest.approx(truth[name]["gpu_ms"], rel=0.01), row
    one = box_text(analysed(path, ranges=["fa_local"]))
    assert "ms/step" not in one


def test_notes_past_four_are_counted_not_dropped(single: dict) -> None:
    v = dict(single, notes=[f"note number {i}" for i in range(7)])
    text = box_text(v)
    assert "note number 3" in text and "note number 4" not in text
    assert "and 3 more notes" in text


def test_unknown_gpu_says_unknown_and_why(tmp_path: Path) -> None:
    from .conftest import cpu_op, kernel, launch, write_trace

    ev = [
        cpu_op("aten::add_", 10.0, 5.0, ext=6),
        launch(11.0, ext=6, corr=51),
        kernel("vectorized_elementwise_kernel", 20.0, 50.0, ext=6, corr=51),
    ]
    v = analysed(write_trace(tmp_path / "t.pt.trace.json", ev, gpu="Mystery Accelerator 9000"))
    text = box_text(v)
    assert "unknown" in text and "no peak known for this GPU" in text
    assert "None" not in text  # never "unknown GPU None"
    head = text.splitlines()[0]
    assert "Mystery Accelerator 9000" in head


def test_unknown_gpu_shows_the_share_in_no_loss(tmp_path: Path) -> None:
    """No peak: the GEMM's 20% of the window (conftest.unknown_gpu_trace, by construction) is in no loss, so the
    box gives it a line of its own and the lines cover the window; the title names the GPU whole on its border."""
    from .conftest import unknown_gpu_trace

    v = analysed(unknown_gpu_trace(tmp_path / "t.json"), ranges=["work"])
    text = box_text(v)
    line = next(x for x in text.splitlines() if "achieved + inefficiency" in x)
    assert re.search(r"\b20%", line)
    assert "only a peak tells them apart" in text
    head = text.splitlines()[0]
    assert "Acme Tensor Engine 9 (no peak known) ─" in head  # the title whole, the border's rule after it


def test_a_long_title_is_shortened_not_cut(single: dict) -> None:
    # rich cuts a title longer than the box's border: the GPUs' names are shortened in the middle instead
    v = json.loads(json.dumps(single))
    v["peak"]["gpu"] = None
    for g in v["run"]["gpus"]:
        g["name"] = "NVIDIA GeForce RTX 4070 Laptop GPU with a name far too long for the box"
    head = box_text(v).splitlines()[0]
    # rich ends a cut title at the border with no space before its rule: the whole (shortened) title has one
    assert head.startswith("╭─ plasmient · whole profile")
    assert "NVIDIA GeForce" in head and "…" in head and "the box ─" in head


def test_a_long_gpu_name_is_shortened_between_words() -> None:
    # A GH200's entry name (a public GH200 trace) had been cut mid-word: "NVIDIA GH200 G…H100 GPU, 96 GB HBM3)".
    from plasmient_report.render.terminal import TITLE_ROOM, _title

    p = "plasmient · whole profile · 1 rank · "
    gh200 = _title(p, "NVIDIA GH200 Grace Hopper Superchip (H100 GPU, 96 GB HBM3)")
    assert gh200 == p + "NVIDIA GH200 Grace Hopper Superchip"  # its closing parenthesis dropped
    two = _title(p, "NVIDIA GH200 Grace Hopper Superchip (H100 GPU, 96 GB HBM3), NVIDIA H100 SXM 80 GB")
    assert two == p + "NVIDIA GH200 … NVIDIA H100 SXM 80 GB"  # between words: the vendor and model, the last ones
    assert _title(p, "NVIDIA H200 SXM 141 GB") == p + "NVIDIA H200 SXM 141 GB"
    assert all(len(t) <= TITLE_ROOM for t in (gh200, two))


def test_lower_bound_and_new_categories(single: dict) -> None:
    # Keys the measure stage adds this wave (CONTRACTS.md): hand-set here until a trace of ours produces them.
    v = json.loads(json.dumps(single))
    v["achieved_is_lower_bound"] = True
    v["coverage"]["unknown_flops_time_fraction"] = 0.31
    v["losses"][1:1] = [
        {"category": "unknown_flops", "layer": "op", "fraction": 0.02, "recommendation": "x"},
        {"category": "startup", "layer": "host", "fraction": 0.01, "recommendation": "y"},
    ]
    v["achieved_by_precision"] = [
        {"precision": "bf16", "flops": 1.0, "peak_tflops": 989.4, "fraction": 0.015},
        {"precision": "fp32", "flops": 1.0, "peak_tflops": 67.0, "fraction": 0.002},
    ]
    text = box_text(v)
    assert re.search(r"achieved fraction of peak \.+\s+≥ 2%", text)
    assert "lower bound: 31% of compute time has no FLOP estimate" in " ".join(text.replace("│", " ").split())
    assert "unknown FLOPs" in text and "start-up" in text and "unknown flops" not in text
    assert "bf16 2% · fp32 0.2%" in text


def test_a_step_that_is_not_the_profilers_is_named(ddp: dict) -> None:
    # The profiler's steps: "← N steps"; any other repeating range taken as the step (a benchmark's label, an nsys
    # report's top-level range) is named, so it is not read as a training step.
    flat = " ".join(box_text(ddp).replace("│", " ").split())
    assert "step time (GPU) " in flat and "← 5 steps × 2 ranks " in flat
    assert " steps × 2 ranks of " not in flat
    v = json.loads(json.dumps(ddp))
    v["step_summary"][0]["range"] = "BatchNorm affine=False"
    flat = " ".join(box_text(v).replace("│", " ").split())
    assert "5 steps × 2 ranks of BatchNorm affine=False" in flat


def test_empty_range_name_is_named(single: dict) -> None:
    v = json.loads(json.dumps(single))
    v["ranges"][0]["name"] = ""
    assert "(unnamed range)" in box_text(v)


def test_nsys_gpu_metrics_are_in_the_box() -> None:
    # The nsys workload recording carries GPU metrics (SM / tensor active): verdict.json has them, and so the box.
    v = analysed(corpus_file("h200-single-nsys/nsys_workload.sqlite"))
    assert v["utilization"]["sm_active"] is not None
    text = box_text(v)
    assert "SM active" in text and f"{v['utilization']['sm_active'] * 100:.0f}%" in text


def test_parser_notes_are_joined_once(tmp_path: Path) -> None:
    # Notes of one file are joined without doubling their full stops ('collected.; Not all').
    v = analysed(sample_file("h200_single/nsys_single.sqlite"))
    notes = " ".join(v["notes"]) + " ".join(s["notes"] or "" for s in v["clock"]["sources"])
    assert ".;" not in notes


# ------------------------------------------------------------------------------------------------ the CLI


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )


def test_help_shows_the_main_form_and_examples() -> None:
    r = cli("--help")
    assert r.returncode == 0
    assert "plasmient-report INPUT... [OPTIONS]" in r.stdout and "Examples:" in r.stdout
    assert "plasmient-report diff base/ cand/ --fail-if-drop 2" in r.stdout
    for line in r.stdout.splitlines():  # command summaries are whole sentences, never cut with "..."
        if re.match(r"\s{2}(batch|diff|peaks|query|report|rules)\s", line):
            assert not line.rstrip().endswith("..."), line
    b = cli("batch", "--help").stdout
    options = re.findall(r"^\s+(--[a-z-]+)(.*)$", b, flags=re.M)
    assert len(options) > 20
    undocumented = [o for o, rest in options if not rest.strip() and o != "--help"]
    assert not [o for o in undocumented if not re.search(rf"{o}\s+\S+\s+\S", b)], undocumented


def test_peaks_does_not_cut_gpu_names_when_piped() -> None:
    r = cli("peaks")
    assert r.returncode == 0
    from plasmient_report.peaks import load_table

    for g in load_table(None):
        assert g.key in r.stdout, g.key


def test_query_on_a_verdict_says_it_needs_run_duckdb(tiny_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert cli(tiny_trace, "--out", out, "--quiet").returncode == 0
    r = cli("query", out / "verdict.json", "SELECT 1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "run.duckdb" in r.stderr and str(out / "run.duckdb") in r.stderr
    r = cli("query", out, "SELECT count(*) FROM kernels", "--csv")  # the output folder works too
    assert r.returncode == 0 and r.stdout.splitlines() == ["count_star()", "2"]


def test_no_progress_when_stderr_is_not_a_terminal(tiny_trace: Path, tmp_path: Path) -> None:
    r = cli(tiny_trace, "--out", tmp_path / "o")
    assert r.returncode == 0 and r.stderr == ""


def test_progress_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (a pty here) the long stages show on stderr; the box still prints."""
    trace = sample_file("h200_single/kineto_single.pt.trace.json.gz")
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100", TERM="xterm")
    p = subprocess.Popen(
        [sys.executable, "-m", "plasmient_report.cli", str(trace), "--out", str(tmp_path / "o")],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 300)
        if not ready:
            p.kill()
            break
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the pty
            break
        if not chunk:
            break
        seen += chunk
    p.wait(timeout=60)
    os.close(master)
    text = seen.decode("utf-8", "replace")
    assert p.returncode == 0, text[-2000:]
    assert "ingest kineto_single.pt.trace.json.gz" in text and "VERDICT" in text


def test_a_generic_launcher_is_named_by_what_it_launches():
    # CUTLASS's launchers say nothing of their kernel (`Kernel2` was a row of report.html's Top kernels for the int8
    # GEMM of sample_traces/h200_hf/blas_forms); their first template argument names it. Kernel names as recorded
    # on an H200 (blas_forms) and in TraceLens's traces (FlashAttention-3's CUTLASS 3 `device_kernel`).
    from plasmient_report.vocab import kernel_label

    int8 = (
        "void cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_128x256_128x3_tn_align16>"
        "(cutlass_80_tensorop_i16832gemm_s8_128x256_128x3_tn_align16::Params)"
    )
    assert kernel_label(int8) == "Kernel2 [cutlass_80_tensorop_i16832gemm_s8_128x256_128x3_tn_align16]"
    fa3 = "void cutlass::device_kernel<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, 64> > >(flash::Params)"
    assert kernel_label(fa3) == "device_kernel [FlashAttnFwdSm90]"
    # functor-tagged and plain names are as before
    mul = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, MulFunctor<float> > >(int)"
    assert kernel_label(mul) == "vectorized_elementwise_kernel [MulFunctor]"
    assert kernel_label("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def test_a_name_that_is_all_parentheses_is_kept():
    # The top ops' row of kernels no op launched is "(no op)"; cut as an argument list it was an empty cell in
    # report.html (a public nsys report of Triton kernels on an A100, all of its 5.5 s in that row).
    from plasmient_report.render._format import kernel_names
    from plasmient_report.vocab import kernel_label

    assert kernel_label("(no op)") == "(no op)"
    assert kernel_names(["(no op)", "aten::mm"], 48) == {"(no op)": "(no op)", "aten::mm": "aten::mm"}
    assert kernel_label("void gemm_kernel(float*, int)") == "gemm_kernel"  # an argument list is still cut


@pytest.mark.parametrize(
    ("mangled", "label"),
    [
        # ROCm traces keep kernel names mangled (TraceLens's MI300X SGLang / vLLM / ResNet traces). The labels are
        # the function c++filt reads in each (`void aiter::add_rmsnorm_quant_kernel<std::bfloat16_t, …>(…)`,
        # `void ck_tile::kentry<2, ck_tile::FmhaBatchPrefillWithPagedKVCacheKernel<…>>(…)`); the traces cut the
        # longest names short (c++filt then reads nothing) and the label still reads.
        (
            "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
            "add_rmsnorm_quant_kernel",
        ),
        (
            "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmhaBatchPrefillPipelineQRKSVS",
            "kentry [FmhaBatchPrefillWithPagedKVCacheKernel]",
        ),
        (
            "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28GridwiseGemm_xdl",
            "kernel_grouped_conv_fwd_xdl_cshuffle_v3",
        ),
        (
            "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
            "act_and_mul_kernel",
        ),
        ("_Z12scale_kernelPfif", "scale_kernel"),  # not nested: c++filt reads scale_kernel(float*, int, float)
        ("_Z", "_Z"),  # not a mangled name that reads: left as it is
    ],
)
def test_a_mangled_kernel_name_is_labelled_by_its_function(mangled, label):
    from plasmient_report.vocab import kernel_label

    assert kernel_label(mangled) == label


def test_a_fix_line_keeps_what_a_generic_launcher_runs():
    # PR301's one-line fix names a kernel in one word: the function, but 'kentry' alone (CK tile's launcher of
    # ROCm's RMSNorm in TraceLens's MI300X vLLM trace) would say nothing
    from plasmient_report.vocab import kernel_label, kernel_word

    ck = "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblemIDF16b"
    assert kernel_word(kernel_label(ck)) == "kentry [Rmsnorm2dFwd]"
    mul = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, MulFunctor<float> > >(int)"
    assert kernel_word(kernel_label(mul)) == "vectorized_elementwise_kernel"
