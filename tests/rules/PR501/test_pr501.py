"""PR501 launch-bound-stream: fires on the committed launch-bound phase (1000 one-element adds) and on a plain CUDA
program launching tiny kernels (graph advice in CUDA's words), silent on compute-bound work and on start-up."""

from __future__ import annotations

from ...conftest import kernel, sample_file, write_trace
from ..expect import Between, Expect, analyse, check, single_phase, truth
from ..traces import runtime


def test_fires_on_the_launch_bound_phase():
    # sample_traces/README.md / kineto_run_info.json: 1000 × tiny.add_(1.0) on a 1-element tensor; the kernels
    # (~1 µs) take 0.90 ms of an 18.1 ms span: most of the window is launch gaps.
    n = truth("h200_single/kineto_run_info.json")["config"]["launch_iters"]
    check(
        single_phase("launch_bound"),
        [
            Expect(
                "PR501",
                category="launch_bound",
                lost_fraction=Between(0.5, 0.95, truth="README: 0.90 ms busy of 18.1 ms"),
                evidence={
                    "kernels": n,
                    "launches_per_step": n,
                    "median_kernel_ns": Between(0, 2000, truth="1-element add"),
                    "median_gap_ns": lambda g: g and g > 2000,
                },
                says=[r"CUDA graph", r"torch\.compile"],
            )
        ],
    )


def test_graph_advice_in_cuda_words_without_pytorch(tmp_path):
    # Construction: a CUDA program launching 300 kernels of 2 µs, one every 17 µs (15 µs gaps), no framework.
    ev = []
    for i in range(300):
        t0 = 10.0 + i * 17.0
        ev.append(runtime("cudaLaunchKernel", t0 - 12.0, 10.0, corr=100 + i))
        ev.append(kernel("scale_bias_kernel", t0, 2.0, ext=0, corr=100 + i))
    check(
        analyse([write_trace(tmp_path / "cuda.json", ev)]),
        [
            Expect(
                "PR501",
                evidence={"kernels": 300},
                says=[r"cudaStreamBeginCapture", r"cudaGraphLaunch"],
                never_says=[r"torch", r"CUDAGraph\b"],
            )
        ],
    )


def test_silent_on_compute_bound():
    check(single_phase("compute_bound"), [], silent=["PR501"])


def test_launches_per_step_are_per_gpu_on_several_ranks():
    # PARAM's DLRM on 8 V100s (public, corpus public-real/param-dlrm-v100x8: one ProfilerStep per rank): the fix
    # said "2,180 launches per step" — the eight ranks' sum. Truth, read with json: each rank's GPU activities
    # launched in its step; launches per GPU per step are at most the most of any rank.
    import gzip
    import json

    from ...conftest import corpus_file

    folder = corpus_file("public-real/param-dlrm-v100x8")
    per_rank = []
    for f in sorted(folder.glob("*.json.gz")):
        ev = json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]
        per_rank.append(sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")))
    assert len(per_rank) == 8
    v = analyse([folder], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR501"]
    assert f["evidence"]["launches_per_step"] <= max(per_rank), (f["evidence"]["launches_per_step"], per_rank)
    assert "per GPU per step" in f["fix"], f["fix"]


def test_an_op_is_named_by_its_own_kernel_not_its_workspace_memset(tmp_path):
    # Construction: 200 aten::mm ops, each launching a 1 µs memset (cuBLAS's workspace) then its 2 µs GEMM kernel,
    # launch-bound by design. The corpus H200 nsys export said "aten::mm 640× (…, kernel Memset)".
    from ...conftest import cpu_op

    ev = []
    for i in range(200):
        t = 20.0 * i
        ev += [cpu_op("aten::mm", t, 15.0, 2 * i + 1), runtime("cudaMemsetAsync", t + 1.0, 3.0, corr=2 * i + 1, ext=2 * i + 1)]
        args = {"device": 0, "stream": 7, "correlation": 2 * i + 1, "External id": 2 * i + 1}
        ev.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": t + 5.0,
                   "dur": 1.0, "args": args})  # fmt: skip
        ev += [runtime("cudaLaunchKernel", t + 6.0, 7.0, corr=2 * i + 2, ext=2 * i + 1)]
        ev += [kernel("nvjet_tst_64x8_64x16_1x1_v_bz_TNN", t + 14.0, 2.0, ext=2 * i + 1, corr=2 * i + 2)]
    v = analyse([write_trace(tmp_path / "mm.json", ev)], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR501"]
    (mm,) = [o for o in f["evidence"]["top_ops"] if o["op"] == "aten::mm"]
    assert mm["kernel"].startswith("nvjet"), f["evidence"]["top_ops"]


def test_one_graph_is_promised_per_step_not_per_window(tmp_path):
    # The CUDA construction above has no steps: its window may hold many iterations, so the fix does not promise that
    # its 300 launches become one graph (TraceLens's B200 vLLM trace said "929 launches in the window → 1 graph").
    # The launch-bound phase is measured per occurrence of its range: one graph per occurrence is what capture gives.
    ev = []
    for i in range(300):
        ev += [runtime("cudaLaunchKernel", i * 17.0 - 2.0, 10.0, corr=100 + i), kernel("k", 10.0 + i * 17.0, 2.0, 0, 100 + i)]
    v = analyse([write_trace(tmp_path / "window.json", ev)], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR501"]
    assert "in the window; capture the repeated part as one graph" in f["fix"] and "→ 1 graph" not in f["fix"], f["fix"]
    (g,) = [x for x in single_phase("launch_bound")["findings"] if x["rule"] == "PR501"]
    assert g["fix"].endswith("→ 1 graph"), g["fix"]


def test_a_step_that_syncs_is_no_graph_until_the_syncs_go():
    # sample_traces/h200_hf/moe_eager: HF Mixtral's eager experts loop finds each expert's tokens on the host (a
    # nonzero per expert and layer, each a cudaStreamSynchronize). Truth, read with json from the trace: 495
    # cudaStreamSynchronize and 1 cudaDeviceSynchronize in the 3 ProfilerSteps among 8,192 kernels; 319 of the
    # syncs return into a launch-sized gap (≤ 100 µs) of the stream: runs of 26 launches between them on average. A
    # graph is not captured across a sync: the fix says to remove them first, and promises no "1 graph" per step.
    v = analyse([sample_file("h200_hf/moe_eager.pt.trace.json.gz")], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR501"]
    assert f["evidence"]["host_syncs"] == 319
    assert "2,731 launches per step cut by 106 host syncs: remove the syncs" in f["fix"] and "1 graph" not in f["fix"]
    assert "a graph is not captured across a sync" in f["recommendation"]


def test_syncs_between_phases_leave_the_graph_advice():
    # sample_traces/h200_single's five phases: 17 host syncs (12 cudaDeviceSynchronize, 5 cudaStreamSynchronize,
    # read with json), each between two phases or after one, none inside the launch-bound phase's gaps — the runs of
    # launches between them are long, a graph per run is still the fix.
    v = analyse([sample_file("h200_single/kineto_single.pt.trace.json.gz")], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR501"]
    assert f["evidence"]["host_syncs"] == 0 and "remove the syncs" not in f["fix"], f["fix"]
