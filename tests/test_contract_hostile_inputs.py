"""Hand-made hostile inputs of every kind issue 9 names, through the real command line: each gives exit 0 with a
verdict that says honestly what is missing (`coverage`), or exit 2 with exactly one line naming the file — never a
traceback, a hang, a half-written output folder, or a write beside an input. Built at test time from the samples.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plasmient_report.cli import main

from . import contract
from .fuzz import seeds
from .fuzz.harness import time_limit

KINETO = seeds.seeds("kineto")[0]  # (name, bytes): the cut DDP rank-0 trace (distributedInfo: rank 0 of 2)


def kineto_doc() -> dict[str, Any]:
    return json.loads(KINETO[1])


def kernels_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def dump(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def check(inputs: list[Path], tmp: Path, expect: str, *extra: str) -> dict[str, Any] | str:
    """The real command line (in-process) held to the whole contract (tests/contract.py), with a hang guard;
    returns the verdict (exit 0) or the error line (exit 2)."""
    out = tmp / "out"
    with time_limit(300):
        got = contract.check_cli(
            "report",
            *inputs,
            "--out",
            out,
            "--no-html",
            "--no-trace",
            "--json",
            *extra,
            inputs=inputs,
            out=out,
            expect=expect,
            files=contract.OUTPUT_FILES_NO_HTML_TRACE,
            in_process=True,
        )
    assert got is not None
    return got


def write(tmp: Path, name: str, data: bytes) -> Path:
    d = tmp / "in"
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_bytes(data)
    return p


# --------------------------------------------------------------------------------------------- Kineto JSON


def _truncated() -> bytes:
    return KINETO[1][: len(KINETO[1]) // 2]


def _bit_flips() -> bytes:
    b = bytearray(KINETO[1])
    for i in range(100, len(b), 997):
        b[i] ^= 0x10
    return bytes(b)


def _dup_keys() -> bytes:
    return KINETO[1].replace(b'"ts": ', b'"ts": "x", "ts": ', 50)


def _drop_ts() -> bytes:
    doc = kineto_doc()
    for e in kernels_of(doc)[:3]:
        del e["ts"]
    return dump(doc)


def _wrong_types() -> bytes:
    doc = kineto_doc()
    for e in kernels_of(doc)[:5]:
        e["args"]["grid"] = "wide"
        e["args"]["device"] = [0]
        e["pid"] = {"gpu": 0}
    doc["deviceProperties"] = "H200"
    return dump(doc)


def _huge_negative() -> bytes:
    doc = kineto_doc()
    k = kernels_of(doc)
    k[0]["args"]["grid"] = [2**63, -(2**63), 2**70]
    k[1]["args"]["registers per thread"] = -5
    k[2]["args"]["External id"] = 2**64
    k[3]["args"]["stream"] = -(2**63)
    return dump(doc)


def _base_overflow() -> bytes:
    doc = kineto_doc()
    doc["baseTimeNanoseconds"] = 2**63 - 1000
    return dump(doc)


def _nan() -> bytes:
    doc = kineto_doc()
    kernels_of(doc)[0]["dur"] = float("nan")  # json writes NaN (not JSON, but Python's and others' writers do)
    return dump(doc)


def _infinity() -> bytes:
    doc = kineto_doc()
    kernels_of(doc)[1]["ts"] = float("inf")
    return dump(doc)


def _bad_utf8() -> bytes:
    doc = kineto_doc()
    kernels_of(doc)[0]["name"] = "BAD_NAME"
    return dump(doc).replace(b"BAD_NAME", b"gemm\xff\xfe\xc3\x28")


def _deep(depth: int) -> Callable[[], bytes]:
    def make() -> bytes:
        data = KINETO[1]
        i = data.index(b"{") + 1
        return data[:i] + b'"deep": ' + b"[" * depth + b"1" + b"]" * depth + b", " + data[i:]

    return make


def _deep_in_args() -> bytes:
    data = KINETO[1]
    i = data.index(b'"args": {') + len(b'"args": {')
    return data[:i] + b'"Input Dims": ' + b"[" * 50_000 + b"]" * 50_000 + b", " + data[i:]


def _zero_length() -> bytes:
    doc = kineto_doc()
    for e in kernels_of(doc):
        e["dur"] = 0
    return dump(doc)


def _out_of_order() -> bytes:
    doc = kineto_doc()
    doc["traceEvents"].reverse()
    return dump(doc)


def _end_before_start() -> bytes:
    doc = kineto_doc()
    kernels_of(doc)[0]["dur"] = -5.0
    return dump(doc)


def _unknown_categories() -> bytes:
    doc = kineto_doc()
    for i, e in enumerate(doc["traceEvents"][::7]):
        e["cat"] = f"mystery_{i}"
    doc["traceEvents"].append({"ph": "Z", "cat": "kernel", "name": "z", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0})
    return dump(doc)


def _reordered_keys() -> bytes:
    doc = kineto_doc()
    events = doc.pop("traceEvents")
    doc = {"traceEvents": [dict(reversed(list(e.items()))) for e in events], **doc}
    return dump(doc)


def _trailing_garbage() -> bytes:
    return KINETO[1] + b"\x00\xff garbage"


def _ops_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]


def _nan_flops() -> bytes:
    doc = kineto_doc()
    for e, v in zip(_ops_of(doc)[:3], (float("nan"), float("inf"), -5.0), strict=False):
        e["args"]["flops"] = v
    return dump(doc)


def _dims_wrong_type() -> bytes:
    doc = kineto_doc()
    for e, v in zip(_ops_of(doc)[:4], ("[[8, 8]]", {"a": 1}, 5, True), strict=False):
        e["args"]["Input Dims"] = v
        e["args"]["Input type"] = v
    return dump(doc)


def _pid_not_string() -> bytes:
    doc = kineto_doc()
    for e, v in zip(doc["traceEvents"][::5], (True, 1.5, [0], None, {"p": 1}, -3, 2**70), strict=False):
        e["pid"] = v
        e["tid"] = v
    return dump(doc)


def _negative_absolute_time() -> bytes:
    # base + ts before 1970 for a few events: no UTC time; the rest stays
    doc = kineto_doc()
    ks = kernels_of(doc)
    base = doc["baseTimeNanoseconds"]
    for e in ks[:2]:
        e["ts"] = -(base / 1000.0) - 10.0
    return dump(doc)


def _negative_base() -> bytes:
    doc = kineto_doc()
    doc["baseTimeNanoseconds"] = -1790857026000000000
    return dump(doc)


def _bom() -> bytes:
    return b"\xef\xbb\xbf" + KINETO[1]


def _leading_whitespace() -> bytes:
    return b"\n\n   \t\r\n" * 1000 + KINETO[1]


def _big_metadata_first() -> bytes:
    # a harness's metadata object (200 KiB) before traceEvents: detection must not give up after 4 KiB
    doc = kineto_doc()
    meta = {"metadata": {"runs": [{"i": i, "note": "x" * 100} for i in range(2000)]}}
    return dump({**meta, **doc})


def _array_form() -> bytes:
    return dump(kineto_doc()["traceEvents"])


def _array_no_close() -> bytes:
    data = _array_form()
    return data[: data.rindex(b"]")] + b",\n"


def _array_cut_mid_event() -> bytes:
    data = _array_form()
    return data[: data.rindex(b"]") - 40]


KINETO_CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "truncated": (_truncated, "bad"),
    "bit_flips": (_bit_flips, "either"),
    "duplicate_keys": (_dup_keys, "either"),
    "missing_ts": (_drop_ts, "ok"),
    "wrong_types": (_wrong_types, "either"),
    "huge_negative_ids": (_huge_negative, "ok"),
    "int64_overflow_time_base": (_base_overflow, "bad"),
    "nan": (_nan, "ok"),
    "infinity": (_infinity, "ok"),
    "invalid_utf8": (_bad_utf8, "either"),
    "deep_nesting_100": (_deep(100), "ok"),
    "deep_nesting_100000": (_deep(100_000), "either"),
    "deep_nesting_in_args": (_deep_in_args, "either"),
    "zero_length_events": (_zero_length, "ok"),
    "events_out_of_order": (_out_of_order, "ok"),
    "end_before_start": (_end_before_start, "ok"),
    "unknown_categories": (_unknown_categories, "ok"),
    "reordered_keys": (_reordered_keys, "ok"),
    "trailing_garbage": (_trailing_garbage, "bad"),
    "nan_flops": (_nan_flops, "ok"),
    "input_dims_wrong_type": (_dims_wrong_type, "ok"),
    "pid_not_string": (_pid_not_string, "ok"),
    "negative_absolute_time": (_negative_absolute_time, "ok"),
    "negative_time_base": (_negative_base, "bad"),
    "utf8_bom": (_bom, "ok"),
    "leading_whitespace": (_leading_whitespace, "ok"),
    "big_metadata_before_events": (_big_metadata_first, "ok"),
    "array_form": (_array_form, "ok"),
    "array_form_without_closing_bracket": (_array_no_close, "ok"),
    "array_form_cut_inside_an_event": (_array_cut_mid_event, "ok"),
}

# What the verdict must say of the events or fields it left out (never a silent loss).
KINETO_NOTES = {
    "missing_ts": "3 with a missing, NaN or infinite ts/dur",
    "nan": "1 with a missing, NaN or infinite ts/dur",
    "infinity": "1 with a missing, NaN or infinite ts/dur",
    "end_before_start": "1 with a negative duration",
    "nan_flops": "3 ops' 'flops' left out",
    "input_dims_wrong_type": "4 ops' 'Input Dims' / 'Input type' left out",
    "negative_absolute_time": "2 with a UTC time before 1970",
    "array_form_cut_inside_an_event": "the trace ends inside its last event",
    # (these kernels were once a GPU of their own, device NULL, counted twice in the waterfall: Σ losses = 2.0)
    "wrong_types": "5 with no GPU index (args.device, else the pid)",
}


@pytest.mark.parametrize("case", list(KINETO_CASES))
def test_hostile_kineto(case, tmp_path):
    make, expect = KINETO_CASES[case]
    v = check([write(tmp_path, KINETO[0], make())], tmp_path, expect)
    if case in KINETO_NOTES:
        assert isinstance(v, dict) and KINETO_NOTES[case] in (v["clock"]["sources"][0]["notes"] or ""), v["clock"]
    if expect == "ok" and isinstance(v, dict):
        assert v["coverage"]["kernels"] > 0


def test_events_out_of_order_give_the_same_numbers(tmp_path):
    a = check([write(tmp_path / "a", KINETO[0], KINETO[1])], tmp_path / "a", "ok")
    b = check([write(tmp_path / "b", KINETO[0], _out_of_order())], tmp_path / "b", "ok")
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a["utilization"]["trace"] == b["utilization"]["trace"]
    assert a["achieved_fraction_of_peak"] == b["achieved_fraction_of_peak"]


def test_missing_rank_is_reported(tmp_path):
    # distributedInfo says 8 ranks; one file (rank 0) is given: ranks 1–7 are reported missing, not guessed.
    doc = kineto_doc()
    doc["distributedInfo"]["world_size"] = 8
    v = check([write(tmp_path, "rank0.pt.trace.json", dump(doc))], tmp_path, "ok")
    assert isinstance(v, dict)
    assert v["coverage"]["world_size"] == 8 and v["coverage"]["missing_ranks"] == [1, 2, 3, 4, 5, 6, 7]
    assert any("7 of 8 ranks" in n for n in v["notes"])


def test_cupti_buffer_overflow_is_reported(tmp_path):
    doc = kineto_doc()
    doc["INFO"] = [
        "INFO:2026-11-30 18:57:01 1:1 CuptiActivityProfiler.cpp:395] Record counts: Out-of-range = 0, "
        "Blocklisted runtime = 9, CUPTI stopped early? = 1"
    ]
    doc["WARNING"] = ["WARNING:2026-11-30 18:57:01 1:1 CuptiActivityApi.cpp:123] Detected 4096 dropped records"]
    v = check([write(tmp_path, "rank0.pt.trace.json", dump(doc))], tmp_path, "ok")
    assert isinstance(v, dict)
    cov = v["coverage"]
    assert cov["dropped_events"] == 4096
    (src,) = cov["incomplete_sources"]
    assert "CUPTI stopped early" in src["what"] and "4096" in src["what"]


# ------------------------------------------------------------------------------------------- gzip, files


def test_gzip_bomb_is_refused_by_the_decompressed_size_guard(tmp_path):
    # 64 MiB of zeros in 64 KiB of gzip, against a guard lowered to 8 MiB (the default is 32 GiB, or 1 GiB at
    # more than 200x): refused while inflating, in bounded memory. A subprocess: the guard is read at import.
    p = write(tmp_path, "bomb.pt.trace.json.gz", gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20)))
    run = contract.cli(
        p,
        "--out",
        tmp_path / "out",
        env={**os.environ, "PYTHONPATH": str(contract.ROOT), "PLASMIENT_MAX_DECOMPRESSED_BYTES": str(8 << 20)},
    )
    assert "decompressed-size guard" in contract.refused(run, [p], tmp_path / "out")


@pytest.mark.parametrize("trailer", [b"\xff\xff\xff\xff", b"\x00\x00\x00\x80"])
def test_gzip_size_trailer_that_lies(tmp_path, trailer):
    # The gzip trailer claims 4 GiB: never pre-allocated (a counter log is read whole through read_maybe_gzip).
    n, data = seeds.seeds("nvml")[0]
    trace = write(tmp_path, KINETO[0], KINETO[1])
    log = write(tmp_path, n + ".gz", gzip.compress(data)[:-4] + trailer)
    check([trace, log], tmp_path, "either")


def test_symlink_loops_in_an_input_folder(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / KINETO[0]).write_bytes(KINETO[1])
    (d / "loop").symlink_to(d)
    (d / "sub").mkdir()
    (d / "sub" / "up").symlink_to(d)
    (d / "a").symlink_to(d / "b")
    (d / "b").symlink_to(d / "a")
    v = check([d], tmp_path, "ok")
    assert isinstance(v, dict) and len(v["clock"]["sources"]) == 1


def test_folder_of_only_a_symlink_loop(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "loop").symlink_to(d)
    msg = check([d], tmp_path, "bad")
    assert "holds no trace" in msg


def test_fifo_is_refused_not_read(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    fifo = d / "trace.json"
    os.mkfifo(fifo)
    msg = check([fifo], tmp_path, "bad")
    assert "not a regular file" in msg
    (d / KINETO[0]).write_bytes(KINETO[1])
    assert isinstance(check([d], tmp_path, "ok"), dict)  # in a folder, a FIFO is passed over


def test_device_file_is_refused(tmp_path):
    msg = check([Path("/dev/zero")], tmp_path, "bad")
    assert "not a regular file" in msg


def test_jax_xplane_is_named_in_its_refusal(tmp_path):
    # jax.profiler / TensorFlow write `<host>.xplane.pb` (a protobuf; TraceLens's JAX tests hold real ones): refused in
    # one line that says what it is and what to record instead, not as an unknown file.
    p = tmp_path / "host.xplane.pb"
    p.write_bytes(b"\n\x0f/device:GPU:0\x12\x04" + os.urandom(64))
    msg = check([p], tmp_path, "bad")
    assert "JAX / TensorFlow profiler XPlane" in msg and "nsys profile" in msg


def test_xla_trace_viewer_json_is_named_in_its_refusal(tmp_path):
    # The trace viewer's JSON of jax.profiler / TensorFlow: Chrome trace events like Kineto's, the device's work on
    # XLA's per-device processes ('/device:GPU:0', its streams and an 'XLA Ops' thread). It was refused as "a
    # CPU-only profile?"; it is named for what it is.
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "Stream #9(Compute)"}},
        {"ph": "M", "pid": 1, "tid": 10000, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]
    ops = [{"ph": "X", "pid": 1, "tid": 9, "name": "fusion.3", "ts": 10 + 5 * i, "dur": 4} for i in range(20)]
    p = tmp_path / "host.trace.json"
    p.write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": meta + ops}))
    msg = check([p], tmp_path, "bad")
    assert "JAX / TensorFlow (XLA) profiler trace (process '/device:GPU:0')" in msg and "nsys profile" in msg


def test_folder_with_no_traces(tmp_path):
    d = tmp_path / "in"
    (d / "deeper").mkdir(parents=True)
    (d / "README.md").write_text("nothing here")
    (d / "deeper" / "data.bin").write_bytes(os.urandom(256))
    msg = check([d], tmp_path, "bad")
    assert "holds no trace" in msg


def test_file_name_with_a_newline(tmp_path):
    doc = kineto_doc()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    p = write(tmp_path, "two\nlines.pt.trace.json", dump(doc))
    line = contract.refused(contract.cli("report", p, "--out", tmp_path / "out", in_process=True))
    assert "two\\nlines" in line


def test_output_folder_is_atomic_when_rendering_fails(tmp_path, monkeypatch):
    # A failure after the analysis (here: while writing verdict.json) leaves no output folder and no temporary one.
    from plasmient_report.render import verdict

    def boom(*a: Any, **k: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(verdict, "write", boom)
    p = write(tmp_path, KINETO[0], KINETO[1])
    r = CliRunner().invoke(main, ["report", str(p), "--out", str(tmp_path / "out"), "--no-html", "--no-trace"])
    assert r.exit_code != 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in"]


# --------------------------------------------------------------------------------------------- nsys SQLite


def nsys_copy(tmp: Path, edit: Callable[[sqlite3.Connection], None] | None = None, name: str = "run.sqlite") -> Path:
    p = write(tmp, name, seeds.seeds("nsys")[0][1])
    if edit is not None:
        con = sqlite3.connect(p)
        edit(con)
        con.commit()
        con.close()
    return p


def _drop(table: str) -> Callable[[sqlite3.Connection], None]:
    return lambda con: con.execute(f"DROP TABLE {table}")


def _drop_column(table: str, col: str) -> Callable[[sqlite3.Connection], None]:
    return lambda con: con.execute(f'ALTER TABLE {table} DROP COLUMN "{col}"')


def _sql(*stmts: str) -> Callable[[sqlite3.Connection], None]:
    def edit(con: sqlite3.Connection) -> None:
        for s in stmts:
            con.execute(s)

    return edit


NSYS_CASES: dict[str, tuple[Callable[[sqlite3.Connection], None], str]] = {
    "no_kernel_table": (_drop("CUPTI_ACTIVITY_KIND_KERNEL"), "either"),
    "no_kernels_or_copies": (
        _sql(
            "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL",
            "DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY",
            "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET",
        ),
        "bad",
    ),
    "no_string_ids": (_drop("StringIds"), "either"),
    "no_metadata": (_sql("DROP TABLE META_DATA_EXPORT", "DROP TABLE TARGET_INFO_SESSION_START_TIME"), "either"),
    "no_end_column": (_drop_column("CUPTI_ACTIVITY_KIND_KERNEL", "end"), "either"),
    "no_device_column": (_drop_column("CUPTI_ACTIVITY_KIND_KERNEL", "deviceId"), "either"),
    "no_nvtx_text": (_drop_column("NVTX_EVENTS", "text"), "ok"),
    "no_process_column": (_drop_column("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid"), "ok"),
    "text_in_integer_columns": (
        _sql("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon', gridX = x'ff00' WHERE rowid % 3 = 0"),
        "either",
    ),
    "int64_edge_times": (
        _sql(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 9223372036854775807 WHERE rowid = 1",
            'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = -9223372036854775808 WHERE rowid = 2',
        ),
        "ok",
    ),
    "end_before_start": (
        _sql('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = "end", "end" = start WHERE rowid % 4 = 0'),
        "either",
    ),
    "zero_length_kernels": (_sql('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start'), "either"),
    "absurd_ids": (
        _sql(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 9223372036854775807 WHERE rowid = 1",
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = -1, gridX = 4294967296 WHERE rowid < 9",
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET rowid = 4611686018427387904 "
            "WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME)",
        ),
        "ok",
    ),
    "session_start_overflow": (_sql("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 9223372036854775807"), "bad"),
    "session_start_text": (_sql("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'yesterday'"), "either"),
    "time_shift_overflow": (
        _sql("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PARAM_TIME_SHIFT', '-9223372036854775808')"),
        "bad",
    ),
    "absurd_rank_in_environment": (
        _sql("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=99999999999999')"),
        "ok",
    ),
    "invalid_utf8_names": (_sql("UPDATE StringIds SET value = x'6e63636cff' WHERE id % 2 = 0"), "ok"),
    "times_before_1970": (
        _sql(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = -(SELECT utcEpochNs FROM "
            'TARGET_INFO_SESSION_START_TIME) - 2000, "end" = -(SELECT utcEpochNs FROM '
            "TARGET_INFO_SESSION_START_TIME) - 1000 WHERE rowid IN (1, 2, 3)"
        ),
        "ok",
    ),
    "kernel_names_missing_from_string_ids": (
        _sql("DELETE FROM StringIds WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0)"),
        "ok",
    ),
    # a table replaced by an endlessly recursive view: tables are read, never views
    "recursive_view_for_a_table": (
        _sql(
            "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k_real",
            "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(n) AS "
            '(SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n AS start, n AS "end", '
            "0 AS deviceId FROM r",
            "CREATE VIEW CUPTI_ACTIVITY_KIND_RUNTIME_V9 AS WITH RECURSIVE r(n) AS "
            "(SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n AS start FROM r",
        ),
        "either",
    ),
}


# What the verdict must say of the rows it could not use (honest coverage, not a silent loss).
NSYS_NOTES = {
    "no_kernel_table": "no CUPTI_ACTIVITY_KIND_KERNEL table",
    "no_end_column": "with no start, end or device",
    "no_device_column": "with no start, end or device",
    "text_in_integer_columns": "with no start, end or device",  # not CAST('soon' AS INTEGER) = 0: util 1.0
    "int64_edge_times": "2 with impossible times",
    "end_before_start": "with an end before the start",
    "absurd_ids": "1 with a device id beyond int32",
    "no_metadata": "times are ns since capture start, not UTC",
    "no_process_column": "GPU activities of no known process",  # two processes: whose copies? not guessed
    "session_start_text": "times are ns since capture start, not UTC",
    "kernel_names_missing_from_string_ids": "kernels have no name in StringIds",
    "times_before_1970": "3 with impossible times",
    "recursive_view_for_a_table": "no CUPTI_ACTIVITY_KIND_KERNEL table",
}


@pytest.mark.parametrize("case", list(NSYS_CASES))
def test_hostile_nsys(case, tmp_path):
    edit, expect = NSYS_CASES[case]
    v = check([nsys_copy(tmp_path, edit)], tmp_path, expect)
    if case in NSYS_NOTES:
        assert isinstance(v, dict) and NSYS_NOTES[case] in (v["clock"]["sources"][0]["notes"] or "")


@pytest.mark.parametrize("how", ["zero_page", "garbage_page", "cut_at_page", "cut_mid_page", "header"])
def test_corrupt_sqlite_pages(tmp_path, how):
    data = bytearray(seeds.seeds("nsys")[0][1])
    page = int.from_bytes(data[16:18], "big")
    k = len(data) // page // 2
    if how == "zero_page":
        data[k * page : (k + 3) * page] = bytes(3 * page)
    elif how == "garbage_page":
        data[k * page : (k + 1) * page] = bytes((i * 7919) % 251 for i in range(page))
    elif how == "cut_at_page":
        del data[k * page :]
    elif how == "cut_mid_page":
        del data[k * page + page // 3 :]
    else:
        data[16:20] = b"\x00\x03\x07\x07"  # a page size that is not a power of two
    check([write(tmp_path, "run.sqlite", bytes(data))], tmp_path, "either")


# ------------------------------------------------------------- nsys SQLite read as SQLite reads it (issue 15)


def _sqlite_kernels(db: Path) -> int:
    """Independent truth: what SQLite itself sees (a private copy, so recovery writes nowhere near the input)."""
    ((n,),) = sqlite3.connect(db).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    return int(n)


def _kernels_and_copies(v: dict[str, Any]) -> int:
    return int(v["coverage"]["kernels"])


def _seed_db(tmp: Path, name: str) -> Path:
    p = tmp / name
    p.write_bytes(seeds.seeds("nsys")[0][1])
    return p


def _copy_with_side_files(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-journal"):
        if Path(str(src) + suffix).exists():
            shutil.copyfile(str(src) + suffix, dest_dir / (src.name + suffix))
    return dest_dir / src.name


def test_wal_export_committed_frames_are_read(tmp_path):
    """A WAL-mode export whose last committed transaction is still in its `-wal` file: the tool reads what SQLite
    reads (here: half the kernels deleted), and the input and its -wal stay as they were."""
    work = _seed_db(tmp_path, "w.sqlite")
    con = sqlite3.connect(work)
    assert con.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    con.execute("PRAGMA wal_autocheckpoint = 0")
    before = _sqlite_kernels(work)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0")
    con.commit()
    # copy while the writer holds the WAL unmerged: the state a crashed (or still open) writer leaves
    inp = _copy_with_side_files(work, tmp_path / "in")
    con.close()
    assert Path(str(inp) + "-wal").stat().st_size > 0
    truth = _sqlite_kernels(_copy_with_side_files(inp, tmp_path / "truth"))
    assert truth < before
    v = check([inp], tmp_path, "ok")
    assert isinstance(v, dict)
    row = (
        sqlite3.connect(str(tmp_path / "truth" / inp.name)).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    )
    memcpy = int(row[0]) if row else 0
    memset = int(
        sqlite3.connect(str(tmp_path / "truth" / inp.name))
        .execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET")
        .fetchone()[0]
    )
    assert _kernels_and_copies(v) == truth + memcpy + memset
    assert "-wal" in v["clock"]["sources"][0]["notes"]


def test_hot_journal_is_rolled_back_on_a_copy(tmp_path):
    """A rollback-journal export left by a writer that died mid-transaction (database pages already overwritten,
    the hot `-journal` holding the originals): SQLite rolls it back, and so does the tool — on a copy."""
    work = _seed_db(tmp_path, "j.sqlite")
    before = _sqlite_kernels(work)
    con = sqlite3.connect(work, isolation_level=None)
    con.execute("PRAGMA journal_mode = DELETE")
    con.execute("PRAGMA cache_size = 1")  # spill dirty pages into the database file before the commit
    con.execute("BEGIN")
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("DELETE FROM StringIds")
    inp = _copy_with_side_files(work, tmp_path / "in")  # the crash: database and journal as they are now
    con.execute("ROLLBACK")
    con.close()
    assert Path(str(inp) + "-journal").stat().st_size > 0
    assert _sqlite_kernels(_copy_with_side_files(inp, tmp_path / "truth")) == before  # SQLite's own answer
    v = check([inp], tmp_path, "ok")
    assert isinstance(v, dict)
    assert "hot -journal" in v["clock"]["sources"][0]["notes"]
    memcpy = int(
        sqlite3.connect(str(tmp_path / "truth" / inp.name))
        .execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
        .fetchone()[0]
    )
    memset = int(
        sqlite3.connect(str(tmp_path / "truth" / inp.name))
        .execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET")
        .fetchone()[0]
    )
    assert _kernels_and_copies(v) == before + memcpy + memset


def test_another_process_exclusive_lock_is_respected(tmp_path):
    """A writer in another process holds an exclusive lock: one line saying so (never a read of pages being
    rewritten, never a wait without end)."""
    inp = write(tmp_path, "locked.sqlite", seeds.seeds("nsys")[0][1])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA journal_mode = DELETE'); c.execute('BEGIN EXCLUSIVE')\n"
            "c.execute('DELETE FROM StringIds')\n"
            "print('locked', flush=True); time.sleep(120)\n",
            str(inp),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        line = check([inp], tmp_path, "bad")
        assert "locked by another process" in line
    finally:
        holder.kill()
        holder.wait()
    # once the writer is gone (its journal is then hot), the database reads as before the writer began
    v = check([inp], tmp_path, "ok")
    assert isinstance(v, dict) and v["coverage"]["kernels"] > 0


def test_parquetdir_with_a_fifo_as_a_table_is_refused_not_read(tmp_path):
    src = Path(__file__).resolve().parent.parent / "sample_traces" / "h200x2_ddp" / "nsys" / "nsys_ddp_pqtdir"
    d = tmp_path / "in" / "run_pqtdir"
    shutil.copytree(src, d)
    (d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
    os.mkfifo(d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    line = check([d], tmp_path, "bad")
    assert "not a regular file" in line


def test_sparse_gpu_metrics_rowids_do_not_hang(tmp_path):
    # GPU_METRICS is read in rowid ranges: a row moved to rowid 2**62 must not make 4.6e12 ranges.
    def edit(con: sqlite3.Connection) -> None:
        con.execute(
            "CREATE TABLE IF NOT EXISTS TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, "
            "typeName TEXT, metricId INTEGER, metricName TEXT)"
        )
        con.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (0, 0, 'gpu', 1, 'SMs Active [Throughput %]')")
        con.execute("CREATE TABLE IF NOT EXISTS GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER)")
        ((t0,),) = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        con.executemany(
            "INSERT INTO GPU_METRICS (rowid, timestamp, typeId, metricId, value) VALUES (?, ?, 0, 1, 50)",
            [(1, t0), (2, t0 + 10**6), (2**62, t0 + 2 * 10**6)],
        )

    check([nsys_copy(tmp_path, edit)], tmp_path, "ok")


def test_nsys_rank_missing_from_the_environment_is_reported(tmp_path):
    edit = _sql(
        "DELETE FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%'",
        "INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=0')",
        "INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'WORLD_SIZE=4')",
        # one GPU process: the other rank's kernels are not in this export
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid <> (SELECT min(globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
        "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE globalPid <> (SELECT min(globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
        "DELETE FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE globalPid <> (SELECT min(globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
    )
    v = check([nsys_copy(tmp_path, edit)], tmp_path, "ok")
    assert isinstance(v, dict)
    assert v["coverage"]["world_size"] == 4 and v["coverage"]["missing_ranks"] == [1, 2, 3]


def test_nsys_says_events_were_lost(tmp_path):
    edit = _sql(
        "INSERT INTO DIAGNOSTIC_EVENT (timestamp, timestampType, source, severity, text, globalPid) VALUES "
        "(5, 2, 3, 2, 'Not all CUDA events might have been collected.', 0)",
        "INSERT INTO DIAGNOSTIC_EVENT (timestamp, timestampType, source, severity, text, globalPid) VALUES "
        "(6, 1, 1, 2, '1234 CUPTI records were dropped: the buffer is full', 0)",
    )
    v = check([nsys_copy(tmp_path, edit)], tmp_path, "ok")
    assert isinstance(v, dict)
    assert v["coverage"]["dropped_events"] == 1234
    assert "Not all CUDA events" in v["coverage"]["incomplete_sources"][0]["what"]


# ---------------------------------------------------------------------------------- counter logs, ncu, time


COUNTER_CASES: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "nvml_nan_and_huge": ("nvml", lambda b: b.replace(b",", b",NaN,", 3).replace(b"\n17", b"\n99999999999999999999", 2)),
    "nvml_int64_edge_wall_ns": ("nvml", lambda b: b.replace(b"\n17", b"\n9223372036854775807", 5)),
    "nvml_negative_wall_ns": ("nvml", lambda b: b.replace(b"\n17", b"\n-17", 5)),
    "smi_dmon_impossible_dates": ("smi_dmon", lambda b: b.replace(b"2026", b"9999").replace(b":", b"9", 4)),
    "smi_query_bad_utf8": ("smi_query", lambda b: b.replace(b"NVIDIA", b"NV\xff\xfeIA")),
    "dcgmi_epoch_overflow": ("dcgmi", lambda b: b"99999999999999999999 " + b.replace(b"\n", b"\n9999999999999999999 ")),
    "dcgmi_huge_entity_id": ("dcgmi", lambda b: b.replace(b"GPU 0", b"GPU 99999999999999999999")),
    "exporter_infinite_time": ("exporter", lambda b: b.replace(b"[", b'[[1e999, "1"], [', 1) if b[:1] == b"{" else b),
    "ncu_truncated_quote": ("ncu", lambda b: b[: len(b) // 2] + b'"unterminated'),
}


@pytest.mark.parametrize("case", list(COUNTER_CASES))
def test_hostile_counter_logs_and_ncu(case, tmp_path):
    family, mutate = COUNTER_CASES[case]
    trace_name, trace = seeds.companion_trace()
    for i, (name, data) in enumerate(seeds.seeds(family)):
        work = tmp_path / f"s{i}"
        work.mkdir()
        check([write(work, trace_name, trace), write(work, name, mutate(data))], work, "either")


def test_implausible_counter_values_are_left_out_and_counted(tmp_path):
    """nvidia-smi dmon `sm` 250% and 1e23 are no utilization: left out and said, never passed on as 2.5."""
    from plasmient_report import parsers, store
    from plasmient_report.parsers import Detected, ParseOptions

    src = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_single" / "nvidia_smi_dmon.txt"
    lines = src.read_text().splitlines()
    head = [ln for ln in lines if ln.startswith("#")][:2]
    names = head[0].lstrip("#").split()
    sm = names.index("sm")
    rows = [ln for ln in lines if not ln.startswith("#") and ln.strip()]
    edited = []
    for i, ln in enumerate(rows):
        parts = ln.split()
        if i in (1, 3):
            parts[sm] = "250" if i == 1 else "1e23"
        edited.append("  ".join(parts))
    p = write(tmp_path, "nvidia_smi_dmon.txt", ("\n".join(head + edited) + "\n").encode())
    con = store.connect()
    info = parsers.ingest_one(Detected(p, parsers.detect(p)), con, 0, ParseOptions(tz="UTC"))
    ((hi,),) = con.execute("SELECT max(value) FROM counters WHERE metric = 'gpu_util'").fetchall()
    assert hi <= 1.0
    assert any("2 of gpu_util" in n for n in info.notes), info.notes
    n_util = con.execute("SELECT count(*) FROM counters WHERE metric = 'gpu_util'").fetchone()[0]
    assert n_util == len(rows) - 2


def test_a_stray_kernel_years_away_with_a_counter_log_does_not_hang(tmp_path):
    # One kernel 12 years after the others stretches the trace's window: counter-log alignment must stay bounded
    # (its correlation grid once grew with the window: days → hours of work, decades → TiB of memory).
    # The real CLI with every output, in a subprocess.
    trace_name, trace = seeds.companion_trace()
    doc = json.loads(trace)
    kernels_of(doc)[-1]["ts"] += 4e14
    n, log = seeds.seeds("nvml")[0]
    t = write(tmp_path, trace_name, dump(doc))
    c = write(tmp_path, n, log)
    # a hang is the subprocess's time limit running out (no timing asserted)
    contract.check_cli(t, c, "--out", tmp_path / "out", "--json", inputs=[t, c], out=tmp_path / "out", timeout=300)


def test_inputs_are_never_written_even_read_only_folder(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / KINETO[0]).write_bytes(KINETO[1])
    shutil.copy(d / KINETO[0], tmp_path / "copy.json")
    os.chmod(d, 0o555)
    try:
        check([d / KINETO[0]], tmp_path, "ok")
    finally:
        os.chmod(d, 0o755)
