"""Blocks of the measurement library computed in numpy instead of SQL, where DuckDB's window operator is the cost.

A module marks such a block `-- native: NAME {` … `-- }`: the SQL inside stays the definition (the docs, and the
reference `sql.reference()` runs it), and `sql.install` calls `NATIVE[NAME](con)` in its place, which creates the
same objects with the same rows. Each function reads the block's inputs from the store as columns, works on whole
arrays (one sort, cumulative sums; no Python loop over rows) and hands its result back as an Arrow table that the
block's own column expressions type; where an integer sum could leave int64 (which SQL's HUGEINT would hold) it
runs the SQL instead. `tests/test_measure_native.py` checks each against its SQL on real traces.

Under a memory budget (`--memory-budget`) the store's DuckDB keeps to its own limit and spills; what a block holds
in numpy comes on top of it. The run gives its blocks an allowance (`allow`, from the part of the budget kept for
Python); a block whose input would take more (its rows × `BYTES_PER_ROW`) runs its SQL instead, which DuckDB
spills. Without an allowance (no budget, or a store the pipeline did not open) a block always runs natively.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import vocab

_SAFE = float(2**62)  # |running sums| below this fit int64 whatever the order they are added in

# Peak memory a block holds per row of its input (the input read as columns, the sort's order and the sorted
# copies, the result handed back as Arrow), measured with RSS sampled every 10 ms on a 2 GiB Kineto trace (2.05 M
# parts, 2.05 M gaps with 0.82 M host intervals, 4.12 M stretches: +620, +908 and +928 MiB), rounded up.
BYTES_PER_ROW = {"sweep_segments": 320, "short_gaps": 340, "stretch_islands": 240}
INPUT_ROWS = {  # each block's input rows
    "sweep_segments": "SELECT count(*) FROM _sw_parts WHERE e > s",
    "short_gaps": "SELECT (SELECT count(*) FROM _sw_gaps) + (SELECT count(*) FROM _sw_hunion)",
    "stretch_islands": "SELECT count(*) FROM _sw_c",
}
_allowances: dict[str, int] = {}  # a store's file → the bytes its native blocks may hold (one dict operation each: thread-safe)


def _store_path(con: duckdb.DuckDBPyConnection) -> str | None:
    """The file of the connection's database (one per run store; shared by its cursors), None in memory."""
    rows = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    return rows[0][0] if rows and rows[0][0] else None


def allow(con: duckdb.DuckDBPyConnection, nbytes: int | None) -> None:
    """The memory the native blocks on this store (and its cursors) may hold; None: no limit (forgets it)."""
    path = _store_path(con)
    if path is not None and nbytes is not None:
        _allowances[path] = int(nbytes)
    elif path is not None:
        _allowances.pop(path, None)


def fits(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether block `name` may run natively on this store: no allowance set, or its input fits it."""
    allowance = _allowances.get(_store_path(con) or "") if _allowances else None
    if allowance is None:
        return True
    ((rows,),) = con.execute(INPUT_ROWS[name]).fetchall()
    return int(rows or 0) * BYTES_PER_ROW[name] <= allowance


def _fits(x: np.ndarray, at: np.ndarray) -> bool:
    """Whether every partial sum of the grouped `x` (and every group's sum) stays well inside int64."""
    f = x.astype(np.float64)
    return bool(np.abs(np.add.reduceat(f, at)).max() < _SAFE and np.abs(np.cumsum(np.add.reduceat(f, at))).max() < _SAFE)


def sweep_segments(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_seg` (busy stretches: running sums of the packed class counts and the fixed-point rates
    over each window's cut points) and `_sw_busy` (the union of the window's activities) from `_sw_parts`.

    Every part adds its code and rate at its start and takes them away at its end, so each window's sums return
    to 0 at its last point: one running sum over the points sorted by (window, time) is each window's own. A
    busy stretch is a point where the sum of codes is > 0, up to the window's next point; the busy islands are
    runs of busy stretches that touch (the union of the parts, touching ones merged, as interval_union)."""
    p = con.sql("SELECT wid, s, e, code, rate FROM _sw_parts WHERE e > s").fetchnumpy()
    code = np.asarray(p["code"], dtype=np.int64)
    rate = np.asarray(p["rate"], dtype=np.int64)
    wid = np.concatenate([np.asarray(p["wid"], dtype=np.int64)] * 2)
    t = np.concatenate([np.asarray(p["s"], dtype=np.int64), np.asarray(p["e"], dtype=np.int64)])
    dk = np.concatenate([code, -code])
    dr = np.concatenate([rate, -rate])
    order = np.lexsort((t, wid))
    wid, t, dk, dr = wid[order], t[order], dk[order], dr[order]
    first = np.ones(t.size, dtype=bool)
    first[1:] = (wid[1:] != wid[:-1]) | (t[1:] != t[:-1])
    at = np.flatnonzero(first)
    if at.size:
        k = np.cumsum(np.add.reduceat(dk, at))
        r = np.cumsum(np.add.reduceat(dr, at))
        # the same sums in floating point (each within far less than 2^61 of the exact one): int64 held them
        if not _fits(dk, at) or not _fits(dr, at):
            con.execute(reference_sql)  # sums SQL holds in HUGEINT (and checks when cast): its own way
            return
    else:
        k = r = np.zeros(0, dtype=np.int64)
    pw, pt = wid[at], t[at]
    last = np.ones(pt.size, dtype=bool)  # a window's last point: no next point (lead() is NULL)
    last[:-1] = pw[1:] != pw[:-1]
    t_next = np.empty_like(pt)
    t_next[:-1] = pt[1:]
    keep = ~last & (k > 0)
    sw, st, sn = pw[keep], pt[keep], t_next[keep]
    seg = pa.table({"wid": sw, "t": st, "t_next": sn, "k": k[keep], "r": r[keep]})
    scale = vocab.RATE_FIXED_SCALE
    con.register("_sw_native_seg", seg)
    try:
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _sw_seg AS
            SELECT wid, t, t_next,
                   (k & 127)::INTEGER AS cb, ((k >> 7) & 127)::INTEGER AS mb,
                   ((k >> 14) & 127)::INTEGER AS uk, ((k >> 21) & 127)::INTEGER AS um,
                   ((k >> 28) & 127)::INTEGER AS nw, ((k >> 35) & 127)::INTEGER AS pp,
                   ((k >> 42) & 127)::INTEGER AS nc, ((k >> 49) & 127)::INTEGER AS cp,
                   greatest(r::DOUBLE / {scale!r}, 0.0) AS r
            FROM _sw_native_seg""")
    finally:
        con.unregister("_sw_native_seg")
    # busy islands: a stretch that does not start where the one before it (same window) ended begins one
    begins = np.ones(sw.size, dtype=bool)
    begins[1:] = (sw[1:] != sw[:-1]) | (st[1:] != sn[:-1])
    b = np.flatnonzero(begins)
    ends = np.append(b[1:], sw.size)[: b.size] - 1
    busy = pa.table({"wid": sw[b], "start_ns": st[b], "end_ns": sn[ends]})
    con.execute(
        "CREATE OR REPLACE TEMP VIEW _sw_parts_v AS SELECT wid AS grp, s AS start_ns, e AS end_ns FROM _sw_parts WHERE e > s"
    )
    con.register("_sw_native_busy", busy)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _sw_busy AS SELECT wid, start_ns, end_ns FROM _sw_native_busy")
    finally:
        con.unregister("_sw_native_busy")


def round_half_away(y: np.ndarray) -> np.ndarray:
    """round() as DuckDB rounds a DOUBLE: half away from zero (numpy's rounds half to even)."""
    whole = np.trunc(y)
    return whole + np.where(np.abs(y - whole) >= 0.5, np.sign(y), 0.0)


def _fixed(x: np.ndarray, scale: float) -> np.ndarray | None:
    """round(x * scale) as DuckDB rounds a DOUBLE (half away from zero) in int64; None when one may not fit."""
    y = x * scale
    if y.size and not (np.abs(y).max() < _SAFE):  # (also false for NaN)
        return None
    return round_half_away(y).astype(np.int64)


def _sums(x: np.ndarray, at: np.ndarray) -> np.ndarray | None:
    """Sums of `x` over the groups starting at `at` in int64; None when one may not fit (SQL sums in HUGEINT)."""
    if not (np.add.reduceat(np.abs(x).astype(np.float64), at).max() < _SAFE):
        return None
    return np.add.reduceat(x, at)


def stretch_islands(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_m`: the stretches of `_sw_c` merged where consecutive ones of a window have one
    category (NULL a category of its own; a window's leading NULL stretches one island), with their achieved and
    uncapped peak-time summed in fixed point as `exact_sum` does (round(x · scale) added as integers, then
    / scale) and their capped time."""
    c = con.sql("SELECT wid, t, t_next, busy, r, category FROM _sw_c").to_arrow_table()
    wid = c.column("wid").to_numpy()
    t = c.column("t").to_numpy()
    t_next = c.column("t_next").to_numpy()
    r = c.column("r").to_numpy()
    cat = c.column("category").combine_chunks().dictionary_encode()
    code = cat.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    dt = (t_next - t).astype(np.float64)
    scale = vocab.NS_FIXED_SCALE
    achieved, uncapped = _fixed(np.minimum(r, 1.0) * dt, scale), _fixed(r * dt, scale)
    if achieved is None or uncapped is None:
        con.execute(reference_sql)
        return
    order = np.lexsort((t, wid))
    wid, t, t_next, code, achieved, uncapped = (a[order] for a in (wid, t, t_next, code, achieved, uncapped))
    capped = np.where(r[order] > 1.0 + 1e-9, t_next - t, 0)
    # lag(category) over the window: NULL before a window's first stretch, so a leading NULL category starts none
    prev = np.full(code.size, -1, dtype=np.int64)
    prev[1:] = code[:-1]
    starts_window = np.ones(code.size, dtype=bool)
    starts_window[1:] = wid[1:] != wid[:-1]
    prev[starts_window] = -1
    chg = code != prev
    begins = starts_window | chg
    at = np.flatnonzero(begins)
    if not at.size:
        con.execute(reference_sql)  # no stretches: the SQL makes the empty table with its types
        return
    achieved_sum, uncapped_sum = _sums(achieved, at), _sums(uncapped, at)
    if achieved_sum is None or uncapped_sum is None:
        con.execute(reference_sql)
        return
    has_cat = code[at] >= 0
    m = pa.table(
        {
            "wid": wid[at],
            "start_ns": np.minimum.reduceat(t, at),
            "end_ns": np.maximum.reduceat(t_next, at),
            "category": cat.dictionary.take(pa.array(np.where(has_cat, code[at], 0), mask=~has_cat)),
            "busy": c.column("busy").to_numpy(zero_copy_only=False)[order][at],
            "achieved": achieved_sum,
            "has_cat": has_cat,
            "capped_ns": np.add.reduceat(capped, at),
            "uncapped": uncapped_sum,
        }
    )
    con.register("_sw_native_m", m)
    try:
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _sw_m AS
            SELECT wid, start_ns, end_ns, category, busy,
                   CASE WHEN has_cat THEN achieved::HUGEINT / {scale!r} END AS achieved_ns,
                   capped_ns::HUGEINT AS capped_ns, uncapped::HUGEINT / {scale!r} AS uncapped_ns
            FROM _sw_native_m""")
    finally:
        con.unregister("_sw_native_m")


_KINDS = ("launch", "startup", "loader")
_NULL_RANK = np.iinfo(np.int64).min  # the host activity a short gap is named by (stretches.sql)


def short_gaps(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_short`: each idle gap up to vocab.LAUNCH_GAP_MAX_NS long, with whether the host was
    launching, setting up or loading at some time in it — for each kind, the last merged host interval of the
    gap's rank to start before the gap ends (`_sw_hunion`: they do not overlap) overlaps it, or none does.

    One sort answers every look-up: the intervals' starts and the gaps' ends, keyed by (rank, kind), in time order
    with a gap's end before an interval that starts at that instant (the ASOF condition is start < end); the last
    interval at or before each gap end is a running maximum of interval positions."""
    g = con.sql(
        f"SELECT wid, gap_no, rank, start_ns, end_ns, after_sync FROM _sw_gaps "
        f"WHERE end_ns - start_ns <= {int(vocab.LAUNCH_GAP_MAX_NS)}"
    ).to_arrow_table()
    kinds = ", ".join(f"'{k}'" for k in _KINDS)
    h = con.sql(f"SELECT rank, kind, start_ns, end_ns FROM _sw_hunion WHERE kind IN ({kinds})").to_arrow_table()
    n = g.num_rows
    if n == 0:
        con.execute(reference_sql)  # no short gaps: the SQL makes the empty table with its types
        return
    # ranks as codes; a NULL rank one of its own, matching a NULL rank (IS NOT DISTINCT FROM)
    g_rank, h_rank = (pc.fill_null(t.column("rank").cast(pa.int64()), _NULL_RANK).to_numpy() for t in (g, h))
    _, codes = np.unique(np.concatenate([g_rank, h_rank]), return_inverse=True)
    g_code, h_code = codes[:n], codes[n:]
    kind_of = {k: i for i, k in enumerate(_KINDS)}
    h_kind = np.array([kind_of[k] for k in h.column("kind").to_pylist()], dtype=np.int64) if h.num_rows else np.zeros(0, np.int64)
    g_start = g.column("start_ns").to_numpy()
    g_end = g.column("end_ns").to_numpy()
    k = len(_KINDS)
    q_key = np.concatenate([g_code * k + i for i in range(k)])  # query j·n + row: kind j of gap `row`
    q_t = np.tile(g_end, k)
    h_start = h.column("start_ns").to_numpy()
    h_end = h.column("end_ns").to_numpy()
    ev_key = np.concatenate([h_code * k + h_kind, q_key])
    ev_t = np.concatenate([h_start, q_t])
    ev_is_h = np.concatenate([np.ones(h.num_rows, dtype=bool), np.zeros(q_key.size, dtype=bool)])
    order = np.lexsort((ev_is_h, ev_t, ev_key))
    pos = np.where(ev_is_h[order], np.arange(order.size), -1)
    last = np.maximum.accumulate(pos)  # the last interval start at or before each event, in sorted order
    found = last >= 0
    key_sorted = ev_key[order]
    found &= np.where(found, key_sorted[np.maximum(last, 0)] == key_sorted, False)
    end_of = np.concatenate([h_end, np.zeros(q_key.size, dtype=h_end.dtype)])[order]
    q_pos = np.empty(q_key.size, dtype=np.int64)  # where each query landed
    q_rows = order[~ev_is_h[order]] - h.num_rows
    q_pos[q_rows] = np.flatnonzero(~ev_is_h[order])
    hit = found[q_pos] & (end_of[np.maximum(last[q_pos], 0)] > np.tile(g_start, k))
    present = hit.reshape(k, n)
    out = pa.table(
        {
            "wid": g.column("wid"),
            "gap_no": g.column("gap_no"),
            "t": g.column("start_ns"),
            "t_next": g.column("end_ns"),
            "h_startup": present[kind_of["startup"]].astype(np.int32),
            "h_loader": present[kind_of["loader"]].astype(np.int32),
            "after_sync": g.column("after_sync"),
            "gap_launching": present[kind_of["launch"]],
        }
    )
    con.register("_sw_native_short", out)
    try:
        con.execute("""
            CREATE OR REPLACE TEMP TABLE _sw_short AS
            SELECT wid, gap_no, t, t_next, 0 AS h_call, 0 AS h_op, h_startup, h_loader, t AS gap_start,
                   t_next - t AS gap_ns, after_sync, gap_launching
            FROM _sw_native_short""")
    finally:
        con.unregister("_sw_native_short")


NATIVE: dict[str, Callable[[duckdb.DuckDBPyConnection, str], None]] = {
    "short_gaps": short_gaps,
    "sweep_segments": sweep_segments,
    "stretch_islands": stretch_islands,
}
