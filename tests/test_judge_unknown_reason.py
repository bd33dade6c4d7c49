"""What the verdict says to give for unknown work names its reason: convolutions whose stride and padding the trace
does not record (a torch 1.9 ResNet50 trace of the kineto repo: all its unknown time was cuDNN convolutions with
shapes but no Concrete Inputs) are said as such, not as "custom, compiled or library kernels"."""

from __future__ import annotations

from plasmient_report import judge, pipeline

from .conftest import cpu_op, kernel, launch, write_trace
from .rules.expect import analyse


def _note(tmp_path, op: str, kname: str, concrete: list | None) -> str:
    # Construction: one op with shapes launching one 500 µs kernel nothing estimates (truth: the op is a convolution
    # with shapes and, or not, its stride / padding; or a custom op).
    extra = {"Concrete Inputs": concrete} if concrete is not None else {}
    ev = [cpu_op(op, 0.0, 20.0, 1, dims=[[32, 64, 56, 56], [64, 64, 3, 3]], types=["float", "float"], **extra)]
    ev += [launch(5.0, ext=1, corr=1), kernel(kname, 10.0, 500.0, ext=1, corr=1)]
    v = analyse([write_trace(tmp_path / f"{op.replace(':', '_')}.json", ev)], write_html=False, write_trace=False)
    (said,) = [n for n in v["notes"] if "FLOP estimate" in n]
    return said


def test_convolutions_without_stride_and_padding_are_named(tmp_path):
    said = _note(tmp_path, "aten::cudnn_convolution", "void implicit_convolve_sgemm<float, float>(int)", None)
    assert "100% of that time is convolutions" in said and "stride and padding" in said, said


def test_other_unknown_work_keeps_its_reason(tmp_path):
    said = _note(tmp_path, "my::custom_op", "my_fused_kernel", None)
    assert "stride and padding" not in said and "custom, compiled or library kernels" in said, said


def test_an_op_named_convert_is_no_convolution(tmp_path):
    # aten::_convert_weight... / a custom `convert` op has "conv" in its name but is no convolution
    said = _note(tmp_path, "my::convert_layout", "my_fused_kernel", None)
    assert "stride and padding" not in said and "custom, compiled or library kernels" in said, said


def test_an_nsys_trace_is_not_told_to_record_with_a_newer_torch(tmp_path):
    # The same construction, its source said to be an nsys export (nsys's NVTX shape ranges never carry argument
    # values: no torch records a convolution's stride / padding there): the reason stands, the advice of a newer
    # torch does not.
    op, kname = "aten::cudnn_convolution", "void implicit_convolve_sgemm<float, float>(int)"
    ev = [cpu_op(op, 0.0, 20.0, 1, dims=[[32, 64, 56, 56], [64, 64, 3, 3]], types=["float", "float"])]
    ev += [launch(5.0, ext=1, corr=1), kernel(kname, 10.0, 500.0, ext=1, corr=1)]
    res = pipeline.analyse([write_trace(tmp_path / "conv.json", ev)], pipeline.Options(write_html=False, write_trace=False))
    try:
        kineto = judge.give_flops(res.con)
        res.con.execute("UPDATE sources SET format = 'nsys-sqlite'")
        nsys = judge.give_flops(res.con)
    finally:
        res.close()
    assert "newer torch" in kineto and "Concrete Inputs" in kineto, kineto
    assert "100% of that time is convolutions" in nsys and "newer torch" not in nsys and "Concrete" not in nsys, nsys


def test_graph_replays_are_named_and_not_told_to_record_shapes():
    # sample_traces/h200_hf/cuda_graph: an HF Llama forward captured once into a CUDA graph and replayed 5 times
    # (cuda_graph.truth.json "replays": 5) under the profiler with record_shapes=True. A replayed kernel has no op,
    # so its GEMMs have no shapes however the trace was recorded: recording shapes again would not help.
    from .conftest import sample_file

    v = analyse([sample_file("h200_hf/cuda_graph.pt.trace.json.gz")], write_html=False, write_trace=False)
    (said,) = [n for n in v["notes"] if "FLOP estimate" in n]
    assert "replayed from CUDA graphs (cudaGraphLaunch)" in said and "without graphs" in said, said
    (line,) = [x for x in v["losses"] if x["category"] == "unknown_flops"]
    assert "replayed from graphs" in line["recommendation"] and "record shapes" not in line["recommendation"], line
    # the headline's hint points to the note, not to recording shapes
    from plasmient_report.render._format import achieved_why

    assert "record shapes" not in (achieved_why(v) or "")
