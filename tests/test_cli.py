"""The command line: the main job, query, peaks, and the bad-input contract (one line, exit 2, nothing written)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from plasmient_report.cli import main

from . import contract
from .conftest import kernel, write_trace


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_main_job_writes_outputs_and_json(tiny_trace, tmp_path):
    out = tmp_path / "out"
    r = cli(str(tiny_trace), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["schema"] == "plasmient.verdict/1"
    for key in (
        "run",
        "utilization",
        "achieved_fraction_of_peak",
        "peak",
        "losses",
        "headroom",
        "verdict",
        "findings",
        "ranks",
        "ranges",
        "clock",
        "coverage",
    ):
        assert key in v
    assert json.loads((out / "verdict.json").read_text()) == v
    con = duckdb.connect(str(out / "run.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 2


def test_box_is_printed(tiny_trace, tmp_path):
    r = cli(str(tiny_trace), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "achieved fraction of peak" in r.stdout and "VERDICT" in r.stdout and "14%" in r.stdout


def test_query_subcommand(tiny_trace, tmp_path):
    out = tmp_path / "o"
    assert cli(str(tiny_trace), "--out", str(out), "--quiet").returncode == 0
    r = cli("query", str(out / "run.duckdb"), "SELECT name, flops FROM kernels ORDER BY start_ns", "--csv")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "name,flops" and lines[1].startswith("nvjet_sm90_tst_gemm,137438953472")
    contract.refused(contract.cli("query", out / "run.duckdb", "SELECT * FROM nope"))


def test_version_and_peaks():
    runner = CliRunner()
    assert runner.invoke(main, ["--version"]).output.startswith("plasmient-report, version")
    r = runner.invoke(main, ["peaks", "NVIDIA H200"])
    assert r.exit_code == 0 and "989.4" in r.output and "datasheet" in r.output


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    good = json.dumps({"traceEvents": [kernel("k", 1.0, 1.0, 1, 1)], "baseTimeNanoseconds": 1}).encode()
    cases = {
        "empty": b"",
        "truncated_json": good[: len(good) // 2],
        "not_a_trace": b'{"hello": [1, 2, 3]}',
        "no_gpu": json.dumps(
            {
                "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}],
                "schemaVersion": 1,
            }
        ).encode(),
        "bad_utf8": b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "\xff\xfe", "ts": 1}]}',
        "overflow": json.dumps({"schemaVersion": 1, "traceEvents": [kernel("k", 1e300, 1.0, 1, 1)]}).encode(),
        "int_overflow": b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0,'
        b' "tid": 7, "ts": 99999999999999999999999, "dur": 1}]}',
        "nan": b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
        b'"tid": 7, "ts": NaN, "dur": 1}]}',
        "binary": os.urandom(512),
    }
    paths = {}
    for name, data in cases.items():
        p = tmp / f"{name}.json"
        p.write_bytes(data)
        paths[name] = p
    gz = tmp / "truncated.json.gz"
    gz.write_bytes(gzip.compress(good * 50)[:-30])
    paths["truncated_gz"] = gz
    corrupt = bytearray(gzip.compress(good * 50))
    corrupt[20:40] = b"\x00" * 20
    (tmp / "corrupt.json.gz").write_bytes(bytes(corrupt))
    paths["corrupt_gz"] = tmp / "corrupt.json.gz"
    empty_dir = tmp / "nothing_here"
    empty_dir.mkdir()
    (empty_dir / "notes.txt").write_text("hello")
    paths["empty_dir"] = empty_dir
    paths["missing"] = tmp / "does_not_exist.json"
    return paths


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "truncated_json",
        "not_a_trace",
        "no_gpu",
        "bad_utf8",
        "overflow",
        "int_overflow",
        "nan",
        "binary",
        "truncated_gz",
        "corrupt_gz",
        "empty_dir",
        "missing",
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, case):
    inputs = tmp_path / "in"
    inputs.mkdir()
    path = _bad_inputs(inputs)[case]
    out = tmp_path / "out"
    contract.check_cli(path, "--out", out, inputs=[path], out=out, expect="bad")


def test_output_inside_input_folder_is_refused(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    write_trace(d / "a.json", [kernel("k", 1.0, 1.0, 1, 1)])
    assert "input" in contract.refused(contract.cli(d, "--out", d / "out"), [d], d / "out")


def test_an_internal_error_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """The contract holds even for a bug of ours: one line, exit 2, no traceback (unless --debug)."""
    from plasmient_report import pipeline

    def boom(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr(pipeline, "analyse", boom)
    sample = Path(__file__).resolve().parent.parent / "sample_traces/h200_single/kineto_single.pt.trace.json.gz"
    r = CliRunner().invoke(main, [str(sample), "--out", str(tmp_path / "o")])
    line = contract.one_line(r.stderr)
    assert r.exit_code == 2 and "internal error (KeyError" in line and "--debug" in line
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(main, [str(sample), "--out", str(tmp_path / "o"), "--debug"])
    assert isinstance(r.exception, KeyError)


def test_runtime_calls_without_gpu_activity_say_what_was_not_recorded(tmp_path):
    """A profile with launches but no kernels (torch.profiler without ProfilerActivity.CUDA: a public trace of
    HazyResearch/zoology has exactly this) is refused naming what is missing, not called CPU-only."""
    from .conftest import cpu_op

    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0}
    p = tmp_path / "t.json"
    write_trace(p, [cpu_op("aten::mm", 1.0, 9.0, 1), {**launch, "args": {"correlation": 1, "External id": 1}}])
    r = cli(str(p), "--out", str(tmp_path / "out"))
    assert contract.refused(contract.Run(r.returncode, r.stdout, r.stderr))
    assert "1 GPU runtime calls, 1 of them launches or copies, but no GPU kernels" in r.stderr
    assert "ProfilerActivity.CUDA" in r.stderr
    # Runtime calls that give the GPU no work (device queries: a public nsys export of CO18326/uvmTorch has only
    # cuModuleGetLoadingMode and cudaGetDeviceProperties) say so, not that the GPU's records were lost.
    query = {**launch, "name": "cudaGetDeviceProperties"}
    p2 = tmp_path / "query.json"
    write_trace(p2, [cpu_op("aten::mm", 1.0, 9.0, 1), {**query, "args": {"correlation": 1, "External id": 1}}])
    r = cli(str(p2), "--out", str(tmp_path / "out3"))
    assert contract.refused(contract.Run(r.returncode, r.stdout, r.stderr))
    assert "no launch or copy among them" in r.stderr and "gave the GPU no work" in r.stderr
    assert "ProfilerActivity.CUDA" not in r.stderr
    # A copy call is work given to the GPU too; a ROCm program's tracer is roctracer, not CUPTI alone.
    copy = {**launch, "name": "hipMemcpyAsync"}
    p3 = tmp_path / "copy.json"
    write_trace(p3, [cpu_op("aten::copy_", 1.0, 9.0, 1), {**copy, "args": {"correlation": 1, "External id": 1}}])
    r = cli(str(p3), "--out", str(tmp_path / "out4"))
    assert contract.refused(contract.Run(r.returncode, r.stdout, r.stderr))
    assert "1 of them launches or copies" in r.stderr and "roctracer" in r.stderr, r.stderr
    q = tmp_path / "cpu.json"
    write_trace(q, [cpu_op("aten::mm", 1.0, 9.0, 1)])
    r = cli(str(q), "--out", str(tmp_path / "out2"))
    assert r.returncode == 2 and "CPU-only profile" in r.stderr


@pytest.mark.parametrize(("env", "want"), [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_command_line_gives_arrow_the_system_allocator_unless_told(env: str | None, want: str) -> None:
    """The command line's process (and the page worker it starts) allocates Arrow's buffers with the C library's
    allocator (cli.py says why); a user's ARROW_DEFAULT_MEMORY_POOL is kept."""
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env is not None:
        environ["ARROW_DEFAULT_MEMORY_POOL"] = env
    code = "import plasmient_report.cli, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


@pytest.mark.parametrize("env", [None, "2"])
def test_the_command_line_starts_no_blas_threads_unless_told(env: str | None) -> None:
    """The command line's process loads numpy with OpenBLAS's own threads off (cli.py says why): after importing the
    CLI (which loads numpy) the process runs only its main thread and what DuckDB starts on import, where numpy alone
    starts one BLAS thread per further core. A user's OPENBLAS_NUM_THREADS is kept. Threads counted in
    /proc/self/task (Linux)."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts the process's threads in /proc/self/task (Linux only)")
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env is not None:
        environ["OPENBLAS_NUM_THREADS"] = env

    def threads(code: str, blas: str | None = None) -> tuple[int, str]:
        code += "; import numpy, os; print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"
        env_run = environ if blas is None else {**environ, "OPENBLAS_NUM_THREADS": blas}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_run, timeout=120)
        assert r.returncode == 0, r.stderr
        n, value = r.stdout.split()
        return int(n), value

    n_numpy, _ = threads("pass")  # numpy alone: 1 + its BLAS threads (none on one core, or where env says 1)
    # what DuckDB starts of its own when imported (none in 2.0.1; 1.5 started one), numpy's BLAS threads off
    n_duckdb, _ = threads("import duckdb", blas="1")
    n_cli, value = threads("import plasmient_report.cli")
    if env is None:
        assert (n_cli, value) == (n_duckdb, "1")
        if (os.cpu_count() or 1) > 1:
            assert n_numpy > 1  # (what the setting saves: numpy without it starts threads here)
    else:
        assert value == env and n_cli == n_numpy + n_duckdb - 1  # the user's setting, as numpy alone has it


def test_the_console_script_leaves_the_last_collections_out_and_main_alone_does_not(tiny_trace: Path, tmp_path: Path) -> None:
    """The installed command and `python -m plasmient_report.cli` run `cli.run`: the main job, then every object the
    process holds frozen out of the interpreter's shutdown collections (cli.run says why), after the outputs are
    complete. `main` called by a process that goes on (these tests, a program embedding the tool) freezes nothing."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    scripts = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["plasmient-report"] == "plasmient_report.cli:run"
    code = (
        "import atexit, gc, sys\n"
        "import plasmient_report.cli as c\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count(), flush=True))\n"
        f"c.main([{str(tiny_trace)!r}, '--out', {str(tmp_path / 'a')!r}, '--quiet'], standalone_mode=False)\n"
        "print('after main', gc.get_freeze_count(), flush=True)\n"
        f"sys.argv = ['plasmient-report', {str(tiny_trace)!r}, '--out', {str(tmp_path / 'b')!r}, '--quiet']\n"
        "c.run()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert int(lines["after main"]) == 0
    assert int(lines["at exit"]) > 10_000  # the modules' objects: DuckDB's, Arrow's, click's, the package's
    for out in ("a", "b"):
        assert {p.name for p in (tmp_path / out).iterdir()} >= {"verdict.json", "report.html", "trace.pftrace", "run.duckdb"}
