"""Mutators: each takes the bytes of a real file and a random generator and returns hostile bytes.

Three kinds, one list per parser family (MUTATORS):
- bytes: truncation at structural boundaries and anywhere, bit flips, interesting bytes, invalid UTF-8, gzip;
- JSON (Kineto, Prometheus JSON), on the decoded document: keys dropped / duplicated / reordered, wrong types,
  huge / negative / int64-overflowing numbers, NaN and Infinity, deep nesting, zero-length events, events out of
  order or ending before they start, unknown categories and phases, broken head keys (rank, world size, time base);
- SQLite (nsys): tables or columns dropped and renamed, wrong types, absurd ids and times, rows deleted or
  duplicated, metadata changed, pages corrupted or cut;
- text (counter logs, Nsight Compute CSV): lines dropped / repeated / swapped, numbers replaced by huge, negative,
  NaN, overflowing ones, timestamps made impossible, headers changed, columns removed.
A mutation program is a short list of (mutator name, seed): `apply(family, data, program)` is deterministic.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Mutator = Callable[[bytes, random.Random], bytes]

INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\x80", b"\xe2\x82")
INTERESTING_NUMBERS = (
    "0",
    "-0",
    "-1",
    "1e308",
    "-1e308",
    "1e-320",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "99999999999999999999999",
    "4294967295",
    "2147483648",
    "1e20",
    "9.2e15",
    "NaN",
    "Infinity",
    "-Infinity",
    "1.7976931348623157e309",
)
INTERESTING_VALUES: tuple[Any, ...] = (
    0,
    -1,
    1,
    2**31,
    2**32 - 1,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    1e-320,
    9.2e15,
    1.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "abc",
    "0",
    "1e999",
    "NaN",
    None,
    True,
    False,
    [],
    {},
    [1, 2],
    {"a": 1},
    "\u0000",
    "\ud7ff\ue000",
    "x" * 5000,
)


# ------------------------------------------------------------------------------------------------ bytes


def truncate_structural(data: bytes, rng: random.Random) -> bytes:
    """Cut right before or after a structural byte (JSON punctuation, a line end, a CSV separator)."""
    marks = [m.start() for m in re.finditer(rb'[{}\[\],:"\n\t ]', data[:2_000_000])]
    if not marks:
        return data[: rng.randrange(len(data) + 1)]
    i = rng.choice(marks)
    return data[: i + rng.choice((0, 1))]


def truncate_anywhere(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def bit_flips(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def interesting_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    for _ in range(rng.choice((1, 2, 8))):
        b[rng.randrange(len(b))] = rng.choice(b'\x00\xff\x80\x7f"\\\n\r{}[],:0-9e')
    return bytes(b)


def invalid_utf8(data: bytes, rng: random.Random) -> bytes:
    """Invalid UTF-8 inside a string value where there is one, else anywhere."""
    quotes = [m.start() for m in re.finditer(rb'"[A-Za-z]', data[:2_000_000])]
    i = rng.choice(quotes) + 1 if quotes and rng.random() < 0.8 else rng.randrange(len(data) + 1)
    return data[:i] + rng.choice(INVALID_UTF8) + data[i:]


def delete_chunk(data: bytes, rng: random.Random) -> bytes:
    if len(data) < 2:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randrange(1, min(4096, len(data) - i) + 1) :]


def duplicate_chunk(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randrange(1, 512))
    k = rng.randrange(len(data) + 1)
    return data[:k] + data[i:j] + data[k:]


def gzip_wrap(data: bytes, rng: random.Random) -> bytes:
    """Gzip it: intact, cut short, with a corrupt body or with a lying size trailer."""
    gz = gzip.compress(data, compresslevel=1)
    how = rng.randrange(4)
    if how == 1:
        return gz[: rng.randrange(10, max(11, len(gz)))]
    if how == 2 and len(gz) > 40:
        b = bytearray(gz)
        for _ in range(4):
            b[rng.randrange(10, len(b) - 8)] ^= 0xFF
        return bytes(b)
    if how == 3:
        return gz[:-4] + rng.choice((b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x00\x00\x00\x80"))
    return gz


BYTE_MUTATORS: dict[str, Mutator] = {
    "truncate_structural": truncate_structural,
    "truncate_anywhere": truncate_anywhere,
    "bit_flips": bit_flips,
    "interesting_bytes": interesting_bytes,
    "invalid_utf8": invalid_utf8,
    "delete_chunk": delete_chunk,
    "duplicate_chunk": duplicate_chunk,
}


# ------------------------------------------------------------------------------------------------ JSON


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


def _events(doc: Any) -> list[Any]:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    if isinstance(doc, list):
        return doc
    return []


def _json_mutator(fn: Callable[[Any, random.Random], Any]) -> Mutator:
    def run(data: bytes, rng: random.Random) -> bytes:
        try:
            doc = json.loads(data)
            return _dumps(fn(doc, rng))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return bit_flips(data, rng)  # already broken (or too deep to decode here): keep breaking it

    run.__name__ = fn.__name__
    return run


def _pick_event(doc: Any, rng: random.Random, want: Callable[[Any], bool] | None = None) -> dict[str, Any] | None:
    ev = [e for e in _events(doc) if isinstance(e, dict) and (want is None or want(e))]
    return rng.choice(ev) if ev else None


def _gpu(e: Any) -> bool:
    return e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")


def _some_events(doc: Any, rng: random.Random) -> list[dict[str, Any]]:
    ev = [e for e in _events(doc) if isinstance(e, dict)]
    if not ev:
        return []
    if rng.random() < 0.15:
        return ev  # all of them
    k = rng.choice((1, 1, 2, 5, 20))
    gpu = [e for e in ev if _gpu(e)]
    pool = gpu if gpu and rng.random() < 0.6 else ev
    return rng.sample(pool, min(k, len(pool)))


def drop_key(doc: Any, rng: random.Random) -> Any:
    if isinstance(doc, dict) and rng.random() < 0.25:
        keys = [k for k in doc if k != "traceEvents" or rng.random() < 0.1]
        if keys:
            del doc[rng.choice(keys)]
        return doc
    key = rng.choice(("ts", "dur", "ph", "cat", "name", "pid", "tid", "args"))
    for e in _some_events(doc, rng):
        e.pop(key, None)
        if isinstance(e.get("args"), dict) and e["args"]:
            e["args"].pop(rng.choice(list(e["args"])), None)
    return doc


def wrong_type(doc: Any, rng: random.Random) -> Any:
    if isinstance(doc, dict) and rng.random() < 0.3:
        key = rng.choice(
            ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceEvents", "displayTimeUnit")
        )
        doc[key] = rng.choice(INTERESTING_VALUES)
        return doc
    for e in _some_events(doc, rng):
        key = rng.choice(("ts", "dur", "ph", "cat", "name", "pid", "tid", "args"))
        e[key] = rng.choice(INTERESTING_VALUES)
        if isinstance(e.get("args"), dict) and e["args"] and rng.random() < 0.5:
            e["args"][rng.choice(list(e["args"]))] = rng.choice(INTERESTING_VALUES)
    return doc


def huge_numbers(doc: Any, rng: random.Random) -> Any:
    nums = [v for v in INTERESTING_VALUES if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for e in _some_events(doc, rng):
        for key in rng.sample(("ts", "dur", "pid", "tid"), rng.randrange(1, 3)):
            e[key] = rng.choice(nums)
        args = e.get("args")
        if isinstance(args, dict):
            for k in (
                "External id",
                "correlation",
                "device",
                "stream",
                "bytes",
                "flops",
                "registers per thread",
                "In msg nelems",
                "Group size",
            ):
                if k in args and rng.random() < 0.5:
                    args[k] = rng.choice(nums)
            if "grid" in args and rng.random() < 0.5:
                args["grid"] = [rng.choice(nums) for _ in range(3)]
            if "Input Dims" in args and rng.random() < 0.5:
                args["Input Dims"] = [[rng.choice(nums), rng.choice(nums)], [rng.choice(nums)]]
    return doc


def nan_infinity(doc: Any, rng: random.Random) -> Any:
    for e in _some_events(doc, rng):
        e[rng.choice(("ts", "dur"))] = rng.choice((float("nan"), float("inf"), float("-inf")))
        if isinstance(e.get("args"), dict) and rng.random() < 0.3:
            e["args"]["flops"] = float("nan")
    if isinstance(doc, dict) and rng.random() < 0.2:
        doc["baseTimeNanoseconds"] = rng.choice((float("nan"), float("inf")))
    return doc


def times_broken(doc: Any, rng: random.Random) -> Any:
    """Zero-length events, end before start, events out of order, negative and overlapping times."""
    how = rng.randrange(5)
    ev = _some_events(doc, rng)
    if how == 0:
        for e in ev:
            e["dur"] = 0
    elif how == 1:
        for e in ev:
            e["dur"] = -abs(e.get("dur", 1) if isinstance(e.get("dur"), (int, float)) else 1) - 1
    elif how == 2:
        lst = _events(doc)
        rng.shuffle(lst)
    elif how == 3:
        times = [e.get("ts") for e in ev]
        rng.shuffle(times)
        for e, t in zip(ev, times, strict=True):
            e["ts"] = t
    else:
        for e in ev:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = -e["ts"] if rng.random() < 0.5 else e["ts"] * rng.choice((0, 1000, 1e-6))
    return doc


def unknown_categories(doc: Any, rng: random.Random) -> Any:
    for e in _some_events(doc, rng):
        if rng.random() < 0.5:
            e["cat"] = rng.choice(
                (
                    "kernel",
                    "gpu_memcpy",
                    "cpu_op",
                    "banana",
                    "",
                    "KERNEL",
                    "cuda_sync",
                    "gpu_user_annotation",
                    "user_annotation",
                    "Trace",
                    "overhead",
                    "ac2g",
                )
            )
        else:
            e["ph"] = rng.choice(("X", "B", "E", "i", "s", "f", "M", "C", "Z", "", "XX"))
    return doc


def duplicate_events(doc: Any, rng: random.Random) -> Any:
    lst = _events(doc)
    if lst:
        how = rng.randrange(3)
        if how == 0:
            lst.extend(json.loads(json.dumps(rng.sample(lst, min(len(lst), rng.choice((1, 10, 100)))))))
        elif how == 1:
            keep = (
                [e for e in lst if not (isinstance(e, dict) and _gpu(e))]
                if rng.random() < 0.3
                else rng.sample(lst, len(lst) // 2)
            )
            lst[:] = keep
        else:
            lst[:] = lst[: rng.randrange(len(lst) + 1)]
    return doc


def _deep_nesting_text(data: bytes, rng: random.Random) -> bytes:
    """Arrays / objects nested thousands deep, at the top level, in an event's args, or as an event (built as
    text: no recursive encoder involved)."""
    depth = rng.choice((64, 600, 5000, 100_000))
    opener, closer = (b"[", b"]") if rng.random() < 0.5 else (b'{"a": ', b"}")
    deep = opener * depth + b"1" + closer * depth
    where = rng.randrange(3)
    if where == 0 and data.lstrip().startswith(b"{"):
        i = data.index(b"{") + 1
        return data[:i] + b'"deep": ' + deep + b", " + data[i:]
    hits = [m.end() for m in re.finditer(rb'"args": \{', data[:2_000_000])]
    if where == 1 and hits:
        i = rng.choice(hits)
        return data[:i] + b'"Input Dims": ' + deep + b", " + data[i:]
    m = re.search(rb'"traceEvents": \[', data)
    if m:
        return data[: m.end()] + deep + b", " + data[m.end() :]
    return deep + data


def head_keys(doc: Any, rng: random.Random) -> Any:
    """distributedInfo (rank, world size, process groups), deviceProperties and the time base, made odd."""
    if not isinstance(doc, dict):
        return doc
    how = rng.randrange(4)
    if how == 0:
        di = doc.setdefault("distributedInfo", {})
        if isinstance(di, dict):
            di[rng.choice(("rank", "world_size"))] = rng.choice((0, 1, 7, 8, -1, 2**31, 2**63, "3", None, 1.5))
    elif how == 1:
        di = doc.setdefault("distributedInfo", {})
        if isinstance(di, dict):
            di["pg_config"] = rng.choice(([{"pg_name": 0, "ranks": [0, 1, 2**40]}], [None], "x", [{"ranks": "x"}]))
    elif how == 2:
        props = doc.get("deviceProperties")
        if isinstance(props, list) and props and isinstance(props[0], dict):
            props[0][rng.choice(("id", "name", "numSms", "totalGlobalMem", "computeMajor"))] = rng.choice(INTERESTING_VALUES)
        else:
            doc["deviceProperties"] = [{"id": rng.choice((0, -1, 2**40)), "name": rng.choice(("", "NVIDIA H100", "x"))}]
    else:
        doc["baseTimeNanoseconds"] = rng.choice((0, -1, 2**63 - 1, 2**63, -(2**62), 10**18, "1790857026000000000", 1.79e18, None))
    return doc


def reorder_keys(doc: Any, rng: random.Random) -> Any:
    """Key order is not meaning: traceEvents first or last, event keys shuffled."""

    def shuffled(d: dict[str, Any]) -> dict[str, Any]:
        items = list(d.items())
        rng.shuffle(items)
        return dict(items)

    if isinstance(doc, dict):
        doc = shuffled(doc)
    lst = _events(doc)
    for i, e in enumerate(lst):
        if isinstance(e, dict):
            lst[i] = shuffled(e)
    return doc


def _dup_key_text(data: bytes, rng: random.Random) -> bytes:
    """A key given twice in one object (JSON allows it; the last wins in most decoders)."""
    hits = [m for m in re.finditer(rb'"(ts|dur|ph|cat|name|pid|tid|traceEvents|args|baseTimeNanoseconds)": ', data)]
    if not hits:
        return data
    m = rng.choice(hits)
    val = rng.choice((b'"x"', b"-1", b"1e400", b"null", b"[]", b"{}", b"0", b"9223372036854775808"))
    return data[: m.start()] + m.group(0) + val + b", " + data[m.start() :]


JSON_MUTATORS: dict[str, Mutator] = {
    "drop_key": _json_mutator(drop_key),
    "wrong_type": _json_mutator(wrong_type),
    "huge_numbers": _json_mutator(huge_numbers),
    "nan_infinity": _json_mutator(nan_infinity),
    "times_broken": _json_mutator(times_broken),
    "unknown_categories": _json_mutator(unknown_categories),
    "duplicate_events": _json_mutator(duplicate_events),
    "deep_nesting": _deep_nesting_text,
    "head_keys": _json_mutator(head_keys),
    "reorder_keys": _json_mutator(reorder_keys),
    "dup_key": _dup_key_text,
}


# ------------------------------------------------------------------------------------------------ SQLite

NSYS_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "NVTX_EVENTS",
    "StringIds",
    "META_DATA_EXPORT",
    "META_DATA_CAPTURE",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_DEVICE",
    "TARGET_INFO_SESSION_START_TIME",
    "TARGET_INFO_SYSTEM_ENV",
    "GPU_METRICS",
    "TARGET_INFO_GPU_METRICS",
    "ENUM_CUDA_MEMCPY_OPER",
    "ENUM_CUDA_MEM_KIND",
    "DIAGNOSTIC_EVENT",
    "ANALYSIS_DETAILS",
)
SQL_VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    1,
    2**31,
    2**32 - 1,
    2**62,
    2**63 - 1,
    -(2**63),
    1.5,
    -1e300,
    1e300,
    float("nan"),
    "abc",
    "",
    "1e400",
    b"\xff\x00\xfe",
    "\u00e9\u0000",
)


def _sqlite_mutator(fn: Callable[[sqlite3.Connection, random.Random], None]) -> Mutator:
    def run(data: bytes, rng: random.Random) -> bytes:
        tmp = Path(tempfile.mkdtemp(prefix="plasmient-fuzz-"))
        try:
            db = tmp / "m.sqlite"
            db.write_bytes(data)
            try:
                con = sqlite3.connect(db)
                fn(con, rng)
                con.commit()
                con.close()
            except sqlite3.Error:
                return bit_flips(data, rng)  # not a database any more: keep breaking it
            return db.read_bytes()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    run.__name__ = fn.__name__
    return run


def _tables(con: sqlite3.Connection, rng: random.Random) -> str | None:
    names = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    pick = [t for t in NSYS_TABLES if t in names]
    if not pick or rng.random() < 0.1:
        pick = sorted(names)
    return rng.choice(pick) if pick else None


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def sql_drop_table(con: sqlite3.Connection, rng: random.Random) -> None:
    t = _tables(con, rng)
    if t:
        con.execute(f'DROP TABLE "{t}"')


def sql_drop_column(con: sqlite3.Connection, rng: random.Random) -> None:
    t = _tables(con, rng)
    if t:
        cols = _columns(con, t)
        if len(cols) > 1:
            c = rng.choice(cols)
            if rng.random() < 0.5:
                con.execute(f'ALTER TABLE "{t}" DROP COLUMN "{c}"')
            else:
                con.execute(f'ALTER TABLE "{t}" RENAME COLUMN "{c}" TO "{c}_x"')


def sql_wrong_values(con: sqlite3.Connection, rng: random.Random) -> None:
    t = _tables(con, rng)
    if not t:
        return
    cols = _columns(con, t)
    for c in rng.sample(cols, min(len(cols), rng.choice((1, 1, 2, 3)))):
        v = rng.choice(SQL_VALUES)
        if isinstance(v, float) and v != v:
            v = None  # sqlite3 stores NaN as NULL anyway
        where = rng.choice(("", "WHERE rowid % 7 = 0", 'WHERE rowid = (SELECT min(rowid) FROM "{t}")'))
        con.execute(f'UPDATE "{t}" SET "{c}" = ? {where.format(t=t)}', [v])


def sql_times(con: sqlite3.Connection, rng: random.Random) -> None:
    """End before start, zero-length, out of order, negative and int64-edge times."""
    t = rng.choice(
        ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY", "GPU_METRICS")
    )
    cols = set(_columns(con, t)) if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", [t]).fetchall() else set()
    if not cols:
        return
    how = rng.randrange(5)
    where = rng.choice(("", "WHERE rowid % 5 = 0", 'WHERE rowid = (SELECT max(rowid) FROM "{t}")')).format(t=t)
    if "start" in cols and how == 0:
        con.execute(f'UPDATE "{t}" SET start = "end", "end" = start {where}')
    elif "start" in cols and how == 1:
        con.execute(f'UPDATE "{t}" SET "end" = start {where}')
    elif "start" in cols and how == 2:
        con.execute(f'UPDATE "{t}" SET start = -start {where}')
    elif how == 3:
        col = "start" if "start" in cols else "timestamp" if "timestamp" in cols else None
        if col:
            con.execute(f'UPDATE "{t}" SET "{col}" = ? {where}', [rng.choice((2**63 - 1, -(2**63), 2**62, 10**18))])
    else:
        col = "end" if "end" in cols else "timestamp" if "timestamp" in cols else None
        if col:
            con.execute(f'UPDATE "{t}" SET "{col}" = NULL {where}')


def sql_rows(con: sqlite3.Connection, rng: random.Random) -> None:
    """Rows deleted, duplicated, or moved to absurd rowids."""
    t = _tables(con, rng)
    if not t:
        return
    how = rng.randrange(4)
    if how == 0:
        con.execute(f'DELETE FROM "{t}" WHERE rowid % ? = 0', [rng.choice((1, 2, 3))])
    elif how == 1:
        con.execute(f'INSERT INTO "{t}" SELECT * FROM "{t}" LIMIT 200')
    elif how == 2:
        con.execute(
            f'UPDATE "{t}" SET rowid = ? WHERE rowid = (SELECT max(rowid) FROM "{t}")',
            [rng.choice((2**62, 2**63 - 1, -(2**63) + 1, 10**12))],
        )
    else:
        con.execute(f'DELETE FROM "{t}"')


def sql_metadata(con: sqlite3.Connection, rng: random.Random) -> None:
    """The export's own description: time normalisation and shift, session start, ranks in the environment."""
    how = rng.randrange(4)
    try:
        if how == 0:
            con.execute(
                "UPDATE META_DATA_EXPORT SET value = ? WHERE name = ?",
                [rng.choice(("true", "false", "1", "yes", "garbage", "")), "EXPORT_PARAM_TIME_NORMALIZE"],
            )
            con.execute(
                "INSERT INTO META_DATA_EXPORT (name, value) VALUES ('EXPORT_PARAM_TIME_SHIFT', ?)",
                [str(rng.choice((0, -1, 2**63 - 1, -(2**63), 10**30, "x")))],
            )
        elif how == 1:
            con.execute(
                "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = ?",
                [rng.choice((None, 0, -1, 2**63 - 1, -(2**63), 2**62, "abc", 1.5))],
            )
        elif how == 2:
            con.execute(
                "UPDATE TARGET_INFO_SESSION_START_TIME SET utcTime = ?",
                [rng.choice(("", "garbage", "9999-99-99T99:99:99", "0001-01-01T00:00:00", None))],
            )
        else:
            v = rng.choice(
                (
                    "RANK=-5",
                    "RANK=99999999999999999999",
                    "RANK=abc",
                    "WORLD_SIZE=0",
                    "WORLD_SIZE=-3",
                    "WORLD_SIZE=100000000000000",
                    "LOCAL_RANK=1",
                    "RANK=1",
                )
            )
            con.execute(
                "INSERT INTO META_DATA_CAPTURE (name, value) VALUES (?, ?)",
                [
                    rng.choice(
                        ("PROCESS_0:ENVIRONMENT_VARIABLE", "PROCESS_1:ENVIRONMENT_VARIABLE", "PROCESS_0:PID", "PROCESS_1:PID")
                    ),
                    v,
                ],
            )
    except sqlite3.Error:
        return  # this copy has no writable META_DATA_CAPTURE: the mutation is a no-op


def sql_strings(con: sqlite3.Connection, rng: random.Random) -> None:
    """StringIds made odd: names deleted, invalid UTF-8, empty, huge."""
    how = rng.randrange(3)
    if how == 0:
        con.execute("DELETE FROM StringIds WHERE id % ? = 0", [rng.choice((1, 2, 5))])
    elif how == 1:
        con.execute(
            "UPDATE StringIds SET value = ? WHERE id % 3 = 0",
            [rng.choice((b"\xff\xfe", "", "x" * 100_000, None, "nccl\u0000AllReduce", 12))],
        )
    else:
        con.execute("UPDATE StringIds SET id = id + ? WHERE id % 2 = 0", [rng.choice((1, 2**40, -(2**40)))])


SQLITE_MUTATORS: dict[str, Mutator] = {
    "sql_drop_table": _sqlite_mutator(sql_drop_table),
    "sql_drop_column": _sqlite_mutator(sql_drop_column),
    "sql_wrong_values": _sqlite_mutator(sql_wrong_values),
    "sql_times": _sqlite_mutator(sql_times),
    "sql_rows": _sqlite_mutator(sql_rows),
    "sql_metadata": _sqlite_mutator(sql_metadata),
    "sql_strings": _sqlite_mutator(sql_strings),
}


def _page_size(data: bytes) -> int:
    if len(data) >= 18 and data.startswith(b"SQLite format 3\x00"):
        ps = int.from_bytes(data[16:18], "big")
        return 65536 if ps == 1 else ps or 4096
    return 4096


def corrupt_pages(data: bytes, rng: random.Random) -> bytes:
    """Pages of the database file overwritten, zeroed, or the file cut at a page boundary."""
    ps = _page_size(data)
    n = max(1, len(data) // ps)
    b = bytearray(data)
    how = rng.randrange(4)
    if how == 0:
        return data[: ps * rng.randrange(1, n + 1)]
    for _ in range(rng.choice((1, 2, 5))):
        p = rng.randrange(0 if rng.random() < 0.1 else min(1, n - 1), n)
        lo = p * ps + (100 if p == 0 and rng.random() < 0.7 else 0)
        hi = min(len(b), (p + 1) * ps)
        if hi <= lo:
            continue
        if how == 1:
            b[lo:hi] = bytes(hi - lo)
        elif how == 2:
            for _ in range(8):
                b[rng.randrange(lo, hi)] = rng.randrange(256)
        else:
            b[lo:hi] = bytes(rng.randrange(256) for _ in range(hi - lo))
    return bytes(b)


def corrupt_header(data: bytes, rng: random.Random) -> bytes:
    """The 100-byte database header: page size, page count, schema cookie, encoding."""
    b = bytearray(data)
    if len(b) < 100:
        return data
    field = rng.choice(((16, 2), (28, 4), (40, 4), (56, 4), (18, 2), (44, 4)))
    b[field[0] : field[0] + field[1]] = bytes(rng.randrange(256) for _ in range(field[1]))
    return bytes(b)


# ------------------------------------------------------------------------------------------------ text

_NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_TIME_RE = re.compile(rb"\d{4}[/-]?\d{2}[/-]?\d{2}|\d{2}:\d{2}:\d{2}(?:\.\d+)?")


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def drop_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    for _ in range(rng.choice((1, 1, 3, 10))):
        if ls:
            del ls[rng.randrange(len(ls))]
    return b"\n".join(ls)


def repeat_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    if ls:
        i = rng.randrange(min(len(ls), 4) if rng.random() < 0.5 else len(ls))  # headers are near the top
        ls[i:i] = [ls[i]] * rng.choice((1, 2, 50))
    return b"\n".join(ls)


def swap_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    if rng.random() < 0.3:
        body = ls[2:]
        rng.shuffle(body)
        ls = ls[:2] + body
    elif len(ls) > 1:
        i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
        ls[i], ls[j] = ls[j], ls[i]
    return b"\n".join(ls)


def replace_numbers(data: bytes, rng: random.Random) -> bytes:
    hits = list(_NUMBER_RE.finditer(data))
    if not hits:
        return data
    out = bytearray(data)
    for m in sorted(rng.sample(hits, min(len(hits), rng.choice((1, 3, 20)))), key=lambda m: -m.start()):
        out[m.start() : m.end()] = rng.choice(INTERESTING_NUMBERS).encode()
    return bytes(out)


def replace_all_numbers_in_column(data: bytes, rng: random.Random) -> bytes:
    """One field position replaced on every line (a whole column of NaN, of negatives, of huge values)."""
    ls = _lines(data)
    sep = b"," if data.count(b",") > data.count(b"\n") else None
    col = rng.randrange(8)
    val = rng.choice(INTERESTING_NUMBERS).encode()
    out = []
    for line in ls:
        parts = line.split(sep) if sep else line.split()
        if len(parts) > col and _NUMBER_RE.fullmatch(parts[col].strip()):
            parts[col] = val
            line = (sep or b" ").join(parts)
        out.append(line)
    return b"\n".join(out)


def bad_times(data: bytes, rng: random.Random) -> bytes:
    hits = list(_TIME_RE.finditer(data))
    if not hits:
        return data
    out = bytearray(data)
    for m in sorted(rng.sample(hits, min(len(hits), rng.choice((1, 5, 50)))), key=lambda m: -m.start()):
        out[m.start() : m.end()] = rng.choice(
            (
                b"9999/99/99",
                b"0001/01/01",
                b"25:61:61",
                b"00:00:00",
                b"2038/01/19",
                b"19700101",
                b"99999999",
                b"24:00:00.999999999999",
                b"x",
            )
        )
    return bytes(out)


def header_tokens(data: bytes, rng: random.Random) -> bytes:
    """A header word replaced, repeated or removed (column names decide the meaning)."""
    ls = _lines(data)
    idx = [i for i, ln in enumerate(ls[:6]) if ln.startswith((b"#", b"timestamp", b"wall_ns", b'"ID"', b"# "))] or [0]
    i = rng.choice(idx)
    toks = re.split(rb"(\s+|,)", ls[i])
    words = [k for k, t in enumerate(toks) if t.strip() and t not in (b",",)]
    if words:
        k = rng.choice(words)
        toks[k] = rng.choice(
            (
                b"",
                b"gpu",
                b"sm",
                b"timestamp",
                b"wall_ns",
                b"DCGM_FI_DEV_GPU_UTIL",
                b"\xff",
                toks[k] + toks[k],
                b"Entity",
                b"#",
                b'"Metric Value"',
                b"utilization.gpu [%]",
            )
        )
    ls[i] = b"".join(toks)
    return b"\n".join(ls)


def remove_column(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    col = rng.randrange(6)
    out = []
    for line in ls:
        parts = line.split(b",")
        if len(parts) > col and (len(parts) > 1 or rng.random() < 0.5):
            del parts[col]
        out.append(b",".join(parts))
    return b"\n".join(out)


def line_endings(data: bytes, rng: random.Random) -> bytes:
    how = rng.randrange(4)
    if how == 0:
        return data.replace(b"\n", b"\r\n")
    if how == 1:
        return data.replace(b"\n", b"\r")
    if how == 2:
        return b"\xef\xbb\xbf" + data
    return data.replace(b" ", b"\t") if rng.random() < 0.5 else data.replace(b"\n", b"\n\x00", 3)


def long_line(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    i = rng.randrange(len(ls) + 1)
    ls.insert(i, rng.choice((b"9" * 200_000, b"," * 50_000, b"GPU 0 " + b"1 " * 30_000, b'"' * 10_001)))
    return b"\n".join(ls)


TEXT_MUTATORS: dict[str, Mutator] = {
    "drop_lines": drop_lines,
    "repeat_lines": repeat_lines,
    "swap_lines": swap_lines,
    "replace_numbers": replace_numbers,
    "replace_column": replace_all_numbers_in_column,
    "bad_times": bad_times,
    "header_tokens": header_tokens,
    "remove_column": remove_column,
    "line_endings": line_endings,
    "long_line": long_line,
}


MUTATORS: dict[str, dict[str, Mutator]] = {
    "kineto": {**JSON_MUTATORS, **BYTE_MUTATORS},
    "nsys": {
        **SQLITE_MUTATORS,
        "corrupt_pages": corrupt_pages,
        "corrupt_header": corrupt_header,
        "truncate_anywhere": truncate_anywhere,
        "bit_flips": bit_flips,
    },
    **{f: {**TEXT_MUTATORS, **BYTE_MUTATORS} for f in ("nvml", "smi_dmon", "smi_query", "dcgmi", "ncu")},
    "exporter": {
        **TEXT_MUTATORS,
        **BYTE_MUTATORS,
        **{k: JSON_MUTATORS[k] for k in ("drop_key", "wrong_type", "huge_numbers", "deep_nesting")},
    },
}
# Families whose files may be gzip-compressed in the wild (the last step of a program may gzip them).
GZIP_FAMILIES = frozenset({"kineto", "nvml", "smi_dmon", "smi_query", "dcgmi", "exporter", "ncu"})

Program = list[tuple[str, int]]


def apply(family: str, data: bytes, program: Program) -> bytes:
    """Run a mutation program; `gzip` as a step name compresses (only for families read through gzip)."""
    table = MUTATORS[family]
    for name, seed in program:
        rng = random.Random(seed)
        if name == "gzip":
            data = gzip_wrap(data, rng) if family in GZIP_FAMILIES else data
        else:
            data = table[name](data, rng)
    return data


def random_program(family: str, rng: random.Random, max_len: int = 3) -> Program:
    names = sorted(MUTATORS[family])
    structural = sorted(set(names) & (set(JSON_MUTATORS) | set(SQLITE_MUTATORS) | set(TEXT_MUTATORS)))

    def pick() -> str:  # structure-aware mutations 3 times out of 4: byte noise mostly makes files unreadable
        return rng.choice(structural if structural and rng.random() < 0.75 else names)

    prog: Program = [(pick(), rng.randrange(2**32)) for _ in range(rng.randrange(1, max_len + 1))]
    if family in GZIP_FAMILIES and rng.random() < 0.1:
        prog.append(("gzip", rng.randrange(2**32)))
    return prog


def file_name(family: str, seed_name: str, data: bytes) -> str:
    """Keep the seed's name, with `.gz` when the mutated bytes are gzip (detection reads extensions too)."""
    return seed_name + ".gz" if data[:2] == b"\x1f\x8b" and not seed_name.endswith(".gz") else seed_name
