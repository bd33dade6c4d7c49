"""nsys GPU metrics (`--gpu-metrics-devices`): GPU_METRICS samples → `counters` intervals [t − period, t], named by
(typeId, metricId) in TARGET_INFO_GPU_METRICS and placed on the GPU through typeId & 0xFF.

GPU metrics dominate large exports (12.7 M rows at 10 kHz on two GPUs): the table is read once, in rowid ranges
(a b-tree range each, no scan), from the file's pages (`reader.Pages`, `_sqlpages.c`) or else through the ADBC
driver as stored — typed value by value in SQL only for a range that holds a value of the wrong kind — by a reader
thread that stays one range ahead of the inserts; the ranges commit pair by pair, a file store writing them
compressed as they commit and an in-memory one compressing them at a checkpoint after each pair (memory bounded by
a few ranges either way). Two ranges are inserted at once, each on a connection of its own, in a transaction of its
own and on one DuckDB thread, and committed in order: the store holds each series in the export's (time) order and
readers in time order stream it without a sort (a DuckDB insert of 12.6 M rows is ~4–5 CPU s, mostly writing the
table's compressed columns: two connections spread it over both cores, one thread per statement keeps the join's
output in order)."""

from __future__ import annotations

import contextlib
import itertools
import queue
import re
import threading
from collections.abc import Iterator
from typing import Any

import adbc_driver_manager
import duckdb
import pyarrow as pa
import pyarrow.compute

from ... import store
from ...errors import BadInput
from ...store import one
from .metadata import Meta, NsysSource
from .reader import Export, Pages, _select_sql, c, rowid_ranges, text

COUNTER_CHUNK_ROWS = 500_000  # GPU_METRICS rows per insert (two at a time, committed together)

# GPU_METRICS names (2023.4+ carry a `[unit]` suffix; older ones none) → counters.metric, matched by prefix,
# in the counter parsers' vocabulary (parsers/_counters.py) where the quantity is the same (GR Active = DCGM GRACT).
METRIC_NAMES = (
    ("SMs Active", "sm_active"),
    ("SM Active", "sm_active"),
    ("SM Issue", "sm_issue"),
    ("Tensor Active", "tensor_active"),
    ("DRAM Read Bandwidth", "dram_read"),
    ("DRAM Write Bandwidth", "dram_write"),
    ("GR Active", "gr_engine_active"),
    ("GPC Clock Frequency", "sm_clock_mhz"),
    ("SYS Clock Frequency", "sys_clock_mhz"),
    ("PCIe RX Throughput", "pcie_rx"),
    ("PCIe TX Throughput", "pcie_tx"),
    ("NVLink RX Responses User Data", "nvlink_rx_user"),
    ("NVLink TX Responses User Data", "nvlink_tx_user"),
)
PERCENT_METRICS = {"sm_active", "sm_issue", "tensor_active", "dram_read", "dram_write", "gr_engine_active", "pcie_rx", "pcie_tx"}


def rowid_chunks(ex: Export, table: str) -> list[tuple[int, int] | None]:
    """GPU_METRICS' rowid ranges of about COUNTER_CHUNK_ROWS rows (reader.rowid_ranges)."""
    return rowid_ranges(ex, table, COUNTER_CHUNK_ROWS)


_COLS = ("timestamp", "typeId", "metricId", "value")
# A sample that is no sample: a percentage outside 0–100 (values are stored as integers 0–100).
_IMPLAUSIBLE = "(m.scale = 0.01 AND (g.value < 0 OR g.value > 100))"
_TYPED = [c("timestamp"), c("typeId"), c("metricId"), c("value", typ="f")]
_SCHEMA = pa.schema([("timestamp", pa.int64()), ("typeId", pa.int64()), ("metricId", pa.int64()), ("value", pa.float64())])


_KINDS = "iiif"  # _COLS as the page reader reads them: three integer columns, a number read as a double


def _fast_chunk(conn: Any, table: str, chunk: tuple[int, int] | None) -> pa.Table | None:
    """One rowid range of GPU_METRICS as stored, through the driver without per-value SQL (the fast path); None
    when the chunk holds a value of another kind (text in a number column, NULL-typed first rows): the driver then
    fails or infers another type, and the chunk is read again the careful way."""
    where = f" WHERE rowid BETWEEN {chunk[0]} AND {chunk[1]}" if chunk else ""
    cols = ", ".join(f'"{x}"' for x in _COLS)
    cur = conn.cursor()
    try:
        cur.execute(f'SELECT {cols} FROM "{table}"{where}')
        t = cur.fetch_arrow_table()
    except (OSError, adbc_driver_manager.Error):
        return None
    finally:
        cur.close()
    if not all(pa.types.is_integer(f.type) for f in t.schema if f.name != "value") or not (
        pa.types.is_integer(t.schema.field("value").type) or pa.types.is_floating(t.schema.field("value").type)
    ):
        return None
    return t.cast(_SCHEMA)


def _careful_chunk(ex: Export, table: str, chunk: tuple[int, int] | None, conn: Any = None) -> pa.Table:
    """One rowid range typed value by value in SQL (a value of the wrong kind reads NULL): the fallback. On `conn`
    (a driver connection of the caller's thread) when given, else on the export's own."""
    where = f"rowid BETWEEN {chunk[0]} AND {chunk[1]}" if chunk else None
    if conn is None:
        cur, rdr = ex.scan(table, _TYPED, where=where)
    else:
        cur = conn.cursor()
        cur.execute(_select_sql(ex, table, _TYPED, where))
        rdr = cur.fetch_record_batch()
    try:
        t = rdr.read_all()
    finally:
        if cur is not None:
            cur.close()
    t = t.filter(pa.compute.equal(t.column("_s"), 1)).drop_columns(["_s"])
    return t.cast(_SCHEMA)


def read_chunks(ex: Export, table: str, chunks: list[tuple[int, int] | None]) -> Iterator[Any]:
    """GPU_METRICS once, chunk by chunk, as Arrow: a reader thread (reading the pages, else through its own driver
    connection, for the careful read of a chunk too) fetches the next rowid range while the caller inserts this
    one, at most one chunk ahead (memory bounded by two chunks): the export's own connections are not used then.
    Arrow-family exports stream their table."""
    if not ex.is_sqlite or not all(ex.has(table, x) for x in _COLS):
        for chunk in chunks:
            if ex.is_sqlite:
                yield _careful_chunk(ex, table, chunk)
            else:
                cur, rdr = ex.scan(table, _TYPED)
                yield _without_sentinel(rdr)
        return
    ahead: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        conn = None  # a driver connection of this thread, made when a chunk is not read from the pages
        pages = None
        try:
            pages = Pages.open(ex, table, _COLS, _KINDS)
            for chunk in chunks:
                if stop.is_set():
                    return
                t = pages.read(chunk, _SCHEMA) if pages is not None else None
                if t is None:
                    conn = conn or ex.connect_another()
                    t = _fast_chunk(conn, table, chunk)
                ahead.put(("chunk", t if t is not None else _careful_chunk(ex, table, chunk, conn)))
            ahead.put(("done", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            ahead.put(("error", e))
        finally:
            if pages is not None:
                pages.close()
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    worker = threading.Thread(target=produce, name="plasmient-gpu-metrics", daemon=True)
    worker.start()
    try:
        while True:
            kind, item = ahead.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                ahead.get_nowait()
        worker.join()


def _without_sentinel(rdr: pa.RecordBatchReader) -> pa.RecordBatchReader:
    def batches() -> Iterator[pa.RecordBatch]:
        for b in rdr:
            yield b.drop_columns(["_s"]).cast(_SCHEMA) if b.num_rows else pa.RecordBatch.from_pylist([], _SCHEMA)

    return pa.RecordBatchReader.from_batches(_SCHEMA, batches())


def _tables(parts: Iterator[Any]) -> Iterator[pa.Table]:
    """Each chunk as a table: a stream (Arrow-family exports) batch by batch, since a stream can be read once and
    a chunk is read twice (what is left out, then the insert)."""
    for part in parts:
        if isinstance(part, pa.RecordBatchReader):
            for b in part:
                yield pa.Table.from_batches([b])
        else:
            yield part


def _left_out(con: duckdb.DuckDBPyConnection, part: pa.Table, percent_ids: pa.Array) -> int:
    """Samples of this chunk left out for want of a number or as an impossible percentage. Only rows with no
    value, or one outside 0–100 of a metric id some percentage has (`percent_ids`), can be either: Arrow picks
    those (the clocks, outside 0–100 in every sample, are not), SQL names their metric."""
    v = part.column("value")
    outside = pa.compute.or_(pa.compute.less(v, 0), pa.compute.greater(v, 100))
    maybe = part.filter(
        pa.compute.fill_null(pa.compute.and_(outside, pa.compute.is_in(part.column("metricId"), value_set=percent_ids)), True)
    )
    if not maybe.num_rows:
        return 0
    con.register("_nsys_maybe", maybe)
    try:
        row = one(
            con,
            f"""SELECT count(*) FILTER (WHERE g.value IS NULL OR {_IMPLAUSIBLE})
                           FROM _nsys_maybe g JOIN _ns_metric m ON m.typeId = g.typeId AND m.metricId = g.metricId
                           WHERE g.timestamp >= 0""",
        )
    finally:
        con.unregister("_nsys_maybe")
    return int(row[0]) if row and row[0] else 0


INSERTERS = 2  # chunks inserted at once, each by a connection of its own in a transaction of its own


class _Inserters:
    """Chunks inserted side by side, each in its own transaction on its own connection (cursor) and on one DuckDB
    thread (so each keeps its rows in order), then committed in the chunks' order: a transaction's rows join the
    table when it commits, so the table holds the chunks in order. Each connection gets its own copy of the small
    look-up tables the insert joins (TEMP tables are the connection's). Not inside a caller's transaction (its
    own snapshot would not see the commits): `of` gives None there."""

    def __init__(self, cursors: list[duckdb.DuckDBPyConnection]) -> None:
        self.cursors = cursors

    @staticmethod
    def of(con: duckdb.DuckDBPyConnection, n: int) -> _Inserters | None:
        if n < 2:
            return None
        if store.in_transaction(con):
            return None
        tables = {t: con.sql(f"SELECT * FROM {t}").to_arrow_table() for t in ("_ns_metric", "_ns_gpumetric_dev")}
        cursors = []
        try:
            for _ in range(n):
                cur = store.cursor(con)
                cursors.append(cur)
                for t, rows in tables.items():
                    cur.register("_nsys_lookup", rows)
                    cur.execute(f"CREATE TEMP TABLE {t} AS SELECT * FROM _nsys_lookup")
                    cur.unregister("_nsys_lookup")
        except BaseException:
            for cur in cursors:
                cur.close()
            raise
        return _Inserters(cursors)

    def __enter__(self) -> _Inserters:
        return self

    def __exit__(self, *exc: object) -> None:
        for cur in self.cursors:
            with contextlib.suppress(duckdb.Error):
                cur.close()

    def insert(self, sql: str, parts: list[pa.Table]) -> None:
        """`sql` over each of `parts` (`_nsys_in`) at once, committed in their order; all rolled back on an error."""
        errors: list[BaseException] = []

        def run(cur: duckdb.DuckDBPyConnection, part: pa.Table) -> None:
            try:
                cur.register("_nsys_in", part)
                cur.execute(sql)
            except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
                errors.append(e)
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.unregister("_nsys_in")

        used = self.cursors[: len(parts)]
        for cur in used:
            cur.execute("BEGIN TRANSACTION")
        workers = [
            threading.Thread(target=run, args=(cur, part), name="plasmient-gpu-metrics-insert")
            for cur, part in zip(used, parts, strict=True)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            for cur in used:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
            raise errors[0]
        for cur in used:
            cur.execute("COMMIT")


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
    return start_counters(con, ex, sid, meta, info, background=False).finish()


def start_counters(
    con: duckdb.DuckDBPyConnection, ex: Export, sid: int, meta: Meta, info: NsysSource, background: bool = True
) -> CounterLoad:
    """Begin `emit_counters`: the look-up tables now (the GPUs must be in `devices`), the chunks' read and insert on
    a thread of their own when `background` and the export is read in several chunks beside the caller's
    connection (`_Inserters`), else at once. The caller may go on with other tables of the store meanwhile —
    never with `ex`'s own connections, which stay on the caller's thread — and ends with `CounterLoad.finish`
    (or `cancel`). What the caller's other tables cost then runs on the core the load leaves."""
    gm, names = ex.table("GPU_METRICS"), ex.table("TARGET_INFO_GPU_METRICS")
    if gm is None or not all(ex.has(names, c) for c in ("typeId", "metricId", "metricName")):
        return CounterLoad(con, sid, meta, info, None)
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
    con.register(
        "_ns_metric_in",
        pa.table(
            {
                "typeId": pa.array(tbl["typeId"], pa.int64()),
                "metricId": pa.array(tbl["metricId"], pa.int64()),
                "metric": pa.array(tbl["metric"], pa.string()),
                "scale": pa.array(tbl["scale"], pa.float64()),
                "hz_to_mhz": pa.array(tbl["hz_to_mhz"], pa.bool_()),
            }
        ),
    )
    con.execute("CREATE OR REPLACE TEMP TABLE _ns_metric AS SELECT * FROM _ns_metric_in")
    con.unregister("_ns_metric_in")
    percent_ids = pa.array(sorted({i for i, sc in zip(tbl["metricId"], tbl["scale"], strict=True) if sc == 0.01}), pa.int64())
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
    chunks = rowid_chunks(ex, gm)
    # A source of one GPU process and no rank of its own gets its rank from the aligner (input order, see
    # align.assign_ranks), which then rewrites every row of the source that carries another: its samples go in
    # with the rank it will most likely get — its input position, right whenever no other input claims a rank —
    # so that millions of them are not rewritten (an UPDATE of 12.6 M rows is ~0.65 s).
    rank = f"coalesce(d.rank, {sid})" if info.rank is None and not info.multi_rank else "d.rank"
    insert = f"""
        INSERT INTO counters (source_id, rank, device, gpu_index, gpu_uuid, metric, start_ns, end_ns, value,
                              time_source)
        SELECT {sid}, {rank}, d.device, d.device, d.gpu_uuid, m.metric,
               {base}::BIGINT + g.timestamp - {period}, {base}::BIGINT + g.timestamp,
               CASE WHEN m.hz_to_mhz AND g.value > 1e5 THEN g.value / 1e6 ELSE g.value * m.scale END, 'native'
        FROM _nsys_in g JOIN _ns_metric m ON m.typeId = g.typeId AND m.metricId = g.metricId
        JOIN _ns_gpumetric_dev d ON d.gpu_id = g.typeId & 255
        WHERE g.timestamp >= 0 AND g.value IS NOT NULL AND NOT ({_IMPLAUSIBLE})"""
    load = CounterLoad(con, sid, meta, info, {m for m in tbl["metric"]})
    load.before = int((one(con, "SELECT count(*) FROM counters") or (0,))[0])
    (threads,) = one(con, "SELECT current_setting('threads')") or (None,)
    load.threads = threads
    # Inserted outside a caller's transaction, the chunks' rows are committed pair by pair. A file store (a run's)
    # then writes them compressed into its file as they commit (DuckDB's optimistic writes): its memory stays
    # bounded without a checkpoint, and a checkpoint per pair rewrote the table's list of row groups each time
    # (21 -> 65 ms each over a 1.9 GiB export's 50 pairs: its ingest 32.2-33.1 -> 27.7-29.7 s without, the same
    # peak RSS, benchmarks/README.md session 28). An in-memory store compresses its tables only at a checkpoint
    # (~15x for counters): one after each pair. Inside a caller's transaction the chunks go in one by one on the
    # caller's connection (run_here) and never a checkpoint (it would abort the transaction): more memory.
    side_by_side = len(chunks) > 1 and not store.in_transaction(con)
    checkpoint = side_by_side and store.database_file(con) is None
    inserters = _Inserters.of(con, INSERTERS) if side_by_side else None
    try:
        # One DuckDB thread for the inserts: rows go in as stored (time order, each series after the other within a
        # sample) — with more, the join's output comes batch by batch in any order, and every later reader in time
        # order (the Perfetto writer) would sort 12 M rows. Two chunks go in side by side instead (_Inserters).
        # (A setting of the database: the caller's statements meanwhile run on one thread too.)
        con.execute("SET threads = 1")
        if inserters is None:
            load.run_here(ex, gm, chunks, insert, percent_ids)
        else:
            load.start(ex, gm, chunks, insert, percent_ids, inserters, background, checkpoint)
    except BaseException:
        load.cancel()
        raise
    return load


class CounterLoad:
    """GPU_METRICS going into `counters` (start_counters): `finish` waits for the chunks, raises what their read or
    insert raised (BadInput naming the file) and writes the notes; `cancel` stops them (an error elsewhere)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sid: int, meta: Meta, info: NsysSource, metrics: set[str] | None) -> None:
        self.con, self.sid, self.meta, self.info, self.metrics = con, sid, meta, info, metrics
        self.before = 0
        self.bad = 0
        self.threads: Any = None
        self.path = ""
        self.table = ""
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._inserters: _Inserters | None = None
        self._done = metrics is None

    def _bad_input(self, e: BaseException) -> BadInput:
        return BadInput(self.path, f"cannot read table {self.table} ({str(e).strip().splitlines()[0] if str(e).strip() else e})")

    def run_here(self, ex: Export, gm: str, chunks: list[tuple[int, int] | None], insert: str, percent_ids: pa.Array) -> None:
        """Every chunk on the caller's connection, now: one chunk, or inside the caller's transaction (where a
        checkpoint would abort it), so never a checkpoint."""
        self.path, self.table = str(ex.path), gm
        con = self.con
        try:
            for part in _tables(read_chunks(ex, gm, chunks)):
                con.register("_nsys_in", part)
                try:
                    self.bad += _left_out(con, part, percent_ids)
                    con.execute(insert)
                finally:
                    con.unregister("_nsys_in")
        except (duckdb.Error, OSError, pa.ArrowException) as e:
            raise self._bad_input(e) from None

    def start(
        self,
        ex: Export,
        gm: str,
        chunks: list[tuple[int, int] | None],
        insert: str,
        percent_ids: pa.Array,
        inserters: _Inserters,
        background: bool,
        checkpoint: bool,
    ) -> None:
        """The chunks two at a time on the inserters' connections, on a thread of their own when `background`. Only
        the reader thread (its own driver connection) and those connections are used there, never `ex`'s or the
        caller's."""
        self.path, self.table = str(ex.path), gm
        self._inserters = inserters
        # the chunks' reader (a thread with its own driver connection) starts on this thread: read_chunks is a
        # generator, its first step (which connects and starts the thread) runs where it is first advanced
        parts = _tables(read_chunks(ex, gm, chunks))
        side = inserters.cursors[0]  # between inserts: what is left out, the checkpoints (an in-memory store's)

        def load() -> None:
            try:
                while not self._stop.is_set() and (group := list(itertools.islice(parts, len(inserters.cursors)))):
                    for part in group:
                        self.bad += _left_out(side, part, percent_ids)
                    inserters.insert(insert, group)
                    if checkpoint:
                        with contextlib.suppress(duckdb.Error):
                            side.execute("CHECKPOINT")
            except (duckdb.Error, OSError, pa.ArrowException) as e:
                self._error = self._bad_input(e)
            except BaseException as e:  # noqa: BLE001 - raised by finish, in the caller's thread
                self._error = e
            finally:
                with contextlib.suppress(Exception):
                    parts.close()  # type: ignore[attr-defined]

        if not background:
            load()
            return
        self._thread = threading.Thread(target=load, name="plasmient-gpu-metrics-load", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._inserters is not None:
            self._inserters.__exit__(None, None, None)
            self._inserters = None
        if not self._done and self.threads is not None:
            self._done = True
            with contextlib.suppress(duckdb.Error):
                self.con.execute(f"SET threads = {int(self.threads)}")

    def cancel(self) -> None:
        """Stop after the chunks now being inserted (what was committed stays: the run is failing anyway)."""
        self._stop.set()
        self._join()

    def finish(self) -> int:
        """Wait for the chunks; the rows inserted (notes and the sampling period set on the source)."""
        if self.metrics is None:
            return 0
        try:
            self._join()
        finally:
            self._done = True
        if self._error is not None:
            raise self._error
        con, sid, meta, info = self.con, self.sid, self.meta, self.info
        if self.bad:
            info.notes.append(f"GPU metrics: {self.bad} samples left out (no number, or a percentage outside 0–100)")
        after = one(con, "SELECT count(*) FROM counters")
        n = int(after[0] - self.before) if after else 0
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
            info.notes.append(f"GPU metrics: {n} samples of {len(self.metrics)} metrics")
            if meta.gpu_metrics_hz:
                info.sample_period_ns = round(1e9 / meta.gpu_metrics_hz)
        return n
