"""Property-based fuzzing of every parser (issue 9), seeded with the real recordings of sample_traces/.

Property: for a mutated real file — truncated at a structural boundary, bit-flipped, keys dropped / duplicated /
reordered, types swapped, numbers huge / negative / overflowing / NaN, invalid UTF-8, deep nesting, events of zero
length / out of order / ending before they start, unknown categories; SQLite tables or columns dropped, pages
corrupted — the main job either gives a verdict whose invariants hold or raises BadInput with one line naming the
file; nothing else is raised, inputs are unchanged and nothing is written beside them (tests/fuzz/harness.py).

Bounded for CI (about a minute on two cores): derandomized, a fixed number of examples per family; set
PLASMIENT_FUZZ_SCALE=10 for ten times more. benchmarks/fuzz_campaign.py runs the long campaign.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import mutators, seeds
from .harness import run_contract

SCALE = float(os.environ.get("PLASMIENT_FUZZ_SCALE", "1"))
# (examples of the ingest stage alone, examples of the whole job) per family, for SCALE = 1.
EXAMPLES = {
    "kineto": (40, 10),
    "nsys": (24, 5),
    "nvml": (20, 4),
    "smi_dmon": (20, 4),
    "smi_query": (20, 4),
    "dcgmi": (20, 4),
    "exporter": (20, 4),
    "ncu": (20, 4),
}


def _settings(n: int) -> settings:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


def programs(family: str) -> st.SearchStrategy[list[tuple[str, int]]]:
    names = sorted(mutators.MUTATORS[family]) + (["gzip"] if family in mutators.GZIP_FAMILIES else [])
    return st.lists(st.tuples(st.sampled_from(names), st.integers(0, 2**32 - 1)), min_size=1, max_size=3)


def run_mutated(family: str, seed: int, program: list[tuple[str, int]], full: bool) -> str:
    name, data = seeds.seeds(family)[seed % len(seeds.seeds(family))]
    data = mutators.apply(family, data, program)
    with tempfile.TemporaryDirectory(prefix="plasmient-fuzz-") as tmp:
        work = Path(tmp)
        inputs = seeds.place_inputs(work / "in", mutators.file_name(family, name, data), data, family, full)
        return run_contract(inputs, work, full=full, limit_s=120)


def _property(family: str, full: bool):  # noqa: ANN202 - a hypothesis test factory
    n = EXAMPLES[family][1 if full else 0]

    @_settings(n)
    @given(seed=st.integers(0, 7), program=programs(family))
    def prop(seed: int, program: list[tuple[str, int]]) -> None:
        run_mutated(family, seed, program, full)

    return prop


@pytest.mark.parametrize("family", seeds.FAMILIES)
def test_seeds_pass_unmutated(family):
    # The seeds themselves are good inputs: mutations start from files the tool reads.
    for i in range(len(seeds.seeds(family))):
        assert run_mutated(family, i, [], full=True) == "ok"


@pytest.mark.slow
def test_fuzz_kineto_ingest():
    _property("kineto", full=False)()


@pytest.mark.slow
def test_fuzz_kineto_whole_job():
    _property("kineto", full=True)()


@pytest.mark.slow
def test_fuzz_nsys_ingest():
    _property("nsys", full=False)()


@pytest.mark.slow
def test_fuzz_nsys_whole_job():
    _property("nsys", full=True)()


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(seeds.AUXILIARY))
def test_fuzz_counter_logs_and_ncu_ingest(family):
    _property(family, full=False)()


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(seeds.AUXILIARY))
def test_fuzz_counter_logs_and_ncu_beside_a_trace(family):
    _property(family, full=True)()


def test_kineto_truncated_at_every_structural_boundary(tmp_path):
    # A small real document (the first events of the DDP rank-0 trace) cut before and after every `{ } [ ] , : "`.
    import json
    import re

    full = json.loads(seeds.seeds("kineto")[0][1])
    events = [e for e in full["traceEvents"] if e.get("ph") != "M"]
    kernel = next(e for e in events if e.get("cat") == "kernel")
    kernel["args"] = {k: kernel["args"][k] for k in ("device", "stream", "correlation", "grid")}
    doc = {
        "schemaVersion": 1,
        "baseTimeNanoseconds": full["baseTimeNanoseconds"],
        "distributedInfo": {"rank": 0, "world_size": 2},
        "traceEvents": [kernel],
    }
    data = json.dumps(doc, separators=(",", ":")).encode()
    cuts = sorted({m.start() + d for m in re.finditer(rb'[{}\[\],:"]', data) for d in (0, 1)})
    outcomes = set()
    for i, cut in enumerate(cuts):
        work = tmp_path / f"c{i}"
        (work / "in").mkdir(parents=True)
        p = work / "in" / "cut.pt.trace.json"
        p.write_bytes(data[:cut])
        outcomes.add(run_contract([p], work, full=False, limit_s=60).split(":")[0])
    assert outcomes <= {"ok", "bad input"} and "bad input" in outcomes


def test_nsys_cut_at_page_boundaries(tmp_path):
    data = seeds.seeds("nsys")[0][1]
    page = int.from_bytes(data[16:18], "big")
    n = len(data) // page
    for k in sorted({1, 2, 3, n // 4, n // 2, n - 1}):
        work = tmp_path / f"p{k}"
        (work / "in").mkdir(parents=True)
        p = work / "in" / "cut.sqlite"
        p.write_bytes(data[: k * page])
        run_contract([p], work, full=False, limit_s=60)
