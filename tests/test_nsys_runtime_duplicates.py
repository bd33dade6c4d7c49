"""Some nsys exports write each CUDA runtime call twice, under event classes 0 and 67 (the same thread and
correlation id, `cudaMemcpy_v3020` and `cudaMemcpy`, one interval around the other): one call each in the store.
Found on a public Perlmutter export (pipit's saxpy-mpi): PR403 said "30 synchronous memcpy calls (host blocked
748.7 ms)" of 15 calls, 374.3 ms."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from plasmient_report import pipeline

from .conftest import corpus_file, sample_file


def _calls(path: Path) -> dict[str, int]:
    """Truth, read with sqlite3: one call per (thread, correlation id, name without its _vNNNN suffix)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT r.globalTid, r.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds s ON s.id = r.nameId"
    ).fetchall()
    db.close()
    seen, out = set(), {}
    for tid, corr, name in rows:
        name = re.sub(r"_v[0-9]+$", "", name or "unknown")
        key = (tid, corr, name)
        if corr is not None and key in seen:
            continue
        seen.add(key)
        out[name] = out.get(name, 0) + 1
    return out


@pytest.mark.parametrize(
    "where", ["corpus:public-nsys-pipit-saxpy-mpi/saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "sample:h200_hf/llama_nsys.sqlite"]
)
def test_each_runtime_call_is_one_row(where: str) -> None:
    kind, rel = where.split(":")
    path = corpus_file(rel) if kind == "corpus" else sample_file(rel)
    want = _calls(path)
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        got = dict(res.con.execute("SELECT name, count(*) FROM api_calls WHERE kind <> 'osrt' GROUP BY name").fetchall())
    finally:
        res.close()
    assert got == want
    if kind == "corpus":
        assert want["cudaMemcpy"] == 15  # (what makes this export the case: 30 rows in the file)


def test_a_driver_helper_threads_os_calls_do_not_name_a_gap() -> None:
    # pipit's public cloverleaf export (A100, --trace=osrt): CUDA's event-handler thread (`cuda-EvtHandlr`) sits in
    # poll() through every gap, while the program's thread does the work; PR504 said "host in poll for 100% of it".
    # Truth, read with sqlite3: the thread of the long polls makes no CUDA runtime call.
    path = corpus_file("public-nsys-pipit-cloverleaf/perlmutter-cloverleaf-cuda.sqlite")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cuda_threads = {r[0] for r in db.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    poll_threads = {
        r[0]
        for r in db.execute(
            "SELECT DISTINCT o.globalTid FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
            "WHERE s.value = 'poll' AND o.\"end\" - o.start > 1000000"
        )
    }
    db.close()
    assert poll_threads and not poll_threads & cuda_threads  # (what makes this export the case)
    res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert res.typed is not None
        gaps = [g for f in res.typed.findings if f.rule == "PR504" for g in f.evidence["gaps"]]
    finally:
        res.close()
    assert gaps and not [g for g in gaps if g["host_call"] == "poll"], [g["host"] for g in gaps]
