"""trace.pftrace: the vertical trace — native Perfetto protobuf where cluster, model, op, kernel, device and
verdict line up on one clock (SPEC §6). Reads only the store; streams packets to the file with interned names.

Per rank a process; under it one track group per layer, each holding leaf tracks. Slices that overlap without
nesting are spread over sibling lanes so every track nests. Flows join each CUDA launch to its kernel, and the
same collective across ranks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import duckdb
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

SEQ_ID = 0x504C  # one trusted packet sequence for the whole file
LAYERS = ("cluster", "model", "op", "kernel", "device", "verdict")
BEGIN, END, COUNTER = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_COUNTER


def uuid_of(*parts: object) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


@dataclass
class Slice:
    start: int
    end: int
    name: str
    args: dict[str, Any] | None = None
    flows: tuple[int, ...] = ()
    terminating: tuple[int, ...] = ()


class Writer:
    """Streams TracePackets with interned event and annotation names."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.names: dict[str, int] = {}
        self.arg_names: dict[str, int] = {}
        self.first = True
        self.packets = 0
        self.tracks = 0

    def _emit(self, packet: pb.TracePacket) -> None:
        packet.trusted_packet_sequence_id = SEQ_ID
        if self.first:
            packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        else:
            packet.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        t = pb.Trace()
        t.packet.append(packet)
        self.f.write(t.SerializeToString())
        self.packets += 1

    def track(self, uuid: int, name: str, parent: int | None = None, process: tuple[int, str] | None = None,
              counter: str | None = None, order: int | None = None, explicit_children: bool = False) -> None:
        self.tracks += 1
        p = pb.TracePacket()
        d = p.track_descriptor
        d.uuid = uuid
        if parent is not None:
            d.parent_uuid = parent
        if process is not None:
            d.process.pid, d.process.process_name = process
        else:
            d.name = name
        if counter is not None:
            d.counter.unit_name = counter
        if order is not None:
            d.sibling_order_rank = order
        if explicit_children:
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
        self._emit(p)

    @staticmethod
    def _intern(table: dict[str, int], entries: Any, name: str) -> int:
        """The interned id of `name`; first use adds it to the packet's interned data (`entries`)."""
        iid = table.get(name)
        if iid is None:
            iid = table[name] = len(table) + 1
            e = entries.add()
            e.iid, e.name = iid, name
        return iid

    def begin(self, track: int, s: Slice) -> None:
        p = pb.TracePacket()
        p.timestamp = s.start
        ev = p.track_event
        ev.type = BEGIN
        ev.track_uuid = track
        ev.name_iid = self._intern(self.names, p.interned_data.event_names, s.name)
        if s.args:
            for k, v in s.args.items():
                if v is None:
                    continue
                a = ev.debug_annotations.add()
                a.name_iid = self._intern(self.arg_names, p.interned_data.debug_annotation_names, k)
                if isinstance(v, bool):
                    a.bool_value = v
                elif isinstance(v, int):
                    a.int_value = v
                elif isinstance(v, float):
                    a.double_value = v
                else:
                    a.string_value = str(v)
        if s.flows:
            ev.flow_ids.extend(s.flows)
        if s.terminating:
            ev.terminating_flow_ids.extend(s.terminating)
        self._emit(p)

    def end(self, track: int, ts: int) -> None:
        p = pb.TracePacket()
        p.timestamp = ts
        p.track_event.type = END
        p.track_event.track_uuid = track
        self._emit(p)

    def counter(self, track: int, ts: int, value: float) -> None:
        p = pb.TracePacket()
        p.timestamp = ts
        p.track_event.type = COUNTER
        p.track_event.track_uuid = track
        p.track_event.double_counter_value = value
        self._emit(p)


class Lanes:
    """One leaf track, plus overflow lanes named alike, fed slices in (start, longer first) order and written
    as they come: a slice goes to the first lane where it nests or is disjoint, so every lane nests. Holds only
    the open slices, whatever the number of slices (a multi-GB trace streams through)."""

    def __init__(self, w: Writer, parent: int, key: tuple[Any, ...], name: str, order: int) -> None:
        self.w, self.parent, self.key, self.name, self.order = w, parent, key, name, order
        self.stacks: list[list[int]] = []  # open end times per lane
        self.tracks: list[int] = []
        self.count = 0

    def add(self, s: Slice) -> int:
        """Write `s`; returns its lane."""
        self.count += 1
        for i, st in enumerate(self.stacks):
            t = self.tracks[i]
            while st and st[-1] <= s.start:  # ends before begins at a tie
                self.w.end(t, st.pop())
            if not st or s.end <= st[-1]:
                st.append(s.end)
                self.w.begin(t, s)
                return i
        i = len(self.tracks)
        t = uuid_of(*self.key, i)
        self.w.track(t, self.name if i == 0 else f"{self.name} (overlap {i})", parent=self.parent,
                     order=self.order * 100 + i)
        self.tracks.append(t)
        self.stacks.append([s.end])
        self.w.begin(t, s)
        return i

    def close(self) -> int:
        for t, st in zip(self.tracks, self.stacks, strict=True):
            while st:
                self.w.end(t, st.pop())
        return len(self.tracks)


def assign_lanes(slices: list[Slice]) -> list[list[Slice]]:
    """The lanes `Lanes` puts these slices in (for tests and small groups)."""
    class _Null(Writer):
        def _emit(self, packet: pb.TracePacket) -> None:
            self.packets += 1  # counted, not written: only the lane assignment is wanted

    slices.sort(key=lambda s: (s.start, -s.end))
    lanes = Lanes(_Null(None), 0, ("lanes",), "", 0)  # type: ignore[arg-type]
    out: list[list[Slice]] = []
    for s in slices:
        i = lanes.add(s)
        if i == len(out):
            out.append([])
        out[i].append(s)
    return out


def emit_group(w: Writer, parent: int, key: tuple[Any, ...], name: str, slices: Iterable[Slice], order: int,
               presorted: bool = False) -> int:
    """One leaf track (plus overflow lanes) for a set of slices; returns lanes used. `presorted`: the slices
    come in (start, longer first) order — then they stream, never held."""
    lanes = Lanes(w, parent, key, name, order)
    for s in slices if presorted else sorted(slices, key=lambda s: (s.start, -s.end)):
        lanes.add(s)
    return lanes.close()


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | dict[str, Any] | None = None
          ) -> Iterator[tuple[Any, ...]]:
    cur = con.execute(sql, params or [])
    while batch := cur.fetchmany(50_000):
        yield from batch


def _fid(*parts: object) -> int:
    return uuid_of("flow", *parts) | 1


def write(con: duckdb.DuckDBPyConnection, verdict: dict[str, Any], path: Path) -> dict[str, int]:
    """Write trace.pftrace; returns counts of what was written (for tests and the report)."""
    stats = {"kernels": 0, "collective_flows": 0, "tracks": 0}
    ranks = [r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM kernels WHERE rank IS NOT NULL ORDER BY rank").fetchall()]
    peak = {(r, d): (p, bw) for r, d, p, bw in con.execute(
        "SELECT rank, device, any_value(peak_flop_s), NULL FROM metrics WHERE scope='window' AND rank IS NOT NULL "
        "GROUP BY rank, device").fetchall()}
    bw_all = verdict.get("peak", {}).get("memory_bandwidth_tbs")
    gpu_names = {(g["rank"], g["device"]): g.get("name") for g in verdict.get("run", {}).get("gpus", [])}
    hosts = dict(con.execute("SELECT rank, any_value(host) FROM sources GROUP BY rank").fetchall())
    with open(path, "wb") as f:
        w = Writer(f)
        for rank in ranks:
            proc = uuid_of("rank", rank)
            gpus = sorted({d for (r, d) in peak if r == rank} | {d for (r, d) in gpu_names if r == rank})
            gname = ", ".join(sorted({str(gpu_names.get((rank, d)) or "GPU") for d in gpus}))
            label = f"rank {rank}" + (f" · {hosts[rank]}" if hosts.get(rank) else "") + f" · {gname}"
            w.track(proc, label, process=(100000 + int(rank), label), explicit_children=True, order=int(rank))
            layer_uuid = {}
            for i, layer in enumerate(LAYERS):
                layer_uuid[layer] = uuid_of("layer", rank, layer)
                w.track(layer_uuid[layer], layer, parent=proc, order=i, explicit_children=True)
            _cluster(con, w, rank, layer_uuid["cluster"], stats)
            _model(con, w, rank, layer_uuid["model"])
            _ops(con, w, rank, layer_uuid["op"], stats)
            _kernels(con, w, rank, layer_uuid["kernel"], peak, bw_all, stats)
            _device(con, w, rank, layer_uuid["device"])
            _verdict(con, w, rank, layer_uuid["verdict"])
        stats["packets"] = w.packets
        stats["tracks"] = w.tracks
    return stats


def _cluster(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int, stats: dict[str, int]) -> None:
    rows = list(_rows(con, """
        WITH c AS (
            SELECT *, coalesce(process_group, group_ranks, '') AS pg,
                   count(*) OVER (PARTITION BY coalesce(process_group, group_ranks, ''), collective, seq) AS nranks
            FROM collectives
        )
        SELECT start_ns, end_ns, collective, pg, seq, bytes, dtype, group_ranks, nranks
        FROM c WHERE rank = ? ORDER BY start_ns""", [rank]))
    slices = []
    for s, e, coll, pg, seq, nbytes, dtype, granks, nranks in rows:
        fl = (_fid("coll", pg, coll, seq),) if nranks > 1 else ()
        stats["collective_flows"] += len(fl)
        slices.append(Slice(s, max(e, s), f"{coll or 'collective'}", {
            "process_group": pg, "seq": seq, "bytes": nbytes, "dtype": dtype, "group_ranks": granks}, flows=fl))
    if slices:
        emit_group(w, parent, ("coll", rank), "collectives (NCCL)", slices, 0)


def _model(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int) -> None:
    for on_gpu, label in ((False, "ranges (record_function / NVTX)"), (True, "ranges on the GPU timeline")):
        slices = [Slice(s, max(e, s), n or "?", {"domain": d})
                  for s, e, n, d in _rows(con, "SELECT start_ns, end_ns, name, domain FROM ranges WHERE rank = ? "
                                               "AND on_gpu = ? AND domain IS DISTINCT FROM 'python'", [rank, on_gpu])]
        if slices:
            emit_group(w, parent, ("ranges", rank, on_gpu), label, slices, int(on_gpu))


def _ops(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int, stats: dict[str, int]) -> None:
    threads = [t for (t,) in con.execute(
        "SELECT DISTINCT thread FROM (SELECT thread FROM ops WHERE rank = $r UNION ALL "
        "SELECT thread FROM api_calls WHERE rank = $r UNION ALL SELECT thread FROM ranges WHERE rank = $r "
        "AND domain = 'python') WHERE thread IS NOT NULL ORDER BY 1", {"r": rank}).fetchall()]
    for i, tid in enumerate(threads):
        def slices(tid: Any = tid) -> Iterator[Slice]:
            for s, e, n, f, dims, sid, corr, has_kernel in _rows(con, """
                    SELECT start_ns, greatest(end_ns, start_ns) AS e, name, flops, input_dims, NULL, NULL, NULL
                    FROM ops WHERE rank = $rank AND thread = $tid
                    UNION ALL  -- Python frames (with_stack=True) enclose the ops they called
                    SELECT start_ns, greatest(end_ns, start_ns), name, NULL, NULL, NULL, NULL, NULL
                    FROM ranges WHERE rank = $rank AND thread = $tid AND domain = 'python'
                    UNION ALL
                    SELECT a.start_ns, greatest(a.end_ns, a.start_ns), a.name, NULL, NULL, a.source_id, a.correlation,
                           EXISTS (SELECT 1 FROM kernels k WHERE k.source_id = a.source_id
                                                             AND k.correlation = a.correlation)
                    FROM api_calls a WHERE a.rank = $rank AND a.thread = $tid
                    ORDER BY 1, 2 DESC, 3, 7 NULLS FIRST""", {"rank": rank, "tid": tid}):
                if sid is None:
                    yield Slice(s, e, n, {"flops": f, "input_dims": dims} if f or dims else None)
                else:
                    fl = (_fid("launch", sid, corr),) if has_kernel and corr is not None else ()
                    yield Slice(s, e, n, {"correlation": corr}, flows=fl)
        emit_group(w, parent, ("thread", rank, tid), f"CPU thread {tid}", slices(), i, presorted=True)


def _kernels(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int,
             peak: dict[tuple[int, int], tuple[float | None, Any]], bw_tbs: float | None, stats: dict[str, int]) -> None:
    streams = con.execute("SELECT DISTINCT device, stream FROM kernels WHERE rank = ? ORDER BY 1, 2",
                          [rank]).fetchall()
    for i, (dev, stream) in enumerate(streams):
        p = peak.get((rank, dev), (None, None))[0]
        ridge = p / (bw_tbs * 1e12) if p and bw_tbs else None
        lanes = Lanes(w, parent, ("stream", rank, dev, stream), f"GPU {dev} stream {stream}", i)
        for s, e, n, kind, flops, nbytes, sid, corr, op in _rows(con, """
                SELECT k.start_ns, k.end_ns, k.name, k.kind, k.flops, k.bytes, k.source_id, k.correlation, o.name
                FROM kernels k LEFT JOIN ops o ON o.op_id = k.op_id
                WHERE k.rank = ? AND k.device = ? AND k.stream IS NOT DISTINCT FROM ?
                ORDER BY k.start_ns, greatest(k.end_ns, k.start_ns) DESC, k.kernel_id""", [rank, dev, stream]):
            dur = max(e - s, 0)
            args: dict[str, Any] = {"kind": kind, "op": op}
            if flops:
                args["flops"] = float(flops)
                if p and dur:
                    args["achieved_pct_of_peak"] = round(100.0 * flops / (dur / 1e9) / p, 2)
                if nbytes and kind == "compute":
                    ai = flops / nbytes
                    args["arithmetic_intensity"] = round(ai, 2)
                    if ridge:
                        args["bound"] = "compute" if ai >= ridge else "memory"
            elif kind == "compute":
                args["bound"] = "memory (no FLOPs)"
            if nbytes and kind in ("memcpy", "memset"):
                args["bytes"] = float(nbytes)
            term = (_fid("launch", sid, corr),) if corr is not None else ()
            lanes.add(Slice(s, max(e, s), n, args, terminating=term))
        stats["kernels"] += lanes.count
        lanes.close()


def _device(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int) -> None:
    series = con.execute("SELECT DISTINCT device, metric FROM counters WHERE rank = ? ORDER BY 1, 2",
                         [rank]).fetchall()
    for i, (dev, metric) in enumerate(series):
        t = uuid_of("counter", rank, dev, metric)
        w.track(t, f"GPU {dev} {metric}", parent=parent, counter=metric, order=i)
        for ts, v in _rows(con, "SELECT end_ns, value FROM counters WHERE rank = ? AND device IS NOT DISTINCT FROM ? "
                                "AND metric = ? AND value IS NOT NULL ORDER BY end_ns", [rank, dev, metric]):
            w.counter(t, ts, float(v))


def _verdict(con: duckdb.DuckDBPyConnection, w: Writer, rank: int, parent: int) -> None:
    """An 'achieved % of peak' counter (100 where no loss was recorded) and the lost stretches by category."""
    devices = [d for (d,) in con.execute("SELECT DISTINCT device FROM losses WHERE scope = 'window' AND rank = ? "
                                         "ORDER BY 1", [rank]).fetchall()]
    for dev in devices:
        counter = uuid_of("achieved", rank, dev)
        w.track(counter, f"GPU {dev} achieved % of peak", parent=parent, counter="%", order=0)
        lanes = Lanes(w, parent, ("lost", rank, dev), f"GPU {dev} lost peak", 1)
        prev_end = None
        for s, e, cat, lost in _rows(con, """
                SELECT start_ns, end_ns, category, lost_ns FROM losses
                WHERE scope = 'window' AND rank = ? AND device IS NOT DISTINCT FROM ?
                ORDER BY start_ns, end_ns DESC""", [rank, dev]):
            if prev_end is not None and s > prev_end:
                w.counter(counter, prev_end, 100.0)
            w.counter(counter, s, max(0.0, 100.0 * (1.0 - lost / (e - s))) if e > s else 100.0)
            prev_end = e
            if e > s:
                lanes.add(Slice(s, e, cat, {"lost_ns": float(lost)}))
        if prev_end is not None:
            w.counter(counter, prev_end, 100.0)
        lanes.close()


def read_back(path: Path) -> Iterable[pb.TracePacket]:
    """Parse a written trace (for tests and checks): the file is a concatenation of Trace messages."""
    t = pb.Trace()
    t.ParseFromString(Path(path).read_bytes())
    return t.packet
