"""PyTorch profiler (Kineto) Chrome-trace JSON → the store's tables.

The pieces, each with one job:
- `sniff`: is a file a trace (any key order, the array form, a BOM), or another profiler's JSON;
- `decode`: `traceEvents` into typed staging tables, streaming (bounded memory, no Python loop over events);
- `schema`: what differs between torch generations (categories, argument spellings, the document's top level,
  which GPU a kernel's device id is);
- `emit`: staging tables → store tables, times to UTC (SPEC §3).
This module runs them and cleans what is bad but readable: events with no usable time, NaN / infinite FLOPs,
shapes of the wrong type are left out (or their field dropped) and counted in the source's notes, never a
reason to refuse the rest of the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import msgspec

from ... import vocab
from ...errors import BadInput
from ...store import one
from .. import gpus, ranks
from ..base import Format, SourceInfo
from . import decode, emit, schema
from .schema import DeviceProp, DeviceRow
from .sniff import looks_like_kineto, sniff, what_json

__all__ = ["FORMATS", "DeviceProp", "KinetoSource", "ingest", "looks_like_kineto", "rank_from_filename", "sniff"]

# Kineto `ts` is µs; above this it is already epoch µs (traces before baseTimeNanoseconds existed).
EPOCH_US_THRESHOLD = 1e14
# |ts| beyond this (µs) cannot be a time: |UTC ns| must stay below 2**62 so that differences of times fit in int64.
MAX_ABS_TS_US = 4.6e15
TIME_LIMIT_NS = 2**62
rank_from_filename = ranks.from_filename


@dataclass
class KinetoSource(SourceInfo):
    """What a Kineto file says about itself, for the `sources` and `devices` rows."""

    devices: list[DeviceProp] = field(default_factory=list)
    categories: dict[str, int] = field(default_factory=dict)


def ingest(path: Path, con: duckdb.DuckDBPyConnection, source_id: int) -> KinetoSource:
    """Decode one Kineto file into the store. Rank may be None (decided by the caller)."""
    search_path = decode.open_stages(con)
    try:
        dec = decode.decode(path, con)
        head = _head(path, dec)
        cats = {
            str(c): int(n)
            for c, n in con.execute("SELECT cat, sum(n) FROM _kin_cats WHERE cat IS NOT NULL GROUP BY cat").fetchall()
        }
        info = _describe(path, head, dec, cats)
        _clean(con, path, info)
        cut = _clip_to_recording(con, info)
        rows = _devices(con, head, info)
        info.gpu_events = emit.emit(con, source_id, info.rank, int(info.base_time_ns or 0), rows, cut)
        if info.gpu_events == 0 and (what := schema.non_gpu_accelerator(cats)):
            raise BadInput(path, f"{what}: this tool measures NVIDIA / AMD GPU work")
        if info.gpu_events == 0 and (xla := _xla_track(con)):
            # the trace viewer's JSON of jax.profiler / TensorFlow (XProf, TensorBoard): Chrome trace events, but the
            # device's work is on XLA's per-device processes, not Kineto's kernel events
            raise BadInput(
                path,
                f"a JAX / TensorFlow (XLA) profiler trace ({xla}), not a PyTorch profiler trace: record the program with "
                "Nsight Systems (nsys profile --trace=cuda,nvtx) and give its report",
            )
        if info.gpu_events == 0 and cats.get("cuda_profiler_range"):
            # CUPTI profiler (range / counter) mode replays each kernel for its counters: there is no timeline
            raise BadInput(
                path,
                f"a CUPTI profiler counter-mode trace ({cats['cuda_profiler_range']} kernel counter ranges, no kernel "
                "timeline): record with the default activity tracing (no experimental_config profiler_metrics)",
            )
        n_mem = one(con, "SELECT count(*) FROM memory_events WHERE source_id = ?", [source_id])
        if n_mem and n_mem[0]:
            info.notes.append(f"{n_mem[0]} device-memory allocator events (profile_memory=True)")
        return info
    finally:
        decode.drop_stages(con, search_path)


def _xla_track(con: duckdb.DuckDBPyConnection) -> str | None:
    """The process or thread that marks a trace of the XLA profiler (`/device:GPU:0`, `XLA Ops`), if one does."""
    row = one(
        con,
        "SELECT name, value FROM _kin_meta WHERE (name = 'process_name' AND "
        "regexp_matches(value, '(^|/)device:(XLA_)?(GPU|TPU):[0-9]')) OR (name = 'thread_name' AND value IN "
        "('XLA Ops', 'XLA Modules', 'TensorFlow Ops')) ORDER BY name LIMIT 1",
    )
    return f"{str(row[0]).removesuffix('_name')} '{row[1]}'" if row else None


def _head(path: Path, dec: decode.Decoded) -> schema.Head:
    if dec.top_is_array:
        h = schema.Head()
        if dec.partial_tail:
            h.notes.append(
                "the trace ends inside its last event (the array form without its closing ']'): that event was left out"
            )
        return h
    try:
        head = schema.decode_head(dec.head)
    except msgspec.DecodeError as e:
        msg = str(e)
        if "utf-8" in msg.lower():
            raise BadInput(path, f"invalid UTF-8 in JSON ({msg})") from None
        raise BadInput(path, f"malformed JSON ({msg})") from None
    except msgspec.ValidationError as e:
        raise BadInput(path, f"not a PyTorch profiler trace ({e})") from None
    except RecursionError:
        raise BadInput(path, "malformed JSON (nested too deeply outside traceEvents)") from None
    if not head.has_events:
        raise BadInput(path, what_json(path))
    return head


def _describe(path: Path, head: schema.Head, dec: decode.Decoded, cats: dict[str, int]) -> KinetoSource:
    di = head.distributed
    rank, method = None, "order"
    if di is not None and ranks.valid_rank(di.rank) is not None:
        rank, method = di.rank, "distributedInfo"
    elif (r := ranks.from_filename(path)) is not None:
        rank, method = r, "filename"
    base = head.base_time_ns
    version = f"kineto schema {head.schema_version}" if head.schema_version is not None else "chrome trace"
    if base is None:
        version += " (no baseTimeNanoseconds)"
    notes = list(head.notes)
    if head.rocm:
        notes.append("ROCm trace")
    incomplete, dropped = _profiler_losses(head.log_lines)
    info = KinetoSource(
        incomplete=incomplete,
        dropped_events=dropped,
        format="kineto",
        format_version=version,
        rank=rank,
        rank_method=method,
        world_size=ranks.valid_world_size(di.world_size) if di is not None else None,
        base_time_ns=base,
        clock_anchor="native" if base is not None else "epoch_us",
        events=dec.events,
        host=head.host,
        devices=list(head.devices),
        notes=notes,
        categories=cats,
    )
    return info


def _profiler_losses(lines: list[str]) -> tuple[list[str], int | None]:
    """What Kineto's log in the trace (INFO / WARNING / ERROR) says was lost: CUPTI stopping early when its
    activity buffer filled up, dropped records."""
    import re

    stopped = re.compile(r"CUPTI stopped early\?\s*=\s*[1-9]")
    dropped_re = re.compile(
        r"(?i)(\d+)\s+(?:dropped|lost)\s+(?:activity\s+)?(?:records?|events?)"
        r"|(\d+)\s+(?:activity\s+)?(?:records?|events?)\s+(?:were\s+)?(?:dropped|lost)"
        r"|dropped(?:\s+records?)?\s*[=:]\s*(\d+)"
    )
    out: list[str] = []
    dropped: int | None = None
    for line in lines:
        if stopped.search(line):
            out.append("CUPTI stopped early (its activity buffer filled up): GPU events after that point are missing")
        if m := dropped_re.search(line):
            n = int(next(g for g in m.groups() if g))
            dropped = (dropped or 0) + n
            out.append(f"{n} CUPTI records dropped (activity buffer overflow)")
    return list(dict.fromkeys(out)), dropped


# The staged tables of timed events (the profiler's own spans and overhead records too: they become rows of
# `profiler_overhead` and bound the recording), which `_clean` rids of events no time can be given.
_STAGES = ("_kin_gpu", "_kin_cpu", "_kin_py", "_kin_api", "_kin_span")


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = one(con, sql)
    return int(row[0]) if row and row[0] else 0


def _drop(con: duckdb.DuckDBPyConnection, cond: str, tables: tuple[str, ...] = _STAGES) -> int:
    """Delete the staged events matching `cond` from `tables` (every event table); how many there were."""
    n = 0
    for t in tables:
        k = _count(con, f"SELECT count(*) FROM {t} WHERE {cond}")
        if k:
            con.execute(f"DELETE FROM {t} WHERE {cond}")
            n += k
    return n


def _clean(con: duckdb.DuckDBPyConnection, path: Path, info: KinetoSource) -> None:
    """Leave out the events no time can be given (and count them), decide how `ts` is anchored (SPEC §3), and
    drop field values that are no values (NaN / infinite / negative FLOPs, shapes that are not lists)."""
    total = _count(con, "SELECT " + " + ".join(f"(SELECT count(*) FROM {s})" for s in _STAGES))
    left: dict[str, int] = {}

    def drop(reason: str, cond: str, tables: tuple[str, ...] = _STAGES) -> None:
        if n := _drop(con, cond, tables):
            left[reason] = left.get(reason, 0) + n

    drop("a missing, NaN or infinite ts/dur", "ts IS NULL OR NOT isfinite(ts) OR (dur IS NOT NULL AND NOT isfinite(dur))")
    drop("a negative duration", "dur < 0")
    # a GPU activity that names no GPU index (args.device, else the pid: missing, or no int32) cannot be placed on
    # a GPU: left out, not measured as a GPU of its own (fuzzing found a waterfall summing past 100% with one)
    drop("no GPU index (args.device, else the pid)", f"{emit.device_sql()} IS NULL", ("_kin_gpu",))
    drop("a time out of range", f"abs(ts) > {MAX_ABS_TS_US} OR coalesce(dur, 0) > {MAX_ABS_TS_US}")
    base = info.base_time_ns
    parts = " UNION ALL ".join(f"SELECT ts FROM {s}" for s in _STAGES)
    # Whether most events are epoch µs: counted, not a median (a median holds every ts at once, beyond any memory
    # limit: the 4 GiB Kineto trace's 15 M events ran DuckDB out of memory under --memory-budget 1GiB)
    most = one(con, f"SELECT count(*) FILTER (WHERE ts > {EPOCH_US_THRESHOLD}) * 2 > count(ts) FROM ({parts})")
    if base is None:
        info.base_time_ns = 0
        if most and most[0]:
            info.clock_anchor = "epoch_us"
            # most events are epoch µs: one that is not is no time of this trace
            drop("a time that is not epoch µs like the rest", f"ts <= {EPOCH_US_THRESHOLD}")
        else:
            info.clock_anchor = "relative"
            info.notes.append("no baseTimeNanoseconds and ts is not epoch µs: times are relative, not UTC")
    elif not 0 < base < TIME_LIMIT_NS:
        raise BadInput(path, f"baseTimeNanoseconds {base} is no time (before 1970 or beyond int64 ns)")
    if info.clock_anchor != "relative":
        # UTC ns must be after 1970 and fit in int64 with room for differences
        b = int(info.base_time_ns or 0)
        drop(
            "a UTC time before 1970 or beyond 2116",
            f"{b}::DOUBLE + ts * 1000 < 0 OR {b}::DOUBLE + (ts + coalesce(dur, 0)) * 1000 >= {float(TIME_LIMIT_NS)}",
        )
    flops_bad = _count(con, "SELECT count(*) FROM _kin_cpu WHERE flops IS NOT NULL AND (NOT isfinite(flops) OR flops < 0)")
    if flops_bad:
        con.execute("UPDATE _kin_cpu SET flops = NULL WHERE flops IS NOT NULL AND (NOT isfinite(flops) OR flops < 0)")
        info.notes.append(f"{flops_bad} ops' 'flops' left out (NaN, infinite or negative)")
    shapes_bad = _count(con, "SELECT count(*) FROM _kin_cpu WHERE bad_shapes")
    if shapes_bad:
        info.notes.append(f"{shapes_bad} ops' 'Input Dims' / 'Input type' left out (not lists)")
    read = ", ".join(f"'{c}'" for c in schema.GPU_CATS + schema.CPU_CATS + schema.API_CATS)
    nameless = _count(con, f"SELECT sum(nameless) FROM _kin_cats WHERE cat IN ({read})")
    if nameless:
        left["no name"] = nameless
    if left:
        n_left = sum(v for k, v in left.items() if k != "no name")
        if total and n_left >= total:
            raise BadInput(path, "no event has a usable time (" + ", ".join(f"{n} with {r}" for r, n in left.items()) + ")")
        info.notes.append("events left out: " + ", ".join(f"{n} with {r}" for r, n in left.items()))


# The host-side staging tables whose events are cut to the recording: ops and annotations, Python frames. (Runtime
# calls are recorded by the GPU tracer with the GPU activities: they bound the recording, as those do.)
_HOST_STAGES = ("_kin_cpu", "_kin_py")
_RANGE_STAGE = "_kin_cpu"  # (the staging table of ranges: it gets a `cut` column when one is cut)
_IS_RANGE = {"_kin_cpu": "cat = 'user_annotation' OR name LIKE 'ProfilerStep#%'", "_kin_py": "false"}
# How far past the recording's edges an event may reach and still be inside it (µs): the Python frames that close
# with the profiler end on its span's end, but `ts + dur` of µs floats at epoch magnitude is off by ~1 ns, and
# older torch writes whole µs.
_EDGE_US = 1.0


def _clip_to_recording(con: duckdb.DuckDBPyConnection, info: KinetoSource) -> bool | None:
    """Cut the host events to when the profiler recorded. A range can close long after the profiler stopped (the
    last `ProfilerStep#N` of a torch.compile run, seconds later at exit): its time past the recording holds no
    recorded GPU work or runtime call, and measured whole it read as seconds of idle GPU waiting on a sync.

    The recording: the profiler's `PyTorch Profiler (N)` spans (`_kin_span`; several in one file: their hull),
    widened to every GPU activity and runtime call. Ops, annotations and Python frames reaching outside are cut to
    it, those wholly outside left out; each kind is said once in the source's notes (cut ranges also in the
    verdict's: a step's time changes). A trace without a span is left as it is: traces that lack one are often cut
    out of longer ones by a splitter (an iteration kept whole: its annotation and first Python frames begin before
    its first op or launch), where the recorded events bound nothing. True when `_kin_cpu` got the `cut` column
    (some event of it was cut), False when nothing reached outside the recording, None without a span (whether a
    range was cut is unknown)."""
    row = one(
        con,
        """SELECT min(s), max(e) FROM (
               SELECT ts AS s, ts + dur AS e, true AS span FROM _kin_span
               WHERE cat = 'trace' AND name LIKE 'PyTorch Profiler%' AND isfinite(ts) AND dur > 0
               UNION ALL SELECT ts, ts + coalesce(dur, 0), false FROM _kin_gpu
               WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')
               UNION ALL SELECT ts, ts + coalesce(dur, 0), false FROM _kin_api)
           WHERE isfinite(s) AND isfinite(e)
           HAVING bool_or(span)""",
    )
    if not row or row[0] is None:
        return None
    lo, hi = float(row[0]) - _EDGE_US, float(row[1]) + _EDGE_US
    if not (math.isfinite(lo) and math.isfinite(hi)):  # times at the edge of a double: they bound nothing
        return None
    outside = f"(ts + coalesce(dur, 0) > {hi!r} OR ts < {lo!r})"
    gone_if = f"{outside} AND (ts >= {hi!r} OR ts + coalesce(dur, 0) <= {lo!r})"
    events = " UNION ALL ".join(
        f"SELECT replace(coalesce(name, '(unnamed)'), '; ', ', ') AS name, {_IS_RANGE[t]} AS is_range, "
        f"greatest({lo!r} - ts, 0) AS before, greatest(ts + coalesce(dur, 0) - {hi!r}, 0) AS after, {gone_if} AS gone "
        f"FROM {t} WHERE {outside}"
        for t in _HOST_STAGES
    )
    # per kind (ranges, the rest): how many reached outside and how many were wholly outside, and the three names
    # that reached farthest (per name: how many, how far before the start and past the end)
    found = con.execute(f"""
        SELECT is_range, name, n, before, after, sum(n) OVER k AS total, sum(gone) OVER k AS total_gone FROM (
            SELECT is_range, name, count(*) AS n, max(before) AS before, max(after) AS after,
                   count(*) FILTER (WHERE gone) AS gone
            FROM ({events}) GROUP BY ALL)
        WINDOW k AS (PARTITION BY is_range)
        QUALIFY row_number() OVER (PARTITION BY is_range ORDER BY greatest(before, after) DESC, name) <= 3
        ORDER BY is_range DESC, greatest(before, after) DESC, name""").fetchall()
    if not found:
        return False
    for t in _HOST_STAGES:
        con.execute(f"DELETE FROM {t} WHERE {gone_if}")
        # (the ranges among them say so: `ranges.cut`, and the steps they are)
        flag = ""
        if t == _RANGE_STAGE:
            con.execute(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS cut BOOLEAN")
            flag = ", cut = true"
        con.execute(
            f"UPDATE {t} SET ts = greatest(ts, {lo!r}), dur = least(ts + coalesce(dur, 0), {hi!r}) - greatest(ts, {lo!r})"
            f"{flag} WHERE {outside}"
        )
    for ranges in (True, False):
        these = [f for f in found if bool(f[0]) == ranges]
        if not these:
            continue
        total, gone = int(these[0][5]), int(these[0][6])
        said = ", ".join(
            f"{name}{f' ×{n}' if n > 1 else ''} "
            + " and ".join(
                ([f"began {'up to ' if n > 1 else ''}{_us(before)} before it"] if before > 0 else [])
                + ([f"ended {'up to ' if n > 1 else ''}{_us(after)} after it"] if after > 0 else [])
            )
            for _, name, n, before, after, _, _ in these
        )
        plural = "s" if total > 1 else ""
        what = f"{total} range{plural}" if ranges else f"{total} host event{plural} (ops, Python frames)"
        left_out = f", {gone} wholly outside left out" if gone else ""
        info.notes.append(
            f"{what} reached {vocab.OUTSIDE_RECORDING_MARK} of the profiler (its PyTorch Profiler span, widened to "
            f"the GPU activities and runtime calls): {said}. Cut to it{left_out}: no GPU "
            "activity or runtime call was recorded outside it"
            + (f", so {vocab.CUT_RANGES_MARK} (a lower bound on its whole time)" if ranges else "")
        )
    return True


def _us(us: float) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} µs"


def _devices(con: duckdb.DuckDBPyConnection, head: schema.Head, info: KinetoSource) -> list[DeviceRow]:
    """The `devices` rows: the properties of every device id GPU work ran on (schema.map_devices); a GPU the
    trace does not name (or names generically) is identified from its properties (parsers.gpus)."""
    used = [
        int(d)
        for (d,) in con.execute(
            f"SELECT DISTINCT {emit.device_sql()} AS d FROM _kin_gpu WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') "
            "AND name IS NOT NULL AND d IS NOT NULL AND d BETWEEN 0 AND 2147483647"
        ).fetchall()
    ]
    rows, notes = schema.map_devices(used, head.devices, head.rocm)
    info.notes += notes
    out, said = [], set()
    for r in rows:
        name, note = gpus.name_from_properties(r.name, r.vendor, r.compute_capability, r.sm_count, r.memory_bytes)
        if note and note not in said:
            said.add(note)
            info.notes.append(f"device {r.device}: {note}")
        out.append(DeviceRow(r.device, name, r.sm_count, r.memory_bytes, r.compute_capability, r.vendor))
    return out


FORMATS = (
    Format("kineto", "PyTorch profiler trace", ingest),
    Format("json-other", "JSON of another tool", None, refusal="json-other"),
)
