"""trace.pftrace decoded independently of the writer (the `perfetto` package's protobuf classes and the
semantics of perfetto_trace.proto: interning per sequence, slices as begin/end pairs per track) and checked
against the store it was written from: every kernel, op, CUDA call, Python frame, range, collective, loss
stretch and counter sample is there once, with its times, name and arguments; flows join each launch to its
kernel and each collective across ranks; counters of different logs are on separate tracks, in %."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from plasmient_report import pipeline, store
from plasmient_report.render import perfetto

from .conftest import corpus_file, counter_value

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
TE = pb.TrackEvent


@dataclass
class Decoded:
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)  # track, start, end, name, args, flows, terms
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))

    def path(self, uuid: int) -> str:
        d = self.tracks[uuid]
        name = d.process.process_name if d.HasField("process") else d.name
        return f"{self.path(d.parent_uuid)}/{name}" if d.parent_uuid in self.tracks else name

    def under(self, prefix: str) -> list[dict[str, Any]]:
        return [s for s in self.slices if self.path(s["track"]).startswith(prefix)]


def decode(path: Path) -> Decoded:
    """Read a trace as Perfetto's trace processor does, for what we write: interned names per packet
    sequence (cleared by SEQ_INCREMENTAL_STATE_CLEARED), begin/end pairs per track in file order, counter
    values per track. A sequence's defaults (TracePacketDefaults: the clock of its timestamps, a counter's track)
    and its own clocks (ClockSnapshot) are resolved as the trace processor's sources do: the defaults are parsed
    after the clearing and before the timestamp (proto_trace_reader.cc); a snapshot sets each of its clocks at its
    time (clock_synchronizer.cc), an incremental clock's timestamp adds to its last time (ToNs,
    clock_synchronizer.h) and is converted to the trace's clock through the snapshot; a counter without a track
    takes the defaults' (track_event_tokenizer.cc). Fails on anything inconsistent: unknown tracks or names, ends
    without a begin, a track going back in time, unclosed slices, a clock without a snapshot."""
    trace = pb.Trace()
    trace.ParseFromString(Path(path).read_bytes())
    out = Decoded()
    names: dict[int, dict[int, str]] = defaultdict(dict)
    arg_names: dict[int, dict[int, str]] = defaultdict(dict)
    open_: dict[int, list[dict[str, Any]]] = defaultdict(list)
    last_ts: dict[int, int] = {}
    defaults: dict[int, pb.TracePacketDefaults] = {}
    clocks: dict[tuple[int, int], dict[str, Any]] = {}  # (sequence, clock id 64-127) -> last time, incremental, to BOOTTIME
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names[seq].clear()
            arg_names[seq].clear()
            defaults.pop(seq, None)
        if p.HasField("trace_packet_defaults"):
            defaults[seq] = p.trace_packet_defaults
        for e in p.interned_data.event_names:
            names[seq][e.iid] = e.name
        for e in p.interned_data.debug_annotation_names:
            arg_names[seq][e.iid] = e.name
        if p.HasField("clock_snapshot"):
            at = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert set(at) - {6} and 6 in at, "a snapshot of a sequence's clock against BOOTTIME (the trace's clock)"
            for cid, c in at.items():
                if cid != 6:
                    assert 64 <= cid < 128
                    clocks[(seq, cid)] = {"last": c.timestamp, "inc": c.is_incremental, "offset": at[6].timestamp - c.timestamp}
            continue
        if p.HasField("track_descriptor"):
            assert p.track_descriptor.uuid not in out.tracks, "a track declared twice"
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        ev, ts = p.track_event, p.timestamp
        d = defaults.get(seq)
        clock = p.timestamp_clock_id or (d.timestamp_clock_id if d is not None else 0)
        if clock not in (0, 6):
            c = clocks[(seq, clock)]  # (KeyError: a sequence clock never defined)
            if c["inc"]:
                c["last"] += ts
                ts = c["last"]
            ts += c["offset"]
        track = ev.track_uuid if ev.HasField("track_uuid") else None
        if track is None and d is not None and d.track_event_defaults.HasField("track_uuid"):
            track = d.track_event_defaults.track_uuid
        assert track is not None, "an event without a track"
        if not ev.HasField("track_uuid"):
            ev.track_uuid = track  # (resolved: what follows reads the event's track)
        assert ev.track_uuid in out.tracks, "event on an undeclared track"
        assert ts >= last_ts.get(ev.track_uuid, 0), "a track goes back in time"
        last_ts[ev.track_uuid] = ts
        if ev.type == TE.TYPE_SLICE_BEGIN:
            args = {}
            for a in ev.debug_annotations:
                args[arg_names[seq][a.name_iid]] = getattr(a, a.WhichOneof("value"))
            open_[ev.track_uuid].append(
                {
                    "track": ev.track_uuid,
                    "start": ts,
                    "name": names[seq][ev.name_iid],
                    "args": args,
                    "flows": list(ev.flow_ids),
                    "terms": list(ev.terminating_flow_ids),
                }
            )
        elif ev.type == TE.TYPE_SLICE_END:
            assert open_[ev.track_uuid], "an end without a begin: the track does not nest"
            s = open_[ev.track_uuid].pop()
            s["end"] = ts
            out.slices.append(s)
        elif ev.type == TE.TYPE_COUNTER:
            assert out.tracks[ev.track_uuid].HasField("counter")
            out.counters[ev.track_uuid].append((ts, counter_value(ev)))
    assert not any(open_.values()), "unclosed slices"
    return out


def build(paths: list[Path], tmp_path: Path, **kw: Any) -> tuple[pipeline.Result, Decoded, dict[str, int]]:
    res = pipeline.analyse(paths, pipeline.Options(**kw))
    out = tmp_path / "trace.pftrace"
    stats = perfetto.write(res.con, res.verdict, out)
    return res, decode(out), stats


def rows(con: Any, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    return con.execute(sql, params or []).fetchall()


def test_field_numbers_are_perfettos() -> None:
    """The bulk encoder writes field numbers by hand: they must be those of perfetto_trace.proto."""
    f = {
        m.DESCRIPTOR.name: {x.name: x.number for x in m.DESCRIPTOR.fields}
        for m in (pb.Trace, pb.TracePacket, pb.TrackEvent, pb.DebugAnnotation, pb.InternedData, pb.EventName)
    }
    assert perfetto.F_TRACE_PACKET == f["Trace"]["packet"]
    assert (
        perfetto.F_PKT_TIMESTAMP,
        perfetto.F_PKT_SEQ_ID,
        perfetto.F_PKT_TRACK_EVENT,
        perfetto.F_PKT_INTERNED,
        perfetto.F_PKT_FLAGS,
    ) == tuple(
        f["TracePacket"][k] for k in ("timestamp", "trusted_packet_sequence_id", "track_event", "interned_data", "sequence_flags")
    )
    assert (
        perfetto.F_EV_ANNOTATION,
        perfetto.F_EV_TYPE,
        perfetto.F_EV_NAME_IID,
        perfetto.F_EV_TRACK_UUID,
        perfetto.F_EV_COUNTER,
        perfetto.F_EV_DOUBLE_COUNTER,
        perfetto.F_EV_FLOW,
        perfetto.F_EV_TERMINATING_FLOW,
    ) == tuple(
        f["TrackEvent"][k]
        for k in (
            "debug_annotations",
            "type",
            "name_iid",
            "track_uuid",
            "counter_value",
            "double_counter_value",
            "flow_ids",
            "terminating_flow_ids",
        )
    )
    assert (perfetto.F_ANN_NAME_IID, perfetto.F_ANN_INT, perfetto.F_ANN_DOUBLE, perfetto.F_ANN_STRING) == tuple(
        f["DebugAnnotation"][k] for k in ("name_iid", "int_value", "double_value", "string_value")
    )
    assert (perfetto.F_INTERNED_EVENT_NAMES, perfetto.F_INTERNED_ANNOTATION_NAMES) == (
        f["InternedData"]["event_names"],
        f["InternedData"]["debug_annotation_names"],
    )
    assert (perfetto.F_NAME_IID, perfetto.F_NAME_NAME) == (f["EventName"]["iid"], f["EventName"]["name"])
    assert perfetto.F_PKT_TRACK_DESCRIPTOR == f["TracePacket"]["track_descriptor"]
    td = {x.name: x.number for x in pb.TrackDescriptor.DESCRIPTOR.fields}
    assert (
        perfetto.F_TD_UUID,
        perfetto.F_TD_NAME,
        perfetto.F_TD_PROCESS,
        perfetto.F_TD_PARENT,
        perfetto.F_TD_COUNTER,
        perfetto.F_TD_CHILD_ORDERING,
        perfetto.F_TD_ORDER,
    ) == tuple(td[k] for k in ("uuid", "name", "process", "parent_uuid", "counter", "child_ordering", "sibling_order_rank"))
    pd = {x.name: x.number for x in pb.ProcessDescriptor.DESCRIPTOR.fields}
    assert (perfetto.F_PROCESS_PID, perfetto.F_PROCESS_NAME) == (pd["pid"], pd["process_name"])
    assert perfetto.F_COUNTER_UNIT_NAME == pb.CounterDescriptor.DESCRIPTOR.fields_by_name["unit_name"].number
    assert (perfetto.BEGIN, perfetto.END, perfetto.COUNTER) == (TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_COUNTER)
    assert (perfetto.STATE_CLEARED, perfetto.NEEDS_STATE) == (
        pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED,
        pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE,
    )
    assert perfetto.EXPLICIT_ORDER == pb.TrackDescriptor.EXPLICIT
    # a counter track's own sequence (Writer.counter_sequence): its defaults and its incremental clock
    assert (perfetto.F_PKT_CLOCK_SNAPSHOT, perfetto.F_PKT_DEFAULTS) == (
        f["TracePacket"]["clock_snapshot"],
        f["TracePacket"]["trace_packet_defaults"],
    )
    dd = pb.TracePacketDefaults.DESCRIPTOR.fields_by_name
    assert (perfetto.F_DEF_TRACK_EVENT, perfetto.F_DEF_CLOCK_ID) == (
        dd["track_event_defaults"].number,
        dd["timestamp_clock_id"].number,
    )
    assert perfetto.F_TED_TRACK_UUID == pb.TrackEventDefaults.DESCRIPTOR.fields_by_name["track_uuid"].number
    assert perfetto.F_CS_CLOCKS == pb.ClockSnapshot.DESCRIPTOR.fields_by_name["clocks"].number
    ck = pb.ClockSnapshot.Clock.DESCRIPTOR.fields_by_name
    assert (perfetto.F_CLK_ID, perfetto.F_CLK_TS, perfetto.F_CLK_INCREMENTAL) == (
        ck["clock_id"].number,
        ck["timestamp"].number,
        ck["is_incremental"].number,
    )
    assert perfetto.CLOCK_BOOTTIME == pb.BUILTIN_CLOCK_BOOTTIME and 64 <= perfetto.CLOCK_SERIES < 128  # sequence-scoped


def test_single_gpu_trace_has_every_event_of_the_store(tmp_path: Path) -> None:
    res, tr, stats = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    con = res.con
    # Layers: one process per rank, the six layer tracks under it.
    proc = perfetto.uuid_of("rank", 0)
    assert tr.tracks[proc].HasField("process")
    assert {d.name for d in tr.tracks.values() if d.parent_uuid == proc} == set(perfetto.LAYERS)
    # Kernels: on their stream's tracks, each once, with the store's times, name and kind.
    want = Counter(rows(con, "SELECT device, stream, start_ns, greatest(end_ns, start_ns), name, kind FROM kernels"))
    got = Counter()
    for s in tr.under(f"{tr.path(proc)}/kernel/"):
        track = tr.path(s["track"]).rsplit("/", 1)[1].split(" (overlap")[0]
        dev, stream = (int(x) for x in track.removeprefix("GPU ").split(" stream "))
        got[(dev, stream, s["start"], s["end"], s["name"], s["args"].get("kind"))] += 1
    assert got == want and stats["kernels"] == sum(want.values()) > 1000
    # Ops, CUDA calls and Python frames: on their CPU thread's tracks.
    want = Counter(
        rows(
            con,
            """
        SELECT thread, start_ns, greatest(end_ns, start_ns), name FROM ops
        UNION ALL SELECT thread, start_ns, greatest(end_ns, start_ns), name FROM api_calls
        UNION ALL SELECT thread, start_ns, greatest(end_ns, start_ns), name FROM ranges WHERE domain = 'python'""",
        )
    )
    got = Counter()
    for s in tr.under(f"{tr.path(proc)}/op/"):
        tid = int(tr.path(s["track"]).rsplit("/", 1)[1].split(" (overlap")[0].removeprefix("CPU thread "))
        got[(tid, s["start"], s["end"], s["name"])] += 1
    assert got == want
    # Ranges (record_function / NVTX), CPU side and GPU side.
    want = Counter(
        rows(
            con,
            "SELECT on_gpu, start_ns, greatest(end_ns, start_ns), coalesce(name, '?'), domain "
            "FROM ranges WHERE domain IS DISTINCT FROM 'python'",
        )
    )
    got = Counter(
        (" on the GPU" in tr.path(s["track"]), s["start"], s["end"], s["name"], s["args"].get("domain"))
        for s in tr.under(f"{tr.path(proc)}/model/")
    )
    assert got == want


def test_kernel_arguments_follow_the_store(tmp_path: Path) -> None:
    """A kernel slice's class, bound, achieved % and arithmetic intensity are the measure stage's kernel_class
    row (one definition, never recomputed here); FLOPs and copy bytes the kernel's."""
    res, tr, _ = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    by_key = {
        (s, e, n): rest
        for s, e, n, *rest in rows(
            res.con,
            """
        SELECT k.start_ns, greatest(k.end_ns, k.start_ns), k.name, k.kind, k.flops, k.bytes, c.class, c.bound,
               c.fraction_of_peak, c.arithmetic_intensity
        FROM kernels k JOIN kernel_class c USING (kernel_id)""",
        )
    }
    seen = Counter()
    for s in tr.under("rank 0"):
        if "/kernel/" not in tr.path(s["track"]):
            continue
        kind, flops, nbytes, cls, bound, frac, ai = by_key[(s["start"], s["end"], s["name"])]
        a = s["args"]
        assert a["kind"] == kind and a.get("class") == cls and a.get("bound") == bound
        seen[cls] += 1
        if flops:
            seen["flops"] += 1
            assert a["flops"] == pytest.approx(flops, rel=1e-12)
            if frac is not None:
                assert a["achieved_pct_of_peak"] == pytest.approx(100 * frac, abs=0.006)
            if ai is not None:
                assert a["arithmetic_intensity"] == pytest.approx(ai, abs=0.006)
        else:
            assert "flops" not in a and "achieved_pct_of_peak" not in a
        if nbytes and kind in ("memcpy", "memset"):
            seen["bytes"] += 1
            assert a["bytes"] == pytest.approx(nbytes)
    assert seen["flops"] > 100 and seen["compute"] > 10 and seen["memory"] > 10 and seen["bytes"] > 10, seen


def test_every_launch_flows_to_its_kernel(tmp_path: Path) -> None:
    res, tr, _ = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    corr_of_kernel = {
        (s, e, n): c
        for s, e, n, c in rows(res.con, "SELECT start_ns, greatest(end_ns, start_ns), name, correlation FROM kernels")
    }
    starts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in tr.slices:
        for f in s["flows"]:
            starts[f].append(s)
        for f in s["terms"]:
            ends[f].append(s)
    launched = rows(
        res.con,
        "SELECT count(DISTINCT (source_id, correlation)) FROM kernels k WHERE EXISTS ("
        "SELECT 1 FROM api_calls a WHERE a.source_id = k.source_id "
        "AND a.correlation = k.correlation)",
    )[0][0]
    assert len(starts) == launched > 1000
    assert set(ends) == set(starts), "a flow without both ends"
    for f, (launch,) in starts.items():
        assert "/op/" in tr.path(launch["track"])
        for kernel in ends[f]:  # the kernel of that launch: the same correlation id
            assert corr_of_kernel[(kernel["start"], kernel["end"], kernel["name"])] == launch["args"]["correlation"]


def test_two_rank_trace_links_collectives(tmp_path: Path) -> None:
    res, tr, stats = build([corpus_file("h200x2-small/kineto")], tmp_path)
    procs = sorted(d.process.process_name.split(" · ")[0] for d in tr.tracks.values() if d.HasField("process"))
    assert procs == ["rank 0", "rank 1"]
    for rank in (0, 1):
        assert {d.name for d in tr.tracks.values() if d.parent_uuid == perfetto.uuid_of("rank", rank)} == set(perfetto.LAYERS)
    colls = [s for s in tr.slices if "/cluster/" in tr.path(s["track"])]
    assert Counter((s["start"], s["end"], s["name"]) for s in colls) == Counter(
        rows(res.con, "SELECT start_ns, greatest(end_ns, start_ns), coalesce(collective, 'collective') FROM collectives")
    )
    by_flow: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in colls:
        for f in s["flows"]:
            by_flow[f].append(s)
    n_coll = rows(
        res.con,
        "SELECT count(*) FROM (SELECT 1 FROM collectives GROUP BY "
        "coalesce(process_group, group_ranks, ''), collective, seq HAVING count(*) > 1)",
    )[0][0]
    assert len(by_flow) == n_coll > 0 and stats["collective_flows"] == sum(len(v) for v in by_flow.values())
    for group in by_flow.values():  # one collective: the same op, sequence number and group on both ranks
        assert len({tr.path(s["track"]).split("/")[0] for s in group}) == 2
        assert len({(s["name"], s["args"].get("seq"), s["args"].get("process_group")) for s in group}) == 1


def test_verdict_layer_matches_the_losses(tmp_path: Path) -> None:
    res, tr, _ = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    values = tr.counters[perfetto.uuid_of("achieved", 0, 0)]
    assert values and all(0.0 <= v <= 100.0 for _, v in values)
    assert tr.tracks[perfetto.uuid_of("achieved", 0, 0)].counter.unit_name == "%"
    lost = [s for s in tr.slices if tr.path(s["track"]).split("/")[1] == "verdict"]
    assert Counter((s["start"], s["end"], s["name"]) for s in lost) == Counter(
        rows(res.con, "SELECT start_ns, end_ns, category FROM losses WHERE scope = 'window' AND end_ns > start_ns")
    )
    total = rows(res.con, "SELECT sum(lost_ns) FROM losses WHERE scope = 'window' AND end_ns > start_ns")[0][0]
    assert sum(s["args"]["lost_ns"] for s in lost) == pytest.approx(total, rel=1e-9)
    # the counter: 100 − lost share of each stretch, at its start
    first = rows(
        res.con, "SELECT start_ns, end_ns, lost_ns FROM losses WHERE scope = 'window' ORDER BY start_ns, end_ns DESC LIMIT 1"
    )[0]
    assert (first[0], pytest.approx(max(0.0, 100 * (1 - first[2] / (first[1] - first[0]))))) in values


def test_counters_of_each_log_on_their_own_track_in_percent(tmp_path: Path) -> None:
    """Three logs of the same GPU (nvidia-smi dmon, nvidia-smi query, NVML) each give gpu_util: three tracks,
    each in time order with its own log's samples (never interleaved), utilisations in %."""
    d = SAMPLES / "h200_align"
    res, tr, _ = build(
        [d / "kineto_bursts.pt.trace.json.gz", d / "nvidia_smi_dmon.txt", d / "nvidia_smi_query.csv", d / "nvml_samples.csv"],
        tmp_path,
    )
    counter_tracks = {u: t for u, t in tr.tracks.items() if t.HasField("counter") and "achieved" not in t.name}
    series = rows(
        res.con,
        "SELECT c.source_id, s.format, c.metric, c.end_ns, c.value FROM counters c "
        "JOIN sources s USING (source_id) WHERE c.rank = 0 AND c.value IS NOT NULL "
        "ORDER BY c.source_id, c.metric, c.end_ns",
    )
    want: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for _, fmt, metric, t, v in series:
        want[(fmt, metric)].append((t, v))
    got = {}
    for u, t in counter_tracks.items():
        fmt = t.name.rsplit(" · ", 1)[1]
        metric = t.name.split(" ")[2]
        got[(fmt, metric)] = (t.counter.unit_name, tr.counters[u])
    assert set(got) == set(want)
    util = [k for k in got if k[1] == "gpu_util"]
    assert len(util) == 3, util
    for key, samples in want.items():
        unit, values = got[key]
        scale = 100.0 if unit == "%" else 1.0
        assert [t for t, _ in values] == [t for t, _ in samples]
        assert [v for _, v in values] == pytest.approx([v * scale for _, v in samples])
    for key in util:
        assert got[key][0] == "%" and max(v for _, v in got[key][1]) > 1.0  # percent, not a fraction
    assert got[("nvidia-smi-dmon", "power_w")][0] == "W" and got[("nvidia-smi-dmon", "sm_clock_mhz")][0] == "MHz"


def test_nsys_gpu_metrics_in_percent(tmp_path: Path) -> None:
    res, tr, _ = build([corpus_file("h200-single-nsys/nsys_workload.sqlite")], tmp_path)
    units = {t.name.split(" ")[2]: t.counter.unit_name for t in tr.tracks.values() if t.HasField("counter")}
    assert units["sm_active"] == units["tensor_active"] == units["compute_warps_in_flight"] == "%"
    assert units["sm_clock_mhz"] == "MHz" and units["compute_warps_in_flight_avg"] == "warps"
    n = rows(res.con, "SELECT count(*) FROM counters WHERE rank = 0 AND value IS NOT NULL")[0][0]
    samples = sum(len(v) for u, v in tr.counters.items() if "achieved" not in tr.tracks[u].name)
    assert samples == n > 400_000


def test_negative_times_are_lifted_not_refused(tmp_path: Path) -> None:
    """Times before 1970 in the store (issue 15: they made the writer fail): Perfetto timestamps are unsigned,
    so the whole trace moves up by one constant and still lines up; the process name says so."""
    con = store.connect()
    con.execute(
        "INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, name, kind, "
        "correlation) VALUES (0, 0, 0, 0, 7, -5000, -1000, 'gemm', 'compute', 1), "
        "(1, 0, 0, 0, 7, 2000, 3000, 'copy', 'memcpy', 2)"
    )
    con.execute(
        "INSERT INTO api_calls (source_id, rank, thread, start_ns, end_ns, name, correlation) "
        "VALUES (0, 0, 1, -9000, -8000, 'cudaLaunchKernel', 1)"
    )
    con.execute(
        "INSERT INTO counters (source_id, rank, device, metric, start_ns, end_ns, value) "
        "VALUES (0, 0, 0, 'power_w', -20000, -10000, 300.0)"
    )
    out = tmp_path / "t.pftrace"
    stats = perfetto.write(con, {}, out)
    tr = decode(out)
    assert stats["time_shift_ns"] == 20000 - 10000  # the earliest time written (the counter sample at −10 µs)
    got = {s["name"]: (s["start"], s["end"]) for s in tr.slices}
    assert got == {"gemm": (5000, 9000), "copy": (12000, 13000), "cudaLaunchKernel": (1000, 2000)}
    assert [v for vs in tr.counters.values() for v in vs] == [(0, 300.0)]
    launch = next(s for s in tr.slices if s["name"] == "cudaLaunchKernel")
    gemm = next(s for s in tr.slices if s["name"] == "gemm")
    assert launch["flows"] == gemm["terms"] and launch["flows"]
    assert any("before 1970" in d.process.process_name for d in tr.tracks.values() if d.HasField("process"))


def _greedy_lanes(slices: list[tuple[int, int]]) -> list[int]:
    """The reference: each slice (in start, longer-first order) in the first lane where it nests in the open
    slice on top, or where nothing is open."""
    stacks: list[list[int]] = []
    lanes = []
    for s, e in slices:
        for i, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                lanes.append(i)
                break
        else:
            stacks.append([e])
            lanes.append(len(stacks) - 1)
    return lanes


def test_overlapping_slices_go_to_overflow_lanes() -> None:
    s = [(0, 10), (1, 3), (5, 15), (12, 20)]
    assert perfetto.assign_lanes([a for a, _ in s], [b for _, b in s]) == [0, 0, 1, 0]


def test_lanes_in_batches_equal_one_by_one_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels that overlap on one stream (nested, crossing, zero-length, equal times), written in batches of
    a few slices: every slice once, on the lane the one-by-one placement gives, each lane nesting."""
    rnd = random.Random(7)
    con = store.connect()
    kernels = []
    for stream in range(40):
        t = 0
        for _ in range(rnd.randint(1, 60)):
            t += rnd.choice([0, 0, 1, 3, 10])
            kernels.append((stream, 10**15 + t, 10**15 + t + rnd.choice([0, 1, 2, 5, 20, rnd.randint(0, 80)])))
    con.executemany(
        "INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, name, kind) "
        "VALUES (?, 0, 0, 0, ?, ?, ?, 'k' || ?, 'compute')",
        [(i, st, s, e, i % 3) for i, (st, s, e) in enumerate(kernels)],
    )
    monkeypatch.setattr(perfetto, "BATCH_ROWS", 3)
    out = tmp_path / "t.pftrace"
    perfetto.write(con, {}, out)
    tr = decode(out)
    lane_of = {}
    for s in tr.slices:
        name = tr.path(s["track"]).rsplit("/", 1)[1]
        base, _, lane = name.partition(" (overlap ")
        lane_of.setdefault((int(base.split(" stream ")[1]), s["start"], s["end"], s["name"]), []).append(
            int(lane.rstrip(")") or 0)
        )
    for stream in range(40):
        mine = sorted(((s, e, f"k{i % 3}") for i, (st, s, e) in enumerate(kernels) if st == stream), key=lambda x: (x[0], -x[1]))
        placed = [lane_of[(stream, *k)].pop() for k in mine]
        # ties (same start and end) are interchangeable: compare the lanes as multisets per (start, end)
        expect = _greedy_lanes([(s, e) for s, e, _ in mine])
        by_span: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
        for (s, e, _), lane in zip(mine, expect, strict=True):
            by_span[(s, e)][lane] += 1
        got_span: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
        for (s, e, _), lane in zip(mine, placed, strict=True):
            got_span[(s, e)][lane] += 1
        assert got_span == by_span
    assert all(not v for v in lane_of.values())


def test_counters_stored_out_of_order_are_written_in_time_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counter rows stream as stored; a series that goes back in time (found a few batches in, after packets
    were written) makes the writer start the counters over, sorted: every track still in time order, every
    sample once."""
    con = store.connect()
    con.execute(
        "INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, name, kind) "
        "VALUES (0, 0, 0, 0, 7, 10**15, 10**15 + 100, 'k', 'compute')"
    )
    con.execute("INSERT INTO sources (source_id, path, format) VALUES (1, 'a.csv', 'nvml-csv'), (2, 'b.txt', 'nvidia-smi-dmon')")
    rows_in = [(1 + (i % 2), "gpu_util" if i % 3 else "power_w", 10**15 + 1000 * i, (i % 10) / 10) for i in range(300)]
    rows_in[250], rows_in[10] = rows_in[10], rows_in[250]  # one sample stored late: its series goes back in time
    con.executemany(
        "INSERT INTO counters (source_id, rank, device, metric, start_ns, end_ns, value) VALUES (?, 0, 0, ?, ? - 1000, ?, ?)",
        [(s, m, t, t, v) for s, m, t, v in rows_in],
    )
    monkeypatch.setattr(perfetto, "BATCH_ROWS", 16)
    out = tmp_path / "t.pftrace"
    perfetto.write(con, {}, out)
    tr = decode(out)  # fails if a track goes back in time
    got = {tr.tracks[u].name: v for u, v in tr.counters.items()}
    for sid, fmt in ((1, "nvml-csv"), (2, "nvidia-smi-dmon")):
        for metric, unit, scale in (("gpu_util", "%", 100.0), ("power_w", "W", 1.0)):
            want = sorted((t, v * scale) for s, m, t, v in rows_in if s == sid and m == metric)
            have = got[f"GPU 0 {metric} ({unit}) · {fmt}"]
            assert [t for t, _ in have] == [t for t, _ in want]
            assert [v for _, v in have] == pytest.approx([v for _, v in want])


def test_order_check_of_counter_batches_is_per_series() -> None:
    """`_still_in_order` against a plain per-series reading of its definition: every series of the batch goes on
    in time order from its last time, and the last times move on — on batches in global time order (its fast
    path), interleaved series each in order but not globally, and series that go back in time."""
    import numpy as np

    rng = random.Random(7)
    for case in range(400):
        n, k = rng.randint(1, 40), rng.randint(1, 5)  # (batches are never empty)
        idx = [rng.randrange(k) for _ in range(n)]
        kind = case % 3
        if kind == 0:  # global time order (ties included)
            ts = sorted(rng.randint(0, 50) for _ in range(n))
        elif kind == 1:  # each series in order, the series shifted against each other
            step = {s: 0 for s in range(k)}
            ts = []
            for s in idx:
                step[s] += rng.randint(0, 3)
                ts.append(10 * s + step[s])
        else:  # anything
            ts = [rng.randint(0, 50) for _ in range(n)]
        last0 = [rng.choice([np.iinfo(np.int64).min, rng.randint(-5, 30)]) for _ in range(k)]
        want_last, ok = list(last0), True
        for s, t in zip(idx, ts, strict=True):
            if t < want_last[s]:
                ok = False
            want_last[s] = t
        last = np.array(last0, dtype=np.int64)
        got = perfetto._still_in_order(np.array(idx, dtype=np.int64), np.array(ts, dtype=np.int64), last)
        assert got == ok, (case, idx, ts, last0)
        if ok:
            assert last.tolist() == want_last, (case, idx, ts, last0)


@pytest.mark.skipif(perfetto._pbenc is None, reason="the native encoder is not built (no C compiler at install)")
@pytest.mark.parametrize(
    "inputs",
    [
        ["sample:h200_sync_stack/sync_stack.pt.trace.json.gz"],  # Python frames, flows, many lanes
        ["sample:h200x2_pipeline/m8/rank0.pt.trace.json.gz", "sample:h200x2_pipeline/m8/rank1.pt.trace.json.gz"],
        ["corpus:h200-single-nsys/nsys_workload.sqlite"],  # GPU-metric counters
    ],
)
def test_native_encoder_writes_the_numpy_encoders_bytes(inputs: list[str], tmp_path: Path, monkeypatch) -> None:
    """The native protobuf encoder (render/_pbenc.c) writes byte for byte the file the numpy one does."""
    from .conftest import sample_file

    paths = [sample_file(r[7:]) if r.startswith("sample:") else corpus_file(r[7:]) for r in inputs]
    res = pipeline.analyse(paths, pipeline.Options(write_html=False, write_trace=False))
    try:
        out = {}
        for native in (True, False):
            monkeypatch.setattr(perfetto, "NATIVE", native)
            out[native] = tmp_path / f"native-{native}.pftrace"
            perfetto.write(res.con, res.verdict, out[native])
        assert out[True].read_bytes() == out[False].read_bytes() and out[True].stat().st_size > 100_000
    finally:
        res.close()


@pytest.mark.skipif(perfetto._pbenc is None, reason="the native encoder is not built (no C compiler at install)")
def test_native_counter_records_are_the_numpy_ones() -> None:
    """One track's samples (`_counter_packets`) written by the native records writer and by numpy: the same bytes,
    with special values, integer values, and times the fixed layout cannot hold (the general encoder then); a time
    outside the layout given to the native writer is refused, not written short."""
    import numpy as np

    rng = np.random.default_rng(5)
    n = 5000
    t0 = 1_700_000_000_000_000_000  # ns since 1970: a 9-byte varint
    ts = t0 + np.cumsum(rng.integers(0, 200_000, n)).astype(np.int64)
    track = np.uint64(perfetto.uuid_of("counter", 2))
    values = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
    values[:4] = [np.nan, -0.0, np.inf, -np.inf]
    cases = [(ts, values), (ts, rng.integers(-5, 5, n)), (ts - t0, values), (ts[:0], values[:0])]
    for t, v in cases:
        native = bytes(perfetto._counter_packets(track, t, v))
        saved, perfetto.NATIVE = perfetto.NATIVE, False
        try:
            reference = bytes(perfetto._counter_packets(track, t, v))
        finally:
            perfetto.NATIVE = saved
        assert native == reference and (len(native) > 0) == (t.size > 0)
    rec = perfetto._counter_record()
    assert rec.dtype.fields is not None
    at = {k: rec.dtype.fields[k][1] for k in ("ts_lo", "tr_lo", "value")}
    with pytest.raises(ValueError):
        perfetto._pbenc.records(
            rec.template, (ts - t0).view(np.uint64), at["ts_lo"], np.array([track]), at["tr_lo"], values, at["value"]
        )


@pytest.mark.parametrize(
    "native",
    [
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                perfetto._pbenc is None, reason="the native encoder is not built (no C compiler at install)"
            ),
        ),
        False,
    ],
)
def test_series_packets_read_back_as_the_samples(native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A counter track's samples on a sequence of its own (`Writer.counter_sequence`, `_series_packets`): series
    interleaved, written batch after batch (each series' last time carried over), times 0 and as large as a
    varint holds, equal times, special values — decoded as the trace processor reads them (`decode`: the
    sequence's defaults and its incremental clock), every sample back on its track at its time with its value;
    each 10 kHz sample (a delta of 100 µs) takes 22 bytes. A series going back in time, or outside the series,
    is refused."""
    import numpy as np

    monkeypatch.setattr(perfetto, "NATIVE", native)
    rng = np.random.default_rng(11)
    k, n = 5, 20_000
    series = rng.integers(0, k, n).astype(np.int64)
    steps = rng.choice([0, 1, 100_000, 10**9, 10**15], size=n, p=[0.1, 0.1, 0.7, 0.05, 0.05]).astype(np.int64)
    ts = np.zeros(n, dtype=np.int64)
    for s in range(k):  # each series in time order (the series interleaved, not globally in order)
        at = np.flatnonzero(series == s)
        ts[at] = s * 7 + np.cumsum(steps[at])
    ts[np.flatnonzero(series == 0)[-1]] = (1 << 63) - 1  # (the largest time Perfetto's signed times hold)
    values = rng.normal(size=n)
    whole = rng.random(n) < 0.5  # whole numbers (counter_value) among the fractions (double_counter_value)
    values[whole] = rng.integers(-100, 1 << 20, whole.sum())
    values[:9] = [np.nan, -0.0, np.inf, 0.0, 2.0**53 - 1, 2.0**53, 2.0**63, -(2.0**53), 1e300]
    out = tmp_path / "series.pftrace"
    with open(out, "wb") as f:
        w = perfetto.Writer(f)
        tracks = [perfetto.uuid_of("s", s) for s in range(k)]
        seqs = []
        for s, t in enumerate(tracks):
            w.track(t, f"series {s}", counter="%")
            seqs.append(w.counter_sequence(t))
        last = np.zeros(k, dtype=np.uint64)
        cuts = [0, 1, 3000, 3001, 12_345, n]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            w.bulk(perfetto._series_packets(np.array(seqs, np.uint64), ts[a:b], values[a:b], series[a:b], last), b - a)
    assert perfetto.SEQ_ID not in seqs and len(set(seqs)) == k
    tr = decode(out)
    for s, t in enumerate(tracks):
        at = np.flatnonzero(series == s)
        got = tr.counters[t]
        assert [x for x, _ in got] == ts[at].tolist()
        np.testing.assert_array_equal(np.array([v for _, v in got]), values[at])  # (NaN where NaN)
        np.testing.assert_array_equal(np.signbit([v for _, v in got]), np.signbit(values[at]))  # (-0.0 as -0.0)
    assert last.tolist() == [int(ts[np.flatnonzero(series == s)[-1]]) for s in range(k)]

    def one(value: float) -> int:
        return len(
            perfetto._series_packets(
                np.array([1], np.uint64), np.array([100_000]), np.array([value]), np.array([0]), np.zeros(1, np.uint64)
            )
        )

    # 2 (packet tag, length) + 4 (timestamp: a 3-byte varint) + 2 (track_event's tag, length) + 2 (type) + the
    # value + 2 (sequence id): a double's tag and 8 bytes, or an integer's tag and varint (87: 1 byte, 2**53 - 1: 8)
    assert [one(v) for v in (0.5, -1.0, -0.0, 2.0**53, 87.0, 0.0, 2.0**53 - 1)] == [22, 22, 22, 22, 15, 15, 22]
    for bad_ts, bad_series in (([5, 4], [0, 0]), ([5], [1])):
        with pytest.raises(ValueError):
            perfetto._series_packets(
                np.array([1], np.uint64), np.array(bad_ts), np.ones(len(bad_ts)), np.array(bad_series), np.zeros(1, np.uint64)
            )


@pytest.mark.skipif(perfetto._pbenc is None, reason="the native encoder is not built (no C compiler at install)")
def test_native_series_packets_are_the_numpy_ones() -> None:
    """`_series_packets` natively and in numpy: the same bytes and the same last times, batch after batch."""
    import numpy as np

    rng = np.random.default_rng(3)
    k, n = 40, 50_000
    series = rng.integers(0, k, n).astype(np.int64)
    ts = np.zeros(n, dtype=np.int64)
    for s in range(k):
        at = np.flatnonzero(series == s)
        ts[at] = rng.integers(0, 10**18) + np.cumsum(rng.integers(0, 10**6, at.size))
    values = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
    whole = rng.random(n) < 0.5
    values[whole] = rng.integers(-(1 << 54), 1 << 54, whole.sum()) >> rng.integers(0, 55, whole.sum())  # all sizes
    values[:8] = [np.nan, -0.0, 0.0, np.inf, 2.0**53 - 1, 2.0**53, 7.0, 7.000000000000001]
    seqs = rng.integers(1, 1 << 40, k).astype(np.uint64)
    as_int = [int(v) for v in values if 0 <= v < 2**53 and v == int(v) and not np.signbit(v)]
    fractions = np.where(np.isin(values, as_int) & ~np.signbit(values), 0.5, values)  # the same samples, all doubles
    got = {}
    for native, vals in ((True, values), (False, values), ("doubles", fractions)):
        saved, perfetto.NATIVE = perfetto.NATIVE, native is True
        try:
            last = np.zeros(k, dtype=np.uint64)
            got[native] = (
                b"".join(
                    bytes(perfetto._series_packets(seqs, ts[a : a + 7000], vals[a : a + 7000], series[a : a + 7000], last))
                    for a in range(0, n, 7000)
                ),
                last.tolist(),
            )
        finally:
            perfetto.NATIVE = saved
    assert got[True] == got[False]
    # a whole value in [0, 2**53) goes as a varint: 8 - (its varint's bytes) shorter than a double, each
    assert len(as_int) > n // 8
    assert len(got["doubles"][0]) - len(got[True][0]) == sum(8 - max(1, -(-v.bit_length() // 7)) for v in as_int)


@pytest.mark.skipif(perfetto._pbenc is None, reason="the native encoder is not built (no C compiler at install)")
def test_native_encoder_of_random_messages() -> None:
    """Nested messages with masks, blobs taken by index, constants, varints of every size and fixed64 fields:
    the same bytes both ways."""
    rng = random.Random(3)
    import numpy as np

    for _ in range(200):
        n = rng.randrange(0, 40)
        blobs = perfetto.Blobs(
            np.frombuffer(bytes(rng.randrange(256) for _ in range(300)), np.uint8),
            np.sort(np.array([0, 300] + [rng.randrange(300) for _ in range(9)], np.int64)),
        )

        def mask(n: int = n) -> Any:
            return np.array([rng.random() < 0.6 for _ in range(n)], bool) if rng.random() < 0.5 else None

        inner = perfetto.Messages(n).varint(1, rng.randrange(2**40))
        inner.varint(2, np.array([rng.randrange(2 ** rng.randrange(1, 64)) for _ in range(n)], np.uint64), mask())
        inner.bytes(3, blobs, mask(), take=np.array([rng.randrange(10) for _ in range(n)], np.int64))
        outer = perfetto.Messages(n).fixed64(4, np.array([rng.random() for _ in range(n)]), mask())
        outer.message(5, inner, mask()).varint(6, np.array([rng.randrange(-(2**62), 2**62) for _ in range(n)], np.int64))
        top = perfetto.Messages(n).message(1, outer)
        native = top.encode()
        saved, perfetto.NATIVE = perfetto.NATIVE, False
        try:
            reference = perfetto.Messages(n).message(1, outer).encode()
        finally:
            perfetto.NATIVE = saved
        assert native.data.tobytes() == reference.data.tobytes()
        assert native.offsets.tolist() == reference.offsets.tolist()
