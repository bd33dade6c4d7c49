"""trace.pftrace's device-memory counter tracks and the collectives' numbers on their slices, read back with the
perfetto package's protobuf classes, against the samples' truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plasmient_report import pipeline
from plasmient_report.render import perfetto

from .conftest import counter_value, sample_file


def written(inputs: list[Path], out: Path) -> list:
    res = pipeline.analyse(inputs, pipeline.Options())
    perfetto.write(res.con, res.verdict, out)
    return list(perfetto.read_back(out))


def memory_series(packets: list) -> dict[str, list[float]]:
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in packets if p.HasField("track_descriptor")}
    out: dict[str, list[float]] = {}
    for p in packets:
        if p.HasField("track_event") and "memory" in names.get(p.track_event.track_uuid, ""):
            out.setdefault(names[p.track_event.track_uuid], []).append(counter_value(p.track_event))
    return out


@pytest.fixture(scope="module")
def memory_truth():
    return json.loads(sample_file("h200_hf/llama_memory.truth.json").read_text())["memory"]


def test_memory_counter_tracks(tmp_path: Path, memory_truth) -> None:
    series = memory_series(written([sample_file("h200_hf/llama_memory.pt.trace.json.gz")], tmp_path / "t.pftrace"))
    alloc = series["GPU 0 memory allocated (MiB)"]
    reserved = series["GPU 0 memory reserved (MiB)"]
    # every allocator event is a sample; the peaks are torch.cuda's own max_memory_allocated / max_memory_reserved
    assert len(alloc) == len(reserved) == 1924
    assert max(alloc) * 2**20 == memory_truth["max_allocated_bytes"]
    assert max(reserved) * 2**20 == memory_truth["max_reserved_bytes"]


def test_memory_binned_keeps_the_peak(tmp_path: Path, memory_truth, monkeypatch) -> None:
    monkeypatch.setattr(perfetto, "MAX_MEMORY_SAMPLES", 100)
    series = memory_series(written([sample_file("h200_hf/llama_memory.pt.trace.json.gz")], tmp_path / "t.pftrace"))
    (name,) = [n for n in series if "allocated" in n]
    assert "the most in each" in name and len(series[name]) <= 100
    assert max(series[name]) * 2**20 == memory_truth["max_allocated_bytes"]


def test_driver_memory_records_give_a_reserved_track_only(tmp_path: Path) -> None:
    """nsys --cuda-memory-usage=true (h200_nsys_memory): CUDA's allocation records know the memory the process holds
    from the driver, not what tensors hold — one reserved track, no (empty) allocated one. Truth: torch.cuda's
    max_memory_reserved in the same run; the driver also counts the libraries' own cudaMallocs (cuBLAS workspaces:
    67,240,960 B here, never freed — sample_traces/h200_nsys_memory/README.md), so the peak is at most 128 MiB above."""
    truth = json.loads(sample_file("h200_nsys_memory/nsys_memory.truth.json").read_text())["memory"]
    series = memory_series(written([sample_file("h200_nsys_memory/nsys_memory.sqlite")], tmp_path / "t.pftrace"))
    assert list(series) == ["GPU 0 memory reserved (MiB)"]
    peak = max(series["GPU 0 memory reserved (MiB)"]) * 2**20
    assert truth["max_reserved_bytes"] <= peak <= truth["max_reserved_bytes"] + (128 << 20)


def test_collective_slices_carry_wait_bandwidth_and_lateness(tmp_path: Path) -> None:
    """DDP on 2 H200s (ground truth: rank 1 sleeps 30 ms before every backward): rank 1's first bucket all-reduce of
    each step is ~30 ms late; the slices carry the bus bandwidth the collectives table reports."""
    truth = json.loads(sample_file("h200x2_ddp/ground_truth.json").read_text())
    packets = written([sample_file("h200x2_ddp/kineto")], tmp_path / "t.pftrace")
    iids = {d.iid: d.name for p in packets if p.HasField("interned_data") for d in p.interned_data.debug_annotation_names}
    slices = []
    for p in packets:
        if p.HasField("track_event"):
            args = {iids[a.name_iid]: a for a in p.track_event.debug_annotations}
            if "busbw_gb_s" in args:
                slices.append(
                    {
                        k: (
                            a.int_value
                            if a.HasField("int_value")
                            else a.double_value
                            if a.HasField("double_value")
                            else a.string_value
                        )
                        for k, a in args.items()
                    }
                )
    assert len(slices) == truth["allreduce_per_step_expected"] * truth["profiled_steps"] * truth["world_size"]
    late = sorted(s["lateness_ns"] for s in slices)[-truth["profiled_steps"] :]
    assert all(x == pytest.approx(truth["late_sleep_s"] * 1e9, rel=0.1) for x in late)
    assert {s["link"] for s in slices} == {"NVLink 4 (18 links)"}
    assert all(s["wait_ns"] + s["transfer_ns"] > 0 and s["busbw_gb_s"] > 0 for s in slices)
