"""Nsight Systems Arrow-family exports (parquetdir, arrowdir, arrow stream), NCCL's NVTX payloads and OS runtime
calls. Truth: the `.sqlite` export of the same report (the committed exports were made from the committed
`.nsys-rep` files, sample_traces/README.md), DDP's own bucket sizes in h200x2_ddp/ground_truth.json, and the
exports themselves read with sqlite3 / pyarrow here."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from plasmient_report import pipeline, store
from plasmient_report.errors import BadInput
from plasmient_report.parsers import detect, discover, nsys, nsys_rep

from .conftest import corpus_file, sample_file

DDP_SQLITE = "h200x2_ddp/nsys/nsys_ddp.sqlite"
DDP_EXPORTS = ("h200x2_ddp/nsys/nsys_ddp_pqtdir", "h200x2_ddp/nsys/nsys_ddp_arwdir", "h200x2_ddp/nsys/nsys_ddp.arrows")
# Every store row an nsys export fills (payload columns aside: the SQLite export has no blobs).
TABLES = {
    "kernels": "*",
    "ops": "*",
    "syncs": "*",
    "devices": "*",
    "ranges": "*",
    "api_calls": "*",
    "collectives": "source_id, rank, device, stream, kernel_correlation, start_ns, end_ns, collective, dtype",
}


def _rows(path: Path) -> tuple[dict[str, list[tuple]], nsys.NsysSource]:
    con = store.connect()
    info = nsys.ingest(path, con, 0)
    out = {t: sorted(con.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in TABLES.items()}
    con.close()
    return out, info


def test_exports_are_detected_from_content():
    assert detect(sample_file("h200x2_ddp/nsys/nsys_ddp_pqtdir")) == "nsys-parquetdir"
    assert detect(sample_file("h200x2_ddp/nsys/nsys_ddp_arwdir")) == "nsys-arrow"
    assert detect(sample_file("h200x2_ddp/nsys/nsys_ddp.arrows")) == "nsys-arrow"
    assert detect(sample_file("h200_single/nsys_single_pqtdir")) == "nsys-parquetdir"
    assert detect(sample_file("h200x2_ddp")) is None  # a folder that is no export
    assert detect(sample_file("h200x2_ddp/nsys/nsys_ddp_arwdir/StringIds.arrow")) is None  # one table of one


@pytest.mark.parametrize("export", DDP_EXPORTS)
def test_every_export_fills_the_same_store_as_the_sqlite(export: str):
    """Same report, other container: every row of every table equal (times to the ns, names, ids, ranks)."""
    ref, ref_info = _rows(sample_file(DDP_SQLITE))
    got, info = _rows(sample_file(export))
    assert info.format == ("nsys-parquetdir" if "pqtdir" in export else "nsys-arrow")
    assert info.format_version == "nsys 2025.3.2.0 (schema 3.20.3)"
    assert (info.multi_rank, info.world_size, info.base_time_ns) == (True, 2, ref_info.base_time_ns)
    for table in TABLES:
        assert got[table] == ref[table], table
    assert len(got["kernels"]) == 1480 and len(got["collectives"]) == 86


def test_parquetdir_gives_the_same_verdict_as_the_sqlite():
    """The whole pipeline on the single-GPU report: kernels, kernel time, per-range utilization and achieved
    fraction equal (the exports differ only in their container)."""
    a = pipeline.analyse([sample_file("h200_single/nsys_single.sqlite")], pipeline.Options())
    b = pipeline.analyse([sample_file("h200_single/nsys_single_pqtdir")], pipeline.Options())
    q = "SELECT count(*), sum(end_ns - start_ns) FROM kernels"
    assert a.con.execute(q).fetchone() == b.con.execute(q).fetchone() == (1821, a.con.execute(q).fetchone()[1])
    va, vb = a.verdict, b.verdict
    assert vb["utilization"]["trace"] == va["utilization"]["trace"]
    assert vb["achieved_fraction_of_peak"] == va["achieved_fraction_of_peak"]
    ranges_a = {r["name"]: (r["utilization"], r["achieved_fraction_of_peak"], r["window_ns"]) for r in va["ranges"]}
    ranges_b = {r["name"]: (r["utilization"], r["achieved_fraction_of_peak"], r["window_ns"]) for r in vb["ranges"]}
    assert ranges_a == ranges_b and "phase:compute_bound" in ranges_a


def test_nccl_payloads_give_message_sizes_and_communicators():
    """Exported with --include-blobs: every NCCL kernel gets its call's payload. DDP's buckets (ground truth):
    one 128 MiB bucket in the first step, then four rebuilt 32 MiB buckets per step."""
    path = sample_file("h200x2_ddp/nsys/nsys_ddp_pqtdir")
    con = store.connect()
    info = nsys.ingest(path, con, 0)
    assert "NCCL NVTX payloads: message size and communicator of 86 of 86 collectives" in info.notes
    sizes = dict(
        con.execute("""SELECT bytes, count(*) FROM collectives WHERE rank = 0 AND collective = 'allreduce'
                                AND dtype = 'bf16' GROUP BY 1""").fetchall()
    )
    truth = json.loads(sample_file("h200x2_ddp/ground_truth.json").read_text())["ddp_bucket_sizes"]
    assert int(truth["bucket_sizes"]) in sizes and {int(b) for b in truth["rebuilt_bucket_sizes"].split(",")} <= set(sizes)
    assert sizes == {134217728: 1, 33554432: 32}
    # One communicator of both ranks (its id as NCCL hashes it, the same on both), ranks in communicator order.
    assert con.execute("SELECT DISTINCT process_group, group_ranks, group_size FROM collectives").fetchall() == [
        ("nccl:bac26100af4eeb9a", "[0, 1]", 2)
    ]
    # The same operation on both ranks moves the same bytes (pairs on collective + seq).
    assert con.execute("""SELECT count(*) FROM collectives a JOIN collectives b ON a.collective = b.collective
                          AND a.seq = b.seq AND a.rank = 0 AND b.rank = 1 WHERE a.bytes <> b.bytes""").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM collectives WHERE peer IS NOT NULL").fetchone() == (0,)  # no send/recv


def test_nccl_payloads_from_a_sqlite_export_with_blobs(tmp_path: Path):
    """The same blobs in a SQLite export (--include-blobs true writes them to NVTX_EVENTS.binaryData): copied
    here from the parquetdir into the committed SQLite export of the same report."""
    db = tmp_path / "nsys_ddp.sqlite"
    shutil.copy(sample_file(DDP_SQLITE), db)
    blobs = pq.read_table(
        sample_file("h200x2_ddp/nsys/nsys_ddp_pqtdir") / "NVTX_EVENTS.parquet", columns=["start", "globalTid", "binaryData"]
    )
    rows = [
        (bytes(b.as_py()), s.as_py(), g.as_py())
        for s, g, b in zip(blobs["start"], blobs["globalTid"], blobs["binaryData"].cast("large_binary"), strict=True)
        if b.is_valid
    ]
    con = sqlite3.connect(db)
    con.executemany("UPDATE NVTX_EVENTS SET binaryData = ? WHERE start = ? AND globalTid = ?", rows)
    con.commit()
    con.close()
    assert len(rows) == 92
    s = store.connect()
    info = nsys.ingest(db, s, 0)
    assert "NCCL NVTX payloads: message size and communicator of 86 of 86 collectives" in info.notes
    ref = store.connect()
    nsys.ingest(sample_file("h200x2_ddp/nsys/nsys_ddp_pqtdir"), ref, 0)
    q = "SELECT * FROM collectives ORDER BY rank, start_ns"
    assert s.execute(q).fetchall() == ref.execute(q).fetchall()
    assert s.execute("SELECT count(bytes), count(DISTINCT process_group) FROM collectives").fetchone() == (86, 1)


def test_without_blobs_the_notes_say_how_to_get_payloads():
    con = store.connect()
    info = nsys.ingest(sample_file(DDP_SQLITE), con, 0)
    assert any("--include-blobs true" in n for n in info.notes)
    assert con.execute("SELECT count(bytes), count(process_group) FROM collectives").fetchone() == (0, 0)


def test_os_runtime_calls_are_api_calls_of_kind_osrt():
    """cloverleaf was recorded with --trace=osrt: its top-level OS calls inside the CUDA span of the process."""
    path = corpus_file("public-nsys-pipit-cloverleaf/perlmutter-cloverleaf-cuda.sqlite")
    con = store.connect()
    nsys.ingest(path, con, 0)
    n, lo, hi = con.execute("SELECT count(*), min(start_ns), max(end_ns) FROM api_calls WHERE kind = 'osrt'").fetchone()
    cuda = con.execute("SELECT min(start_ns), max(end_ns) FROM api_calls WHERE kind <> 'osrt'").fetchone()
    assert n == 1154 and lo >= cuda[0] and hi <= cuda[1]
    top = dict(con.execute("SELECT name, count(*) FROM api_calls WHERE kind = 'osrt' GROUP BY 1").fetchall())
    assert top["poll"] == 17 and top["write"] == 133 and "cudaLaunchKernel" not in top


def test_report_uses_a_newer_sibling_parquetdir(tmp_path: Path):
    rep = tmp_path / "nsys_single.nsys-rep"
    shutil.copy(sample_file("h200_single/nsys_single.nsys-rep"), rep)
    pqt = tmp_path / "nsys_single_pqtdir"
    shutil.copytree(sample_file("h200_single/nsys_single_pqtdir"), pqt)
    t = rep.stat().st_mtime
    os.utime(pqt, (t - 10, t - 10))  # older than the report: not used (no nsys here to export it)
    with pytest.raises(BadInput, match="nsys export --type sqlite"):
        nsys_rep.resolve(rep, tmp_path / "cache")
    os.utime(pqt, (t + 10, t + 10))
    assert nsys_rep.resolve(rep, tmp_path / "cache") == pqt
    assert discover([rep]) == discover([pqt]) and discover([rep])[0].format == "nsys-parquetdir"


def test_a_folder_of_several_exports_of_one_report_is_read_once(tmp_path: Path):
    """A folder holding a report and its exports (`x.nsys-rep`, `x.sqlite`, `x_pqtdir`, `x.arrows`): one input,
    the SQLite one; the parquetdir's tables are not walked into as inputs."""
    found = discover([sample_file("h200x2_ddp/nsys")])
    assert [(d.path.name, d.format) for d in found] == [("nsys_ddp.sqlite", "nsys-sqlite")]
    only = tmp_path / "run"
    shutil.copytree(sample_file("h200_single/nsys_single_pqtdir"), only / "nsys_single_pqtdir")
    assert [(d.path.name, d.format) for d in discover([only])] == [("nsys_single_pqtdir", "nsys-parquetdir")]
    with pytest.raises(BadInput, match="one table of an nsys export"):
        discover([sample_file("h200_single/nsys_single_pqtdir/StringIds.parquet")])


def test_a_folder_of_unreadable_parquet_is_bad_input(tmp_path: Path):
    bad = tmp_path / "x_pqtdir"
    bad.mkdir()
    (bad / "StringIds.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(BadInput):
        nsys.ingest(bad, store.connect(), 0)


def test_gpu_metrics_of_a_parquetdir_equal_the_sqlite(tmp_path: Path):
    """The GPU_METRICS stream of an Arrow-family export is read once per batch (a stream can be read only once):
    the same counters as the SQLite export. No committed parquetdir has GPU metrics, so the real H200 llama export
    (10 kHz metrics) is written table by table as the parquetdir nsys would write (same tables, same columns)."""
    import pyarrow as pa

    src = sample_file("h200_hf/llama_nsys.sqlite")
    folder = tmp_path / "llama_pqtdir"
    folder.mkdir()
    db = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        cur = db.execute(f'SELECT * FROM "{name}"')
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
        if not rows:
            continue
        pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}), folder / f"{name}.parquet")
    db.close()
    counters = "SELECT rank, device, gpu_uuid, metric, start_ns, end_ns, value FROM counters ORDER BY ALL"
    con = store.connect()
    nsys.ingest(src, con, 0)
    ref = con.execute(counters).fetchall()
    con.close()
    con = store.connect()
    nsys.ingest(folder, con, 0)
    got = con.execute(counters).fetchall()
    con.close()
    # every sample of the export but those timed before the capture start (22 here) is a counter row
    ((n,),) = (
        sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        .execute("SELECT count(*) FROM GPU_METRICS WHERE timestamp >= 0")
        .fetchall()
    )
    assert len(ref) == n == 93896
    assert got == ref
