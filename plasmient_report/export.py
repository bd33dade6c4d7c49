"""`plasmient-report export RUN --csv DIR` (or `--parquet DIR`): the tables a user puts in a spreadsheet, from a stored
run (an output folder or its run.duckdb), one file per table — per kernel name, per op, per shape, per step, the
collectives, the losses, the findings, the numbers of every window, and the collective / memory / launch tables when
the store has them. Every table is a query over the store's own tables and the measurement library's views and
macros (docs/measurements.md); nothing is recomputed here.

The folder follows the output rules (outdir.py): it must be new, empty, or an earlier export of this tool (then
replaced whole); the files are written into a staging folder and swapped in at once, never half-written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from . import outdir, scratch, sql, store
from .errors import BadInput

FORMATS = ("csv", "parquet")


@dataclass(frozen=True)
class Table:
    """One exported file: its name, what it holds, and its query (None: skipped when `needs` is absent)."""

    name: str
    what: str
    query: str | Callable[[duckdb.DuckDBPyConnection], str | None]
    needs: tuple[str, ...] = ()


def _per_window(macro: str, extra: str = "") -> Callable[[duckdb.DuckDBPyConnection], str | None]:
    """A table macro of the library (kernel_roofline, shape_roofline) over every analysed window, with the window's
    scope and range as the first columns."""

    def query(con: duckdb.DuckDBPyConnection) -> str | None:
        windows = con.execute(
            "SELECT DISTINCT scope, range_name FROM windows ORDER BY scope DESC, range_name NULLS FIRST"
        ).fetchall()
        if not windows:
            return None
        parts = []
        for scope, rn in windows:
            lit = "NULL" if rn is None else "'" + str(rn).replace("'", "''") + "'"
            parts.append(f"SELECT '{scope}' AS scope, {lit} AS range_name, * FROM {macro}('{scope}', {lit}{extra})")
        return " UNION ALL ".join(parts)

    return query


TABLES: tuple[Table, ...] = (
    Table(
        "metrics",
        "utilization, achieved fraction and coverage per analysed window, per GPU and for the run (rank NULL)",
        "SELECT * FROM metrics ORDER BY scope DESC, range_name NULLS FIRST, rank NULLS FIRST, device",
        ("metrics",),
    ),
    Table(
        "metrics_by_precision",
        "the achieved fraction per window, GPU and precision",
        "SELECT * FROM metrics_by_precision ORDER BY scope DESC, range_name NULLS FIRST, rank NULLS FIRST, device, precision",
        ("metrics_by_precision",),
    ),
    Table(
        "losses",
        "the loss waterfall per window, GPU and category (lost peak-time and its share of the window)",
        """SELECT l.scope, l.range_name, l.rank, l.device, l.category, any_value(l.layer) AS layer,
                    sum(l.lost_ns) AS lost_ns, sum(l.lost_ns) / any_value(m.window_ns) AS fraction
             FROM losses l JOIN metrics m ON m.scope = l.scope AND m.range_name IS NOT DISTINCT FROM l.range_name
                              AND m.rank IS NOT DISTINCT FROM l.rank AND m.device IS NOT DISTINCT FROM l.device
             GROUP BY ALL ORDER BY l.scope DESC, l.range_name NULLS FIRST, l.rank, l.device, lost_ns DESC""",
        ("stretches", "metrics"),
    ),
    Table(
        "kernels",
        "per kernel name and window: count, time, FLOPs, bytes, FLOP/s, fraction of peak, intensity, bound (kernel_roofline)",
        _per_window("kernel_roofline", ", 'kernel'"),
        ("kernel_class", "window_kernels"),
    ),
    Table(
        "ops",
        "per op and window: the same (kernel_roofline by op)",
        _per_window("kernel_roofline", ", 'op'"),
        ("kernel_class", "window_kernels"),
    ),
    Table(
        "shapes",
        "per GEMM / attention / convolution shape and window (shape_roofline)",
        _per_window("shape_roofline"),
        ("kernel_shapes",),
    ),
    Table(
        "steps",
        "per step: each occurrence of an analysed range on each GPU over its GPU window",
        "SELECT * FROM steps ORDER BY label, rank, device, occurrence",
        ("steps",),
    ),
    Table(
        "step_losses",
        "each step's loss waterfall",
        "SELECT s.label, s.name, l.rank, l.device, l.occurrence, "
        "l.category, l.layer, l.lost_ns, l.lost_ns / s.gpu_ns AS fraction FROM step_losses l JOIN steps s "
        "USING (label, rank, device, occurrence) ORDER BY l.label, l.rank, l.device, l.occurrence, l.lost_ns DESC",
        ("steps", "step_losses"),
    ),
    Table("step_stats", "per range of steps: mean, median, spread of the GPU step time", "SELECT * FROM step_stats", ("steps",)),
    Table(
        "collectives",
        "per collective instance (one operation seen on several ranks): its lateness and the rank that arrived last",
        "SELECT * FROM collective_instances ORDER BY first_start_ns",
        ("collective_members",),
    ),
    Table(
        "collective_members",
        "per collective operation on a rank: its kernel, duration and wait for its peers",
        "SELECT * FROM collective_members ORDER BY start_ns, rank",
        ("collective_members",),
    ),
    Table(
        "idle_gaps",
        "per idle gap of each window: its span and the host sync that began it",
        "SELECT * FROM idle_gaps ORDER BY scope DESC, range_name NULLS FIRST, rank, device, start_ns",
        ("idle_gaps",),
    ),
    Table(
        "findings",
        "the rules' findings (evidence as JSON)",
        "SELECT * FROM findings ORDER BY lost_fraction DESC NULLS LAST, rule_id",
        ("findings",),
    ),
    Table(
        "sources",
        "the inputs: format, rank, clock offset and how it was found",
        "SELECT * FROM sources ORDER BY source_id",
        ("sources",),
    ),
)
# Library modules whose tables and views are exported as they are, when the store has them (collectives, memory and
# launch statistics; device links).
MODULE_TABLES = ("collective_stats", "memory", "launch_stats", "device_links")
_OBJECT_RE = re.compile(r"COMMENT ON (TABLE|VIEW) ([a-z_][a-z0-9_]*) IS", re.IGNORECASE)


def store_path(run: Path) -> Path:
    """The run.duckdb of RUN (an output folder or the file itself), or BadInput saying what to give."""
    run = Path(run)
    if run.is_dir():
        if (run / "run.duckdb").is_file():
            return run / "run.duckdb"
        raise BadInput(run, "a folder without run.duckdb (export reads the store a run wrote: <out>/run.duckdb)")
    if not run.exists():
        raise BadInput(run, "no such file or directory")
    try:
        with open(run, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise BadInput(run, f"cannot read ({e.strerror})") from None
    if head[8:12] != b"DUCK":
        what = "a JSON file (verdict.json?)" if head.lstrip()[:1] in (b"{", b"[") else "not a DuckDB database"
        raise BadInput(run, f"{what}: export reads the run's store, run.duckdb (or its output folder)")
    return run


def _objects(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {
        n
        for (n,) in con.execute(
            "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    }


def tables(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    """(file stem, what it holds, query) of every table this store can give."""
    have = _objects(con)
    out = []
    for t in TABLES:
        if not all(n in have for n in t.needs):
            continue
        q = t.query(con) if callable(t.query) else t.query
        if q:
            out.append((t.name, t.what, q))
    known = {name for name, _, _ in out}
    mods = sql.modules()
    for m in MODULE_TABLES:
        if m not in mods:
            continue
        for kind, obj in _OBJECT_RE.findall(mods[m].sql):
            if obj in have and obj not in known and not obj.startswith("_"):
                out.append((obj, f"{kind.lower()} {obj} of sql/{m}.sql (docs/measurements.md)", f"SELECT * FROM {obj}"))
                known.add(obj)
    return out


def _copy(con: duckdb.DuckDBPyConnection, query: str, path: Path, fmt: str) -> int:
    target = str(path).replace("'", "''")
    options = "FORMAT csv, HEADER true" if fmt == "csv" else "FORMAT parquet, COMPRESSION zstd"
    rows = con.execute(f"COPY ({query}) TO '{target}' ({options})").fetchall()
    return int(rows[0][0]) if rows and rows[0] and rows[0][0] is not None else 0


def export(run: Path, targets: Sequence[tuple[str, Path]]) -> list[tuple[Path, list[tuple[str, int]]]]:
    """Write every table of RUN's store into each (format, folder) of `targets`; returns per folder the files and
    their row counts. BadInput (one line) for an unusable RUN or folder; nothing is half-written."""
    db = store_path(run)
    checked = []
    for fmt, folder in targets:
        if fmt not in FORMATS:
            raise BadInput(folder, f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
        checked.append((fmt, outdir.check_export_out(folder, [db])))
    if len({p for _, p in checked}) < len(checked):
        raise BadInput(checked[0][1], "--csv and --parquet need two different folders")
    try:
        con = store.open_readonly(db)
    except duckdb.Error as e:
        raise BadInput(db, f"cannot open the store ({str(e).splitlines()[0]})") from None
    results = []
    try:
        todo = tables(con)
        if not todo:
            raise BadInput(db, "holds none of the tables a run writes (is it a plasmient-report store?)")
        with scratch.run():
            for fmt, folder in checked:
                written: list[tuple[str, int]] = []
                with outdir.staged(folder, "export") as tmp:
                    for name, _, query in todo:
                        file = tmp / f"{name}.{fmt}"
                        written.append((file.name, _copy(con, query, file, fmt)))
                    (tmp / "README.md").write_text(_readme(db, fmt, [(f"{n}.{fmt}", w) for n, w, _ in todo]), encoding="utf-8")
                results.append((folder, written))
    except OSError as e:
        raise BadInput(checked[0][1], f"cannot write the export ({e.strerror})") from None
    finally:
        con.close()
    return results


def _readme(db: Path, fmt: str, files: list[tuple[str, str]]) -> str:
    lines = [
        f"# plasmient-report export ({fmt})",
        "",
        f"From `{db}`. Times are in ns (UTC on the run's common clock),",
        "fractions 0–1, rates in FLOP/s and B/s; each column is documented in docs/measurements.md and",
        "docs/schema.md of plasmient-report.",
        "",
        "| file | what |",
        "|---|---|",
    ]
    lines += [f"| `{f}` | {w} |" for f, w in files]
    return "\n".join(lines) + "\n"
