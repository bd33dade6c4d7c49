"""Is this a PyTorch profiler (Kineto) / Chrome trace? From content, whatever the order of the top-level keys.

A trace is a JSON object with a top-level `traceEvents` array, or the trace-event format's array form
`[{"ph": …}, …]` (whose closing `]` may be missing). A UTF-8 BOM and leading whitespace are allowed. Harnesses
put large objects (`metadata`, `distributedInfo` with hundreds of process groups) before `traceEvents`, so when
the first KiB do not settle it, the document's top level is scanned (streaming, events not decoded) up to
`SCAN_LIMIT` bytes. JSON documents of other profilers are named (rocprofiler-sdk, Chakra execution traces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ...errors import BadInput
from .._io import GuardedReader
from .._jsonsplit import SplitError, split_events
from ..base import BOM, Sniff

SCAN_LIMIT = 64 << 20  # bytes of a JSON document read to find a top-level `traceEvents` before giving up
SCAN_CHUNK = 256 << 10

# Top-level keys of JSON documents that are not traces this tool reads → what they are.
OTHER_JSON = {
    "rocprofiler-sdk-tool": "a rocprofiler-sdk (rocprofv3) JSON results file",
    "nodes": "an execution trace (Chakra / PyTorch ExecutionTraceObserver), not a profiler trace",
}
_KEY = re.compile(rb'^\s*\{\s*"([^"\\]{1,80})"\s*:')


@dataclass(frozen=True)
class JsonShape:
    """What a JSON document's top level holds, as far as it was read."""

    kind: str  # 'trace' | 'other' | 'unknown'
    keys: tuple[str, ...] = ()  # top-level keys, when the whole top level was read
    what: str | None = None  # for 'other': what the document is


def looks_like_kineto(head: bytes) -> bool:
    """The quick test on the first KiB (decompressed): an object whose `traceEvents` shows, or the array form."""
    h = head[3:] if head[:3] == BOM else head
    h = h.lstrip()
    return (h.startswith(b"{") and b'"traceEvents"' in h) or (h.startswith(b"[") and b'"ph"' in h[:4096])


def _starts_json(head: bytes) -> bool:
    h = (head[3:] if head[:3] == BOM else head).lstrip()
    return h[:1] in (b"{", b"[")


class _Limited:
    """A reader that stops the scan after `limit` bytes."""

    def __init__(self, inner: GuardedReader, limit: int) -> None:
        self.inner, self.limit, self.n = inner, limit, 0

    def read(self, k: int = -1) -> bytes:
        if self.n >= self.limit:
            raise _Enough
        b = self.inner.read(min(k, self.limit - self.n) if k > 0 else self.limit - self.n)
        self.n += len(b)
        return b


class _Enough(Exception):
    pass


def json_shape(path: Path, limit: int = SCAN_LIMIT) -> JsonShape:
    """Scan a JSON document's top level: a trace as soon as the first events show; else its keys."""
    try:
        with GuardedReader(path) as g:
            for item in split_events(_Limited(g, limit), chunk_bytes=SCAN_CHUNK):
                if isinstance(item, tuple):
                    if item[0] == "array":
                        continue
                    if item[0] == "head":
                        return _from_head(item[1])
                    continue
                if b'"ph"' in item or b'"name"' in item:
                    return JsonShape("trace")
                return JsonShape("unknown")
    except _Enough:
        return JsonShape("unknown")
    except (SplitError, BadInput):
        return JsonShape("unknown")
    return JsonShape("unknown")


def _from_head(head: bytes) -> JsonShape:
    try:
        top = msgspec.json.decode(head, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        try:
            lst = msgspec.json.decode(head)
        except (msgspec.DecodeError, RecursionError):
            return JsonShape("unknown")
        return JsonShape("trace" if isinstance(lst, list) else "unknown")
    keys = tuple(top)
    if "traceEvents" in top:
        return JsonShape("trace", keys)
    for k, what in OTHER_JSON.items():
        if k in top:
            return JsonShape("other", keys, what)
    return JsonShape("unknown", keys)


def sniff(s: Sniff) -> str | None:
    """'kineto' for a trace; 'json-other' for a JSON document of another profiler (named by `what_json`)."""
    if looks_like_kineto(s.head):
        return "kineto"
    if not _starts_json(s.head):
        return None
    m = _KEY.match(s.head[3:] if s.head[:3] == BOM else s.head)
    if m and m.group(1).decode("utf-8", "replace") in OTHER_JSON:
        return "json-other"
    shape = json_shape(s.path)
    if shape.kind == "trace":
        return "kineto"
    if shape.kind == "other":
        return "json-other"
    return None


def what_json(path: Path) -> str:
    """One line saying what a JSON document that is not a trace is."""
    shape = json_shape(path)
    if shape.what:
        return shape.what + ": this tool reads PyTorch profiler / Chrome traces, Nsight Systems exports and counter logs"
    if shape.keys:
        keys = ", ".join(shape.keys[:6]) + (" …" if len(shape.keys) > 6 else "")
        return f"JSON but not a PyTorch profiler trace (no top-level 'traceEvents'; its keys: {keys})"
    return f"JSON but not a PyTorch profiler trace (no top-level 'traceEvents' in its first {SCAN_LIMIT >> 20} MiB)"


_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d{1,7})')


def declared_rank(path: Path, limit: int = 1 << 20) -> int | None:
    """The rank a trace says it is, cheaply: `distributedInfo.rank` when it shows in the first MiB, else a rank in
    the file name; None when neither says (the trace is then numbered by input order)."""
    from .. import ranks

    try:
        with GuardedReader(path) as g:
            head = g.read(limit)
    except (BadInput, OSError):
        head = b""
    m = _DIST_RANK.search(head)
    if m:
        return ranks.valid_rank(int(m.group(1)))
    return ranks.from_filename(path)
