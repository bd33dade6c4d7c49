"""Nsight Systems SQLite ingest: every table filled from real exports (2022.2 → 2026.2), times by SPEC §3,
ranks from processes, emit_nvtx ops linked to their kernels, GPU metrics as counters, and the H200 ground truth
end to end. Truth comes from the exports themselves (read with sqlite3 here), from the `nsys stats` CSVs
shipped beside the cloverleaf export, and from the corpus README (measured on the recording machine)."""

from __future__ import annotations

import csv
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from plasmient_report import metrics, pipeline, store
from plasmient_report.errors import BadInput
from plasmient_report.parsers import detect, nsys
from plasmient_report.parsers.nsys import events, gpu_metrics
from plasmient_report.peaks import load_table

from .conftest import corpus_file

WORKLOAD = "h200-single-nsys/nsys_workload.sqlite"
MM_FLOPS = 2 * 8192**3


def sq(path: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def ingest(path: Path):
    con = store.connect()
    info = nsys.ingest(path, con, 0)
    return con, info


@pytest.fixture(scope="module")
def workload():
    path = corpus_file(WORKLOAD)
    con, info = ingest(path)
    return path, con, info


def test_workload_tables_match_the_export(workload):
    path, con, info = workload
    assert detect(path) == "nsys-sqlite"
    assert info.format_version == "nsys 2025.3.2.0 (schema 3.20.3)"
    counts = dict(con.execute("SELECT kind, count(*) FROM kernels GROUP BY kind").fetchall())
    assert counts == {"compute": 4353, "memcpy": 10, "memset": 381}
    assert sq(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0] == 4353
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == 9537
    assert dict(con.execute("SELECT kind, count(*) FROM syncs GROUP BY kind").fetchall()) == {
        "Stream Wait Event": 10,
        "Context Sync": 1,
    }
    # Kernel ids unique and in the source's block of ids.
    assert con.execute("SELECT count(DISTINCT kernel_id), min(kernel_id), max(kernel_id) FROM kernels").fetchone() == (
        4744,
        1,
        4744,
    )
    # SPEC §3: utc = TARGET_INFO_SESSION_START_TIME.utcEpochNs + t, exact to the ns.
    ((utc0,),) = sq(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    ((t0,),) = sq(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert utc0 == 1796062558838160498 and t0 == 13011894
    assert con.execute("SELECT min(start_ns) FROM kernels WHERE kind = 'compute'").fetchone()[0] == utc0 + t0
    assert info.base_time_ns == utc0 and info.clock_anchor == "native"
    # Names as Kineto writes them: demangled kernels, `Memcpy DtoH (Device -> Pinned)`, runtime names unversioned.
    assert con.execute("SELECT DISTINCT name, copy_kind FROM kernels WHERE kind = 'memcpy'").fetchall() == [
        ("Memcpy DtoH (Device -> Pinned)", "DtoH (Pinned)")
    ]
    assert (
        con.execute("SELECT count(*) FROM api_calls WHERE name = 'cudaLaunchKernel' AND kind = 'runtime'").fetchone()[0] == 3920
    )
    assert con.execute("SELECT count(*) FROM api_calls WHERE name = 'cuLaunchKernelEx' AND kind = 'driver'").fetchone()[0] == 433
    assert (
        con.execute(
            "SELECT count(*) FROM kernels WHERE name LIKE 'nvjet_sm90%' AND grid_x > 0 AND block_x > 0 AND regs > 0 AND smem > 0"
        ).fetchone()[0]
        > 0
    )


def test_workload_process_device_and_ranges(workload):
    path, con, info = workload
    # One GPU process (pid 1180) and no rank in its environment: the aligner numbers it.
    assert info.processes == {1180: None} and not info.multi_rank and info.rank is None
    assert con.execute("SELECT DISTINCT pid FROM api_calls").fetchall() == [(1180,)]
    assert con.execute("SELECT * EXCLUDE (source_id, rank) FROM devices").fetchall() == [
        (0, "GPU-963dfaf6-ee6f-e154-3bb4-ed3c56e03519", "0000:00:06.0", "NVIDIA H200", 132, 150109880320, "9.0", "NVIDIA")
    ]
    phases = sq(path, "SELECT text, start, end FROM NVTX_EVENTS WHERE text LIKE 'phase:%' ORDER BY start")
    got = con.execute(
        "SELECT name, start_ns, end_ns, domain, on_gpu FROM ranges WHERE name LIKE 'phase:%' ORDER BY start_ns"
    ).fetchall()
    assert got == [(n, info.base_time_ns + s, info.base_time_ns + e, "default", False) for n, s, e in phases]
    # Registered-string NVTX ranges of another domain get that domain's name (the 75-row) and their text.
    assert ("CCCL", "cub::DeviceRadixSort", 3) in con.execute("SELECT domain, name, count(*) FROM ranges GROUP BY ALL").fetchall()
    # emit_nvtx op ranges are ops, not ranges.
    assert con.execute("SELECT count(*) FROM ranges WHERE name LIKE '%op_id = %'").fetchone()[0] == 0


def test_emit_nvtx_ops_parse_like_kineto(workload):
    path, con, info = workload
    ((n_ops,),) = sq(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND domainId = 0 AND text LIKE '%, op_id = %'")
    assert con.execute("SELECT count(*), count(DISTINCT op_id) FROM ops").fetchone() == (n_ops, n_ops) == (12355,) * 2
    mm = con.execute(
        "SELECT name, seq, input_dims, input_types FROM ops WHERE name = 'aten::mm' ORDER BY start_ns LIMIT 1"
    ).fetchone()
    assert mm == ("aten::mm", 2156, "[[8192, 8192], [8192, 8192]]", None)
    # Scalars and backward nodes: `[]` entries kept, names bare, seq where the text has one.
    assert con.execute("SELECT input_dims FROM ops WHERE name = 'aten::add_' LIMIT 1").fetchone()[0] == "[[268435456], [], []]"
    assert con.execute("SELECT count(*) FROM ops WHERE name = 'MmBackward0' AND seq IS NOT NULL").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM ops WHERE name LIKE '%op_id%' OR name LIKE '%, seq%'").fetchone()[0] == 0
    # Ops and launches share thread numbering (tid from globalTid): forward on 1180, autograd on 1222.
    assert {t for (t,) in con.execute("SELECT DISTINCT thread FROM ops").fetchall()} == {1180, 1222}
    assert {t for (t,) in con.execute("SELECT DISTINCT thread FROM api_calls").fetchall()} == {1180, 1222}


def test_kernel_and_op_ids_follow_the_export_in_time_order_and_the_tables_hold_them_so(tmp_path: Path):
    """kernel_id numbers the GPU activities by (start, end, stream, correlation), op_id the emit_nvtx ops by (start,
    the longer first, thread), ties in the export's order (its rowids); the tables keep their rows in id order
    (nest_ops reads ties in it). The recording has no tied ops: a copy of it gets 200 (every 50th op takes the
    times of the op before it, on its thread). The truth is the export's own rows, sorted so."""
    path = tmp_path / "ties.sqlite"
    shutil.copy(corpus_file(WORKLOAD), path)
    op_rows = """SELECT rowid, start, "end", globalTid & 16777215 AS tid, text FROM NVTX_EVENTS
                 WHERE eventType IN (59, 60) AND domainId = 0 AND text LIKE '%, op_id = %' AND "end" IS NOT NULL"""
    c = sqlite3.connect(path)
    c.execute(f"""
        UPDATE NVTX_EVENTS SET start = p.ps, "end" = p.pe, globalTid = p.pg FROM (
            SELECT rowid AS r, lag(start) OVER w AS ps, lag("end") OVER w AS pe, lag(globalTid) OVER w AS pg,
                   row_number() OVER w AS i
            FROM ({op_rows.replace("globalTid & 16777215 AS tid", "globalTid")}) WINDOW w AS (ORDER BY rowid)) p
        WHERE NVTX_EVENTS.rowid = p.r AND p.i % 50 = 0""")
    c.commit()
    c.close()
    ops = sorted(sq(path, op_rows), key=lambda r: (r[1], -r[2], r[3], r[0]))
    ties = {(r[1], r[2], r[3]) for r in ops}
    assert len(ops) - len(ties) == 12355 // 50
    con, info = ingest(path)
    base = info.base_time_ns
    got = con.execute("SELECT op_id, start_ns, end_ns, thread, seq FROM ops").fetchall()  # (in the table's order)
    assert [g[0] for g in got] == sorted(g[0] for g in got)
    seq = [int(t.split(", seq = ")[1].split(",")[0]) if ", seq = " in t else None for _, _, _, _, t in ops]
    assert [g[1:] for g in got] == [(base + s, base + e, tid, q) for (_, s, e, tid, _), q in zip(ops, seq, strict=True)]
    acts = sq(
        path,
        """SELECT start, "end", streamId, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
           SELECT start, "end", streamId, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
           SELECT start, "end", streamId, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET""",
    )
    kernels = con.execute("SELECT kernel_id, start_ns, end_ns, stream, correlation FROM kernels").fetchall()
    assert [k[0] for k in kernels] == sorted(k[0] for k in kernels)
    assert [k[1:] for k in kernels] == [(base + s, base + e, st, cr) for s, e, st, cr in sorted(acts)]


def test_kernels_link_to_launches_and_mm_ops_get_their_flops(workload):
    _, con, _ = workload
    con = con.cursor()  # the module's store, analysed on a cursor (same database)
    unlinked = con.execute("""
        SELECT count(*) FROM kernels k WHERE NOT EXISTS (
            SELECT 1 FROM api_calls a WHERE a.source_id = k.source_id AND a.correlation = k.correlation)""").fetchone()
    assert unlinked == (0,)
    metrics.model_op_flops(con)
    metrics.nest_ops(con)
    metrics.attribute_kernel_flops(con)
    # phase:compute_bound: 30 × 8192³ mm, each one nvjet kernel carrying 2·8192³ FLOPs from its aten::mm range.
    ((s, e),) = con.execute("SELECT start_ns, end_ns FROM ranges WHERE name = 'phase:compute_bound'").fetchall()
    rows = con.execute(
        """
        SELECT o.name, k.flops FROM kernels k JOIN ops o ON o.op_id = k.flops_op_id
        WHERE k.start_ns BETWEEN ? AND ? AND k.kind = 'compute'""",
        [s, e + 10**9],
    ).fetchall()
    mm = [f for n, f in rows if n == "aten::mm"]
    assert len(mm) >= 30
    assert sum(f for f in mm[:30]) == pytest.approx(30 * MM_FLOPS)


def test_gpu_metrics_become_interval_counters(workload):
    path, con, info = workload
    ((n,),) = sq(path, "SELECT count(*) FROM GPU_METRICS WHERE timestamp >= 0")
    assert con.execute("SELECT count(*) FROM counters").fetchone()[0] == n == 448580
    metrics_seen = {m for (m,) in con.execute("SELECT DISTINCT metric FROM counters").fetchall()}
    assert {
        "sm_active",
        "tensor_active",
        "dram_read",
        "dram_write",
        "gr_engine_active",
        "sm_clock_mhz",
        "sm_issue",
        "compute_warps_in_flight",
        "pcie_rx",
    } <= metrics_seen
    # 10 kHz sampling: every sample is the interval [t − 100 µs, t]; % metrics are fractions.
    assert con.execute("SELECT DISTINCT end_ns - start_ns, time_source, device FROM counters").fetchall() == [
        (100_000, "native", 0)
    ]
    assert info.sample_period_ns == 100_000
    lo, hi = con.execute(
        "SELECT min(value), max(value) FROM counters WHERE metric IN "
        "('sm_active', 'tensor_active', 'dram_read', 'gr_engine_active')"
    ).fetchone()
    assert 0 <= lo and hi <= 1.0
    lo, hi = con.execute("SELECT min(value), max(value) FROM counters WHERE metric = 'sm_clock_mhz'").fetchone()
    assert 1000 < lo and hi < 2000  # H200 boost clock 1980 MHz

    def mean(metric: str, phase: str) -> float:
        return con.execute(
            """
            SELECT avg(c.value) FROM counters c, ranges r
            WHERE r.name = ? AND c.metric = ? AND c.end_ns BETWEEN r.start_ns AND r.end_ns""",
            [phase, metric],
        ).fetchone()[0]

    # The check: tensor pipes busy in the matmul phase, idle in the elementwise one (which saturates HBM).
    assert mean("tensor_active", "phase:compute_bound") > 0.8
    assert mean("tensor_active", "phase:memory_bound") < 0.05
    assert mean("dram_read", "phase:memory_bound") + mean("dram_write", "phase:memory_bound") > 0.8


def test_gpu_metrics_are_stored_in_the_exports_order(monkeypatch: pytest.MonkeyPatch):
    """Counters go into the store as the export holds them (each series in time order): readers that need time
    order (the Perfetto writer) then stream them instead of sorting millions of rows. Many small chunks and
    batches, so that a parallel insert would have had the chance to interleave them. Truth: the export's own
    rowid order, read with sqlite3."""
    path = corpus_file(WORKLOAD)
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 20_000)
    monkeypatch.setattr(nsys.reader, "BATCH_ROWS", 2_048)
    con = store.connect()
    con.execute("SET threads = 2")
    nsys.ingest(path, con, 0)
    got = con.execute("SELECT end_ns - min(end_ns) OVER () FROM counters WHERE metric = 'sm_active' ORDER BY rowid").fetchall()
    con.close()
    want = sq(
        path,
        """SELECT g.timestamp - min(g.timestamp) OVER () FROM GPU_METRICS g
                       JOIN TARGET_INFO_GPU_METRICS m USING (typeId, metricId)
                       WHERE m.metricName LIKE 'SMs Active%' AND g.timestamp >= 0 ORDER BY g.rowid""",
    )
    assert len(got) == len(want) > 20_000
    assert got == want


@pytest.mark.parametrize("first", [None, "h200-single-nsys/nvml_samples_nsys.csv"])
def test_gpu_metrics_carry_the_rank_the_aligner_gives_their_source(first):
    """A one-process export with no rank of its own is ranked by the aligner (input order, the lowest number no
    input claims); its GPU metrics go in with its input position as their rank, so that the aligner rewrites them
    only when that guess is wrong — here once right (the export alone: rank 0) and once wrong (after the NVML log
    of the same run, a counter log and no rank, the export is input 1 but gets rank 0). Truth: the aligner's rule,
    and every other table of the source, which the aligner ranks in the same pass."""
    from plasmient_report import align

    inputs = ([corpus_file(first)] if first else []) + [corpus_file(WORKLOAD)]
    with pipeline.run_store(inputs, pipeline.Options()) as con:
        pipeline.ingest(con, inputs)
        ((sid,),) = con.execute("SELECT source_id FROM sources WHERE format = 'nsys-sqlite'").fetchall()
        assert sid == len(inputs) - 1
        ((guess,),) = con.execute("SELECT DISTINCT rank FROM counters WHERE source_id = ?", [sid]).fetchall()
        assert guess == sid
        align.align(con)
        ((rank,),) = con.execute("SELECT rank FROM sources WHERE source_id = ?", [sid]).fetchall()
        assert rank == 0
        for t in ("counters", "kernels", "ops"):
            got = con.execute(f"SELECT DISTINCT rank FROM {t} WHERE source_id = ?", [sid]).fetchall()
            assert got == [(0,)], t


@pytest.mark.slow
def test_workload_end_to_end_matches_the_ground_truth():
    """README ground truth: compute_bound ≈ 0.76 of 989.4 TFLOP/s bf16; train_step ≈ 0.47. emit_nvtx has no
    dtypes, so the peak precision is assumed (bf16) and the verdict's peak source says so."""
    path = corpus_file(WORKLOAD)
    res = pipeline.analyse([path], pipeline.Options(ranges=["phase:compute_bound"]))
    v = res.verdict
    assert 0.72 <= v["achieved_fraction_of_peak"] <= 0.80
    assert v["utilization"]["trace"] > 0.95
    assert v["peak"]["precision"] == "bf16" and v["peak"]["tflops"] == pytest.approx(989.4)
    assert "bf16 assumed" in v["peak"]["source"]
    # GPU metrics reach the verdict: tensor pipes busy here, idle in the elementwise phase.
    assert v["utilization"]["tensor_active"] > 0.8
    mem = pipeline.analyse([path], pipeline.Options(ranges=["phase:memory_bound"])).verdict
    assert mem["utilization"]["tensor_active"] < 0.05 and mem["utilization"]["sm_active"] > 0.9
    res = pipeline.analyse([path], pipeline.Options(ranges=["phase:train_step"]))
    assert 0.40 <= res.verdict["achieved_fraction_of_peak"] <= 0.55


@pytest.mark.slow
def test_phases_agree_with_the_kineto_run_of_the_same_workload():
    """Issue 3: per-phase utilization and achieved fraction within 10% relative of the Kineto recording."""
    ns = corpus_file(WORKLOAD)
    kin = corpus_file("h200-single-kineto/kineto_single.json.gz")
    for phase in ("phase:compute_bound", "phase:memory_bound", "phase:train_step"):
        a = pipeline.analyse([ns], pipeline.Options(ranges=[phase])).verdict
        b = pipeline.analyse([kin], pipeline.Options(ranges=[phase])).verdict
        assert a["utilization"]["trace"] == pytest.approx(b["utilization"]["trace"], rel=0.10), phase
        assert a["achieved_fraction_of_peak"] == pytest.approx(b["achieved_fraction_of_peak"], rel=0.10, abs=1e-3), phase


def test_cloverleaf_matches_nsys_stats_exactly():
    """`nsys stats` cuda_gpu_trace / cuda_api_trace CSVs of the same export: counts and kernel time to the ns."""
    path = corpus_file("public-nsys-pipit-cloverleaf/perlmutter-cloverleaf-cuda.sqlite")
    gpu_csv = corpus_file("public-nsys-pipit-cloverleaf/cloverleaf_gpu_trace.csv")
    api_csv = corpus_file("public-nsys-pipit-cloverleaf/cloverleaf-cuda_api_trace.csv")
    with open(gpu_csv, newline="") as f:
        leaves = [r for r in csv.DictReader(f) if r["Event Type"] == "Leave"]
    with open(api_csv, newline="") as f:
        api_leaves = [r for r in csv.DictReader(f) if r["Event Type"] == "Leave"]
    kern = [r for r in leaves if r["type"] == "kernel"]
    copies = [r for r in leaves if r["type"] != "kernel"]
    kern_ns = sum(int(r["Timestamp (ns)"]) - int(r["_matching_timestamp"]) for r in kern)
    copy_ns = sum(int(r["Timestamp (ns)"]) - int(r["_matching_timestamp"]) for r in copies)
    con, info = ingest(path)
    assert (
        con.execute("SELECT count(*), sum(end_ns - start_ns) FROM kernels WHERE kind = 'compute'").fetchone()
        == (len(kern), kern_ns)
        == (1312, 294404540)
    )
    assert con.execute("SELECT count(*), sum(end_ns - start_ns), sum(bytes) FROM kernels WHERE kind = 'memcpy'").fetchone() == (
        len(copies),
        copy_ns,
        sum(float(r["bytes"]) for r in copies),
    )
    assert con.execute("SELECT count(*) FROM api_calls WHERE kind <> 'osrt'").fetchone()[0] == len(api_leaves) == 3048
    # nsys stats prints export-relative times: first kernel at 533338240 ns → + utcEpochNs.
    first = min(int(r["_matching_timestamp"]) for r in kern)
    assert con.execute("SELECT min(start_ns) FROM kernels").fetchone()[0] == 1696392839587175550 + first
    # Pageable copies named as such; the process's device 0 is physical GPU id 3 at 0000:03:00.0 (cuDevice 0).
    assert dict(con.execute("SELECT copy_kind, count(*) FROM kernels WHERE kind = 'memcpy' GROUP BY 1").fetchall()) == {
        "HtoD (Pageable)": 254,
        "DtoH (Pageable)": 25,
    }
    assert con.execute("SELECT device, bus_id, name FROM devices").fetchall() == [(0, "0000:03:00.0", "NVIDIA A100-SXM4-80GB")]
    # Rank from the captured environment (PMI_RANK=0; SLURM_PROCID agrees).
    assert (info.rank, info.rank_method) == (0, "env:PMI_RANK")
    assert con.execute("SELECT DISTINCT rank FROM kernels").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM syncs").fetchone()[0] == 1312


def test_nsys_2022_export_with_its_oddities():
    """2022.2: EXPORT_META_DATA, non-lazy (empty tables present), an extra `name` column, invalid UTF-8 in
    TARGET_INFO_SYSTEM_ENV; the rank comes from the NUL-separated DeviceEnvironment (PMI_RANK=0, PMI_SIZE=2)."""
    path = corpus_file("public-nsys-pipit-saxpy-mpi/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    con, info = ingest(path)
    assert info.format_version == "nsys 2022.2.1.31 (schema 2.9.1)"
    assert info.host == "nid001608"
    assert (info.rank, info.world_size) == (0, 2)
    assert dict(con.execute("SELECT kind, count(*) FROM kernels GROUP BY 1").fetchall()) == {"compute": 5, "memcpy": 15}
    ((utc0,),) = sq(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    ((t0,),) = sq(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert con.execute("SELECT min(start_ns) FROM kernels WHERE kind = 'compute'").fetchone()[0] == utc0 + t0
    assert dict(con.execute("SELECT domain, count(*) FROM ranges GROUP BY 1").fetchall()) == {"MPI": 17, "default": 5}
    assert con.execute("SELECT count(*) FROM ranges WHERE name = 'MPI_Send'").fetchone()[0] == 10
    assert con.execute("SELECT name FROM devices").fetchall() == [("NVIDIA A100-SXM4-40GB",)]


def test_two_process_report_is_two_ranks():
    """nsys-ai's 2×H100 export (time-sliced, no TARGET_INFO_GPU): each python process is a rank, numbered by
    its CUDA device; correlation ids repeat across processes and are made unique within the source."""
    path = corpus_file("public-nsys-nsysai/mfu_2gpu_before.sqlite")
    con, info = ingest(path)
    assert info.multi_rank and info.world_size == 2 and info.rank_method == "device"
    assert info.processes == {144: 0, 145: 1}
    per_rank = con.execute("SELECT rank, device, kind, count(*) FROM kernels GROUP BY ALL ORDER BY ALL").fetchall()
    assert (0, 0, "nccl", 33) in per_rank and (1, 1, "nccl", 33) in per_rank
    assert (0, 0, "compute", 1960) in per_rank and (1, 1, "compute", 1984) in per_rank
    # The two processes' raw correlation ids overlap; every kernel still finds exactly its own launch.
    raw = sq(
        path,
        """SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
                      GROUP BY correlationId HAVING count(DISTINCT globalPid) > 1)""",
    )
    assert raw[0][0] == 78
    bad = con.execute("""
        SELECT count(*) FROM kernels k JOIN api_calls a ON a.source_id = k.source_id AND a.correlation = k.correlation
        WHERE a.rank <> k.rank""").fetchone()[0]
    assert bad == 0
    # NCCL: kernels → collectives with seq per rank; the NCCL domain's API ranges (no 75-row kept here) → ranges.
    seqs = con.execute(
        "SELECT rank, collective, list(seq ORDER BY start_ns) FROM collectives GROUP BY ALL ORDER BY rank"
    ).fetchall()
    assert [(r, c) for r, c, _ in seqs] == [(0, "sendrecv"), (1, "sendrecv")]
    assert seqs[0][2] == seqs[1][2] == list(range(33))
    assert dict(con.execute("SELECT domain, count(*) FROM ranges GROUP BY 1").fetchall()) == {"NCCL": 462}
    # No GPU model in this export: devices rows exist without a name (the user gives --gpu).
    assert con.execute("SELECT rank, device, name FROM devices ORDER BY rank").fetchall() == [(0, 0, None), (1, 1, None)]
    assert any("--gpu" in n for n in info.notes)


def test_every_corpus_export_ingests():
    expected = {  # file: (kernels+copies, ops, GPU name)
        "h200-single-nsys/nsys_small.sqlite": (18, 0, "NVIDIA H200"),
        "public-nsys-nsysai/mock.sqlite": (3, 0, "NVIDIA GeForce RTX 3080"),
        "public-nsys-nsysai/h100_2gpu_1s.sqlite": (4368, 16782, None),
    }
    for rel, (n_gpu, n_ops, gpu) in expected.items():
        con, info = ingest(corpus_file(rel))
        assert info.gpu_events == n_gpu, rel
        assert con.execute("SELECT count(*) FROM ops").fetchone()[0] == n_ops, rel
        assert con.execute("SELECT any_value(name) FROM devices").fetchone()[0] == gpu, rel
        ((utc0,),) = sq(corpus_file(rel), "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
        ((t0,),) = sq(corpus_file(rel), "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
        assert (
            con.execute("SELECT min(start_ns) FROM kernels WHERE kind <> 'memcpy' AND kind <> 'memset'").fetchone()[0]
            == utc0 + t0
        ), rel


# ------------------------------------------------------------------ synthetic exports: what real files lack


def _export(
    path: Path, *, normalized: bool = False, kernels: bool = True, meta: str = "META_DATA_EXPORT", nvtx_nulls: int = 0
) -> Path:
    """A minimal lazy export: metadata, strings, one process, optional kernels and NVTX."""
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE {meta} (name TEXT, value TEXT)")
    con.executemany(
        f"INSERT INTO {meta} VALUES (?, ?)",
        [
            ("EXPORT_PRODUCT_VERSION", "2026.9.9.9"),
            ("EXPORT_SCHEMA_VERSION", "3.99.0"),
            ("EXPORT_PARAM_TIME_NORMALIZE", "true" if normalized else "false"),
            ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ],
    )
    con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)")
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1800000000000000000, '2027-01-15T08:00:00', '')")
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)", [(1, "my_kernel"), (2, "cudaLaunchKernel_v7000"), (3, "registered range")]
    )
    gpid = 7 << 24
    base = 1800000000000000000 if normalized else 0
    if kernels:
        # a future column order with an extra column the parser does not know
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (futureCol TEXT, start INTEGER, end INTEGER, "
            "deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, "
            "globalPid INTEGER, demangledName INTEGER, shortName INTEGER, gridX INTEGER)"
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ('x', ?, ?, 0, 1, 7, 5, ?, 1, 1, 4)", [base + 1000, base + 3000, gpid]
        )
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, eventClass INTEGER, "
            "globalTid INTEGER, correlationId INTEGER, nameId INTEGER, returnValue INTEGER)"
        )
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, 5, 2, 0)", [base + 500, base + 900, gpid | 9])
    if nvtx_nulls:
        con.execute(
            "CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, "
            "globalTid INTEGER, textId INTEGER, domainId INTEGER)"
        )
        rows = [(base + i, base + i + 1, 59, None, gpid | 9, 3, 0) for i in range(nvtx_nulls)]
        rows.append((base + 10, base + 5000, 59, "phase:late text", gpid | 9, None, 0))
        con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return path


def test_lazy_export_with_missing_tables_and_extra_columns(tmp_path: Path):
    con, info = ingest(_export(tmp_path / "lazy.sqlite"))
    assert con.execute("SELECT name, start_ns, end_ns, grid_x, stream FROM kernels").fetchall() == [
        ("my_kernel", 1800000000000000000 + 1000, 1800000000000000000 + 3000, 4, 7)
    ]
    assert con.execute("SELECT name, pid, thread, correlation FROM api_calls").fetchall() == [("cudaLaunchKernel", 7, 9, 5)]
    for t in ("ops", "ranges", "syncs", "counters", "collectives"):
        assert con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0, t
    assert info.format_version == "nsys 2026.9.9.9 (schema 3.99.0)"
    # No TARGET_INFO_GPU: a device row without a name, and a note saying --gpu.
    assert con.execute("SELECT device, name FROM devices").fetchall() == [(0, None)]


@pytest.mark.parametrize(
    ("gpus", "name", "uuid", "note"),
    [
        # the host's one GPU, no CUDA device map and no cuDevice (nsys 2020's exports, exported again): that GPU
        ([(0, "TITAN RTX", None, "9f6a0c1e-0000-4000-8000-000000000001")], "TITAN RTX", "GPU-9f6a0c1e", None),
        # eight of one model, each cuDevice 0 (one GPU per process): the model, not which of them
        (
            [(i, "Tesla V100-SXM2-16GB", 0, f"00000000-0000-0000-0000-00000000000{i}") for i in range(8)],
            "Tesla V100-SXM2-16GB",
            None,
            None,
        ),
        # two models, no map: TARGET_INFO_GPU.id = the kernels' deviceId, as nsys's cuda_gpu_trace joins, and said
        (
            [(1, "GeForce RTX 2080 Ti", None, None), (0, "GeForce RTX 3090", None, None)],
            "GeForce RTX 3090",
            None,
            "GPU model of device 0 read from TARGET_INFO_GPU.id",
        ),
    ],
)
def test_gpu_model_of_an_export_without_a_cuda_device_map(tmp_path: Path, gpus, name, uuid, note):
    """Older exports (nsys 2020-2021 reports, exported by a newer nsys) have TARGET_INFO_GPU but no
    TARGET_INFO_CUDA_DEVICE, and an empty or shared cuDevice: three public ones came out as "unknown GPU" while nsys's
    own cuda_gpu_trace named theirs (a TITAN RTX, a V100 of eight, an RTX 3090 beside a 2080 Ti)."""
    path = _export(tmp_path / "old.sqlite")
    with sqlite3.connect(path) as sq:
        sq.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, cuDevice INTEGER, uuid TEXT, busLocation TEXT)")
        sq.executemany("INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?, '0000:01:00.0')", gpus)
    con, info = ingest(path)
    ((got_name, got_uuid),) = con.execute("SELECT name, gpu_uuid FROM devices").fetchall()
    assert got_name == name
    assert (got_uuid or "").startswith(uuid or "") and (got_uuid is None) == (uuid is None)
    said = [n for n in info.notes if "GPU model" in n]
    if note is None:
        assert said == []
    else:
        assert len(said) == 1 and note in said[0], said


def test_time_normalised_export_is_not_shifted_twice(tmp_path: Path):
    con, info = ingest(_export(tmp_path / "norm.sqlite", normalized=True))
    assert con.execute("SELECT start_ns FROM kernels").fetchone()[0] == 1800000000000000000 + 1000
    assert info.base_time_ns == 0


def test_old_metadata_table_name(tmp_path: Path):
    con, info = ingest(_export(tmp_path / "old.sqlite", meta="EXPORT_META_DATA"))
    assert info.format_version.startswith("nsys 2026.9.9.9")


def test_text_column_that_starts_null_is_read(tmp_path: Path):
    """The ADBC driver types columns from the first rows: 70 k registered-string ranges (text NULL) before a
    plain-text one must not break the read."""
    con, _ = ingest(_export(tmp_path / "nvtx.sqlite", nvtx_nulls=70_000))
    assert con.execute("SELECT count(*) FROM ranges WHERE name = 'registered range'").fetchone()[0] == 70_000
    assert con.execute("SELECT count(*) FROM ranges WHERE name = 'phase:late text'").fetchone()[0] == 1


def test_export_without_kernels_is_reported(tmp_path: Path):
    """An export with no CUDA table says so, and names what it holds instead (an NVTX- or GPU-metrics-only
    recording, as two public reports were, is not a CPU-only profile); one with no recording at all (string tables
    only: an older nsys's export of a newer report) says that."""
    path = _export(tmp_path / "nokern.sqlite", kernels=False)
    con = store.connect()
    with pytest.raises(BadInput, match=r"no CUDA trace in this export \(no CUPTI_ACTIVITY_KIND table.*, and GPU util"):
        pipeline.ingest(con, [path])
    path = _export(tmp_path / "nvtx_metrics.sqlite", kernels=False, nvtx_nulls=3)  # 3 + 1 NVTX events
    with sqlite3.connect(path) as sq:
        sq.execute("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER)")
        sq.executemany("INSERT INTO GPU_METRICS VALUES (?, 1, 2, 50)", [(t,) for t in range(1000, 1005)])
    with pytest.raises(BadInput, match=r"no CUDA trace .*; it holds 5 GPU metric samples, 4 NVTX events, but GPU util"):
        pipeline.ingest(store.connect(), [path])
    empty = tmp_path / "strings_only.sqlite"
    with sqlite3.connect(empty) as sq:
        sq.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    with pytest.raises(BadInput, match="this export holds no recording"):
        pipeline.ingest(store.connect(), [empty])


def test_sqlite_that_is_not_an_nsys_export(tmp_path: Path):
    path = tmp_path / "other.sqlite"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE t (x)")
    c.commit()
    c.close()
    with pytest.raises(BadInput, match="not an Nsight Systems export"):
        ingest(path)


def test_gpu_metrics_read_in_rowid_chunks(monkeypatch: pytest.MonkeyPatch, workload):
    """Large exports insert GPU_METRICS in rowid chunks with a checkpoint between (bounded memory): the same rows."""
    path, con0, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 100_000)
    con, _ = ingest(path)
    q = "SELECT metric, count(*), round(sum(value), 6), min(start_ns), max(end_ns) FROM counters GROUP BY 1 ORDER BY 1"
    assert con.execute(q).fetchall() == con0.cursor().execute(q).fetchall()


@pytest.mark.parametrize("dense", [True, False])
def test_gpu_metrics_rowid_chunks_count_the_rows_only_when_the_file_cannot_hold_the_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dense: bool
):
    """More than 64 chunks of dense rowids are read as they are; counting the rows first (a scan of the table: 0.48 s
    at 49.8 M rows) is for sparse rowids that a file of this size cannot hold, which then get no more chunks than
    the rows need. Both ways every rowid falls in exactly one chunk."""
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 1_000)
    path = tmp_path / "gm.sqlite"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER)")
    rowids = range(1, 100_001) if dense else range(1, 100 * 10**9, 10**9)  # 100 chunks; or 10^8 asked, 100 rows
    c.executemany(
        "INSERT INTO GPU_METRICS (rowid, timestamp, typeId, metricId, value) VALUES (?, ?, 0, 1, 50)", ((r, r) for r in rowids)
    )
    c.commit()
    c.close()
    ex = nsys.reader.Export(path)
    asked: list[str] = []
    real = ex.rows
    monkeypatch.setattr(ex, "rows", lambda sql, *a: asked.append(sql) or real(sql, *a))
    chunks = gpu_metrics.rowid_chunks(ex, "GPU_METRICS")
    ex.close()
    counted = any("count(*)" in q for q in asked)
    assert counted != dense
    assert len(chunks) == (100 if dense else 1)
    for r in (rowids[0], rowids[len(rowids) // 2], rowids[-1]):
        assert sum(1 for ch in chunks if ch is not None and ch[0] <= r <= ch[1]) == 1


def test_gpu_metrics_inserted_side_by_side_or_one_by_one_give_the_same_table(monkeypatch: pytest.MonkeyPatch, workload):
    """Chunks go in two at a time, each on its own connection and committed in order; inside a caller's transaction
    (whose snapshot would not see those commits) one by one on the caller's connection. The same rows in the same
    order either way, and the same as the export read in one piece (the workload fixture)."""
    path, con0, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 60_000)
    made: list[bool] = []
    real = gpu_metrics._Inserters.of
    monkeypatch.setattr(
        gpu_metrics._Inserters, "of", staticmethod(lambda c, n: (lambda i: made.append(i is not None) or i)(real(c, n)))
    )
    q = "SELECT metric, end_ns, value, rank, device, gpu_uuid FROM counters ORDER BY rowid"
    want = con0.cursor().execute(q).fetchall()
    side, _ = ingest(path)
    assert made == [True]
    assert side.execute(q).fetchall() == want
    con = store.connect()
    con.execute("BEGIN TRANSACTION")
    nsys.ingest(path, con, 0)
    assert made == [True]  # none made inside the transaction
    assert con.execute(q).fetchall() == want
    con.execute("COMMIT")


def test_gpu_metrics_checkpoint_an_in_memory_store_only(monkeypatch: pytest.MonkeyPatch, tmp_path, workload):
    """A file store (a run's) writes each pair of chunks compressed into its file as it commits, so its memory stays
    bounded without a checkpoint per pair (each one rewrote the table's list of row groups: quadratic in the
    export); an in-memory store compresses only at a checkpoint: one after each pair. The same rows either way."""
    path, con0, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 60_000)
    checkpoints: list[str] = []

    class Recorded:  # an inserter's cursor that notes the checkpoints run on it
        def __init__(self, cur: object) -> None:
            self._cur = cur

        def execute(self, sql: str, *a: object) -> object:
            if sql.strip().upper() == "CHECKPOINT":
                checkpoints.append(sql)
            return self._cur.execute(sql, *a)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self._cur, name)

    real = gpu_metrics._Inserters.of
    monkeypatch.setattr(
        gpu_metrics._Inserters, "of", staticmethod(lambda c, n: gpu_metrics._Inserters([Recorded(x) for x in real(c, n).cursors]))
    )
    q = "SELECT metric, end_ns, value, rank, device, gpu_uuid FROM counters ORDER BY rowid"
    want = con0.cursor().execute(q).fetchall()
    ((rows,),) = sq(path, "SELECT count(*) FROM GPU_METRICS")
    pairs = -(-len(gpu_metrics.rowid_chunks(nsys.open_export(path), "GPU_METRICS")) // 2)
    assert rows > 4 * 60_000 and pairs >= 2
    memory, _ = ingest(path)
    assert len(checkpoints) == pairs
    assert memory.execute(q).fetchall() == want
    checkpoints.clear()
    con = store.connect(tmp_path / "store.duckdb")
    nsys.ingest(path, con, 0)
    assert checkpoints == []
    assert con.execute(q).fetchall() == want


def test_gpu_metrics_insert_that_fails_is_one_line_naming_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path, workload):
    """A sample whose UTC time leaves int64 (a hostile timestamp) fails its chunk's insert while the next chunk is
    inserted beside it: both roll back, and the run stops with one line naming the file."""
    path, _, _ = workload
    bad = tmp_path / "bad.sqlite"
    shutil.copy(path, bad)
    c = sqlite3.connect(bad)
    c.execute("UPDATE GPU_METRICS SET timestamp = 9223372036854775000 WHERE rowid = 150000")
    c.commit()
    c.close()
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 100_000)
    con = store.connect()
    with pytest.raises(BadInput) as e:
        nsys.ingest(bad, con, 0)
    assert "bad.sqlite" in str(e.value) and "GPU_METRICS" in str(e.value) and "\n" not in str(e.value)
    # the sample is in the second chunk: the first pair of chunks failed, and neither chunk's rows were committed
    assert con.execute("SELECT count(*) FROM counters").fetchone()[0] == 0


def test_gpu_metrics_load_beside_the_other_tables_gives_the_same_store(monkeypatch: pytest.MonkeyPatch, workload):
    """The GPU metrics go in on threads of their own while the kernels, calls and ranges are written: every table
    and the source's notes come out as when the metrics go in after them (emit_counters, the order of old)."""
    path, _, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 60_000)
    side, info = ingest(path)
    monkeypatch.setattr(gpu_metrics, "start_counters", lambda *a, real=gpu_metrics.start_counters: real(*a, background=False))
    alone, info_alone = ingest(path)
    assert info.notes == info_alone.notes and info.events == info_alone.events
    for t in ("counters", "kernels", "api_calls", "ranges", "ops", "devices", "syncs", "collectives"):
        q = f"SELECT * FROM {t} ORDER BY rowid"
        assert side.execute(q).fetchall() == alone.execute(q).fetchall(), t


def test_without_room_for_both_the_other_tables_go_in_before_the_gpu_metrics_and_give_the_same_store(
    monkeypatch: pytest.MonkeyPatch, workload
):
    """Where DuckDB has no room for two loads at once (store.room_beside), the kernels, calls and ranges are written
    first and the GPU metrics after them: the same tables and notes as the two at once."""
    path, _, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 60_000)
    order: list[str] = []
    real_start = gpu_metrics.start_counters

    def start(*a, **k):
        order.append("metrics")
        return real_start(*a, **k)

    monkeypatch.setattr(gpu_metrics, "start_counters", start)
    real_rest = events.emit_rest

    def rest(*a, **k):
        order.append("rest")
        return real_rest(*a, **k)

    monkeypatch.setattr(events, "emit_rest", rest)
    runs = {}
    for room in (True, False):
        monkeypatch.setattr(store, "room_beside", lambda con, room=room: room)
        order.clear()
        runs[room] = ingest(path)
        assert order == (["metrics", "rest"] if room else ["rest", "metrics"])
    (side, info), (first, info_first) = runs[True], runs[False]
    assert info.notes == info_first.notes and info.events == info_first.events
    # The same rows; the kernels and ops (numbered in time order) also in the same order. (The runtime calls' INSERT
    # dedupes through a window, whose output order follows DuckDB's threads: not part of the store's contract.)
    for t in ("counters", "kernels", "api_calls", "ranges", "ops", "devices", "syncs", "collectives", "memory_events"):
        q = f"SELECT * FROM {t} ORDER BY ALL"
        assert side.execute(q).fetchall() == first.execute(q).fetchall(), t
    for t in ("kernels", "ops"):
        q = f"SELECT * FROM {t} ORDER BY rowid"
        assert side.execute(q).fetchall() == first.execute(q).fetchall(), t
    assert side.execute("SELECT count(*) FROM counters").fetchone()[0] > 0


def test_gpu_metrics_load_stops_when_the_other_tables_fail(monkeypatch: pytest.MonkeyPatch, workload):
    """An error while the other tables are written (here a BadInput from the NVTX ranges) stops the GPU-metric
    threads before it reaches the caller: no thread of the load is left running."""
    import threading

    from plasmient_report.parsers.nsys import events

    path, _, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 60_000)

    def fail(*a, **k):
        raise BadInput(path, "broken NVTX table")

    monkeypatch.setattr(events, "emit_nvtx", fail)
    with pytest.raises(BadInput, match="broken NVTX table"):
        ingest(path)
    assert not [t for t in threading.enumerate() if t.name.startswith("plasmient-gpu-metrics")]


def test_gpu_metrics_fast_and_careful_reads_agree(monkeypatch: pytest.MonkeyPatch, workload):
    """Each rowid range is read as stored (fast) unless it holds a value of the wrong kind; the careful read
    (typed value by value) gives the same rows."""
    path, con0, _ = workload
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 100_000)
    monkeypatch.setattr(gpu_metrics, "_fast_chunk", lambda *a: None)
    con, _ = ingest(path)
    q = "SELECT metric, count(*), round(sum(value), 6), min(start_ns), max(end_ns) FROM counters GROUP BY 1 ORDER BY 1"
    assert con.execute(q).fetchall() == con0.cursor().execute(q).fetchall()


def test_gpu_metrics_values_of_the_wrong_kind_are_left_out_and_counted(monkeypatch: pytest.MonkeyPatch, tmp_path, workload):
    """Text in `value` for 11 rows and 150% for 5 others: those rows are left out and counted, the rest of
    their range and of the table read as before. Truth: the same export as SQLite stores it."""
    path, con0, _ = workload
    db = tmp_path / "m.sqlite"
    shutil.copyfile(path, db)
    c = sqlite3.connect(db)
    ((pct_metric,),) = c.execute("""SELECT metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName LIKE 'SMs Active%'
                                  LIMIT 1""").fetchall()
    c.execute("UPDATE GPU_METRICS SET value = 'n/a' WHERE rowid BETWEEN 1000 AND 1010")
    ids = [
        r
        for (r,) in c.execute(
            "SELECT rowid FROM GPU_METRICS WHERE metricId = ? AND rowid > 2000 LIMIT 5", [pct_metric]
        ).fetchall()
    ]
    c.execute(f"UPDATE GPU_METRICS SET value = 150 WHERE rowid IN ({', '.join(map(str, ids))})")
    c.commit()
    c.close()
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 100_000)
    con, info = ingest(db)
    n0 = con0.cursor().execute("SELECT count(*) FROM counters").fetchone()[0]
    assert con.execute("SELECT count(*) FROM counters").fetchone()[0] == n0 - 16
    assert any("GPU metrics: 16 samples left out" in n for n in info.notes)
    assert con.execute("SELECT max(value) FROM counters WHERE metric = 'sm_active'").fetchone()[0] <= 1.0


def test_kernel_values_of_the_wrong_kind_read_as_the_typed_read_does(monkeypatch: pytest.MonkeyPatch, tmp_path, workload):
    """An integer table read as stored (the staging's fast path) gives way to the typed read when a value of
    another kind comes, even batches in: a real registersPerThread reads as its integer part (SQLite's CAST), text
    in gridX as unknown (NULL), every other kernel as before. Truth: the export as SQLite stores it, and the typed
    read with the fast path off."""
    path, con0, _ = workload
    db = tmp_path / "k.sqlite"
    shutil.copyfile(path, db)
    c = sqlite3.connect(db)
    ((late, corr),) = c.execute(
        "SELECT rowid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid DESC LIMIT 1"
    ).fetchall()
    c.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET registersPerThread = 37.9, gridX = 'n/a' WHERE rowid = ?", [late])
    c.commit()
    c.close()
    assert sq(db, f"SELECT typeof(registersPerThread), typeof(gridX) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = {late}") == [
        ("real", "text")
    ]
    monkeypatch.setattr(nsys.reader, "BATCH_ROWS", 500)  # the odd value comes batches after the first
    con, _ = ingest(db)
    cols = "name, start_ns, end_ns, device, stream, grid_x, grid_y, block_x, regs, correlation"
    rows = con.execute(f"SELECT {cols} FROM kernels ORDER BY start_ns, correlation").fetchall()
    assert con.execute("SELECT regs, grid_x FROM kernels WHERE correlation = ?", [corr]).fetchall() == [(37, None)]
    monkeypatch.setattr(nsys.reader, "_stage_as_stored", lambda *a, **k: False)
    typed, _ = ingest(db)
    assert rows == typed.execute(f"SELECT {cols} FROM kernels ORDER BY start_ns, correlation").fetchall()
    unchanged = f"SELECT {cols} FROM kernels WHERE correlation IS DISTINCT FROM {corr} ORDER BY start_ns, correlation"
    assert con.execute(unchanged).fetchall() == con0.cursor().execute(unchanged).fetchall()


def test_metric_names():
    assert nsys.metric_name("SMs Active [Throughput %]") == "sm_active"
    assert nsys.metric_name("SM Active") == "sm_active"
    assert nsys.metric_name("Tensor Active / FP16 Active [Throughput %]") == "tensor_active"
    assert nsys.metric_name("DRAM Write Bandwidth [Throughput %]") == "dram_write"
    assert nsys.metric_name("GPC Clock Frequency [MHz]") == "sm_clock_mhz"
    assert nsys.metric_name("GR Active [Throughput %]") == "gr_engine_active"
    assert nsys.metric_name("Compute Warps in Flight [Avg Warps per Cycle]") == "compute_warps_in_flight_avg_warps_per_cycle"


def test_peak_precision_assumed_without_dtypes_is_said(workload):
    _, con, _ = workload
    prec, peaks = metrics.assign_peaks(con.cursor(), load_table(), None, None, None)
    assert prec == "bf16" and peaks[0].peak.flop_s == pytest.approx(989.4e12)
    assert "bf16 assumed" in peaks[0].peak.source
    _, peaks = metrics.assign_peaks(con.cursor(), load_table(), "fp8", None, None)
    assert "assumed" not in peaks[0].peak.source


def test_an_nsys_ingest_does_not_import_polars():
    """polars is for the counter-log parsers only (parsers/_polars.py: ~0.1 s and ~45 MiB resident): reading an nsys
    export through the ADBC driver must not import it (the driver's DB-API module does, when polars is installed).
    In a fresh interpreter, where nothing else has imported it; a committed export whose text columns go through the
    driver (StringIds, NVTX_EVENTS)."""
    sample = Path(__file__).parent.parent / "sample_traces/h200_single/nsys_single.sqlite"
    code = (
        "import sys; from pathlib import Path; from plasmient_report import store; from plasmient_report.parsers import nsys\n"
        f"con = store.connect(); info = nsys.ingest(Path({str(sample)!r}), con, 0)\n"
        "n = con.execute('SELECT count(*) FROM kernels').fetchone()[0]\n"
        "print(n, 'adbc_driver_sqlite' in sys.modules, 'polars' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) > 0 and out[1:] == ["True", "False"]
