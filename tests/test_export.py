"""`plasmient-report export RUN --csv DIR` / `--parquet DIR`: the tables of a stored run, one file each, matching the
verdict written beside them; the folder rules of the outputs (never over something the tool did not write)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .conftest import ROOT, sample_file


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "ddp"
    r = cli(str(sample_file("h200x2_ddp/kineto")), "--out", str(out), "--no-html", "--no-trace", "--quiet")
    assert r.returncode == 0, r.stderr
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_every_table_matches_the_verdict(run_dir: Path, tmp_path: Path) -> None:
    v = json.loads((run_dir / "verdict.json").read_text())
    r = cli("export", str(run_dir), "--csv", str(tmp_path / "csv"), "--parquet", str(tmp_path / "pq"))
    assert r.returncode == 0, r.stderr
    names = {p.stem for p in (tmp_path / "csv").glob("*.csv")}
    assert {"kernels", "ops", "shapes", "steps", "step_losses", "collectives", "losses", "findings", "metrics"} <= names
    assert {p.stem for p in (tmp_path / "pq").glob("*.parquet")} == names
    for name in names:  # the two formats hold the same rows
        assert pq.read_table(tmp_path / "pq" / f"{name}.parquet").num_rows == len(_rows(tmp_path / "csv" / f"{name}.csv"))
    steps = _rows(tmp_path / "csv" / "steps.csv")
    assert [(int(s["rank"]), int(s["occurrence"]), int(s["gpu_ns"])) for s in steps] == [
        (s["rank"], s["occurrence"], s["gpu_ns"]) for s in v["steps"]
    ]
    findings = _rows(tmp_path / "csv" / "findings.csv")
    assert sorted(f["rule_id"] for f in findings) == sorted(f["rule"] for f in v["findings"])
    kernels = [k for k in _rows(tmp_path / "csv" / "kernels.csv") if k["scope"] == "window"]
    top = {k["name"]: k for k in kernels}
    for k in v["top_kernels"]:
        assert int(top[k["name"]]["count"]) == k["count"]
        assert float(top[k["name"]]["time_ns"]) == pytest.approx(k["time_ns"])
    losses = [x for x in _rows(tmp_path / "csv" / "losses.csv") if x["scope"] == "window" and x["rank"] == "0"]
    rank0 = next(x for x in v["ranks"] if x["rank"] == 0)
    assert {x["category"]: pytest.approx(float(x["fraction"])) for x in losses} == {
        x["category"]: x["fraction"] for x in rank0["losses"]
    }
    # the collectives: 4 all-reduces per step × 5 steps, each seen on both ranks (ground_truth.json)
    truth = json.loads(sample_file("h200x2_ddp/ground_truth.json").read_text())
    coll = _rows(tmp_path / "csv" / "collectives.csv")
    assert len(coll) == truth["allreduce_per_step_expected"] * truth["profiled_steps"]
    assert {c["n_ranks"] for c in coll} == {"2"} and {c["last_rank"] for c in coll} == {str(truth["late_rank"])}
    readme = (tmp_path / "csv" / "README.md").read_text()
    assert all(f"`{n}.csv`" in readme for n in names)


def test_the_folder_rules(run_dir: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    r = cli("export", str(run_dir), "--csv", str(foreign))
    assert r.returncode == 2 and "refusing to replace it" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (foreign / "notes.txt").read_text() == "keep me" and len(list(foreign.iterdir())) == 1
    r = cli("export", str(run_dir), "--csv", str(run_dir))  # the run's own folder: its input, and not an export
    assert r.returncode == 2 and (run_dir / "verdict.json").is_file()
    again = tmp_path / "again"
    assert cli("export", str(run_dir / "run.duckdb"), "--csv", str(again)).returncode == 0
    stale = sorted(p.name for p in again.iterdir())
    r = cli("export", str(run_dir), "--csv", str(again))  # an earlier export is replaced whole
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in again.iterdir()) == stale
    r = cli("export", str(run_dir / "verdict.json"), "--csv", str(tmp_path / "x"))
    assert r.returncode == 2 and "run.duckdb" in r.stderr and not (tmp_path / "x").exists()
    r = cli("export", str(run_dir))
    assert r.returncode == 2 and "--csv DIR" in r.stderr
