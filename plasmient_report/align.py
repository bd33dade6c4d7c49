"""One clock (SPEC §3): every source gets a rank (traces) and one clock record — offset, method, uncertainty — in
the store's `clock` table, and its times are moved by that offset once, at the end of the stage.

In order: native anchors (offset 0); `--offset SOURCE=±DURATION` forces a source; ranks are shifted so that the
ends of the same collective (the library's collective key) coincide (median residual reported); counter logs are
matched to the trace's GPUs (UUID / bus id / index) and shifted to maximise the correlation of their utilization
with the trace's kernel-busy series. Each step reads the times through the clock as the steps before it left it;
`apply_clock` then adds each source's offset to every time column of its rows, in one pass. (Nsight Compute
launches are joined to trace kernels in the measure stage: kernel_flops.py.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from . import peaks, sql, vocab
from .errors import BadInput
from .store import one

# Columns that hold a point in time (shifted with their source); durations are named otherwise.
TIME_COLUMNS = ("start_ns", "end_ns", "ts_ns")
# Tables read through the clock while the stage runs (`clocked_<table>`: the times plus the offsets so far).
CLOCKED_TABLES = ("kernels", "ops", "api_calls", "ranges", "collectives", "counters")
# Typical uncertainty of a native anchor across hosts (NTP); within one host CPU and GPU share a clock.
NATIVE_UNCERTAINTY_NS = {"native": 1_000, "epoch_us": 1_000, "relative": None}
# Counter-log anchors whose time the log itself gives (their uncertainty is one sampling period).
COUNTER_TRUSTED = ("native", "anchored", "prefixed")
DEFAULT_SEARCH_NS = 300 * 10**9  # ±5 min around each candidate
ZONE_STEP_NS = 15 * 60 * 10**9  # time zones differ by multiples of 15 min …
ZONE_MAX_NS = 14 * 3600 * 10**9  # … by at most 14 h
# A rank is shifted only when its collective ends sit at least this far from its peer's (clock error, not NCCL's
# own spread of ends between ranks on one host: 1–16 µs on the H200 recordings); an applied shift is uncertain
# by at least as much.
MIN_RANK_SHIFT_NS = 50_000
# Traces whose spans are further apart than this, with no overlap, were not recorded together: the ranks of one run
# are profiled at the same time (their clocks agree to seconds, even across hosts), whatever the profiler schedule.
RUN_GAP_NS = 3600 * 10**9
# Traces closer than that but apart by more than this, with no overlap, are still analysed as one run (a rank's
# profiler schedule that started late, a clock minutes off) — and said in the notes, since their windows are then
# summed as if the ranks had run side by side: separate runs given together look just the same. A minute is well
# above how far the clocks of one run's hosts disagree (seconds at most, above).
NO_OVERLAP_NOTE_NS = 60 * 10**9
EPOCH_2000_NS = 946_684_800 * 10**9  # earlier "times" are relative to a process start: no calendar to compare on
UTIL_METRICS = ("gpu_util", "gr_engine_active", "sm_active")
_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 10**9,
    "sec": 10**9,
    "m": 60 * 10**9,
    "min": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION_RE = re.compile(r"^\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|sec|s|min|m|h)?\s*$")


@dataclass(frozen=True)
class ForcedOffset:
    """`--offset SOURCE=±DURATION`: add offset_ns to every time of the input named SOURCE (path or file name)."""

    source: str
    offset_ns: int


def parse_duration_ns(text: str) -> int:
    """'+37s', '-850us', '1.5ms', '-3h', '250ns'; a bare number is seconds."""
    m = _DURATION_RE.match(text)
    if not m:
        raise BadInput(None, f"bad duration {text!r} (examples: +37s, -850us, 1.5ms, -3h)")
    sign = -1 if m.group(1) == "-" else 1
    return sign * int(round(float(m.group(2)) * _UNITS_NS[m.group(3) or "s"]))


def parse_offset(spec: str) -> ForcedOffset:
    src, sep, dur = spec.rpartition("=")
    if not sep or not src.strip():
        raise BadInput(None, f"--offset {spec!r}: expected SOURCE=±DURATION (e.g. nvidia_smi.csv=+37s)")
    return ForcedOffset(src.strip(), parse_duration_ns(dur))


# ---------------------------------------------------------------------------------------------------- ranks


def assign_ranks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Sources without a rank get one by input order; clashing ranks are renumbered, and said so.
    Counter logs and Nsight Compute files (rank_method 'counters') are not ranks: they are matched later."""
    notes: list[str] = []
    # Multi-rank sources (an nsys report of several processes) set rank per row; their ranks are taken.
    taken: set[int] = {
        r
        for (r,) in con.execute(
            "SELECT DISTINCT k.rank FROM kernels k JOIN sources s USING (source_id) "
            "WHERE s.rank_method = 'multi' AND k.rank IS NOT NULL"
        ).fetchall()
    }
    rows = con.execute(
        "SELECT source_id, rank, rank_method, path FROM sources WHERE rank_method NOT IN ('multi', 'counters') ORDER BY source_id"
    ).fetchall()
    final: dict[int, tuple[int, str]] = {}
    declared: dict[int, str] = {}
    for _sid, rank, method, path in rows:
        if rank is not None and method == "distributedInfo":
            if rank in declared:
                # two traces that both say they are rank r are two recordings of that rank, not two ranks
                raise BadInput(
                    None,
                    f"{Path(declared[rank]).name} and {Path(path).name} both say they are rank {rank} "
                    "(distributedInfo): two recordings of one rank, not ranks of one run. Pass one, compare the "
                    "two with `plasmient-report diff BASE CANDIDATE`, or analyse each with `plasmient-report batch`",
                )
            declared[rank] = path
    for sid, rank, method, _path in rows:
        if rank is not None and rank not in taken:
            taken.add(rank)
            final[sid] = (rank, method)
    nxt = 0
    for sid, rank, _method, path in rows:
        if sid in final:
            continue
        while nxt in taken:
            nxt += 1
        if rank is not None:
            notes.append(f"{path}: claims rank {rank}, already taken by another input; counted as rank {nxt}")
        final[sid] = (nxt, "order" if rank is None else "renumbered")
        taken.add(nxt)
    # every table of the store whose rows carry their source's rank (memory_events included)
    tables = [
        t
        for (t,) in con.execute("""
        SELECT table_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name <> 'sources'
          AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main')
        GROUP BY table_name HAVING list_contains(list(column_name), 'source_id') AND list_contains(list(column_name), 'rank')
        ORDER BY table_name""").fetchall()
    ]
    for sid, (rank, how) in final.items():
        con.execute("UPDATE sources SET rank = ?, rank_method = ? WHERE source_id = ?", [rank, how, sid])
        for t in tables:  # rows that already carry it are not rewritten (an UPDATE of 12 M counter rows is ~0.6 s)
            con.execute(f'UPDATE "{t}" SET rank = $r WHERE source_id = $s AND rank IS DISTINCT FROM $r', {"r": rank, "s": sid})
    return notes


def anchor_sources(con: duckdb.DuckDBPyConnection) -> None:
    """Give each source its clock record: offset 0 (its own anchor), the anchor as method, and its uncertainty. A
    counter log's uncertainty is its effective sampling period; a synthesized one's is unknown. Later steps
    refine the records; `apply_clock` moves the times."""
    if one(con, "SELECT count(*) FROM clock") != (0,):
        raise RuntimeError("the align stage ran twice on one store: its offsets are already applied")
    cases = " ".join(f"WHEN '{a}' THEN {'NULL' if u is None else u}" for a, u in NATIVE_UNCERTAINTY_NS.items())
    trusted = ", ".join(f"'{a}'" for a in COUNTER_TRUSTED)
    con.execute(f"""
        INSERT INTO clock (source_id, offset_ns, method, uncertainty_ns)
        SELECT source_id, 0, coalesce(clock_anchor, 'none'),
               CASE WHEN rank_method = 'counters'
                    THEN CASE WHEN clock_anchor IN ({trusted}) THEN sample_period_ns END
                    ELSE CASE clock_anchor {cases} END END
        FROM sources""")
    con.execute("""UPDATE sources SET first_ns = t.s, last_ns = t.e FROM (
                       SELECT source_id, min(start_ns) s, max(end_ns) e FROM counters GROUP BY source_id) t
                   WHERE sources.source_id = t.source_id""")


def _set_clock(
    con: duckdb.DuckDBPyConnection,
    source_id: int,
    offset_ns: int,
    method: str,
    uncertainty_ns: int | None,
    reference_source_id: int | None = None,
) -> None:
    con.execute(
        "UPDATE clock SET offset_ns = ?, method = ?, uncertainty_ns = ?, reference_source_id = ? WHERE source_id = ?",
        [int(offset_ns), method, uncertainty_ns, reference_source_id, source_id],
    )


def _offsets(con: duckdb.DuckDBPyConnection) -> dict[int, int]:
    return {int(sid): int(off) for sid, off in con.execute("SELECT source_id, offset_ns FROM clock").fetchall()}


def _clocked_views(con: duckdb.DuckDBPyConnection) -> None:
    """`clocked_<table>`: a trace table with its times on the clock as the stage has it so far (temporary views;
    the stored times move once, in apply_clock). Every step reads through them, so each can also run alone."""
    for t in CLOCKED_TABLES:
        con.execute(f"""CREATE OR REPLACE TEMP VIEW clocked_{t} AS
                        SELECT t.* REPLACE (t.start_ns + coalesce(c.offset_ns, 0) AS start_ns,
                                            t.end_ns + coalesce(c.offset_ns, 0) AS end_ns)
                        FROM {t} t LEFT JOIN clock c ON c.source_id = t.source_id""")


def _drop_clocked_views(con: duckdb.DuckDBPyConnection) -> None:
    for t in CLOCKED_TABLES:
        con.execute(f"DROP VIEW IF EXISTS temp.clocked_{t}")


def apply_clock(con: duckdb.DuckDBPyConnection) -> None:
    """The one pass: add each source's clock offset to every time column of its rows (every table with a source_id
    and a time column), to the span recorded for it, and copy its record to `sources` (offset_ns, offset_method,
    offset_uncertainty_ns: the public columns of SPEC §2)."""
    con.execute("""UPDATE sources SET offset_ns = c.offset_ns, offset_method = c.method,
                                      offset_uncertainty_ns = c.uncertainty_ns,
                                      first_ns = sources.first_ns + c.offset_ns, last_ns = sources.last_ns + c.offset_ns
                   FROM clock c WHERE c.source_id = sources.source_id""")
    if one(con, "SELECT count(*) FROM clock WHERE offset_ns <> 0") == (0,):
        return
    tables = con.execute("""
        SELECT table_name, list(column_name) FROM information_schema.columns
        WHERE table_schema = 'main' AND table_name NOT IN ('sources', 'clock')
          AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main')
        GROUP BY table_name HAVING list_contains(list(column_name), 'source_id')""").fetchall()
    for table, cols in sorted(tables):
        tcols = [c for c in cols if c in TIME_COLUMNS]
        if tcols:
            sets = ", ".join(f"{c} = {c} + c.offset_ns" for c in tcols)
            con.execute(f'UPDATE "{table}" SET {sets} FROM clock c WHERE c.source_id = "{table}".source_id AND c.offset_ns <> 0')


def apply_forced(con: duckdb.DuckDBPyConnection, forced: Sequence[ForcedOffset]) -> set[int]:
    """--offset: each named source gets exactly that offset (method 'forced'). Unknown or ambiguous names fail."""
    done: set[int] = set()
    rows = con.execute("SELECT source_id, path FROM sources").fetchall()
    for f in forced:
        want = Path(f.source)
        hits = [r for r in rows if r[1] == f.source or _same_file(Path(r[1]), want)]
        if not hits:
            hits = [r for r in rows if Path(r[1]).name == want.name]
        if not hits:
            raise BadInput(
                None, f"--offset {f.source}: no input is named so (inputs: {', '.join(Path(r[1]).name for r in rows)})"
            )
        if len(hits) > 1:
            raise BadInput(None, f"--offset {f.source}: several inputs have that name; give the path")
        sid = hits[0][0]
        _set_clock(con, sid, f.offset_ns, "forced", 0)
        done.add(sid)
    return done


def one_recording(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Refuse traces that were not recorded together (exit 2, naming two of them): spans on calendar clocks more
    than RUN_GAP_NS apart with nothing between them are separate recordings, not ranks of one run — analysed as one,
    their steps, stragglers and collectives would be compared across days (and the rank alignment would pair
    their collectives' sequence numbers). Counter logs are matched to the traces later and are not checked here;
    traces on a process-relative clock have no calendar to compare. Returns notes: traces apart by more than
    NO_OVERLAP_NOTE_NS with nothing between them, analysed as one run all the same."""
    rows = con.execute(f"""
        SELECT s.path, s.first_ns + coalesce(c.offset_ns, 0) AS a, s.last_ns + coalesce(c.offset_ns, 0) AS b
        FROM sources s LEFT JOIN clock c USING (source_id)
        WHERE s.rank_method IS DISTINCT FROM 'counters' AND s.first_ns IS NOT NULL AND s.last_ns IS NOT NULL
          AND s.clock_anchor IS DISTINCT FROM 'relative' AND s.first_ns >= {EPOCH_2000_NS}
        ORDER BY a, b, s.path""").fetchall()
    notes: list[str] = []
    if len(rows) < 2:
        return notes
    end_path, end = rows[0][0], rows[0][2]
    for path, a, b in rows[1:]:
        if a - end > RUN_GAP_NS:
            raise BadInput(
                None,
                f"{Path(end_path).name} and {Path(path).name} were not recorded together: the second starts "
                f"{_long_duration(a - end)} after the first ends — not ranks of one run. Analyse each alone, or "
                "all of them with `plasmient-report batch`",
            )
        if a - end > NO_OVERLAP_NOTE_NS:
            notes.append(
                f"{Path(end_path).name} and {Path(path).name} do not overlap in time (the second starts "
                f"{(a - end) / 6e10:.1f} min after the first ends): analysed as ranks of one run, their windows summed — if they "
                "are separate runs, analyse each alone or with `plasmient-report batch`"
            )
        if b > end:
            end_path, end = path, b
    return notes


def _long_duration(ns: int) -> str:
    h = ns / 3.6e12
    return f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} hours"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# --------------------------------------------------------------------------------- ranks by collectives


@dataclass(frozen=True)
class RankAlignment:
    source_id: int
    reference_source_id: int
    shift_ns: int
    residual_ns: int  # median |end − end_ref| after the shift
    collectives: int


def align_ranks(con: duckdb.DuckDBPyConnection, fixed: set[int]) -> tuple[list[RankAlignment], list[str]]:
    """Shift trace sources so that the ends of the same collective instance (sql/collective_key: key, collective,
    seq) coincide. The lowest rank (and any --offset source) stays put; the others follow, breadth-first over
    shared groups."""
    sym = one(con, "SELECT count(*) FROM collectives WHERE regexp_matches(collective, ?)", [vocab.SYMMETRIC_COLLECTIVE_RE])
    # Send/recv cannot be paired by sequence number alone (one rank's sends are its peer's recvs): never used.
    where, pattern = (
        ("WHERE regexp_matches(collective, ?)", vocab.SYMMETRIC_COLLECTIVE_RE)
        if sym and sym[0]
        else ("WHERE NOT regexp_matches(coalesce(collective, ''), ?)", vocab.P2P_COLLECTIVE_RE)
    )
    _clocked_views(con)
    sql.install(con, "collective_key")
    pairs = con.execute(
        f"""
        WITH c AS (SELECT source_id, rank, collective_key(process_group, group_ranks) AS key, collective, seq, end_ns
                   FROM clocked_collectives {where}),
        d AS (
            SELECT a.source_id AS sa, b.source_id AS sb, b.end_ns - a.end_ns AS res
            FROM c a JOIN c b ON a.key = b.key AND a.collective = b.collective AND a.seq = b.seq
                             AND a.source_id < b.source_id
        ), m AS (SELECT sa, sb, median(res) AS med, count(*) AS n FROM d GROUP BY sa, sb)
        SELECT m.sa, m.sb, m.med, m.n, median(abs(d.res - m.med)) FROM m JOIN d USING (sa, sb)
        GROUP BY m.sa, m.sb, m.med, m.n ORDER BY m.sa, m.sb""",
        [pattern],
    ).fetchall()
    if not pairs:
        return [], []
    edges: dict[int, list[tuple[int, float, int, float]]] = {}
    for sa, sb, med, n, mad in pairs:
        edges.setdefault(sa, []).append((sb, float(med), int(n), float(mad)))
        edges.setdefault(sb, []).append((sa, -float(med), int(n), float(mad)))
    ranks = dict(con.execute("SELECT source_id, coalesce(rank, 1 << 30) FROM sources").fetchall())
    ref = min(edges, key=lambda s: (ranks.get(s, 1 << 30), s))
    roots = [ref, *sorted(s for s in fixed if s in edges and s != ref)]
    delta: dict[int, float] = {r: 0.0 for r in roots}
    parent: dict[int, tuple[int, int, float]] = {}
    queue = list(roots)
    while queue:
        a = queue.pop(0)
        # (the most collectives first; of as many, the lowest source: the same tree in every run)
        for b, med, n, mad in sorted(edges.get(a, []), key=lambda e: (-e[2], e[0])):
            if b in delta:
                continue
            # b's ends sit `med` after a's: move b by −med (on top of a's own move).
            delta[b] = delta[a] - med
            parent[b] = (a, n, mad)
            queue.append(b)
    out: list[RankAlignment] = []
    notes: list[str] = []
    hosts = dict(con.execute("SELECT source_id, host FROM sources").fetchall())
    offsets = _offsets(con)
    for b, (a, n, mad) in parent.items():
        shift = int(round(delta[b]))
        if hosts.get(a) and hosts.get(a) == hosts.get(b) and delta[a] == 0:
            # Same host, same clock: the residual is NCCL's own end skew, not a clock error.
            notes.append(
                f"rank {ranks.get(b)} and rank {ranks.get(a)} share host {hosts[a]}: clocks kept; their "
                f"collective ends differ by {_fmt_ns(shift * -1)} (median over {n})"
            )
            continue
        if abs(shift) < MIN_RANK_SHIFT_NS and delta[a] == 0:
            # Below NCCL's own spread of collective ends: more likely skew between the kernels than between clocks.
            notes.append(
                f"rank {ranks.get(b)}: collective ends differ from rank {ranks.get(a)} by "
                f"{_fmt_ns(-shift)} (median over {n}), under {_fmt_ns(MIN_RANK_SHIFT_NS)}: clocks kept"
            )
            continue
        # The residuals' spread says how well the ends were matched, not how far NCCL's ends sit apart on
        # one clock (up to tens of µs between two ranks of one host): that is the floor of what ends can tell.
        _set_clock(con, b, offsets.get(b, 0) + shift, "collectives", max(int(round(mad)), MIN_RANK_SHIFT_NS), a)
        out.append(RankAlignment(b, a, shift, int(round(mad)), n))
        notes.append(
            f"rank {ranks.get(b)} aligned to rank {ranks.get(a)} on {n} collectives: shifted "
            f"{_fmt_ns(shift)}, median residual {_fmt_ns(int(round(mad)))}"
        )
    if not (sym and sym[0]):
        notes.append("rank alignment used asymmetric collectives (no all-reduce/all-gather/reduce-scatter found)")
    return out, notes


def _fmt_ns(ns: int | float) -> str:
    a = abs(ns)
    sign = "-" if ns < 0 else "+"
    if a >= 3600 * 10**9:
        return f"{sign}{a / 3.6e12:.3f} h"
    if a >= 10**9:
        return f"{sign}{a / 1e9:.3f} s"
    if a >= 10**6:
        return f"{sign}{a / 1e6:.3f} ms"
    if a >= 10**3:
        return f"{sign}{a / 1e3:.1f} µs"
    return f"{sign}{a:.0f} ns"


# ------------------------------------------------------------------------------- counter logs: which GPU


def _norm_uuid(u: str | None) -> str | None:
    if not u:
        return None
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def _norm_bus(b: str | None) -> str | None:
    """'00000000:00:06.0' and '0000:00:06.0' are one GPU: compare bus:device.function."""
    if not b:
        return None
    parts = b.strip().lower().split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else None


def match_counter_gpus(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Give counter rows the (rank, device) of the trace GPU they describe: by UUID, else PCI bus id, else device
    index. One physical GPU can appear in several traces (runs one after another): among the GPUs that match,
    the one whose profiled window the log overlaps wins, then a UUID / bus id match over an index match.
    Unmatched and ambiguous GPUs are said in the notes."""
    _clocked_views(con)
    sql.install(con, "rank_span")
    trace = con.execute("""
        WITH span AS (SELECT rank, start_ns AS s, end_ns AS e
                      FROM rank_span_of('clocked_kernels', 'clocked_ops', 'clocked_api_calls', 'clocked_ranges'))
        SELECT g.rank, g.device, any_value(d.gpu_uuid), any_value(d.bus_id), any_value(span.s), any_value(span.e),
               any_value(d.name)
        FROM (SELECT DISTINCT rank, device FROM kernels) g
        LEFT JOIN devices d ON d.rank IS NOT DISTINCT FROM g.rank AND d.device = g.device
             AND d.source_id IN (SELECT source_id FROM sources WHERE rank_method <> 'counters')
        LEFT JOIN span ON span.rank IS NOT DISTINCT FROM g.rank
        GROUP BY g.rank, g.device ORDER BY g.rank, g.device""").fetchall()
    logs = con.execute("""
        SELECT c.source_id, s.path, c.gpu_index, c.gpu_uuid,
               (SELECT any_value(d.bus_id) FROM devices d WHERE d.source_id = c.source_id
                  AND (d.gpu_uuid = c.gpu_uuid OR (c.gpu_uuid IS NULL AND d.device = c.gpu_index))) AS bus,
               c.s, c.e,
               (SELECT any_value(d.name) FROM devices d WHERE d.source_id = c.source_id
                  AND (d.gpu_uuid = c.gpu_uuid OR (c.gpu_uuid IS NULL AND d.device = c.gpu_index))) AS model
        FROM (SELECT source_id, gpu_index, gpu_uuid, min(start_ns) AS s, max(end_ns) AS e FROM clocked_counters
              WHERE (entity IS NULL OR entity LIKE 'GPU %')
                -- counter logs only, before the scan groups anything (a trace's own GPU metrics: millions of rows)
                AND source_id IN (SELECT source_id FROM sources WHERE rank_method = 'counters') GROUP BY ALL) c
        JOIN sources s USING (source_id)
        WHERE s.rank_method = 'counters'
        ORDER BY c.source_id, c.gpu_index""").fetchall()
    notes: list[str] = []
    # Only counter logs are matched here; a trace's own GPU metrics (nsys) already carry their rank and device.
    con.execute(
        "UPDATE counters SET rank = NULL, device = NULL "
        "WHERE source_id IN (SELECT source_id FROM sources WHERE rank_method = 'counters')"
    )
    unmatched: dict[str, list[str]] = {}
    table = peaks.load_table(None)
    for sid, path, idx, uuid, bus, ls, le, model in logs:
        strong = [
            (r, d, ws, we)
            for r, d, u, b, ws, we, _ in trace
            if (uuid and _norm_uuid(u) == _norm_uuid(uuid)) or (bus and b and _norm_bus(b) == _norm_bus(bus))
        ]
        by_index = [
            (r, d, ws, we, name)
            for r, d, u, b, ws, we, name in trace
            if idx is not None and d == idx and (r, d, ws, we) not in strong and not (uuid and u) and not (bus and b)
        ]
        # An index says nothing of which machine: a log whose GPU is another model than the trace's GPU of that
        # index is of another GPU (both names known to the peak table, as different entries).
        weak = [(r, d, ws, we) for r, d, ws, we, name in by_index if not peaks.different_models(model, name, table)]
        if by_index and not weak and not strong:
            others = sorted({str(name) for *_, name in by_index})
            unmatched.setdefault(Path(path).name, []).append(
                f"GPU {idx} ({model}: the trace's GPU {idx} is {', '.join(others)}; a log of another machine?)"
            )
            continue

        def overlapping(c: list[tuple], ls: int = ls, le: int = le) -> list[tuple]:
            return [x for x in c if x[2] is not None and ls < x[3] and le > x[2]]

        hit, how = None, None
        for cands, kind in ((overlapping(strong), "id"), (overlapping(weak), "index"), (strong, "id"), (weak, "index")):
            if len(cands) == 1:
                hit, how = cands[0][:2], kind
                break
            if len(cands) > 1:
                break
        label = f"GPU {idx}" if idx is not None else f"GPU {uuid}"
        if hit is None:
            many = (
                len(overlapping(strong)) > 1
                or len(overlapping(weak)) > 1
                or (not overlapping(strong) and not overlapping(weak) and (len(strong) > 1 or len(weak) > 1))
            )
            why = " (several trace GPUs fit it equally)" if many else ""
            unmatched.setdefault(Path(path).name, []).append(label + why)
            continue
        con.execute(
            """UPDATE counters SET rank = ?, device = ? WHERE source_id = ?
                       AND gpu_index IS NOT DISTINCT FROM ? AND gpu_uuid IS NOT DISTINCT FROM ?
                       AND (entity IS NULL OR entity LIKE 'GPU %')""",
            [hit[0], hit[1], sid, idx, uuid],
        )
        con.execute(
            """UPDATE devices SET rank = ?, device = ? WHERE source_id = ?
                       AND (gpu_uuid IS NOT DISTINCT FROM ? OR (? IS NULL AND device = ?))""",
            [hit[0], hit[1], sid, uuid, uuid, idx],
        )
        if how == "index" and len(trace) > 1:
            notes.append(
                f"{Path(path).name}: {label} matched to rank {hit[0]} device {hit[1]} by index"
                + (" and time" if overlapping(weak) else " only")
            )
    for name, labels in unmatched.items():
        notes.append(
            f"{name}: {', '.join(labels)} {'match' if len(labels) > 1 else 'matches'} no GPU of the trace (by UUID, "
            "bus id or index); "
            "its samples are kept but not compared"
        )
    return notes


# --------------------------------------------------------------------- counter logs: when (correlation)


@dataclass(frozen=True)
class CounterAlignment:
    source_id: int
    shift_ns: int | None  # the best shift found (None: nothing could be placed)
    applied: bool
    method: str  # correlation, zone, kept, ambiguous, weak, none
    correlation: float | None
    correlation_runner_up: float | None  # best correlation at a clearly different shift
    correlation_at_zero: float | None
    uncertainty_ns: int
    zone_jump_ns: int


@dataclass
class _Series:
    """One GPU: the trace's cumulative busy time B(x) and the log's cumulative value M(x), both as breakpoints of
    piecewise-linear functions of time (s since the origin), and the GPU's profiled window."""

    busy_x: np.ndarray
    busy_y: np.ndarray
    log_x: np.ndarray
    log_y: np.ndarray
    w0: float
    w1: float


def _busy(con: duckdb.DuckDBPyConnection, origin: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Cumulative kernel-busy time of each trace GPU (rank, device) as breakpoints (x, B(x)) of a piecewise-linear
    function of time (s since `origin`), from the union of its kernels on the clock (sql/intervals)."""
    sql.install(con, "intervals")
    con.execute("""CREATE OR REPLACE TEMP VIEW _align_busy_parts AS
                   SELECT {'rank': rank, 'device': device} AS grp, start_ns, end_ns FROM clocked_kernels
                   WHERE rank IS NOT NULL AND device IS NOT NULL AND end_ns > start_ns""")
    rows = con.execute("""SELECT grp.rank AS rank, grp.device AS device, start_ns, end_ns
                          FROM interval_union('_align_busy_parts') ORDER BY rank, device, start_ns""").fetchnumpy()
    con.execute("DROP VIEW temp._align_busy_parts")
    ranks, devs = np.asarray(rows["rank"]), np.asarray(rows["device"])
    starts, ends = np.asarray(rows["start_ns"], dtype=np.int64), np.asarray(rows["end_ns"], dtype=np.int64)
    out: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for key in sorted({(int(r), int(d)) for r, d in zip(ranks, devs, strict=True)}):
        sel = (ranks == key[0]) & (devs == key[1])
        s = (starts[sel] - origin).astype(float) / 1e9
        e = (ends[sel] - origin).astype(float) / 1e9
        dur = e - s
        before = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
        x = np.empty(2 * len(s))
        y = np.empty(2 * len(s))
        x[0::2], x[1::2] = s, e
        y[0::2], y[1::2] = before, before + dur
        out[key] = (x, y)
    return out


def _held(t_s: np.ndarray, v: np.ndarray, period_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The log as a step function (each value holds from its sample to the next), integrated: (x, M(x))."""
    ends = np.concatenate([t_s[1:], [t_s[-1] + period_s]])
    ends = np.maximum(ends, t_s)
    area = np.concatenate([[0.0], np.cumsum(v * (ends - t_s))])
    x = np.empty(2 * len(t_s))
    y = np.empty(2 * len(t_s))
    x[0::2], x[1::2] = t_s, ends
    y[0::2], y[1::2] = area[:-1], area[1:]
    return x, y


def _correlate(
    series: list[_Series],
    shifts: np.ndarray,
    step: float,
    window: float,
    lag: float,
    log_span: tuple[float, float],
    max_points: int = 4_000_000,
) -> np.ndarray:
    """Pearson r, for each shift s, between the log's mean over [g − s − step, g − s] and the trace's busy fraction
    over [g − lag − window, g − lag], on a grid g of the given step inside the profiled window; NaN where the log
    covers less than half of the grid or either side does not vary."""
    r = np.full(len(shifts), np.nan)
    grids = [np.arange(x.w0 + lag + window, x.w1 + step / 2, step) for x in series]
    preds = [
        (np.interp(g - lag, x.busy_x, x.busy_y) - np.interp(g - lag - window, x.busy_x, x.busy_y)) / window
        for g, x in zip(grids, series, strict=True)
    ]
    total = sum(len(g) for g in grids)
    if total < 8:
        return r
    chunk = max(1, max_points // total)
    lo, hi = log_span
    for c0 in range(0, len(shifts), chunk):
        S = shifts[c0 : c0 + chunk, None]
        acc = np.zeros((6, len(S)))
        for g, p, x in zip(grids, preds, series, strict=True):
            a = g[None, :] - S
            valid = ((a - step) >= lo) & (a <= hi)
            m = (np.interp(a, x.log_x, x.log_y) - np.interp(a - step, x.log_x, x.log_y)) / step
            w = valid.astype(float)
            pp = np.broadcast_to(p[None, :], a.shape)
            acc += np.stack(
                [w.sum(1), (m * w).sum(1), (pp * w).sum(1), (m * m * w).sum(1), (pp * pp * w).sum(1), (m * pp * w).sum(1)]
            )
        n, sx, sy, sxx, syy, sxy = acc
        var = (n * sxx - sx * sx) * (n * syy - sy * sy)
        with np.errstate(invalid="ignore", divide="ignore"):
            rr = (n * sxy - sx * sy) / np.sqrt(var)
        ok = (n >= max(8, 0.5 * total)) & (var > 1e-12 * np.maximum(n, 1) ** 4)
        r[c0 : c0 + chunk] = np.where(ok, rr, np.nan)
    return r


@dataclass(frozen=True)
class _Peak:
    shift: float
    r: float
    runner_up: float | None


def _search(
    series: list[_Series],
    center: float,
    radius: float,
    window: float,
    lag: float,
    fine_step: float,
    log_span: tuple[float, float],
) -> _Peak | None:
    """The best shift within center ± radius: a coarse scan (step ≥ window/4, smoothed accordingly), then a fine one
    around the three best coarse shifts. runner_up = the best correlation at least max(2·window, 1 s) away."""
    span = max(x.w1 - x.w0 for x in series)
    coarse = max(window / 4, span / 2000, 2 * radius / 20000, fine_step)
    shifts = np.arange(center - radius, center + radius + coarse / 2, coarse)
    rc = _correlate(series, shifts, coarse, max(window, coarse), lag, log_span)
    if np.all(np.isnan(rc)):
        return None
    order = np.argsort(np.nan_to_num(rc, nan=-2.0))[::-1]
    best_c = shifts[order[0]]
    away = max(2 * window, 1.0, 3 * coarse)
    far = [rc[i] for i in order if abs(shifts[i] - best_c) > away and not np.isnan(rc[i])]
    runner = float(far[0]) if far else None
    tops = [shifts[i] for i in order[:3] if not np.isnan(rc[i])]
    fine_grid = max(fine_step, span / 20000)
    fine = np.unique(np.concatenate([np.arange(t - 2 * coarse, t + 2 * coarse + fine_step / 2, fine_step) for t in tops]))
    rf = _correlate(series, fine, fine_grid, window, lag, log_span)
    if np.all(np.isnan(rf)):
        return None
    b = int(np.nanargmax(rf))
    near = np.nan_to_num(rf, nan=-2.0) >= rf[b] - 0.002
    i0 = i1 = b
    while i0 > 0 and near[i0 - 1] and fine[i0] - fine[i0 - 1] <= fine_step * 1.5:
        i0 -= 1
    while i1 < len(fine) - 1 and near[i1 + 1] and fine[i1 + 1] - fine[i1] <= fine_step * 1.5:
        i1 += 1
    return _Peak(float((fine[i0] + fine[i1]) / 2), float(rf[b]), runner)


def align_counters(
    con: duckdb.DuckDBPyConnection, fixed: set[int], search_ns: int = DEFAULT_SEARCH_NS
) -> tuple[list[CounterAlignment], list[str]]:
    """Shift each counter log (not forced) so that its utilization best correlates with the kernel-busy series of
    the trace GPUs it was matched to. A log that does not overlap the trace is first tried whole quarter-hours
    away (a wrong time zone). A shift is applied only when the correlation is clear (no other shift fits almost
    as well); a log with its own clock keeps it when the best shift is within one sampling period."""
    out: list[CounterAlignment] = []
    notes: list[str] = []
    srcs = con.execute("""
        SELECT s.source_id, s.path, s.clock_anchor, s.sample_period_ns, s.time_zone
        FROM sources s WHERE s.rank_method = 'counters'
          AND EXISTS (SELECT 1 FROM counters c WHERE c.source_id = s.source_id AND c.rank IS NOT NULL)
        ORDER BY s.source_id""").fetchall()
    offsets = _offsets(con)
    _clocked_views(con)
    sql.install(con, "rank_span")
    spans = {
        r: (int(s), int(e))
        for r, s, e in con.execute(
            "SELECT rank, start_ns, end_ns FROM rank_span_of('clocked_kernels', 'clocked_ops', 'clocked_api_calls', "
            "'clocked_ranges') WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL"  # (a rank of events without times)
        ).fetchall()
    }
    origin = min((s for s, _ in spans.values()), default=0)
    busy = _busy(con, origin) if srcs else {}
    for sid, path, anchor, eff_period, zone in srcs:
        if sid in fixed:
            continue
        name = Path(path).name
        metric = next(
            (
                m
                for m in UTIL_METRICS
                if (
                    one(con, "SELECT count(*) FROM counters WHERE source_id = ? AND metric = ? AND rank IS NOT NULL", [sid, m])
                    or (0,)
                )[0]
            ),
            None,
        )
        if metric is None:
            notes.append(f"{name}: no utilization metric to align by; its own clock is kept")
            continue
        res = _align_one(con, sid, metric, eff_period, search_ns, anchor, spans, origin, busy)
        out.append(res)
        unc = _fmt_ns(res.uncertainty_ns)[1:]
        if res.applied and res.shift_ns is not None:
            _set_clock(con, sid, offsets.get(sid, 0) + res.shift_ns, res.method, res.uncertainty_ns)
            if res.method == "zone":
                msg = f"{name}: moved {_fmt_ns(res.shift_ns)} (whole quarter-hours) onto the trace"
            else:
                msg = (
                    f"{name}: shifted {_fmt_ns(res.shift_ns)} to match the trace's busy time (r = "
                    f"{res.correlation:.2f}, next best {_r(res.correlation_runner_up)}; ± {unc})"
                )
            if res.zone_jump_ns:
                msg += f"; its clock is off by {_fmt_ns(res.zone_jump_ns)}, like a log read in the wrong time zone" + (
                    f" (read as {zone}: check --tz)" if zone else ""
                )
            notes.append(msg)
        elif res.method == "kept":
            notes.append(
                f"{name}: its own clock agrees with the trace (best shift {_fmt_ns(res.shift_ns or 0)}, "
                f"r = {res.correlation:.2f}: within two sampling periods of ± {unc}, or no better than unshifted)"
            )
        elif res.method in ("ambiguous", "weak"):
            notes.append(
                f"{name}: correlation with the trace is {res.method} (best r = {_r(res.correlation)} at "
                f"{_fmt_ns(res.shift_ns or 0)}, r = {_r(res.correlation_runner_up)} elsewhere): clock "
                f"{'kept as logged' if anchor in COUNTER_TRUSTED else 'left synthesized (low confidence)'}; "
                "use --offset to place it"
            )
        else:
            notes.append(
                f"{name}: its utilization does not vary where it could overlap the trace: clock "
                f"{'kept as logged' if anchor in COUNTER_TRUSTED else 'left synthesized (low confidence)'}"
            )
    return out, notes


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _align_one(
    con: duckdb.DuckDBPyConnection,
    sid: int,
    metric: str,
    eff_period: int | None,
    search_ns: int,
    anchor: str,
    spans: dict[int | None, tuple[int, int]],
    origin: int,
    busy: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
) -> CounterAlignment:
    """One log against the trace GPUs it was matched to: spans are the ranks' profiled spans, busy their GPUs'
    kernel-busy series, both on the clock and in s since origin (busy) or ns (spans)."""
    rows = con.execute(
        """
        SELECT rank, device, end_ns, end_ns - start_ns AS period_ns, value FROM clocked_counters
        WHERE source_id = ? AND metric = ? AND rank IS NOT NULL ORDER BY rank, device, end_ns""",
        [sid, metric],
    ).fetchnumpy()
    ranks, devs = np.asarray(rows["rank"]), np.asarray(rows["device"])
    t_all = np.asarray(rows["end_ns"]).astype(np.int64)
    v_all = np.asarray(rows["value"]).astype(float)
    period = int(np.median(np.asarray(rows["period_ns"])))
    eff = int(eff_period or period)
    held = eff >= 2 * period
    # A held value (NVML refreshes utilization every ~1/6–1 s) was computed on average half a refresh before it
    # was sampled, over about one refresh period.
    window = eff / 1e9
    lag = window / 2 if held else 0.0
    series: list[_Series] = []
    for key in sorted({(int(r), int(d)) for r, d in zip(ranks, devs, strict=True)}):
        if key[0] not in spans:
            continue
        sel = (ranks == key[0]) & (devs == key[1])
        ts = (t_all[sel] - origin) / 1e9
        lx, ly = _held(ts, v_all[sel], period / 1e9)
        bx, by = busy.get(key, (np.array([0.0, 1.0]), np.array([0.0, 0.0])))
        series.append(_Series(bx, by, lx, ly, (spans[key[0]][0] - origin) / 1e9, (spans[key[0]][1] - origin) / 1e9))
    none = CounterAlignment(sid, None, False, "none", None, None, None, eff, 0)
    if not series:
        return none
    log_span = ((int(t_all.min()) - origin) / 1e9, (int(t_all.max()) + period - origin) / 1e9)
    w0, w1 = min(x.w0 for x in series), max(x.w1 for x in series)
    # at most ~200k grid points over the trace's window, whatever its length (a stray event days away must
    # not make the correlation grid, and its time, explode)
    fine = max(min(period / 1e9, window) / 4, 1e-4, (w1 - w0) / 200_000)
    radius = search_ns / 1e9
    trusted = anchor in COUNTER_TRUSTED

    def overlap(shift: float) -> float:
        return max(0.0, min(log_span[1] + shift, w1) - max(log_span[0] + shift, w0))

    need = 0.5 * min(w1 - w0, log_span[1] - log_span[0])
    centers = [0.0]
    if not trusted:  # a synthesized clock may be anywhere: also try the log ending / starting with the trace
        centers += [w1 - log_span[1], w0 - log_span[0]]
    peaks = [(c, _search(series, c, radius, window, lag, fine, log_span)) for c in centers]
    zone_jump = 0.0
    if overlap(0.0) < need:
        # Off the trace altogether: a log read in the wrong zone is off by whole quarter-hours.
        zones = [k * ZONE_STEP_NS / 1e9 for k in range(-ZONE_MAX_NS // ZONE_STEP_NS, ZONE_MAX_NS // ZONE_STEP_NS + 1)]
        covering = [z for z in zones if z != 0 and overlap(z) >= need]
        for z in covering:
            peaks.append((z, _search(series, z, min(radius, ZONE_STEP_NS / 2e9), window, lag, fine, log_span)))
    found = [(c, p) for c, p in peaks if p is not None]
    r0v = _correlate(series, np.array([0.0]), fine, window, lag, log_span)[0]
    r0 = None if np.isnan(r0v) else float(r0v)
    if not found:
        covering = [c for c, _ in peaks if c != 0 and c not in centers]
        if len(covering) == 1 and overlap(0.0) < need:
            z = covering[0]
            return CounterAlignment(sid, int(round(z * 1e9)), True, "zone", None, None, r0, eff, int(round(z * 1e9)))
        return none
    c, best = max(found, key=lambda cp: cp[1].r)
    away = max(2 * window, 1.0)  # searches from several centres can find the same peak: that is no rival
    others = [p.r for _, p in found if abs(p.shift - best.shift) > away] + (
        [best.runner_up] if best.runner_up is not None else []
    )
    runner = max(others) if others else None
    shift_ns = int(round(best.shift * 1e9))
    clear = best.r >= 0.5 and (runner is None or best.r - runner >= 0.1)
    if c not in centers:
        zone_jump = c
    if not clear:
        if zone_jump and len([cc for cc, _ in peaks if cc not in centers]) == 1:
            z = int(round(zone_jump * 1e9))  # the only quarter-hour that puts the log on the trace
            return CounterAlignment(sid, z, True, "zone", best.r, runner, r0, eff, z)
        return CounterAlignment(sid, shift_ns, False, "ambiguous" if best.r >= 0.5 else "weak", best.r, runner, r0, eff, 0)
    # A log's own clock is trusted to about a sampling period: a nearby optimum is noise, not evidence.
    if trusted and (abs(best.shift) <= 2 * window or (r0 is not None and best.r - r0 < 0.1)):
        return CounterAlignment(sid, shift_ns, False, "kept", best.r, runner, r0, eff, 0)
    return CounterAlignment(sid, shift_ns, True, "correlation", best.r, runner, r0, eff, int(round(zone_jump * 1e9)))


# ----------------------------------------------------------------------------------------------- stage


def align(
    con: duckdb.DuckDBPyConnection, offsets: Sequence[str | ForcedOffset] = (), counter_search_ns: int = DEFAULT_SEARCH_NS
) -> list[str]:
    """The align stage: ranks, anchors, forced offsets, rank alignment, counter logs — each refining the `clock`
    table — then the offsets applied to the store's times in one pass. Returns notes."""
    forced = [o if isinstance(o, ForcedOffset) else parse_offset(o) for o in offsets]
    notes = assign_ranks(con)
    for path, zone, src_notes in con.execute(
        "SELECT path, time_zone, notes FROM sources WHERE time_zone IS NOT NULL ORDER BY source_id"
    ).fetchall():
        said = next((n for n in (src_notes or "").split("; ") if "read as" in n), f"local times read as {zone}")
        notes.append(f"{Path(path).name}: {said}")
    anchor_sources(con)
    try:
        fixed = apply_forced(con, forced)
        notes += one_recording(con)
        _, rank_notes = align_ranks(con, fixed)
        notes += rank_notes
        notes += match_counter_gpus(con)
        _, counter_notes = align_counters(con, fixed, counter_search_ns)
        notes += counter_notes
    finally:
        _drop_clocked_views(con)
    apply_clock(con)
    return notes
