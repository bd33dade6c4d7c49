#!/usr/bin/env python3
"""Same outputs before and after a change: every trace of sample_traces/ and the corpus analysed with the code on
PYTHONPATH, its verdict and a digest of every store table written to a folder; two such folders compared.

    PYTHONPATH=OLD_CHECKOUT python benchmarks/compare_outputs.py run /tmp/cmp/before
    PYTHONPATH=.            python benchmarks/compare_outputs.py run /tmp/cmp/after
    python benchmarks/compare_outputs.py diff /tmp/cmp/before /tmp/cmp/after     # exit 1 when they differ

Runs: each Kineto JSON and nsys SQLite file alone, and each folder holding several rank traces of one format as
one multi-rank run. One DuckDB thread (sums in one order, so equal code gives equal digits). The verdict is
compared field by field (floats to 1e-9 relative); a table digest is its row count and an order-free hash of
its rows (tables the measure stage and rules write included), so a changed value anywhere in the store shows.
Inputs that are refused (BadInput) are compared by their message. A checking aid, not a test: nothing here
asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = (".json", ".json.gz", ".sqlite")
RANKED = re.compile(r"(rank|worker)[_-]?\d")


def inputs(roots: list[Path]) -> dict[str, list[Path]]:
    """Run name → its input files."""
    runs: dict[str, list[Path]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES) and _trace(p))
        by_dir: dict[tuple[Path, str], list[Path]] = {}
        for f in files:
            kind = "sqlite" if f.name.endswith(".sqlite") else "json"
            by_dir.setdefault((f.parent, kind), []).append(f)
            runs[str(f.relative_to(root.parent))] = [f]
        for (d, kind), fs in by_dir.items():
            ranked = [f for f in fs if RANKED.search(f.name)]
            if len(ranked) > 1:
                runs[f"{d.relative_to(root.parent)}/*.{kind}"] = ranked
    return runs


def _trace(p: Path) -> bool:
    """A Kineto trace or an SQLite file (the tool decides what the SQLite is)."""
    if p.name.endswith(".sqlite"):
        return True
    from plasmient_report.parsers._io import GuardedReader
    from plasmient_report.parsers.kineto import looks_like_kineto

    with GuardedReader(p) as g:
        return looks_like_kineto(g.read(4096))


def digest(con: Any) -> dict[str, list[Any]]:
    tables = [
        t
        for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
            "ORDER BY table_name"
        ).fetchall()
    ]
    out = {}
    for t in tables:
        n, h = con.execute(f'SELECT count(*), sum(hash(x) % 1000000007)::BIGINT FROM (SELECT "{t}" AS x FROM "{t}")').fetchall()[
            0
        ]
        out[t] = [n, h]
    return out


def run(out: Path, roots: list[Path], only: str | None) -> int:
    from plasmient_report import pipeline, store
    from plasmient_report.errors import BadInput

    out.mkdir(parents=True, exist_ok=True)
    runs = inputs(roots)
    res: dict[str, Any] = {}
    for name, files in runs.items():
        if only and only not in name:
            continue
        t = time.perf_counter()
        try:
            with store.threads(1):
                r = pipeline.analyse(files, pipeline.Options())
            res[name] = {"verdict": json.loads(json.dumps(r.verdict, default=str)), "store": digest(r.con)}
            r.close()
        except BadInput as e:
            res[name] = {"refused": str(e)}
        print(f"{time.perf_counter() - t:6.1f} s  {name}", file=sys.stderr, flush=True)
    (out / "outputs.json").write_text(json.dumps(res, indent=1, sort_keys=True))
    print(f"{len(res)} runs → {out / 'outputs.json'}")
    return 0


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [x for k in sorted(set(a) | set(b)) for x in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [x for i, (p, q) in enumerate(zip(a, b, strict=True)) for x in _diff(p, q, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def diff(a: Path, b: Path, ignore: list[str]) -> int:
    ra = json.loads((a / "outputs.json").read_text())
    rb = json.loads((b / "outputs.json").read_text())
    bad = 0
    for name in sorted(set(ra) | set(rb)):
        d = [x for x in _diff(ra.get(name), rb.get(name)) if not any(i in x for i in ignore)]
        verdicts = [x for x in d if not x.startswith(".store")]
        if d:
            bad += 1
            print(f"{name}: {len(d)} differences" + (" (store only)" if not verdicts else ""))
            for x in d[:12]:
                print(f"    {x}")
    same = len(set(ra) | set(rb)) - bad
    print(f"{same} runs the same, {bad} differ")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--roots", type=Path, nargs="*", default=[REPO / "sample_traces", REPO.parent / "shared" / "corpus"])
    r.add_argument("--only", help="only runs whose name holds this text")
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    d.add_argument("--ignore", action="append", default=[], help="leave out differences whose path holds this")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if a.cmd == "run":
        return run(a.out, a.roots, a.only)
    return diff(a.a, a.b, a.ignore)


if __name__ == "__main__":
    sys.exit(main())
