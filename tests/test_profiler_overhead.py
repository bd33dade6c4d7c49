"""The profiler's own overhead (Kineto `overhead` events: CUPTI's overhead records) is read into `profiler_overhead`;
the GPU idle under a set-up one is start-up, not the host op that happened to be running: the profiler's own when
CUPTI asks for its activity buffers, the program's when the driver loads a module lazily at a kernel's first launch.
Found on a public A100 trace (JeremyMorlier/GPUModel, five fp16 GEMMs): 1.83 ms of its 2.14 ms idle gap was an
`Activity Buffer Request`, read as "host other 90%: host in aten::matmul"."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plasmient_report import pipeline

from .conftest import BASE, cpu_op, kernel, launch, sample_file, write_trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _overhead(name: str, ts: float, dur: float) -> dict:
    # as Kineto writes CUPTI's overhead records: on no thread of the program
    return {"ph": "X", "cat": "overhead", "name": name, "pid": -1, "tid": 0, "ts": ts, "dur": dur}


def _idle_under(ev: list[dict], lo: float, hi: float) -> float:
    """µs of [lo, hi) with no GPU activity, from the file's own events (the truth)."""
    busy = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    covered, at = 0.0, lo
    for s, e in busy:
        s, e = max(s, at), min(e, hi)
        if e > s:
            covered += e - s
            at = e
    return (hi - lo) - covered


def test_the_gpu_idle_under_a_buffer_request_is_the_profilers_start_up() -> None:
    # Our attention recording (H200, torch 2.9): CUPTI asked for its first activity buffer 413 µs into the profile,
    # for 511 µs, inside the first SDPA call on the host. Truth: the overhead event and the GPU activities, read with
    # json; the store must hold the event as recorded and class every idle µs under it start-up.
    path = sample_file("h200_measure/attention/attention.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    over = [e for e in ev if e.get("cat") == "overhead" and e.get("ph") == "X"]
    assert [e["name"] for e in over] == ["Activity Buffer Request"]  # (what makes this recording the case)
    (o,) = over
    idle_us = _idle_under(ev, o["ts"], o["ts"] + o["dur"])
    assert idle_us > 100  # (the GPU was idle under it)
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        rows = res.con.execute("SELECT name, start_ns, end_ns FROM profiler_overhead").fetchall()
        base = doc["baseTimeNanoseconds"]
        assert [r[0] for r in rows] == ["Activity Buffer Request"]
        # (µs floats with 3 decimals to ns: within 1 ns of rounding each)
        assert abs(rows[0][1] - (base + o["ts"] * 1e3)) <= 1 and abs(rows[0][2] - (base + (o["ts"] + o["dur"]) * 1e3)) <= 2
        s, e = rows[0][1], rows[0][2]
        by_cat = dict(
            res.con.execute(
                """SELECT category, sum(least(end_ns, ?) - greatest(start_ns, ?)) FROM stretches
                   WHERE scope = 'window' AND NOT busy AND start_ns < ? AND end_ns > ? GROUP BY category""",
                [e, s, e, s],
            ).fetchall()
        )
        assert set(by_cat) == {"startup"}, by_cat
        assert by_cat["startup"] == pytest.approx(idle_us * 1e3, abs=2_000)  # ±2 µs: the sweep's ns against µs floats
        assert res.typed is not None
        (gap,) = [f for f in res.typed.findings if f.rule == "PR504" and f.category == "startup"]
        assert "profiler: Activity Buffer Request" in gap.title and "the profiler's own set-up" in gap.recommendation
    finally:
        res.close()


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("Activity Buffer Request", "profiler: Activity Buffer Request"),
        ("Lazy Function Loading", "Lazy Function Loading"),
        ("Buffer Flush", None),
    ],
)
def test_only_set_up_is_start_up(tmp_path: Path, name: str, said: str | None) -> None:
    # The public A100 trace's shape: aten::mm on the host 0–2,200 µs, the overhead record 300–2,100 µs inside it,
    # the launch at 2,150 µs and its GEMM at 2,200–2,220 µs; then a second GEMM after a 5 µs launch gap.
    # A buffer request is the profiler setting up: its 1,800 µs are start-up, the profiler's (not paid unprofiled).
    # Lazy function loading is the driver loading the kernel's module at its first launch (CUDA's lazy loading):
    # start-up the program pays unprofiled too, so not called the profiler's. A buffer flush recurs while the
    # profiler records: not start-up (the host op's time stays the host's, as before).
    startup = said is not None
    ev = [cpu_op("aten::mm", 0.0, 2200.0, 1), _overhead(name, 300.0, 1800.0), launch(2150.0, ext=1, corr=1)]
    ev += [kernel("sm80_xmma_gemm_f16f16", 2200.0, 20.0, ext=1, corr=1)]
    ev += [
        cpu_op("aten::mm", 2221.0, 10.0, 2),
        launch(2222.0, ext=2, corr=2),
        kernel("sm80_xmma_gemm_f16f16", 2225.0, 20.0, ext=2, corr=2),
    ]
    path = write_trace(tmp_path / "t.json", ev, gpu="NVIDIA A100-SXM4-80GB")
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        (n,) = res.con.execute("SELECT count(*) FROM profiler_overhead WHERE name = ?", [name]).fetchone()
        assert n == 1
        lo, hi = BASE + 300_000, BASE + 2_100_000
        (ns,) = res.con.execute(
            """SELECT coalesce(sum(least(end_ns, ?) - greatest(start_ns, ?)), 0) FROM stretches
               WHERE scope = 'window' AND category = 'startup' AND start_ns < ? AND end_ns > ?""",
            [hi, lo, hi, lo],
        ).fetchone()
        assert ns == (1_800_000 if startup else 0), ns
        assert res.typed is not None
        found = [f for f in res.typed.findings if f.rule == "PR504" and f.category == "startup"]
        if said is None:
            assert not found
        else:
            (gap,) = found
            assert said in gap.title and ("profiler: " in gap.title) == said.startswith("profiler: "), gap.title
            assert ("the profiler's own set-up" in gap.recommendation) == said.startswith("profiler: ")
    finally:
        res.close()


def test_a_buffer_requested_mid_run_is_the_profilers_overhead_not_start_up(tmp_path: Path) -> None:
    # A construction: a GEMM at 0–20 µs, then aten::mm on the host 30–2,230 µs with CUPTI requesting another
    # activity buffer 300–2,100 µs inside it (as it does when one fills: 1.9 ms mid-run in our kineto_single
    # recording), the launch at 2,180 µs and its GEMM at 2,230 µs. The 2.2 ms idle gap is past the first GPU
    # activity: not start-up ("profile after warm-up" would not remove it), but the profiler's overhead, named so.
    ev = [cpu_op("aten::mm", 0.0, 15.0, 1), launch(5.0, ext=1, corr=1)]
    ev += [kernel("sm80_xmma_gemm_f16f16", 10.0, 10.0, ext=1, corr=1)]
    ev += [cpu_op("aten::mm", 30.0, 2200.0, 2), _overhead("Activity Buffer Request", 300.0, 1800.0)]
    ev += [launch(2180.0, ext=2, corr=2), kernel("sm80_xmma_gemm_f16f16", 2230.0, 20.0, ext=2, corr=2)]
    path = write_trace(tmp_path / "t.json", ev, gpu="NVIDIA A100-SXM4-80GB")
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        lo, hi = BASE + 300_000, BASE + 2_100_000
        (ns,) = res.con.execute(
            """SELECT coalesce(sum(least(end_ns, ?) - greatest(start_ns, ?)), 0) FROM stretches
               WHERE scope = 'window' AND category = 'startup' AND start_ns < ? AND end_ns > ?""",
            [hi, lo, hi, lo],
        ).fetchone()
        assert ns == 0
        assert res.typed is not None
        found = [f for f in res.typed.findings if f.rule == "PR504"]
        assert [f.category for f in found if f.category == "startup"] == []
        (gap,) = found
        (line,) = gap.evidence["gaps"]
        assert line["host_call"] == "profiler: Activity Buffer Request", line
        assert "profiler's own overhead" in gap.fix and "not paid unprofiled" in gap.fix, gap.fix
    finally:
        res.close()


@pytest.mark.parametrize("rel", ["sample:h200_hf/llama_nsys.sqlite", "corpus:h200-single-nsys/nsys_small.sqlite"])
def test_an_nsys_exports_overhead_records_are_read(rel: str) -> None:
    # nsys writes CUPTI's overhead records (CUPTI_ACTIVITY_KIND_OVERHEAD) and its own (PROFILER_OVERHEAD: its CUDA
    # profiling initialization, buffer flushes, instrumentation). Truth: the export's rows, read with sqlite3,
    # named through StringIds; their durations to the ns.
    import sqlite3

    from .conftest import corpus_file

    kind, name = rel.split(":")
    path = sample_file(name) if kind == "sample" else corpus_file(name)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    want: list[tuple[str, int]] = []
    for t in ("CUPTI_ACTIVITY_KIND_OVERHEAD", "PROFILER_OVERHEAD"):
        if t in tables:
            want += db.execute(
                f"SELECT coalesce(s.value, 'unknown'), o.\"end\" - o.start FROM {t} o "
                'LEFT JOIN StringIds s ON s.id = o.nameId WHERE o."end" > o.start'
            ).fetchall()
    db.close()
    assert want  # (what makes the export the case)
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        got = res.con.execute("SELECT name, end_ns - start_ns FROM profiler_overhead").fetchall()
        assert sorted(got) == sorted(want)
        # nsys's own initialization, where recorded, is the profiler's set-up (named so where the GPU idles under it)
        inits = [n for n, _ in want if "profiling initialization" in n]
        named = {r[0] for r in res.con.execute("SELECT name FROM host_activity WHERE kind = 'startup'").fetchall()}
        assert all(f"profiler: {n}" in named for n in inits), (inits, named)
    finally:
        res.close()
