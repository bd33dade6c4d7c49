"""NCCL's NVTX extended payloads (nsys `--include-blobs true`) → `collectives`: message size, communicator, its
size and this rank's place in it, peer. An NCCL call range is matched to the kernel whose launch it contains."""

from __future__ import annotations

import duckdb

from ...store import one
from .metadata import NVTX_PUSHPOP, NVTX_STARTEND, NsysSource
from .reader import Export, c, stage

# NVTX extended-payload entry types (nvToolsExtPayload.h NVTX_PAYLOAD_ENTRY_TYPE_*) → (bytes, signed).
# Types from 2**24 up name an enum schema (its size from NVTX_PAYLOAD_ENUMS, else 4 bytes).
PAYLOAD_TYPES = {
    1: (1, True),
    2: (1, False),
    3: (2, True),
    4: (2, False),
    5: (4, True),
    6: (4, False),
    7: (8, True),
    8: (8, False),
    9: (8, True),
    10: (8, False),
    11: (1, True),
    12: (1, False),
    13: (2, True),
    14: (2, False),
    15: (4, True),
    16: (4, False),
    17: (8, True),
    18: (8, False),
    22: (8, False),
    23: (8, False),
}
# NCCL's payload entry names (NCCL 2.19+), as the schema tables give them.
NCCL_PAYLOAD_FIELDS = {
    "comm": "NCCL communicator ID",
    "nranks": "No. of ranks",
    "comm_rank": "Rank",
    "bytes": "Message size [bytes]",
    "peer": "Peer rank",
    "root": "Root",
    "redop": "Reduction operation",
}

# Collectives whose payload size is one rank's share of the buffer.
PER_RANK_PAYLOAD_RE = r"(?i)(all_?gather|reduce_?scatter)"


def _le_uint(hexcol: str, byte_off: str, n: int) -> str:
    """SQL: the little-endian unsigned integer of `n` bytes at `byte_off` in the hex string `hexcol`."""
    pairs = " || ".join(f"substring({hexcol}, 2 * ({byte_off}) + {2 * i + 1}, 2)" for i in reversed(range(n)))
    return f"TRY_CAST('0x' || {pairs} AS UBIGINT)"


def emit_payloads(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, base: int, info: NsysSource) -> None:
    """NCCL's NVTX payloads (exported with `--include-blobs true`) → `collectives`: message size, communicator,
    its size and this rank's place in it, peer. Each `binaryData` is a 32-byte header (count, schemaId,
    payload size, payload offset; u64 little-endian) and the payload, laid out by NVTX_PAYLOAD_SCHEMA_ENTRIES.
    An NCCL call range is matched to the kernel whose launch (runtime/driver call, same thread) it contains."""
    entries = ex.table("NVTX_PAYLOAD_SCHEMA_ENTRIES")
    has_blobs = one(con, "SELECT count(*) FROM _ns_nvtx WHERE binaryData IS NOT NULL")
    if entries is None or not has_blobs or not has_blobs[0]:
        if ex.table("NVTX_PAYLOAD_SCHEMAS") is not None and one(
            con, f"SELECT count(*) FROM collectives WHERE source_id = {sid}"
        ) != (0,):
            info.notes.append(
                "NCCL NVTX payloads not exported (export with --include-blobs true for message sizes and communicators)"
            )
        return
    stage(
        con, ex, "_ns_pl_entries", entries, [c("domainId"), c("schemaId"), c("idx"), c("type"), c("name", typ="s"), c("offset")]
    )
    stage(con, ex, "_ns_pl_enums", ex.table("NVTX_PAYLOAD_ENUMS"), [c("domainId"), c("schemaId"), c("size")])
    stage(
        con,
        ex,
        "_ns_pl_enum_entries",
        ex.table("NVTX_PAYLOAD_ENUM_ENTRIES"),
        [c("domainId"), c("schemaId"), c("idx"), c("name", typ="s"), c("value")],
    )
    sizes = ", ".join(f"({t}, {n}, {str(sg).lower()})" for t, (n, sg) in PAYLOAD_TYPES.items())
    value = " ".join(f"WHEN {n} THEN {_le_uint('p.hex', 'p.payload_off + coalesce(e.offset, 0)', n)}" for n in (1, 2, 4, 8))
    tpid = "((n.globalTid >> 24) & 16777215)"
    # One row per (payload event, schema entry). Domain and schema ids repeat per process with the same layout.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_pl_values AS
        WITH p AS (
            SELECT n.start, n."end", {tpid} AS pid, n.globalTid & 16777215 AS tid, n.domainId,
                   coalesce(n.text, s.value) AS name, hex(n.binaryData) AS hex,
                   {_le_uint("hex(n.binaryData)", "8", 8)} AS schema_id,
                   TRY_CAST({_le_uint("hex(n.binaryData)", "24", 8)} AS BIGINT) AS payload_off
            FROM _ns_nvtx n LEFT JOIN _ns_str s ON s.id = n.textId
            WHERE n.binaryData IS NOT NULL AND octet_length(n.binaryData) >= 32
              AND n.eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND})
        ), e AS (
            SELECT DISTINCT e.domainId, e.schemaId, e.name, e.offset, e.type,
                   coalesce(t.n, CASE WHEN e.type >= 16777216 THEN coalesce(en.size, 4) END) AS n,
                   coalesce(t.signed, false) AS signed
            FROM _ns_pl_entries e LEFT JOIN (VALUES {sizes}) t(type, n, signed) ON t.type = e.type
            LEFT JOIN (SELECT DISTINCT domainId, schemaId, size FROM _ns_pl_enums) en
                   ON en.domainId = e.domainId AND en.schemaId = e.type
        )
        SELECT p.start, p."end", p.pid, p.tid, p.name, e.name AS field, e.type,
               CASE WHEN 2 * (p.payload_off + coalesce(e.offset, 0) + e.n) <= length(p.hex)
                    THEN CASE e.n {value} END END AS raw, e.n, e.signed
        FROM p JOIN e ON e.domainId = p.domainId AND e.schemaId = p.schema_id
        WHERE e.n IN (1, 2, 4, 8)""")
    f = NCCL_PAYLOAD_FIELDS

    def pick(key: str, signed: bool = True) -> str:
        val = (
            "CASE WHEN signed AND n < 8 AND raw >= (1::UBIGINT << (8 * n - 1)) THEN raw::HUGEINT - (1::HUGEINT << (8 * n)) "
            "ELSE raw::HUGEINT END"
        )
        return f"TRY_CAST(max({val}) FILTER (WHERE field = '{f[key]}') AS BIGINT)"

    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_nccl_calls AS
        SELECT start, "end", pid, tid, name,
               lower(printf('%016x', max(raw) FILTER (WHERE field = '{f["comm"]}'))) AS comm,
               {pick("nranks")} AS nranks, {pick("comm_rank")} AS comm_rank, {pick("bytes")} AS bytes,
               {pick("peer")} AS peer, {pick("root")} AS root
        FROM _ns_pl_values GROUP BY start, "end", pid, tid, name""")
    # Communicators: (pid, comm) → this process's rank in it and its size (ncclCommInitRank* payloads); the
    # store ranks of its members when they are all in this report, in communicator-rank order.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _ns_comms AS
        WITH m AS (
            SELECT DISTINCT c.pid, c.comm, c.comm_rank, c.nranks, r.rank FROM _ns_nccl_calls c
            LEFT JOIN _ns_rank r ON r.pid = c.pid
            WHERE starts_with(c.name, 'ncclCommInit') AND c.comm IS NOT NULL AND c.comm_rank IS NOT NULL
        ), g AS (
            SELECT comm, '[' || string_agg(rank::VARCHAR, ', ' ORDER BY comm_rank) || ']' AS ranks,
                   count(*) AS members, any_value(nranks) AS nranks, count(rank) AS known
            FROM m GROUP BY comm
        )
        SELECT m.pid, m.comm, m.comm_rank, m.nranks,
               CASE WHEN g.members = g.nranks AND g.known = g.members THEN g.ranks END AS group_ranks
        FROM m JOIN g USING (comm)""")
    # The NCCL call that launched each collective's kernel: the innermost payload range on the launching thread
    # around the launch call (ncclAllReduce … → cudaLaunchKernelExC / cuLaunchKernelEx inside it).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_nccl_match AS
        SELECT c.rank, c.kernel_correlation, arg_max(x.bytes, x.start) AS bytes, arg_max(x.comm, x.start) AS comm,
               arg_max(x.peer, x.start) AS peer, arg_max(x.pid, x.start) AS pid
        FROM collectives c JOIN api_calls a ON a.source_id = {sid} AND a.correlation = c.kernel_correlation
                                            AND a.rank IS NOT DISTINCT FROM c.rank
        JOIN _ns_nccl_calls x ON x.pid = a.pid AND x.tid = a.thread
                             AND {base}::BIGINT + x.start <= a.start_ns AND {base}::BIGINT + x."end" >= a.end_ns
        WHERE c.source_id = {sid} AND NOT starts_with(x.name, 'ncclCommInit') AND x.name NOT LIKE 'ncclGroup%'
        GROUP BY c.rank, c.kernel_correlation""")
    matched = one(con, "SELECT count(*) FROM _ns_nccl_match")
    total = one(con, f"SELECT count(*) FROM collectives WHERE source_id = {sid}")
    n_matched, n_total = (int(matched[0]) if matched else 0), (int(total[0]) if total else 0)
    # NCCL's payload gives one rank's share for all-gather (sendcount) and reduce-scatter (recvcount) — "the size of
    # one message and not the total bytes" (NCCL src/collectives.cc); the store's bytes are the whole buffer, as
    # nccl-tests and Kineto count them: that share times the communicator's size.
    con.execute(f"""
        UPDATE collectives SET bytes = CASE WHEN regexp_matches(collectives.collective, '{PER_RANK_PAYLOAD_RE}')
                                            THEN m.bytes * cm.nranks ELSE m.bytes END,
               peer = m.peer, group_size = cm.nranks, group_ranks = cm.group_ranks
        FROM _ns_nccl_match m LEFT JOIN _ns_comms cm ON cm.pid = m.pid AND cm.comm = m.comm
        WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM m.rank
          AND collectives.kernel_correlation = m.kernel_correlation""")
    if n_total and n_matched == n_total:
        # Every collective knows its communicator: it is the process group, and seq counts within it.
        con.execute(f"""
            UPDATE collectives SET process_group = 'nccl:' || m.comm FROM _ns_nccl_match m
            WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM m.rank
              AND collectives.kernel_correlation = m.kernel_correlation AND m.comm IS NOT NULL""")
        con.execute(f"""
            UPDATE collectives SET seq = s.seq FROM (
                SELECT rank, kernel_correlation, (row_number() OVER (PARTITION BY rank, process_group, collective
                                                                      ORDER BY start_ns, kernel_correlation) - 1)::INTEGER AS seq
                FROM collectives WHERE source_id = {sid}) s
            WHERE collectives.source_id = {sid} AND collectives.rank IS NOT DISTINCT FROM s.rank
              AND collectives.kernel_correlation = s.kernel_correlation""")
    if n_total:
        info.notes.append(f"NCCL NVTX payloads: message size and communicator of {n_matched} of {n_total} collectives")
    con.execute("DROP TABLE IF EXISTS _ns_comms")
    con.execute("DROP TABLE IF EXISTS _ns_nccl_match")
