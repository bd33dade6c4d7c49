"""One class per kernel (sql/kernel_class.sql): unknown is not memory-bound, communication by what it is, every
kernel against the peak of its own precision; and the verdict's honesty when FLOPs are unknown. Synthetic traces
(truth by construction), the project's recordings and the corpus of other systems' traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plasmient_report import pipeline

from . import contract
from .conftest import annotation, corpus_file, cpu_op, kernel, launch, sample_file, unknown_gpu_trace, write_trace

H100_BF16 = 989.4e12  # NVIDIA H100 SXM datasheet, dense bf16
H100_TF32 = 494.7e12  # the same, TF32
N = 4096


def analyse(paths: list[Path], **kw: Any) -> pipeline.Result:
    return pipeline.analyse(paths, pipeline.Options(write_html=False, write_trace=False, **kw))


def classes(res: pipeline.Result) -> dict[str, tuple[str, str | None]]:
    return {
        n: (c, p)
        for n, c, p in res.con.execute(
            "SELECT k.name, kc.class, kc.precision FROM kernels k JOIN kernel_class kc USING (kernel_id)"
        ).fetchall()
    }


def _mixed_trace(tmp: Path) -> Path:
    bf16 = ["c10::BFloat16"] * 2
    ev = [
        annotation("work", 0.0, 2000.0),
        # a GEMM with shapes: compute; its FLOPs known
        cpu_op("aten::mm", 10.0, 5.0, ext=1, dims=[[N, N], [N, N]], types=bf16),
        launch(11.0, 1, 10),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 100.0, 200.0, ext=1, corr=10),
        # a GEMM whose op recorded no shapes: unknown, not memory-bound
        cpu_op("aten::mm", 20.0, 5.0, ext=2),
        launch(21.0, 2, 11),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 300.0, 300.0, ext=2, corr=11),
        # an elementwise kernel of an op with a byte model: known ~0 FLOPs (memory)
        cpu_op("aten::add_", 30.0, 5.0, ext=3, dims=[[N, N], [N, N], []], types=["c10::BFloat16"] * 2 + ["Scalar"]),
        launch(31.0, 3, 12),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
            600.0,
            50.0,
            ext=3,
            corr=12,
        ),
        # a custom kernel nothing describes: unknown
        launch(41.0, 0, 13),
        kernel("my_fused_attention_fwd", 650.0, 100.0, ext=0, corr=13),
        # Inductor pointwise: known (memory)
        launch(51.0, 0, 14),
        kernel("triton_poi_fused_add_mul_0", 750.0, 50.0, ext=0, corr=14),
        # communication that is not NCCL: DeepEP dispatch, symmetric-memory all-reduce
        launch(61.0, 0, 15),
        kernel("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", 800.0, 300.0, ext=0, corr=15),
        launch(71.0, 0, 16),
        kernel("multimem_all_reduce_kernel<bf16>", 1100.0, 100.0, ext=0, corr=16),
        # fp32 inputs on a TF32 tensor-core kernel: tf32
        cpu_op("aten::mm", 80.0, 5.0, ext=4, dims=[[N, N], [N, N]], types=["float", "float"]),
        launch(81.0, 4, 17),
        kernel("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n", 1200.0, 400.0, ext=4, corr=17),
    ]
    return write_trace(tmp / "mixed.json", ev)


def test_kernel_classes_by_what_they_are(tmp_path):
    res = analyse([_mixed_trace(tmp_path)])
    c = classes(res)

    def cls(prefix: str) -> str:
        return next(v[0] for n, v in c.items() if n.startswith(prefix))

    assert cls("void at::native::vectorized_elementwise_kernel") == "memory"
    assert cls("my_fused_attention_fwd") == "unknown"
    assert cls("triton_poi_fused_add_mul_0") == "memory"
    assert cls("void deep_ep::intranode::dispatch") == "communication"
    assert cls("multimem_all_reduce_kernel") == "communication"
    assert c["sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n"] == ("compute", "tf32")
    gemms = res.con.execute("""SELECT kc.class, k.flops FROM kernels k JOIN kernel_class kc USING (kernel_id)
                               WHERE k.name LIKE 'sm90_xmma%' ORDER BY k.start_ns""").fetchall()
    assert gemms == [("compute", 2 * N**3), ("unknown", None)]


def test_unknown_is_its_own_category_and_the_verdict_says_lower_bound(tmp_path):
    v = analyse([_mixed_trace(tmp_path)], ranges=["work"]).verdict
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    # by construction: the shape-less GEMM runs alone 300–600 µs, the custom kernel 650–750 µs: 400 µs of 2000
    assert cats["unknown_flops"] == pytest.approx(400 / 2000)
    assert cats["memory_bound"] == pytest.approx((50 + 50) / 2000)
    assert cats["collective_transfer"] == pytest.approx(400 / 2000)
    # compute time (compute + memory + unknown kernels): 200 + 300 + 50 + 100 + 50 + 400 µs; unknown 400 of 1100
    assert v["coverage"]["unknown_flops_time_fraction"] == pytest.approx(400 / 1100)
    assert v["achieved_is_lower_bound"] and v["headroom"]["factor"] is None
    assert "not useful" not in v["verdict"] and not any(f["rule"] == "PR602" for f in v["findings"])
    # each kernel against its own precision's peak: the bf16 GEMM against 989.4, the TF32 one against 494.7 TFLOP/s
    expected = (2 * N**3 / H100_BF16 + 2 * N**3 / H100_TF32) / 2000e-6
    assert v["achieved_fraction_of_peak"] == pytest.approx(expected, rel=1e-9)
    by = {b["precision"]: b["fraction"] for b in v["achieved_by_precision"]}
    assert by == pytest.approx({"bf16": 2 * N**3 / H100_BF16 / 2000e-6, "tf32": 2 * N**3 / H100_TF32 / 2000e-6})
    assert sum(by.values()) == pytest.approx(v["achieved_fraction_of_peak"])
    assert v["achieved_fraction_of_peak"] + sum(cats.values()) == pytest.approx(1.0, abs=1e-9)


def test_zero_coverage_says_achieved_unknown(tmp_path):
    ev = [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::mm", 10.0, 5.0, ext=1),
        launch(11.0, 1, 10),
        kernel("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_TNN", 100.0, 800.0, ext=1, corr=10),
    ]
    v = analyse([write_trace(tmp_path / "t.json", ev)]).verdict
    assert v["achieved_fraction_of_peak"] is None and v["achieved_is_lower_bound"]
    assert v["coverage"]["unknown_flops_time_fraction"] == pytest.approx(1.0)
    note = next(n for n in v["notes"] if "achieved: unknown" in n)
    assert "--model-flops" in note and "record_shapes" in note and "Nsight Compute" in note
    assert v["headroom"]["factor"] is None and "not useful" not in v["verdict"]


def test_what_to_give_for_unknown_work_fits_the_trace(tmp_path):
    # Construction: the same unknown GEMM, (a) under an op recorded with shapes whose kernel nothing models (a
    # custom kernel: TraceLens's B200 vLLM trace has record_shapes on and MXFP4 MoE kernels no model knows), and
    # (b) in a CUDA program with no PyTorch at all: neither is told to record shapes with torch.profiler.
    shaped = [
        annotation("work", 0.0, 1000.0),
        cpu_op("vllm::moe_forward", 10.0, 5.0, ext=1, dims=[[4096, 4096], [4096, 4096]], types=["c10::BFloat16"] * 2),
        launch(11.0, 1, 10),
        kernel("bmm_MxE4m3_MxE2m1_custom_kernel", 100.0, 800.0, ext=1, corr=10),
    ]
    bare = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 100,
            "tid": 1,
            "ts": 11.0,
            "dur": 2.0,
            "args": {"correlation": 10},
        },
        kernel("my_gemm_kernel", 100.0, 800.0, ext=0, corr=10),
    ]
    for name, ev in (("shaped", shaped), ("bare", bare)):
        v = analyse([write_trace(tmp_path / f"{name}.json", ev)]).verdict
        note = next(n for n in v["notes"] if "achieved: unknown" in n)
        assert "--model-flops" in note and "Nsight Compute" in note, note
        assert "record_shapes=True" not in note and "torch.profiler" not in note, note
        if name == "shaped":
            assert "has shapes" in note


def test_fp8_gemms_against_the_fp8_peak():
    # sample_traces/h200_hf/fp8_gemm: 20 torch._scaled_mm e4m3 8192³ in 15.51 ms of CUDA-event time → 0.716 of the
    # H200's 1978.9 TFLOP/s dense FP8 peak; 20 bf16 torch.mm in 28.02 ms → 0.793 of 989.4.
    t = json.loads(sample_file("h200_hf/fp8_gemm.truth.json").read_text())["phases"]
    path = sample_file("h200_hf/fp8_gemm.pt.trace.json.gz")
    for phase, prec in (("fp8_gemm", "fp8"), ("bf16_gemm", "bf16")):
        v = analyse([path], ranges=[phase]).verdict
        assert v["peak"]["precision"] == prec and [b["precision"] for b in v["achieved_by_precision"]] == [prec]
        assert v["achieved_fraction_of_peak"] == pytest.approx(t[phase]["achieved_truth"], rel=0.01)
        assert not any("capped" in n for n in v["notes"])
    both = analyse([path]).verdict
    assert {b["precision"] for b in both["achieved_by_precision"]} >= {"fp8", "bf16"}
    forced = analyse([path], ranges=["fp8_gemm"], peak_precision="bf16").verdict
    # --peak-precision forces one peak: the FP8 GEMMs then imply more than the bf16 peak and are capped (said)
    assert forced["peak"]["precision"] == "bf16" and any("capped" in n for n in forced["notes"])


@pytest.mark.parametrize(
    "phase",
    ["int8_mm", "addmm_gelu", "addbmm", "mv", "addmv", "dot", "scaled_mm_v2", "int4_weight_mm_m16", "int4_weight_mm_m4096"],
)
def test_the_other_matmul_class_ops_against_their_program_truth(phase):
    # sample_traces/h200_hf/blas_forms: one range per op, 20 calls each — int8 torch._int_mm 8192³, a Linear with
    # its GELU in cuBLASLt's epilogue (aten::_addmm_activation), addbmm (8 products summed), mv / addmv on a
    # 16384² bf16 matrix, an fp32 dot of 2²⁸ elements, FP8 torch.nn.functional.scaled_mm (aten::_scaled_mm_v2), int4
    # weight-only torch._weight_int4pack_mm (tinygemm) of M = 16 and 4096 activations by an 8192² weight.
    # Truth: FLOPs from the shapes the program chose (torch 2.11's FlopCounterMode counts none of these ops) over
    # in-stream CUDA-event time, against the peak of the op's own precision (int8 1978.9 TOPS, fp32 66.9 TFLOP/s).
    t = json.loads(sample_file("h200_hf/blas_forms.truth.json").read_text())["phases"][phase]
    v = analyse([sample_file("h200_hf/blas_forms.pt.trace.json.gz")], ranges=[phase]).verdict
    assert [b["precision"] for b in v["achieved_by_precision"]] == [t["precision"]]
    assert v["achieved_fraction_of_peak"] == pytest.approx(t["achieved_truth"], rel=0.02)
    assert not v["achieved_is_lower_bound"] and v["coverage"]["unknown_flops_time_fraction"] < 0.01


@pytest.mark.parametrize("phase", ["fa_full", "fa_causal", "fa_sliding", "fa_local"])
def test_flash_attn_ops_against_their_program_truth(phase):
    # sample_traces/h200_hf/flash_ops: FlashAttention 2's own ops (flash_attn::_flash_attn_forward / _backward, as
    # torch 2.11's profiler records them), 10 forward + backward per range on bf16 (4, 4096, 16, 128), masks full,
    # causal, HF's causal sliding window 1024 and a local ±512. Truth (written by the program): FLOPs of the pairs
    # each mask keeps (brute force), 2.5x backward (FlopCounterMode's count for SDPA of the same shapes), over
    # in-stream CUDA-event time; flash_attn's flags and windows are read from the op's recorded arguments.
    t = json.loads(sample_file("h200_hf/flash_ops.truth.json").read_text())["phases"][phase]
    v = analyse([sample_file("h200_hf/flash_ops.pt.trace.json.gz")], ranges=[phase]).verdict
    (r,) = v["ranges"]
    assert r["flops"] == pytest.approx(t["flops"], rel=0.001)  # causal: L·L/2 for the L·(L+1)/2 pairs kept
    assert v["achieved_fraction_of_peak"] == pytest.approx(t["achieved_truth"], rel=0.02)
    assert not v["achieved_is_lower_bound"] and v["coverage"]["unknown_flops_time_fraction"] < 0.01


def test_v100_is_never_labelled_bf16():
    # hta-df-index-resolver: a V100 (no bf16) running fp32 sgemm kernels (../shared/corpus/public-real/README.md)
    v = analyse([corpus_file("public-real/hta-df-index-resolver/df_index_resolver.json.gz")]).verdict
    assert v["peak"]["precision"] == "fp32"
    v = analyse([corpus_file("public-kineto-hta/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")]).verdict
    assert "V100" in v["peak"]["gpu"] and v["peak"]["precision"] != "bf16"


def test_op_links_are_checked_against_thread_and_time():
    # hta-df-index-resolver: runtime External ids equal to correlation ids name unrelated ops (aten::empty); the
    # checked link falls back to the op enclosing the launch on its thread.
    res = analyse([corpus_file("public-real/hta-df-index-resolver/df_index_resolver.json.gz")])
    bad = res.con.execute("""SELECT count(*) FROM kernels k JOIN ops o ON o.op_id = k.op_id
                             WHERE o.name IN ('aten::empty', 'aten::empty_strided') AND k.kind = 'compute'""").fetchone()
    assert bad == (0,)
    # every kernel linked has its launch inside its op, on the op's thread
    wrong = res.con.execute("""SELECT count(*) FROM kernel_launch l JOIN ops o USING (op_id)
                               WHERE o.thread <> l.launch_thread OR l.launch_start_ns NOT BETWEEN o.start_ns AND o.end_ns
                            """).fetchone()
    assert wrong == (0,)
    assert res.verdict["coverage"]["kernels_linked_to_ops_fraction"] > 0.9
    res = analyse([corpus_file("public-real/param-resnet-2080ti/resnet_kineto.json.gz")])
    conv = res.con.execute("""SELECT o.name, count(*) FROM kernels k JOIN ops o ON o.op_id = k.op_id
                              WHERE k.name LIKE '%scudnn%' GROUP BY o.name""").fetchall()
    assert conv and all("conv" in n for n, _ in conv)


@pytest.mark.parametrize("inner_ends", [15.0, 11.0], ids=["inner-open", "inner-ended"])
def test_a_launch_goes_to_the_innermost_op_open_even_when_ops_start_together(inner_ends, tmp_path):
    # A child op often starts in its parent's µs (aten::matmul -> aten::mm): of the ops starting at one time, the
    # launch belongs to the innermost still open at the launch — the child, or its parent once the child ended.
    # (The trace's External ids link nothing here: the enclosing op is looked up by thread and time. With a few
    # rows DuckDB once planned that lookup as a loop join that took the outer op: truth by construction.)
    ev = [
        annotation("work", 0.0, 100.0),
        cpu_op("aten::matmul", 10.0, 10.0, ext=5),
        cpu_op("aten::mm", 10.0, inner_ends - 10.0, ext=6),
        launch(12.0, 0, 10),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 30.0, 20.0, ext=0, corr=10),
    ]
    res = analyse([write_trace(tmp_path / "t.json", ev)])
    try:
        rows = res.con.execute("SELECT o.name, l.op_link FROM kernel_launch l JOIN ops o USING (op_id)").fetchall()
    finally:
        res.close()
    assert rows == [("aten::mm" if inner_ends > 12.0 else "aten::matmul", "enclosing")]


def test_all_to_all_sendrecv_is_a_collective_not_a_bubble():
    # param-dlrm-v100x8: the embedding all-to-all runs as ncclKernel_SendRecv under c10d::alltoall_base_ on 8 ranks
    v = analyse([corpus_file("public-real/param-dlrm-v100x8")]).verdict
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    assert "pipeline_bubble" not in cats and cats["collective_wait"] > 0.1
    assert not any(f["rule"] == "PR201" for f in v["findings"])
    contract.check_verdict(v)  # each of the 8 ranks' waterfalls closes


@pytest.mark.parametrize(
    "name",
    [
        "hta-et-simple-add/benchmark_simple_add_trace.json.gz",
        "hta-cp-simple-add/benchmark_result_493459_1694039959_trace.json.gz",
    ],
)
def test_cuda_startup_is_startup_not_launch_bound(name):
    # seconds of CUDA start-up (context creation in the first CUDA call, cudaMalloc / cudaFree) before the first
    # kernels of two tiny A100 benchmarks (../shared/corpus/public-real/README.md)
    v = analyse([corpus_file(f"public-real/{name}")]).verdict
    assert v["losses"][0]["category"] == "startup"
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    assert cats["startup"] > 0.5 and cats.get("launch_bound", 0) < 0.2


def test_unknown_gpu_still_gets_time_based_losses(tmp_path):
    # a GPU the peak table does not know: no achieved fraction, but utilization and every time-based category;
    # truth by construction (conftest.unknown_gpu_trace)
    v = analyse([unknown_gpu_trace(tmp_path / "t.json")], ranges=["work"]).verdict
    assert v["achieved_fraction_of_peak"] is None and v["verdict"] == "busy (no peak known)"
    assert any("no peak" in n for n in v["notes"])
    assert v["peak"]["gpu"] is None and v["peak"]["tflops"] is None  # no peak-table entry used
    assert v["run"]["gpus"][0]["name"] == "Acme Tensor Engine 9"
    assert v["headroom"] == {"factor": None, "text": "headroom unknown (no peak known for this GPU)"}
    assert v["utilization"]["trace"] == pytest.approx(300 / 1000)
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    assert cats["memory_bound"] == pytest.approx(100 / 1000)
    assert sum(f for c, f in cats.items() if c in ("launch_bound", "sync_stall", "startup", "host_other")) == pytest.approx(
        700 / 1000
    )
    # the GEMM's 200 µs, whose FLOPs are known but whose peak is not, belong to no category: the losses cover the
    # window but for it (docs/verdict.md)
    assert "compute_inefficiency" not in cats
    in_no_category = 1 - sum(cats.values())
    assert in_no_category == pytest.approx(200 / 1000)


def test_rocm_compiled_kernels_are_classed():
    # tl-mi300-compile-triton: torch.compile Triton kernels on an MI300X: pointwise / reduction kernels are known
    res = analyse([corpus_file("public-real/tl-mi300-compile-triton/trace.json.gz")])
    rows = res.con.execute("""SELECT kc.class, count(*) FROM kernels k JOIN kernel_class kc USING (kernel_id)
                              WHERE regexp_matches(k.name, '^triton_(poi|red|per)_') GROUP BY ALL""").fetchall()
    assert rows and all(c == "memory" for c, _ in rows)
    v = res.verdict
    assert v["losses"]
    contract.check_verdict(v)


def test_long_idle_gap_is_not_launch_bound_because_of_one_copy(tmp_path):
    # 972 ms of host work with a 4.8 ms cudaMemcpyAsync at its end (issue #14): only launch calls are launch-bound
    ev = [
        annotation("step", 0.0, 1_000_000.0),
        cpu_op("aten::mm", 10.0, 5.0, ext=1, dims=[[N, N], [N, N]], types=["c10::BFloat16"] * 2),
        launch(11.0, 1, 10),
        kernel("nvjet_sm90_tst_gemm", 20.0, 1000.0, ext=1, corr=10),
        cpu_op("aten::copy_", 968_000.0, 5000.0, ext=2, dims=[[1024], [1024]], types=["float", "float"]),
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaMemcpyAsync",
            "pid": 100,
            "tid": 1,
            "ts": 968_100.0,
            "dur": 4800.0,
            "args": {"correlation": 11, "External id": 2},
        },
        kernel("Memcpy HtoD (Pageable -> Device)", 972_900.0, 50.0, ext=2, corr=11, cat="gpu_memcpy"),
        cpu_op("aten::mm", 973_000.0, 5.0, ext=3, dims=[[N, N], [N, N]], types=["c10::BFloat16"] * 2),
        launch(973_001.0, 3, 12),
        kernel("nvjet_sm90_tst_gemm", 973_010.0, 1000.0, ext=3, corr=12),
    ]
    v = analyse([write_trace(tmp_path / "t.json", ev)], ranges=["step"]).verdict
    cats = {x["category"]: x["fraction"] for x in v["losses"]}
    assert cats.get("launch_bound", 0.0) < 0.001 and cats["host_other"] > 0.95


def test_several_devices_in_one_process_each_sum_to_one(tmp_path):
    # one process driving two GPUs (DataParallel): one entry per (rank, device), each with its own losses
    bf16 = ["c10::BFloat16"] * 2
    ev = [
        cpu_op("aten::mm", 10.0, 5.0, ext=1, dims=[[N, N], [N, N]], types=bf16),
        launch(11.0, 1, 10),
        kernel("nvjet_sm90_tst_gemm", 100.0, 200.0, ext=1, corr=10, device=0),
        cpu_op("aten::mm", 20.0, 5.0, ext=2, dims=[[N, N], [N, N]], types=bf16),
        launch(21.0, 2, 11),
        kernel("nvjet_sm90_tst_gemm", 150.0, 600.0, ext=2, corr=11, device=1),
        cpu_op("aten::add_", 900.0, 5.0, ext=3),
        launch(901.0, 3, 12),
        kernel("vectorized_elementwise_kernel", 950.0, 20.0, ext=3, corr=12, device=0),
    ]
    p = write_trace(tmp_path / "dp.json", ev)
    doc = json.loads(p.read_text())
    doc["deviceProperties"].append({"id": 1, "name": "NVIDIA H100 80GB HBM3", "numSms": 132})
    p.write_text(json.dumps(doc))
    v = analyse([p]).verdict
    assert [(r["rank"], r["device"]) for r in v["ranks"]] == [(0, 0), (0, 1)]
    contract.check_verdict(v)  # each (rank, device) has its own waterfall, closing on its own


def test_bandwidth_above_hbm_is_flagged_not_stated(tmp_path):
    # an elementwise add whose byte model (read two 1 GiB fp32 tensors, write one: 3 GiB) over 0.5 ms implies
    # 6.4 TB/s, above the H100's 3.35 TB/s HBM: L2 reuse or an over-count, never "191% of HBM"
    n = 2**28
    ev = [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::add", 10.0, 5.0, ext=1, dims=[[n], [n], []], types=["float", "float", "Scalar"]),
        launch(11.0, 1, 10),
        kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", 100.0, 500.0, ext=1, corr=10
        ),
    ]
    res = analyse([write_trace(tmp_path / "t.json", ev)], ranges=["work"])
    assert res.con.execute("SELECT bool_and(above_hbm_peak) FROM kernel_class WHERE class = 'memory'").fetchone() == (True,)
    v = res.verdict
    top = v["top_kernels"][0]
    assert top["bandwidth_above_hbm_peak"] and top["bandwidth_fraction_of_hbm"] > 1
    # named as every renderer names it (vocab.kernel_label), not cut from the raw name
    assert any("imply more than the HBM peak (e.g. vectorized_elementwise_kernel [CUDAFunctor_add])" in n for n in v["notes"])
    pr301 = [f for f in v["findings"] if f["rule"] == "PR301"]
    assert pr301 and "L2" in pr301[0]["title"] and pr301[0]["evidence"]["bandwidth_above_hbm_peak"]


def test_deepseeks_own_deepep_kernels_are_communication(tmp_path):
    # DeepSeek's published DualPipe profile (deepseek-ai/profile-data) names DeepEP's kernels `dpsk::ep::`:
    # the all-to-all dispatch and combine of expert parallelism, communication like `deep_ep::`.
    ev = [
        launch(1.0, 0, 1),
        kernel("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*)", 10.0, 300.0, ext=0, corr=1),
        launch(2.0, 0, 2),
        kernel(
            "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)", 400.0, 200.0, ext=0, corr=2
        ),
    ]
    c = classes(analyse([write_trace(tmp_path / "dpsk.json", ev)]))
    assert sorted(v[0] for v in c.values()) == ["communication", "communication"]


def test_a_matmul_word_does_not_make_a_gemm_of_a_kernel_known_to_do_none(tmp_path):
    # Kernel names of TraceLens's B200 vLLM trace: TensorRT-LLM's MoE finalize (a CUTLASS type in its template
    # arguments), vLLM's KV-cache write (`flash` in its name) and fp8 quantization do no matmul work; a CUTLASS
    # device kernel running FlashAttention and a bare GEMM may. Truth: what each kernel is, by its source.
    names = {
        "void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, float>>"
        "(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, float>)": "memory",
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>"
        "(__nv_bfloat16 const*)": "memory",
        "void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*)": "memory",
        "void cutlass::device_kernel<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwd<128>>>(flash::Params)": "unknown",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "unknown",
        # cuDNN's batch norm (the kineto repo's ResNet50 sample, V100: 21% of its unknown time) is no matmul; its
        # convolutions may be
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*)": "memory",
        "void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, 0>(float, float, cudnnTensorStruct)": "memory",
        "volta_scudnn_128x64_relu_interior_nn_v1": "unknown",
        # MIOpen's tensor ops beside its convolutions (TraceLens's MI300 ResNet trace with activation checkpointing:
        # 0.4 ms of its 2.0 ms unknown time, launched outside any op) are elementwise; its implicit GEMMs may not be
        "SubTensorOpWithScalar1d": "memory",
        "SubTensorOpWithCastTensor1d": "memory",
        "Op2dTensorLite": "memory",
        "OpTensorFwdBias": "memory",
        "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta": "unknown",
    }
    ev = []
    for i, name in enumerate(names):
        ev += [launch(1.0 + i, i + 1, 10 + i), kernel(name, 100.0 + 100.0 * i, 50.0, ext=i + 1, corr=10 + i)]
    res = analyse([write_trace(tmp_path / "names.json", ev)])
    got = dict(res.con.execute("SELECT k.name, c.class FROM kernels k JOIN kernel_class c USING (kernel_id)").fetchall())
    assert got == names


def test_int8_gemm_kernel_names_say_int8():
    # a kernel whose op recorded no dtypes is given its precision by its name: CUTLASS's int8 tensor-op GEMM as
    # torch._int_mm runs it on an H200 (sample_traces/h200_hf/blas_forms), cuBLAS's int8 IMMA kernels
    import duckdb

    from plasmient_report import sql

    con = duckdb.connect()
    sql.install(con, "vocab")
    for name in (
        "void cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_128x256_128x3_tn_align16>"
        "(cutlass_80_tensorop_i16832gemm_s8_128x256_128x3_tn_align16::Params)",
        "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64_stage3_warpsize2x2x1_tensor16x8x32_kernel",
        "volta_int8_igemm_imma_128x128_ldg16_nn",
    ):
        assert con.execute("SELECT kernel_name_precision(?)", [name]).fetchone()[0] == "int8", name
    assert con.execute("SELECT kernel_name_precision('sm90_xmma_gemm_bf16bf16_bf16f32')").fetchone()[0] == "bf16"


def test_flash_attn_ops_give_their_kernels_the_attention_flops(tmp_path):
    # Construction: HF's attn_implementation="flash_attention_2" as flash_attn >= 2.6.3 records it — the custom op
    # flash_attn::_flash_attn_forward (q, k, v as (batch, seqlen, heads, head dim), then dropout_p, softmax_scale,
    # causal, window_size_left / right, softcap, alibi_slopes, return_softmax: flash_attn_interface.py) launching
    # FlashAttention 2's kernel, and its backward under the autograd node. Truth: 2·B·H·L·S·(D + D), halved when
    # causal, its backward 2.5× (flops.py's convention).
    b, seq, h, d = 4, 2048, 32, 128
    q = [b, seq, h, d]
    bf16 = ["c10::BFloat16"] * 3
    fwd_concrete = ["", "", "", "0.0", "0.088388347648318433", "True", "-1", "-1", "0.0", "", "False"]
    bwd_concrete = [""] * 9 + ["0.0", "0.088388347648318433", "True", "-1", "-1", "0.0", "", "False", ""]
    ev = [
        annotation("work", 0.0, 3000.0),
        cpu_op(
            "flash_attn::_flash_attn_forward",
            10.0,
            20.0,
            1,
            dims=[q, q, q] + [[]] * 8,
            types=bf16,
            **{"Concrete Inputs": fwd_concrete},
        ),
        launch(12.0, 1, 11),
        kernel(
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >"
            "(Flash_fwd_params)",
            100.0,
            600.0,
            ext=1,
            corr=11,
        ),
        cpu_op("FlashAttnFuncBackward", 40.0, 40.0, 2),
        cpu_op(
            "flash_attn::_flash_attn_backward",
            45.0,
            30.0,
            3,
            dims=[q] * 5 + [[b, h, seq]] + [q] * 3 + [[]] * 9,
            types=["c10::BFloat16"] * 9,
            **{"Concrete Inputs": bwd_concrete},
        ),
        launch(50.0, 3, 12),
        kernel(
            "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
            "cutlass::bfloat16_t> >(Flash_bwd_params)",
            800.0,
            1500.0,
            ext=3,
            corr=12,
        ),
    ]
    res = analyse([write_trace(tmp_path / "fa2.json", ev)], ranges=["work"])
    got = dict(res.con.execute("SELECT substr(name, 6, 9), flops FROM kernels").fetchall())
    fwd = 2 * b * h * seq * seq * (d + d) / 2
    assert got == {"flash_fwd": fwd, "flash_bwd": 2.5 * fwd}
    cls = {n[5:14]: c for n, (c, _) in classes(res).items()}
    assert cls == {"flash_fwd": "compute", "flash_bwd": "compute"}
