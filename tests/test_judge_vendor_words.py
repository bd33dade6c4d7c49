"""The waterfall speaks the program's runtime: a HIP program's launch-bound line advises HIP graphs, not CUDA graphs
(TraceLens's MI300X traces read "CUDA graphs / torch.compile")."""

from __future__ import annotations

import pytest

from .conftest import cpu_op, kernel, write_trace
from .rules.expect import analyse
from .rules.traces import runtime


@pytest.mark.parametrize(("call", "api"), [("hipLaunchKernel", "HIP"), ("cudaLaunchKernel", "CUDA")])
def test_the_launch_bound_line_names_the_programs_graphs(tmp_path, call: str, api: str) -> None:
    # Construction: 200 aten::add ops, each launching a 2 µs kernel 10 µs after the last: launch-bound by design.
    ev = []
    for i in range(200):
        t = 12.0 * i
        ev += [cpu_op("aten::add", t, 9.0, i + 1), runtime(call, t + 1.0, 7.0, corr=i + 1, ext=i + 1)]
        ev += [kernel("elementwise_kernel", t + 9.0, 2.0, ext=i + 1, corr=i + 1)]
    v = analyse([write_trace(tmp_path / f"{api}.json", ev)], write_html=False, write_trace=False)
    (line,) = [x for x in v["losses"] if x["category"] == "launch_bound"]
    assert f"{api} graphs" in line["recommendation"], line
    other = "CUDA" if api == "HIP" else "HIP"
    assert f"{other} graphs" not in line["recommendation"], line


@pytest.mark.parametrize(("pytorch", "side"), [(True, "Python side"), (False, "host side")])
def test_the_host_line_names_python_only_for_a_pytorch_program(pytorch: bool, side: str) -> None:
    # An nsys report of a C / CUDA program (llm.c's GPT-2 training on a T4, a public report) was told to "profile
    # the Python side"; a program the trace shows to be PyTorch's (`program.pytorch`: its ops, kernels or ranges) is.
    from plasmient_report import judge, store

    u = judge.UnknownWork(api="CUDA", pytorch=pytorch, has_shapes=False, graph_share=0.0, training=None)
    line = judge.generic_advice(store.connect(), u)["host_other"]
    assert side in line and ("Python" in line) == pytorch, line
