"""Stream a Chrome-trace JSON document and cut its `traceEvents` array into batches of whole events.

A vectorised scanner (numpy) tracks, per byte, whether it is inside a string and at which nesting depth,
carrying that state across chunk boundaries. Commas at depth 2 inside the `traceEvents` array separate
events, so each batch is a run of complete events that msgspec decodes as one JSON array. Everything else
of the document (the top-level keys) is kept as a small head object with an empty `traceEvents`.
Memory is bounded by the chunk size, whatever the size of the file.

With a `decode` function, the events are cut without the scan where it can be avoided: a chunk is cut after its
last `}` followed by `,` and `{` (the boundary between two events as every writer puts it) and that run of
events is decoded at once. The cut is right exactly when the run decodes — a cut inside a string leaves the
run's last string open, one inside a nested object or array leaves it unclosed, one after the array's end leaves
the head's keys inside brackets — so a run that does not decode is scanned byte-exactly instead, as above, and the
cutting by guesses resumes at the next event boundary the scan finds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

QUOTE, BACKSLASH = 34, 92
OPEN_BRACE, CLOSE_BRACE, OPEN_BRACKET, CLOSE_BRACKET, COMMA = 123, 125, 91, 93, 44
KEY = b'"traceEvents"'
BOM = b"\xef\xbb\xbf"
_NEWLINES_TO_SPACE = bytes.maketrans(b"\r\n", b"  ")
HEAD_LIMIT = 256 << 20  # the non-event part of a trace is small; more means this is not a trace
_WHITESPACE = b" \t\r\n"
GUESS_TRIES = 64  # `{` looked at from the end of a chunk for an event boundary before scanning it instead
T = TypeVar("T")


class Readable(Protocol):
    def read(self, k: int = -1) -> bytes: ...


class SplitError(ValueError):
    """The document is not a JSON object (or array) of events we can split."""


@dataclass
class _State:
    in_string: bool = False
    trailing_backslashes: int = 0  # backslashes at the end of the previous chunk (inside a string)
    depth: int = 0
    in_events: bool = False  # inside the traceEvents array
    events_done: bool = False
    expect_array: bool = False  # saw the key at depth 1, waiting for its '['
    top_is_array: bool = False
    head: bytearray = field(default_factory=bytearray)
    pending: bytearray = field(default_factory=bytearray)
    ndjson: bool = False
    unscanned: bool = False  # `pending` starts at an event boundary and was not scanned (cut by guesses)


# One table for the scan: 1 at a quote, 2 at a structural byte, 0 elsewhere (one pass finds both).
_CLASSES = bytes(
    1 if c == QUOTE else 2 if c in (OPEN_BRACE, CLOSE_BRACE, OPEN_BRACKET, CLOSE_BRACKET, COMMA) else 0 for c in range(256)
)


def _escaped(chunk: bytes, quotes: np.ndarray, carry_bs: int) -> np.ndarray:
    """Of the quote positions `quotes`, those escaped (preceded by an odd run of backslashes)."""
    out = np.zeros(quotes.size, dtype=bool)
    if carry_bs == 0 and chunk.find(b"\\") < 0:
        return out
    arr = np.frombuffer(chunk, dtype=np.uint8)
    # only quotes right after a backslash need a look (rare in traces): count the run before each
    for j in np.flatnonzero((quotes == 0) | (arr[np.maximum(quotes - 1, 0)] == BACKSLASH)).tolist():
        k = int(quotes[j])
        run, i = 0, k - 1
        while i >= 0 and chunk[i] == BACKSLASH:
            run += 1
            i -= 1
        if i < 0:
            run += carry_bs
        out[j] = bool(run & 1)
    return out


def _batch(pending: bytearray, chunk: bytes, pos: int, cut: int, seps: np.ndarray, ndjson: bool) -> bytes:
    """Whole events pending + chunk[pos:cut] (`seps`: the separating commas inside, chunk positions) as a JSON
    array, or as newline-delimited JSON (a JSON string never holds a raw newline, so newlines are whitespace)."""
    if not ndjson:
        return b"[" + bytes(pending) + chunk[pos:cut] + b"]"
    out = bytearray((bytes(pending) + chunk[pos:cut]).translate(_NEWLINES_TO_SPACE))
    if seps.size:
        np.frombuffer(out, dtype=np.uint8)[seps - pos + len(pending)] = 10
    return bytes(out)


def split_events(
    stream: Readable, chunk_bytes: int = 4 << 20, ndjson: bool = False, decode: Callable[[bytearray], T | None] | None = None
) -> Iterator[bytes | T | tuple[str, bytes]]:
    """Yield batches (bytes of a JSON array of whole events, or NDJSON with one event a line), then
    ('head', bytes of the rest of the document with an empty traceEvents). Markers on the way: ('array', b'')
    first when the document is the array form `[{…}, …]`, ('partial_tail', b'') when such an array ends inside
    its last event (left out). A UTF-8 BOM and leading whitespace are skipped. Raises SplitError on a document
    that is not a trace.

    With `decode` (JSON arrays only), runs of events cut by guesses are given to it as the bytes of a JSON array
    (a bytearray, never changed afterwards): what it returns is yielded in their place, and None (the bytes do
    not decode: the guess was wrong, or the events are bad) has those bytes scanned exactly, their batches
    yielded as bytes. Batches and decoded runs
    come in document order and together hold every event once."""
    if decode is not None and ndjson:
        raise ValueError("decode works on JSON arrays, not NDJSON")
    st = _State(ndjson=ndjson)
    first = True
    while True:
        chunk = stream.read(chunk_bytes)
        if not chunk:
            break
        if first:
            if chunk[:3] == BOM:  # a UTF-8 byte-order mark before the document: not part of it
                chunk = chunk[3:]
            stripped = chunk.lstrip()
            if not stripped:
                continue
            if stripped[:1] == b"[":
                st.top_is_array = True
                yield ("array", b"")
            elif stripped[:1] != b"{":
                raise SplitError("not a JSON object")
            first = False
        if not (st.in_events or st.events_done or st.expect_array or st.top_is_array):
            # never cut the key in two: extend the chunk while it ends with a prefix of it
            while any(chunk.endswith(KEY[:j]) for j in range(1, len(KEY))):
                more = stream.read(64)
                if not more:
                    break
                chunk += more
        if st.unscanned:
            yield from _guess(chunk, st, decode, chunk_bytes)  # type: ignore[arg-type]
            continue
        yield from _scan(chunk, st)
        if decode is not None and st.in_events:
            _at_boundary(st)
    if first:
        raise SplitError("empty document")
    if st.unscanned:  # the rest of the events and the document's end: scanned exactly
        tail = bytes(st.pending)
        st.pending = bytearray()
        st.unscanned = False
        yield from _scan(tail, st)
    if st.top_is_array and st.in_events:
        # The trace-event format's array form may end without its `]` (a process that died while writing):
        # the whole events are the trace. An event cut off at the end is left out (and said).
        tail = bytes(st.pending)
        if st.depth == 1 and not st.in_string:
            if tail.strip().rstrip(b",").strip():
                yield _batch(
                    bytearray(),
                    tail.strip().rstrip(b","),
                    0,
                    len(tail.strip().rstrip(b",")),
                    np.zeros(0, dtype=np.int64),
                    st.ndjson,
                )
        elif tail.strip():
            yield ("partial_tail", b"")
        yield ("head", b"[]")
        return
    if st.depth != 0 or st.in_string:
        raise SplitError("truncated JSON (the file ends inside the trace)")
    if st.in_events:
        raise SplitError("truncated JSON (the traceEvents array is not closed)")
    yield ("head", bytes(st.head))


def _at_boundary(st: _State) -> None:
    """After a scan that ends inside the events: `pending` begins right after a separating comma (or the array's
    `[`), outside any string, at the events' depth — a state known without its bytes, so they count as unscanned
    and the next chunk can be cut by guesses."""
    st.unscanned = True
    st.depth = 1 if st.top_is_array else 2
    st.in_string = False
    st.trailing_backslashes = 0


def _boundary(data: bytes | bytearray, lo: int = 0) -> tuple[int, int] | None:
    """The last `}` `,` `{` (whitespace between allowed) in `data[lo:]`: the positions of its `}` and `,`."""
    end = len(data)
    for _ in range(GUESS_TRIES):
        i = data.rfind(b"{", lo, end)
        if i <= lo:
            return None
        j = i - 1
        while j >= lo and data[j] in _WHITESPACE:
            j -= 1
        if j > lo and data[j] == COMMA:
            k = j - 1
            while k >= lo and data[k] in _WHITESPACE:
                k -= 1
            if k >= lo and data[k] == CLOSE_BRACE:
                return k, j
        end = i
    return None


def _guess(chunk: bytes, st: _State, decode: Callable[[bytearray], T | None], chunk_bytes: int) -> Iterator[bytes | T]:
    """One chunk in the events, `pending` unscanned: decode the run of events up to the chunk's last event
    boundary; scan exactly what does not decode, or what finds no boundary for a while. The run is built in
    place, `[` + pending + chunk cut after the boundary's `}` + `]`: one copy of the chunk, not three."""
    buf = bytearray(b"[") + st.pending + chunk
    cut = _boundary(buf, 1)
    if cut is not None:
        close, comma = cut
        tail = buf[comma + 1 :]
        between = bytes(buf[close + 1 : comma + 1])
        del buf[close + 1 :]
        buf.append(CLOSE_BRACKET)
        got = decode(buf)  # the run (its decoded values may refer to it: `buf` is never changed again)
        if got is not None:
            yield got
            st.pending = tail
            return
        data = bytes(memoryview(buf)[1:-1]) + between + bytes(tail)
    elif len(buf) - 1 < 4 * chunk_bytes:  # one long event (or the array's end): wait for more
        st.pending = buf[1:]
        return
    else:
        data = bytes(memoryview(buf)[1:])
    st.pending = bytearray()
    st.unscanned = False
    yield from _scan(data, st)
    if st.in_events:
        _at_boundary(st)


def _scan(chunk: bytes, st: _State) -> Iterator[bytes]:
    """Work on the sparse set of quotes and structural bytes ({ } [ ] ,), found in one pass, not on every
    byte: a structural byte is outside strings when an even number of (unescaped) quotes come before it."""
    arr = np.frombuffer(chunk, dtype=np.uint8)
    n = arr.size
    carry_in = int(st.in_string)
    cls = np.frombuffer(chunk.translate(_CLASSES), dtype=np.uint8)
    marks = np.flatnonzero(cls)
    kinds = cls[marks]
    is_quote = kinds == 1
    quotes = marks[is_quote]
    esc = _escaped(chunk, quotes, st.trailing_backslashes if st.in_string else 0)
    if esc.any():
        is_quote[np.flatnonzero(is_quote)[esc]] = False
        quotes = quotes[~esc]
    # quotes before each mark (a structural byte is never a quote itself): its parity says in or out of a string
    before = np.cumsum(is_quote) - is_quote
    spos = marks[~(kinds == 1) & (((before + carry_in) & 1) == 0)]
    n_quotes = int(quotes.size)
    ch = arr[spos]
    delta = np.zeros(spos.size, dtype=np.int64)
    delta[(ch == OPEN_BRACE) | (ch == OPEN_BRACKET)] = 1
    delta[(ch == CLOSE_BRACE) | (ch == CLOSE_BRACKET)] = -1
    depth_after = st.depth + np.cumsum(delta)
    depth_before = depth_after - delta
    is_open, is_close, is_comma = delta == 1, delta == -1, ch == COMMA

    def depth_at(i: int) -> int:  # depth just before byte i
        k = int(np.searchsorted(spos, i)) - 1
        return int(depth_after[k]) if k >= 0 else st.depth

    def quote_parity_at(i: int) -> int:
        return (int(np.searchsorted(quotes, i)) + carry_in) & 1

    pos = 0  # next byte of this chunk not yet assigned to head or events
    events_depth = 1 if st.top_is_array else 2
    while pos < n:
        lo = int(np.searchsorted(spos, pos))
        if st.in_events:
            sel = np.flatnonzero(is_close[lo:] & (depth_after[lo:] == events_depth - 1))
            end = int(spos[lo + sel[0]]) if sel.size else n
            hi = int(np.searchsorted(spos, end))
            seps = spos[lo:hi][is_comma[lo:hi] & (depth_before[lo:hi] == events_depth)]
            if end < n:  # the array ends here: everything before it is whole events
                if (bytes(st.pending) + chunk[pos:end]).strip():
                    yield _batch(st.pending, chunk, pos, end, seps, st.ndjson)
                st.pending = bytearray()
                st.in_events = False
                st.events_done = True
                pos = end  # the closing bracket goes to the head
                continue
            if seps.size:
                cut = int(seps[-1])
                yield _batch(st.pending, chunk, pos, cut, seps[:-1], st.ndjson)
                st.pending = bytearray(chunk[cut + 1 : n])
            else:
                st.pending += chunk[pos:n]
            pos = n
            break
        if (st.top_is_array and not st.events_done) or st.expect_array:
            want = 1 if st.top_is_array else 2
            sel = np.flatnonzero(is_open[lo:] & (depth_after[lo:] == want))
            if st.expect_array:
                stop = int(spos[lo + sel[0]]) if sel.size else n
                between = chunk[pos:stop].strip(b" \t\r\n:")
                if between:
                    raise SplitError("'traceEvents' is not an array")
            if not sel.size:
                st.head += chunk[pos:n]
                pos = n
                break
            start = int(spos[lo + sel[0]])
            st.head += chunk[pos : start + 1]
            st.expect_array = False
            st.in_events = True
            pos = start + 1
            continue
        if st.events_done:
            st.head += chunk[pos:n]
            pos = n
            break
        k = _find_key(chunk, pos, depth_at, quote_parity_at)
        if k is None:
            st.head += chunk[pos:n]
            pos = n
            break
        st.head += chunk[pos:k]
        st.expect_array = True
        pos = k
    if len(st.head) > HEAD_LIMIT:
        raise SplitError(f"no 'traceEvents' array in the first {HEAD_LIMIT >> 20} MiB")
    st.depth = int(depth_after[-1]) if spos.size else st.depth
    st.in_string = bool((carry_in + n_quotes) & 1)
    if st.in_string:
        tail_bs = 0
        i = n - 1
        while i >= 0 and chunk[i] == BACKSLASH:
            tail_bs += 1
            i -= 1
        st.trailing_backslashes = tail_bs + (st.trailing_backslashes if i < 0 else 0)
    else:
        st.trailing_backslashes = 0


def _find_key(chunk: bytes, pos: int, depth_at: Any, quote_parity_at: Any) -> int | None:
    """Index just after `"traceEvents"` when it is a key of the top-level object; None if not in this chunk."""
    start = pos
    while True:
        i = chunk.find(KEY, start)
        if i < 0:
            return None
        if quote_parity_at(i) == 0 and depth_at(i) == 1:
            return i + len(KEY)
        start = i + 1
