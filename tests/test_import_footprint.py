"""What a run imports is part of what every run costs (benchmarks/README.md, sessions 37-38): readers of formats the
inputs are not in stay unimported. polars (the counter logs' reader: ~0.1 s and ~45 MiB resident) and
pyarrow.parquet (nsys parquetdir exports: ~16 ms and 7 MiB) are imported by runs that read such inputs only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_traces" / "h200_single" / "kineto_single.pt.trace.json.gz"

PROGRAM = """
import json, sys
sys.path.insert(0, sys.argv[1])
from plasmient_report import cli
sys.argv = ["plasmient-report", sys.argv[2], "--out", sys.argv[3], "--quiet"]
try:
    cli.run()
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(m for m in sys.modules if m == "polars" or m.startswith(("polars.", "pyarrow.parquet")))))
"""


def test_a_kineto_run_with_every_output_imports_no_reader_of_other_formats(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(ROOT), str(SAMPLE), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert (tmp_path / "out" / "verdict.json").is_file()  # the run happened, every output written
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
