"""The measurement library: the measure stage's concepts as SQL over the store, one module per concept, in the way
of Perfetto's trace-processor standard library. Each module is a `.sql` file in this package with a header —

    -- Module: kernel_class
    -- Depends: kernel_launch, device_peaks, comm_kernels
    -- One class per GPU activity: …            (the module's job, until the first blank line)

— and creates views, tables or macros whose every column carries a `COMMENT ON`. `{{NAME}}` placeholders are the
constants of `plasmient_report.vocab` as SQL literals (the patterns live there, once), and a few CASE lists generated
from its tables (`vocab.sql` turns them into macros: `kernel_name_precision(name)`, `dtype_precision(type)`,
`category_layer(category)`, `is_communication_kernel(kind, name)`).

A module that creates a table computes it from the store when installed: the measure stage installs them in order,
after the rows they read are final (`install`). Views and macros can be installed at any time; a module of only
those (`DEFINITIONS`) is run once per store however often it is asked for. `docs()` renders
the library's own comments as `docs/measurements.md` (a test fails when the two drift). A block marked
`-- native: NAME {` … `-- }` is computed by `native.NATIVE[NAME]` instead (the same rows, in numpy), unless inside
`reference()`, which runs every module's SQL as written.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from importlib import resources

import duckdb

from .. import store, vocab

_HEADER_RE = re.compile(r"^--\s*(Module|Depends):\s*(.*)$")
_PLACEHOLDER_RE = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")
_NATIVE_RE = re.compile(r"^-- native: ([a-z_][a-z0-9_]*) \{\n(.*?)^-- \}\n", re.MULTILINE | re.DOTALL)
_reference: ContextVar[bool] = ContextVar("plasmient_sql_reference", default=False)
_deferred: ContextVar[list[str] | None] = ContextVar("plasmient_sql_deferred_comments", default=None)
# The modules that only define macros and views (nothing computed from the store's rows: installed again they change
# nothing). Each step of the measure stage installs the ones it uses, so a run asked for the vocabulary three times
# (~17 ms each on the 2 MiB sample); `install` runs such a module once per database of a connection and its cursors
# (`store.installed`), unless inside a caller's transaction (which may roll the definitions back).
# tests/test_measure_library.py checks that these define only macros and views and that every other module does more.
DEFINITIONS = frozenset({"vocab", "intervals", "rank_span", "collective_key", "kernel_roofline", "losses", "program"})
_COMMENT_STMT_RE = re.compile(
    r"^COMMENT ON (?:TABLE|VIEW|COLUMN|MACRO TABLE|MACRO) [a-z_][a-z0-9_.]* IS '(?:[^']|'')*';[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)
_COMMENT_RE = re.compile(
    r"COMMENT ON (TABLE|VIEW|COLUMN|MACRO TABLE|MACRO) ([a-z_][a-z0-9_.]*) IS '((?:[^']|'')*)'", re.IGNORECASE
)


@dataclass(frozen=True)
class Module:
    name: str
    depends: tuple[str, ...]
    doc: str
    sql: str


def _parse(name: str, text: str) -> Module:
    depends: tuple[str, ...] = ()
    doc_lines: list[str] = []
    mod_name = None
    in_header = True
    for line in text.splitlines():
        if not in_header:
            break
        m = _HEADER_RE.match(line)
        if m:
            if m.group(1) == "Module":
                mod_name = m.group(2).strip()
            else:
                depends = tuple(d.strip() for d in m.group(2).split(",") if d.strip())
        elif line.startswith("--"):
            doc_lines.append(line[2:].strip())
        else:
            in_header = False
    if mod_name != name:
        raise ValueError(f"sql/{name}.sql: header names module {mod_name!r}")
    return Module(name, depends, " ".join(doc_lines).strip(), text)


@cache
def modules() -> dict[str, Module]:
    """Every module of the library by name (the package's .sql files)."""
    out: dict[str, Module] = {}
    for f in sorted(resources.files(__package__).iterdir(), key=lambda p: p.name):
        if f.name.endswith(".sql"):
            name = f.name[:-4]
            out[name] = _parse(name, f.read_text(encoding="utf-8"))
    for m in out.values():
        for d in m.depends:
            if d not in out:
                raise ValueError(f"sql/{m.name}.sql depends on unknown module {d!r}")
    return out


def order(names: list[str] | tuple[str, ...]) -> list[str]:
    """The modules `names` and their dependencies, dependencies first."""
    mods = modules()
    seen: list[str] = []

    def visit(n: str, stack: tuple[str, ...]) -> None:
        if n in stack:
            raise ValueError(f"sql: dependency cycle {' → '.join((*stack, n))}")
        if n in seen:
            return
        for d in mods[n].depends:
            visit(d, (*stack, n))
        seen.append(n)

    for n in names:
        visit(n, ())
    return seen


def _constants() -> dict[str, str]:
    """The placeholders: vocab's constants as SQL literals, and CASE lists generated from its tables."""
    consts = vocab.sql_constants()
    consts["PRECISION_HINT_CASES"] = " ".join(f"WHEN regexp_matches(n, '{rx}') THEN '{p}'" for p, rx in vocab.PRECISION_HINTS)
    consts["DTYPE_PRECISION_CASES"] = " ".join(f"WHEN '{t}' THEN '{p}'" for t, p in vocab.DTYPE_PRECISION.items())
    consts["CATEGORY_LAYER_CASES"] = " ".join(f"WHEN '{c}' THEN '{layer}'" for c, layer in vocab.CATEGORIES.items())
    return consts


def render(name: str) -> str:
    """A module's SQL with the vocabulary's placeholders filled in."""
    return fill(modules()[name].sql, f"sql/{name}.sql")


def fill(text: str, where: str = "SQL") -> str:
    """`text` with the vocabulary's placeholders filled in (`where` names it in the error for an unknown one)."""
    consts = _constants()

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in consts:
            raise ValueError(f"{where}: unknown placeholder {{{{{m.group(1)}}}}}")
        return consts[m.group(1)]

    return _PLACEHOLDER_RE.sub(sub, text)


@contextlib.contextmanager
def reference() -> Iterator[None]:
    """Inside, `install` runs native blocks as their SQL: the definition the native code is checked against."""
    token = _reference.set(True)
    try:
        yield
    finally:
        _reference.reset(token)


def install(con: duckdb.DuckDBPyConnection, *names: str, with_dependencies: bool = False) -> None:
    """Run the modules `names` (tables are computed now, from the store as it is). With `with_dependencies`, their
    dependencies first (for views and macros; the measure stage computes tables in its own order)."""
    for n in order(names) if with_dependencies else names:
        key = _definitions_key(con, n)
        if key is not None and key in store.installed(con):
            continue
        text = render(n)
        # The comments go last, in one transaction: on the file store every statement otherwise commits on its
        # own, and the library's ~450 COMMENT ONs cost ~1 ms each that way. (The module's tables are not put in
        # one transaction: what it drops would then stay in memory until the commit, ~75 MiB on a large trace.)
        comments = "\n".join(m.group(0) for m in _COMMENT_STMT_RE.finditer(text))
        text = _COMMENT_STMT_RE.sub("", text)
        if _reference.get() or "-- native: " not in text:
            _execute(con, text)
        else:
            from .native import NATIVE

            at = 0
            for m in _NATIVE_RE.finditer(text):
                _execute(con, text[at : m.start()])
                NATIVE[m.group(1)](con, m.group(2))  # (under a memory budget: in slices, or its SQL, which spills)
                at = m.end()
            _execute(con, text[at:])
        if comments:
            pending = _deferred.get()
            if pending is not None:
                pending.append(comments)  # (list.append: one step under the GIL, from any thread)
            else:
                with _transaction(con):
                    con.execute(comments)
        if key is not None and not store.in_transaction(con):  # (a caller's transaction may yet roll it back)
            store.installed(con).add(key)


def _definitions_key(con: duckdb.DuckDBPyConnection, name: str) -> tuple[str, str] | None:
    """(the connection's database, `name`) for a module of DEFINITIONS, else None: install it whatever was before.
    Installed once outside any transaction, the module is there for good; one installed inside a caller's
    transaction is not recorded (`install`)."""
    if name not in DEFINITIONS:
        return None
    row = store.one(con, "SELECT current_database()")
    return (str(row[0]), name) if row else None


@contextlib.contextmanager
def deferred_comments() -> Iterator[list[str]]:
    """Inside, `install` keeps its modules' `COMMENT ON` statements in the list it yields (one text per module, in
    order), for `apply_comments` to run later, instead of running them at once. Nothing reads the comments while a
    run analyses; its store gets them when it is finished, on a cursor beside report.html's drawing: the library's
    ~450 comments (each alters its object's catalog entry) cost ~0.09 s of a small trace's run on its critical
    path (benchmarks/README.md, session 37)."""
    pending: list[str] = []
    token = _deferred.set(pending)
    try:
        yield pending
    finally:
        _deferred.reset(token)


def apply_comments(con: duckdb.DuckDBPyConnection, pending: list[str]) -> None:
    """Run the comments `deferred_comments` kept, in one transaction, and empty the list (left as it is when they
    fail: a later call tries again, and raises). Comments on objects gone by now (dropped) are skipped: then each
    statement goes in on its own."""
    texts = list(pending)
    if not texts:
        return
    try:
        with _transaction(con):
            con.execute("\n".join(texts))
    except duckdb.CatalogException:
        for text in texts:
            for m in _COMMENT_STMT_RE.finditer(text):
                with contextlib.suppress(duckdb.CatalogException), _transaction(con):
                    con.execute(m.group(0))
    del pending[: len(texts)]


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """One transaction (unless the caller holds one, which then commits)."""
    try:
        con.execute("BEGIN TRANSACTION")
    except duckdb.TransactionException:
        yield
        return
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _execute(con: duckdb.DuckDBPyConnection, text: str) -> None:
    """SQL text around a native block, unless it is only comments."""
    if any(line.strip() and not line.lstrip().startswith("--") for line in text.splitlines()):
        con.execute(text)


def comments(name: str) -> list[tuple[str, str, str]]:
    """A module's `COMMENT ON` statements as (kind, object, comment): kind TABLE, VIEW, COLUMN, MACRO or MACRO TABLE;
    a column's object is `table.column`."""
    return [(kind.upper(), obj, comment.replace("''", "'")) for kind, obj, comment in _COMMENT_RE.findall(render(name))]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def docs() -> str:
    """docs/measurements.md: every module, its job, its dependencies and the comment of every object and column."""
    lines = [
        "# The measurement library (`plasmient_report/sql/`)",
        "",
        "Generated from the modules' own comments by `python -m plasmient_report.sql > docs/measurements.md`;",
        "`tests/test_measure_library.py` fails when this page and the modules drift. Every object below lives in",
        '`run.duckdb` beside the tables of `docs/schema.md`: `plasmient-report query run.duckdb "SELECT …"`.',
        "",
    ]
    for name in order(list(modules())):
        m = modules()[name]
        lines += [f"## {name}", "", m.doc, ""]
        if m.depends:
            lines += [f"Depends on: {', '.join(m.depends)}.", ""]
        text = render(name)
        objects: dict[str, list[tuple[str, str]]] = {}
        heads: dict[str, tuple[str, str]] = {}
        for kind, obj, comment in _COMMENT_RE.findall(text):
            comment = comment.replace("''", "'")
            if kind.upper() == "COLUMN":
                table, _, col = obj.partition(".")
                objects.setdefault(table, []).append((col, comment))
            else:
                heads[obj] = (kind.lower(), comment)
                objects.setdefault(obj, [])
        for obj, cols in objects.items():
            kind, comment = heads.get(obj, ("table", ""))
            lines += [f"### `{obj}` ({kind})", "", comment, ""]
            if cols:
                lines += ["| column | meaning |", "|---|---|"]
                lines += [f"| {c} | {_cell(t)} |" for c, t in cols]
                lines.append("")
    return "\n".join(lines).rstrip() + "\n"
