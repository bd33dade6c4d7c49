"""Every distinct crash the fuzzers found, kept as a regression seed (issue 9). Each ran into an exception other
than BadInput before its fix; now it gives a verdict or one line naming the file.

Small inputs are kept as files (tests/data/fuzz_seeds/regressions/); larger ones as the mutation program that
produced them from a cut seed: nsys crashes (a 680 KB database each is no tiny seed; their causes are also covered,
by hand, in tests/test_contract_hostile_inputs.py: NSYS_CASES, test_corrupt_sqlite_pages) and the later Kineto
(~150 KB each) and dcgm-exporter ones.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from pathlib import Path

import pytest

from plasmient_report.parsers import _io

from . import mutators, seeds
from .harness import run_contract

REG = seeds.SEED_DIR / "regressions"

# file, family, what it crashed with, the fix
FILES = [
    (
        "kineto_thread_name_null.json",
        "kineto",
        "AttributeError in kineto._describe (thread_name whose name is null)",
        "a missing name is not a ROCm stream name",
    ),
    (
        "kineto_ids_beyond_int32.json",
        "kineto",
        "duckdb ConversionException in kineto._emit (grid, device, cbid, rank, device properties beyond int32)",
        "out-of-range ids are unknown (TRY_CAST, checked ranges)",
    ),
    (
        "dcgmi_huge_entity_id.txt",
        "dcgmi",
        "TypeError building an Int32 series (entity id 2**63)",
        "a row whose entity id is no GPU index is a malformed line",
    ),
    (
        "dcgmi_epoch_overflow.txt",
        "dcgmi",
        "TypeError building an Int64 series (20-digit epoch prefix)",
        "a prefix beyond ±2**62 ns is an unreadable timestamp: BadInput naming the line",
    ),
    (
        "exporter_infinite_time.json",
        "exporter",
        "OverflowError in dcgm_exporter._from_query_json (time 1e999)",
        "points that are not [time, value] numbers are skipped; samples at no time are left out",
    ),
    (
        "ncu_huge_id.csv",
        "ncu",
        "OverflowError building the Arrow table (a 20-digit device / process id)",
        "ids beyond int32 are unknown",
    ),
    (
        "ncu_infinite_launch_id.csv",
        "ncu",
        "OverflowError in ncu._long (launch ID 'Infinity')",
        "a launch id that is not a finite integer is replaced by its order",
    ),
    (
        "nvml_gzip_trailer.csv.gz",
        "nvml",
        "MemoryError in _io.read_maybe_gzip (trailer promises 1.9 GB)",
        "the trailer is a hint: pre-allocation capped by the decompressed-size guard",
    ),
    ("smi_dmon_gzip_trailer.txt.gz", "smi_dmon", "MemoryError in _io.read_maybe_gzip (lying trailer)", "the same"),
]

# family, seed, program, whole job?, what it crashed with (mutators.py and the seeds are deterministic)
PROGRAMS = [
    (
        "nsys",
        0,
        [("sql_times", 2181659846), ("sql_times", 2744422300), ("sql_wrong_values", 3292745709)],
        True,
        "OutOfRangeException in nsys._emit_nvtx: session start + an NVTX time of 2**63 − 1",
    ),
    (
        "nsys",
        0,
        [("sql_strings", 2279800146), ("sql_drop_table", 2786876819), ("sql_wrong_values", 3507176172)],
        False,
        "OutOfRangeException in nsys._emit: session start + a kernel time overflowing int64",
    ),
    (
        "nsys",
        0,
        [("sql_wrong_values", 3082878421), ("sql_strings", 1583016130)],
        True,
        "OutOfRangeException in metrics.sweep: times 9e18 ns apart (an int64 difference overflows)",
    ),
    (
        "nsys",
        0,
        [("corrupt_pages", 967887169), ("sql_strings", 1270138903)],
        False,
        "BadInput of several lines (SQLite's message quoted the schema)",
    ),
    (
        "nsys",
        0,
        [("sql_wrong_values", 3452503234), ("corrupt_pages", 1610275763), ("bit_flips", 1082032469)],
        False,
        "sqlite3.DatabaseError in nsys.Export.rows (a corrupt page found by a query)",
    ),
    (
        "nsys",
        0,
        [("sql_wrong_values", 777678884), ("sql_wrong_values", 77905139), ("sql_metadata", 3650086670)],
        False,
        "ValueError in nsys._read_meta (utcEpochNs is text); then a deviceId beyond int32",
    ),
    (
        "nsys",
        0,
        [("sql_metadata", 1976702649), ("corrupt_header", 2779160937), ("sql_wrong_values", 3446609371)],
        True,
        "ConversionException in nsys._emit: session start beyond int64",
    ),
    ("nsys", 0, [("bit_flips", 2773028232)], False, "adbc OperationalError in nsys._reader (database disk image is malformed)"),
    (
        "nsys",
        0,
        [("sql_rows", 3105616735), ("sql_rows", 830984907), ("sql_drop_column", 4053156479)],
        True,
        "TypeError in judge.build: ranks [None, 0, 1] (copies of no known process in a two-process report)",
    ),
    (
        "nsys",
        0,
        [("sql_metadata", 3230856997), ("sql_wrong_values", 1802036398), ("sql_wrong_values", 3343551243)],
        False,
        "UnicodeDecodeError in nsys.Export: SQLite's message about a damaged schema quoted bytes that are not UTF-8",
    ),
    (
        "nsys",
        0,
        [("sql_times", 1313383042), ("sql_times", 1204525867), ("sql_wrong_values", 711893674)],
        False,
        "OutOfRangeException in nsys.emit_activities: a kernel's static + dynamic shared memory overflowing int64",
    ),
    (
        "nsys",
        0,
        [("sql_drop_column", 3857627677), ("sql_wrong_values", 1827821982)],
        True,
        "TypeError in align.align_counters: a rank whose events have no times (its span NULL)",
    ),
    (
        "kineto",
        1,
        [("drop_key", 3265688781), ("drop_key", 669227714)],
        True,
        "ContractViolation: losses summing to 2.0 (kernels without args.device or a pid measured as a GPU of their own)",
    ),
    (
        "kineto",
        1,
        [("duplicate_events", 4177650554), ("huge_numbers", 1062006938)],
        True,
        "BinderException in kineto._clip_to_recording (a recording bound of inf written into SQL); then losses past 100%",
    ),
    (
        "kineto",
        1,
        [("unknown_categories", 351869369), ("huge_numbers", 1828418690), ("deep_nesting", 1045652375)],
        False,
        "RecursionError in kineto.schema.decode_head (JSON nested too deeply outside traceEvents)",
    ),
    (
        "kineto",
        1,
        [("unknown_categories", 2221477382), ("huge_numbers", 1745391594), ("reorder_keys", 2061507027)],
        False,
        "ConversionException in kineto._emit_ops: a profiler overhead record at -1e308 µs (the spans were never cleaned)",
    ),
    (
        "kineto",
        0,
        [("huge_numbers", 2966389123), ("reorder_keys", 3744326609), ("drop_key", 1486811856)],
        True,
        "ConversionException in roofline.kernel_groups: 10^30 FLOPs in fixed point overflowed a HUGEINT (no kernel's work)",
    ),
    (
        "nsys",
        0,
        [("sql_wrong_values", 2090272894), ("sql_drop_table", 3743496011)],
        False,
        "OutOfRangeException in nsys.emit_rest: a profiler overhead record ending at int64's maximum (never cleaned)",
    ),
    (
        "kineto",
        0,
        [("huge_numbers", 395224110), ("reorder_keys", 2072160295)],
        False,
        "OutOfRangeException in kineto._emit_collectives: an element count of int64's maximum times 2 bytes",
    ),
    (
        "exporter",
        0,
        [("long_line", 428713089)],
        False,
        "ValueError in dcgm_exporter._from_query_json (an integer of 200,000 digits: past Python's int conversion limit)",
    ),
    (
        "exporter",
        1,
        [("line_endings", 163577546), ("deep_nesting", 1637462740), ("repeat_lines", 3344226023)],
        False,
        "RecursionError in kineto.sniff._from_head (a counter log made to start like deeply nested JSON)",
    ),
]


def _run(tmp: Path, name: str, data: bytes, family: str, full: bool) -> str:
    inputs = seeds.place_inputs(tmp / "in", name, data, family, full)
    return run_contract(inputs, tmp, full=full, limit_s=120)


@pytest.mark.parametrize("name,family,crash,fix", FILES, ids=[f[0] for f in FILES])
def test_regression_seed_file(name, family, crash, fix, tmp_path):
    data = (REG / name).read_bytes()
    _run(tmp_path / "ingest", name, data, family, full=False)
    _run(tmp_path / "whole", name, data, family, full=True)


@pytest.mark.parametrize("family,seed,program,full,crash", PROGRAMS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PROGRAMS)])
def test_regression_program(family, seed, program, full, crash, tmp_path):
    name, data = seeds.seeds(family)[seed]
    _run(tmp_path, name, mutators.apply(family, data, program), family, full)


def test_gzip_trailer_is_not_preallocated():
    # The trailer of nvml_gzip_trailer.csv.gz says 1.9 GB; the file inflates to a few KB. Reading it must not
    # allocate what the trailer says (it once did: MemoryError under a 4 GB limit, 1.9 GB of RSS without one).
    tracemalloc.start()
    try:
        with contextlib.suppress(Exception):  # only the memory matters here (it is a corrupt gzip too)
            _io.read_maybe_gzip(REG / "nvml_gzip_trailer.csv.gz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
