"""Device memory from the allocator's records (sql/memory.sql, verdict `memory`): the peaks per GPU against the
program's own torch.cuda.max_memory_allocated / max_memory_reserved (sample_traces/h200_hf/llama_memory.truth.json)."""

from __future__ import annotations

import json

import pytest

from plasmient_report import pipeline

from .conftest import sample_file


@pytest.fixture(scope="module")
def run():
    return pipeline.analyse([sample_file("h200_hf/llama_memory.pt.trace.json.gz")], pipeline.Options())


@pytest.fixture(scope="module")
def truth():
    return json.loads(sample_file("h200_hf/llama_memory.truth.json").read_text())["memory"]


def test_peaks_match_the_allocators_own_counters(run, truth):
    (m,) = run.typed.memory
    # The trace's totals are the caching allocator's: its peaks are exactly what torch.cuda reported.
    assert m.peak_allocated_bytes == truth["max_allocated_bytes"]
    assert m.peak_reserved_bytes == truth["max_reserved_bytes"]
    assert m.allocated_at_start_bytes == truth["allocated_at_step_start_bytes"]
    assert m.reserved_at_start_bytes == truth["reserved_at_step_start_bytes"]
    assert m.device_memory_bytes == truth["device_total_bytes"]
    assert m.peak_reserved_fraction == pytest.approx(truth["max_reserved_bytes"] / truth["device_total_bytes"])
    assert m.absolute and m.source == "allocator"
    # the allocator events belong to the rank of their trace (the align stage numbers them with the rest)
    assert m.rank == 0 and m.device == 0


def test_peak_is_inside_the_step(run):
    """One profiled training step: activations peak between the forward and the backward, inside the profile."""
    (m,) = run.typed.memory
    ((lo, hi),) = run.con.execute("SELECT start_ns, end_ns FROM rank_span").fetchall()
    assert lo <= m.first_ns < m.peak_allocated_ns < m.last_ns <= hi
    # allocated rises from its start to the peak and falls back by the end of the step
    assert m.allocated_at_start_bytes < m.peak_allocated_bytes and m.allocated_at_end_bytes < m.peak_allocated_bytes


def test_timeline_is_the_allocators_series(run, truth):
    rows = run.con.execute(
        "SELECT count(*), max(allocated_bytes), max(reserved_bytes), bool_and(absolute) FROM memory_timeline"
    ).fetchone()
    assert rows == (run.typed.memory[0].events, truth["max_allocated_bytes"], truth["max_reserved_bytes"], True)


def test_no_memory_section_without_profile_memory():
    r = pipeline.analyse([sample_file("h200_hf/llama_generate.pt.trace.json.gz")], pipeline.Options())
    assert r.typed.memory == []
