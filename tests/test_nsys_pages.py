"""GPU_METRICS read from the SQLite file's pages (parsers/nsys/_sqlpages.c): the same rows and values as SQLite
itself gives — the truth here is SQLite's own `SELECT ... WHERE rowid BETWEEN` over the same file — on every page
size, record encoding and tree shape, and nothing read (None: the caller reads through the driver, as before)
wherever SQLite's reading could differ. Never a crash on a damaged file."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from plasmient_report import store
from plasmient_report.parsers import nsys
from plasmient_report.parsers.nsys import gpu_metrics, reader

from .conftest import corpus_file

native = reader._native
needs_native = pytest.mark.skipif(native is None, reason="the page reader (_sqlpages.c) is not built")
ALL = (-(2**63), 2**63 - 1)
COLUMNS = "timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER"
Q = 'SELECT "timestamp", "typeId", "metricId", "value" FROM GPU_METRICS WHERE rowid BETWEEN ? AND ? ORDER BY rowid'


def make(path: Path, rows, page_size: int = 4096, schema: str | None = None, ids=None) -> Path:
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA page_size = {page_size}")
    c.execute(
        schema
        or "CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER)"
    )
    cols = "timestamp, typeId, metricId, value"
    if ids is None:
        c.executemany(f"INSERT INTO GPU_METRICS ({cols}) VALUES (?, ?, ?, ?)", rows)
    else:
        c.executemany(
            f"INSERT INTO GPU_METRICS (rowid, {cols}) VALUES (?, ?, ?, ?, ?)", [(i, *r) for i, r in zip(ids, rows, strict=True)]
        )
    c.commit()
    c.close()
    return path


def empty_database(page_size: int, reserved: int) -> bytes:
    """An empty database's one page, written by hand (fileformat2.html §1.3: the header; §1.6: an empty table leaf
    page for sqlite_master): the only way to ask for reserved bytes at the end of each page here (Python's
    sqlite3 has no file control for SQLITE_FCNTL_RESERVE_BYTES); SQLite keeps them in every page it adds."""
    head = bytearray(100)
    head[:16] = b"SQLite format 3\x00"
    head[16:18] = page_size.to_bytes(2, "big")
    head[18:24] = bytes([1, 1, reserved, 64, 32, 32])
    head[24:28] = head[92:96] = (1).to_bytes(4, "big")  # change counter; the size below valid for it
    head[28:32] = (1).to_bytes(4, "big")  # one page
    head[44:48] = (4).to_bytes(4, "big")  # schema format 4
    head[56:60] = (1).to_bytes(4, "big")  # UTF-8
    head[96:100] = (3_037_002).to_bytes(4, "big")
    leaf = bytes([13, 0, 0, 0, 0]) + (page_size - reserved).to_bytes(2, "big") + b"\x00"
    return bytes(head) + leaf + bytes(page_size - 100 - len(leaf))


def truth(path: Path, lo: int, hi: int) -> list[tuple]:
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute(Q, [lo, hi]).fetchall()
    finally:
        c.close()


def pages_of(path: Path):
    ex = nsys.reader.Export(path)
    pages = reader.Pages.open(ex, "GPU_METRICS", gpu_metrics._COLS, gpu_metrics._KINDS)
    return ex, pages


def read(path: Path, lo: int, hi: int):
    ex, pages = pages_of(path)
    try:
        assert pages is not None
        t = pages.read(None if (lo, hi) == ALL else (lo, hi), gpu_metrics._SCHEMA)
        return None if t is None else list(zip(*(t.column(i).to_pylist() for i in range(4)), strict=True))
    finally:
        if pages is not None:
            pages.close()
        ex.close()


def rows_of(n: int, seed: int) -> list[tuple]:
    """Values of every integer width SQLite stores (0 and 1 take no bytes; 1, 2, 3, 4, 6 and 8 bytes), negative ones
    too, and reals in the value column."""
    rng = random.Random(seed)
    widths = [0, 1, 100, -100, 30_000, -30_000, 8_000_000, -8_000_000, 2**31 - 1, -(2**31), 2**47 - 1, -(2**47), 2**62, -(2**63)]
    out = []
    for i in range(n):
        ts = rng.choice(widths) if i % 7 == 0 else rng.randrange(-(2**40), 2**40)
        value: float | int = rng.choice([0, 1, 2**53, -(2**53), 255, 65_535]) if i % 5 == 0 else rng.randrange(0, 101)
        if i % 11 == 0:
            value = rng.uniform(-1e300, 1e300) if i % 22 == 0 else rng.random() * 100
        out.append((ts, rng.choice(widths), rng.randrange(0, 40), value))
    return out


@needs_native
@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_every_encoding_and_range_reads_as_sqlite_reads_it(tmp_path: Path, page_size: int):
    rows = rows_of(20_000, page_size)  # 512-byte pages: a tree three levels deep
    path = make(tmp_path / "gm.sqlite", rows, page_size)
    assert read(path, *ALL) == truth(path, *ALL)
    rng = random.Random(page_size)
    for _ in range(25):
        lo = rng.randrange(-5, 20_010)
        hi = lo + rng.choice([0, 1, 17, 500, 5_000, 40_000])
        assert read(path, lo, hi) == truth(path, lo, hi), (lo, hi)
    assert read(path, 10, 9) == []  # an empty range


@needs_native
def test_sparse_and_negative_rowids_and_reserved_bytes(tmp_path: Path):
    rows = rows_of(3_000, 7)
    rng = random.Random(1)
    ids = sorted({rng.randrange(-(2**62), 2**62) for _ in range(len(rows))})
    rows = rows[: len(ids)]
    path = make(tmp_path / "gm.sqlite", rows, 1024, ids=ids)
    for lo, hi in [ALL, (ids[10], ids[2000]), (ids[10] + 1, ids[2000] - 1), (-(2**63), ids[0]), (ids[-1], 2**63 - 1), (0, 0)]:
        assert read(path, lo, hi) == truth(path, lo, hi)
    # Reserved bytes at each page's end (an encryption or checksum extension's room): the usable size shrinks.
    res = tmp_path / "res.sqlite"
    res.write_bytes(empty_database(1024, reserved=32))
    c = sqlite3.connect(res)
    c.execute("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER)")
    c.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)", rows)
    c.commit()
    c.close()
    assert res.read_bytes()[20] == 32
    assert read(res, *ALL) == truth(res, *ALL)


@needs_native
@pytest.mark.parametrize(
    "case",
    ["text_in_int", "real_in_int", "huge_int_value", "blob", "added_column"],
)
def test_what_sqlite_would_read_otherwise_is_left_to_it(tmp_path: Path, case: str):
    """A chunk holding a value SQLite's CAST would type (text, a blob, a real in an integer column, an integer that
    is no exact double), a payload on overflow pages or a record shorter than the table: None, so that the
    chunk is read through the driver; the chunks around it still read natively."""
    rows = rows_of(2_000, 3)
    path = make(
        tmp_path / "gm.sqlite",
        rows,
        1024,
        schema="CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER, note)",
    )
    c = sqlite3.connect(path)
    set_ = {
        "text_in_int": "typeId = 'gpu'",
        "real_in_int": "timestamp = 1.5",
        "huge_int_value": f"value = {2**53 + 1}",
        "blob": "metricId = x'0102'",
    }
    if case == "added_column":
        c.execute("ALTER TABLE GPU_METRICS RENAME COLUMN value TO old_value")
        c.execute("ALTER TABLE GPU_METRICS ADD COLUMN value INTEGER DEFAULT 7")
        c.execute("UPDATE GPU_METRICS SET value = old_value WHERE rowid <> 1000")
    else:
        c.execute(f"UPDATE GPU_METRICS SET {set_[case]} WHERE rowid = 1000")
    c.commit()
    c.close()
    assert read(path, 990, 1010) is None
    assert read(path, *ALL) is None
    assert read(path, 1, 999) == truth(path, 1, 999)
    assert read(path, 1001, 2000) == truth(path, 1001, 2000)


@needs_native
def test_nulls_read_as_nulls(tmp_path: Path):
    """NULL in any column reads NULL (Arrow's validity), as SQLite gives it; the rows around keep their values."""
    path = make(tmp_path / "gm.sqlite", rows_of(3_000, 4), 1024)
    c = sqlite3.connect(path)
    c.execute("UPDATE GPU_METRICS SET value = NULL WHERE rowid % 7 = 0")
    c.execute("UPDATE GPU_METRICS SET timestamp = NULL, typeId = NULL WHERE rowid IN (1, 1500, 3000)")
    c.commit()
    c.close()
    got = read(path, *ALL)
    assert got == truth(path, *ALL)
    assert sum(r[3] is None for r in got) == 3_000 // 7 and got[0][0] is None and got[1][0] is not None
    assert read(path, 2, 6) == truth(path, 2, 6)  # a range without NULLs


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE GPU_METRICS (timestamp INTEGER PRIMARY KEY, typeId INTEGER, metricId INTEGER, value INTEGER)",
        "CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER, "
        "PRIMARY KEY (timestamp, typeId, metricId)) WITHOUT ROWID",
        "CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, v INTEGER, value AS (v * 2))",
    ],
    ids=["rowid_alias", "without_rowid", "generated"],
)
def test_tables_whose_records_are_not_plain_rows_are_read_by_sqlite(tmp_path: Path, schema: str):
    path = tmp_path / "gm.sqlite"
    c = sqlite3.connect(path)
    c.execute(schema)
    cols = "timestamp, typeId, metricId, v" if "AS (" in schema else "timestamp, typeId, metricId, value"
    c.executemany(f"INSERT INTO GPU_METRICS ({cols}) VALUES (?, ?, ?, ?)", [(i, 0, 1, 50) for i in range(1, 200)])
    c.commit()
    c.close()
    ex, pages = pages_of(path)
    ex.close()
    assert pages is None


def test_a_wal_mode_file_or_one_with_a_journal_beside_it_is_read_by_sqlite(tmp_path: Path):
    wal = make(tmp_path / "wal.sqlite", rows_of(100, 1))
    c = sqlite3.connect(wal)
    c.execute("PRAGMA journal_mode = WAL")
    c.close()
    assert wal.read_bytes()[18:20] == b"\x02\x02"
    ex, pages = pages_of(wal)
    ex.close()
    assert pages is None
    plain = make(tmp_path / "plain.sqlite", rows_of(100, 1))
    (tmp_path / "plain.sqlite-journal").write_bytes(b"\0" * 512)  # not hot (all zero), but not the file alone either
    ex, pages = pages_of(plain)
    ex.close()
    assert pages is None


@needs_native
def test_damaged_files_never_crash_and_never_disagree_with_sqlite(tmp_path: Path):
    """Bytes of the table's pages overwritten at random: the reader gives None or rows; where SQLite reads the range
    without an error, any rows given are SQLite's."""
    good = make(tmp_path / "good.sqlite", rows_of(4_000, 5), 1024)
    data = good.read_bytes()
    ex, pages = pages_of(good)
    assert pages is not None
    root = pages.args[3]
    pages.close()
    ex.close()
    rng = random.Random(11)
    agreed = deferred = 0
    for trial in range(150):
        bad = bytearray(data)
        for _ in range(rng.choice([1, 3, 20])):
            at = rng.randrange((root - 1) * 1024, len(bad))
            bad[at] = rng.randrange(256)
        path = tmp_path / f"bad{trial}.sqlite"
        path.write_bytes(bytes(bad))
        lo = rng.randrange(0, 4_000)
        fd = os.open(path, os.O_RDONLY)
        try:
            got = native.read(fd, 1024, 1024, len(bad) // 1024, root, [1, 2, 3, 4], b"iiif", lo, lo + 1_500)
        finally:
            os.close(fd)
        try:
            want = truth(path, lo, lo + 1_500)
        except sqlite3.DatabaseError:
            continue
        if got is None:
            deferred += 1
            continue
        n, bufs, masks, _ = got
        cols = [np.frombuffer(b, np.int64 if k != "f" else np.float64).tolist() for b, k in zip(bufs, "iiif", strict=True)]
        for col, m in zip(cols, masks, strict=True):
            for i in [] if m is None else np.flatnonzero(np.frombuffer(m, np.uint8) == 0):
                col[i] = None
        assert list(zip(*cols, strict=True)) == [tuple(r) for r in want], trial
        agreed += 1
    assert agreed > 10 and deferred > 0  # both ways were exercised


@needs_native
def test_a_read_holds_sqlite_s_shared_lock(tmp_path: Path):
    """While the pages are read no writer can change them: the read transaction holds SQLite's shared lock."""
    path = make(tmp_path / "gm.sqlite", rows_of(100, 2))
    ex, pages = pages_of(path)
    assert pages is not None
    w = sqlite3.connect(path, timeout=0.05)
    w.execute("INSERT INTO GPU_METRICS (timestamp, typeId, metricId, value) VALUES (1, 0, 1, 2)")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        w.commit()
    pages.close()
    w.commit()
    w.close()
    ex.close()


@pytest.mark.parametrize(
    "path,rows",
    [
        pytest.param("h200-single-nsys/nsys_workload.sqlite", 400_000, marks=pytest.mark.corpus, id="corpus"),
        pytest.param(Path(__file__).parent.parent / "sample_traces/h200_hf/llama_nsys.sqlite", 90_000, id="sample"),
    ],
)
@needs_native
def test_real_exports_ingest_the_same_counters_read_either_way(monkeypatch: pytest.MonkeyPatch, path, rows: int):
    """Real exports' GPU_METRICS rows (the H200 corpus export's 448,602; a committed sample's) into `counters` through
    the page reader and through the driver alone: the same table, row for row in the same order (several chunks,
    two at a time)."""
    path = path if isinstance(path, Path) else corpus_file(path)
    monkeypatch.setattr(gpu_metrics, "COUNTER_CHUNK_ROWS", 20_000)
    tables = []
    for page_reader in (native, None):
        monkeypatch.setattr(reader, "_native", page_reader)
        con = store.connect()
        nsys.ingest(path, con, 0)
        tables.append(con.execute("SELECT * FROM counters").fetchall())
        con.close()
    assert len(tables[0]) > rows
    assert tables[0] == tables[1]


def read_as(path: Path, table: str, columns: list[str], kinds: str):
    ex = nsys.reader.Export(path)
    pages = reader.Pages.open(ex, table, columns, kinds)
    try:
        assert pages is not None
        types = {"i": reader.pa.int64(), "f": reader.pa.float64(), "s": reader.pa.large_string(), "b": reader.pa.large_binary()}
        t = pages.read(None, reader.pa.schema([(f"c{i}", types[k]) for i, k in enumerate(kinds)]))
        return None if t is None else list(zip(*(t.column(i).to_pylist() for i in range(len(kinds))), strict=True))
    finally:
        if pages is not None:
            pages.close()
        ex.close()


@needs_native
@pytest.mark.parametrize("page_size", [512, 4096])
def test_payloads_on_overflow_pages_are_gathered(tmp_path: Path, page_size: int):
    """Rows longer than a page keep the rest of their payload on a chain of overflow pages: read whole, as SQLite
    reads them (its own SELECT the truth), text and blobs of every length from empty to 40 pages."""
    rng = random.Random(page_size)
    path = tmp_path / "t.sqlite"
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA page_size = {page_size}")
    c.execute("CREATE TABLE T (a INTEGER, note TEXT, b INTEGER, raw BLOB)")
    rows = []
    for i in range(600):
        n = rng.choice([0, 1, 100, page_size - 40, page_size - 30, page_size, 3 * page_size, 40 * page_size]) + rng.randrange(5)
        text = "".join(rng.choice("abcé中😀") for _ in range(n // 3))
        rows.append((i, text, -i, rng.randbytes(rng.choice([0, n]))))
    c.executemany("INSERT INTO T VALUES (?, ?, ?, ?)", rows)
    c.commit()
    c.close()
    assert read_as(path, "T", ["a", "note", "b", "raw"], "isib") == rows


@needs_native
def test_text_and_blob_columns_read_as_the_typed_read_gives_them(tmp_path: Path):
    """Text as stored (UTF-8; invalid bytes replaced, as the driver's read does), a blob in a text column as its
    bytes (CAST AS TEXT), text in a blob column as its bytes (CAST AS BLOB), a number in a blob column NULL (the
    typed read's CASE), NULLs; a number in a text column is left to SQLite (its formatting)."""
    path = tmp_path / "t.sqlite"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE T (s, b)")  # (no affinity: values stay of the kind inserted)
    c.executemany(
        "INSERT INTO T VALUES (?, ?)",
        [
            ("aten::mm, seq = 1", b"\x00\x01"),
            ("", b""),
            (None, None),
            ("ü €", "text in a blob column"),
            (b"raw", 5),
            (b"bad \xff\xfe", 2.5),
        ],
    )
    c.execute("UPDATE T SET s = CAST(s AS TEXT) WHERE s = x'62616420fffe'")  # invalid UTF-8 stored as text
    c.commit()
    c.close()
    got = read_as(path, "T", ["s", "b"], "sb")
    ex = nsys.reader.Export(path)  # the typed read through the driver, which the pages replace
    try:
        cur, rdr = ex.scan("T", [nsys.reader.c("s", typ="s"), nsys.reader.c("b", typ="b")])
        typed = rdr.read_all()
        cur.close()
    finally:
        ex.close()
    typed = typed.filter(reader.pa.compute.equal(typed.column("_s"), 1))
    assert got == list(zip(typed.column("s").to_pylist(), typed.column("b").to_pylist(), strict=True))
    assert got == [
        ("aten::mm, seq = 1", b"\x00\x01"),
        ("", b""),
        (None, None),
        ("ü €", b"text in a blob column"),
        ("raw", None),
        ("bad \ufffd\ufffd", None),
    ]
    c = sqlite3.connect(path)
    c.execute("INSERT INTO T VALUES (12, NULL)")
    c.commit()
    c.close()
    assert read_as(path, "T", ["s", "b"], "sb") is None


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("h200-single-nsys/nsys_workload.sqlite", marks=pytest.mark.corpus, id="corpus"),
        pytest.param(Path(__file__).parent.parent / "sample_traces/h200_hf/llama_nsys.sqlite", id="sample"),
    ],
)
@needs_native
def test_every_staging_table_is_the_same_read_from_pages_or_through_the_driver(monkeypatch: pytest.MonkeyPatch, path):
    """The staging tables of real exports (kernels, runtime calls, NVTX with their text and domains, strings, …)
    filled from the pages — whole, and a range of 1,000 rows at a time — and through the driver alone: the same
    rows in the same order."""
    path = path if isinstance(path, Path) else corpus_file(path)
    staged = []
    for page_reader, chunk in ((native, reader.STAGE_CHUNK_ROWS), (native, 1_000), (None, 0)):
        monkeypatch.setattr(reader, "_native", page_reader)
        monkeypatch.setattr(reader, "STAGE_CHUNK_ROWS", chunk)
        con = store.connect()
        ex = nsys.reader.Export(path)
        try:
            nsys.events.stage_all(con, ex)
        finally:
            ex.close()
        names = [
            t
            for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '_ns_%' ORDER BY 1").fetchall()
        ]
        staged.append({t: con.execute(f"SELECT * FROM {t}").fetchall() for t in names})
        con.close()
    assert staged[0].keys() == staged[2].keys() and len(staged[0]) >= 10
    assert sum(len(v) for v in staged[0].values()) > 10_000
    assert staged[0] == staged[2]
    assert staged[1] == staged[2]
