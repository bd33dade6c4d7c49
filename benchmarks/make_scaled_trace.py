#!/usr/bin/env python3
"""Build a large Kineto test trace by replicating a real one: a SCALED REAL trace, not a new recording.

    python benchmarks/make_scaled_trace.py [SOURCE.json[.gz]] [--target-mb 100 | --copies N] [-o OUT.json[.gz]]

The source's `traceEvents` are written N times. Copy k (k = 0..N-1) is shifted in time by k·(span + 1 ms), so the
copies follow one another like consecutive profiling windows, and gets fresh ids so that nothing links across
copies: `args["External id"]`, `args["correlation"]`, `args["Sequence number"]`, `args["Record function id"]`,
`args["Ev Idx"]` and flow-event `id`s are offset by k·(max + 1); `ProfilerStep#S` becomes `ProfilerStep#S+k·steps`.
Metadata events (ph "M": process/thread names) are written once. With `--steps N` the trace has N profiler steps
instead of copies × the source's: the source's `ProfilerStep#` ranges are left out and N ranges written in their
place (per category: the CPU annotation and its GPU twin), each over a run of consecutive copies — the size of
real traces' step counts (a few to tens), where the peer's per-event step lookup (HTA scans every step for every
event) costs what it costs on a real trace, not on 500 steps. The top-level keys (deviceProperties,
distributedInfo, baseTimeNanoseconds, ...) are copied unchanged, in the source's order.

Layout follows Kineto's (one key per line at the top, one event per line), which matters for loaders that scan
the text line by line (HTA looks for `"rank":` that way). The default output goes to .bench_data/ (git-ignored:
never commit it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = Path("/work/shared/corpus/h200-single-kineto/kineto_single.json.gz")
ID_ARGS = ("External id", "correlation", "Sequence number", "Record function id", "Ev Idx")
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _open_text(path: Path, mode: str):
    if path.name.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8", compresslevel=6)
    return open(path, mode, encoding="utf-8")


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8") as f:
        return json.load(f)


def scale(src: dict, copies: int, out, steps_total: int | None = None) -> int:
    """Write the scaled trace to the text stream `out`; returns the number of events written."""
    events = src["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    t0 = min(e["ts"] for e in body if isinstance(e.get("ts"), (int, float)))
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in body if isinstance(e.get("ts"), (int, float)))
    shift_us = float(int(t1 - t0) + 1000)  # whole µs: keeps the ts decimals (ns) exact
    span = {k: 0 for k in ID_ARGS}
    flow_span = 0
    steps = []
    for e in body:
        a = e.get("args")
        if isinstance(a, dict):
            for k in ID_ARGS:
                v = a.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    span[k] = max(span[k], v + 1)
        if isinstance(e.get("id"), int):
            flow_span = max(flow_span, e["id"] + 1)
        m = STEP.match(str(e.get("name", "")))
        if m:
            steps.append(int(m.group(1)))
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    step_events = [e for e in body if STEP.match(str(e.get("name", ""))) and e.get("ph") == "X"]
    merged = steps_total is not None and bool(step_events)
    if merged:
        body = [e for e in body if not (STEP.match(str(e.get("name", ""))) and e.get("ph") == "X")]

    keys = list(src.keys())
    at = keys.index("traceEvents")
    dump = json.dumps
    out.write("{\n")
    for k in keys[:at]:
        out.write(f"  {dump(k)}: {dump(src[k])},\n")
    out.write('  "traceEvents": [\n')
    first = True
    n = 0

    def emit(ev: dict) -> None:
        nonlocal first, n
        out.write(("  " if first else ",\n  ") + dump(ev, separators=(", ", ": ")))
        first = False
        n += 1

    for e in meta:
        emit(e)
    for k in range(copies):
        dt = k * shift_us
        for e in body:
            if k == 0:
                emit(e)
                continue
            ev = dict(e)
            if isinstance(ev.get("ts"), (int, float)):
                ev["ts"] = ev["ts"] + dt
            if isinstance(ev.get("id"), int):
                ev["id"] = ev["id"] + k * flow_span
            a = ev.get("args")
            if isinstance(a, dict):
                a = dict(a)
                for key in ID_ARGS:
                    v = a.get(key)
                    if isinstance(v, int) and not isinstance(v, bool):
                        a[key] = v + k * span[key]
                ev["args"] = a
            if step_span and (m := STEP.match(str(ev.get("name", "")))):
                ev["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_span}"
            emit(ev)
    if merged:
        assert steps_total is not None
        blocks = [(b * copies // steps_total, (b + 1) * copies // steps_total) for b in range(min(steps_total, copies))]
        for cat in dict.fromkeys(e.get("cat") for e in step_events):
            mine = [e for e in step_events if e.get("cat") == cat]
            lo = min(e["ts"] for e in mine)
            hi = max(e["ts"] + e.get("dur", 0) for e in mine)
            for b, (k0, k1) in enumerate(blocks):
                ev = dict(mine[0], name=f"ProfilerStep#{b}", ts=lo + k0 * shift_us)
                ev["dur"] = round(hi + (k1 - 1) * shift_us - ev["ts"], 3)
                emit(ev)
    out.write("\n  ]")
    for k in keys[at + 1 :]:
        out.write(f",\n  {dump(k)}: {dump(src[k])}")
    out.write("\n}\n")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE, help="a real Kineto trace")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--target-mb", type=float, default=100.0, help="aim for this many MiB of JSON (default 100)")
    g.add_argument("--copies", type=int, help="number of copies (overrides --target-mb)")
    ap.add_argument("--steps", type=int, help="merge the copies' profiler steps into this many (see above)")
    ap.add_argument("-o", "--out", type=Path, help="output .json or .json.gz (default .bench_data/<name>)")
    args = ap.parse_args(argv)

    src = _load(args.source)
    if "traceEvents" not in src:
        ap.error("source has no traceEvents")
    copies = args.copies
    if copies is None:
        probe = _Counter()
        scale(src, 1, probe)
        copies = max(1, round(args.target_mb * (1 << 20) / probe.n))
    stem = args.source.name.removesuffix(".gz").removesuffix(".json")
    tag = f".{args.steps}steps" if args.steps else ""
    out = args.out or REPO / ".bench_data" / f"{stem}.scaled{copies}x{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with _open_text(out, "w") as f:
        n = scale(src, copies, f, args.steps)
    size = out.stat().st_size
    print(f"{out}: {copies} copies of {args.source.name}, {n:,} events, {size / (1 << 20):,.1f} MiB on disk")
    return 0


class _Counter:
    """A write-only text sink counting UTF-8 bytes (to size one copy)."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, s: str) -> None:
        self.n += len(s.encode("utf-8"))


if __name__ == "__main__":
    sys.exit(main())
