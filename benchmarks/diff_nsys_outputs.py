"""Differential check of the nsys path: two checkouts of plasmient-report (a reference, e.g. main, and this one) run
the main job on the same real nsys exports; their verdicts must agree (numbers to 1e-9 relative, everything else
equal) and their trace.pftrace files must hold the same tracks, slices and counters (decoded as Perfetto's trace
processor reads them; the order of packets of different tracks may differ). Traces over `--decode-max-mb` are
compared by their verdicts and sizes only (decoding in Python takes minutes per 100 MB).

    python benchmarks/diff_nsys_outputs.py --ref /work/main [EXPORT ...]     # default: every nsys export of
                                                                             # sample_traces/ and the corpus

Exits 1 on any difference. Nothing here asserts on timings; each run's wall time is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
# Keys whose values name the run, not its numbers: paths, tool version, timings.
VOLATILE = {"tool", "generated_at", "elapsed_s", "out", "output", "path", "paths", "inputs"}


def exports() -> list[Path]:
    found = sorted((REPO / "sample_traces").rglob("*.sqlite"))
    found += sorted(p for p in (REPO / "sample_traces").rglob("*") if p.is_dir() and p.name.endswith(("_pqtdir", "_arwdir")))
    found += sorted((REPO / "sample_traces").rglob("*.arrows"))
    if CORPUS.is_dir():
        found += sorted(CORPUS.rglob("*.sqlite"))
    return found


def run(tree: Path, export: Path, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "plasmient_report.cli", str(export), "--out", str(out), "--quiet"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if p.returncode not in (0, 1):  # 1: findings; 2: bad input (compared as such)
        (out / "stderr.txt").parent.mkdir(parents=True, exist_ok=True)
        (out / "stderr.txt").write_text(p.stderr)
    return time.perf_counter() - t


def diff_json(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in VOLATILE:
                continue
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'new' if k in b else 'ref'}")
            else:
                diff_json(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            diff_json(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))) or not (
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
        ):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


def trace_content(path: Path) -> dict[str, Any]:
    """Tracks (by path), slices and counters per track, as multisets: what a reader of the trace sees."""
    sys.path.insert(0, str(REPO))
    from tests.test_perfetto import decode

    d = decode(path)
    tracks = Counter(d.path(u) for u in d.tracks)
    slices = Counter(
        (
            d.path(s["track"]),
            s["start"],
            s["end"],
            s["name"],
            json.dumps(s["args"], sort_keys=True),
            len(s["flows"]),
            len(s["terms"]),
        )
        for s in d.slices
    )
    counters = {d.path(u): sorted(v) for u, v in d.counters.items()}
    return {"tracks": tracks, "slices": slices, "counters": counters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports", nargs="*", type=Path)
    ap.add_argument("--ref", type=Path, default=REPO.parent / "main", help="the reference checkout")
    ap.add_argument("--decode-max-mb", type=float, default=60.0)
    a = ap.parse_args()
    failed = 0
    for export in a.exports or exports():
        with tempfile.TemporaryDirectory() as tmp:
            ref_out, new_out = Path(tmp) / "ref", Path(tmp) / "new"
            t_ref = run(a.ref, export, ref_out)
            t_new = run(REPO, export, new_out)
            problems: list[str] = []
            rv, nv = ref_out / "verdict.json", new_out / "verdict.json"
            if rv.exists() != nv.exists():
                problems.append(f"verdict.json written by {'new' if nv.exists() else 'ref'} only")
            elif rv.exists():
                diff_json(json.loads(rv.read_text()), json.loads(nv.read_text()), "verdict", problems)
            rt, nt = ref_out / "trace.pftrace", new_out / "trace.pftrace"
            note = ""
            if rt.exists() and nt.exists():
                if max(rt.stat().st_size, nt.stat().st_size) <= a.decode_max_mb * 2**20:
                    rc, nc = trace_content(rt), trace_content(nt)
                    for k in ("tracks", "slices"):
                        if rc[k] != nc[k]:
                            problems.append(
                                f"trace {k}: {sum((rc[k] - nc[k]).values())} only in ref, "
                                f"{sum((nc[k] - rc[k]).values())} only in new"
                            )
                    if rc["counters"] != nc["counters"]:
                        bad = [
                            t for t in set(rc["counters"]) | set(nc["counters"]) if rc["counters"].get(t) != nc["counters"].get(t)
                        ]
                        problems.append(f"trace counters differ on {len(bad)} tracks, e.g. {sorted(bad)[:2]}")
                    note = (
                        f"{len(rc['tracks'])} tracks, {sum(rc['slices'].values())} slices, "
                        f"{sum(len(v) for v in rc['counters'].values())} counter samples equal"
                    )
                else:
                    note = f"trace {rt.stat().st_size / 2**20:.0f} vs {nt.stat().st_size / 2**20:.0f} MiB (not decoded)"
            elif rt.exists() != nt.exists():
                problems.append(f"trace.pftrace written by {'new' if nt.exists() else 'ref'} only")
            status = "SAME" if not problems else "DIFFERENT"
            failed += bool(problems)
            print(f"{status:9} {export}  ref {t_ref:.1f} s, new {t_new:.1f} s  {note}", flush=True)
            for p in problems[:20]:
                print("          " + p)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
