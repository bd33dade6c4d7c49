"""The `plasmient` nsys recipe without Nsight Systems: its pure parts (shim) on the committed nsys exports, and the
Recipe module driven through a minimal stand-in of the framework's documented API (`recipe.Recipe`,
`context.map`/`wait`, `add_output_file`, `create_analysis_file`, `Option.INPUT`) — a fake written here, not
NVIDIA's code. The real recipe ran on the GPU machine (README, "Inside Nsight Systems")."""

from __future__ import annotations

import argparse
import enum
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from plasmient_report.nsys_recipe import recipe_path, shim

from .conftest import sample_file

RECIPE_DIR = recipe_path() / "plasmient"


# ----------------------------------------------------------------------------- a stand-in for the framework


class _Option(enum.Enum):
    OUTPUT = "output"
    FORCE_OVERWRITE = "force_overwrite"
    INPUT = "input"


class _Parser(argparse.ArgumentParser):
    def __init__(self) -> None:
        super().__init__(prog="nsys recipe plasmient")
        self.recipe_group = self.add_argument_group("recipe")

    def add_recipe_argument(self, option: _Option, required: bool = False) -> None:
        if option is _Option.INPUT:  # the framework expands folders into their .nsys-rep files
            self.recipe_group.add_argument("--input", nargs="+", required=required)
        elif option is _Option.OUTPUT:
            self.recipe_group.add_argument("--output")
        else:
            self.recipe_group.add_argument("--force-overwrite", action="store_true")


class _Recipe:
    """What the recipe uses of nsys_recipe.lib.recipe.Recipe (2025.3.1): constructed with the parsed arguments;
    run(context) starts the analysis record; add_output_file(name, filetype) gives a path in the output folder
    (made on first use) and lists typed files for the .nsys-analysis file."""

    def __init__(self, parsed_args: argparse.Namespace) -> None:
        self._parsed_args = parsed_args
        self._output_dir: str | None = None
        self._output_files: dict[str, str] = {}
        self._analysis_dict: dict[str, Any] = {}

    def run(self, context: Any) -> None:
        self._analysis_dict = {"RecipeName": "plasmient", "Options": {k: v for k, v in vars(self._parsed_args).items()}}

    def get_output_dir(self) -> str:
        if self._output_dir is None:
            self._output_dir = self._parsed_args.output
            Path(self._output_dir).mkdir(parents=True)
        return self._output_dir

    def add_output_file(self, filename: str, filetype: str | None = None) -> str:
        if filetype:
            self._output_files[filename] = filetype
        return str(Path(self.get_output_dir()) / filename)

    def create_analysis_file(self) -> None:
        name = Path(self.get_output_dir()).name
        Path(self.add_output_file(f"{name}.nsys-analysis")).write_text(json.dumps(self._analysis_dict, indent=4))

    @classmethod
    def get_argument_parser(cls) -> _Parser:
        parser = _Parser()
        parser.add_recipe_argument(_Option.OUTPUT)
        parser.add_recipe_argument(_Option.FORCE_OVERWRITE)
        return parser


class _Context:
    """Sequential mode: map calls the function on each item; wait returns the results in order."""

    def map(self, func: Any, iterable: Any, **kw: Any) -> list[Any]:
        return [func(x, **kw) for x in iterable]

    def wait(self, results: Any) -> Any:
        return results


@pytest.fixture
def recipe_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    pkg = types.ModuleType("nsys_recipe")
    pkg.__file__ = str(tmp_path / "packages" / "nsys_recipe" / "__init__.py")  # no nsys beside it
    lib = types.ModuleType("nsys_recipe.lib")
    rec = types.ModuleType("nsys_recipe.lib.recipe")
    rec.Recipe = _Recipe  # type: ignore[attr-defined]
    args = types.ModuleType("nsys_recipe.lib.args")
    args.Option = _Option  # type: ignore[attr-defined]
    for name, mod in (
        ("nsys_recipe", pkg),
        ("nsys_recipe.lib", lib),
        ("nsys_recipe.lib.recipe", rec),
        ("nsys_recipe.lib.args", args),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location("plasmient_recipe_under_test", RECIPE_DIR / "plasmient.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the recipe folder


def test_recipe_folder_is_what_nsys_loads() -> None:
    meta = json.loads((RECIPE_DIR / "metadata.json").read_text())
    assert meta["module_name"] == "plasmient" and (RECIPE_DIR / "plasmient.py").is_file()
    assert meta["display_name"] and meta["description"]


def test_cli_prints_the_recipe_path() -> None:
    from click.testing import CliRunner

    from plasmient_report.cli import main

    r = CliRunner().invoke(main, ["nsys-recipe-path"])
    assert r.exit_code == 0
    assert Path(r.output.strip()) == recipe_path() and (Path(r.output.strip()) / "plasmient" / "metadata.json").is_file()


def test_only_the_recipe_module_imports_nsys_recipe() -> None:
    root = recipe_path().parent
    importers = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "import nsys_recipe" in p.read_text() or "from nsys_recipe" in p.read_text()
    )
    assert importers == ["nsys_recipe/plasmient/plasmient.py"]


# ----------------------------------------------------------------------------- job identity


def test_job_identity_from_captured_environments() -> None:
    rank0 = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc", "__PID__": "11"}
    rank1 = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc", "__PID__": "12"}
    shell = {"HOME": "/root", "TORCHELASTIC_RUN_ID": "zzz"}  # no rank: an unrelated process nsys could read
    assert shim.job_identity([rank0, shell]) == ("TORCHELASTIC_RUN_ID=abc", 0, 2)
    # one report holding both workers: one job, no single rank (the parser numbers them per process)
    assert shim.job_identity([rank0, rank1]) == ("TORCHELASTIC_RUN_ID=abc", None, 2)
    assert shim.job_identity([{"SLURM_PROCID": "3", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "8"}]) == ("SLURM_JOB_ID=77", 3, 8)
    assert shim.job_identity([{"RANK": "0", "MASTER_PORT": "29500"}]) == (None, 0, None)  # a port is no job
    assert shim.job_identity([shell]) == (None, None, None)
    # two disagreeing jobs in one report: no job is named (the report becomes a run of its own)
    assert shim.job_identity([rank0, {**rank1, "TORCHELASTIC_RUN_ID": "other"}])[0] is None


def _info(report: str, job: str | None, export: str | None = None, error: str | None = None) -> shim.ReportInfo:
    return shim.ReportInfo(report, export if export is not None or error else report + ".sqlite", job, None, None, None, error)


def test_reports_of_one_job_are_one_run() -> None:
    infos = [
        _info("/r/a/jobA_rank0.nsys-rep", "TORCHELASTIC_RUN_ID=x"),
        _info("/r/a/jobA_rank1.nsys-rep", "TORCHELASTIC_RUN_ID=x"),
        _info("/r/a/other.nsys-rep", None),
        _info("/r/a/late.nsys-rep", "TORCHELASTIC_RUN_ID=y"),
        _info("/r/a/broken.nsys-rep", None, error="/r/a/broken.nsys-rep: not a report"),
    ]
    g = shim.group_reports(infos, "job", "a")
    assert sorted((r.run_id, r.inputs) for r in g.runs) == [
        ("a/jobA", ("/r/a/jobA_rank0.nsys-rep.sqlite", "/r/a/jobA_rank1.nsys-rep.sqlite")),
        ("a/late", ("/r/a/late.nsys-rep.sqlite",)),
        ("a/other", ("/r/a/other.nsys-rep.sqlite",)),
    ]
    assert [(o.run_id, o.status, o.error) for o in g.failed] == [("a/broken", "failed", "/r/a/broken.nsys-rep: not a report")]
    assert g.run_of["/r/a/jobA_rank1.nsys-rep"] == "a/jobA"
    assert len(shim.group_reports(infos, "report", "a").runs) == 4
    assert len(shim.group_reports(infos, "folder", "a").runs) == 1
    # differently named ranks of one job: the run is named by the job
    g2 = shim.group_reports([_info("/r/n0.nsys-rep", "SLURM_JOB_ID=5"), _info("/r/m1.nsys-rep", "SLURM_JOB_ID=5")])
    assert [r.run_id for r in g2.runs] == ["nsys/job-5"]
    # one folder per node: still one job, one run
    g3 = shim.group_reports([_info("/j/node0/r0.nsys-rep", "SLURM_JOB_ID=5"), _info("/j/node1/r1.nsys-rep", "SLURM_JOB_ID=5")])
    assert [(r.run_id, len(r.inputs)) for r in g3.runs] == [("nsys/job-5", 2)]


def test_nsys_beside_the_recipe_framework(tmp_path: Path) -> None:
    pkg = tmp_path / "target-linux-x64" / "python" / "packages" / "nsys_recipe"
    pkg.mkdir(parents=True)
    assert shim.nsys_for(pkg) is None
    exe = tmp_path / "target-linux-x64" / "nsys"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert shim.nsys_for(pkg) == str(exe.resolve())


def test_probe_reads_the_committed_reports() -> None:
    ddp = shim.probe_report(str(sample_file("h200x2_ddp/nsys/nsys_ddp.sqlite")), "/nonexistent-cache")
    assert ddp.error is None and ddp.export == ddp.report and ddp.host
    # recorded under `env -i` (sample_traces/README.md): no rank variables captured, so no job and no rank
    assert (ddp.job, ddp.rank) == (None, None)
    bad = shim.probe_report(str(sample_file("README.md")), "/nonexistent-cache")
    assert bad.export is None and bad.error and "README.md" in bad.error


def test_recipe_end_to_end_on_committed_exports(recipe_module: Any, tmp_path: Path) -> None:
    """Two committed reports through the Recipe subclass (stand-in framework, sequential mode): one run each, the
    fleet summary, reports.parquet, the notebook and the analysis file; numbers as the main job gives them."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for rel in ("h200_single/nsys_single.sqlite", "h200x2_ddp/nsys/nsys_ddp.sqlite"):
        shutil.copy(sample_file(rel), inputs / Path(rel).name)
    parser = recipe_module.Plasmient.get_argument_parser()
    out = tmp_path / "out"
    args = parser.parse_args(["--input", *map(str, sorted(inputs.iterdir())), "--output", str(out), "--no-trace"])
    r = recipe_module.Plasmient(args)
    r.run(_Context())
    for name in ("summary.parquet", "index.html", "reports.parquet", "plasmient.ipynb", "out.nsys-analysis"):
        assert (out / name).is_file(), name
    analysis = json.loads((out / "out.nsys-analysis").read_text())
    assert analysis["Outputs"] == {
        "summary.parquet": "Parquet",
        "index.html": "HTML",
        "reports.parquet": "Parquet",
        "plasmient.ipynb": "Notebook",
        "runs": "Folder",
    }
    rows = pq.read_table(out / "summary.parquet").to_pylist()
    runs = {x["run_id"]: x for x in rows if x["level"] == "run"}
    assert sorted(runs) == ["in/nsys_ddp", "in/nsys_single"] and all(x["status"] == "ok" for x in runs.values())
    assert runs["in/nsys_ddp"]["world_size"] == 2
    assert (out / "runs" / "in__nsys_single" / "report.html").is_file()
    nb = json.loads((out / "plasmient.ipynb").read_text())
    assert nb["nbformat"] == 4 and any("summary.parquet" in "".join(c["source"]) for c in nb["cells"])
    rep = pq.read_table(out / "reports.parquet").to_pylist()
    assert {x["run_id"] for x in rep} == set(runs) and all(x["status"] == "ok" for x in rep)
    # the same numbers as the main job on the same export (the recipe is a shim, not a second analysis)
    from plasmient_report import pipeline

    res = pipeline.analyse([inputs / "nsys_single.sqlite"], pipeline.Options(write_html=False, write_trace=False))
    try:
        assert runs["in/nsys_single"]["achieved_fraction_of_peak"] == pytest.approx(
            res.verdict["achieved_fraction_of_peak"], rel=1e-9
        )
        assert runs["in/nsys_single"]["utilization"] == pytest.approx(res.verdict["utilization"]["trace"], rel=1e-9)
    finally:
        res.close()


def test_a_partial_sibling_export_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's recipes leave `<report>_pqtdir` beside a report with only the tables they read: the probe exports
    the whole report into its cache instead (here through a stand-in `nsys` that writes a committed export)."""
    rep = tmp_path / "reports" / "nsys_single.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"not read by the stand-in")
    partial = rep.with_name("nsys_single_pqtdir")
    partial.mkdir()
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"):
        shutil.copy(sample_file(f"h200_single/nsys_single_pqtdir/{table}.parquet"), partial)
    fake = tmp_path / "nsys"
    fake.write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --output ] && out=$2; shift; done\n'
        f"cp '{sample_file('h200_single/nsys_single.sqlite')}' \"$out\"\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("NSYS", str(fake))
    info = shim.probe_report(str(rep), str(tmp_path / "cache"))
    assert info.error is None and info.export is not None
    assert Path(info.export).suffix == ".sqlite" and (tmp_path / "cache") in Path(info.export).parents
    assert sorted(p.name for p in rep.parent.iterdir()) == ["nsys_single.nsys-rep", "nsys_single_pqtdir"]  # untouched


# ----------------------------------------------------------------------------- against NVIDIA's own recipes
# sample_traces/h200_nsys_recipe/nvidia/: what Nsight Systems 2025.3.1's recipes gave on the GPU machine for the
# same reports (README there): cuda_gpu_kern_sum, gpu_time_util (--chunks 1 --threshold 100: one chunk per
# process and GPU, every chunk listed), nccl_gpu_overlap_trace. Each report is the export committed beside it.

CROSS = {
    "single": ["h200_single/nsys_single.sqlite"],
    "ddp": ["h200x2_ddp/nsys/nsys_ddp.sqlite"],
    "gloo": ["h200_nsys_recipe/gloo_rank0.sqlite", "h200_nsys_recipe/gloo_rank1.sqlite"],
}


def _nvidia(recipe: str, case: str, table: str) -> tuple[list[dict[str, Any]], list[str]]:
    d = sample_file(f"h200_nsys_recipe/nvidia/{recipe}-{case}")
    return pq.read_table(d / f"{table}.parquet").to_pylist(), [r["File"] for r in pq.read_table(d / "files.parquet").to_pylist()]


@pytest.fixture(scope="module")
def analysed() -> Any:
    from plasmient_report import pipeline

    out = {}
    for case, rels in CROSS.items():
        files = [sample_file(r) for r in rels]
        out[case] = (files, pipeline.analyse(files, pipeline.Options(write_html=False, write_trace=False)))
    yield out
    for _, res in out.values():
        res.close()


@pytest.mark.parametrize("case", sorted(CROSS))
def test_kernel_time_per_name_equals_cuda_gpu_kern_sum(analysed: Any, case: str) -> None:
    import sqlite3

    files, res = analysed[case]
    nv, nv_files = _nvidia("cuda_gpu_kern_sum", case, "rank_stats")
    for sid, f in enumerate(files):
        # NVIDIA names kernels by their short name; ours are demangled: the export maps one to the other.
        sq = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        short = dict(
            sq.execute(
                "SELECT d.value, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d "
                "ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName GROUP BY 1, 2"
            )
        )
        sq.close()
        ours: dict[str, list[int]] = {}
        for name, n, total in res.con.execute(
            "SELECT name, count(*), sum(end_ns - start_ns) FROM kernels WHERE source_id = ? "
            "AND kind IN ('compute', 'nccl') GROUP BY name",
            [sid],
        ).fetchall():
            acc = ours.setdefault(short.get(name, name), [0, 0])
            acc[0] += n
            acc[1] += total
        rank = nv_files.index(f.stem)
        theirs = {r["Name"]: [r["Count"], r["Sum"]] for r in nv if r["Rank"] == rank}
        assert ours == theirs  # every kernel name, its launches and its total ns, exactly


@pytest.mark.parametrize("case", sorted(CROSS))
def test_gpu_utilization_against_gpu_time_util(analysed: Any, case: str) -> None:
    """gpu_time_util's In-Use: the durations of kernels, copies and memsets, summed (concurrent ones twice), over
    first-to-last GPU activity of each process and GPU, to 0.1%. Ours is the union (time with anything resident)
    over the analysed window: the same busy time when nothing runs concurrently, less when something does."""
    files, res = analysed[case]
    nv, nv_files = _nvidia("gpu_time_util", case, "analysis")
    assert len(nv) == len(res.verdict["ranks"])
    for row in nv:
        sid = [f.stem for f in files].index(nv_files[row["Rank"]])
        first, last, summed = res.con.execute(
            "SELECT min(raw_start), max(raw_start + (end_ns - start_ns)), sum(end_ns - start_ns) FROM kernels "
            "WHERE source_id = ? AND device = ?",
            [sid, row["Device ID"]],
        ).fetchone()
        assert (first, last - first) == (row["Start"], row["Duration"])  # the same window, to the ns
        assert 100 * summed / row["Duration"] == pytest.approx(row["In-Use"], abs=0.05)  # their rounding
        rank = next(r for r in res.verdict["ranks"] if r["device"] == row["Device ID"] and (len(files) == 1 or r["rank"] == sid))
        busy = rank["utilization"]["trace"] * rank["window_ns"]  # our utilization, back in ns
        assert busy <= summed * (1 + 1e-9)
        if case == "single":  # one stream at a time: union == sum (to 0.5%)
            assert busy == pytest.approx(summed, rel=0.005)


def test_exposed_communication_against_nccl_gpu_overlap_trace(analysed: Any) -> None:
    """nccl_gpu_overlap_trace gives each NCCL kernel's share overlapped by compute kernels (%); what is not is
    exposed. Ours: the waterfall's collective_wait + collective_transfer of each rank's window."""
    _, res = analysed["ddp"]
    trace, _ = _nvidia("nccl_gpu_overlap_trace", "ddp", "rank_trace")
    exposed: dict[int, float] = {}
    for r in trace:
        if r["Name"].startswith("nccl"):
            exposed[r["DeviceID"]] = exposed.get(r["DeviceID"], 0.0) + (r["End"] - r["Start"]) * (1 - r["Compute Overlap"] / 100)
    assert len(exposed) == 2
    for rank in res.verdict["ranks"]:
        lost = {x["category"]: x["fraction"] for x in rank["losses"]}
        ours = (lost.get("collective_wait", 0.0) + lost.get("collective_transfer", 0.0)) * rank["window_ns"]
        # 165.0 ms (rank 0, which waits for the late rank) and 10.2 ms (rank 1); overlap % has one decimal
        assert ours == pytest.approx(exposed[rank["device"]], rel=0.005)


def test_one_report_per_rank_is_one_run(analysed: Any) -> None:
    """The 2-rank gloo job (sample_traces/h200_nsys_recipe): each rank under its own `nsys profile`. The captured
    environment names the job (torchrun's TORCHELASTIC_RUN_ID) and each report's rank; the two are one run."""
    infos = [shim.probe_report(str(sample_file(f"h200_nsys_recipe/gloo_rank{r}.sqlite")), "/nonexistent") for r in (0, 1)]
    assert [(i.rank, i.world_size, i.error) for i in infos] == [(0, 2, None), (1, 2, None)]
    assert infos[0].job == infos[1].job and infos[0].job and infos[0].job.startswith("TORCHELASTIC_RUN_ID=")
    g = shim.group_reports(infos, "job", "h200_nsys_recipe")
    assert [(r.run_id, len(r.inputs)) for r in g.runs] == [("h200_nsys_recipe/gloo", 2)]
    _, res = analysed["gloo"]
    methods = {m for (m,) in res.con.execute("SELECT rank_method FROM sources").fetchall()}
    assert methods == {"env:RANK"} and sorted(r["rank"] for r in res.verdict["ranks"]) == [0, 1]
