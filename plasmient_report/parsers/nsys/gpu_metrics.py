"""nsys GPU metrics (`--gpu-metrics-devices`): GPU_METRICS samples → `counters` intervals [t − period, t], named by
(typeId, metricId) in TARGET_INFO_GPU_METRICS and placed on the GPU through typeId & 0xFF."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from typing import Any

import duckdb
import pyarrow as pa

from ...errors import BadInput
from ...store import one
from .metadata import Meta, NsysSource
from .reader import Export, c, text

COUNTER_CHUNK_ROWS = 1_000_000  # GPU_METRICS rows per insert; a checkpoint after each compresses them

# GPU_METRICS names (2023.4+ carry a `[unit]` suffix; older ones none) → counters.metric, matched by prefix,
# in the counter parsers' vocabulary (parsers/_counters.py) where the quantity is the same (GR Active = DCGM GRACT).
METRIC_NAMES = (
    ("SMs Active", "sm_active"), ("SM Active", "sm_active"), ("SM Issue", "sm_issue"),
    ("Tensor Active", "tensor_active"), ("DRAM Read Bandwidth", "dram_read"),
    ("DRAM Write Bandwidth", "dram_write"), ("GR Active", "gr_engine_active"), ("GPC Clock Frequency", "sm_clock_mhz"),
    ("SYS Clock Frequency", "sys_clock_mhz"), ("PCIe RX Throughput", "pcie_rx"), ("PCIe TX Throughput", "pcie_tx"),
    ("NVLink RX Responses User Data", "nvlink_rx_user"), ("NVLink TX Responses User Data", "nvlink_tx_user"),
)
PERCENT_METRICS = {"sm_active", "sm_issue", "tensor_active", "dram_read", "dram_write", "gr_engine_active",
                   "pcie_rx", "pcie_tx"}


def rowid_chunks(ex: Export, table: str) -> list[tuple[int, int] | None]:
    """rowid ranges of about COUNTER_CHUNK_ROWS rows (a rowid range is a b-tree range in SQLite: no full scan);
    one unbounded chunk for small tables or tables without rowid, and for Arrow-family exports (streamed)."""
    if not ex.is_sqlite:
        return [None]
    try:
        (lo,), = ex.rows(f'SELECT min(rowid) FROM "{table}"')
        (hi,), = ex.rows(f'SELECT max(rowid) FROM "{table}"')
    except sqlite3.DatabaseError:
        return [None]
    if lo is None or hi is None or hi - lo < COUNTER_CHUNK_ROWS:
        return [None]
    n_chunks = (hi - lo) // COUNTER_CHUNK_ROWS + 1
    if n_chunks > 64:  # sparse rowids (an edited or hostile file): no more chunks than the rows need
        (count,), = ex.rows(f'SELECT count(*) FROM "{table}"')
        n_chunks = min(n_chunks, count // COUNTER_CHUNK_ROWS + 1)
    stride = -(-(hi - lo + 1) // n_chunks)
    return [(a, min(a + stride - 1, hi)) for a in range(lo, hi + 1, stride)]


def metric_name(raw: str) -> str:
    """`SMs Active [Throughput %]` → sm_active; unknown names snake_cased (`[Throughput %]` dropped)."""
    base, _, suffix = raw.partition(" [")
    for prefix, name in METRIC_NAMES:
        if base.startswith(prefix):
            return name
    suffix = suffix.rstrip("]")
    words = re.sub(r"[^0-9a-zA-Z]+", "_", base).strip("_").lower()
    if suffix and suffix != "Throughput %":
        words += "_" + re.sub(r"[^0-9a-zA-Z]+", "_", suffix).strip("_").lower()
    return words or "metric"


def emit_counters(con: duckdb.DuckDBPyConnection, ex: Export, sid: int, meta: Meta, info: NsysSource) -> int:
    """GPU_METRICS → `counters` as intervals [t − period, t], joined to their names on (typeId, metricId) and
    to the GPU through typeId & 0xFF (TARGET_INFO_GPU.id) → the process's CUDA ordinal. Streams, never held."""
    gm, names = ex.table("GPU_METRICS"), ex.table("TARGET_INFO_GPU_METRICS")
    if gm is None or not all(ex.has(names, c) for c in ("typeId", "metricId", "metricName")):
        return 0
    rows = ex.rows(f'SELECT DISTINCT typeId, metricId, metricName FROM "{names}"')
    tbl: dict[str, list[Any]] = {"typeId": [], "metricId": [], "metric": [], "scale": [], "hz_to_mhz": []}
    for type_id, metric_id, raw in rows:
        raw_name = text(raw)
        m = metric_name(raw_name)
        pct = "%" in raw_name or (m in PERCENT_METRICS and "[" not in raw_name)
        tbl["typeId"].append(int(type_id))
        tbl["metricId"].append(int(metric_id))
        tbl["metric"].append(m)
        tbl["scale"].append(0.01 if pct else 1.0)
        # Clock metrics are named [MHz] but some versions store Hz (1.98e9 on an H200): no clock is 100 GHz.
        tbl["hz_to_mhz"].append("MHz" in raw_name)
    con.register("_ns_metric_in", pa.table({
        "typeId": pa.array(tbl["typeId"], pa.int64()), "metricId": pa.array(tbl["metricId"], pa.int64()),
        "metric": pa.array(tbl["metric"], pa.string()), "scale": pa.array(tbl["scale"], pa.float64()),
        "hz_to_mhz": pa.array(tbl["hz_to_mhz"], pa.bool_())}))
    con.execute("CREATE OR REPLACE TEMP TABLE _ns_metric AS SELECT * FROM _ns_metric_in")
    con.unregister("_ns_metric_in")
    # GPU id (typeId & 0xFF) → the rank and CUDA ordinal of the process that used it; GPUs no GPU process used
    # are left out (their ordinal would collide with a used one's).
    # Each row names its GPU by UUID (as counter logs do): the aligner matches counters to trace GPUs by it.
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ns_gpumetric_dev AS
        SELECT m.gpu_id, arg_min(m.rank, coalesce(m.rank, 1 << 30)) AS rank,
               arg_min(m.device, coalesce(m.rank, 1 << 30)) AS device, any_value(d.gpu_uuid) AS gpu_uuid
        FROM _ns_devmap m LEFT JOIN devices d ON d.source_id = {sid} AND d.rank IS NOT DISTINCT FROM m.rank
                                              AND d.device = m.device
        WHERE m.gpu_id IS NOT NULL GROUP BY m.gpu_id""")
    single = one(con, "SELECT count(*), count(gpu_id) FROM _ns_devmap")
    if single and single[0] == 1 and single[1] == 0:
        # one GPU used and no TARGET_INFO_GPU to name it: the metrics' GPUs can only be that one
        con.execute("""INSERT INTO _ns_gpumetric_dev SELECT DISTINCT m.typeId & 255, d.rank, d.device, NULL
                       FROM _ns_metric m, _ns_devmap d""")
    period = f"{round(1e9 / meta.gpu_metrics_hz)}::BIGINT" if meta.gpu_metrics_hz else "NULL::BIGINT"
    base = int(info.base_time_ns or 0)
    cols = [c("timestamp"), c("typeId"), c("metricId"), c("value", typ="f")]
    before = one(con, "SELECT count(*) FROM counters")
    for chunk in rowid_chunks(ex, gm):
        where = '"timestamp" >= 0' + (f" AND rowid BETWEEN {chunk[0]} AND {chunk[1]}" if chunk else "")
        cur, rdr = ex.scan(gm, cols, where=where)
        try:
            con.register("_nsys_in", rdr)
            con.execute(f"""
                INSERT INTO counters (source_id, rank, device, gpu_index, gpu_uuid, metric, start_ns, end_ns, value,
                                      time_source)
                SELECT {sid}, d.rank, d.device, d.device, d.gpu_uuid, m.metric,
                       {base}::BIGINT + g.timestamp - {period}, {base}::BIGINT + g.timestamp,
                       CASE WHEN m.hz_to_mhz AND g.value > 1e5 THEN g.value / 1e6 ELSE g.value * m.scale END,
                       'native'
                FROM _nsys_in g JOIN _ns_metric m ON m.typeId = g.typeId AND m.metricId = g.metricId
                JOIN _ns_gpumetric_dev d ON d.gpu_id = g.typeId & 255
                WHERE g._s = 1""")
            con.unregister("_nsys_in")
        except (duckdb.Error, OSError, pa.ArrowException) as e:
            raise BadInput(ex.path, f"cannot read table {gm} ({e})") from None
        finally:
            if cur is not None:
                cur.close()
        if chunk:
            # DuckDB compresses in-memory tables at a checkpoint (~15x for counters): memory stays bounded.
            with contextlib.suppress(duckdb.Error):  # inside a caller's transaction: no checkpoint, only more memory
                con.execute("CHECKPOINT")
    after = one(con, "SELECT count(*) FROM counters")
    n = int(after[0] - before[0]) if after and before else 0
    if n and not meta.gpu_metrics_hz:
        # No sampling frequency recorded: each series' mean sample spacing is its period.
        con.execute(f"""
            UPDATE counters SET start_ns = counters.end_ns - p.period FROM (
                SELECT device, metric, ((max(end_ns) - min(end_ns)) / greatest(count(*) - 1, 1))::BIGINT AS period
                FROM counters WHERE source_id = {sid} GROUP BY ALL) p
            WHERE counters.source_id = {sid} AND counters.start_ns IS NULL
              AND counters.device IS NOT DISTINCT FROM p.device AND counters.metric = p.metric""")
    con.execute("DROP TABLE IF EXISTS _ns_gpumetric_dev")
    if n:
        info.notes.append(f"GPU metrics: {n} samples of {len(set(tbl['metric']))} metrics")
        if meta.gpu_metrics_hz:
            info.sample_period_ns = round(1e9 / meta.gpu_metrics_hz)
    return n

