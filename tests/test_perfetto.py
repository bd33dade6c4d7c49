"""trace.pftrace parsed back from protobuf: every kernel a slice, nesting per track, flows with both ends,
the layer tracks per rank, counter values equal to the store."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from plasmient_report import pipeline
from plasmient_report.render import perfetto

from .conftest import corpus_file

BEGIN, END, COUNTER = perfetto.BEGIN, perfetto.END, perfetto.COUNTER


def build(paths, tmp_path, **kw):
    res = pipeline.analyse(list(paths), pipeline.Options(**kw))
    out = tmp_path / "trace.pftrace"
    stats = perfetto.write(res.con, res.verdict, out)
    return res, out, stats


def check_invariants(path):
    tracks, names, stacks = {}, {}, defaultdict(list)
    flows_out, flows_in = Counter(), Counter()
    slices_per_track = Counter()
    last_ts = defaultdict(int)
    for p in perfetto.read_back(path):
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d
            continue
        if not p.HasField("track_event"):
            continue
        ev = p.track_event
        assert ev.track_uuid in tracks, "event on an undeclared track"
        assert p.timestamp >= last_ts[ev.track_uuid], "events of one track out of order"
        last_ts[ev.track_uuid] = p.timestamp
        if ev.type == BEGIN:
            stacks[ev.track_uuid].append(p.timestamp)
            slices_per_track[ev.track_uuid] += 1
            assert ev.name_iid in names
            for f in ev.flow_ids:
                flows_out[f] += 1
            for f in ev.terminating_flow_ids:
                flows_in[f] += 1
        elif ev.type == END:
            assert stacks[ev.track_uuid], "END without BEGIN: slices do not nest"
            assert stacks[ev.track_uuid].pop() <= p.timestamp
    assert all(not s for s in stacks.values()), "unclosed slices"
    return tracks, names, slices_per_track, flows_out, flows_in


def test_single_gpu_trace_round_trips(tmp_path):
    res, out, stats = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    tracks, names, per_track, flows_out, flows_in = check_invariants(out)
    n_kernels = res.con.execute("SELECT count(*) FROM kernels").fetchall()[0][0]
    kernel_tracks = [u for u, d in tracks.items() if d.name.startswith("GPU ") and " stream " in d.name]
    assert sum(per_track[u] for u in kernel_tracks) == n_kernels == stats["kernels"]
    # every launch flow ends on a kernel, every kernel's terminating flow starts at a launch
    launches = set(flows_out)
    assert set(flows_in) <= launches and all(n == 1 for n in flows_in.values())
    assert len(set(flows_in) & launches) == res.con.execute(
        "SELECT count(DISTINCT (source_id, correlation)) FROM kernels k WHERE EXISTS (SELECT 1 FROM api_calls a "
        "WHERE a.source_id = k.source_id AND a.correlation = k.correlation)").fetchall()[0][0]
    layer_names = {d.name for d in tracks.values() if d.parent_uuid == perfetto.uuid_of("rank", 0)}
    assert layer_names == set(perfetto.LAYERS)


def test_two_rank_trace_links_collectives(tmp_path):
    res, out, _ = build([corpus_file("h200x2-small/kineto")], tmp_path)
    tracks, names, per_track, flows_out, flows_in = check_invariants(out)
    procs = [d for d in tracks.values() if d.HasField("process")]
    assert sorted(d.process.process_name.split(" · ")[0] for d in procs) == ["rank 0", "rank 1"]
    for rank in (0, 1):
        kids = {d.name for d in tracks.values() if d.parent_uuid == perfetto.uuid_of("rank", rank)}
        assert kids == set(perfetto.LAYERS)
    # the same collective on both ranks shares one flow id: it appears on two slices
    n_coll = res.con.execute("SELECT count(DISTINCT (collective, seq)) FROM collectives").fetchall()[0][0]
    coll_flows = [f for f, n in flows_out.items() if n == 2]
    assert len(coll_flows) == n_coll > 0


def test_verdict_counter_matches_losses(tmp_path):
    res, out, _ = build([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path)
    counter_track = perfetto.uuid_of("achieved", 0, 0)
    values = [p.track_event.double_counter_value for p in perfetto.read_back(out)
              if p.HasField("track_event") and p.track_event.track_uuid == counter_track]
    assert values and all(0.0 <= v <= 100.0 for v in values)
    # The lost-peak slices carry the same lost time as the store.
    total_lost = res.con.execute("SELECT sum(lost_ns) FROM losses WHERE scope='window'").fetchall()[0][0]
    got = 0.0
    lost_names = {"lost_ns"}
    arg_names = {}
    for p in perfetto.read_back(out):
        for e in p.interned_data.debug_annotation_names:
            arg_names[e.iid] = e.name
        if p.HasField("track_event") and p.track_event.type == BEGIN:
            for a in p.track_event.debug_annotations:
                if arg_names.get(a.name_iid) in lost_names:
                    got += a.double_value
    assert got == pytest.approx(total_lost, rel=1e-9)


def test_overlapping_slices_go_to_overflow_lanes():
    s = [perfetto.Slice(0, 10, "a"), perfetto.Slice(5, 15, "b"), perfetto.Slice(1, 3, "c"), perfetto.Slice(12, 20, "d")]
    lanes = perfetto.assign_lanes(s)
    assert [[x.name for x in lane] for lane in lanes] == [["a", "c", "d"], ["b"]]
