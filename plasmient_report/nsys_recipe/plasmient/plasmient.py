"""`nsys recipe plasmient --input DIR --output OUT [--mode concurrent]`: plasmient-report inside Nsight Systems'
recipe framework. The only module of plasmient-report that imports `nsys_recipe` — NVIDIA's code, under NVIDIA's
licence, shipped with Nsight Systems and never a dependency of this package — and only its Recipe / mapper /
reducer API (`recipe.Recipe(parsed_args)`, `context.map` / `context.wait`, `add_output_file`,
`create_analysis_file`, `get_argument_parser` with `Option.INPUT`; as in Nsight Systems 2025.3.1). Everything
else is `plasmient_report.nsys_recipe.shim`, tested without nsys.

Stage 1 maps over the reports (export, job identity), the reports of one job become one run, stage 2 maps the
batch mapper over the runs, and the reducer writes summary.parquet, index.html, reports.parquet, plasmient.ipynb
and the .nsys-analysis file beside runs/<run>/ (each run's verdict.json, report.html, trace.pftrace, run.duckdb).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import nsys_recipe
from nsys_recipe.lib import recipe
from nsys_recipe.lib.args import Option

from plasmient_report.nsys_recipe import shim

PRECISIONS = ("bf16", "fp16", "fp8", "int8", "tf32", "fp32", "fp64")


class Plasmient(recipe.Recipe):
    def run(self, context):  # noqa: ANN001, ANN201 — the framework's signature
        super().run(context)
        args = self._parsed_args
        out = Path(self.add_output_file(shim.REPORTS)).parent
        reports = sorted(str(Path(p).absolute()) for p in args.input)
        label = shim.label_of(reports)
        nsys = shim.nsys_for(Path(nsys_recipe.__file__).parent)
        infos = list(context.wait(context.map(shim.probe_report, reports, cache_dir=str(out / shim.CACHE), nsys=nsys)))
        grouped = shim.group_reports(infos, args.group_by, label)
        opts = shim.options(args.range or (), args.peak_precision, args.gpu, not args.no_html, not args.no_trace)
        outcomes = list(context.wait(context.map(shim.analyse_run, shim.tasks(grouped.runs, out, opts))))
        outcomes += grouped.failed
        files = shim.reduce(outcomes, infos, grouped, out, f"plasmient · nsys recipe · {label}")
        for f in files:
            self.add_output_file(f.name, shim.FILE_TYPES.get(f.suffix, "Data"))
        self.add_output_file("runs", "Folder")
        for line in shim.report_lines(outcomes, out):
            print(line)
        self._analysis_dict.update({"EndTime": str(datetime.now()), "Outputs": self._output_files})
        self.create_analysis_file()

    @classmethod
    def get_argument_parser(cls):  # noqa: ANN206
        parser = super().get_argument_parser()
        parser.add_recipe_argument(Option.INPUT, required=True)
        g = parser.recipe_group
        g.add_argument(
            "--group-by",
            choices=shim.GROUP_BY,
            default="job",
            help="job (default): reports of one job (same TORCHELASTIC_RUN_ID, SLURM_JOB_ID, … in the "
            "captured environment) are one run, one rank each; report: each report a run; folder: "
            "the reports of one folder are one run",
        )
        g.add_argument(
            "--range",
            action="append",
            default=[],
            metavar="NAME",
            help="analyse only inside NVTX ranges of this name (glob; repeatable)",
        )
        g.add_argument(
            "--peak-precision", choices=PRECISIONS, help="precision of the peak (default: the dominant matmul precision)"
        )
        g.add_argument("--gpu", help="GPU name when the report does not name it (e.g. H100-SXM)")
        g.add_argument("--no-html", action="store_true", help="no report.html per run")
        g.add_argument("--no-trace", action="store_true", help="no trace.pftrace per run")
        return parser
