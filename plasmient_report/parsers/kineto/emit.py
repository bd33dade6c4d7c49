"""Kineto staging tables → the store's tables (kernels, syncs, ranges, ops, api_calls, collectives, devices,
memory_events), times converted to UTC epoch ns (SPEC §3) in SQL."""

from __future__ import annotations

import duckdb

from ... import vocab
from ...store import aside, in_order, one
from .decode import open_stages
from .schema import DeviceRow

NCCL_OP_RE = "(?i)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)"
ID_STRIDE = 1000000000000  # kernel_id / op_id = source_id * ID_STRIDE + n

# CUDA / HIP caching-allocator device types in `[memory]` events (c10::DeviceType): 1 CUDA, 6 HIP (ROCm's
# traces say HIP), 0 CPU. Only device memory is kept.
GPU_DEVICE_TYPES = (1, 6)
# The GPU activities that become `kernels` rows (and are counted as the trace's GPU events): one predicate for both.
GPU_ACTIVITY = "cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND name IS NOT NULL"


def ns_expr(col: str, base: int) -> str:
    # base + floor(ts)·1000 + round(frac·1000): exact to the ns for µs floats with 3 decimals.
    return f"({base}::BIGINT + CAST(floor({col}) AS BIGINT) * 1000 + CAST(round(({col} - floor({col})) * 1000) AS BIGINT))"


def device_sql() -> str:
    """The GPU a GPU event ran on: `args.device`, else the pid (Kineto puts the device index there)."""
    return "TRY_CAST(coalesce(device, pid) AS INTEGER)"


def emit(
    con: duckdb.DuckDBPyConnection,
    sid: int,
    rank: int | None,
    base: int,
    devices: list[DeviceRow],
    cut: bool | None = None,
) -> int:
    """Write the store rows of one trace; returns the number of GPU kernels and copies. `cut` as
    kineto._clip_to_recording returned it: True, `_kin_cpu` has the `cut` column of the ranges cut to the profiler's
    recording; False, the recording cut none; None, the trace has no recording to cut to (`ranges.cut` unknown).

    Two chains of INSERTs, each writing store tables the other does not, each table's in the same order every run:
    kernels, syncs, ranges, memory events and devices on a cursor of the store, on a thread of its own, and the ops,
    runtime calls, the profiler's overhead and the collectives on `con` (the ops' INSERT is the largest; the
    collectives moved to it once the ops' numbering got cheaper, session 41: the 100 MiB trace's emit 0.167-0.183 ->
    0.144-0.165 s, the two chains ~0.13-0.15 s each). Each INSERT runs on one DuckDB thread (it writes the store's
    compressed columns in order), so one after the other they kept one core of two busy. Measured
    (benchmarks/README.md, session 32), the 100 MiB trace: emit 0.245 -> 0.143 s (medians of eight, interleaved),
    the whole run 2.74 -> 2.65 s (ten pairs). Where DuckDB's tables are large for its memory limit
    (`store.room_beside`: the staging tables, spilled or not), the two chains run one after the other, as two sorts
    at once would spill."""
    cut_col = "coalesce(cut, false)" if cut else ("NULL::BOOLEAN" if cut is None else "false")
    start = ns_expr("ts", base)
    end = ns_expr("ts + coalesce(dur, 0)", base)
    rk = "NULL::INTEGER" if rank is None else str(int(rank))
    dev = device_sql()

    def kernels_and_ranges(cur: duckdb.DuckDBPyConnection) -> int:
        open_stages(cur)
        _emit_kernels(cur, sid, rk, start, end, dev)
        _emit_ranges(cur, sid, rk, start, end, dev, cut_col)
        _emit_memory(cur, sid, rk, base)
        for d in devices:
            cur.execute(
                "INSERT INTO devices (source_id, rank, device, name, sm_count, memory_bytes, compute_capability,"
                " vendor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [sid, rank, d.device, d.name, d.sm_count, d.memory_bytes, d.compute_capability, d.vendor],
            )
        row = one(cur, f"SELECT count(*) FROM _kin_gpu WHERE {GPU_ACTIVITY}")
        return int(row[0]) if row else 0

    with aside(con, kernels_and_ranges) as gpu_events:
        _emit_ops(con, sid, rk, start, end)
        _emit_collectives(con, sid, rk, start, end, dev)
        n = gpu_events()
    con.execute("DROP TABLE _kin_cpu")  # (read by both chains)
    return n


def _emit_kernels(cur: duckdb.DuckDBPyConnection, sid: int, rk: str, start: str, end: str, dev: str) -> None:
    kind = """CASE WHEN cat = 'gpu_memcpy' THEN 'memcpy' WHEN cat = 'gpu_memset' THEN 'memset'
                   WHEN regexp_matches(name, '(?i)^(void )?(nccl|rccl|ncclDevKernel|ncclKernel)') THEN 'nccl'
                   ELSE 'compute' END"""
    gpu_rows = in_order(f"SELECT * FROM _kin_gpu WHERE {GPU_ACTIVITY}", "ts, rowid")
    cur.execute(f"""
        INSERT INTO kernels (kernel_id, source_id, rank, device, stream, start_ns, end_ns, raw_start, name, kind,
                             correlation, external_id, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                             regs, smem, copy_kind, bytes)
        SELECT _n + {sid}::BIGINT * {ID_STRIDE},
               {sid}, {rk}, {dev}, coalesce(stream, tid), {start}, {end}, ts, name, {kind},
               correlation, external_id, grid_x, grid_y, grid_z, block_x, block_y, block_z, regs, smem,
               CASE WHEN cat = 'gpu_memcpy' THEN coalesce(regexp_extract(name, 'Memcpy (\\w+)', 1), 'unknown') END,
               bytes
        FROM ({gpu_rows})""")
    cur.execute(f"""
        INSERT INTO syncs (source_id, rank, device, stream, start_ns, end_ns, kind, correlation)
        SELECT {sid}, {rk}, {dev}, coalesce(stream, tid), {start}, {end}, coalesce(sync_kind, name), correlation
        FROM _kin_gpu WHERE cat = 'cuda_sync'""")


def _emit_ranges(con: duckdb.DuckDBPyConnection, sid: int, rk: str, start: str, end: str, dev: str, cut_col: str) -> None:
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rk}, pid, tid, {dev}, 'gpu_user_annotation', name, {start}, {end}, true, external_id
        FROM _kin_gpu WHERE cat = 'gpu_user_annotation' AND name IS NOT NULL""")
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id,
                            cut)
        SELECT {sid}, {rk}, pid, tid, NULL, 'user_annotation', name, {start}, {end}, false, external_id, {cut_col}
        FROM _kin_cpu WHERE cat = 'user_annotation' AND name IS NOT NULL""")
    # Python frames (with_stack=True): ranges of domain 'python' on their thread, for the Python site of a
    # host sync; never analysis windows (metrics.build_windows leaves them out).
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id)
        SELECT {sid}, {rk}, pid, tid, NULL, 'python', name, {start}, {end}, false, NULL
        FROM _kin_py WHERE name IS NOT NULL""")
    con.execute("DROP TABLE _kin_py")  # each staging table goes after its last use: less held at once
    # ProfilerStep#N is a cpu_op in some torch versions and a user_annotation in others: keep it a range.
    con.execute(f"""
        INSERT INTO ranges (source_id, rank, pid, thread, device, domain, name, start_ns, end_ns, on_gpu, external_id,
                            cut)
        SELECT {sid}, {rk}, pid, tid, NULL, 'user_annotation', name, {start}, {end}, false, external_id, {cut_col}
        FROM _kin_cpu WHERE cat = 'cpu_op' AND name LIKE 'ProfilerStep#%'""")


def _emit_ops(con: duckdb.DuckDBPyConnection, sid: int, rk: str, start: str, end: str) -> None:
    cpu_rows = in_order("SELECT * FROM _kin_cpu WHERE cat = 'cpu_op' AND name IS NOT NULL", "ts, dur DESC, rowid")
    con.execute(f"""
        INSERT INTO ops (source_id, rank, pid, thread, start_ns, end_ns, raw_start, name, op_id, external_id, seq,
                         input_dims, input_types, concrete_inputs, flops, flops_source)
        SELECT {sid}, {rk}, pid, tid, {start}, {end}, ts, name, _n + {sid}::BIGINT * {ID_STRIDE}, external_id, seq,
               input_dims, input_types, concrete, flops, CASE WHEN flops IS NOT NULL THEN 'op' END
        FROM ({cpu_rows})""")
    con.execute(f"""
        INSERT INTO api_calls (source_id, rank, pid, thread, start_ns, end_ns, name, kind, correlation, external_id, cbid)
        SELECT {sid}, {rk}, pid, tid, {start}, {end}, name,
               CASE cat WHEN 'cuda_driver' THEN 'driver' ELSE 'runtime' END, correlation, external_id, cbid
        FROM _kin_api WHERE name IS NOT NULL""")
    con.execute("DROP TABLE _kin_api")
    con.execute(f"""
        INSERT INTO profiler_overhead (source_id, rank, name, start_ns, end_ns)
        SELECT {sid}, {rk}, name, {start}, {end} FROM _kin_span WHERE cat = 'overhead' AND name IS NOT NULL AND dur > 0""")


def _emit_collectives(con: duckdb.DuckDBPyConnection, sid: int, rk: str, start: str, end: str, dev: str) -> None:
    # NCCL: one row per collective kernel (torch >= 2.3 puts the metadata on the kernel itself); older
    # traces carry it only on the CPU-side record_param_comms op, joined through External id.
    con.execute(f"""
        INSERT INTO collectives (source_id, rank, device, stream, kernel_correlation, start_ns, end_ns, collective,
                                 process_group, process_group_desc, group_ranks, group_size, seq, in_nelems,
                                 out_nelems, dtype, bytes)
        WITH k AS (
            SELECT * FROM _kin_gpu
            WHERE cat = 'kernel' AND regexp_matches(name, '(?i)^(void )?(nccl|rccl)')
        ), comms AS (
            SELECT external_id, any_value(collective) AS collective, any_value(pg_name) AS pg_name,
                   any_value(pg_desc) AS pg_desc, any_value(pg_ranks) AS pg_ranks, any_value(group_size) AS group_size,
                   any_value(in_nelems) AS in_nelems, any_value(out_nelems) AS out_nelems, any_value(dtype) AS dtype
            FROM _kin_cpu WHERE name = 'record_param_comms' AND external_id IS NOT NULL GROUP BY external_id
        ), j AS (
            SELECT k.*, coalesce(k.collective, c.collective,
                                 lower(regexp_extract(k.name, '{NCCL_OP_RE}', 1))) AS coll,
                   coalesce(k.pg_name, c.pg_name) AS pgn, coalesce(k.pg_desc, c.pg_desc) AS pgd,
                   coalesce(k.pg_ranks, c.pg_ranks) AS pgr, coalesce(k.group_size, c.group_size) AS gs,
                   coalesce(k.in_nelems, c.in_nelems) AS inn, coalesce(k.out_nelems, c.out_nelems) AS outn,
                   coalesce(k.dtype, c.dtype) AS dt
            FROM k LEFT JOIN comms c USING (external_id)
        )
        SELECT {sid}, {rk}, {dev}, coalesce(stream, tid), correlation, {start}, {end}, coll, pgn, pgd, pgr, gs,
               (row_number() OVER (PARTITION BY coalesce(pgn, pgr, ''), coll ORDER BY ts) - 1)::INTEGER,
               inn, outn, dt, {_bytes_of("greatest(coalesce(inn, 0), coalesce(outn, 0))", "dt")}
        FROM j""")
    # Collectives of other communication kernels (symmetric memory, custom all-reduce, …): no NCCL metadata, but
    # the op that launched them (External id) names the collective and its first input is the buffer reduced or
    # gathered: `symm_mem::multimem_all_reduce_` [[2557440]] bf16. No process group: not paired across ranks.
    con.execute(f"""
        INSERT INTO collectives (source_id, rank, device, stream, kernel_correlation, start_ns, end_ns, collective, seq,
                                 in_nelems, out_nelems, dtype, bytes)
        WITH kn AS (
            -- the patterns read once per distinct name (27 k long kernel names: ~25 ms a pass on a 100 MiB trace);
            -- the name is an aggregate's result, so the filter is not pushed back under the grouping
            SELECT n FROM (SELECT any_value(name) AS n FROM _kin_gpu WHERE cat = 'kernel' GROUP BY name)
            WHERE NOT regexp_matches(n, '(?i)^(void )?(nccl|rccl)') AND regexp_matches(n, '{vocab.COMM_KERNEL_RE}')
        ), k AS (
            SELECT * FROM _kin_gpu
            WHERE cat = 'kernel' AND name IN (SELECT n FROM kn) AND external_id IS NOT NULL
        ), opn AS (
            SELECT n FROM (SELECT any_value(name) AS n FROM _kin_cpu WHERE external_id IS NOT NULL GROUP BY name)
            WHERE regexp_matches(n, '{OP_COLLECTIVE_RE}')
        ), o AS (
            SELECT external_id, arg_min(name, ts) AS op, arg_min(input_dims, ts) AS dims, arg_min(input_types, ts) AS types
            FROM _kin_cpu WHERE external_id IS NOT NULL AND name IN (SELECT n FROM opn)
            GROUP BY external_id
        ), j AS (
            SELECT k.*, replace(lower(regexp_extract(o.op, '{OP_COLLECTIVE_RE}', 1)), '_', '') AS coll,
                   TRY_CAST(list_product(TRY_CAST(json_extract(o.dims, '$[0]') AS BIGINT[])) AS BIGINT) AS n,
                   regexp_replace(lower(json_extract_string(o.types, '$[0]')), '^c10::', '') AS dt
            FROM k JOIN o USING (external_id)
        )
        SELECT {sid}, {rk}, {dev}, coalesce(stream, tid), correlation, {start}, {end}, coll,
               (row_number() OVER (PARTITION BY coll ORDER BY ts) - 1)::INTEGER, n, n, dt,
               {_bytes_of("n", "dt")}
        FROM j""")


# The collective an op performs, by its name (`symm_mem::one_shot_all_reduce`, `_C_custom_ar::all_reduce`, …).
OP_COLLECTIVE_RE = "(?i)(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)"


def _bytes_of(nelems: str, dt: str) -> str:
    """SQL: the bytes of `nelems` elements of dtype `dt`; NULL (unknown) when the dtype's size is not known or the
    product is beyond int64 (a broken element count: fuzzing found int64's maximum times 2 overflowing)."""
    return f"TRY_CAST(({nelems})::HUGEINT * {_dtype_bytes(dt)} AS BIGINT)"


def _dtype_bytes(dt: str) -> str:
    """SQL: the size in bytes of one element of the dtype named by `dt` (NULL when not known)."""
    return f"""CASE lower(coalesce({dt}, ''))
                        WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
                        WHEN 'double' THEN 8 WHEN 'long' THEN 8 WHEN 'int64' THEN 8
                        WHEN 'bfloat16' THEN 2 WHEN 'half' THEN 2 WHEN 'float16' THEN 2
                        WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'uint8' THEN 1
                        WHEN 'float8_e4m3fn' THEN 1 WHEN 'float8_e5m2' THEN 1 ELSE NULL END"""


def _emit_memory(con: duckdb.DuckDBPyConnection, sid: int, rk: str, base: int) -> None:
    """`[memory]` allocator events of device memory (profile_memory=True) → `memory_events`: the signed size of
    each allocation / free and, where the trace records them (torch >= 1.10), the allocator's totals after it.
    `Device Id` is the process's device ordinal; when the kernels of the trace ran on one device id and the
    allocator speaks of one other (ROCm numbers kernel devices after the CPU agents), they are the same GPU."""
    types = ", ".join(map(str, GPU_DEVICE_TYPES))
    kdev = [
        d
        for (d,) in con.execute(f"""SELECT DISTINCT {device_sql()} FROM _kin_gpu
                                          WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')""").fetchall()
    ]
    mdev = [
        d
        for (d,) in con.execute(f"SELECT DISTINCT device FROM _kin_mem WHERE device_type IN ({types}) AND device >= 0").fetchall()
    ]
    dev = f"{int(kdev[0])}" if len(kdev) == 1 and len(mdev) == 1 and kdev[0] is not None else "device"
    con.execute(f"""
        INSERT INTO memory_events (source_id, rank, device, pid, thread, ts_ns, bytes_delta, total_allocated,
                                   total_reserved, addr)
        SELECT {sid}, {rk}, {dev}, pid, tid, {ns_expr("ts", base)}, CAST(bytes AS BIGINT),
               CAST(total_allocated AS BIGINT), CAST(total_reserved AS BIGINT), addr
        FROM _kin_mem
        WHERE device_type IN ({types}) AND device IS NOT NULL AND device >= 0 AND ts IS NOT NULL AND isfinite(ts)
          AND bytes IS NOT NULL AND isfinite(bytes) AND abs(bytes) < 1e18
          AND (total_allocated IS NULL OR (isfinite(total_allocated) AND abs(total_allocated) < 1e18))
          AND (total_reserved IS NULL OR (isfinite(total_reserved) AND abs(total_reserved) < 1e18))""")
