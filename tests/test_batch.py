"""`plasmient-report batch`: archives unpacked safely, files grouped into runs, every run through the per-run
pipeline (a corrupt run reported, never stopping the batch), summary.parquet and index.html, resumable reruns.

The fleet is made at test time from the committed real recordings in sample_traces/ (SPEC §7): a 1-rank Kineto
run, a 2-rank Kineto DDP run, the same DDP job recorded by nsys (2 ranks), and a run whose trace is a truncated
gzip. Local vs Ray outputs are compared in test_batch_ray.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from plasmient_report.batch import archive, executors, group
from plasmient_report.batch.mapper import Outcome, Task
from plasmient_report.batch.summary import LOSS_COLUMNS, SCHEMA
from plasmient_report.errors import BadInput

from . import contract
from .conftest import SAMPLES

RUNS = {"fleet/corrupt", "fleet/ddp_kineto", "fleet/ddp_nsys", "fleet/single_kineto"}


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def make_fleet(root: Path) -> Path:
    """fleet/<run>/… — one folder per run, as a team's trace bucket would hold them."""
    fleet = root / "fleet"
    for run, files in {
        "single_kineto": ["h200_single/kineto_single.pt.trace.json.gz"],
        "ddp_kineto": ["h200x2_ddp/kineto/rank0.pt.trace.json.gz", "h200x2_ddp/kineto/rank1.pt.trace.json.gz"],
        "ddp_nsys": ["h200x2_ddp/nsys/nsys_ddp.sqlite", "h200x2_ddp/nsys/nsys_ddp.nsys-rep"],
    }.items():
        (fleet / run).mkdir(parents=True)
        for f in files:
            shutil.copy2(SAMPLES / f, fleet / run)
    (fleet / "corrupt").mkdir()
    good = (SAMPLES / "h200x2_ddp/kineto/rank0.pt.trace.json.gz").read_bytes()
    (fleet / "corrupt" / "rank0.pt.trace.json.gz").write_bytes(good[: len(good) // 2])  # truncated gzip
    (fleet / "README.txt").write_text("traces of last week's jobs\n")
    return fleet


def make_tar_gz(fleet: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tf:
        tf.add(fleet, arcname=fleet.name)
    return dest


def make_tar_zst(fleet: Path, dest: Path) -> Path:
    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(fleet, arcname=fleet.name)
    dest.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return dest


def make_zip(fleet: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(fleet.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(fleet.parent).as_posix())
    return dest


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# The end-to-end batch, once per module (the expensive part); the tests below read its outputs.


@pytest.fixture(scope="module")
def fleet_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    return make_tar_gz(make_fleet(root), root / "fleet.tar.gz")


@pytest.fixture(scope="module")
def batch_local(fleet_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("batch") / "out"
    r = cli("batch", str(fleet_archive), "--out", str(out), "--no-trace", "--no-html", "--jobs", "2")
    return {"out": out, "proc": r}


def summary_rows(out: Path) -> list[dict[str, Any]]:
    return pq.read_table(out / "summary.parquet").to_pylist()


@pytest.mark.slow
def test_batch_exit_code_and_stderr(batch_local):
    r = batch_local["proc"]
    assert r.returncode == 0, r.stderr  # a failed run does not fail the batch
    assert "4 runs: 3 analysed, skipped 0 (unchanged), 1 failed" in r.stderr
    assert "fleet/corrupt failed" in r.stderr and "gzip" in r.stderr
    assert "summary.parquet" in r.stdout and "index.html" in r.stdout


@pytest.mark.slow
def test_summary_has_a_row_per_run_and_rank(batch_local):
    rows = summary_rows(batch_local["out"])
    assert pq.read_schema(batch_local["out"] / "summary.parquet").names == SCHEMA.names
    assert {r["run_id"] for r in rows if r["level"] == "run"} == RUNS
    ranks = {(r["run_id"], r["rank"]) for r in rows if r["level"] == "rank"}
    assert ranks == {
        ("fleet/single_kineto", 0),
        ("fleet/ddp_kineto", 0),
        ("fleet/ddp_kineto", 1),
        ("fleet/ddp_nsys", 0),
        ("fleet/ddp_nsys", 1),
    }
    # Rows come sorted (run id, run row first, ranks in order): the same whatever order the workers finished in.
    keys = [(r["run_id"], r["level"] != "run", r["rank"] or 0) for r in rows]
    assert keys == sorted(keys)


@pytest.mark.slow
def test_corrupt_run_is_reported_with_its_error(batch_local):
    out = batch_local["out"]
    bad = [r for r in summary_rows(out) if r["run_id"] == "fleet/corrupt"]
    assert len(bad) == 1 and bad[0]["status"] == "failed" and bad[0]["level"] == "run"
    assert "rank0.pt.trace.json.gz" in bad[0]["error"] and "gzip" in bad[0]["error"]
    assert bad[0]["achieved_fraction_of_peak"] is None and bad[0]["report"] is None
    assert not (out / "runs" / "fleet__corrupt").exists()


@pytest.mark.slow
def test_summary_numbers_are_each_runs_verdict(batch_local):
    out = batch_local["out"]
    rows = summary_rows(out)
    for run_row in (r for r in rows if r["level"] == "run" and r["status"] == "ok"):
        slug = run_row["run_id"].replace("/", "__")
        v = json.loads((out / "runs" / slug / "verdict.json").read_text())
        assert run_row["report"] == f"runs/{slug}/verdict.json"  # --no-html: the link goes to the verdict
        assert run_row["utilization"] == v["utilization"]["trace"]
        assert run_row["achieved_fraction_of_peak"] == v["achieved_fraction_of_peak"]
        assert run_row["headroom"] == v["headroom"]["factor"]
        assert run_row["verdict"] == v["verdict"]
        assert run_row["world_size"] == len(v["run"]["ranks"])
        assert run_row["peak_gpu"] == v["peak"]["gpu"] and run_row["gpu"] == "NVIDIA H200"
        assert run_row["window_ns"] == v["run"]["window_ns"]
        assert run_row["findings"] == len(v["findings"])
        for loss in v["losses"]:
            assert run_row[f"loss_{loss['category']}"] == pytest.approx(loss["fraction"])
        # achieved + every loss category = 100% of the window (the waterfall's invariant survives the summary)
        assert run_row["achieved_fraction_of_peak"] + sum(run_row[c] for c in LOSS_COLUMNS) == pytest.approx(1, abs=1e-6)
        top = max(v["findings"], key=lambda f: f["lost_fraction"] or 0)
        assert run_row["top_findings"][0].startswith(top["rule"])
        # inputs as analysed (relative to the batch folder: the same on every executor) and their hashes
        assert run_row["inputs"] == v["run"]["inputs"]
        assert all(p.startswith("inputs/fleet/") for p in run_row["inputs"])
        assert run_row["input_sha256"] == [sha256(out / p) for p in run_row["inputs"]]
        for rank_row in (r for r in rows if r["run_id"] == run_row["run_id"] and r["level"] == "rank"):
            vr = next(x for x in v["ranks"] if x["rank"] == rank_row["rank"])
            assert rank_row["achieved_fraction_of_peak"] == vr["achieved_fraction_of_peak"]
            assert rank_row["utilization"] == vr["utilization"]["trace"]
    formats = {r["run_id"]: r["formats"] for r in rows if r["level"] == "run"}
    assert formats["fleet/ddp_nsys"] == "nsys-sqlite" and formats["fleet/ddp_kineto"] == "kineto"


@pytest.mark.slow
def test_ddp_run_matches_the_main_job(batch_local, tmp_path):
    """The mapper is the main job: the same numbers as `plasmient-report INPUT` on the same files."""
    out = batch_local["out"]
    r = cli(
        *[str(SAMPLES / "h200x2_ddp/kineto" / f) for f in ("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz")],
        "--out",
        str(tmp_path / "one"),
        "--json",
        "--no-html",
        "--no-trace",
    )
    assert r.returncode == 0, r.stderr
    main_job = json.loads(r.stdout)
    batch = json.loads((out / "runs" / "fleet__ddp_kineto" / "verdict.json").read_text())
    assert batch["achieved_fraction_of_peak"] == pytest.approx(main_job["achieved_fraction_of_peak"], rel=1e-9)
    assert batch["utilization"]["trace"] == pytest.approx(main_job["utilization"]["trace"], rel=1e-9)
    assert [x["category"] for x in batch["losses"]] == [x["category"] for x in main_job["losses"]]


@pytest.mark.slow
def test_index_ranks_runs_by_headroom_and_lists_failures(batch_local):
    out = batch_local["out"]
    html = (out / "index.html").read_text()
    # runs whose headroom is unknown (achieved null or a lower bound) come last
    ok = sorted(
        (r for r in summary_rows(out) if r["level"] == "run" and r["status"] == "ok"),
        key=lambda r: (r["headroom"] is None, -(r["headroom"] or 0.0), r["run_id"]),
    )
    positions = [html.index(f'<tr data-run="{r["run_id"]}">') for r in ok]
    assert positions == sorted(positions)  # most headroom first
    for r in ok:
        assert f'href="{r["report"]}"' in html and (out / r["report"]).exists()
    failed = html[html.index('id="failed-table"') :]
    assert "fleet/corrupt" in failed and "gzip" in failed
    assert not any(f'{a}="http' in html for a in ("src", "href"))  # self-contained: nothing to fetch


@pytest.mark.slow
def test_rerun_skips_unchanged_runs(batch_local, fleet_archive, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(batch_local["out"], out)  # paths inside are relative: a copied batch folder still resumes
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/verdict.json")}
    r = cli("batch", str(fleet_archive), "--out", str(out), "--no-trace", "--no-html")
    assert r.returncode == 0, r.stderr
    assert "4 runs: 0 analysed, skipped 3 (unchanged), 1 failed" in r.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/verdict.json")} == before
    assert pq.read_table(out / "summary.parquet").equals(pq.read_table(batch_local["out"] / "summary.parquet"))


@pytest.mark.slow
def test_rerun_after_fixing_a_run_analyses_only_that_run(batch_local, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(batch_local["out"], out)
    fleet = make_fleet(tmp_path / "src")
    shutil.copy2(SAMPLES / "h200x2_ddp/kineto/rank0.pt.trace.json.gz", fleet / "corrupt" / "rank0.pt.trace.json.gz")
    fixed = make_tar_gz(fleet, tmp_path / "fleet.tar.gz")
    r = cli("batch", str(fixed), "--out", str(out), "--no-trace", "--no-html")
    assert r.returncode == 0, r.stderr
    assert "4 runs: 1 analysed, skipped 3 (unchanged), 0 failed" in r.stderr
    row = next(x for x in summary_rows(out) if x["run_id"] == "fleet/corrupt")
    assert row["status"] == "ok" and row["world_size"] == 1


@pytest.mark.slow
def test_missing_output_or_changed_options_rerun(batch_local, fleet_archive, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(batch_local["out"], out)
    (out / "runs" / "fleet__ddp_nsys" / "run.duckdb").unlink()
    r = cli("batch", str(fleet_archive), "--out", str(out), "--no-trace", "--no-html", "--select", "PR1")
    assert r.returncode == 0, r.stderr
    assert "3 analysed, skipped 0" in r.stderr  # other rules selected: every run is redone
    r = cli("batch", str(fleet_archive), "--out", str(out), "--no-trace", "--no-html", "--select", "PR1")
    assert "0 analysed, skipped 3 (unchanged)" in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# Archives: every format unpacks to the same runs; nothing escapes the work folder.


@pytest.mark.parametrize("kind", ["folder", "tar", "tar.gz", "tar.zst", "zip"])
def test_every_archive_format_gives_the_same_runs(kind, tmp_path):
    fleet = make_fleet(tmp_path / "src")
    src = {
        "folder": lambda: fleet,
        "tar": lambda: _tar(fleet, tmp_path / "fleet.tar"),
        "tar.gz": lambda: make_tar_gz(fleet, tmp_path / "fleet.tar.gz"),
        "tar.zst": lambda: make_tar_zst(fleet, tmp_path / "fleet.tar.zst"),
        "zip": lambda: make_zip(fleet, tmp_path / "fleet.zip"),
    }[kind]()
    out = tmp_path / "out"
    sources = archive.open_sources([src], out / "inputs")
    grouping = group.group(sources, "folder", out)
    assert {r.run_id for r in grouping.runs} == RUNS
    ddp = next(r for r in grouping.runs if r.run_id == "fleet/ddp_nsys")
    assert [Path(p).name for p in ddp.inputs] == ["nsys_ddp.nsys-rep", "nsys_ddp.sqlite"]
    if kind == "folder":
        assert sources[0].root == fleet.resolve() and not (out / "inputs").exists()  # read in place
        assert Path(ddp.inputs[0]).is_absolute()
    else:
        assert ddp.inputs[0].startswith("inputs/fleet/")
        assert sha256(out / ddp.inputs[1]) == sha256(fleet / "ddp_nsys" / "nsys_ddp.sqlite")


def _tar(fleet: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w") as tf:
        tf.add(fleet, arcname=fleet.name)
    return dest


def test_tar_members_cannot_escape(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:

        def add(name: str, data: bytes = b"x", **kw: Any) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in kw.items():
                setattr(info, k, v)
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)

        add("../escaped.txt")
        add("/tmp/absolute.txt")
        add("run/../../escaped2.txt")
        add("run/link", type=tarfile.SYMTYPE, linkname="/etc/passwd", size=0)
        add("run/hard", type=tarfile.LNKTYPE, linkname="../../escaped.txt", size=0)
        add("run/dev", type=tarfile.CHRTYPE, size=0)
        add("run/ok.txt", b"fine")
    work = tmp_path / "work"
    root = archive.unpack(evil, "tar", work / "evil", archive.Budget())
    written = sorted(p.relative_to(work / "evil").as_posix() for p in (work / "evil").rglob("*") if not p.is_dir())
    assert written == [".plasmient-unpacked.json", "run/ok.txt"]
    assert root == work / "evil" / "run"  # one top folder: runs are named below it
    assert not (tmp_path / "escaped.txt").exists() and not any(p.is_symlink() for p in work.rglob("*"))


def test_zip_members_cannot_escape(tmp_path):
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escaped.txt", "x")
        zf.writestr("/abs.txt", "x")
        zf.writestr("a\\..\\..\\escaped3.txt", "x")
        link = zipfile.ZipInfo("a/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("__MACOSX/a/._x", "junk")
        zf.writestr("a/ok.txt", "fine")
    work = tmp_path / "work"
    archive.unpack(evil, "zip", work / "evil", archive.Budget())
    written = sorted(p.relative_to(work / "evil").as_posix() for p in (work / "evil").rglob("*") if not p.is_dir())
    assert written == [".plasmient-unpacked.json", "a/ok.txt"]
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "escaped3.txt").exists()


def test_size_limit_stops_unpacking_and_leaves_nothing(tmp_path):
    big = tmp_path / "big.tar.gz"
    with tarfile.open(big, "w:gz") as tf:
        info = tarfile.TarInfo("run/zeros.bin")
        info.size = 1 << 20
        tf.addfile(info, io.BytesIO(bytes(1 << 20)))
    with pytest.raises(BadInput, match="size limit"):
        archive.unpack(big, "tar", tmp_path / "work" / "big", archive.Budget(limit_bytes=1 << 19))
    assert list((tmp_path / "work").iterdir()) == []


def test_unpacked_archive_is_reused(tmp_path):
    fleet = make_fleet(tmp_path / "src")
    arc = make_zip(fleet, tmp_path / "fleet.zip")
    dest = tmp_path / "work" / "fleet"
    archive.unpack(arc, "zip", dest, archive.Budget())
    stamp = (dest / archive.STAMP).stat().st_mtime_ns
    archive.unpack(arc, "zip", dest, archive.Budget())
    assert (dest / archive.STAMP).stat().st_mtime_ns == stamp


def test_what_is_an_archive(tmp_path):
    fleet = make_fleet(tmp_path / "src")
    assert archive.kind_of(fleet) == "folder"
    assert archive.kind_of(make_tar_gz(fleet, tmp_path / "a.tar.gz")) == "tar"
    assert archive.kind_of(make_tar_zst(fleet, tmp_path / "a.tar.zst")) == "tar.zst"
    assert archive.kind_of(make_zip(fleet, tmp_path / "a.zip")) == "zip"
    # a gzipped trace is gzip but not a tarball
    assert archive.kind_of(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz") is None
    assert archive.label_of(Path("x/Fleet 2024.tar.zst")) == "Fleet_2024"


# ---------------------------------------------------------------------------------------------------------------
# Grouping files into runs and ranks.


def test_prefix_grouping_in_a_flat_folder(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for rank in (0, 1):
        shutil.copy(SAMPLES / f"h200x2_ddp/kineto/rank{rank}.pt.trace.json.gz", flat / f"jobA_rank{rank}.pt.trace.json.gz")
        shutil.copy(SAMPLES / f"h200x2_ddp/kineto/rank{rank}.pt.trace.json.gz", flat / f"jobB.rank-{rank}.pt.trace.json.gz")
    shutil.copy(SAMPLES / "h200x2_ddp/nsys/nsys_ddp.sqlite", flat / "jobC.sqlite")
    shutil.copy(SAMPLES / "h200_single/nvidia_smi_dmon.txt", flat / "jobA_nvidia_smi_dmon.txt")
    shutil.copy(SAMPLES / "h200_single/nvidia_smi_dmon.txt", flat / "orphan_dmon.txt")
    src = archive.open_sources([flat], tmp_path / "out" / "inputs")
    g = group.group(src, group.parse_group_by("prefix"), tmp_path / "out")
    runs = {r.run_id: [Path(p).name for p in r.inputs] for r in g.runs}
    assert runs == {
        "flat/jobA": ["jobA_nvidia_smi_dmon.txt", "jobA_rank0.pt.trace.json.gz", "jobA_rank1.pt.trace.json.gz"],
        "flat/jobB": ["jobB.rank-0.pt.trace.json.gz", "jobB.rank-1.pt.trace.json.gz"],
        "flat/jobC": ["jobC.sqlite"],
    }
    assert g.unassigned == ["flat/orphan_dmon.txt"]
    # the default (folder) puts the whole flat folder in one run, which the pipeline would refuse (mixed recordings)
    assert [r.run_id for r in group.group(src, "folder", tmp_path / "out").runs] == ["flat"]


def test_regex_grouping_and_folder_auxiliaries(tmp_path):
    tree = tmp_path / "tree"
    (tree / "job1" / "traces").mkdir(parents=True)
    (tree / "job1" / "logs").mkdir()
    shutil.copy(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz", tree / "job1" / "traces")
    shutil.copy(SAMPLES / "h200_single/nvidia_smi_dmon.txt", tree / "job1" / "logs")
    shutil.copy(SAMPLES / "h200_single/machine_info.txt", tree / "job1")
    src = archive.open_sources([tree], tmp_path / "out" / "inputs")
    by_folder = group.group(src, "folder", tmp_path / "out")
    assert [(r.run_id, len(r.inputs)) for r in by_folder.runs] == [("tree/job1/traces", 1)]
    assert by_folder.unassigned == ["tree/job1/logs/nvidia_smi_dmon.txt"]  # not under the run folder
    by_regex = group.group(src, group.parse_group_by(r"^(?P<run>job\d+)/"), tmp_path / "out")
    assert [(r.run_id, r.slug, len(r.inputs)) for r in by_regex.runs] == [("tree/job1", "tree__job1", 2)]


def test_run_prefix():
    assert group.run_prefix("jobA_rank3.pt.trace.json.gz") == "jobA"
    assert group.run_prefix("jobA.rank12.json") == "jobA"
    assert group.run_prefix("rank0.pt.trace.json.gz") == ""
    assert group.run_prefix("nsys_ddp.sqlite") == "nsys_ddp"
    assert group.run_prefix("frank_ranking.json") == "frank_ranking"  # 'rank' inside a word is no rank number


def test_bad_group_by_regex():
    with pytest.raises(BadInput, match="--group-by"):
        group.parse_group_by("(unclosed")


# ---------------------------------------------------------------------------------------------------------------
# Executors: a worker that dies takes only its run down.


def fake_mapper(task: Task) -> Outcome:
    """Importable from spawned workers: dies on the run named 'crash', otherwise returns a tiny outcome."""
    if task.run.run_id.endswith("crash"):
        os._exit(3)
    return Outcome(task.run.run_id, "analysed", None, [], {"pid": os.getpid()})


def test_local_executor_survives_a_dying_worker():
    runs = [group.Run(f"f/{n}", n, ()) for n in ("a", "b", "crash", "c", "d")]
    tasks = [Task(r, "/", None, "x") for r in runs]
    seen: list[str] = []
    outs = executors.run_local(tasks, lambda o: seen.append(o.run_id), 2, fake_mapper)
    status = {o.run_id: o.status for o in outs}
    assert status == {"f/a": "analysed", "f/b": "analysed", "f/crash": "failed", "f/c": "analysed", "f/d": "analysed"}
    assert sorted(seen) == sorted(status)
    crash = next(o for o in outs if o.run_id == "f/crash")
    assert "worker process died" in (crash.error or "") and crash.rows[0]["status"] == "failed"


def stuck_mapper(task: Task) -> Outcome:
    """Importable from spawned workers. 'crash' dies after a moment; 'stuck', the first time (no flag file yet),
    ignores SIGTERM and never returns, as a worker blocked for good on a queue lock its dead sibling held does."""
    if task.run.run_id.endswith("crash"):
        time.sleep(0.5)
        os._exit(3)
    flag = Path(os.environ["PLASMIENT_TEST_STUCK_FLAG"])
    if task.run.run_id.endswith("stuck") and not flag.exists():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        flag.touch()
        time.sleep(3600)
    return Outcome(task.run.run_id, "analysed", None, [], {"pid": os.getpid()})


def test_local_executor_stops_a_stuck_worker_of_a_broken_pool(tmp_path, monkeypatch):
    # When a worker dies the pool is broken; the pool's own shutdown then waits for every other worker to exit,
    # forever for one that cannot (seen in CI: blocked on the result queue's lock). The executor stops them first,
    # SIGKILL after the grace period; the stuck run is retried in a pool of its own and finishes there.
    monkeypatch.setenv("PLASMIENT_TEST_STUCK_FLAG", str(tmp_path / "stuck-once"))
    monkeypatch.setattr(executors, "STOP_GRACE_S", 0.5)
    tasks = [Task(group.Run(f"f/{n}", n, ()), "/", None, "x") for n in ("stuck", "crash")]
    outs: list[Outcome] = []
    run = lambda: outs.extend(executors.run_local(tasks, lambda o: None, 2, stuck_mapper))  # noqa: E731
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the batch hung on the broken pool's shutdown"
    assert {o.run_id: o.status for o in outs} == {"f/stuck": "analysed", "f/crash": "failed"}


# ---------------------------------------------------------------------------------------------------------------
# Unusable archives and arguments: one line, exit 2.


@pytest.mark.parametrize(
    "make_args,message",
    [
        (lambda t: [str(t / "missing.tar.gz")], "no such file"),
        (
            lambda t: [str(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz"), "--out", str(t / "o")],
            "not a folder or an archive",
        ),
        (lambda t: [str(t), "--out", str(t / "inside")], "inside or over the input"),
        (lambda t: [str(t), "--group-by", "(", "--out", str(t.parent / "o")], "--group-by"),
        (lambda t: [str(t), "--address", "ray://x:10001", "--out", str(t.parent / "o")], "--address needs --executor ray"),
        (lambda t: [str(t), "--out", str(t.parent / "o2")], "no runs found"),
        (lambda t: [str(t), "--select", "NOPE999", "--out", str(t.parent / "o3")], "NOPE999"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, make_args, message):
    d = tmp_path / "empty"
    d.mkdir()
    r = cli("batch", *make_args(d))
    assert message in contract.refused(contract.Run(r.returncode, r.stdout, r.stderr))


def test_nsys_parquetdir_export_is_one_trace_of_its_run(tmp_path: Path) -> None:
    """A run folder holding an nsys parquetdir export (a folder of tables): one input, analysed, and skipped on
    rerun (its hash is that of its files)."""
    fleet = tmp_path / "fleet"
    shutil.copytree(SAMPLES / "h200_single" / "nsys_single_pqtdir", fleet / "job-pq" / "nsys_single_pqtdir")
    out = tmp_path / "out"
    r = cli("batch", str(fleet), "--out", str(out), "--no-trace", "--no-html", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    rows = [x for x in summary_rows(out) if x["level"] == "run"]
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
    assert rows[0]["formats"] == "nsys-parquetdir" and len(rows[0]["inputs"]) == 1
    assert rows[0]["inputs"][0].endswith("nsys_single_pqtdir")
    r = cli("batch", str(fleet), "--out", str(out), "--no-trace", "--no-html", "--jobs", "1")
    assert r.returncode == 0 and "skipped 1" in r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------------------------
# Resume verifies the outputs, not only the manifest; nothing of the inputs disappears silently.


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_type", "edited", "old_manifest"])
def test_rerun_reanalyses_a_run_whose_outputs_are_damaged(batch_local, fleet_archive, tmp_path, damage):
    out = tmp_path / "out"
    shutil.copytree(batch_local["out"], out)
    run = out / "runs" / "fleet__ddp_kineto"
    vpath = run / "verdict.json"
    good = json.loads(vpath.read_text())
    if damage == "garbage":
        vpath.write_bytes(os.urandom(len(vpath.read_bytes())))
    elif damage == "truncated":
        vpath.write_text(vpath.read_text()[:100])
    elif damage == "wrong_type":
        vpath.write_text(json.dumps({**good, "ranks": "two"}))
    elif damage == "edited":  # valid, same keys, a number changed by hand: not what the tool wrote
        text = vpath.read_text()
        vpath.write_text(text.replace(json.dumps(good["achieved_fraction_of_peak"]), "0.999", 1))
    else:  # a manifest of an earlier version, which recorded no outputs
        m = json.loads((run / "batch-manifest.json").read_text())
        m.pop("outputs")
        m.pop("verdict_sha256")
        (run / "batch-manifest.json").write_text(json.dumps(m))
    r = cli("batch", str(fleet_archive), "--out", str(out), "--no-trace", "--no-html")
    assert r.returncode == 0, r.stderr
    assert "4 runs: 1 analysed, skipped 2 (unchanged), 1 failed" in r.stderr, r.stderr
    row = next(x for x in summary_rows(out) if x["run_id"] == "fleet/ddp_kineto" and x["level"] == "run")
    assert row["status"] == "ok" and row["achieved_fraction_of_peak"] == good["achieved_fraction_of_peak"]
    assert json.loads(vpath.read_text()) == good


def test_what_is_in_no_run_is_listed_with_why(tmp_path):
    fleet = tmp_path / "fleet"
    (fleet / "job").mkdir(parents=True)
    shutil.copy2(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz", fleet / "job")
    (fleet / "notes").mkdir()
    (fleet / "notes" / "todo.md").write_text("look at rank 3")
    (fleet / "logs_only").mkdir()
    shutil.copy2(SAMPLES / "h200_single/nvidia_smi_dmon.txt", fleet / "logs_only")
    deep = fleet.joinpath(*[f"d{i}" for i in range(18)])
    deep.mkdir(parents=True)
    shutil.copy2(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz", deep)
    os.mkfifo(fleet / "job" / "pipe.pt.trace.json")
    out = tmp_path / "out"
    r = cli("batch", str(fleet), "--out", str(out), "--no-trace", "--no-html")
    assert r.returncode == 0, r.stderr
    assert "in no run" in r.stderr
    rows = [x for x in summary_rows(out) if x["level"] == "unread"]
    why = {x["run_id"]: x["error"] for x in rows}
    assert "no trace or counter log" in why["fleet/notes"] and "todo.md" in why["fleet/notes"]
    assert "no trace of its run" in why["fleet/logs_only/nvidia_smi_dmon.txt"]
    assert any("folders deep" in w for p, w in why.items() if p.startswith("fleet/d0/"))
    assert "FIFO" in why["fleet/job/pipe.pt.trace.json"]
    assert all(x["status"] == "not analysed" for x in rows)
    html = (out / "index.html").read_text()
    for p, w in why.items():
        assert p in html and w.split(" (")[0] in html
    assert [x["run_id"] for x in summary_rows(out) if x["level"] == "run"] == ["fleet/job"]


def test_an_unreadable_folder_is_listed(tmp_path):
    fleet = tmp_path / "fleet"
    (fleet / "job").mkdir(parents=True)
    shutil.copy2(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz", fleet / "job")
    locked = fleet / "locked"
    locked.mkdir()
    shutil.copy2(SAMPLES / "h200_single/kineto_single.pt.trace.json.gz", locked)
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: permissions do not stop reading")
        g = group.group(archive.open_sources([fleet], tmp_path / "work"), "folder", tmp_path / "work")
        assert [(u.path, u.why) for u in g.unread] == [("fleet/locked", "cannot read (Permission denied)")]
    finally:
        locked.chmod(0o755)
