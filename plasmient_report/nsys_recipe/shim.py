"""The pure parts of the `plasmient` nsys recipe (no `nsys_recipe` import here: tested without Nsight Systems).

Two map stages and a reduce, each a plain function the recipe hands to the framework's `context.map`:

1. `probe_report(report)` — per report: the export to read (a sibling export, else `nsys export` into the
   output's cache) and the job it belongs to, from the environment Nsight Systems captured
   (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, …) with its rank. Pure: one report in, one small record out.
2. `group_reports(...)` puts the reports of one job into one run (one report per rank or node), and
   `analyse_run(task)` is the batch mapper (`batch.mapper.map_run`): the whole pipeline over one run — one clock
   across its reports by the existing collective alignment — writing `runs/<run>/` and returning the run's
   per-rank summary rows.
3. `reduce(...)` is the batch reducer (summary.parquet, index.html) plus the recipe's own files: reports.parquet
   (which report went into which run) and a notebook that shows the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..batch import group as batch_group
from ..batch.mapper import Outcome, Task, map_run, options_fingerprint
from ..batch.summary import row_failed
from ..errors import BadInput

CACHE = ".plasmient-cache"
REPORTS = "reports.parquet"
NOTEBOOK = "plasmient.ipynb"
# What names a job in the environment of its processes, most specific first. torchrun gives every worker of
# one launch the same TORCHELASTIC_RUN_ID (a fresh one per --standalone launch); schedulers name their job.
# MASTER_ADDR:MASTER_PORT is not one: two jobs one after the other on the same node share it.
JOB_VARS = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "PBS_JOBID",
    "LSB_JOBID",
    "FLUX_JOB_ID",
    "COBALT_JOBID",
)
GROUP_BY = ("job", "report", "folder")
FILE_TYPES = {".parquet": "Parquet", ".html": "HTML", ".ipynb": "Notebook"}  # how the .nsys-analysis lists them
# `nsys recipe`'s own recipes export beside the report only the tables they read (a `<report>_pqtdir` holding
# CUPTI_ACTIVITY_KIND_KERNEL and StringIds, say): such a sibling is not a whole export and is not used.
WHOLE_EXPORT_MARK = "META_DATA_EXPORT"
_CHDIR = threading.Lock()  # the batch mapper works in the output folder: one run at a time per process


@dataclass(frozen=True)
class ReportInfo:
    """What stage 1 learns of one report."""

    report: str  # the report as given (absolute)
    export: str | None  # the export the pipeline reads (None when it could not be had)
    job: str | None  # job identity, 'VAR=value' (None: the report is a run of its own)
    rank: int | None  # the rank its environment names (None: several or none)
    world_size: int | None
    host: str | None
    error: str | None  # why the report cannot be analysed (one line)


def nsys_for(recipe_package: Path | None) -> str | None:
    """The `nsys` next to the running recipe framework (`<install>/target-linux-x64/python/packages/nsys_recipe`
    → `<install>/target-linux-x64/nsys`), so exports use the same Nsight Systems as the recipe."""
    if recipe_package is None:
        return None
    cand = Path(recipe_package).resolve().parents[2] / "nsys"
    return str(cand) if cand.is_file() and os.access(cand, os.X_OK) else None


def _env_blocks(export: Path) -> tuple[list[dict[str, str]], str | None]:
    """The environment blocks Nsight Systems captured (one per process it could read), and the host."""
    from ..parsers import nsys as nsys_parser

    ex = nsys_parser.open_export(export)
    try:
        meta = nsys_parser.metadata.read_meta(ex)  # the parser's own reading of META_DATA_CAPTURE (one definition)
        return list(nsys_parser.metadata.env_vars(meta).values()), meta.host
    finally:
        ex.close()


def job_identity(envs: Sequence[dict[str, str]]) -> tuple[str | None, int | None, int | None]:
    """(job, rank, world size) from captured environments. Only blocks that name a rank count (nsys also stores
    the environments of unrelated processes it could read); each is named only when those blocks agree."""
    from ..parsers.ranks import WORLD_VARS
    from ..parsers.ranks import from_env as env_rank

    ranked = [(e, r[0]) for e in envs if (r := env_rank(e))]
    jobs = {next((f"{v}={e[v].strip()}" for v in JOB_VARS if e.get(v, "").strip()), None) for e, _ in ranked}
    ranks = {r for _, r in ranked}
    worlds = {int(e[v]) for e, _ in ranked for v in WORLD_VARS if e.get(v, "").strip().isdigit()}

    def only(xs: set[Any]) -> Any:
        return next(iter(xs)) if len(xs) == 1 else None

    return only(jobs), only(ranks), only(worlds)


def _whole(export: Path) -> bool:
    """A sibling export is usable when it is a SQLite file or a folder export holding the export's metadata."""
    return (
        export.suffix == ".sqlite" or not export.is_dir() or any(p.name.startswith(WHOLE_EXPORT_MARK) for p in export.iterdir())
    )


def export_of(rep: Path, cache_dir: Path) -> Path:
    """The export to read for a report: a whole sibling export, else `nsys export` into the cache (never beside the
    report). A partial sibling is bypassed through a link to the report in the cache, which has no siblings."""
    from ..parsers import nsys_rep

    export = nsys_rep.resolve(rep, cache_dir)
    if _whole(export):
        return export
    link_dir = cache_dir / "links" / hashlib.sha256(str(rep).encode()).hexdigest()[:16]
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / rep.name
    if not link.is_symlink():
        link.symlink_to(rep)
    return nsys_rep.resolve(link, cache_dir)


def probe_report(report: str, cache_dir: str, nsys: str | None = None) -> ReportInfo:
    """Stage 1, per report: its export (exported through nsys when there is none beside it) and its job."""
    rep = Path(report).absolute()
    try:
        if nsys and not os.environ.get("NSYS"):
            os.environ["NSYS"] = nsys  # this worker's exports use the recipe's own nsys
        export = export_of(rep, Path(cache_dir)) if rep.suffix in (".nsys-rep", ".qdrep") else rep
        envs, host = _env_blocks(export)
        job, rank, world = job_identity(envs)
        return ReportInfo(str(rep), str(export), job, rank, world, host, None)
    except BadInput as e:
        return ReportInfo(str(rep), None, None, None, None, None, str(e))
    except Exception as e:  # noqa: BLE001 — one bad report is its row, never the end of the recipe
        return ReportInfo(str(rep), None, None, None, None, None, f"{rep}: {type(e).__name__}: {e}")


def _stem(report: str) -> str:
    name = Path(report).name
    for suffix in (".nsys-rep", ".qdrep", ".sqlite"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _run_name(infos: Sequence[ReportInfo]) -> str:
    """One report: its name. Several: their common name without rank numbers (`jobA_rank0`, `jobA_rank1` →
    `jobA`), else the job's value."""
    if len(infos) == 1:
        return _stem(infos[0].report)
    names = {batch_group.RANK_MARK.sub("", _stem(i.report)).strip("._- ") for i in infos}
    if len(names) == 1 and (n := names.pop()):
        return n
    job = infos[0].job or "job"
    return "job-" + re.sub(r"[^A-Za-z0-9._-]+", "_", job.split("=", 1)[-1])[:40]


@dataclass(frozen=True)
class Grouped:
    runs: list[batch_group.Run]
    failed: list[Outcome]  # reports that could not be probed: a failed run each
    run_of: dict[str, str]  # report → run_id


def group_reports(infos: Sequence[ReportInfo], group_by: str = "job", label: str = "nsys") -> Grouped:
    """Reports into runs. `job`: the reports of one job (same job identity, wherever they lie) are one run, a
    report without one is a run of its own; `report`: every report a run; `folder`: the reports of one folder are one run."""
    if group_by not in GROUP_BY:
        raise BadInput(None, f"--group-by must be one of {', '.join(GROUP_BY)}")
    keyed: dict[tuple[str, str], list[ReportInfo]] = {}
    failed: list[Outcome] = []
    run_of: dict[str, str] = {}
    for i in sorted(infos, key=lambda i: i.report):
        if i.export is None:
            rid = f"{label}/{_stem(i.report)}"
            failed.append(Outcome(rid, "failed", i.error, [row_failed(rid, i.error or "unreadable", [i.report], None)]))
            run_of[i.report] = rid
            continue
        if group_by == "job" and i.job:
            key = ("job", i.job)  # across folders too: one folder per node is a common layout
        elif group_by == "folder":
            key = ("folder", str(Path(i.report).parent))
        else:
            key = ("report", i.report)
        keyed.setdefault(key, []).append(i)
    used: set[str] = set()
    runs = []
    for (_kind, _), members in sorted(keyed.items(), key=lambda kv: kv[1][0].report):
        rid = f"{label}/{_run_name(members)}"
        slug = batch_group._unique(batch_group._slug(rid), used)
        runs.append(batch_group.Run(rid, slug, tuple(m.export for m in members if m.export)))
        for m in members:
            run_of[m.report] = rid
    return Grouped(runs, failed, run_of)


def tasks(runs: Sequence[batch_group.Run], out_dir: Path, opts: Any, force: bool = False) -> list[Task]:
    """The batch mapper's tasks (its resumable manifest and options fingerprint included)."""
    fingerprint = options_fingerprint(opts)
    return [Task(r, str(Path(out_dir).absolute()), opts, fingerprint, force) for r in runs]


def analyse_run(task: Task) -> Outcome:
    """Stage 2, per run: the batch mapper (the whole pipeline over the run's reports into runs/<run>/)."""
    with _CHDIR:  # map_run changes the working directory: threads of one process (Dask) take turns
        return map_run(task)


def reduce(outcomes: Sequence[Outcome], infos: Sequence[ReportInfo], grouped: Grouped, out_dir: Path, title: str) -> list[Path]:
    """The batch reducer (summary.parquet, index.html) and the recipe's own files; returns the files written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..batch import reduce as batch_reduce

    out_dir = Path(out_dir)
    summary, index = batch_reduce.reduce(list(outcomes), out_dir, title)
    failed = {o.run_id for o in outcomes if o.status == "failed"}
    rows = [
        {
            **asdict(i),
            "run_id": grouped.run_of.get(i.report),
            "status": "failed" if i.error or grouped.run_of.get(i.report) in failed else "ok",
        }
        for i in sorted(infos, key=lambda i: i.report)
    ]
    schema = pa.schema(
        [
            ("report", pa.string()),
            ("export", pa.string()),
            ("job", pa.string()),
            ("rank", pa.int32()),
            ("world_size", pa.int32()),
            ("host", pa.string()),
            ("error", pa.string()),
            ("run_id", pa.string()),
            ("status", pa.string()),
        ]
    )
    reports = out_dir / REPORTS
    batch_reduce._atomic(reports, lambda p: pq.write_table(pa.Table.from_pylist(rows, schema=schema), p))
    nb = out_dir / NOTEBOOK
    batch_reduce._atomic(nb, lambda p: p.write_text(json.dumps(notebook(), indent=1) + "\n", encoding="utf-8"))
    return [summary, index, reports, nb]


def notebook() -> dict[str, Any]:
    """A small Jupyter notebook (nbformat 4) that shows the fleet summary beside it: runs by headroom, the
    utilization-vs-achieved scatter, and where each run's peak went."""

    def md(text: str) -> dict[str, Any]:
        return {"cell_type": "markdown", "metadata": {}, "source": text.strip().splitlines(keepends=True)}

    def code(text: str) -> dict[str, Any]:
        return {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": text.strip().splitlines(keepends=True),
        }

    cells = [
        md("""
# plasmient · nsys recipe

Utilization (what the dashboard shows) against the achieved fraction of peak, per run and per rank, and where the
rest of the peak went. Columns: `docs/batch.md` (summary.parquet). Each run's full report is `runs/<run>/report.html`.
"""),
        code("""
import pandas as pd
s = pd.read_parquet("summary.parquet")
reports = pd.read_parquet("reports.parquet")
runs = s[s.level == "run"].sort_values("headroom", ascending=False)
runs[["run_id", "status", "world_size", "utilization", "achieved_fraction_of_peak", "headroom", "top_loss",
      "verdict", "report"]]
"""),
        code("""
s[s.level == "rank"][["run_id", "rank", "device", "gpu", "utilization", "achieved_fraction_of_peak", "top_loss"]]
"""),
        code("""
import matplotlib.pyplot as plt
ok = runs[runs.status == "ok"]
ax = ok.plot.scatter(x="utilization", y="achieved_fraction_of_peak", figsize=(6, 4))
for _, r in ok.iterrows():
    ax.annotate(r.run_id.split("/")[-1], (r.utilization, r.achieved_fraction_of_peak), fontsize=7)
ax.plot([0, 1], [0, 1], ":", color="grey"); ax.set_xlim(0, 1.02); ax.set_ylim(0, None)
ax.set_xlabel("GPU utilization (trace)"); ax.set_ylabel("achieved fraction of peak")
"""),
        code("""
loss = [c for c in s.columns if c.startswith("loss_")]
ok.set_index("run_id")[["achieved_fraction_of_peak", *loss]].plot.barh(stacked=True, figsize=(8, 1 + 0.4 * len(ok)))
"""),
        code("""
reports  # which report went into which run (the reports of one job are one run)
"""),
    ]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def options(
    ranges: Sequence[str] = (),
    peak_precision: str | None = None,
    gpu: str | None = None,
    write_html: bool = True,
    write_trace: bool = True,
) -> Any:
    """The analysis options of the recipe's arguments (a subset of the main job's)."""
    from ..pipeline import Options

    return Options(ranges=tuple(ranges), peak_precision=peak_precision, gpu=gpu, write_html=write_html, write_trace=write_trace)


def label_of(reports: Sequence[str]) -> str:
    """The runs' common prefix: the name of the folder that holds every report (`nsys` when there is none)."""
    if not reports:
        return "nsys"
    common = Path(os.path.commonpath([str(Path(r).absolute().parent) for r in reports]))
    return re.sub(r"[^A-Za-z0-9._-]+", "_", common.name) or "nsys"


def report_lines(outcomes: Sequence[Outcome], out_dir: Path) -> list[str]:
    """What the recipe prints: one line per run (utilization beside achieved fraction, the largest loss), then
    where the fleet summary is."""
    from ..render._format import pct

    lines = []
    for o in sorted(outcomes, key=lambda o: o.run_id):
        run = next((r for r in o.rows if r.get("level") == "run"), {})
        if o.status == "failed":
            lines.append(f"plasmient: {o.run_id}: failed: {o.error}")
            continue
        ranks = sum(r.get("level") == "rank" for r in o.rows)
        lines.append(
            f"plasmient: {o.run_id}: {ranks} rank{'s' if ranks != 1 else ''}, utilization "
            f"{pct(run.get('utilization'))}, achieved {pct(run.get('achieved_fraction_of_peak'))} of peak, "
            f"largest loss {(run.get('top_loss') or 'none').replace('_', ' ')} → {run.get('report')}"
        )
    lines.append(f"plasmient: summary {Path(out_dir) / 'summary.parquet'}, index {Path(out_dir) / 'index.html'}")
    return lines
