"""Nothing of the user's is deleted or overwritten, and the contract holds under signals (SPEC §1, issue 15).

Real folders, real signals (a subprocess, os.kill), a real read-only mount where the machine allows one. Each
subprocess gets its own TMPDIR, so its scratch folder (and what a killed run leaves there) is observable and no
other run on the machine is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from . import contract
from .conftest import ROOT, sample_file

SAMPLE = "h200_single/kineto_single.pt.trace.json.gz"


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    t = tmp / "systmp"
    t.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PLASMIENT_SYSTEM_TMPDIR"}
    env.update(TMPDIR=str(t), PYTHONPATH=str(ROOT), **extra)
    return env


def cli(
    *args: object, cwd: Path, env: dict[str, str] | None = None, umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plasmient_report.cli", *map(str, args)]
    if umask is not None:
        argv = ["plasmient-report", *map(str, args)]
        cmd = [
            sys.executable,
            "-c",
            f"import os, runpy, sys; os.umask({umask}); sys.argv = {argv!r}; "
            "runpy.run_module('plasmient_report.cli', run_name='__main__')",
        ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env or env_for(cwd), timeout=300)


def one_line_exit_2(r: subprocess.CompletedProcess[str]) -> str:
    return contract.refused(contract.Run(r.returncode, r.stdout, r.stderr))


def fake_project(folder: Path) -> Path:
    (folder / ".git" / "objects").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "train.py").write_text("print('hello')\n")
    (folder / "data").mkdir()
    (folder / "data" / "weights.bin").write_bytes(os.urandom(1024))
    return folder


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    p = d / "run.pt.trace.json.gz"
    shutil.copy(sample_file(SAMPLE), p)
    return p


# ------------------------------------------------------------------------------------------ --out refusals


def test_a_project_folder_survives(trace: Path, tmp_path: Path) -> None:
    proj = fake_project(tmp_path / "proj")
    watch = contract.Watch([], proj)
    msg = one_line_exit_2(cli(trace, "--out", proj, cwd=tmp_path))
    assert "not an earlier output" in msg and "proj" in msg
    watch.check()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "proj", "systmp"]  # nothing hidden left beside it


def test_the_current_folder_survives(trace: Path, tmp_path: Path) -> None:
    proj = fake_project(tmp_path / "proj")
    watch = contract.Watch([], proj)
    for out in (".", "./", str(proj), "..", str(tmp_path)):
        msg = one_line_exit_2(cli(trace, "--out", out, cwd=proj, env=env_for(tmp_path)))
        assert "current folder" in msg or "not an earlier output" in msg, msg
    watch.check()


def test_home_root_and_an_unexpanded_tilde_are_refused(trace: Path, tmp_path: Path) -> None:
    home = fake_project(tmp_path / "home")
    env = env_for(tmp_path, HOME=str(home))
    watch = contract.Watch([], home)
    assert "home folder" in one_line_exit_2(cli(trace, "--out", home, cwd=tmp_path, env=env))
    assert "root" in one_line_exit_2(cli(trace, "--out", "/", cwd=tmp_path, env=env))
    assert "'~'" in one_line_exit_2(cli(trace, "--out", "~", cwd=tmp_path, env=env))
    assert "'~'" in one_line_exit_2(cli(trace, "--out", "~/x", cwd=tmp_path, env=env))
    watch.check()
    assert not (tmp_path / "~").exists()


def test_a_file_and_a_path_under_a_file_are_refused(trace: Path, tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert "not a folder" in one_line_exit_2(cli(trace, "--out", f, cwd=tmp_path))
    assert "not a folder" in one_line_exit_2(cli(trace, "--out", f / "sub" / "out", cwd=tmp_path))
    assert f.read_text() == "mine"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_a_symlink_is_refused_and_its_target_kept(trace: Path, tmp_path: Path) -> None:
    proj = fake_project(tmp_path / "proj")
    (tmp_path / "link").symlink_to(proj)
    watch = contract.Watch([], proj)
    assert "symbolic link" in one_line_exit_2(cli(trace, "--out", tmp_path / "link", cwd=tmp_path))
    watch.check()


def test_a_mount_point_is_refused(trace: Path, tmp_path: Path) -> None:
    mount = next((Path(p) for p in ("/proc", "/sys", "/dev") if os.path.ismount(p)), None)
    if mount is None:
        pytest.skip("no mount point found to test with")
    assert "mount point" in one_line_exit_2(cli(trace, "--out", mount, cwd=tmp_path))


def test_an_unwritable_place_is_refused_before_the_analysis(trace: Path, tmp_path: Path) -> None:
    # /proc accepts no folders: the probe says so in one line, before minutes of analysis.
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    msg = one_line_exit_2(cli(trace, "--out", "/proc/plasmient-out", cwd=tmp_path))
    assert "cannot create folders in /proc" in msg


@pytest.fixture
def read_only_mount(tmp_path: Path):
    """A real read-only file system (tmpfs mounted ro): needs root in a sandbox that allows mounts."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({r.stderr.strip() or 'not root'})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_read_only_file_system_is_refused(trace: Path, tmp_path: Path, read_only_mount: Path) -> None:
    assert "read-only file system" in one_line_exit_2(cli(trace, "--out", read_only_mount / "out", cwd=tmp_path))
    assert "read-only file system" in one_line_exit_2(cli("batch", trace.parent, "--out", read_only_mount / "b", cwd=tmp_path))


# ------------------------------------------------------------------------------------ replacing our own


def test_an_earlier_output_is_replaced_and_nothing_is_left_beside_it(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / "run"
    for _ in range(2):
        r = cli(trace, "--out", out, "--quiet", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    marker = json.loads((out / ".plasmient-output").read_text())
    assert marker["kind"] == "run" and set(marker["files"]) == {"verdict.json", "report.html", "trace.pftrace", "run.duckdb"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]  # no .run.old.PID, no staging
    # With a file of the user's in it, it is not ours alone any more: refused, the file kept.
    (out / "my_notes.txt").write_text("keep me")
    assert "did not write (my_notes.txt)" in one_line_exit_2(cli(trace, "--out", out, cwd=tmp_path))
    assert (out / "my_notes.txt").read_text() == "keep me" and (out / "verdict.json").is_file()


def test_an_empty_folder_and_an_output_of_an_earlier_version_are_used(trace: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(trace, "--out", empty, "--quiet", "--no-html", "--no-trace", cwd=tmp_path).returncode == 0
    assert (empty / "verdict.json").is_file()
    # Before the marker existed: a folder holding only the tool's four files, with a plasmient verdict.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "verdict.json").write_text(json.dumps({"schema": "plasmient.verdict/1"}))
    (legacy / "report.html").write_text("<html></html>")
    assert cli(trace, "--out", legacy, "--quiet", cwd=tmp_path).returncode == 0
    assert (legacy / ".plasmient-output").is_file() and (legacy / "trace.pftrace").is_file()
    # A folder holding a file named verdict.json that is not ours is not an earlier output.
    other = tmp_path / "other"
    other.mkdir()
    (other / "verdict.json").write_text('{"court": "guilty"}')
    one_line_exit_2(cli(trace, "--out", other, cwd=tmp_path))
    assert (other / "verdict.json").read_text() == '{"court": "guilty"}'


def test_outputs_follow_the_umask(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "shared" / "run"
    r = cli(trace, "--out", out, "--quiet", cwd=tmp_path, umask=0o002)
    assert r.returncode == 0, r.stderr
    assert (out.stat().st_mode & 0o777) == 0o775 and (out.parent.stat().st_mode & 0o777) == 0o775
    for p in out.iterdir():
        assert (p.stat().st_mode & 0o777) == 0o664, p


def test_batch_out_must_be_new_empty_or_an_earlier_batch(trace: Path, tmp_path: Path) -> None:
    f = tmp_path / "summary.txt"
    f.write_text("mine")
    assert "not a folder" in one_line_exit_2(cli("batch", trace.parent, "--out", f, cwd=tmp_path))
    proj = fake_project(tmp_path / "proj")
    watch = contract.Watch([], proj)
    assert "not an earlier output" in one_line_exit_2(cli("batch", trace.parent, "--out", proj, cwd=tmp_path))
    watch.check()
    assert f.read_text() == "mine"
    out = tmp_path / "fleet"
    r = cli("batch", trace.parent, "--out", out, "--quiet", "--no-html", "--no-trace", "--jobs", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / ".plasmient-output").read_text())["kind"] == "batch"
    # A run's folder is not a batch folder, and a batch folder not a run's.
    run_dir = next((out / "runs").iterdir())
    assert "output of a plasmient-report run" in one_line_exit_2(cli("batch", trace.parent, "--out", run_dir, cwd=tmp_path))
    assert "output of a plasmient-report batch" in one_line_exit_2(cli(trace, "--out", out, cwd=tmp_path))
    r = cli("batch", trace.parent, "--out", out, "--no-html", "--no-trace", "--jobs", "1", cwd=tmp_path)
    assert r.returncode == 0 and "skipped 1 (unchanged)" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_batch_on_a_fifo_or_a_device_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        target = tmp_path / "archive.tar"
        os.mkfifo(target)
    else:
        target = Path("/dev/zero")
        if not target.exists():
            pytest.skip("no /dev/zero")
    msg = one_line_exit_2(cli("batch", target, "--out", tmp_path / "b", cwd=tmp_path))  # timeout=300: a hang fails
    assert ("FIFO" in msg if kind == "fifo" else "device" in msg) and not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------------------------- signals


STALL = """
import os, sys, time
from pathlib import Path
FLAG = Path(os.environ["STALL_FLAG"])
WHERE = os.environ["STALL_WHERE"]


def stall(*_a, **_k):
    FLAG.mkdir(exist_ok=True)
    (FLAG / str(os.getpid())).write_text("")
    time.sleep(120)


if WHERE == "writing":  # inside the staging folder, after verdict.json
    from plasmient_report.render import verdict as _v
    _write = _v.write
    def write(v, path):
        _write(v, path)
        stall()
    _v.write = write
elif WHERE == "analysing":  # after the ingest (the store holds the trace; spill and segments in scratch)
    from plasmient_report import align as _a
    _a.align = lambda *a, **k: stall()
elif WHERE == "in-duckdb":  # inside a long DuckDB query, which turns a signal into RuntimeError
    from plasmient_report import align as _a

    def busy(con, *a, **k):
        FLAG.mkdir(exist_ok=True)
        (FLAG / str(os.getpid())).write_text("")
        con.execute("SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3").fetchall()
    _a.align = busy
elif WHERE == "batch-worker":  # in each pool worker (spawned workers import this file as __mp_main__)
    from plasmient_report.batch import mapper as _m
    _m._analyse = lambda *a, **k: stall()

if __name__ == "__main__":
    from plasmient_report.cli import main
    main(sys.argv[1:], prog_name="plasmient-report")
"""


def stalled(tmp: Path, where: str, *args: object) -> tuple[subprocess.Popen[str], Path, dict[str, str]]:
    """The CLI, stopped at `where` until signalled; returns once it got there."""
    script = tmp / "stalled_cli.py"
    script.write_text(STALL)
    flag = tmp / f"flag-{where}"
    env = env_for(tmp, STALL_FLAG=str(flag), STALL_WHERE=where)
    p = subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        cwd=tmp,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for _ in range(3000):  # up to 5 min on a loaded machine: waiting for an event, not timing anything
        if flag.is_dir() and any(flag.iterdir()):
            break
        if p.poll() is not None:
            raise AssertionError(f"exited before the stall: {p.returncode} {p.communicate()}")
        time.sleep(0.1)
    else:
        p.kill()
        raise AssertionError("never reached the stall")
    return p, flag, env


def scratch_root(env: dict[str, str]) -> Path:
    return Path(env["TMPDIR"]) / f"plasmient-{os.getuid()}"


def leftovers(tmp: Path, env: dict[str, str]) -> list[str]:
    hidden = [str(p) for p in tmp.rglob(".plasmient-*") if p.name not in (".plasmient-output",)]
    root = scratch_root(env)
    runs = [str(p) for p in root.iterdir()] if root.exists() else []
    old = [str(p) for p in Path(env["TMPDIR"]).glob("plasmient-[sk]*")]  # earlier versions' spill / NDJSON
    return hidden + runs + old


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")])
@pytest.mark.parametrize("where", ["analysing", "in-duckdb", "writing"])
def test_interrupted_run_says_so_and_leaves_nothing(
    trace: Path, tmp_path: Path, sig: int, code: int, word: str, where: str
) -> None:
    out = tmp_path / "out"
    p, _, env = stalled(tmp_path, where, trace, "--out", out)
    if where == "writing":
        assert any(tmp_path.glob(".plasmient-staging-out-*"))  # it was mid-write: the staging folder is there
    assert any(scratch_root(env).iterdir())
    os.kill(p.pid, sig)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == code, (stdout, stderr)
    assert stderr.strip().splitlines() == [f"plasmient-report: {word}"]
    assert not out.exists() and leftovers(tmp_path, env) == []


def test_a_killed_run_is_swept_by_the_next(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    p, _, env = stalled(tmp_path, "writing", trace, "--out", out)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    left = leftovers(tmp_path, env)
    assert any(".plasmient-staging-out-" in x for x in left) and any("run-" in x for x in left), left
    r = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", trace, "--out", tmp_path / "second", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert leftovers(tmp_path, env) == [] and not out.exists()


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie no one reaped is dead
    except OSError:
        return True


def _errors(out: Path) -> list[object]:
    """The failed runs' one-line errors from the batch's summary.parquet (for an assertion's message)."""
    import pyarrow.parquet as pq

    t = pq.read_table(out / "summary.parquet", columns=["run_id", "error"]).to_pylist()
    return [r for r in t if r["error"]]


def _batch_tree(tmp: Path) -> Path:
    fleet = tmp / "fleet"
    for name in ("a", "b"):
        (fleet / name).mkdir(parents=True)
        shutil.copy(sample_file(SAMPLE), fleet / name / "run.pt.trace.json.gz")
    return fleet


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_batch_workers_die_with_the_batch(tmp_path: Path, sig: int) -> None:
    fleet = _batch_tree(tmp_path)
    out = tmp_path / "b"
    p, flag, env = stalled(tmp_path, "batch-worker", "batch", fleet, "--out", out, "--jobs", "2")
    for _ in range(600):  # both workers at their run
        if len(list(flag.iterdir())) == 2:
            break
        time.sleep(0.1)
    workers = [int(x.name) for x in flag.iterdir()]
    assert workers and p.pid not in workers
    os.kill(p.pid, sig)
    _, stderr = p.communicate(timeout=120)
    for _ in range(600):
        if all(_dead(w) for w in workers):
            break
        time.sleep(0.1)
    assert all(_dead(w) for w in workers), "orphaned pool workers"
    assert not any((out / "runs").glob("*")) if (out / "runs").exists() else True
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig and len(stderr.strip().splitlines()) == 1, stderr
    # Whatever they left (SIGKILL: the parent's scratch) is gone after the next run.
    r = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", "batch", fleet, "--out", out, "--quiet", "--no-html", "--no-trace"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(x.name for x in (out / "runs").iterdir()) == ["fleet__a", "fleet__b"], (r.stdout, r.stderr, _errors(out))
    left = leftovers(tmp_path, env)
    assert left == [], (left, {p: Path(p).read_text() for p in left if p.endswith(".lock")}, workers, p.pid)


# ------------------------------------------------------------------------------------------- odd file names


def test_a_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    name = os.fsdecode(b"r\xffn\xfe.pt.trace.json.gz")
    shutil.copy(sample_file(SAMPLE), d / name)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", d / name, "--out", out, "--json"],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout.decode("utf-8"))  # valid UTF-8 JSON: the odd bytes are escaped, not dropped
    assert v["run"]["inputs"][0].endswith("r\\xffn\\xfe.pt.trace.json.gz")
    assert json.loads((out / "verdict.json").read_bytes().decode("utf-8")) == v
    # Batch: a run folder with such a name is a run like any other, named with the escape in the summary.
    odd = tmp_path / "fleet" / os.fsdecode(b"j\xffb")
    odd.mkdir(parents=True)
    shutil.copy(sample_file(SAMPLE), odd / "run.pt.trace.json.gz")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "plasmient_report.cli",
            "batch",
            tmp_path / "fleet",
            "--out",
            tmp_path / "b",
            "--quiet",
            "--no-trace",
        ],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "b" / "summary.parquet").to_pylist()
    assert [x["run_id"] for x in rows if x["level"] == "run"] == ["fleet/j\\xffb"]
    assert rows[0]["status"] == "ok"


def test_runs_staged_at_once_into_a_new_folder_all_land(tmp_path: Path) -> None:
    """Batch workers stage their runs into `runs/` at the same moment; whoever creates the shared parent first, every
    run lands (a CI run lost one: both saw `runs/` missing and the second mkdir failed)."""
    import threading

    from plasmient_report import outdir

    n, rounds = 8, 40
    for k in range(rounds):
        parent = tmp_path / f"b{k}" / "runs"
        gate = threading.Barrier(n)
        errors: list[BaseException] = []

        def one(i: int, parent: Path = parent, gate: threading.Barrier = gate, errors: list[BaseException] = errors) -> None:
            gate.wait()
            try:
                with outdir.staged(parent / f"run{i}") as new:
                    (new / "verdict.json").write_text("{}")
            except BaseException as e:  # noqa: BLE001 — collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], (k, errors)
        assert sorted(x.name for x in parent.iterdir()) == sorted(f"run{i}" for i in range(n))


def test_a_sweep_keeps_a_run_folder_whose_lock_its_listing_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory read is no snapshot: a run created while another run sweeps may show its folder but not its lock
    (made just before). The sweep asks for the lock again before it removes a folder as a leftover."""
    from plasmient_report import scratch

    live = scratch.Scratch.create(tmp_path)
    orphan = tmp_path / "run-1-orphan"
    orphan.mkdir()  # a real leftover: no lock at all
    real_scandir = os.scandir

    def listing_without_locks(path: Any = ".") -> Any:
        if not isinstance(path, str | os.PathLike) or Path(path) != tmp_path:  # shutil.rmtree reads folders too
            return real_scandir(path)
        return [e for e in real_scandir(str(path)) if not e.name.endswith(".lock")]

    monkeypatch.setattr(scratch.os, "scandir", listing_without_locks)
    try:
        removed = scratch.sweep(tmp_path)
        assert live.path.is_dir() and live.lock_path.exists()
        assert removed == [orphan] and not orphan.exists()
    finally:
        live.close()
