#!/usr/bin/env python3
"""The main job as a user runs it (every default output) against a peer on the same file, side by side.

    python benchmarks/bench_main_job.py [--kineto TRACE.json ...] [--nsys EXPORT.sqlite] [--repeat N]
                                        [--hta-python .bench_venv/bin/python] [--ref OTHER_CHECKOUT] [--json OUT.json]

With several `--kineto` traces (the committed sample scaled to a few sizes) it ends with a table by size: the
ratio at each, and what each side pays per MiB more, which separates what every run pays from what grows with
the trace.

Rows, each a fresh process. Peak RSS is the process tree's: the larger of `ru_maxrss` (read by the parent from
`os.wait4`: the process's own peak, or its largest child's) and the largest sum of the RSS of the process and its
children, sampled every 10 ms (ours runs report.html in a second process, render/page_worker.py; summing RSS
counts the libraries both map twice, so this errs high):

  ours             `python -m plasmient_report.cli INPUT --out NEW_DIR --quiet`: verdict.json, report.html,
                   trace.pftrace and run.duckdb, the default memory budget
  ours-lean        the same with `--no-html --no-trace` (what the two renders cost is the difference)
  hta              HolisticTraceAnalysis: `TraceAnalysis(trace_dir=DIR)` (load) then `get_temporal_breakdown()`,
                   each timed inside the child; the row's wall time is the whole process, like ours
  sqlite-floor     (nsys) Python `sqlite3` reading every GPU_METRICS row: the floor of any reader of that table
  ref              (`--ref DIR`) the same command as `ours` run from another checkout: before / after a change

The rows run interleaved (ours, peer, ours, peer, …), so a burst of load from other work on this shared machine
hits both; `ours` and `ref` take turns going first (the run after another writes into the page cache it freed);
ratios are the median of the per-repeat ratios, with their range. Nothing asserts on timings. Inputs:
`benchmarks/make_scaled_trace.py` (a committed sample scaled to ~100 MiB) and `benchmarks/make_scaled_nsys.py`
(the corpus nsys export with 10 kHz GPU metrics, scaled), both into `.bench_data/` (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
MiB = 1 << 20

HTA_CHILD = r"""
import json, logging, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
imp = time.perf_counter() - t0
logging.disable(logging.WARNING)
t = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
load = time.perf_counter() - t
t = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
brk = time.perf_counter() - t
events = sum(len(df) for df in ta.t.traces.values())
print("BENCH-RESULT " + json.dumps({"import_s": imp, "load_s": load, "breakdown_s": brk, "events": events,
                                    "idle_pct": float(tb["idle_time_pctg"].iloc[0])}))
"""

SQLITE_FLOOR = r"""
import json, sqlite3, sys, time
t = time.perf_counter()
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
n = 0
cur = con.execute("SELECT * FROM GPU_METRICS")
while rows := cur.fetchmany(100_000):
    n += len(rows)
print("BENCH-RESULT " + json.dumps({"load_s": time.perf_counter() - t, "rows": n}))
"""


def tree_rss(pid: int) -> int:
    """The RSS (bytes) of a process and all its descendants, now (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def run(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> dict:
    """One fresh process: wall, CPU (its children's included) and the process tree's peak RSS, plus the child's
    own BENCH-RESULT line if any."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=str(cwd))
        tree = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.01):
                tree[0] = max(tree[0], tree_rss(p.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        done.set()
        sampler.join()
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code != 0:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:4])} … failed (exit {code}):\n{tail}")
    res: dict = {}
    for line in stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            res = json.loads(line[len("BENCH-RESULT ") :])
    res.update(wall_s=wall, cpu_s=ru.ru_utime + ru.ru_stime, peak_rss=max(ru.ru_maxrss * 1024, tree[0]))
    return res


def ours_cmd(python: str, inp: Path, out: Path, lean: bool) -> list[str]:
    cmd = [python, "-m", "plasmient_report.cli", str(inp), "--out", str(out), "--quiet"]
    return cmd + (["--no-html", "--no-trace"] if lean else [])


def kineto_key(paths: list[Path], j: int) -> str:
    """The results' key of the j-th Kineto input ("kineto" when there is one, as before)."""
    return "kineto" if len(paths) == 1 else f"kineto {j}: {paths[j].name}"


def by_size(paths: list[Path], results: dict[str, dict[str, list[dict]]]) -> None:
    """The Kineto inputs by size: ours (every output) against HTA's load, and what each MiB more costs each side
    between one input and the next larger (the medians' differences: what a run pays whatever its size is the
    smallest input's time)."""
    print("\nKineto by size (medians; ratio: HTA's load over ours; 'more': ms per MiB from the next smaller input)")
    head = ("MiB", "ours s", "HTA load s", "ratio", "RSS/JSON", "ours more", "HTA more")
    print("  " + " ".join(f"{h:>10}" for h in head))
    prev: tuple[float, float, float] | None = None
    for j, path in sorted(enumerate(paths), key=lambda jp: jp[1].stat().st_size):
        rows = results[kineto_key(paths, j)]
        size = path.stat().st_size
        mib, ours = size / MiB, med(rows["ours"], "wall_s")
        hta = med(rows["hta"], "load_s") if rows.get("hta") else math.nan
        cells = [mib, ours, hta, hta / ours, med(rows["ours"], "peak_rss") / size, math.nan, math.nan]
        if prev is not None and mib > prev[0]:
            d = mib - prev[0]
            cells[5], cells[6] = (ours - prev[1]) / d * 1e3, (hta - prev[2]) / d * 1e3
        print("  " + " ".join(f"{c:>10.2f}" if c == c else f"{'–':>10}" for c in cells))
        prev = (mib, ours, hta)


def med(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def table(title: str, size: int, rows: dict[str, list[dict]]) -> None:
    print(f"\n{title}")
    hdr = f"  {'row':<14} {'wall s':>7} {'(min)':>6} {'CPU s':>7} {'peak RSS MiB':>12} {'peak/input':>10}   detail"
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for name, rs in rows.items():
        if not rs:
            print(f"  {name:<14} FAILED")
            continue
        detail = ""
        if "load_s" in rs[0] and "breakdown_s" in rs[0]:
            detail = (
                f"load {med(rs, 'load_s'):.2f} s + temporal breakdown {med(rs, 'breakdown_s'):.2f} s "
                f"(import {med(rs, 'import_s'):.2f} s), {rs[0]['events']:,} events"
            )
        elif "rows" in rs[0]:
            detail = f"read {med(rs, 'load_s'):.2f} s, {rs[0]['rows']:,} rows"
        print(
            f"  {name:<14} {med(rs, 'wall_s'):>7.2f} {min(r['wall_s'] for r in rs):>6.2f} {med(rs, 'cpu_s'):>7.2f} "
            f"{med(rs, 'peak_rss') / MiB:>12,.0f} {med(rs, 'peak_rss') / size:>10.2f}   {detail}"
        )


def ratio(num: list[dict], den: list[dict], key_n: str, key_d: str) -> str:
    """Median (and range) of the per-repeat ratios num/den."""
    rs = [a[key_n] / b[key_d] for a, b in zip(num, den, strict=False) if b[key_d] > 0]
    if not rs:
        return "–"
    return f"{statistics.median(rs):.2f}x (range {min(rs):.2f}–{max(rs):.2f})"


LOOP_N = 10_000_000


def loop_seconds() -> float:
    """Seconds a fixed pure-Python loop takes on one core (the interpreter's speed on this machine now)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(LOOP_N):
        s += i
    return time.perf_counter() - t0


OURS_PACKAGES = ("duckdb", "pyarrow", "msgspec", "numpy", "matplotlib", "jinja2")
PEER_PACKAGES = ("HolisticTraceAnalysis", "pandas", "numpy")


def versions(python: str, packages: tuple[str, ...]) -> str:
    """The installed versions of `packages` in the interpreter `python` ("?" where one is missing)."""
    code = (
        "import importlib.metadata as m, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try: print(p, m.version(p))\n"
        "    except m.PackageNotFoundError: print(p, '?')"
    )
    try:
        out = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "(versions unknown)"
    return ", ".join(out.splitlines())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the platform's processor string."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "CPU unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--kineto",
        type=Path,
        action="append",
        default=[],
        help="a ~100 MiB Kineto trace (.json); give several (e.g. the sample scaled to 25, 50, 100, 200 MiB) for a "
        "table of the ratio by size",
    )
    ap.add_argument("--nsys", type=Path, help="a large nsys SQLite export with GPU metrics")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--hta-python",
        default=str(REPO / ".bench_venv/bin/python"),
        help="interpreter of the venv holding HolisticTraceAnalysis; '' skips HTA",
    )
    ap.add_argument("--python", default=sys.executable, help="interpreter for ours (with the dependencies)")
    ap.add_argument("--no-lean", action="store_true", help="skip the --no-html --no-trace rows")
    ap.add_argument("--json", type=Path, help="write every raw measurement here")
    ap.add_argument(
        "--ref",
        type=Path,
        help="another checkout (e.g. /work/main): its CLI as row `ref`, all outputs, "
        "interleaved with ours (before / after a change)",
    )
    a = ap.parse_args(argv)
    if not a.kineto and not a.nsys:
        ap.error("give --kineto and/or --nsys")
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(REPO))
    # The checkouts' bytecode compiled first, as `pip install` does: with PYTHONDONTWRITEBYTECODE set (some
    # sandboxes do) every run would otherwise compile the package's ~90 modules again (~0.15 s), a cost no
    # installed tool pays. (HTA's venv was installed by pip: its bytecode is there.)
    for checkout in [REPO] + ([a.ref.resolve()] if a.ref else []):
        subprocess.run([a.python, "-m", "compileall", "-q", str(checkout / "plasmient_report")], check=True)
    env_peer = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    work = Path(tempfile.mkdtemp(prefix="bench-main-"))
    results: dict[str, dict[str, list[dict]]] = {}
    inputs: dict[str, Path] = {}
    hta_dirs: dict[str, Path] = {}  # HTA parses every trace in its folder: one folder per input, holding only it
    load0 = os.getloadavg()[0]
    speed0 = loop_seconds()
    try:
        for j, path in enumerate(a.kineto):
            k = path.resolve()
            inputs[kineto_key(a.kineto, j)] = k
            results[kineto_key(a.kineto, j)] = {
                "ours": [],
                **({"ref": []} if a.ref else {}),
                **({} if a.no_lean else {"ours-lean": []}),
                **({"hta": []} if a.hta_python else {}),
            }
            if a.hta_python:
                hta_dirs[kineto_key(a.kineto, j)] = folder = work / f"hta-{j}"
                folder.mkdir()
                (folder / k.name).symlink_to(k)
        if a.nsys:
            inputs["nsys"] = a.nsys.resolve()
            results["nsys"] = {
                "ours": [],
                **({"ref": []} if a.ref else {}),
                **({} if a.no_lean else {"ours-lean": []}),
                "sqlite-floor": [],
            }
        for i in range(a.repeat):
            for kind, rows in results.items():
                inp = inputs[kind]
                # `ours` and `ref` take turns going first: a run's outputs are removed before the next run, and
                # the run after writes into the page cache just freed, which costs less on some VMs than fresh
                # pages (session 31: with `ref` always right after `ours`, the 486 MiB export's `ref` ran 1.02-1.03x
                # faster in two runs of this script, where pairs run in both orders showed `ours` faster)
                order = list(rows)
                if i % 2 and "ref" in order:
                    j, k = order.index("ours"), order.index("ref")
                    order[j], order[k] = order[k], order[j]
                for row in order:
                    out = work / f"out-{kind}-{row}-{i}"
                    cwd = REPO
                    if row.startswith("ours"):
                        cmd, e = ours_cmd(a.python, inp, out, row == "ours-lean"), env
                    elif row == "ref":
                        cwd = a.ref.resolve()
                        cmd, e = ours_cmd(a.python, inp, out, False), dict(env, PYTHONPATH=str(cwd))
                    elif row == "hta":
                        cmd, e = [a.hta_python, "-c", HTA_CHILD, str(hta_dirs[kind])], env_peer
                    else:
                        cmd, e = [a.python, "-c", SQLITE_FLOOR, str(inp)], env_peer
                    print(f"[{i + 1}/{a.repeat}] {kind} {row} …", file=sys.stderr, flush=True)
                    r = run(cmd, e, cwd)
                    if row.startswith("ours") or row == "ref":
                        r["outputs"] = {p.name: p.stat().st_size for p in out.iterdir()}
                        shutil.rmtree(out, ignore_errors=True)
                    rows[row].append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]
    print(
        f"machine {platform.node()} · {cpu_model()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
        f"{time.strftime('%Y-%m-%d %H:%M')} · repeat {a.repeat}, medians · 1-min load {load0:.1f} → {load1:.1f}"
    )
    # A fixed pure-Python loop before and after the runs: how fast this machine's core was (one VM ran it in 0.5 s
    # and, on another day, in 2.4 s: seconds compare only beside it, ratios across machines).
    print(f"  core speed: a {LOOP_N:,}-iteration Python loop took {speed0:.2f} s before the runs, {loop_seconds():.2f} s after")
    # The ratio moves with the machine and with both sides' libraries (HTA's load is pandas work): say which.
    print(f"  ours: {versions(a.python, OURS_PACKAGES)}")
    if a.hta_python:
        print(f"  peer: {versions(a.hta_python, PEER_PACKAGES)}")
    for j, path in enumerate(a.kineto):
        size = path.stat().st_size
        rows = results[kineto_key(a.kineto, j)]
        table(f"Kineto {path.name}: {size / MiB:,.1f} MiB of JSON", size, rows)
        print(f"  outputs of ours: {rows['ours'][0]['outputs']}")
        if rows.get("ref"):
            for key in ("wall_s", "cpu_s", "peak_rss"):
                print(f"  ours / ref, {key:<9}                       {ratio(rows['ours'], rows['ref'], key, key)}")
        if rows.get("hta"):
            print(f"  HTA load / ours (all outputs), wall:          {ratio(rows['hta'], rows['ours'], 'load_s', 'wall_s')}")
            print(
                f"  HTA load+breakdown / ours (all outputs):      "
                f"{ratio([dict(r, lb=r['load_s'] + r['breakdown_s']) for r in rows['hta']], rows['ours'], 'lb', 'wall_s')}"
            )
            print(f"  HTA process / ours process, wall:             {ratio(rows['hta'], rows['ours'], 'wall_s', 'wall_s')}")
            print(f"  HTA peak RSS / ours:                          {ratio(rows['hta'], rows['ours'], 'peak_rss', 'peak_rss')}")
        print(f"  ours peak RSS / JSON size:                    {med(rows['ours'], 'peak_rss') / size:.2f}")
        if rows.get("ours-lean"):
            print(f"  ours all outputs / ours --no-html --no-trace: {ratio(rows['ours'], rows['ours-lean'], 'wall_s', 'wall_s')}")
    if len(a.kineto) > 1:
        by_size(a.kineto, results)
    if "nsys" in results:
        size = a.nsys.stat().st_size
        rows = results["nsys"]
        table(f"nsys {a.nsys.name}: {size / MiB:,.1f} MiB", size, rows)
        print(f"  outputs of ours: {rows['ours'][0]['outputs']}")
        if rows.get("ref"):
            for key in ("wall_s", "cpu_s", "peak_rss"):
                print(f"  ours / ref, {key:<9}                        {ratio(rows['ours'], rows['ref'], key, key)}")
        print(f"  ours (all outputs) / sqlite3 GPU_METRICS read: {ratio(rows['ours'], rows['sqlite-floor'], 'wall_s', 'load_s')}")
        if rows.get("ours-lean"):
            print(
                f"  ours all outputs / ours --no-html --no-trace:  {ratio(rows['ours'], rows['ours-lean'], 'wall_s', 'wall_s')}"
            )
    if a.json:
        a.json.write_text(json.dumps({"loadavg": [load0, load1], "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
