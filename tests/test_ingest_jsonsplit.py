"""The streaming splitter of traceEvents: whole events in batches at any chunk size, strings with quotes,
backslashes and brackets, keys before and after the array, and a clear error on what is not a trace."""

from __future__ import annotations

import io
import json

import msgspec
import pytest

from plasmient_report.parsers._jsonsplit import SplitError, split_events

EVENTS = [
    {"ph": "X", "name": 'a "quoted" {name} [x], y', "ts": 1.5, "args": {"k": [1, [2, 3]], "s": "\\\\"}},
    {"ph": "X", "name": 'back\\\\slash\\"', "ts": 2.0},
    {"ph": "M", "name": "thread_name", "args": {"name": "stream 7 "}},
    {"ph": "X", "name": "traceEvents", "ts": 3.0, "args": {"traceEvents": [{"nested": "}"}]}},
    {"ph": "X", "name": "ünïcödé ✓", "ts": 4.0},
]


def split(doc: bytes, chunk: int):
    batches, head = [], None
    for b in split_events(io.BytesIO(doc), chunk_bytes=chunk):
        if isinstance(b, tuple):
            head = b[1]
        else:
            batches.extend(msgspec.json.decode(b))
    return batches, head


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 13, 64, 1 << 20])
def test_every_chunk_size_gives_the_same_events(chunk):
    doc = json.dumps(
        {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0}],
            "traceEvents": EVENTS,
            "baseTimeNanoseconds": 123,
            "traceName": "t",
        },
        ensure_ascii=False,
    ).encode()
    events, head = split(doc, chunk)
    assert events == EVENTS
    h = json.loads(head)
    assert h["traceEvents"] == [] and h["baseTimeNanoseconds"] == 123 and h["deviceProperties"] == [{"id": 0}]


@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_bare_array_of_events(chunk):
    events, head = split(json.dumps(EVENTS).encode(), chunk)
    assert events == EVENTS and json.loads(head) == []


def test_empty_event_array_and_whitespace():
    events, head = split(b'{ "traceEvents" : [ \n ] , "x": 1}', 4)
    assert events == [] and json.loads(head) == {"traceEvents": [], "x": 1}


@pytest.mark.parametrize(
    "doc",
    [
        b'{"traceEvents": [{"ph": "X"}, {"ph": "X"',  # truncated inside the array
        b'{"traceEvents": [{"ph": "X"}]',  # object never closed
        b'{"traceEvents": [{"ph": "X", "name": "abc',  # inside a string
    ],
)
def test_truncated(doc):
    with pytest.raises(SplitError, match="truncated"):
        split(doc, 8)


def test_not_an_object():
    with pytest.raises(SplitError):
        split(b"hello world", 4)
    with pytest.raises(SplitError, match="not an array"):
        split(b'{"traceEvents": 5}', 4)


@pytest.mark.parametrize("chunk", [1, 3, 17, 1 << 20])
def test_ndjson_batches_hold_one_event_a_line(chunk):
    doc = json.dumps({"traceEvents": EVENTS, "x": 1}, indent=2, ensure_ascii=False).encode()
    events = []
    for b in split_events(io.BytesIO(doc), chunk_bytes=chunk, ndjson=True):
        if not isinstance(b, tuple):
            lines = [ln for ln in b.split(b"\n") if ln.strip()]
            events.extend(json.loads(ln) for ln in lines)
    assert events == EVENTS


# Events whose strings and nested values hold what the guessed cut looks for (`}` `,` `{`), so that some guesses
# are wrong and their bytes must be scanned exactly, whole and unchanged.
TRICKY = [
    {"ph": "X", "name": "a },{ b", "ts": 1.0, "args": {"x": [{"a": 1}, {"b": 2}], "s": "} , {"}},
    {"ph": "X", "name": "c", "ts": 2.0, "args": {"nested": {"o": {"p": [{}, {}]}}}},
    {"ph": "X", "name": 'd "}," {', "ts": 3.0},
    *[{"ph": "X", "name": f"e{i}", "ts": float(i), "args": {"v": [i, {"w": i}]}} for i in range(40)],
]


@pytest.mark.parametrize("chunk", [1, 7, 31, 64, 200, 1 << 20])
@pytest.mark.parametrize("refuse", [False, True])
def test_runs_cut_by_guesses_hold_every_event_once_in_order(chunk, refuse):
    """With `decode`, runs cut at a guessed event boundary are decoded in place; a guess that does not decode (a
    cut inside a string or a nested value, or a run the decoder refuses) has its bytes scanned exactly: every
    event once, in document order, whatever the chunk size."""
    doc = json.dumps({"traceEvents": TRICKY + EVENTS, "x": 1}, ensure_ascii=False, indent=1).encode()
    seen: list[bytes] = []

    def decode(data):
        assert isinstance(data, bytearray) and data[:1] == b"[" and data[-1:] == b"]"
        try:
            events = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return None
        if refuse and len(seen) % 2:  # every other run refused: its bytes go the exact way
            seen.append(b"")
            return None
        seen.append(bytes(data))
        return ("run", events)

    events, head, runs = [], None, 0
    for b in split_events(io.BytesIO(doc), chunk_bytes=chunk, decode=decode):
        if isinstance(b, tuple) and b[0] == "run":
            events.extend(b[1])
            runs += 1
        elif isinstance(b, tuple):
            head = b[1] if b[0] == "head" else head
        else:
            events.extend(msgspec.json.decode(b))
    assert events == TRICKY + EVENTS
    assert json.loads(head) == {"traceEvents": [], "x": 1}
    if 64 <= chunk < len(doc) // 4:
        assert runs > 0  # the guessed way was taken
    for data in filter(None, seen):  # a decoded run's bytes were not changed after it was decoded
        assert msgspec.json.decode(data)
