"""`plasmient-report measure`: the one-line refusals (no torch, no CUDA, no NVML, a bad GPU index, a bad --out),
and the command's wiring on the committed recording `sample_traces/h200_measure/` (made with the command itself on
an H200; its truth — analytic FLOPs, unprofiled step times, measured ceilings — is in its measure.json)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plasmient_report.cli import main
from plasmient_report.workloads import report

from . import contract
from .conftest import sample_file


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["measure", *args])


def _one_line_error(r: Any) -> str:
    assert r.exit_code == 2, r.output
    line = contract.one_line(r.output)
    assert line.startswith("plasmient-report: error: "), r.output
    return line


def _fake_torch(available: bool = True, count: int = 1, cuda_build: str | None = "13.0") -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.99.0+fake"  # type: ignore[attr-defined]
    torch.version = types.SimpleNamespace(cuda=cuda_build)  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: count)  # type: ignore[attr-defined]
    return torch


def _fake_pynvml(init_error: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        if init_error:
            raise NVMLError("Driver Not Loaded")

    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.nvmlInit = init  # type: ignore[attr-defined]
    return nv


def test_without_torch_one_line_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    line = _one_line_error(_invoke())
    assert "torch is not installed" in line and "plasmient-report[measure]" in line


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "pynvml", None)
    line = _one_line_error(_invoke("--workload", "matmul"))
    assert "nvidia-ml-py" in line and "pynvml is not importable" in line


@pytest.mark.parametrize("cuda_build, says", [(None, "a CPU-only build"), ("13.0", "built for CUDA 13.0")])
def test_without_a_gpu(monkeypatch: pytest.MonkeyPatch, cuda_build: str | None, says: str) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False, cuda_build=cuda_build))
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    line = _one_line_error(_invoke())
    assert "measure needs a CUDA GPU" in line and says in line and "sees none" in line


def test_without_the_driver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=True))
    assert "Driver Not Loaded" in _one_line_error(_invoke())


def test_gpu_index_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(count=1))
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    assert "--gpu-index 3: PyTorch sees 1 GPU (indices 0 to 0)" in _one_line_error(_invoke("--gpu-index", "3"))


def test_bad_seconds_and_an_unrelated_out_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "--seconds" in _one_line_error(_invoke("--seconds", "0"))
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert "holds no earlier measure recording" in _one_line_error(_invoke("--out", str(mine)))
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_from_a_folder_that_is_no_recording(tmp_path: Path) -> None:
    assert "not a measure recording" in _one_line_error(_invoke("--from", str(tmp_path)))
    (tmp_path / "measure.json").write_text(json.dumps({"schema": "something/else"}))
    assert "not a measure recording" in _one_line_error(_invoke("--from", str(tmp_path)))
    assert "no such folder" in _one_line_error(_invoke("--from", str(tmp_path / "absent")))


def test_the_truth_is_analytic_flops_over_unprofiled_time() -> None:
    # 2·8192³ FLOP in 1.4 ms on a 989.4 TFLOP/s peak (H200 SXM bf16 dense, datasheet) = 0.7937
    w = {"flops_per_step": 2.0 * 8192**3, "unprofiled_step_s": 1.4e-3}
    assert report.expected_fraction(w, 989.4) == pytest.approx(2.0 * 8192**3 / 1.4e-3 / 989.4e12)
    assert report.expected_fraction(w, None) is None
    assert report.expected_fraction({"flops_per_step": 1.0}, 989.4) is None


def test_workload_flops_follow_the_conventions() -> None:
    torch = pytest.importorskip("torch")  # the [measure] extra; CI runs without it
    from plasmient_report.workloads import kernels

    assert kernels.Matmul("cpu", 64).flops_per_step == 2 * 64**3
    m = kernels.Memory("cpu", 1 << 12)
    assert (m.flops_per_step, m.bytes_per_step) == (2 * 1024, 2 * 2 * 1024 * 4)
    # causal attention keeps L·(L+1)/2 of the L² scores: 4·B·H·L²·D · (L+1)/(2L)
    a = kernels.Attention("cpu", batch=1, heads=2, seq=8, head_dim=4)
    assert a.flops_per_step == pytest.approx(4 * 1 * 2 * 8 * 8 * 4 * (9 / 16))
    a.step()  # runs (on CPU here)
    assert torch.is_tensor(a.q)


@pytest.mark.slow
def test_measure_from_the_committed_recording(tmp_path: Path) -> None:
    """The command's wiring on what it recorded on an H200 (`measure --seconds 0.02`): four workloads through the
    pipeline, a box each, the ceilings and the summary; numbers against the recording's own truth."""
    import duckdb

    from plasmient_report.workloads import NAMES

    rec = sample_file("h200_measure/measure.json").parent
    watch = contract.Watch([], rec)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["measure", "--from", str(rec), "--out", str(out), "--no-trace"])
    assert r.exit_code == 0, r.output
    assert r.output.count("GPU utilization (trace)") == len(NAMES) and "bf16 GEMM" in r.output
    assert "memory copy" in r.output and "what the dashboard shows, and what the GPU did" in r.output
    rows = {w["workload"]: w for w in json.loads((out / "summary.json").read_text())["workloads"]}
    assert sorted(rows) == sorted(NAMES)
    # Truth (measure.json): analytic FLOPs per step over the unprofiled CUDA-event step time, against the same
    # datasheet peak (989.4 TFLOP/s bf16, H200 SXM). Long tensor-core kernels: the profiler adds next to nothing,
    # so the trace's achieved fraction is within 10% of it.
    for w in ("matmul", "attention"):
        assert rows[w]["peak_tflops"] == pytest.approx(989.4)
        assert rows[w]["achieved_fraction_of_peak"] == pytest.approx(rows[w]["expected_fraction_of_peak"], rel=0.10)
    # The cause named is the bound built in: HBM traffic, launch latency (achieved ≈ 0: no tensor-core FLOPs).
    assert rows["memory"]["largest_loss"] == "memory_bound" and rows["launch"]["largest_loss"] == "launch_bound"
    for w in ("memory", "launch"):
        assert (rows[w]["achieved_fraction_of_peak"] or 0.0) < 0.001
    # The launch loop leaves the GPU mostly idle: kernels are ~1 µs behind ~10 µs launches.
    assert rows["launch"]["trace_utilization"] < 0.2 < rows["memory"]["trace_utilization"]
    for w in NAMES:
        assert (out / w / "verdict.json").is_file() and (out / w / "report.html").is_file()
        con = duckdb.connect(str(out / w / "run.duckdb"), read_only=True)
        try:  # the NVML samples were read beside the trace (what the dashboard shows)
            (n,) = con.execute(
                "SELECT count(*) FROM counters JOIN sources USING (source_id) "
                "WHERE sources.format = 'nvml-csv' AND metric = 'gpu_util'"
            ).fetchone()
        finally:
            con.close()
        assert n > 0
    watch.check()  # the recording is untouched: every file's bytes, nothing added
