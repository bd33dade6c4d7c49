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

Columns: load s / load cpu s = wall / CPU (all threads) seconds of the load call alone; proc s / proc cpu s = the
whole child process (interpreter start + imports + load + exit); peak RSS = the child's ru_maxrss; RSS after
import = its RSS before loading (interpreter + libraries), so (peak - base)/JSON is what the load itself costs
per byte of uncompressed JSON.

No timing assertions: this prints numbers, it does not judge them. Exit status 1 when any loader fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import signal
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
    import plasmient_report
    from plasmient_report import pipeline, store

    import_s = time.perf_counter() - t0
    out: dict = {
        "import_s": import_s,
        "module": str(Path(plasmient_report.__file__).parent),
        "rss_after_import": _rss_now(),
        "maxrss_after_import": _maxrss(),
    }
    timers: dict[str, list[float]] = {}  # phase -> [wall s, CPU s], exclusive
    marks: list[tuple[str, int, int]] = []
    con = store.connect()
    target = con
    hooked: list[str] = []
    if phases:
        target = _instrument_ours(con, timers, marks, hooked)
    t, c = time.perf_counter(), time.process_time()
    pipeline.ingest(target, [trace])
    out["load_s"] = time.perf_counter() - t
    out["load_cpu_s"] = time.process_time() - c
    out["rows"] = {
        tbl: con.execute(f"SELECT count(*) FROM {tbl}").fetchone()[0]
        for tbl in ("kernels", "ops", "api_calls", "ranges", "syncs", "collectives")
    }
    if phases:
        out["phases"] = timers
        out["marks"] = marks
        out["hooked"] = hooked
    return out


def _instrument_ours(con, timers: dict[str, list[float]], marks: list[tuple[str, int, int]], hooked: list[str]):
    """Wrap the ingest's internals from the outside (nothing edited) to time its phases and track RSS.

    The ingest is being reworked, so every hook is optional: a name that is not there is skipped and the
    list of hooks applied is reported. Times are exclusive (a phase called inside another is subtracted from
    it), so the phases add up to at most the load time; the rest is "other" (Python loops, glue).
    Phases: read+gunzip (file reads, gzip inflate), split (the streaming traceEvents splitter, or the old
    whole-document top-level decode), event decode (msgspec → typed structs), Arrow build (Python list
    comprehensions over the structs → pa.array), SQL (every DuckDB call: staging inserts, checks, the INSERT
    ... SELECTs of _emit), sha256 of the input (pipeline records it in `sources`).
    """
    import functools
    import inspect

    from plasmient_report.parsers import _io, kineto

    stack: list[list] = []  # [name, child wall seconds, child CPU seconds]

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            stack.append([name, 0.0, 0.0])
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                dt, dc = time.perf_counter() - t, time.process_time() - c
                _, child, child_c = stack.pop()
                acc = timers.setdefault(name, [0.0, 0.0])
                acc[0] += dt - child
                acc[1] += dc - child_c
                if stack:
                    stack[-1][1] += dt
                    stack[-1][2] += dc
                marks.append((name, _rss_now(), _maxrss()))

        return wrapper

    def timed_gen(name, gen_fn):
        @functools.wraps(gen_fn)
        def wrapper(*a, **kw):
            it = gen_fn(*a, **kw)
            step = timed(name, lambda: next(it))
            while True:
                try:
                    item = step()
                except StopIteration:
                    return
                yield item

        return wrapper

    def hook(mod, attr, name):
        fn = getattr(mod, attr, None)
        if fn is None:
            return
        setattr(mod, attr, (timed_gen if inspect.isgeneratorfunction(fn) else timed)(name, fn))
        hooked.append(f"{getattr(mod, '__name__', '?').rsplit('.', 1)[-1]}.{attr}")

    hook(kineto, "read_maybe_gzip", "read+gunzip")
    reader = getattr(kineto, "GuardedReader", None) or getattr(_io, "GuardedReader", None)
    if reader is not None:
        hook(reader, "read", "read+gunzip")
    hook(kineto, "split_events", "split traceEvents")
    hook(kineto, "_decode_head", "split traceEvents")
    hook(kineto, "_decode_loose", "event decode (loose)")
    hook(_io, "sha256_of", "sha256 of input")  # pipeline.ingest calls it as _io.sha256_of
    for key, fn in list(getattr(kineto, "_BUILDERS", {}).items()):
        kineto._BUILDERS[key] = timed("arrow build", fn)
        hooked.append(f"kineto._BUILDERS[{key!r}]")

    class _Decoder:
        def __init__(self, inner):
            self._inner = inner
            self.decode = timed("event decode (msgspec)", inner.decode)

    if hasattr(kineto, "_EVENTS"):
        kineto._EVENTS = _Decoder(kineto._EVENTS)
        hooked.append("kineto._EVENTS.decode")

    class _Con:
        """A DuckDB connection proxy timing execute/register (what the ingest calls)."""

        def __init__(self, inner):
            self._inner = inner
            self.execute = timed("SQL (stage + emit)", inner.execute)
            self.register = timed("SQL (stage + emit)", inner.register)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    hooked.append("con.execute/register")
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
    out: dict = {
        "import_s": import_s,
        "rss_after_import": _rss_now(),
        "maxrss_after_import": _maxrss(),
        "backend": str(used.value),
    }
    parse_s = [0.0]
    inner = hta_trace.parse_trace_file

    def parse_timed(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            parse_s[0] += time.perf_counter() - t

    hta_trace.parse_trace_file = parse_timed
    t, c = time.perf_counter(), time.process_time()
    ta = TraceAnalysis(trace_dir=str(trace_dir))
    out["load_s"] = time.perf_counter() - t
    out["load_cpu_s"] = time.process_time() - c
    out["phases"] = {
        "parse_trace_file (json → DataFrame)": parse_s[0],
        "rest (symbols, align, filter, index)": out["load_s"] - parse_s[0],
    }
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


def code_fingerprint(root: Path) -> str:
    """Short hash of our ingest's source (the package is edited under us: say which code was measured)."""
    import hashlib

    pkg = root / "plasmient_report"
    files = sorted([*pkg.glob("parsers/*.py"), pkg / "pipeline.py", pkg / "store.py", pkg / "schema.sql"])
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def run_child(python: str, kind: str, target: Path, env: dict[str, str]) -> dict:
    """One loader in a fresh process: wall time, ru_maxrss from wait4, the child's own JSON line."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([python, str(HERE), "--child", kind, str(target)], stdout=out, stderr=err, env=env, cwd=str(REPO))
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    res = None
    for line in stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            res = json.loads(line[len("BENCH-RESULT ") :])
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="Kineto trace, .json or .json.gz")
    ap.add_argument(
        "--hta-python",
        default="/work/.venv-hta/bin/python",
        help="interpreter of the venv holding HTA (pip: traceinsight); '' to skip HTA",
    )
    ap.add_argument("--ours-python", default=sys.executable, help="interpreter with plasmient_report installed")
    ap.add_argument(
        "--ours-src",
        type=Path,
        help="benchmark the plasmient_report package in this folder instead of the installed one "
        "(put first on PYTHONPATH; e.g. a frozen copy, or a branch to compare)",
    )
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
    env_ours = dict(env)
    src_root = REPO
    if args.ours_src:
        src_root = args.ours_src.resolve()
        if not (src_root / "plasmient_report" / "__init__.py").is_file():
            ap.error(f"--ours-src {src_root}: no plasmient_report/ package there")
        env_ours["PYTHONPATH"] = str(src_root)

    loaders: list[tuple[str, str, Path]] = [("ours", args.ours_python, trace)]
    tmpdir = None
    notes: list[str] = []
    if args.hta_python:
        # TraceAnalysis(trace_dir=...) parses every *.json / *.gz in the folder: give it a folder with only this.
        tmpdir = Path(tempfile.mkdtemp(prefix="bench-hta-"))
        (tmpdir / trace.name).symlink_to(trace)
        loaders.append(("hta-json", args.hta_python, tmpdir))
        if not args.no_ijson:
            has = subprocess.run([args.hta_python, "-c", "import ijson; print(ijson.backend)"], capture_output=True, text=True)
            if has.returncode == 0:
                if "yajl" not in has.stdout:
                    notes.append(f"ijson backend is {has.stdout.strip()} (pure Python): hta-ijson is slow")
                loaders.append(("hta-ijson", args.hta_python, tmpdir))
            else:
                notes.append("ijson not installed in the HTA venv: hta-ijson skipped")
    if not args.no_phases:
        loaders.append(("ours-phases", args.ours_python, trace))

    results: dict[str, list[dict]] = {k: [] for k, _, _ in loaders}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still remove the temporary folder
    load_before = os.getloadavg()
    code_before = code_fingerprint(src_root)
    failed: list[str] = []
    try:
        for i in range(args.repeat):
            for kind, py, target in loaders:
                if kind == "ours-phases" and i > 0:
                    continue
                print(f"[{i + 1}/{args.repeat}] {kind} ...", file=sys.stderr, flush=True)
                try:
                    results[kind].append(run_child(py, kind, target, env_ours if kind.startswith("ours") else env))
                except Exception as e:  # noqa: BLE001 - report every loader, fail at the end
                    print(f"FAILED: {e}", file=sys.stderr)
                    failed.append(kind)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

    load_after = os.getloadavg()
    code_after = code_fingerprint(src_root)
    if code_after != code_before:
        notes.append(f"our ingest's source changed during the run ({code_before} → {code_after}): rerun")

    def med(kind: str, key: str) -> float | None:
        vals = [r[key] for r in results.get(kind, []) if key in r]
        return statistics.median(vals) if vals else None

    def best(kind: str, key: str) -> float | None:
        vals = [r[key] for r in results.get(kind, []) if key in r]
        return min(vals) if vals else None

    print()
    print(f"trace        {trace}")
    print(
        f"file size    {size_file / MiB:,.1f} MiB{' (gzip)' if size_file != size_json else ''}; "
        f"JSON {size_json / MiB:,.1f} MiB ({size_json:,} bytes)"
    )
    print(
        f"machine      {platform.node()} · {os.cpu_count()} CPUs · {platform.python_implementation()} "
        f"{platform.python_version()} · {time.strftime('%Y-%m-%d %H:%M')} · repeat {args.repeat} (medians)"
    )
    mod = next((r[0]["module"] for k, r in results.items() if k.startswith("ours") and r), "?")
    print(f"our code     {mod}: {{parsers/*.py,pipeline.py,store.py,schema.sql}} sha256 {code_before}")
    print(
        f"load avg     {load_before[0]:.2f} before, {load_after[0]:.2f} after (1-min; well above 0 means other work "
        f"shared the CPUs: then trust the cpu columns more than the wall ones)"
    )
    print()
    hdr = (
        f"{'loader':<12} {'load s':>7} {'(min)':>6} {'load cpu s':>10} {'proc s':>7} {'proc cpu s':>10} "
        f"{'import s':>8} {'peak RSS MiB':>12} "
        f"{'RSS after import MiB':>20} {'peak/JSON':>9} {'(peak-base)/JSON':>16}"
    )
    print(hdr)
    print("-" * len(hdr))
    for kind, _, _ in loaders:
        if not results[kind]:
            print(f"{kind:<12} {'FAILED':>8}")
            continue
        load, proc, imp = med(kind, "load_s"), med(kind, "process_wall_s"), med(kind, "import_s")
        cpu, lcpu = med(kind, "process_cpu_s"), med(kind, "load_cpu_s")
        peak, base = med(kind, "peak_rss"), med(kind, "rss_after_import")
        print(
            f"{kind:<12} {load:>7.2f} {best(kind, 'load_s'):>6.2f} {lcpu:>10.2f} {proc:>7.2f} {cpu:>10.2f} "
            f"{imp:>8.2f} {fmt_mib(peak):>12} "
            f"{fmt_mib(base):>20} {peak / size_json:>9.2f} {(peak - base) / size_json:>16.2f}"
        )
    print()
    if results["ours"]:
        cols = [
            ("load time", "load_s"),
            ("load (min)", "min:load_s"),
            ("load CPU", "load_cpu_s"),
            ("process wall", "process_wall_s"),
            ("process CPU", "process_cpu_s"),
            ("peak RSS", "peak_rss"),
            ("RSS above import", None),
        ]
        print(f"{'HTA / ours':<12} " + " ".join(f"{c:>13}" for c, _ in cols))
        for kind in ("hta-json", "hta-ijson"):
            if not results.get(kind):
                continue
            cells = []
            for _, key in cols:
                if key is None:
                    r = (med(kind, "peak_rss") - med(kind, "rss_after_import")) / (
                        med("ours", "peak_rss") - med("ours", "rss_after_import")
                    )
                elif key.startswith("min:"):
                    r = best(kind, key[4:]) / best("ours", key[4:])
                else:
                    r = med(kind, key) / med("ours", key)
                cells.append(f"{r:>12.2f}x")
            print(f"{kind:<12} " + " ".join(cells))
        print()
    for kind in ("ours", "hta-json", "hta-ijson"):
        if results.get(kind):
            print(f"rows loaded by {kind}: {results[kind][0]['rows']}")
    for kind in ("hta-json", "hta-ijson"):
        if results.get(kind):
            ph = {k: statistics.median(r["phases"][k] for r in results[kind]) for k in results[kind][0]["phases"]}
            print(f"{kind} phases (median): " + ", ".join(f"{k} {v:.2f}s" for k, v in ph.items()))
    if results.get("ours-phases"):
        r = results["ours-phases"][0]
        total = r["load_s"]
        print()
        total_c = r["load_cpu_s"]
        print(f"ours breakdown (one instrumented run; peak RSS {fmt_mib(r['peak_rss'])} MiB):")
        print(f"  {'phase':<28} {'wall s':>7} {'%':>6} {'CPU s':>7} {'%':>6}")

        def row(name: str, w: float, c: float) -> None:
            print(f"  {name:<28} {w:>7.2f} {100 * w / total:>5.1f}% {c:>7.2f} {100 * c / total_c:>5.1f}%")

        phases = sorted(r["phases"].items(), key=lambda kv: -kv[1][1])
        for name, (w, c) in phases:
            row(name, w, c)
        row("other (Python loops, glue)", total - sum(p[1][0] for p in phases), total_c - sum(p[1][1] for p in phases))
        row("total (load)", total, total_c)
        # Where the peak happens: the first checkpoint at which ru_maxrss reached its final value.
        peak_at = next((m for m in r["marks"] if m[2] >= r["maxrss_end"]), None)
        hi = max(r["marks"], key=lambda m: m[1]) if r["marks"] else None
        if hi:
            print(
                f"  highest RSS at a checkpoint: {fmt_mib(hi[1])} MiB after '{hi[0]}'"
                + (
                    f"; ru_maxrss reached its peak by the end of '{peak_at[0]}'"
                    if peak_at
                    else "; ru_maxrss peaked after the last checkpoint"
                )
            )
        print(f"  hooks applied: {', '.join(r['hooked'])}")
    for n in notes:
        print(f"note: {n}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "trace": str(trace),
                    "size_file": size_file,
                    "size_json": size_json,
                    "loadavg": [load_before, load_after],
                    "code": code_before,
                    "results": results,
                    "failed": failed,
                },
                indent=1,
            )
        )
    if failed:
        print(f"\nFAILED loaders: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
