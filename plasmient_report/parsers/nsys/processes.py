"""Which process of an nsys report is which rank (the one place nsys ranks are decided; the rules for reading a
rank from an environment are `parsers.ranks`): the captured environment when it names every GPU process, else one
process per GPU numbered by CUDA ordinal, else the order of first GPU activity. CUPTI correlation ids repeat
across processes, so in a report of several they are made unique here."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from ...store import one
from .. import ranks
from .metadata import Meta, NsysSource, _int, env_vars

PID_SHIFT = 2**32  # multi-process reports: correlation = pid * 2**32 + correlationId (ids repeat across processes)


def gpu_processes(con: duckdb.DuckDBPyConnection) -> list[tuple[int, list[int]]]:
    """Processes with GPU activity, by their first kernel / copy, with the CUDA ordinals each used."""
    rows = con.execute("""
        SELECT (globalPid >> 24) & 16777215 AS pid, min(start), list(DISTINCT deviceId ORDER BY deviceId) FROM (
            SELECT globalPid, start, deviceId FROM _ns_kernel UNION ALL SELECT globalPid, start, deviceId FROM _ns_memcpy
            UNION ALL SELECT globalPid, start, deviceId FROM _ns_memset) WHERE globalPid IS NOT NULL
        GROUP BY pid ORDER BY min(start), pid""").fetchall()
    return [(int(p) if p is not None else -1, [d for d in devs if d is not None]) for p, _, devs in rows]


def assign_ranks(con: duckdb.DuckDBPyConnection, meta: Meta, info: NsysSource) -> None:
    """Processes with GPU activity are ranks: from the captured environment when it names them, else in
    order of first GPU activity. One GPU process: the source's rank (None → the aligner's input order)."""
    found_procs = gpu_processes(con)
    procs = [p for p, _ in found_procs]
    env = env_vars(meta)
    by_pid: dict[int, int | None] = {}
    how = "order"
    if len(procs) == 1:
        found = [r for d in env.values() if (r := ranks.from_env(d))]
        if found and len({r for r, _ in found}) == 1:
            info.rank, how = found[0][0], f"env:{found[0][1]}"
            info.world_size = next((ws for d in env.values() if (ws := ranks.world_from_env(d))), None)
        by_pid[procs[0]] = info.rank
    elif len(procs) > 1:
        hits: dict[int, tuple[int, str]] = {}
        for d in env.values():
            p, r = _int(d.get("__PID__")), ranks.from_env(d)
            if p and r and p in procs:
                hits[p] = r
        if len(hits) == len(procs) and len({r for r, _ in hits.values()}) == len(procs):
            by_pid = {p: hits[p][0] for p in procs}
            how = f"env:{next(iter(hits.values()))[1]}"
        elif all(len(d) == 1 for _, d in found_procs) and len({d[0] for _, d in found_procs}) == len(procs):
            # One process per GPU (torchrun, mpirun on one node): rank r drives cuda:r by convention.
            order = sorted(found_procs, key=lambda pd: pd[1][0])
            by_pid = {p: i for i, (p, _) in enumerate(order)}
            how = "device"
            info.notes.append(
                f"{len(procs)} GPU processes in one report, one GPU each: ranks numbered by CUDA "
                f"device ordinal (pids {', '.join(str(p) for p, _ in order)})"
            )
        else:
            by_pid = {p: i for i, p in enumerate(procs)}
            info.notes.append(
                f"{len(procs)} GPU processes in one report: ranks numbered by first GPU activity "
                f"(pids {', '.join(str(p) for p in procs)})"
            )
        info.multi_rank = True
        info.world_size = len(procs)
    info.rank_method = how
    info.processes = by_pid
    tbl = pa.table({"pid": pa.array(list(by_pid), pa.int64()), "rank": pa.array(list(by_pid.values()), pa.int32())})
    con.register("_ns_rank_in", tbl)
    con.execute("CREATE OR REPLACE TEMP TABLE _ns_rank AS SELECT * FROM _ns_rank_in")
    con.unregister("_ns_rank_in")
    # Activities of no known process (globalPid missing): the one GPU process's; in a report of several, nobody's
    # (a rank cannot be guessed): left out and counted.
    owners = (
        ("_ns_kernel", "globalPid"),
        ("_ns_memcpy", "globalPid"),
        ("_ns_memset", "globalPid"),
        ("_ns_sync", "globalPid"),
        ("_ns_runtime", "globalTid"),
    )
    if len(procs) == 1:
        for t, col in owners:
            con.execute(f"UPDATE {t} SET {col} = {procs[0]}::BIGINT << 24 WHERE {col} IS NULL")
    elif len(procs) > 1:
        orphans = 0
        for t, col in owners[:4]:
            cond = f"{col} IS NULL OR (({col} >> 24) & 16777215) NOT IN (SELECT pid FROM _ns_rank)"
            row = one(con, f"SELECT count(*) FROM {t} WHERE {cond}")
            if row and row[0]:
                orphans += int(row[0])
                con.execute(f"DELETE FROM {t} WHERE {cond}")
        if orphans:
            info.notes.append(f"events left out: {orphans} GPU activities of no known process (no globalPid)")
    if info.multi_rank:
        # CUPTI correlation ids are per process: make them unique in the source (kernels ↔ api_calls join on it).
        for t, col in (
            ("_ns_kernel", "globalPid"),
            ("_ns_memcpy", "globalPid"),
            ("_ns_memset", "globalPid"),
            ("_ns_sync", "globalPid"),
            ("_ns_runtime", "globalTid"),
        ):
            con.execute(
                f"UPDATE {t} SET correlationId = (({col} >> 24) & 16777215) * {PID_SHIFT} + correlationId "
                "WHERE correlationId IS NOT NULL"
            )
