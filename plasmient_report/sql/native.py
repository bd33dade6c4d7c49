"""Blocks of the measurement library computed in numpy instead of SQL, where DuckDB's window operator is the cost.

A module marks such a block `-- native: NAME {` … `-- }`: the SQL inside stays the definition (the docs, and the
reference `sql.reference()` runs it), and `sql.install` calls `NATIVE[NAME](con)` in its place, which creates the
same objects with the same rows. Each function reads the block's inputs from the store as columns, works on whole
arrays (one sort, cumulative sums; no Python loop over rows) and hands its result back as an Arrow table that the
block's own column expressions type; where an integer sum could leave int64 (which SQL's HUGEINT would hold) it
runs the SQL instead. `tests/test_measure_native.py` checks each against its SQL on real traces.

Under a memory budget (`--memory-budget`) the store's DuckDB keeps to its own limit and spills; what a block holds
in numpy comes on top of it. The run gives its blocks an allowance (`allow`, from the part of the budget kept for
Python). A block whose input would take more (its rows × `BYTES_PER_ROW`) has DuckDB sort its input (spilling)
and reads it back in slices that fit (`SLICE_BYTES_PER_ROW`), carrying its running state from one slice to the
next: the sweep and the islands. The short gaps need no sort: their host intervals are held whole (their SQL
runs instead when those alone would take half the allowance) and the gaps read a slice of rows at a time.
Without an allowance (no budget, or a store the pipeline did not open) a block always runs on its whole input.

Two blocks are SQL both ways, for what DuckDB holds in memory and cannot spill: launch_stats' quantiles (their
groups' values) and shapes' recursive walk up the callers. Where those would take more than half of DuckDB's
limit, `launch_stats` computes the same rows from the values sorted within their groups and `shape_owners` walks
one level at a time, which both spill.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import vocab

_SAFE = float(2**62)  # |running sums| below this fit int64 whatever the order they are added in

# Peak memory a block holds per row of its input (the input read as columns, the sort's order and the sorted
# copies, the result handed back as Arrow), measured with RSS sampled every 10 ms on a 2 GiB Kineto trace (2.05 M
# parts, 4.12 M stretches: +620 and +928 MiB), rounded up.
BYTES_PER_ROW = {"sweep_segments": 320, "stretch_islands": 240, "nest_ops": 260}
# (`nest_ops`: kernel_flops._nest_arrays, the ops nested on their threads in numpy, +1,019 MiB for the 4 GiB Kineto
# trace's 4.12 M ops, the run's peak there under any budget; beyond the allowance its SQL runs instead, which
# spills: 6.4 s and a 391 MiB peak under DuckDB's 256 MiB, against 3.5 s.)
# The same for a slice of the input (tracemalloc's peak plus Arrow's pool on the 2 GiB trace): the sweep's sorted
# points (a part's start or end; 167 MiB per 0.84 M) and stretches (152 MiB per 0.56 M) read back with the
# carried ones and the slice's arrays; the short gaps' rows (39 B each beside their results) and, held whole
# beside them, the host intervals sorted (70 MiB for 0.82 M). Rounded up.
SLICE_BYTES_PER_ROW = {"sweep_segments": 220, "stretch_islands": 300, "short_gaps": 100}
INTERVAL_BYTES = 120
INPUT_ROWS = {  # each block's input rows
    "sweep_segments": "SELECT count(*) FROM _sw_parts WHERE e > s",
    "stretch_islands": "SELECT count(*) FROM _sw_c",
    "nest_ops": "SELECT count(*) FROM ops",
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


def _fits(x: np.ndarray, at: np.ndarray, start: int = 0) -> bool:
    """Whether every partial sum of the grouped `x` from `start` (and every group's sum) stays well inside int64."""
    g = np.add.reduceat(x.astype(np.float64), at)
    return bool(np.abs(g).max() < _SAFE and np.abs(float(start) + np.cumsum(g)).max() < _SAFE)


def _slice_rows(con: duckdb.DuckDBPyConnection, name: str, held: int = 0) -> int | None:
    """How many rows of its input block `name` may hold at once on this store: None when its whole input fits (or no
    allowance is set), else its allowance (less the `held` host intervals of the short gaps) over a slice's bytes
    per row (at least one)."""
    allowance = _allowances.get(_store_path(con) or "") if _allowances else None
    if allowance is None or (name in INPUT_ROWS and fits(con, name)):
        return None
    return max(1, (allowance - held * INTERVAL_BYTES) // SLICE_BYTES_PER_ROW[name])


def _in_order(
    con: duckdb.DuckDBPyConnection, query: str, keys: tuple[str, ...], rows: int | None
) -> Generator[tuple[pa.Table, bool]]:
    """The rows of `query` sorted by `keys`, each slice with whether it is the last: one table sorted here when
    `rows` is None, else DuckDB sorts them (spilling under its memory limit) into a temp table read back `rows` at
    a time, in order (none when there are no rows)."""
    if rows is None:
        t = con.sql(query).to_arrow_table()
        yield t.take(np.lexsort([t.column(k).to_numpy() for k in reversed(keys)])), True
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE _native_sorted AS {query} ORDER BY {', '.join(keys)}")
    try:
        ((n,),) = con.execute("SELECT count(*) FROM _native_sorted").fetchall()
        for a in range(0, n, rows):  # a temp table made by a sorted SELECT keeps its rows in that order (rowid)
            sl = con.sql(f"SELECT * FROM _native_sorted WHERE rowid >= {a} AND rowid < {a + rows}").to_arrow_table()
            yield sl, a + rows >= n
    finally:
        con.execute("DROP TABLE IF EXISTS _native_sorted")


def _ordered(w: np.ndarray, t: np.ndarray, after: tuple[int, int] | None) -> bool:
    """Whether (w, t) is sorted, starting at or after `after` (a slice read back must continue the one before)."""
    if after is not None and w.size and (int(w[0]), int(t[0])) < after:
        return False
    return bool(np.all((w[1:] > w[:-1]) | ((w[1:] == w[:-1]) & (t[1:] >= t[:-1]))))


class _Put:
    """A table written a slice at a time: the first slice creates it (typed by `select` over the slice), the next
    ones are appended in order."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str, select: str) -> None:
        self.con, self.table, self.select, self.made = con, table, select, False

    def __call__(self, data: pa.Table) -> None:
        view = f"_native_put_{self.table.lstrip('_')}"
        self.con.register(view, data)
        try:
            head = "INSERT INTO" if self.made else "CREATE OR REPLACE TEMP TABLE"
            self.con.execute(f"{head} {self.table} {'' if self.made else 'AS '}SELECT {self.select} FROM {view}")
        finally:
            self.con.unregister(view)
        self.made = True


_SEG_SELECT = f"""wid, t, t_next,
    (k & 127)::INTEGER AS cb, ((k >> 7) & 127)::INTEGER AS mb, ((k >> 14) & 127)::INTEGER AS uk,
    ((k >> 21) & 127)::INTEGER AS um, ((k >> 28) & 127)::INTEGER AS nw, ((k >> 35) & 127)::INTEGER AS pp,
    ((k >> 42) & 127)::INTEGER AS nc, ((k >> 49) & 127)::INTEGER AS cp,
    greatest(r::DOUBLE / {vocab.RATE_FIXED_SCALE!r}, 0.0) AS r"""


def sweep_segments(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_seg` (busy stretches: running sums of the packed class counts and the fixed-point rates
    over each window's cut points) and `_sw_busy` (the union of the window's activities) from `_sw_parts`.

    Every part adds its code and rate at its start and takes them away at its end, so each window's sums return
    to 0 at its last point: one running sum over the points sorted by (window, time) is each window's own. A
    busy stretch is a point where the sum of codes is > 0, up to the window's next point; the busy islands are
    runs of busy stretches that touch (the union of the parts, touching ones merged, as interval_union).

    Points too many for the run's memory allowance come sorted from DuckDB a slice at a time; the sums, the
    slice's last point (which the next slice may go on) and the busy island still open carry over."""
    rows = _slice_rows(con, "sweep_segments")
    points = (
        "SELECT wid, s AS t, code AS dk, rate AS dr FROM _sw_parts WHERE e > s "
        "UNION ALL SELECT wid, e, -code, -rate FROM _sw_parts WHERE e > s"
    )
    slices = _in_order(con, points, ("wid", "t"), rows)
    with contextlib.closing(slices):
        _sweep_slices(con, reference_sql, slices)


def _sweep_slices(con: duckdb.DuckDBPyConnection, reference_sql: str, slices: Iterator[tuple[pa.Table, bool]]) -> None:
    put_seg, put_busy = _Put(con, "_sw_seg", _SEG_SELECT), _Put(con, "_sw_busy", "wid, start_ns, end_ns")
    held: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * 4  # the last point of the slice before (it may go on)
    k0 = r0 = 0  # the running sums before it
    isl: tuple[int, int, int] | None = None  # the busy island still open: (wid, start, end)
    after: tuple[int, int] | None = None
    for chunk, final in slices:
        cols = [chunk.column(c).to_numpy().astype(np.int64, copy=False) for c in ("wid", "t", "dk", "dr")]
        if not _ordered(cols[0], cols[1], after):
            con.execute(reference_sql)  # (never seen: DuckDB gave a sorted slice out of order) the SQL, whole
            return
        after = (int(cols[0][-1]), int(cols[1][-1])) if cols[0].size else after
        wid, t, dk, dr = (np.concatenate([h, c]) for h, c in zip(held, cols, strict=True))
        first = np.ones(t.size, dtype=bool)
        first[1:] = (wid[1:] != wid[:-1]) | (t[1:] != t[:-1])
        at = np.flatnonzero(first)
        done = at if final else at[:-1]  # the points summed now (the last may go on into the next slice)
        stop = t.size if final or not at.size else int(at[-1])
        held = [a[stop:] for a in (wid, t, dk, dr)]
        if not done.size:
            continue
        if not _fits(dk[:stop], done, k0) or not _fits(dr[:stop], done, r0):
            con.execute(reference_sql)  # sums SQL holds in HUGEINT (and checks when cast): its own way, whole
            return
        k = k0 + np.cumsum(np.add.reduceat(dk[:stop], done))
        r = r0 + np.cumsum(np.add.reduceat(dr[:stop], done))
        k0, r0 = int(k[-1]), int(r[-1])
        pw, pt = wid[at], t[at]  # every point in the buffer: a point's next one may be the held point
        last = np.ones(pt.size, dtype=bool)  # a window's last point: no next point (lead() is NULL)
        last[:-1] = pw[1:] != pw[:-1]
        t_next = np.empty_like(pt)
        t_next[:-1] = pt[1:]
        m = done.size
        keep = ~last[:m] & (k > 0)
        sw, st, sn = pw[:m][keep], pt[:m][keep], t_next[:m][keep]
        put_seg(pa.table({"wid": sw, "t": st, "t_next": sn, "k": k[keep], "r": r[keep]}))
        # busy islands: a stretch that does not start where the one before it (same window) ended begins one
        begins = np.ones(sw.size, dtype=bool)
        begins[1:] = (sw[1:] != sw[:-1]) | (st[1:] != sn[:-1])
        if sw.size and isl is not None and isl[0] == sw[0] and isl[2] == st[0]:
            begins[0] = False
        b = np.flatnonzero(begins)
        ends = np.append(b[1:], sw.size) - 1  # each island's last stretch
        if isl is not None and sw.size and not begins[0]:  # the open island goes on
            isl = (isl[0], isl[1], int(sn[b[0] - 1] if b.size else sn[-1]))
        if isl is not None and b.size:  # …and a new one closed it
            put_busy(pa.table({"wid": [isl[0]], "start_ns": [isl[1]], "end_ns": [isl[2]]}, schema=_BUSY))
            isl = None
        if b.size:
            put_busy(pa.table({"wid": sw[b[:-1]], "start_ns": st[b[:-1]], "end_ns": sn[ends[:-1]]}, schema=_BUSY))
            isl = (int(sw[b[-1]]), int(st[b[-1]]), int(sn[ends[-1]]))
    if isl is not None:
        put_busy(pa.table({"wid": [isl[0]], "start_ns": [isl[1]], "end_ns": [isl[2]]}, schema=_BUSY))
    if not put_seg.made or not put_busy.made:
        empty = pa.table({"wid": [], "t": [], "t_next": [], "k": [], "r": []}, schema=_SEG)
        if not put_seg.made:
            put_seg(empty)
        if not put_busy.made:
            put_busy(pa.table({"wid": [], "start_ns": [], "end_ns": []}, schema=_BUSY))
    con.execute(
        "CREATE OR REPLACE TEMP VIEW _sw_parts_v AS SELECT wid AS grp, s AS start_ns, e AS end_ns FROM _sw_parts WHERE e > s"
    )


_SEG = pa.schema([(c, pa.int64()) for c in ("wid", "t", "t_next", "k", "r")])
_BUSY = pa.schema([(c, pa.int64()) for c in ("wid", "start_ns", "end_ns")])


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


def _sums(x: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Sums of `x` over the groups starting at `at` in int64, with the sums of |x| in floating point (their bound,
    for adding groups later); None when one may not fit (SQL sums in HUGEINT)."""
    bound = np.add.reduceat(np.abs(x).astype(np.float64), at)
    if not (bound.max() < _SAFE):
        return None
    return np.add.reduceat(x, at), bound


_M_SELECT = f"""wid, start_ns, end_ns, category, busy,
    CASE WHEN has_cat THEN achieved::HUGEINT / {vocab.NS_FIXED_SCALE!r} END AS achieved_ns,
    capped_ns::HUGEINT AS capped_ns, uncapped::HUGEINT / {vocab.NS_FIXED_SCALE!r} AS uncapped_ns"""


def stretch_islands(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_m`: the stretches of `_sw_c` merged where consecutive ones of a window have one
    category (NULL a category of its own; a window's leading NULL stretches one island), with their achieved and
    uncapped peak-time summed in fixed point as `exact_sum` does (round(x · scale) added as integers, then
    / scale) and their capped time.

    Stretches too many for the run's memory allowance come sorted from DuckDB a slice at a time; the island
    still open at a slice's end (its sums so far) carries over and is merged with the next slice's first."""
    query = "SELECT wid, t, t_next, busy, r, category FROM _sw_c"
    slices = _in_order(con, query, ("wid", "t"), _slice_rows(con, "stretch_islands"))
    with contextlib.closing(slices):
        if not _island_slices(con, slices):
            con.execute(reference_sql)  # a sum that could leave int64, or no stretches: the SQL, whole


def _island_slices(con: duckdb.DuckDBPyConnection, slices: Iterator[tuple[pa.Table, bool]]) -> bool:
    """`_sw_m` from `_sw_c`'s rows in (wid, t) order; False (nothing usable written) where the SQL must run."""
    put = _Put(con, "_sw_m", _M_SELECT)
    scale = vocab.NS_FIXED_SCALE
    names: dict[str, int] = {}  # category → its code in every slice
    open_: dict[str, np.ndarray] | None = None  # the island still open (one row of each column) and its last code
    after: tuple[int, int] | None = None
    for c, _ in slices:
        wid = c.column("wid").to_numpy()
        t = c.column("t").to_numpy()
        if not _ordered(wid, t, after):
            return False  # (never seen: DuckDB gave a sorted slice out of order)
        if not wid.size:
            continue
        after = (int(wid[-1]), int(t[-1]))
        t_next = c.column("t_next").to_numpy()
        r = c.column("r").to_numpy()
        cat = c.column("category").combine_chunks().dictionary_encode()
        # codes that mean the same category in every slice (a loop over the slice's distinct categories only)
        to_code = np.array([names.setdefault(x, len(names)) for x in cat.dictionary.to_pylist()] + [-1], dtype=np.int64)
        code = to_code[cat.indices.fill_null(len(cat.dictionary)).to_numpy(zero_copy_only=False)]  # NULL: -1
        dt = (t_next - t).astype(np.float64)
        achieved, uncapped = _fixed(np.minimum(r, 1.0) * dt, scale), _fixed(r * dt, scale)
        if achieved is None or uncapped is None:
            return False
        capped = np.where(r > 1.0 + 1e-9, t_next - t, 0)
        # lag(category) over the window: NULL before a window's first stretch, so a leading NULL category starts none
        prev = np.full(code.size, -1, dtype=np.int64)
        prev[1:] = code[:-1]
        starts_window = np.ones(code.size, dtype=bool)
        starts_window[1:] = wid[1:] != wid[:-1]
        if open_ is not None:  # the stretch before this slice's first
            prev[0] = open_["last_code"][0]
            starts_window[0] = bool(open_["wid"][0] != wid[0])
        prev[starts_window] = -1
        begins = starts_window | (code != prev)
        goes_on = open_ is not None and not begins[0]
        begins[0] = True  # the slice's first run: a new island, or the open one's rest (merged below)
        at = np.flatnonzero(begins)
        a_sums, u_sums = _sums(achieved, at), _sums(uncapped, at)
        if a_sums is None or u_sums is None:
            return False
        isl = {
            "wid": wid[at],
            "start_ns": np.minimum.reduceat(t, at),
            "end_ns": np.maximum.reduceat(t_next, at),
            "code": code[at],
            "busy": c.column("busy").to_numpy(zero_copy_only=False)[at],
            "achieved": a_sums[0],
            "capped_ns": np.add.reduceat(capped, at),
            "uncapped": u_sums[0],
            "abs_a": a_sums[1],
            "abs_u": u_sums[1],
        }
        if open_ is not None and goes_on:  # the open island's rest: merged into it
            if not (open_["abs_a"][0] + isl["abs_a"][0] < _SAFE and open_["abs_u"][0] + isl["abs_u"][0] < _SAFE):
                return False
            for k, f in (("start_ns", min), ("end_ns", max)):
                isl[k][0] = f(open_[k][0], isl[k][0])
            for k in ("achieved", "capped_ns", "uncapped", "abs_a", "abs_u"):
                isl[k][0] += open_[k][0]
        elif open_ is not None:
            _put_islands(put, open_, names)
        n = at.size - 1  # every island but the last is closed; the last goes on into the next slice, or not
        _put_islands(put, {k: v[:n] for k, v in isl.items()}, names)
        open_ = {k: v[n:] for k, v in isl.items()}
        open_["last_code"] = code[-1:]
    if open_ is None:
        return False  # no stretches: the SQL makes the empty table with its types
    _put_islands(put, open_, names)
    return True


def _put_islands(put: _Put, isl: dict[str, np.ndarray], names: dict[str, int]) -> None:
    if not isl["wid"].size:
        return
    has_cat = isl["code"] >= 0
    dictionary = pa.array(list(names), type=pa.string())  # (empty when every category is NULL: all masked)
    category = dictionary.take(pa.array(np.where(has_cat, isl["code"], 0), mask=~has_cat))
    put(
        pa.table(
            {
                "wid": isl["wid"],
                "start_ns": isl["start_ns"],
                "end_ns": isl["end_ns"],
                "category": category,
                "busy": isl["busy"],
                "achieved": isl["achieved"],
                "has_cat": has_cat,
                "capped_ns": isl["capped_ns"],
                "uncapped": isl["uncapped"],
            }
        )
    )


_KINDS = ("launch", "startup", "loader")
_NULL_RANK = np.iinfo(np.int64).min  # the host activity a short gap is named by (stretches.sql)


def short_gaps(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """stretches.sql's `_sw_short`: each idle gap up to vocab.LAUNCH_GAP_MAX_NS long, with whether the host was
    launching, setting up or loading at some time in it — for each kind, the last merged host interval of the
    gap's rank to start before the gap ends (`_sw_hunion`: they do not overlap) overlaps it, or none does.

    The intervals sorted once by (rank, kind, start) answer every gap by binary search: a start as its position
    among the distinct starts, and a gap's end as the number of distinct starts before it, make one int64 key
    per interval and per (gap, kind); the last interval key below the gap's is that ASOF match, if its rank and
    kind are the gap's. The gaps need no sort: under a memory allowance they are read a slice of rows at a time."""
    kinds = ", ".join(f"'{k}'" for k in _KINDS)
    h = con.sql(f"SELECT rank, kind, start_ns, end_ns FROM _sw_hunion WHERE kind IN ({kinds})").to_arrow_table()
    allowance = _allowances.get(_store_path(con) or "") if _allowances else None
    if allowance is not None and h.num_rows * INTERVAL_BYTES > allowance // 2:
        con.execute(reference_sql)  # the intervals alone would take half the allowance: the SQL, which spills
        return
    k = len(_KINDS)
    h_rank = pc.fill_null(h.column("rank").cast(pa.int64()), _NULL_RANK).to_numpy()  # a NULL rank one of its own
    ranks = np.unique(h_rank)
    kind_of = {name: i for i, name in enumerate(_KINDS)}
    h_kind = pc.index_in(h.column("kind"), value_set=pa.array(_KINDS)).to_numpy().astype(np.int64)  # (all in _KINDS)
    h_start = h.column("start_ns").to_numpy()
    starts = np.unique(h_start)
    width = starts.size + 1
    h_key = np.searchsorted(ranks, h_rank) * k + h_kind
    comp = h_key * width + np.searchsorted(starts, h_start)
    order = np.argsort(comp, kind="stable")
    comp, h_key, h_end = comp[order], h_key[order], h.column("end_ns").to_numpy()[order]
    del h, h_rank, h_kind, h_start, order
    rows = _slice_rows(con, "short_gaps", held=comp.size)
    put = _Put(
        con,
        "_sw_short",
        "wid, gap_no, t, t_next, 0 AS h_call, 0 AS h_op, h_startup, h_loader, t AS gap_start, t_next - t AS gap_ns, "
        "after_sync, gap_launching",
    )
    short = f"end_ns - start_ns <= {int(vocab.LAUNCH_GAP_MAX_NS)}"
    ((n,),) = con.execute("SELECT coalesce(max(rowid) + 1, 0) FROM _sw_gaps").fetchall()  # (the rowids: a slice each)
    for a in range(0, max(n, 1), rows or max(n, 1)):
        g = con.sql(
            f"SELECT wid, gap_no, rank, start_ns, end_ns, after_sync FROM _sw_gaps "
            f"WHERE {short}" + ("" if rows is None else f" AND rowid >= {a} AND rowid < {a + rows}")
        ).to_arrow_table()
        g_rank = pc.fill_null(g.column("rank").cast(pa.int64()), _NULL_RANK).to_numpy()
        at = np.searchsorted(ranks, g_rank)
        known = at < ranks.size
        known[known] = ranks[at[known]] == g_rank[known]
        before = np.searchsorted(starts, g.column("end_ns").to_numpy())  # distinct starts < the gap's end
        g_start = g.column("start_ns").to_numpy()
        present = []
        for j in range(k):  # (the three kinds)
            key = at * k + j
            i = np.searchsorted(comp, key * width + before) - 1  # the last interval key below the gap's
            hit = known & (i >= 0)
            i = np.maximum(i, 0)
            present.append(hit & (h_key[i] == key) & (h_end[i] > g_start) if comp.size else hit)
        if g.num_rows or not put.made:
            put(
                pa.table(
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
            )


# launch_stats.sql's quantile states: DuckDB holds every value of a group until the group ends, and cannot spill
# them. Measured on the 4 GiB Kineto trace's store (2.18 M rows of window_kernels): its SQL needs more than 128 and
# at most 160 MiB of DuckDB's memory (and, with the six states it had before, more than 160 MiB; the 8 GiB trace's
# 4.35 M rows ran out of 256 MiB under --memory-budget 1GiB). Rounded up, per row of window_kernels.
LAUNCH_STATS_BYTES_PER_ROW = 96

# The same table from the values sorted within their group (which spills): the p50 is the value at position
# max(1, n - floor(n - 0.5 n)) of the group's n non-NULL values in order, as quantile_disc picks it.
_LAUNCH_STATS_SORTED = """
CREATE OR REPLACE TABLE launch_stats AS
WITH a AS (
    SELECT * FROM _ls_kernels
), g AS MATERIALIZED (
    SELECT scope, range_name, rank, device, stream, count(*) AS kernels, count(delay_ns) AS launched,
           count(*) FILTER (WHERE regexp_matches(coalesce(launch_name, ''), {{GRAPH_LAUNCH_API_RE}})) AS graph_kernels,
           max(delay_ns) AS launch_delay_max_ns, max(dur_ns) AS kernel_max_ns, sum(dur_ns) AS kernel_ns,
           row_number() OVER () AS gid
    FROM a GROUP BY scope, range_name, rank, device, stream
), ag AS MATERIALIZED (
    SELECT g.gid, a.dur_ns, a.delay_ns, a.launch_thread, a.launch_start_ns, a.launch_end_ns
    FROM a JOIN g ON g.scope IS NOT DISTINCT FROM a.scope AND g.range_name IS NOT DISTINCT FROM a.range_name
                 AND g.rank IS NOT DISTINCT FROM a.rank AND g.device IS NOT DISTINCT FROM a.device
                 AND g.stream IS NOT DISTINCT FROM a.stream
), calls AS MATERIALIZED (
    SELECT DISTINCT gid, launch_thread, launch_start_ns, launch_end_ns FROM ag WHERE launch_start_ns IS NOT NULL
), cost AS (
    SELECT gid, count(*) AS launch_calls, max(launch_end_ns - launch_start_ns) AS launch_cost_max_ns,
           sum(launch_end_ns - launch_start_ns) AS launch_cost_ns
    FROM calls GROUP BY gid
), v AS (
    SELECT gid, 0 AS m, launch_end_ns - launch_start_ns AS x FROM calls WHERE launch_end_ns - launch_start_ns IS NOT NULL
    UNION ALL SELECT gid, 1, delay_ns FROM ag WHERE delay_ns IS NOT NULL
    UNION ALL SELECT gid, 2, dur_ns FROM ag WHERE dur_ns IS NOT NULL
), q AS MATERIALIZED (
    SELECT gid, m, any_value(x) FILTER (WHERE i = greatest(1, n - floor(n - 0.5 * n))) AS p50,
           any_value(x) FILTER (WHERE i = greatest(1, n - floor(n - 0.99 * n))) AS p99
    FROM (SELECT gid, m, x, row_number() OVER (PARTITION BY gid, m ORDER BY x) AS i,
                 count(*) OVER (PARTITION BY gid, m) AS n FROM v)
    GROUP BY gid, m
)
SELECT g.scope, g.range_name, g.rank, g.device, g.stream, g.kernels, g.launched, g.graph_kernels, c.launch_calls,
       qd.p50 AS launch_delay_p50_ns, qd.p99 AS launch_delay_p99_ns, g.launch_delay_max_ns,
       qc.p50 AS launch_cost_p50_ns, qc.p99 AS launch_cost_p99_ns, c.launch_cost_max_ns, c.launch_cost_ns,
       qk.p50 AS kernel_p50_ns, qk.p99 AS kernel_p99_ns, g.kernel_max_ns, g.kernel_ns
FROM g LEFT JOIN cost c ON c.gid = g.gid AND g.scope IS NOT NULL AND g.device IS NOT NULL
       LEFT JOIN q qc ON qc.gid = c.gid AND qc.m = 0
       LEFT JOIN q qd ON qd.gid = g.gid AND qd.m = 1
       LEFT JOIN q qk ON qk.gid = g.gid AND qk.m = 2
"""


def launch_stats(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """launch_stats.sql's table: its SQL where the quantile states of window_kernels' rows
    (LAUNCH_STATS_BYTES_PER_ROW) take at most half of DuckDB's memory limit (the other half for what runs beside
    it), else from the values sorted within their groups, which spills: the same rows, slower (the 4 GiB Kineto
    trace's store under DuckDB's 256 MiB: 4.5-4.7 s against 2.4-2.6 s). No limit: its SQL."""
    from . import fill

    fits = _half_of_duckdb(con, "SELECT count(*) FROM window_kernels", LAUNCH_STATS_BYTES_PER_ROW)
    con.execute(reference_sql if fits else fill(_LAUNCH_STATS_SORTED, "sql/native.py"))


def _half_of_duckdb(con: duckdb.DuckDBPyConnection, rows_sql: str, bytes_per_row: int) -> bool:
    """Whether `rows_sql`'s count × `bytes_per_row` takes at most half of DuckDB's memory limit (the other half for
    what runs beside it); True when the limit cannot be read."""
    from .. import store

    ((limit, rows),) = con.execute(f"SELECT current_setting('memory_limit'), ({rows_sql})").fetchall()
    cap = store.size_bytes(str(limit))
    return cap is None or int(rows or 0) * bytes_per_row <= cap // 2


# shapes.sql's walk up from each launching op through its callers (a recursive CTE, which DuckDB holds in memory
# with its join's table of every op): measured on the 4 GiB Kineto trace's store (4.12 M ops, a walk of 2.39 M
# rows) it needs more than 160 and at most 192 MiB of DuckDB's memory; the 8 GiB trace's ran out of 256 MiB under
# --memory-budget 1GiB. Rounded up, per op and per row of the walk.
SHAPE_WALK_BYTES_PER_ROW = 40


def shape_owners(con: duckdb.DuckDBPyConnection, reference_sql: str) -> None:
    """shapes.sql's `_ks_owner`: its recursive SQL where the ops and the walk (each launching op's depth + 1 rows;
    64 for an op whose depth is unknown, the walk's bound) take at most half of DuckDB's memory limit at
    SHAPE_WALK_BYTES_PER_ROW, else the same walk one level at a time (at most 64, as the SQL), each level a join of
    the ops still walking with their parents, which spills: the same rows (the 4 GiB Kineto trace's store, 4.12 M
    ops: 1.6 s under DuckDB's 64 MiB, against 1.55 s unbounded)."""
    rows = """SELECT (SELECT count(*) FROM ops) + (SELECT coalesce(sum(coalesce(o.depth, 63) + 1), 0)
                                                FROM (SELECT DISTINCT op_id FROM kernel_launch) l JOIN ops o USING (op_id))"""
    if _half_of_duckdb(con, rows, SHAPE_WALK_BYTES_PER_ROW):
        con.execute(reference_sql)
    else:
        _owners_level_by_level(con)


def _owners_level_by_level(con: duckdb.DuckDBPyConnection) -> None:
    """`_ks_owner` from `_ks_shaped`, the walk up one level at a time (shape_owners)."""
    try:
        con.execute("""CREATE OR REPLACE TEMP TABLE _ks_walk AS
                       SELECT DISTINCT op_id AS launch_op, op_id AS cur FROM kernel_launch WHERE op_id IS NOT NULL""")
        con.execute("""CREATE OR REPLACE TEMP TABLE _ks_found AS SELECT w.launch_op, w.cur AS op_id, 0 AS lvl
                       FROM _ks_walk w SEMI JOIN _ks_shaped s ON s.op_id = w.cur""")
        for lvl in range(1, 65):
            ((n,),) = con.execute(
                """CREATE OR REPLACE TEMP TABLE _ks_walk AS SELECT w.launch_op, o.parent_op_id AS cur
                   FROM _ks_walk w JOIN ops o ON o.op_id = w.cur WHERE o.parent_op_id IS NOT NULL"""
            ).fetchall()
            if not n:
                break
            con.execute(f"""INSERT INTO _ks_found SELECT w.launch_op, w.cur, {lvl}
                            FROM _ks_walk w SEMI JOIN _ks_shaped s ON s.op_id = w.cur""")
        con.execute("""CREATE OR REPLACE TEMP TABLE _ks_owner AS
                       SELECT launch_op, arg_max(op_id, lvl) AS op_id FROM _ks_found GROUP BY launch_op""")
    finally:
        con.execute("DROP TABLE IF EXISTS _ks_walk")
        con.execute("DROP TABLE IF EXISTS _ks_found")


NATIVE: dict[str, Callable[[duckdb.DuckDBPyConnection, str], None]] = {
    "short_gaps": short_gaps,
    "sweep_segments": sweep_segments,
    "stretch_islands": stretch_islands,
    "launch_stats": launch_stats,
    "shape_owners": shape_owners,
}
