"""PR601 clock-throttling: the SM clock below its maximum while the GPU is busy, from device counters
(`counters`: sm_clock_mhz, power_w, power_limit_w, temperature_c). Silent when there are no counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ...sql.native import round_half_away
from ..base import Explanation, Finding, Thresholds, rule
from ..context import RuleContext

EXPLANATION = Explanation(
    what_it_does="""
        From device-counter logs (NVML, nvidia-smi, DCGM, nsys GPU metrics; table `counters`): the SM clock during
        the busy part of the window (samples weighted by the compute / memory-bound time the waterfall lost inside
        them) against the GPU's maximum clock (`sm_clock_max_mhz` when logged, else the highest clock seen). Fires
        when the clock is more than `max_clock_drop` below the maximum for at least `min_throttled_share` of the
        busy time, and says whether power (`power_w` within `power_limit_share` of `power_limit_w`) or temperature
        (at least `hot_celsius`) explains it. Without counters it stays silent.""",
    why_is_this_bad="""
        Compute-bound kernels run in proportion to the SM clock: 1700 MHz instead of 1980 MHz is 14% fewer
        FLOP/s, and datasheet peaks assume the boost clock. The loss hides inside `compute_inefficiency` and
        `memory_bound`; this rule claims the part of them that the clock drop explains, (1 − clock / max).""",
    example="""
        `SM clock 1,710 MHz while busy, 14% below its 1,980 MHz maximum, for 100% of the busy time`.""",
    how_to_fix="""
        Read the reason: `nvidia-smi -q -d PERFORMANCE` (clocks event reasons: SW power cap, HW slowdown, thermal;
        `amd-smi metric` on AMD). Power-capped: check the power limit (`nvidia-smi -pl`), the node's power budget,
        or accept it (it is often the cheaper trade). Thermal: fix cooling / airflow. Application-clock or
        locked-clock settings (`nvidia-smi -lgc`, `-rgc` to reset) can pin the clock low.""",
)

# Counter samples of one source per GPU (the one with the most samples), matched to the analysed GPUs.
SAMPLES_SQL = """
WITH c AS (
    SELECT coalesce(c.rank, d.rank) AS rank, coalesce(c.device, d.device) AS device, c.source_id, c.metric,
           c.start_ns, c.end_ns, c.value
    FROM counters c LEFT JOIN devices d ON c.rank IS NULL AND c.gpu_uuid IS NOT NULL AND d.gpu_uuid = c.gpu_uuid
    WHERE c.value IS NOT NULL AND c.end_ns > c.start_ns AND c.metric IN ({metrics})
), g AS (SELECT DISTINCT rank, device FROM rule_windows
), m AS (
    SELECT g.rank, g.device, c.source_id, c.metric, c.start_ns, c.end_ns, c.value
    FROM c JOIN g ON (c.rank IS NULL OR c.rank IS NOT DISTINCT FROM g.rank) AND (c.device IS NULL OR c.device = g.device)
), best AS (
    SELECT rank, device, arg_max(source_id, n) AS source_id FROM (
        SELECT rank, device, source_id, count(*) AS n FROM m WHERE metric = 'sm_clock_mhz' GROUP BY ALL)
    GROUP BY rank, device
)
SELECT m.* FROM m JOIN best USING (rank, device, source_id)"""
METRICS = [
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "power_limit_w",
    "enforced_power_limit_w",
    "temperature_c",
    "gpu_temp_c",
    "temp_c",
]


# The clock of each GPU while busy: each clock sample weighted by the busy time (and the compute / memory-bound
# lost time) inside it — the definition, in SQL; `per_gpu_clock` computes the same in numpy (the SQL's two ASOF
# joins over 10 kHz GPU metrics took ~0.3–0.5 s). tests/rules/PR601 checks that both give the same rows.
PER_GPU_SQL = """
        WITH s AS (SELECT * FROM _rule_clk),
        ref AS (
            SELECT rank, device, coalesce(max(value) FILTER (WHERE metric = 'sm_clock_max_mhz'),
                                          max(value) FILTER (WHERE metric = 'sm_clock_mhz')) AS ref_mhz
            FROM s GROUP BY rank, device
        ), clk AS (
            SELECT row_number() OVER () AS cid, s.rank, s.device, s.start_ns, s.end_ns, s.value AS mhz, ref.ref_mhz
            FROM s JOIN ref USING (rank, device) WHERE s.metric = 'sm_clock_mhz' AND s.end_ns > s.start_ns
        ), l AS (
            -- busy stretches (the losses of busy categories never overlap on a GPU): the lost and the busy time
            -- inside a clock sample are differences of running sums, looked up by ASOF join (no interval join:
            -- GPU metrics at 10 kHz make millions of samples)
            SELECT rank, device, start_ns, end_ns, lost_ns,
                   coalesce(sum(lost_ns) OVER w, 0) AS lost_before, coalesce(sum(end_ns - start_ns) OVER w, 0) AS busy_before
            FROM rule_losses WHERE category IN ('compute_inefficiency', 'memory_bound') AND end_ns > start_ns
            WINDOW w AS (PARTITION BY rank, device ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        ), at_start AS (
            -- the running sums at each sample's start and at its end: one ASOF lookup each
            SELECT c.cid, coalesce(l.lost_before + l.lost_ns * f.x, 0) AS lost,
                   coalesce(l.busy_before + (l.end_ns - l.start_ns) * f.x, 0) AS busy
            FROM clk c ASOF LEFT JOIN l ON l.rank IS NOT DISTINCT FROM c.rank AND l.device = c.device
                                          AND l.start_ns <= c.start_ns,
                 LATERAL (SELECT least(greatest((c.start_ns - l.start_ns)::DOUBLE / (l.end_ns - l.start_ns), 0), 1) AS x) f
        ), at_end AS (
            SELECT c.*, coalesce(l.lost_before + l.lost_ns * f.x, 0) AS lost,
                   coalesce(l.busy_before + (l.end_ns - l.start_ns) * f.x, 0) AS busy
            FROM clk c ASOF LEFT JOIN l ON l.rank IS NOT DISTINCT FROM c.rank AND l.device = c.device
                                          AND l.start_ns <= c.end_ns,
                 LATERAL (SELECT least(greatest((c.end_ns - l.start_ns)::DOUBLE / (l.end_ns - l.start_ns), 0), 1) AS x) f
        ), busy AS (
            SELECT e.* EXCLUDE (lost, busy), e.lost - s.lost AS lost_ns, round(e.busy - s.busy)::BIGINT AS busy_ns
            FROM at_end e JOIN at_start s USING (cid) WHERE round(e.busy - s.busy)::BIGINT > 0.5
        )
        SELECT rank, device, min(ref_mhz) AS ref_mhz, sum(busy_ns) AS busy_ns,
               sum(mhz * busy_ns) / nullif(sum(busy_ns), 0) AS busy_mhz, min(mhz) AS min_mhz,
               sum(busy_ns) FILTER (WHERE mhz < ref_mhz * (1 - $drop)) AS throttled_ns,
               sum(lost_ns * (1 - mhz / ref_mhz)) FILTER (WHERE mhz < ref_mhz * (1 - $drop)) AS explained_ns,
               min(start_ns) FILTER (WHERE mhz < ref_mhz * (1 - $drop)) AS t0,
               max(end_ns) FILTER (WHERE mhz < ref_mhz * (1 - $drop)) AS t1
        FROM busy GROUP BY rank, device ORDER BY rank, device"""
BUSY_CATEGORIES = ("compute_inefficiency", "memory_bound")


def per_gpu_sql(ctx: RuleContext, drop: float) -> list[dict[str, Any]]:
    return ctx.rows(PER_GPU_SQL, {"drop": drop})


def per_gpu_clock(ctx: RuleContext, drop: float) -> list[dict[str, Any]]:
    """PER_GPU_SQL's rows from numpy: the busy stretches' running sums looked up at each clock sample's start and
    end by binary search (one GPU at a time)."""
    con = ctx.con
    clk = con.sql("""
        WITH ref AS (
            SELECT rank, device, coalesce(max(value) FILTER (WHERE metric = 'sm_clock_max_mhz'),
                                          max(value) FILTER (WHERE metric = 'sm_clock_mhz')) AS ref_mhz
            FROM _rule_clk GROUP BY rank, device)
        SELECT s.rank, s.device, s.start_ns, s.end_ns, s.value AS mhz, ref.ref_mhz
        FROM _rule_clk s JOIN ref USING (rank, device)
        WHERE s.metric = 'sm_clock_mhz' AND s.end_ns > s.start_ns
        ORDER BY s.rank, s.device, s.start_ns, s.end_ns, s.value""").to_arrow_table()  # (in time order: the sums below too)
    if not clk.num_rows:
        return []
    busy = con.sql(
        f"""SELECT rank, device, start_ns, end_ns, lost_ns FROM rule_losses
            WHERE category IN ({", ".join(f"'{c}'" for c in BUSY_CATEGORIES)}) AND end_ns > start_ns
              AND rank IS NOT NULL AND device IS NOT NULL
            ORDER BY rank, device, start_ns"""
    ).to_arrow_table()
    col = lambda tbl, name, dtype: tbl.column(name).to_numpy().astype(dtype)  # noqa: E731
    c_rank, c_dev = col(clk, "rank", np.int64), col(clk, "device", np.int64)
    c_s, c_e, mhz = col(clk, "start_ns", np.int64), col(clk, "end_ns", np.int64), col(clk, "mhz", np.float64)
    ref_arr = clk.column("ref_mhz").to_numpy(zero_copy_only=False)
    l_rank, l_dev = col(busy, "rank", np.int64), col(busy, "device", np.int64)
    l_s, l_e = col(busy, "start_ns", np.int64), col(busy, "end_ns", np.int64)
    l_lost = np.nan_to_num(busy.column("lost_ns").to_numpy(zero_copy_only=False).astype(np.float64))
    out = []
    bounds = np.flatnonzero(np.diff(c_rank) | np.diff(c_dev)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, c_rank.size], strict=True):
        rank, dev = int(c_rank[lo]), int(c_dev[lo])
        sel = (l_rank == rank) & (l_dev == dev)
        ls, le, lost = l_s[sel], l_e[sel], l_lost[sel]
        length = le - ls
        lost_before = np.cumsum(lost) - lost
        busy_before = np.cumsum(length) - length

        def at(t: np.ndarray, ls=ls, le=le, lost=lost, length=length, lost_before=lost_before, busy_before=busy_before):
            i = np.searchsorted(ls, t, side="right") - 1
            found = i >= 0
            j = np.maximum(i, 0)
            if not ls.size:
                return np.zeros(t.size), np.zeros(t.size)
            x = np.clip((t - ls[j]).astype(np.float64) / length[j], 0, 1)
            return (
                np.where(found, lost_before[j] + lost[j] * x, 0.0),
                np.where(found, busy_before[j] + length[j] * x, 0.0),
            )

        s_lost, s_busy = at(c_s[lo:hi])
        e_lost, e_busy = at(c_e[lo:hi])
        busy_ns = round_half_away(e_busy - s_busy)
        keep = busy_ns > 0.5
        if not keep.any():
            continue
        b = busy_ns[keep].astype(np.int64)
        m, lost_ns = mhz[lo:hi][keep], (e_lost - s_lost)[keep]
        ref = float(ref_arr[lo])  # (NULL: NaN, and no sample is below it)
        thr = m < ref * (1 - drop)
        total = int(b.sum())
        out.append(
            {
                "rank": rank,
                "device": dev,
                "ref_mhz": ref if np.isfinite(ref) else None,
                "busy_ns": total,
                "busy_mhz": float((m * b).sum() / total) if total else None,
                "min_mhz": float(m.min()),
                "throttled_ns": int(b[thr].sum()) if thr.any() else None,
                "explained_ns": float((lost_ns[thr] * (1 - m[thr] / ref)).sum()) if thr.any() else None,
                "t0": int(c_s[lo:hi][keep][thr].min()) if thr.any() else None,
                "t1": int(c_e[lo:hi][keep][thr].max()) if thr.any() else None,
            }
        )
    return out


@rule(
    title="The SM clock drops below its maximum while busy",
    category=None,
    thresholds={"max_clock_drop": 0.05, "min_throttled_share": 0.10, "power_limit_share": 0.95, "hot_celsius": 85.0},
    explanation=EXPLANATION,
)
def clock_throttling(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    if not ctx.rows("SELECT count(*) AS n FROM counters WHERE metric = 'sm_clock_mhz'")[0]["n"]:
        return
    # the names as constants: a filter the scan of millions of counter samples applies itself, not a join
    names = ", ".join("'" + m.replace("'", "''") + "'" for m in METRICS)
    ctx.con.execute(f"CREATE TABLE _rule_clk AS {SAMPLES_SQL.format(metrics=names)}")
    yield from _check(ctx, t)


def _check(ctx: RuleContext, t: Thresholds) -> Iterator[Finding]:
    if not ctx.rows("SELECT count(*) AS n FROM _rule_clk WHERE metric = 'sm_clock_mhz'")[0]["n"]:
        return
    per_gpu = per_gpu_clock(ctx, t.max_clock_drop)
    hit = [g for g in per_gpu if g["busy_ns"] and (g["throttled_ns"] or 0) >= t.min_throttled_share * g["busy_ns"]]
    if not hit:
        return
    side = {
        (r["rank"], r["device"]): r
        for r in ctx.rows("""
        WITH s AS (SELECT * FROM _rule_clk),
        w AS (SELECT rank, device, min(start_ns) AS a, max(end_ns) AS b FROM rule_windows GROUP BY ALL)
        SELECT s.rank, s.device,
               avg(value) FILTER (WHERE metric = 'power_w') AS power_w,
               max(value) FILTER (WHERE metric = 'power_w') AS max_power_w,
               max(value) FILTER (WHERE metric IN ('power_limit_w', 'enforced_power_limit_w')) AS power_limit_w,
               max(value) FILTER (WHERE metric IN ('temperature_c', 'gpu_temp_c', 'temp_c')) AS max_temp_c
        FROM s JOIN w ON w.rank IS NOT DISTINCT FROM s.rank AND w.device = s.device AND s.start_ns < w.b AND s.end_ns > w.a
        GROUP BY s.rank, s.device""")
    }
    explained = sum(g["explained_ns"] or 0 for g in hit)
    worst = min(hit, key=lambda g: g["busy_mhz"] or 0)
    drop = 1 - worst["busy_mhz"] / worst["ref_mhz"]
    share = (worst["throttled_ns"] or 0) / worst["busy_ns"]
    sd = side.get((worst["rank"], worst["device"]), {})
    reasons = []
    if sd.get("power_w") is not None:
        if sd.get("power_limit_w") and sd["max_power_w"] >= t.power_limit_share * sd["power_limit_w"]:
            reasons.append(f"power reaches its {sd['power_limit_w']:.0f} W limit (max {sd['max_power_w']:.0f} W): power-capped")
        else:
            lim = f" of a {sd['power_limit_w']:.0f} W limit" if sd.get("power_limit_w") else ""
            reasons.append(f"power {sd['power_w']:.0f} W on average, {sd['max_power_w']:.0f} W max{lim}")
    if sd.get("max_temp_c") is not None:
        reasons.append(
            f"temperature up to {sd['max_temp_c']:.0f} °C"
            + (" (hot: thermal slowdown likely)" if sd["max_temp_c"] >= t.hot_celsius else "")
        )
    gpu = f"GPU {worst['device']}" + (f" (rank {worst['rank']})" if len(ctx.rank_window_ns) > 1 else "")
    why = f" ({'; '.join(reasons)})" if reasons else ""
    amd = ctx.program.runtime == "hip"
    clock, units = ("GFX clock", "compute units") if amd else ("SM clock", "SMs")
    check = (
        "`amd-smi metric --violation` (the time held back by power and thermal limits; the throttle status of "
        "`amd-smi metric --power` on MI200 and older), the power cap, cooling, and a fixed performance level"
        if amd
        else "`nvidia-smi -q -d PERFORMANCE` (clocks event reasons), the power limit (`nvidia-smi -pl`), cooling, "
        "and locked / application clocks (`nvidia-smi -rgc` resets them)"
    )
    rec = (
        f"{gpu} ran its {units} at {worst['busy_mhz']:,.0f} MHz on average while busy, {drop:.0%} below its "
        f"{worst['ref_mhz']:,.0f} MHz maximum (lowest {worst['min_mhz']:,.0f} MHz), for {share:.0%} of the busy "
        f"time{why}. Compute-bound kernels slow down in proportion. Check the reason with {check}."
    )
    yield Finding(
        title=f"{clock} {worst['busy_mhz']:,.0f} MHz while busy, {drop:.0%} below its {worst['ref_mhz']:,.0f} MHz "
        f"maximum, for {share:.0%} of the busy time",
        recommendation=rec,
        fix=f"{clock} −{drop:.0%} while busy: check power / thermal limits",
        lost_fraction=ctx.fraction(explained),
        rank=worst["rank"] if len(ctx.rank_window_ns) > 1 else None,
        key="clock",
        evidence={
            "gpus": [{**g, **side.get((g["rank"], g["device"]), {})} for g in per_gpu],
            "clock_drop": drop,
            "throttled_share_of_busy": share,
        },
    )
