"""A longer fuzzing campaign than CI's: mutation fuzzing of every parser (and, optionally, coverage-guided
fuzzing with atheris), each input run in a worker process under time and memory limits.

    python benchmarks/fuzz_campaign.py --per-family 3000 --out benchmarks/fuzz_out
    python benchmarks/fuzz_campaign.py --families kineto nsys --per-family 500 --full-every 4
    python benchmarks/fuzz_campaign.py --engine atheris --families kineto --seconds 300

Inputs come from tests/fuzz (seeds cut from the committed samples, the same mutators as the CI tests). The
contract (tests/fuzz/harness.py): BadInput with one line naming the file, or a verdict whose invariants hold;
anything else is a crash. Crashes are deduplicated by exception type + innermost frame in plasmient_report;
each distinct one is saved (input, program, traceback) under OUT/crashes/<family>/ to become a regression seed
(tests/data/fuzz_seeds/regressions/). A worker that hangs past --timeout or dies (memory limit, signal) is a
crash too. One worker runs at a time, single-threaded (DuckDB threads = 1, POLARS_MAX_THREADS = 1), so the
campaign takes one core of a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAMILY_NAMES = ("kineto", "nsys", "nvml", "smi_dmon", "smi_query", "dcgmi", "exporter", "ncu")


# ------------------------------------------------------------------------------------------------ worker


def _single_threaded() -> None:
    """One DuckDB thread (store.threads) and one polars thread: the campaign takes one core of a shared machine."""
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    from plasmient_report import store

    store.threads(1).__enter__()  # for the life of this worker process


class HarnessError(Exception):
    """The fuzzer itself failed to build an input (reported apart, never counted as a crash of the tool)."""


def crash_signature(e: BaseException) -> tuple[str, str]:
    """(exception type, innermost frame inside plasmient_report — else the innermost frame at all)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "plasmient_report" in f.filename]
    f = (ours or frames or [None])[-1]
    where = f"{Path(f.filename).name}:{f.name}:{f.lineno}" if f is not None else "?"
    return type(e).__name__, where


def build_input(family: str, seed_idx: int, program: list[tuple[str, int]], folder: Path, full: bool = True) -> list[Path]:
    from tests.fuzz import mutators, seeds

    name, data = seeds.seeds(family)[seed_idx]
    data = mutators.apply(family, data, program)
    return seeds.place_inputs(folder, mutators.file_name(family, name, data), data, family, full)


def worker(mem_mb: int) -> None:
    """Read jobs (JSON lines) on stdin, answer one JSON line each on stdout."""
    import resource

    if mem_mb:
        resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    _single_threaded()
    from tests.fuzz.harness import ContractViolation, Hang, run_contract

    for line in sys.stdin:
        job = json.loads(line)
        work = Path(tempfile.mkdtemp(prefix="plasmient-fuzz-"))
        ans: dict[str, Any]
        try:
            try:
                inputs = build_input(job["family"], job["seed"], [tuple(x) for x in job["program"]], work / "in", job["full"])
            except Exception as e:  # noqa: BLE001 - a bug of the fuzzer, not of the tool
                raise HarnessError(f"{type(e).__name__}: {e}") from e
            outcome = run_contract(inputs, work, full=job["full"], limit_s=job["timeout"])
            ans = {"outcome": "ok" if outcome == "ok" else "bad_input", "message": outcome[:200]}
        except (Exception, Hang) as e:  # noqa: BLE001 - everything that is not BadInput is a finding
            kind = (
                "violation"
                if isinstance(e, ContractViolation)
                else "hang"
                if isinstance(e, Hang)
                else "harness_error"
                if isinstance(e, HarnessError)
                else "crash"
            )
            ans = {
                "outcome": kind,
                "signature": list(crash_signature(e)),
                "message": str(e)[:300],
                "traceback": traceback.format_exc()[-4000:],
            }
        finally:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


# ------------------------------------------------------------------------------------------------ parent


class Worker:
    def __init__(self, mem_mb: int) -> None:
        self.mem_mb = mem_mb
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = {**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--mem-mb", str(self.mem_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env=env,
        )

    def ask(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        import selectors

        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        rc = self.proc.poll()
        self.stop()
        if rc is None:
            return {"outcome": "hang", "signature": ["Timeout", "worker"], "message": f"no answer in {timeout:g} s"}
        return {
            "outcome": "crash",
            "signature": ["WorkerDied", f"exit {rc}"],
            "message": f"worker died (exit {rc}: memory limit or a signal)",
        }

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def campaign(
    families: list[str], per_family: int, out: Path, seed: int, full_every: int, timeout: float, mem_mb: int
) -> dict[str, Any]:
    from tests.fuzz import mutators, seeds

    rng = random.Random(seed)
    summary: dict[str, Any] = {"seed": seed, "per_family": per_family, "families": {}}
    w = Worker(mem_mb)
    try:
        for fam in families:
            n_seeds = len(seeds.seeds(fam))
            stats: Counter[str] = Counter()
            distinct: dict[str, dict[str, Any]] = {}
            t0 = time.time()
            for i in range(per_family):
                program = mutators.random_program(fam, rng)
                job = {
                    "family": fam,
                    "seed": rng.randrange(n_seeds),
                    "program": program,
                    "full": full_every > 0 and i % full_every == 0,
                    "timeout": timeout,
                }
                ans = w.ask(job, timeout + 30)
                stats[ans["outcome"]] += 1
                if ans["outcome"] in ("crash", "hang", "violation"):
                    sig = (
                        " @ ".join(ans["signature"])
                        if ans["outcome"] != "violation"
                        else "ContractViolation @ " + ans["message"][:60]
                    )
                    if sig not in distinct:
                        distinct[sig] = {"count": 0, "job": job, "message": ans["message"], "traceback": ans.get("traceback", "")}
                        _save(out, fam, sig, job, ans)
                        print(f"  [{fam}] new: {sig}: {ans['message'][:120]}", flush=True)
                    distinct[sig]["count"] += 1
                if (i + 1) % 250 == 0:
                    print(f"  [{fam}] {i + 1}/{per_family} {dict(stats)} ({time.time() - t0:.0f} s)", flush=True)
            summary["families"][fam] = {
                "inputs": per_family,
                "outcomes": dict(stats),
                "seconds": round(time.time() - t0),
                "distinct_crashes": {k: v["count"] for k, v in distinct.items()},
            }
            print(
                f"{fam}: {per_family} inputs, {dict(stats)}, {len(distinct)} distinct crashes, {time.time() - t0:.0f} s",
                flush=True,
            )
    finally:
        w.stop()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def replay(crash_dir: Path, timeout: float, mem_mb: int) -> int:
    """Run every saved crash (its family, seed and mutation program) again; print what each gives now."""
    w = Worker(mem_mb)
    still = 0
    try:
        for f in sorted(crash_dir.rglob("*.json")):
            if len(f.stem) != 12:  # <key>.json describes a crash; <key>-<name>.json is a crashing input
                continue
            job = json.loads(f.read_text())
            if "program" not in job:
                continue
            ans = w.ask({k: job[k] for k in ("family", "seed", "program", "full", "timeout")}, timeout + 30)
            bad = ans["outcome"] in ("crash", "hang", "violation")
            still += bad
            print(
                f"{'STILL ' if bad else 'fixed '}{job['family']:9} {job['signature']}: now {ans['outcome']} "
                f"{ans.get('message', '')[:100]}",
                flush=True,
            )
    finally:
        w.stop()
    return still


def _save(out: Path, family: str, sig: str, job: dict[str, Any], ans: dict[str, Any]) -> None:
    key = hashlib.sha256(sig.encode()).hexdigest()[:12]
    d = out / "crashes" / family
    d.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="plasmient-fuzz-save-"))
    try:
        inputs = build_input(family, job["seed"], [tuple(x) for x in job["program"]], work)
        src = inputs[-1]
        (d / f"{key}-{src.name}").write_bytes(src.read_bytes())
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    (d / f"{key}.json").write_text(json.dumps({"signature": sig, **job, **ans}, indent=1))


# ------------------------------------------------------------------------------------------------ atheris


def atheris_campaign(family: str, seconds: int, out: Path, mem_mb: int) -> None:
    """Coverage-guided: atheris mutates the seed bytes, guided by the coverage of plasmient_report's Python code.
    The ingest stage only (fast); non-BadInput exceptions are recorded and fuzzing goes on."""
    import atheris

    _single_threaded()
    with atheris.instrument_imports(include=["plasmient_report"]):
        from plasmient_report import pipeline, store  # noqa: F401
        from plasmient_report.parsers import (  # noqa: F401  # noqa: F401
            _jsonsplit,
            dcgm_exporter,
            dcgmi_dmon,
            kineto,
            ncu,
            nsys,
            nvidia_smi_dmon,
            nvidia_smi_query,
            nvml_csv,
        )
    from tests.fuzz import harness, seeds

    if family == "jsonsplit":
        _atheris_jsonsplit(seconds, out, mem_mb)
        return
    corpus_dir = out / "atheris" / family / "corpus"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    for i, (_, data) in enumerate(seeds.seeds(family)):
        (corpus_dir / f"seed{i}").write_bytes(data)
    name = seeds.seeds(family)[0][0]
    found: dict[str, int] = {}
    counts: Counter[str] = Counter()

    def summary() -> None:  # written as it goes: libFuzzer ends the process its own way
        (out / f"atheris-{family}.json").write_text(
            json.dumps(
                {
                    "family": family,
                    "engine": "atheris",
                    "seconds": seconds,
                    "inputs": sum(counts.values()),
                    "outcomes": dict(counts),
                    "distinct_crashes": found,
                },
                indent=1,
            )
        )

    def one(data: bytes) -> None:
        work = Path(tempfile.mkdtemp(prefix="plasmient-atheris-"))
        try:
            folder = work / "in"
            folder.mkdir()
            p = folder / name
            p.write_bytes(data)
            inputs = [p]
            try:
                res = harness.run_contract(inputs, work, full=False, limit_s=30)
                counts["ok" if res == "ok" else "bad_input"] += 1
            except (Exception, harness.Hang) as e:  # noqa: BLE001
                counts["crash"] += 1
                sig = " @ ".join(crash_signature(e))
                if sig not in found:
                    d = out / "crashes" / family
                    d.mkdir(parents=True, exist_ok=True)
                    key = hashlib.sha256(sig.encode()).hexdigest()[:12]
                    (d / f"{key}-atheris-{name}").write_bytes(data)
                    (d / f"{key}-atheris.json").write_text(
                        json.dumps({"signature": sig, "message": str(e)[:300], "traceback": traceback.format_exc()[-4000:]})
                    )
                    print(f"  [{family}/atheris] new: {sig}: {str(e)[:120]}", flush=True)
                found[sig] = found.get(sig, 0) + 1
                summary()
        finally:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        if sum(counts.values()) % 100 == 0:
            summary()

    atheris.Setup(
        [
            sys.argv[0],
            str(corpus_dir),
            f"-max_total_time={seconds}",
            f"-rss_limit_mb={mem_mb}",
            "-timeout=60",
            "-print_final_stats=1",
        ],
        one,
    )
    try:
        atheris.Fuzz()
    except SystemExit:
        pass
    finally:
        summary()


def _atheris_jsonsplit(seconds: int, out: Path, mem_mb: int) -> None:
    """Differential, coverage-guided: the streaming scanner (parsers/_jsonsplit.py) must cut traceEvents into the
    very events a whole-document JSON decoder sees, at any chunk size, or refuse the document with SplitError."""
    import io

    import atheris

    with atheris.instrument_imports(include=["plasmient_report"]):
        from plasmient_report.parsers import _jsonsplit
    from tests.fuzz import seeds

    corpus_dir = out / "atheris" / "jsonsplit" / "corpus"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    for i, (_, data) in enumerate(seeds.seeds("kineto")):
        doc = json.loads(data)
        doc["traceEvents"] = doc["traceEvents"][:12]
        (corpus_dir / f"seed{i}").write_bytes(json.dumps(doc).encode())
    counts: Counter[str] = Counter()
    found: dict[str, int] = {}

    def split(data: bytes, chunk: int, decode: bool) -> list[Any] | None:
        events: list[Any] = []
        try:
            for b in _jsonsplit.split_events(io.BytesIO(data), chunk_bytes=chunk):
                if decode and not isinstance(b, tuple):
                    events += json.loads(b)
        except _jsonsplit.SplitError:
            return None
        return events

    def summary() -> None:
        (out / "atheris-jsonsplit.json").write_text(
            json.dumps(
                {
                    "family": "jsonsplit",
                    "engine": "atheris",
                    "seconds": seconds,
                    "inputs": sum(counts.values()),
                    "outcomes": dict(counts),
                    "distinct_crashes": found,
                },
                indent=1,
            )
        )

    def one(data: bytes) -> None:
        try:
            try:
                ref = json.loads(data)
            except (ValueError, RecursionError):
                ref = None
            expected = ref.get("traceEvents") if isinstance(ref, dict) and data.count(b'"traceEvents"') == 1 else None
            # a valid document: the batches must decode to its events; an invalid one: no exception but SplitError
            # (the events' own content is checked later, by DuckDB's reader)
            for chunk in (7, 4096):
                got = split(data, chunk, decode=isinstance(expected, list))
                if isinstance(expected, list) and got is not None and got != expected:
                    raise AssertionError(f"chunk {chunk}: {len(got)} events, the document has {len(expected)}")
            counts["ok"] += 1
            if sum(counts.values()) % 500 == 0:
                summary()
        except (ValueError, RecursionError) as e:  # a batch that is not JSON: the splitter cut wrongly
            _found(e, data)
        except Exception as e:  # noqa: BLE001
            _found(e, data)

    def _found(e: BaseException, data: bytes) -> None:
        counts["crash"] += 1
        summary()
        sig = " @ ".join(crash_signature(e))
        if sig not in found:
            d = out / "crashes" / "jsonsplit"
            d.mkdir(parents=True, exist_ok=True)
            key = hashlib.sha256(sig.encode()).hexdigest()[:12]
            (d / f"{key}-atheris.bin").write_bytes(data)
            (d / f"{key}-atheris.json").write_text(json.dumps({"signature": sig, "message": str(e)[:300]}))
            print(f"  [jsonsplit/atheris] new: {sig}: {str(e)[:120]}", flush=True)
        found[sig] = found.get(sig, 0) + 1

    atheris.Setup(
        [sys.argv[0], str(corpus_dir), f"-max_total_time={seconds}", f"-rss_limit_mb={mem_mb}", "-timeout=30", "-max_len=65536"],
        one,
    )
    try:
        atheris.Fuzz()
    except SystemExit:
        pass
    finally:
        summary()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--families",
        nargs="*",
        default=list(FAMILY_NAMES),
        choices=[*FAMILY_NAMES, "jsonsplit"],
        help="parser families (jsonsplit: the streaming JSON scanner alone, atheris engine only)",
    )
    ap.add_argument("--per-family", type=int, default=1000, help="inputs tried per parser family")
    ap.add_argument(
        "--full-every",
        type=int,
        default=4,
        help="every Nth input runs the whole job (align, measure, rules, verdict), the others ingest only",
    )
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per input before it counts as a hang")
    ap.add_argument("--mem-mb", type=int, default=4096, help="address-space limit of the worker (MiB)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "fuzz_out")
    ap.add_argument("--engine", choices=("mutation", "atheris"), default="mutation")
    ap.add_argument("--seconds", type=int, default=300, help="atheris: seconds per family")
    ap.add_argument("--replay", type=Path, help="run the crashes saved under this folder again, nothing else")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.mem_mb)
        return
    if a.replay:
        sys.exit(1 if replay(a.replay, a.timeout, a.mem_mb) else 0)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.engine == "atheris":
        for fam in a.families:
            # one process per family: atheris.Fuzz() runs once per process
            subprocess.run(
                [sys.executable, __file__, "--atheris-one", fam, str(a.seconds), str(a.out), str(a.mem_mb)], cwd=ROOT, check=False
            )
        return
    campaign(a.families, a.per_family, a.out, a.seed, a.full_every, a.timeout, a.mem_mb)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--atheris-one":
        atheris_campaign(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
