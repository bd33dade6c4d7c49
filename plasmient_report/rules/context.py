"""What a rule sees: the store narrowed to the analysed window (temp tables `rule_*`, shared and read-only), the
window's size, steps, GPUs and peaks, what program the trace comes from (the library's `program` view), and
`lost_ns`: how much of the waterfall's lost time a set of intervals accounts for. Each rule runs in its own schema
(`own_schema`): the tables it creates cannot touch another rule's or the store's.
"""

from __future__ import annotations

import contextlib
import decimal
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from .. import sql
from ..metrics import window_label
from ..peaks import GpuPeaks, load_table, match_gpu
from ..store import setting
from ..vocab import (
    BUSY_CATEGORIES,
    CATEGORIES,
    IDLE_CATEGORIES,
    MATERIAL_UNKNOWN_FLOPS,
    NS_FIXED_SCALE,
    WORK_ITEM_GRID_LAUNCH_RE,
    unknown_is_material,
)

# lost_ns: from this many intervals on, the merge and lookups of `RuleContext._lost_ns_sorted` (below it, DuckDB
# may plan the general query's lookups as a nested loop join, whose order of sums that merge would not keep)
LOST_SORTED_MIN_INTERVALS = 2000

# Temp tables every rule may read (the analysed window only; same columns as the store's tables).
# rule_kernels carries each kernel's class from the measure stage (kernel_class: class, bound, comm_kind, …);
# rule_collective_members and rule_idle_gaps are the measure stage's collective instances and idle gaps.
RULE_TABLES = (
    "rule_windows",
    "rule_kernels",
    "rule_ops",
    "rule_api_calls",
    "rule_ranges",
    "rule_collectives",
    "rule_losses",
    "rule_steps",
    "rule_collective_members",
    "rule_idle_gaps",
)
__all__ = [
    "BUSY_CATEGORIES",
    "IDLE_CATEGORIES",
    "RULE_TABLES",
    "GpuInfo",
    "Program",
    "RuleContext",
    "cleanup",
    "own_schema",
    "prepare",
]


@dataclass(frozen=True)
class Program:
    """What program the trace comes from (sql/program.sql): advice must fit it."""

    pytorch: bool = True
    tensorrt: bool = False
    runtime: str = "cuda"  # cuda or hip
    graphs: bool = False  # it already launches captured graphs
    server: str | None = None  # an inference server that reserves most of the GPU on purpose: 'vLLM', 'SGLang'
    training: bool | None = None  # a training step is traced (backward, optimizer); False: inference; None: unknown

    @property
    def api(self) -> str:
        return "HIP" if self.runtime == "hip" else "CUDA"

    @property
    def prefix(self) -> str:
        return "hip" if self.runtime == "hip" else "cuda"


@dataclass(frozen=True)
class GpuInfo:
    rank: int | None
    device: int
    name: str | None
    peak_flop_s: float | None
    bandwidth_bytes_s: float | None
    sm_count: int | None
    compute_capability: str | None
    table_entry: GpuPeaks | None  # the peak-table row (all precisions), when the name matched


@dataclass
class RuleContext:
    con: duckdb.DuckDBPyConnection
    scope: str
    range_name: str | None
    precision: str
    window_ns: float  # Σ analysed windows over GPUs: the denominator of every lost_fraction (as in the verdict)
    rank_window_ns: dict[int | None, float]
    steps: int  # ProfilerStep#N in the window, else the range's occurrences, else 1
    step_unit: str | None  # "step", "occurrence of phase:x", or None (the whole window)
    utilization: float | None
    achieved: float | None
    gpus: dict[tuple[int | None, int], GpuInfo]
    category_ns: dict[str, float] = field(default_factory=dict)
    achieved_is_lower_bound: bool = False  # unknown work is material: the achieved fraction is a floor
    program: Program = field(default_factory=Program)
    gpu_count: int = 1  # GPUs with an analysed window
    kernel_count: int = 0  # GPU activities in the window
    schema: str | None = None  # the schema of the rule now running (own_schema)

    @property
    def hip(self) -> bool:
        """AMD GPUs: HIP's grids (`grid_unit_sql`), compute units, hipBLASLt."""
        return self.program.runtime == "hip" or any((g.name or "").startswith("AMD") for g in self.gpus.values())

    @property
    def window_per_gpu_ns(self) -> float:
        return self.window_ns / max(self.gpu_count, 1)

    # ---- queries -------------------------------------------------------------------------------------------
    def rows(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params) if params is not None else self.con.execute(sql)
        if cur.description is None:
            return []
        cols = [d[0] for d in cur.description]
        return [{c: plain(v) for c, v in zip(cols, r, strict=True)} for r in cur.fetchall()]

    def fraction(self, ns: float | None) -> float:
        return float(ns or 0) / self.window_ns if self.window_ns else 0.0

    def category_fraction(self, *categories: str) -> float:
        return self.fraction(sum(self.category_ns.get(c, 0.0) for c in categories))

    def per_step(self, x: float) -> float:
        return x / max(self.steps, 1)

    def per_step_text(self) -> str:
        return f"per {self.step_unit}" if self.step_unit else "in the window"

    def gpu(self, rank: int | None = None) -> GpuInfo | None:
        for (r, _), g in sorted(self.gpus.items(), key=lambda kv: (kv[0][0] is None, kv[0])):
            if rank is None or r == rank:
                return g
        return None

    def gpus_sql(self) -> str:
        """The GPUs as a relation `(rank, device, peak, bw, sm_count)` (peak in FLOP/s, bw in bytes/s)."""

        def lit(x: Any) -> str:
            return "NULL" if x is None else repr(float(x)) if isinstance(x, float) else str(int(x))

        rows = [
            f"({lit(g.rank)}::INTEGER, {lit(g.device)}::INTEGER, {lit(g.peak_flop_s)}::DOUBLE, "
            f"{lit(g.bandwidth_bytes_s)}::DOUBLE, {lit(g.sm_count)}::INTEGER)"
            for g in self.gpus.values()
        ]
        if not rows:
            rows = ["(NULL::INTEGER, NULL::INTEGER, NULL::DOUBLE, NULL::DOUBLE, NULL::INTEGER)"]
        return f"(SELECT * FROM (VALUES {', '.join(rows)}) v(rank, device, peak, bw, sm_count))"

    # ---- the waterfall -------------------------------------------------------------------------------------
    def lost_ns(
        self, intervals_sql: str, categories: Iterable[str], weighted: bool = False, params: Any = None
    ) -> dict[Any, float]:
        """Lost time (ns) of `categories` inside the intervals, per interval `key`.

        `intervals_sql` yields `key, rank, device, start_ns, end_ns` (device NULL: every GPU of the rank) and,
        when `weighted`, a `weight` in [0, 1] (the part of that interval's loss the rule explains). Intervals of
        one key are merged first, so no lost moment counts twice for a key and no key ever claims more than the
        waterfall lost there. A loss stretch partly covered counts pro rata."""
        cats = [c for c in categories if c in CATEGORIES]
        if not cats:
            return {}
        wcol = "least(greatest(coalesce(weight, 0), 0), 1)" if weighted else "1.0"
        # The intervals first, as a table: planned inline under the window functions below, some rules'
        # interval queries ran 100x slower.
        (n_raw,) = self.con.execute(
            f"""
            CREATE OR REPLACE TABLE _rule_lost_raw AS
            SELECT i.key, i.rank, coalesce(i.device, g.device) AS device, i.start_ns, i.end_ns, {wcol} AS w
            FROM ({intervals_sql}) i
            JOIN (SELECT DISTINCT rank, device FROM rule_windows) g
              ON g.rank IS NOT DISTINCT FROM i.rank AND (i.device IS NULL OR i.device = g.device)
            WHERE i.end_ns > i.start_ns""",
            params,
        ).fetchone() or (0,)
        if not weighted and int(n_raw or 0) >= LOST_SORTED_MIN_INTERVALS:
            try:
                return self._lost_ns_sorted(cats)
            finally:
                self.con.execute("DROP TABLE IF EXISTS _rule_lost_raw")
        cats_param = "?"
        # the intervals of each key merged (the measurement library's interval_union, sql/intervals.sql)
        self.con.execute("""CREATE OR REPLACE VIEW _rule_lost_v AS
                             SELECT {'key': key, 'rank': rank, 'device': device} AS grp, start_ns, end_ns
                             FROM _rule_lost_raw""")
        sql = f"""
            WITH raw AS (SELECT * FROM _rule_lost_raw), merged AS (
                SELECT grp.key AS key, grp.rank AS rank, grp.device AS device, start_ns, end_ns
                FROM interval_union('_rule_lost_v')
            ), l AS (
                -- The losses of these categories on one GPU never overlap (the sweep gives every moment one
                -- category), so the lost time inside [s, e] is C(e) - C(s), C(t) being the lost time before t:
                -- one ASOF lookup per interval end instead of an interval join (n log n, not n x m).
                SELECT rank, device, start_ns, end_ns, lost_ns,
                       coalesce(sum(lost_ns) OVER (PARTITION BY rank, device ORDER BY start_ns
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
                FROM rule_losses WHERE category IN (SELECT unnest({cats_param}::VARCHAR[])) AND end_ns > start_ns
            ), ends AS (
                SELECT key, 'm' AS part, 1.0 AS w, rank, device, start_ns AS t, -1.0 AS sign FROM merged
                UNION ALL SELECT key, 'm', 1.0, rank, device, end_ns, 1.0 FROM merged
                {
            '''UNION ALL SELECT key, 'r', w, rank, device, start_ns, -1.0 FROM raw
                UNION ALL SELECT key, 'r', w, rank, device, end_ns, 1.0 FROM raw'''
            if weighted
            else ""
        }
            ), c AS (
                SELECT p.key, p.part, p.w * p.sign * coalesce(l.before + l.lost_ns * least(greatest(
                           (p.t - l.start_ns)::DOUBLE / (l.end_ns - l.start_ns), 0), 1), 0) AS ns
                FROM ends p ASOF LEFT JOIN l
                  ON l.rank IS NOT DISTINCT FROM p.rank AND l.device = p.device AND l.start_ns <= p.t
            ), whole AS (
                SELECT key, exact_sum(ns, {NS_FIXED_SCALE!r}) AS ns FROM c WHERE part = 'm' GROUP BY key
            ){
            f''', part AS (
                SELECT key, exact_sum(ns, {NS_FIXED_SCALE!r}) AS ns FROM c WHERE part = 'r' GROUP BY key
            )'''
            if weighted
            else ""
        }
            SELECT whole.key, greatest({"least(whole.ns, coalesce(part.ns, 0))" if weighted else "whole.ns"}, 0)
            FROM whole {"LEFT JOIN part ON part.key IS NOT DISTINCT FROM whole.key" if weighted else ""}
            WHERE whole.ns > 0.5"""
        try:
            return {plain(k): float(v or 0) for k, v in self.con.execute(sql, [cats]).fetchall()}
        finally:
            self.con.execute("DROP VIEW IF EXISTS _rule_lost_v")
            self.con.execute("DROP TABLE IF EXISTS _rule_lost_raw")

    def _lost_ns_sorted(self, cats: list[str]) -> dict[Any, float]:
        """`lost_ns` of many unweighted intervals (`_rule_lost_raw`), the same numbers in fewer sorts: each key's
        intervals merged in one pass over them sorted by a number given to the key (not by the key: a kernel name
        can be hundreds of characters long) — an island starts where an interval starts after all before it ended
        and ends at the running maximum of the ends before the next island's start, the last at the key's maximum
        end — and the losses looked up with an ASOF join.

        Bit for bit `lost_ns`'s general query: the same island ends with the same signs, each key's summed in fixed
        point (exact_sum: in any order, the same sum). Below `LOST_SORTED_MIN_INTERVALS` DuckDB may turn the
        general query's ASOF join into a nested loop join, which this query's order of keys does not follow (the
        general query takes the loop join up to ~270 intervals of one key).
        """
        sql = f"""
            WITH raw AS (SELECT * FROM _rule_lost_raw),
            k AS MATERIALIZED (SELECT key, row_number() OVER () AS kid FROM (SELECT DISTINCT key FROM raw)),
            s AS MATERIALIZED (
                SELECT k.kid, r.rank, r.device, r.start_ns,
                       max(r.end_ns) OVER (PARTITION BY k.kid, r.rank, r.device ORDER BY r.start_ns, r.end_ns
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
                       max(r.end_ns) OVER (PARTITION BY k.kid, r.rank, r.device ORDER BY r.start_ns, r.end_ns
                                           ROWS UNBOUNDED PRECEDING) AS run_end,
                       lead(r.start_ns) OVER (PARTITION BY k.kid, r.rank, r.device ORDER BY r.start_ns, r.end_ns)
                           IS NULL AS last
                FROM raw r JOIN k ON k.key IS NOT DISTINCT FROM r.key
                WHERE r.end_ns >= r.start_ns
            ), l AS (
                SELECT rank, device, start_ns, end_ns, lost_ns,
                       coalesce(sum(lost_ns) OVER (PARTITION BY rank, device ORDER BY start_ns
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
                FROM rule_losses WHERE category IN (SELECT unnest(?::VARCHAR[])) AND end_ns > start_ns
            ), ends AS (
                SELECT kid, 1.0 AS w, rank, device, start_ns AS t, -1.0 AS sign FROM s
                WHERE prev_end IS NULL OR start_ns > prev_end
                UNION ALL SELECT kid, 1.0, rank, device, prev_end, 1.0 FROM s WHERE start_ns > prev_end
                UNION ALL SELECT kid, 1.0, rank, device, run_end, 1.0 FROM s WHERE last
            ), c AS (
                SELECT p.kid, p.w * p.sign * coalesce(l.before + l.lost_ns * least(greatest(
                           (p.t - l.start_ns)::DOUBLE / (l.end_ns - l.start_ns), 0), 1), 0) AS ns
                FROM ends p ASOF LEFT JOIN l
                  ON l.rank IS NOT DISTINCT FROM p.rank AND l.device = p.device AND l.start_ns <= p.t
            ), whole AS (
                SELECT kid, exact_sum(ns, {NS_FIXED_SCALE!r}) AS ns, min(pos) AS pos
                FROM (SELECT *, row_number() OVER () AS pos FROM c) GROUP BY kid
            )
            -- (the keys in the order in which the ASOF join first gave them: the general query's GROUP BY key gives
            -- that order too, up to hundreds of keys)
            SELECT k.key, greatest(whole.ns, 0) FROM whole JOIN k USING (kid) WHERE whole.ns > 0.5 ORDER BY whole.pos"""
        return {plain(k): float(v or 0) for k, v in self.con.execute(sql, [cats]).fetchall()}

    def lost_fraction(self, intervals_sql: str, categories: Iterable[str], weighted: bool = False, params: Any = None) -> float:
        """`lost_ns` over all keys together, as a fraction of the window."""
        extra = ", weight" if weighted else ""
        sql = f"SELECT NULL AS key, rank, device, start_ns, end_ns{extra} FROM ({intervals_sql})"
        return self.fraction(sum(self.lost_ns(sql, categories, weighted, params).values()))


def grid_unit_sql(hip: bool, launch: str = "kl.launch_name") -> str:
    """SQL of a kernel's grid unit, 'blocks' or 'work-items' (vocab.WORK_ITEM_GRID_LAUNCH_RE), from the call that
    launched it (`launch`: kernel_launch.launch_name). NULL for a HIP kernel without its launch (replayed from a
    graph): its grid's unit is not known."""
    if not hip:
        return "'blocks'"
    return (
        f"CASE WHEN {launch} IS NULL THEN NULL WHEN regexp_matches({launch}, '{WORK_ITEM_GRID_LAUNCH_RE}') "
        "THEN 'work-items' ELSE 'blocks' END"
    )


def grid_blocks_sql(unit: str, k: str = "k.") -> str:
    """SQL of a kernel's blocks (workgroups) from its grid in `unit` (grid_unit_sql's value): the grid itself when
    it counts blocks, ⌈grid / block⌉ per dimension when it counts work-items (a HIP global work size); NULL when
    the unit is not known or the trace gives no grid (x missing or 0: a kernel replayed from a graph). A y or z
    missing or 0 counts 1 (no launch runs an empty grid), as does a block dimension. `k`: the prefix of the grid_* /
    block_* columns."""

    def one(col: str) -> str:
        return f"coalesce(nullif({k}{col}, 0), 1)"

    grid = {"x": f"nullif({k}grid_x, 0)", "y": one("grid_y"), "z": one("grid_z")}
    blocks = " * ".join(grid.values())
    work_items = " * ".join(f"ceil({grid[a]} / {one(f'block_{a}')})" for a in "xyz")
    return f"CASE {unit} WHEN 'blocks' THEN ({blocks})::BIGINT WHEN 'work-items' THEN ({work_items})::BIGINT END"


def residual(condition: str) -> str:
    """A join condition the planner cannot hash on (equalities inside a CASE): beside two inequalities on times (an
    interval that contains, or overlaps, another) the join is then a range join (IEJoin: both sides sorted,
    n log n) with this as a filter — inside `range_joins`, which keeps DuckDB from a merge join on one of the
    inequalities when a side is small. As a plain equality (the same rank, thread, device) DuckDB builds a hash
    join on it and tests the inequalities on every pair of a rank: every sync against every op of its thread,
    every gap against every loss of its GPU — quadratic in the trace's length (4x the steps of a with_stack trace:
    PR502 0.2 → 1.4 s, PR504 0.05 → 0.5 s). The same rows either way; use it only where both sides grow with the
    trace (the output, pairs of all ranks that meet in time, stays small)."""
    return f"(CASE WHEN {condition} THEN true ELSE false END)"


def range_joins(con: duckdb.DuckDBPyConnection) -> contextlib.AbstractContextManager[None]:
    """Inequality joins as IEJoins whatever the sides' sizes: DuckDB takes a piecewise merge join on one
    inequality when a side has fewer than `merge_join_threshold` rows (1,000), and tests the other per pair —
    528 syncs against 150 k Python frames: 0.2 s, against 0.035 s as an IEJoin (measured)."""
    return setting(con, "merge_join_threshold", 0)


def plain(v: Any) -> Any:
    """DuckDB values → JSON-safe Python values."""
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _peaks_by_gpu(peaks: Sequence[Any]) -> dict[tuple[int | None, int], Any]:
    return {(p.rank, p.device): p for p in peaks}


def prepare(
    con: duckdb.DuckDBPyConnection,
    ranges: Sequence[str],
    precision: str,
    peaks: Sequence[Any],
    peaks_file: Any = None,
    material_unknown: float = MATERIAL_UNKNOWN_FLOPS,
) -> RuleContext:
    """Narrow the store to the headline window (the first `--range`, else each GPU's profiled window)."""
    scope = "range" if ranges else "window"
    range_name = window_label(ranges)
    p = [scope, range_name]
    cleanup(con)
    con.execute(
        """CREATE OR REPLACE TEMP TABLE rule_windows AS
                   SELECT rank, device, start_ns, end_ns FROM windows
                   WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? AND end_ns > start_ns""",
        p,
    )
    if scope == "window":
        # the profiled window's losses as they are stored (a view: copied, 50 k rows of a 100 MiB trace took 12 ms)
        con.execute(
            "CREATE OR REPLACE TEMP VIEW rule_losses AS SELECT * FROM losses WHERE scope = 'window' AND range_name IS NULL"
        )
    else:
        con.execute(
            """CREATE OR REPLACE TEMP TABLE rule_losses AS
                       SELECT * FROM losses WHERE scope = ? AND range_name IS NOT DISTINCT FROM ?""",
            p,
        )
    # kernels with the measure stage's class (kernel_class): class, bound, comm_kind, pipeline, precision, …
    classed = """SELECT k.*, kc.class, kc.reason AS class_reason, kc.bound, kc.comm_kind, kc.pipeline,
                         kc.precision, kc.peak_precision, kc.fraction_of_peak, kc.arithmetic_intensity,
                         kc.above_hbm_peak
                  FROM kernels k JOIN kernel_class kc USING (kernel_id)"""
    if scope == "window":
        # Each GPU's window spans all of its rank's events: nothing to cut (and nothing copied).
        con.execute(f"CREATE OR REPLACE TEMP VIEW rule_kernels AS {classed}")
        for t in ("ops", "api_calls", "ranges", "collectives"):
            con.execute(f"CREATE OR REPLACE TEMP VIEW rule_{t} AS SELECT * FROM {t}")
        con.execute("CREATE OR REPLACE TEMP VIEW rule_collective_members AS SELECT * FROM collective_members")
    else:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE rule_kernels AS
                       SELECT k.* FROM ({classed}) k SEMI JOIN rule_windows w
                         ON w.rank IS NOT DISTINCT FROM k.rank AND w.device = k.device
                        AND k.start_ns < w.end_ns AND k.end_ns > w.start_ns""")
        for t in ("ops", "api_calls", "ranges"):
            con.execute(f"""CREATE OR REPLACE TEMP TABLE rule_{t} AS
                            SELECT x.* FROM {t} x SEMI JOIN rule_windows w
                              ON w.rank IS NOT DISTINCT FROM x.rank AND x.start_ns < w.end_ns AND x.end_ns > w.start_ns""")
        # A collective counts when any rank's part of it is in the window (its peers' parts come along): the
        # measure stage's instances (collective_members: key, collective, seq).
        con.execute("""CREATE OR REPLACE TEMP TABLE rule_collective_members AS
                       WITH hit AS (SELECT DISTINCT key, collective, seq FROM collective_members m SEMI JOIN rule_windows w
                                      ON w.rank IS NOT DISTINCT FROM m.rank AND w.device = m.device
                                     AND m.start_ns < w.end_ns AND m.end_ns > w.start_ns)
                       SELECT m.* FROM collective_members m JOIN hit USING (key, collective, seq)""")
        con.execute("""CREATE OR REPLACE TEMP TABLE rule_collectives AS
                       SELECT c.* FROM collectives c SEMI JOIN rule_collective_members m
                         ON m.source_id = c.source_id AND m.kernel_correlation IS NOT DISTINCT FROM c.kernel_correlation
                        AND m.start_ns = c.start_ns""")
    if scope == "window":
        con.execute(
            "CREATE OR REPLACE TEMP VIEW rule_idle_gaps AS SELECT * FROM idle_gaps WHERE scope = 'window' AND range_name IS NULL"
        )
    else:
        con.execute(
            """CREATE OR REPLACE TEMP TABLE rule_idle_gaps AS
                       SELECT * FROM idle_gaps WHERE scope = ? AND range_name IS NOT DISTINCT FROM ?""",
            p,
        )
    # Steps: ProfilerStep#N ranges (CPU side) that lie inside the window, per rank.
    con.execute("""CREATE OR REPLACE TEMP TABLE rule_steps AS
                   SELECT DISTINCT r.rank, r.name, r.start_ns, r.end_ns FROM ranges r JOIN rule_windows w
                     ON w.rank IS NOT DISTINCT FROM r.rank AND r.start_ns >= w.start_ns - 1000 AND r.end_ns <= w.end_ns + 1000
                   WHERE NOT r.on_gpu AND r.name LIKE 'ProfilerStep#%'""")
    wrows = con.execute(
        """SELECT rank, sum(window_ns), bool_and(peak_flop_s IS NOT NULL), max(occurrences)
                           FROM metrics WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? AND rank IS NOT NULL
                           GROUP BY rank""",
        p,
    ).fetchall()
    rank_window = {r: float(w or 0) for r, w, _, _ in wrows}
    with_peak = sum(float(w or 0) for _, w, ok, _ in wrows if ok)
    window_ns = with_peak or sum(rank_window.values())
    step_rows = con.execute("SELECT rank, count(*) FROM rule_steps GROUP BY rank").fetchall()
    if step_rows:
        steps, unit = max(int(n) for _, n in step_rows), "step"
    elif scope == "range":
        steps, unit = max([int(o or 1) for *_, o in wrows] or [1]), f"occurrence of {range_name}"
    else:
        steps, unit = 1, None
    head = con.execute(
        """SELECT utilization, achieved_fraction_of_peak, unknown_ns, kernel_ns_with_flops FROM metrics
                          WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? AND rank IS NULL""",
        p,
    ).fetchall()
    util, achieved, unknown_ns, with_flops_ns = head[0] if head else (None, None, None, None)
    cat_ns = {
        c: float(n or 0) for c, n in con.execute("SELECT category, sum(lost_ns) FROM rule_losses GROUP BY category").fetchall()
    }
    table = load_table(peaks_file)
    devs = {
        (r, d): (n, sm, cc)
        for r, d, n, sm, cc in con.execute(
            "SELECT rank, device, any_value(name), max(sm_count), any_value(compute_capability) FROM devices "
            "GROUP BY rank, device"
        ).fetchall()
    }
    gpus: dict[tuple[int | None, int], GpuInfo] = {}
    for key, pk in _peaks_by_gpu(peaks).items():
        name, sm, cc = devs.get(key, (pk.device_name, None, None))
        entry = next((g for g in table if g.key == pk.peak.gpu_key), None) or match_gpu(name, table)
        gpus[key] = GpuInfo(
            rank=key[0],
            device=key[1],
            name=name or pk.device_name,
            peak_flop_s=pk.peak.flop_s,
            bandwidth_bytes_s=pk.peak.bandwidth_bytes_s,
            sm_count=sm,
            compute_capability=cc,
            table_entry=entry,
        )
    sql.install(con, "program")
    pyt, trt, runtime, graphs, server, training = con.execute(
        "SELECT pytorch, tensorrt, runtime, graphs, server, training FROM program"
    ).fetchone() or (True, False, "cuda", False, None, None)
    n_gpus, n_kernels = con.execute("""SELECT (SELECT count(*) FROM (SELECT DISTINCT rank, device FROM rule_windows)),
                                              (SELECT count(*) FROM rule_kernels)""").fetchone() or (0, 0)
    return RuleContext(
        con=con,
        scope=scope,
        range_name=range_name,
        precision=precision,
        window_ns=window_ns,
        rank_window_ns=rank_window,
        steps=steps,
        step_unit=unit,
        utilization=float(util) if util is not None else None,
        achieved=float(achieved) if achieved is not None else None,
        gpus=gpus,
        category_ns=cat_ns,
        achieved_is_lower_bound=unknown_is_material(unknown_ns, with_flops_ns, material_unknown),
        program=Program(
            pytorch=bool(pyt), tensorrt=bool(trt), runtime=str(runtime), graphs=bool(graphs), server=server, training=training
        ),
        gpu_count=int(n_gpus or 0),
        kernel_count=int(n_kernels or 0),
    )


@contextlib.contextmanager
def own_schema(ctx: RuleContext, rule_id: str) -> Iterator[str]:
    """Run a rule in a database of its own (an in-memory one attached as `rule_<id>`): what it creates without a
    qualifier lands there, the store and the shared `rule_*` tables stay readable, and everything it made goes when
    it ends — no rule can step on another's tables."""
    con = ctx.con
    (db,) = con.execute("SELECT current_database()").fetchall()[0]
    store_db = '"' + str(db).replace('"', '""') + '"'
    schema = "rule_" + "".join(c for c in rule_id.lower() if c.isalnum())
    con.execute(f"DETACH DATABASE IF EXISTS {schema}")
    con.execute(f"ATTACH ':memory:' AS {schema}")
    try:
        con.execute(f"USE {schema}")
        con.execute(f"SET search_path = '{schema}.main,{store_db}.main'")
        ctx.schema = schema
        yield schema
    finally:
        ctx.schema = None
        con.execute("RESET search_path")  # (back to the connection's default database: USE the store after it)
        con.execute(f"USE {store_db}")
        con.execute(f"DETACH DATABASE IF EXISTS {schema}")


def cleanup(con: duckdb.DuckDBPyConnection) -> None:
    views = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    for t in RULE_TABLES:
        if t in views:
            con.execute(f"DROP VIEW {t}")
        elif t in tables:
            con.execute(f"DROP TABLE {t}")
