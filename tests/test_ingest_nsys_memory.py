"""Nsight Systems device-memory records (`--cuda-memory-usage=true`: CUDA_GPU_MEMORY_USAGE_EVENTS → memory_events,
origin 'driver') on the real H200 recordings of sample_traces/h200_nsys_memory/ (README there). The truth is what
the program measured itself, outside the trace, with torch.cuda's allocator counters (`<name>.truth.json`):
max_memory_reserved / memory_reserved (the caching allocator's segments, i.e. what it holds from the driver),
num_device_alloc / num_device_free (its cudaMalloc / cudaFree calls), and time.time_ns() between phases.

Driver-level vs caching allocator: every cudaMalloc of torch's allocator is one of the report's allocations, but
the report also holds the allocations libraries make themselves (cuBLAS at its first use: 1 KiB + 128 KiB + 64 MiB
on this machine; torch counts 9 cudaMalloc, the report 12). So the driver-level total is torch's reserved plus a
constant the libraries hold for the whole run — the same difference at the peak and at the end — never less."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from plasmient_report import pipeline, store
from plasmient_report.parsers import nsys

from .conftest import sample_file
from .rules.expect import truth

MiB = 2**20
# cuBLAS / cuBLASLt handles and workspaces allocated outside torch's caching allocator: at most this much (the
# recordings hold 1 KiB + 128 KiB + 64 MiB; torch's default cuBLAS(Lt) workspaces are tens of MiB at most).
LIBRARIES_AT_MOST = 128 * MiB
SAMPLES = ("nsys_memory", "nsys_memory_async", "nsys_memory_expand")


@pytest.fixture(scope="module", params=SAMPLES)
def recording(request):
    name = request.param
    res = pipeline.analyse([sample_file(f"h200_nsys_memory/{name}.sqlite")], pipeline.Options())
    yield name, truth(f"h200_nsys_memory/{name}.truth.json"), res
    res.close()


def test_driver_totals_are_torchs_reserved_plus_the_libraries(recording):
    name, t, res = recording
    m = t["memory"]
    (peak,) = res.typed.memory
    assert peak.source == "driver" and peak.absolute  # the whole process was captured: every allocation seen
    assert peak.peak_allocated_bytes is None  # the driver does not see tensors: unknown, never guessed
    assert peak.device_memory_bytes == m["device_total_bytes"]  # TARGET_INFO_GPU.totalMemory = torch total_memory
    end = res.con.execute("SELECT arg_max(reserved_bytes, ts_ns) FROM memory_timeline").fetchone()[0]
    extra_at_peak = peak.peak_reserved_bytes - m["max_reserved_bytes"]
    extra_at_end = end - m["reserved_at_end_bytes"]
    # never below torch's own reserved memory, above it by at most the libraries' own allocations ...
    assert 0 <= extra_at_peak <= LIBRARIES_AT_MOST, (name, extra_at_peak)
    # ... and by the same bytes at the peak and after empty_cache(): memory outside torch's allocator, held
    # throughout — the difference is explained to the byte, not a tolerance.
    assert extra_at_end == extra_at_peak, (name, extra_at_peak, extra_at_end)


def test_native_allocator_calls_match_torchs_counters():
    t = truth("h200_nsys_memory/nsys_memory.truth.json")["memory"]
    res = pipeline.analyse([sample_file("h200_nsys_memory/nsys_memory.sqlite")], pipeline.Options())
    try:
        con = res.con
        allocs, frees, freed = con.execute(
            "SELECT count(*) FILTER (WHERE bytes_delta > 0), count(*) FILTER (WHERE bytes_delta < 0), "
            "-sum(bytes_delta) FILTER (WHERE bytes_delta < 0) FROM memory_events WHERE origin = 'driver'"
        ).fetchone()
        # every cudaFree of the report is torch's (empty_cache() of the ballast and cached segments) ...
        assert frees == t["num_device_free"] == 6
        # ... and every cudaMalloc of torch's is in it, with the libraries' few beside them
        assert t["num_device_alloc"] <= allocs <= t["num_device_alloc"] + 4
        # signed bytes: what empty_cache() gave back is what torch's reserved fell by
        assert freed == t["max_reserved_bytes"] - t["reserved_at_end_bytes"]
        # the ballast (the largest block) is one allocation of the segment torch made for it (rounded to 2 MiB)
        seg = truth("h200_nsys_memory/nsys_memory.truth.json")["segments_before_release"]["sizes_bytes"][0]
        assert con.execute("SELECT max(bytes_delta) FROM memory_events").fetchone()[0] == seg
    finally:
        res.close()


def test_times_are_on_the_stores_clock():
    """Each record lies inside the CUDA call that made it (api_calls, same thread: cudaMalloc, cudaFree,
    cuMemSetAccess, cudaMallocAsync …), and the ballast's cudaMalloc between the program's time.time_ns() marks."""
    t = truth("h200_nsys_memory/nsys_memory.truth.json")
    res = pipeline.analyse([sample_file("h200_nsys_memory/nsys_memory.sqlite")], pipeline.Options())
    try:
        con = res.con
        outside = con.execute("""
            SELECT count(*) FROM memory_events m WHERE NOT EXISTS (
                SELECT 1 FROM api_calls a WHERE a.thread = m.thread AND a.start_ns <= m.ts_ns AND m.ts_ns <= a.end_ns
                  AND regexp_matches(a.name, 'Malloc|Free|cuMem'))""").fetchone()[0]
        assert outside == 0
        snaps = {s["tag"]: s["wall_ns"] for s in t["snapshots"]}
        ballast_ns = con.execute("SELECT arg_max(ts_ns, bytes_delta) FROM memory_events").fetchone()[0]
        assert snaps["after_first_step"] < ballast_ns < snaps["after_warmup"]
        # the 1 GiB block of the last step: inside the third train_step range (NVTX, the same clock)
        (lo, hi) = con.execute(
            "SELECT start_ns, end_ns FROM ranges WHERE name = 'train_step' ORDER BY start_ns LIMIT 1 OFFSET 2"
        ).fetchone()
        assert con.execute(f"SELECT count(*) FROM memory_events WHERE bytes_delta = {2**30}").fetchone()[0] == 1
        assert lo <= con.execute(f"SELECT ts_ns FROM memory_events WHERE bytes_delta = {2**30}").fetchone()[0] <= hi
    finally:
        res.close()


def test_pool_and_mapped_pages():
    """cudaMallocAsync: the process's memory is the pool's size (localMemoryPoolSize), not the sum of the blocks it
    hands out; expandable segments: mapped pages (cuMemSetAccess / cuMemUnmap), 20 MiB each."""
    con = store.connect()
    try:
        nsys.ingest(sample_file("h200_nsys_memory/nsys_memory_async.sqlite"), con, 0)
        # after a cudaFreeAsync the pool keeps the block: the process holds more than its live blocks add up to
        kept = con.execute("""
            SELECT count(*) FILTER (WHERE blocks < total_reserved) FROM (
                SELECT total_reserved, sum(bytes_delta) OVER (ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) AS blocks
                FROM memory_events)""").fetchone()[0]
        assert kept > 0
        con.execute("DELETE FROM memory_events")
        nsys.ingest(sample_file("h200_nsys_memory/nsys_memory_expand.sqlite"), con, 1)
        sizes = con.execute("SELECT DISTINCT abs(bytes_delta) FROM memory_events WHERE thread IS NOT NULL").fetchall()
        assert (20 * MiB,) in sizes
    finally:
        con.close()


def copy(tmp: Path, name: str) -> Path:
    dst = tmp / f"{name}.sqlite"
    shutil.copyfile(sample_file(f"h200_nsys_memory/{name}.sqlite"), dst)
    return dst


def test_unknown_when_the_capture_began_after_the_process(tmp_path):
    """Construction from the real report: move the process's diagnostics before 'Profiling has started' (what a
    capture range or --delay gives: sample_traces/h200_hf/llama_nsys.sqlite's process starts 18.8 s before it).
    Its allocations before the capture are then not in the report: the total is unknown (NULL), sizes kept."""
    path = copy(tmp_path, "nsys_memory")
    with sqlite3.connect(path) as sq:
        sq.execute("UPDATE DIAGNOSTIC_EVENT SET timestamp = timestamp - 10000000000 WHERE globalPid > 0")
    con = store.connect()
    try:
        info = nsys.ingest(path, con, 0)
        n, totals = con.execute("SELECT count(*), count(total_reserved) FROM memory_events").fetchone()
        assert n == 18 and totals == 0
        assert any("capture began after the process" in x for x in info.notes)
    finally:
        con.close()


def test_unknown_when_a_free_has_no_allocation(tmp_path):
    # the ballast's allocation removed: its free is of a block the report never saw allocated
    path = copy(tmp_path, "nsys_memory")
    with sqlite3.connect(path) as sq:
        sq.execute(
            "DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memoryOperationType = 0 AND bytes = "
            "(SELECT max(bytes) FROM CUDA_GPU_MEMORY_USAGE_EVENTS)"
        )
    con = store.connect()
    try:
        info = nsys.ingest(path, con, 0)
        assert con.execute("SELECT count(total_reserved) FROM memory_events").fetchone()[0] == 0
        assert any("never saw allocated" in x for x in info.notes)
    finally:
        con.close()


@pytest.mark.parametrize("rel", ["h200_hf/llama_nsys.sqlite", "h200_single/nsys_single.sqlite"])
def test_reports_without_the_table_are_unchanged(rel):
    # recorded without --cuda-memory-usage: no CUDA_GPU_MEMORY_USAGE_EVENTS table, no memory rows, no note
    path = sample_file(rel)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as sq:
        assert not sq.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUDA_GPU_MEMORY_USAGE_EVENTS'").fetchall()
    con = store.connect()
    try:
        info = nsys.ingest(path, con, 0)
        assert con.execute("SELECT count(*) FROM memory_events").fetchone()[0] == 0
        assert not [x for x in info.notes if "memory" in x]
    finally:
        con.close()
