"""`batch --executor ray`: the same mapper as Ray tasks on a real local Ray (2 CPUs), with outputs identical to
the local process pool's — summary.parquet, index.html, every run's verdict.json and report.html, byte for byte.

Skipped when Ray is not installed (it is in the `test` extra, so CI runs these)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from plasmient_report.batch import run_batch
from plasmient_report.pipeline import Options

from .test_batch import RUNS, cli, make_fleet, make_tar_gz, make_zip

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'plasmient-report[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_ray_executor_starts_a_local_ray_when_none_is_given(tmp_path):
    """No --address and no Ray in the process: `batch` starts a local Ray for itself and stops it after."""
    fleet = make_fleet(tmp_path / "src")
    for run in ("single_kineto", "ddp_kineto", "corrupt"):
        shutil.rmtree(fleet / run)
    out = tmp_path / "out"
    r = cli(
        "batch",
        str(make_zip(fleet, tmp_path / "one.zip")),
        "--executor",
        "ray",
        "--jobs",
        "2",
        "--out",
        str(out),
        "--no-html",
        "--no-trace",
    )
    assert r.returncode == 0, r.stderr
    assert "1 analysed, skipped 0 (unchanged), 0 failed" in r.stderr
    rows = pq.read_table(out / "summary.parquet").to_pylist()
    assert [(x["run_id"], x["level"]) for x in rows] == [("one/ddp_nsys", "run")] + [("one/ddp_nsys", "rank")] * 2


def test_unreachable_address_is_one_line_and_exit_2(tmp_path):
    r = cli(
        "batch",
        str(make_zip(make_fleet(tmp_path / "src"), tmp_path / "f.zip")),
        "--executor",
        "ray",
        "--address",
        "127.0.0.1:1",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 2 and "cannot reach Ray at 127.0.0.1:1" in r.stderr
    assert not (tmp_path / "out" / "inputs").exists()  # refused before unpacking anything


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def both(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ray")
    arc = make_tar_gz(make_fleet(root / "src"), root / "fleet.tar.gz")
    outs = {}
    for executor in ("local", "ray"):
        out = root / executor
        extra = ["--address", ray_cluster] if executor == "ray" else []
        r = cli("batch", str(arc), "--executor", executor, *extra, "--jobs", "2", "--out", str(out), "--no-trace")
        assert r.returncode == 0, r.stderr
        assert "4 runs: 3 analysed, skipped 0 (unchanged), 1 failed" in r.stderr
        outs[executor] = out
    outs["archive"] = arc
    return outs


def test_ray_and_local_outputs_are_identical(both):
    local, ray_out = both["local"], both["ray"]
    a, b = pq.read_table(local / "summary.parquet"), pq.read_table(ray_out / "summary.parquet")
    assert a.equals(b)
    assert {r["run_id"] for r in a.to_pylist()} == RUNS
    assert (local / "index.html").read_bytes() == (ray_out / "index.html").read_bytes()
    runs = sorted(p.name for p in (local / "runs").iterdir())
    assert (
        runs
        == sorted(p.name for p in (ray_out / "runs").iterdir())
        == ["fleet__ddp_kineto", "fleet__ddp_nsys", "fleet__single_kineto"]
    )
    for run in runs:
        for name in ("verdict.json", "report.html", "batch-manifest.json"):
            assert (local / "runs" / run / name).read_bytes() == (ray_out / "runs" / run / name).read_bytes(), (run, name)


def test_ray_rerun_skips_what_local_did(both, ray_cluster, tmp_path):
    """Resuming does not depend on the executor: a batch done locally is skipped by Ray (the Ray in this
    process, already initialised, is used as it is)."""
    out = tmp_path / "out"
    shutil.copytree(both["local"], out)
    res = run_batch([both["archive"]], out, Options(write_trace=False), executor="ray")
    assert sorted((o.run_id, o.status) for o in res.outcomes) == [
        ("fleet/corrupt", "failed"),
        ("fleet/ddp_kineto", "skipped"),
        ("fleet/ddp_nsys", "skipped"),
        ("fleet/single_kineto", "skipped"),
    ]
    assert pq.read_table(out / "summary.parquet").equals(pq.read_table(both["local"] / "summary.parquet"))
    assert ray.is_initialized()  # not ours to shut down
