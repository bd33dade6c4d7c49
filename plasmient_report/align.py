"""One clock: give every source a rank and a clock record (anchor, offset, method, uncertainty).

Kineto traces are anchored natively (baseTimeNanoseconds, or epoch µs) — CPU and GPU share one clock.
"""

from __future__ import annotations

import duckdb

TABLES_WITH_RANK = ("kernels", "ops", "api_calls", "syncs", "ranges", "collectives", "counters", "devices")

# Typical uncertainty of a native anchor across hosts (NTP); within one host CPU and GPU share a clock.
NATIVE_UNCERTAINTY_NS = {"native": 1_000, "epoch_us": 1_000, "relative": None}


def assign_ranks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Sources without a rank get one by input order; clashing ranks are renumbered, and said so."""
    notes: list[str] = []
    # Multi-rank sources (an nsys report of several processes) set rank per row; their ranks are taken.
    taken: set[int] = {r for (r,) in con.execute(
        "SELECT DISTINCT k.rank FROM kernels k JOIN sources s USING (source_id) "
        "WHERE s.rank_method = 'multi' AND k.rank IS NOT NULL").fetchall()}
    rows = con.execute("SELECT source_id, rank, rank_method, path FROM sources WHERE rank_method <> 'multi' "
                       "ORDER BY source_id").fetchall()
    final: dict[int, tuple[int, str]] = {}
    for sid, rank, method, _path in rows:
        if rank is not None and rank not in taken:
            taken.add(rank)
            final[sid] = (rank, method)
    nxt = 0
    for sid, rank, method, path in rows:
        if sid in final:
            continue
        while nxt in taken:
            nxt += 1
        if rank is not None:
            notes.append(f"{path}: claims rank {rank}, already taken by another input; counted as rank {nxt}")
        final[sid] = (nxt, "order" if rank is None else "renumbered")
        taken.add(nxt)
    for sid, (rank, how) in final.items():
        con.execute("UPDATE sources SET rank = ?, rank_method = ? WHERE source_id = ?", [rank, how, sid])
        for t in TABLES_WITH_RANK:
            con.execute(f"UPDATE {t} SET rank = ? WHERE source_id = ?", [rank, sid])
    return notes


def anchor_sources(con: duckdb.DuckDBPyConnection) -> None:
    """Record each source's offset (0 for native anchors) and uncertainty; later refinements add to it."""
    for anchor, unc in NATIVE_UNCERTAINTY_NS.items():
        con.execute("""UPDATE sources SET offset_ns = coalesce(offset_ns, 0),
                       offset_method = coalesce(offset_method, ?), offset_uncertainty_ns = ?
                       WHERE clock_anchor = ?""", [anchor, unc, anchor])


def align(con: duckdb.DuckDBPyConnection) -> list[str]:
    notes = assign_ranks(con)
    anchor_sources(con)
    return notes
