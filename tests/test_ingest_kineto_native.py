"""The native scan of Kineto events (parsers/kineto/_scan.c) against msgspec's Structs: for any run of events, the
two ways give the same staging columns, or the scan leaves the run to the Structs (never a different reading).
The whole-trace comparison against DuckDB's JSON reader is tests/test_ingest_kineto.py's (it takes the native
way wherever the scan is built); here both typed ways run on the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plasmient_report import store
from plasmient_report.parsers.kineto import decode

from .conftest import CORPUS, SAMPLES, corpus_file, sample_file

pytestmark = pytest.mark.skipif(decode._native is None, reason="the native scan is not built (no C compiler at install)")


def _both(data: bytes):
    """`_tables` of one run both ways: (native, structs), each the tables or the way the run went instead."""
    out = []
    for native in (True, False):
        old = decode.NATIVE
        decode.NATIVE = native
        try:
            run = decode._strict(bytearray(data))
        finally:
            decode.NATIVE = old
        if run is None:
            out.append("not whole JSON")
            continue
        if not run.decoded:
            out.append("lenient")
            continue
        counts: dict = {}
        cats = decode._Categories()
        try:
            tables = decode._tables(run, cats, counts)
        except decode._NotStrict:
            out.append("lenient")
            continue
        finally:
            cats.close()
        out.append(({k: (t.to_pydict(), t.schema, text) for k, (t, text) in tables.items()}, counts, run.count))
    return out


def _same(data: bytes) -> None:
    native, structs = _both(data)
    assert native == structs


def _runs(events) -> list[bytes]:
    """The events as JSON both ways a writer may put non-ASCII text: as UTF-8, and as \\u escapes (pairs)."""
    return [json.dumps(events, ensure_ascii=False).encode(), json.dumps(events).encode()]


KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "void gemm<float>(int)",
    "pid": 0,
    "tid": 7,
    "ts": 5219825888435.877,
    "dur": 12.5,
    "args": {"External id": 3, "device": 0, "stream": 7, "correlation": 9, "grid": [4, 1, 1], "block": [128, 1, 1]},
}
OP = {
    "ph": "X",
    "cat": "cpu_op",
    "name": "aten::mm",
    "pid": 100,
    "tid": 1,
    "ts": 5219825888430.5,
    "dur": 20,
    "args": {"External id": 3, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"], "Sequence number": 4},
}


@pytest.mark.parametrize(
    "events",
    [
        [],
        [KERNEL, OP],
        # escapes and non-ASCII in names and raw values; a surrogate pair
        [{**OP, "name": 'a\\"b é \u00e9 😀 \t', "args": {**OP["args"], "Input Dims": [[1], "x\ny"]}}],
        # the older spellings, alone and beside today's
        [{**KERNEL, "args": {"external id": 5}}, {**OP, "args": {"Input dims": [[2]], "Input Dims": None}}],
        [{**KERNEL, "cat": "Kernel", "args": {"external id": 5, "External id": None}}],
        # values of a field's other type: a string tid, an int64-overflowing id, an int as a text field
        [{**KERNEL, "tid": "stream 7"}, OP],
        [{**OP, "args": {"External id": 2**63}}],
        [{**KERNEL, "args": {**KERNEL["args"], "dtype": 5}}],
        # the same on the profiler's span (its pid and tid are text; its table reads neither)
        [{"ph": "X", "cat": "Trace", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 1, "dur": 2, "name": "x"}, KERNEL],
        # what the Structs refuse (the run goes the lenient way): a float id, a bool, args that is no object
        [{**OP, "args": {"External id": 1.5}}],
        [{**KERNEL, "args": {"bytes": True}}],
        [{**OP, "args": None}],
        [{**KERNEL, "name": 5}],
        [5],
        # a key twice (the last wins in msgspec)
        [{**KERNEL, "dur": 1, "zz": 0}],
        # numbers: -0, exponents, the largest ints, a float beyond double
        [{**KERNEL, "ts": -0, "dur": 1e3}, {**KERNEL, "ts": -0.0, "dur": 1.5e-7}, {**OP, "args": {"External id": -(2**63)}}],
        [{**OP, "args": {"flops": 12345678901234567890123, "External id": 2**63 - 1}}],
    ],
)
def test_native_scan_reads_a_run_as_the_structs_do(events):
    for data in _runs(events):
        _same(data)


@pytest.mark.parametrize(
    "data",
    [
        b'[{"ph":"X","dur":1,"dur":2,"cat":"kernel","name":"k","ts":1}]',  # a key twice
        b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"args":{"device":1},"args":{"device":2}}]',
        b'[{"ph":"X","cat":"kernel","n\\u0061me":"k","ts":1}]',  # a key written with an escape
        b'[{"ph":"X","cat":"kernel","name":"a\\ud83d","ts":1}]',  # a lone surrogate
        b'[{"ph":"X","cat":"kernel","name":"\xff","ts":1}]',  # not UTF-8
        b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"zz":"\xff"}]',  # not UTF-8 in a value no table reads
        b'[{"ph":"X","cat":"kernel","name":"k","ts":1e400}]',
        b'[{"ph":"X","cat":"kernel","name":"k","ts":01}]',
        b'[{"ph":"X","cat":"kernel","name":"k","ts":1,}]',
        b'[{"ph":"X","cat":"kernel","name":"k","ts":NaN}]',
        b'[{"ph":"X","cat":"kernel","name":"k\x01","ts":1}]',
        b'[{"ph":"X"} {"ph":"X"}]',
        b' [ { "ph" : "X" , "cat" : "kernel" , "name" : "k" , "ts" : 1 , "args" : { "grid" : [ 1 , 2 ] } } ] ',
        b'[{"ph":"X","cat":"cpu_op","name":"k","ts":1,"args":{"Input Dims":' + b"[" * 600 + b"]" * 600 + b"}}]",
    ],
)
def test_native_scan_of_odd_bytes_gives_the_structs_result(data):
    _same(data)


# Values of every JSON type, for any field: the scan must read them as the Structs do or leave the run to them.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6
)
_TOP_KEYS = list(decode.TOP_FIELDS) + ["id", "s"]
_ARG_KEYS = list(decode.ARG_KEYS) + list(decode.schema.ARG_RENAMES) + ["Python id", "x"]
_CATS = list(decode.schema.GPU_CATS + decode.schema.CPU_CATS + decode.schema.API_CATS) + ["Kernel", "Operator", "Trace"]


_OF_KIND = {
    decode.INT: st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    decode.FLOAT: st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**60), 2**60)),
    decode.TEXT: st.one_of(st.none(), st.text(max_size=8)),
    decode.RAW: _values,
}


def _value(key: str, args: bool):
    """Mostly a value of the field's own type (so that most runs take the native way), sometimes of the type
    msgspec also takes there (JSON text in a typed column), now and then any JSON value."""
    kind = (decode.ARG_FIELDS.get(decode.schema.ARG_RENAMES.get(key, key)) if args else decode.TOP_FIELDS.get(key)) or decode.RAW
    other = _OF_KIND[decode.INT] if kind == decode.TEXT else _OF_KIND[decode.TEXT]
    return st.one_of(*[_OF_KIND[kind]] * 12, other, _values)


@st.composite
def _event(draw):
    ev = {
        "ph": draw(st.sampled_from(["X", "X", "M", "i", "B"])),
        "cat": draw(st.sampled_from(_CATS)),
        "name": draw(st.sampled_from(["k", "process_name", "[memory]", "ProfilerStep#1", "é"])),
        "ts": draw(st.floats(min_value=0, max_value=1e13, allow_nan=False)),
    }
    for k in draw(st.lists(st.sampled_from(_TOP_KEYS), max_size=4)):
        ev[k] = draw(_value(k, False))
    args = draw(st.sampled_from(["object"] * 8 + ["absent"] * 3 + ["other"]))
    if args == "object":
        ev["args"] = {k: draw(_value(k, True)) for k in draw(st.lists(st.sampled_from(_ARG_KEYS), max_size=6))}
    elif args == "other":
        ev["args"] = draw(_values)
    return ev


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event(), max_size=8))
def test_native_scan_of_random_events_gives_the_structs_result(events):
    _same(msgspec.json.encode(events))


def _recordings() -> list[Path]:
    found = []
    for root in (SAMPLES, CORPUS):
        if root.is_dir():
            found += sorted(p for p in root.rglob("*.json*") if p.name.endswith((".json", ".json.gz")))
    return found


def _staged(path: Path, native: bool, monkeypatch) -> dict[str, list[tuple]]:
    monkeypatch.setattr(decode, "NATIVE", native)
    con = store.connect()
    try:
        decode.decode(path, con)
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in decode.STAGES}
    finally:
        con.close()


@pytest.mark.parametrize(
    "ref",
    [
        "sample:h200_sync_stack/sync_stack.pt.trace.json.gz",
        "sample:h200_hf/llama_fsdp2.pt.trace.json.gz",
        "corpus:public-real/kineto-resnet50-nw0/worker0.1623143089861.pt.trace.json.gz",
        "corpus:public-kineto-hta/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "corpus:public-kineto-hta/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    ],
)
def test_native_and_structs_stage_the_same_rows(ref, monkeypatch):
    """Whole recordings (a with_stack GPT loop, FSDP2, torch 1.9's ResNet-50 with string ids in some runs, HTA's
    test trace, a ROCm trace), runs of 256 KiB: the same staging rows both ways."""
    where, rel = ref.split(":", 1)
    path = sample_file(rel) if where == "sample" else corpus_file(rel)
    monkeypatch.setattr(decode, "BATCH_BYTES", 256 << 10)
    assert _staged(path, True, monkeypatch) == _staged(path, False, monkeypatch)


def test_native_scan_reads_decimal_numbers_as_python_does():
    """Times and durations are read by a fast path (an exact mantissa and power of ten, one rounding), else by
    strtod: either way the double Python's float() gives (correctly rounded), for numbers as Kineto writes them
    (µs with 3 decimals, epoch µs), reprs of doubles, long mantissas and exponents."""
    import random

    import numpy as np

    rnd = random.Random(7)
    texts = []
    for _ in range(50_000):
        k = rnd.randrange(5)
        if k == 0:
            texts.append(f"{rnd.uniform(0, 1e16):.3f}")
        elif k == 1:
            texts.append(repr(rnd.uniform(-1e5, 1e5)))
        elif k == 2:
            texts.append(f"{rnd.randrange(10**19)}.{rnd.randrange(10**6)}")
        elif k == 3:
            texts.append(f"{rnd.randrange(1, 10**5)}e{rnd.randrange(-30, 31)}")
        else:
            texts.append(f"-0.{rnd.randrange(10**18):018d}E+{rnd.randrange(6)}")
    texts += ["0.1", "-0.0", "9007199254740993.0", "4.35e-10", "1.7976931348623157e308", "2.2250738585072014e-308"]
    got = decode._native.scan(("[" + ",".join('{"ts": ' + t + "}" for t in texts) + "]").encode(), [(b"ts", 2, False)])
    assert got is not None
    values = np.frombuffer(got[1][0][1], np.float64)
    wrong = [(t, v) for t, v in zip(texts, values.tolist(), strict=True) if repr(float(t)) != repr(v)]
    assert wrong == []
