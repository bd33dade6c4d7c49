#!/usr/bin/env python3
"""Ingest benchmark: plasmient-report's Kineto ingest vs HolisticTraceAnalysis loading the same trace.

    python benchmarks/bench_kineto_ingest.py TRACE.json[.gz] [--hta-python /work/.venv-hta/bin/python] [--repeat N]

Every loader runs in its own fresh interpreter (this file re-executed with a hidden `--child` argument), so each
one's peak RSS is its own: the parent reads the child's `ru_maxrss` from `os.wait4`. The child times only the load
call (imports excluded; they are reported separately) and prints one JSON line the parent reads back.

Loaders:
  ours          `store.connect()` + `pipeline.ingest(con, [trace])`, uninstrumented
  ours-phases   the same, with timers and RSS checkpoints wrapped around the ingest's internals (the breakdown;
                its numbers come from a separate run so the headline row carries no instrumentation)
  hta-json      `TraceAnalysis(trace_dir=DIR)` with HTA's default parser backend (ParserBackend.JSON)
  hta-ijson     the same with ParserBackend.IJSON_BATCH_AND_COMPRESS (what HTA's own auto-detect picks when ijson
                has the yajl2_c backend); skipped with a note when ijson is not installed in the HTA venv

The parent imports nothing heavy (its RSS must stay small: a forked child can inherit it as a starting maxrss).
No timing assertions: this prints numbers, it does not judge them. Exit status 1 when any loader fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
MiB = 1 << 20


# ----------------------------------------------------------------------------------------------- child side


def _rss_now() -> int:
    """Current resident set size in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _child_ours(trace: Path, phases: bool) -> dict:
    t0 = time.perf_counter()
    from plasmient_report import pipeline, store

    import_s = time.perf_counter() - t0
    out: dict = {"import_s": import_s, "rss_after_import": _rss_now(), "maxrss_after_import": _maxrss()}
    timers: dict[str, float] = {}
    marks: list[tuple[str, int, int]] = []
    con = store.connect()
    target = con
    if phases:
        target = _instrument_ours(con, timers, marks)
    t = time.perf_counter()
    pipeline.ingest(target, [trace])
    out["load_s"] = time.perf_counter() - t
    out["rows"] = {tbl: con.execute(f"SELECT count(*) FROM {tbl}").fetchone()[0]
                   for tbl in ("kernels", "ops", "api_calls", "ranges", "syncs", "collectives")}
    if phases:
        out["phases"] = timers
        out["marks"] = marks
    return out


def _instrument_ours(con, timers: dict[str, float], marks: list[tuple[str, int, int]]):
    """Wrap the ingest's internals (from the outside, nothing edited) to time its phases and track RSS.

    Phases: read+gunzip (read_maybe_gzip), top-level JSON decode (_decode_head: msgspec splits traceEvents
    into raw slices), event decode (msgspec → typed structs, per chunk), Arrow build (Python list comprehensions
    over the structs, per chunk), SQL (every DuckDB call: staging inserts, _check_times, _emit), sha256 of the
    input (pipeline records it in `sources`). The remainder is the Python bucketing loop and glue.
    """
    import functools

    from plasmient_report.parsers import _io, kineto

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] = timers.get(name, 0.0) + time.perf_counter() - t
                marks.append((name, _rss_now(), _maxrss()))
        return wrapper

    kineto.read_maybe_gzip = timed("read+gunzip", kineto.read_maybe_gzip)
    kineto._decode_head = timed("json top-level decode", kineto._decode_head)
    for key, fn in list(kineto._BUILDERS.items()):
        kineto._BUILDERS[key] = timed("arrow build", fn)
    kineto._decode_loose = timed("event decode (loose)", kineto._decode_loose)
    _io.sha256_of = timed("sha256 of input", _io.sha256_of)  # pipeline.ingest calls it as _io.sha256_of

    class _Decoder:
        def __init__(self, inner):
            self._inner = inner

        def decode(self, buf):
            return timed("event decode (msgspec)", self._inner.decode)(buf)

    kineto._EVENTS = _Decoder(kineto._EVENTS)

    class _Con:
        """A DuckDB connection proxy timing execute/register (what kineto.ingest and pipeline.ingest call)."""

        def __init__(self, inner):
            self._inner = inner

        def execute(self, *a, **kw):
            return timed("SQL (stage + emit)", self._inner.execute)(*a, **kw)

        def register(self, *a, **kw):
            return timed("SQL (stage + emit)", self._inner.register)(*a, **kw)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    return _Con(con)


def _child_hta(trace_dir: Path, backend: str) -> dict:
    import logging

    t0 = time.perf_counter()
    from hta.common import trace as hta_trace
    from hta.common import trace_parser
    from hta.configs.parser_config import ParserBackend
    from hta.trace_analysis import TraceAnalysis

    import_s = time.perf_counter() - t0
    logging.getLogger("hta").setLevel(logging.ERROR)
    if backend == "ijson":
        import ijson  # noqa: F401  (fail loudly here rather than deep inside HTA)

        trace_parser.set_default_trace_parsing_backend(ParserBackend.IJSON_BATCH_AND_COMPRESS)
    else:
        trace_parser.set_default_trace_parsing_backend(ParserBackend.JSON)
    used = trace_parser.get_default_trace_parsing_backend()
    out: dict = {"import_s": import_s, "rss_after_import": _rss_now(), "maxrss_after_import": _maxrss(),
                 "backend": str(used.value)}
    parse_s = [0.0]
    inner = hta_trace.parse_trace_file

    def parse_timed(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            parse_s[0] += time.perf_counter() - t

    hta_trace.parse_trace_file = parse_timed
    t = time.perf_counter()
    ta = TraceAnalysis(trace_dir=str(trace_dir))
    out["load_s"] = time.perf_counter() - t
    out["phases"] = {"parse_trace_file (json → DataFrame)": parse_s[0],
                     "rest (symbols, align, filter, index)": out["load_s"] - parse_s[0]}
    out["rows"] = {f"rank{r}_events": len(df) for r, df in ta.t.traces.items()}
    if not ta.t.traces:
        raise RuntimeError("HTA loaded no events")
    return out


def child_main(argv: list[str]) -> int:
    kind, target = argv[0], Path(argv[1])
    if kind in ("ours", "ours-phases"):
        out = _child_ours(target, phases=kind == "ours-phases")
    elif kind.startswith("hta-"):
        out = _child_hta(target, kind[4:])
    else:
        raise SystemExit(f"unknown loader {kind}")
    out["maxrss_end"] = _maxrss()
    print("BENCH-RESULT " + json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- parent side


def json_size(path: Path) -> int:
    """Uncompressed size in bytes (streams gzip; the ISIZE trailer is only mod 2**32)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if not gz:
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as g:
        while chunk := g.read(8 << 20):
            n += len(chunk)
    return n


def run_child(python: str, kind: str, target: Path, env: dict[str, str]) -> dict:
    """One loader in a fresh process: wall time, ru_maxrss from wait4, the child's own JSON line."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([python, str(HERE), "--child", kind, str(target)], stdout=out, stderr=err,
                             env=env, cwd=str(REPO))
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    res = None
    for line in stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            res = json.loads(line[len("BENCH-RESULT "):])
    if p.returncode != 0 or res is None:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{kind} failed (exit {p.returncode}):\n{tail}")
    res["process_wall_s"] = wall
    res["process_cpu_s"] = ru.ru_utime + ru.ru_stime
    res["peak_rss"] = ru.ru_maxrss * 1024
    return res


def fmt_mib(b: float) -> str:
    return f"{b / MiB:,.0f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="Kineto trace, .json or .json.gz")
    ap.add_argument("--hta-python", default="/work/.venv-hta/bin/python",
                    help="interpreter of the venv holding HTA (pip: traceinsight); '' to skip HTA")
    ap.add_argument("--ours-python", default=sys.executable, help="interpreter with plasmient_report installed")
    ap.add_argument("--repeat", type=int, default=1, help="runs per loader; the table shows medians")
    ap.add_argument("--no-phases", action="store_true", help="skip the instrumented breakdown run of ours")
    ap.add_argument("--no-ijson", action="store_true", help="skip HTA's ijson backend")
    ap.add_argument("--json", type=Path, help="also write all raw results here")
    args = ap.parse_args(argv)

    trace = args.trace.resolve()
    if not trace.is_file():
        ap.error(f"{trace}: no such file")
    if not trace.name.endswith((".json", ".json.gz", ".gz")):
        ap.error("HTA only loads files named *.json or *.gz")
    size_file = trace.stat().st_size
    size_json = json_size(trace)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop("PYTHONPATH", None)

    loaders: list[tuple[str, str, Path]] = [("ours", args.ours_python, trace)]
    tmpdir = None
    notes: list[str] = []
    if args.hta_python:
        # TraceAnalysis(trace_dir=...) parses every *.json / *.gz in the folder: give it a folder with only this.
        tmpdir = Path(tempfile.mkdtemp(prefix="bench-hta-"))
        (tmpdir / trace.name).symlink_to(trace)
        loaders.append(("hta-json", args.hta_python, tmpdir))
        if not args.no_ijson:
            has = subprocess.run([args.hta_python, "-c", "import ijson; print(ijson.backend)"],
                                 capture_output=True, text=True)
            if has.returncode == 0:
                if "yajl" not in has.stdout:
                    notes.append(f"ijson backend is {has.stdout.strip()} (pure Python): hta-ijson is slow")
                loaders.append(("hta-ijson", args.hta_python, tmpdir))
            else:
                notes.append("ijson not installed in the HTA venv: hta-ijson skipped")
    if not args.no_phases:
        loaders.append(("ours-phases", args.ours_python, trace))

    results: dict[str, list[dict]] = {k: [] for k, _, _ in loaders}
    load_before = os.getloadavg()
    failed: list[str] = []
    try:
        for i in range(args.repeat):
            for kind, py, target in loaders:
                if kind == "ours-phases" and i > 0:
                    continue
                print(f"[{i + 1}/{args.repeat}] {kind} ...", file=sys.stderr, flush=True)
                try:
                    results[kind].append(run_child(py, kind, target, env))
                except Exception as e:  # noqa: BLE001 - report every loader, fail at the end
                    print(f"FAILED: {e}", file=sys.stderr)
                    failed.append(kind)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

    load_after = os.getloadavg()

    def med(kind: str, key: str) -> float | None:
        vals = [r[key] for r in results.get(kind, []) if key in r]
        return statistics.median(vals) if vals else None

    print()
    print(f"trace        {trace}")
    print(f"file size    {size_file / MiB:,.1f} MiB{' (gzip)' if size_file != size_json else ''}; "
          f"JSON {size_json / MiB:,.1f} MiB ({size_json:,} bytes)")
    print(f"machine      {platform.node()} · {os.cpu_count()} CPUs · {platform.python_implementation()} "
          f"{platform.python_version()} · {time.strftime('%Y-%m-%d %H:%M')} · repeat {args.repeat} (medians)")
    print(f"load avg     {load_before[0]:.2f} before, {load_after[0]:.2f} after (1-min; > ~0.3 means other work shared "
          f"the CPUs: trust 'cpu s' more than 'load s')")
    print()
    hdr = (f"{'loader':<12} {'load s':>8} {'proc s':>8} {'cpu s':>7} {'import s':>9} {'peak RSS MiB':>13} "
           f"{'RSS-after-import MiB':>21} {'peak/JSON':>10} {'(peak-base)/JSON':>17}")
    print(hdr)
    print("-" * len(hdr))
    for kind, _, _ in loaders:
        if not results[kind]:
            print(f"{kind:<12} {'FAILED':>8}")
            continue
        load, proc, imp = med(kind, "load_s"), med(kind, "process_wall_s"), med(kind, "import_s")
        cpu = med(kind, "process_cpu_s")
        peak, base = med(kind, "peak_rss"), med(kind, "rss_after_import")
        print(f"{kind:<12} {load:>8.2f} {proc:>8.2f} {cpu:>7.2f} {imp:>9.2f} {fmt_mib(peak):>13} {fmt_mib(base):>21} "
              f"{peak / size_json:>10.2f} {(peak - base) / size_json:>17.2f}")
    print()
    if results["ours"]:
        cols = [("load time", "load_s"), ("process wall", "process_wall_s"), ("process CPU", "process_cpu_s"),
                ("peak RSS", "peak_rss"), ("RSS above import", None)]
        print(f"{'HTA / ours':<12} " + " ".join(f"{c:>16}" for c, _ in cols))
        for kind in ("hta-json", "hta-ijson"):
            if not results.get(kind):
                continue
            cells = []
            for _, key in cols:
                if key is None:
                    r = ((med(kind, "peak_rss") - med(kind, "rss_after_import"))
                         / (med("ours", "peak_rss") - med("ours", "rss_after_import")))
                else:
                    r = med(kind, key) / med("ours", key)
                cells.append(f"{r:>15.2f}x")
            print(f"{kind:<12} " + " ".join(cells))
        print()
    for kind in ("ours", "hta-json", "hta-ijson"):
        if results.get(kind):
            print(f"rows loaded by {kind}: {results[kind][0]['rows']}")
    for kind in ("hta-json", "hta-ijson"):
        if results.get(kind):
            ph = results[kind][0]["phases"]
            print(f"{kind} phases (run 1): " + ", ".join(f"{k} {v:.2f}s" for k, v in ph.items()))
    if results.get("ours-phases"):
        r = results["ours-phases"][0]
        total = r["load_s"]
        print()
        print(f"ours breakdown (instrumented run, load {total:.2f}s; peak RSS {fmt_mib(r['peak_rss'])} MiB):")
        accounted = 0.0
        for name, secs in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
            accounted += secs
            print(f"  {name:<28} {secs:>7.2f}s  {100 * secs / total:>5.1f}%")
        print(f"  {'other (Python loop, glue)':<28} {total - accounted:>7.2f}s  {100 * (total - accounted) / total:>5.1f}%")
        # Where the peak happens: the first checkpoint at which ru_maxrss reached its final value.
        peak_at = next((m for m in r["marks"] if m[2] >= r["maxrss_end"]), None)
        hi = max(r["marks"], key=lambda m: m[1]) if r["marks"] else None
        if hi:
            print(f"  highest RSS at a checkpoint: {fmt_mib(hi[1])} MiB after '{hi[0]}'"
                  + (f"; ru_maxrss reached its peak by the end of '{peak_at[0]}'" if peak_at else
                     "; ru_maxrss peaked after the last checkpoint"))
    for n in notes:
        print(f"note: {n}")
    if args.json:
        args.json.write_text(json.dumps({"trace": str(trace), "size_file": size_file, "size_json": size_json,
                                         "loadavg": [load_before, load_after],
                                         "results": results, "failed": failed}, indent=1))
    if failed:
        print(f"\nFAILED loaders: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
