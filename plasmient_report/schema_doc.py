"""docs/schema.md, generated from the store's own comments: the `COMMENT ON TABLE / COLUMN` statements of schema.sql
(which every run.duckdb carries: `SELECT * FROM duckdb_columns()`), read back from a fresh store, and the `losses`
view's comments from the measurement library. `python -m plasmient_report.schema_doc > docs/schema.md` writes it;
tests/test_schema_doc.py fails when the page and the store drift.
"""

from __future__ import annotations

import duckdb

from . import sql, store

INTRO = """\
# The store (`run.duckdb`) — a public interface

Generated from the store's own comments (the `COMMENT ON` statements of `plasmient_report/schema.sql`) by
`python -m plasmient_report.schema_doc > docs/schema.md`; `tests/test_schema_doc.py` fails when this page and the
store drift. Every `run.duckdb` carries the same comments:
`SELECT table_name, column_name, comment FROM duckdb_columns()`.

Every parser fills these tables; alignment, metrics, rules and renderers read only them. Query a stored run with

```
plasmient-report query plasmient-out/<name>/run.duckdb \\
  "SELECT name, count(*), sum(end_ns - start_ns) / 1e6 AS ms FROM kernels GROUP BY name ORDER BY ms DESC LIMIT 10"
```

Conventions: all `*_ns` columns are **int64 UTC epoch nanoseconds** after alignment (SPEC §3), on the one clock of
the `clock` table; `raw_start` keeps the source's own time (Kineto: µs as written; nsys: ns since capture start).
`rank` is the job rank of the source (see `sources.rank_method`); `device` the CUDA device ordinal as the process
saw it. The measure stage adds the measurement library's tables, views and macros (`kernel_launch`,
`kernel_class`, `collective_members`, `range_occurrences`, `stretches`, `idle_gaps`, `metrics_by_precision`,
`kernel_roofline(…)`, …), documented column by column in [measurements.md](measurements.md), which is generated
from their own comments; `losses` (SPEC §2) is one of them, repeated at the end of this page.
"""

# SPEC §2 objects that live in the measurement library, not in schema.sql.
LIBRARY_OBJECTS = ("losses",)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _heading(table: str, comment: str) -> tuple[str, str]:
    """A table comment's first sentence (the heading) and the rest (a paragraph under the columns)."""
    first, sep, rest = comment.partition(". ")
    first = first.rstrip(".")
    rest = rest.strip()
    if rest and not rest.endswith("."):
        rest += "."
    return f"## {table} — {first[:1].lower()}{first[1:]}", rest if sep else ""


def _store_sections(con: duckdb.DuckDBPyConnection) -> list[str]:
    lines: list[str] = []
    tables = con.execute("""SELECT table_name, comment FROM duckdb_tables()
                            WHERE schema_name = 'main' AND NOT temporary ORDER BY table_oid""").fetchall()
    for table, comment in tables:
        head, rest = _heading(table, comment or "")
        lines += [head, "", "| column | type | meaning |", "|---|---|---|"]
        cols = con.execute(
            """SELECT column_name, data_type, comment FROM duckdb_columns()
                              WHERE schema_name = 'main' AND table_name = ? ORDER BY column_index""",
            [table],
        ).fetchall()
        lines += [f"| {c} | {t} | {_cell(m or '')} |" for c, t, m in cols]
        lines.append("")
        if rest:
            lines += [rest, ""]
    return lines


def _library_sections() -> list[str]:
    lines: list[str] = []
    for name in LIBRARY_OBJECTS:
        found = sql.comments(name)
        head = next((c for kind, obj, c in found if obj == name and kind != "COLUMN"), "")
        cols = [(obj.split(".", 1)[1], c) for kind, obj, c in found if kind == "COLUMN" and obj.startswith(f"{name}.")]
        title, rest = _heading(name, head)
        lines += [
            f"{title} (a view of the measurement library: [measurements.md](measurements.md#{name}))",
            "",
            sql.modules()[name].doc,
            "",
            "| column | meaning |",
            "|---|---|",
        ]
        lines += [f"| {c} | {_cell(m)} |" for c, m in cols]
        lines.append("")
        if rest:
            lines += [rest, ""]
    return lines


def render() -> str:
    """docs/schema.md: every table of a fresh store and every column, with its type and its comment."""
    con = store.connect()
    try:
        lines = [INTRO, *_store_sections(con), *_library_sections()]
    finally:
        con.close()
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
