"""The main job on every trace we have — the shared corpus and our samples — writes all four outputs, and the
numbers keep their invariants: utilization in [0, 1], achieved ≤ utilization (no useful work while idle),
achieved + losses = 1, every trace kernel a slice in trace.pftrace. Inputs that cannot be analysed give one
clear error (BadInput) and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from plasmient_report import pipeline
from plasmient_report.errors import BadInput
from plasmient_report.render import perfetto

from .conftest import CORPUS, SAMPLES

TRACES = [
    "h200-single-kineto/kineto_single.json.gz",
    "h200x2-small/kineto",
    "h200-single-nsys/nsys_workload.sqlite",
    "h200-single-nsys/nsys_small.sqlite",
    "public-nsys-nsysai/h100_2gpu_1s.sqlite",
    "public-nsys-nsysai/mfu_2gpu_before.sqlite",
    "public-nsys-nsysai/mock.sqlite",
    "public-nsys-pipit-cloverleaf/perlmutter-cloverleaf-cuda.sqlite",
    "public-nsys-pipit-saxpy-mpi/saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    *[f"public-kineto-hta/{p.name}" for p in sorted((CORPUS / "public-kineto-hta").glob("*.gz"))],
]
SAMPLE_RUNS = ["h200_single/kineto_single.pt.trace.json.gz", "h200_single/nsys_single.sqlite",
               "h200x2_ddp/kineto", "h200x2_ddp/nsys"]
REFUSED = {"cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"}  # a CPU-only profile: no GPU to judge


def check(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = pipeline.Options()
    if path.name in REFUSED:
        with pytest.raises(BadInput):
            pipeline.analyse([path], opts)
        return
    res = pipeline.analyse([path], opts)
    pipeline.write_outputs(res, out, [path], opts)
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "run.duckdb", "trace.pftrace", "verdict.json"]
    v = res.verdict
    util, ach = v["utilization"]["trace"], v["achieved_fraction_of_peak"]
    assert 0.0 <= util <= 1.0
    if ach is not None:
        assert 0.0 <= ach <= util + 1e-9
        assert ach + sum(x["fraction"] for x in v["losses"]) == pytest.approx(1.0, abs=1e-9)
    n_kernels = res.con.execute("SELECT count(*) FROM kernels WHERE rank IS NOT NULL").fetchall()[0][0]
    slices = sum(1 for p in perfetto.read_back(out / "trace.pftrace")
                 if p.HasField("track_event") and p.track_event.type == perfetto.BEGIN
                 and p.track_event.HasField("track_uuid")) if n_kernels < 50_000 else None
    if slices is not None:
        assert slices >= n_kernels


@pytest.mark.slow
@pytest.mark.parametrize("rel", TRACES)
def test_corpus_trace(rel, tmp_path):
    path = CORPUS / rel
    if not path.exists():
        pytest.skip(f"../shared/corpus not present ({rel})")
    check(path, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("rel", SAMPLE_RUNS)
def test_sample_run(rel, tmp_path):
    check(SAMPLES / rel, tmp_path)
