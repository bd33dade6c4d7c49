"""Measured next to derived (SPEC §4): the time-weighted mean of the aligned device-counter samples over each
analysed window — utilization as NVML / DCGM / nvidia-smi reported it, and SM-active / tensor-active where
logged — beside the trace's own utilization. SQL over `windows`, `counters` and `sources`.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

# Counter metric → the verdict's name for its window mean.
MEASURED_METRICS = {"gpu_util": "measured", "sm_active": "sm_active", "tensor_active": "tensor_active"}
MIN_COVERAGE = 0.5  # samples must cover this share of the window
MIN_PERIODS = 2  # and the window must span this many (effective) sampling periods


@dataclass(frozen=True)
class WindowMean:
    scope: str
    range_name: str | None
    rank: int | None  # None: run level (GPUs combined, weighted by window length)
    device: int | None
    metric: str
    value: float
    sources: tuple[str, ...]  # the log(s) the value comes from
    coverage: float
    samples: int
    period_ns: int | None


def window_means(con: duckdb.DuckDBPyConnection) -> list[WindowMean]:
    """Per window and GPU: for each metric, the mean of the best log (the finest sampling among those covering
    the window); then per window the GPUs combined. Windows too short for the log's period, or
    not covered by it, get nothing."""
    metrics = list(MEASURED_METRICS)
    rows = con.execute(
        f"""
        WITH w AS (
            SELECT scope, range_name, rank, device, start_ns, end_ns FROM windows WHERE end_ns > start_ns
        ), wl AS (  -- the windows' groups (a range's occurrences on one GPU): their length, an id
            SELECT scope, range_name, rank, device, sum(end_ns - start_ns) AS wlen, row_number() OVER () AS gid
            FROM w GROUP BY ALL
        ), c AS (
            SELECT c.source_id, c.rank, c.device, list_position($1::VARCHAR[], c.metric) AS m, c.start_ns, c.end_ns,
                   c.value, coalesce(s.sample_period_ns, c.end_ns - c.start_ns) AS period_ns
            FROM counters c JOIN sources s USING (source_id)
            WHERE c.rank IS NOT NULL AND c.metric IN (SELECT unnest($1::VARCHAR[]))
              AND (c.entity IS NULL OR c.entity LIKE 'GPU %') AND c.end_ns > c.start_ns
        ), grid AS (
            -- Time buckets of b ns: each sample falls in the bucket of its start, each window is spread over the
            -- buckets a sample overlapping it can start in ([start − the longest sample, end)), so that a pair is
            -- met once, in the sample's bucket: an equi-join on (rank, device, bucket), not every window against
            -- every sample of its GPU. b: at least the longest sample, and the windows' buckets about as many as
            -- the samples (at most a million).
            SELECT o, l, greatest(l, (sum_w // least(greatest(n, 1), 1000000))::BIGINT + 1) AS b
            FROM (SELECT min(start_ns) AS o, coalesce(max(end_ns - start_ns), 1) AS l, count(*) AS n FROM c),
                 (SELECT sum(end_ns - start_ns)::HUGEINT
                         + count(*) * (SELECT coalesce(max(end_ns - start_ns), 1) FROM c) AS sum_w FROM w)
        ), wb AS (
            SELECT wl.gid, w.rank, w.device, w.start_ns, w.end_ns,
                   unnest(range((w.start_ns - g.l - g.o) // g.b, (w.end_ns - 1 - g.o) // g.b + 1)) AS k
            FROM w JOIN wl ON wl.scope = w.scope AND wl.range_name IS NOT DISTINCT FROM w.range_name
                          AND wl.rank = w.rank AND wl.device = w.device, grid g
        ), j AS (
            SELECT wb.gid, c.source_id, c.m, c.value, c.period_ns, c.end_ns - c.start_ns AS spacing,
                   least(c.end_ns, wb.end_ns) - greatest(c.start_ns, wb.start_ns) AS ov
            FROM (SELECT c.*, (c.start_ns - g.o) // g.b AS k FROM c, grid g) c
            JOIN wb ON wb.rank = c.rank AND wb.device = c.device AND wb.k = c.k
            WHERE c.start_ns < wb.end_ns AND c.end_ns > wb.start_ns
        ), per_src AS (
            SELECT gid, m, source_id, sum(value * ov) / sum(ov) AS mean, sum(ov) AS covered, count(*) AS n,
                   max(period_ns) AS period_ns, median(spacing) AS spacing
            FROM j GROUP BY gid, m, source_id
        ), ok AS (
            SELECT wl.scope, wl.range_name, wl.rank, wl.device, list_extract($1::VARCHAR[], p.m) AS metric, p.mean, s.path,
                   least(p.covered / wl.wlen, 1.0) AS coverage, p.n, p.period_ns, p.spacing, wl.wlen
            FROM per_src p JOIN wl USING (gid) JOIN sources s USING (source_id)
            WHERE p.covered >= {MIN_COVERAGE} * wl.wlen AND wl.wlen >= {MIN_PERIODS} * p.period_ns
        )
        SELECT scope, range_name, rank, device, metric,
               arg_min(mean, spacing * 1e6 - n), arg_min(path, spacing * 1e6 - n),
               arg_min(coverage, spacing * 1e6 - n), arg_min(n, spacing * 1e6 - n), arg_min(period_ns, spacing * 1e6 - n),
               any_value(wlen)
        FROM ok GROUP BY scope, range_name, rank, device, metric""",
        [metrics],
    ).fetchall()
    per_gpu = [
        WindowMean(sc, rn, r, d, m, float(v), (p,), float(cov), int(n), int(per) if per else None)
        for sc, rn, r, d, m, v, p, cov, n, per, _ in rows
    ]
    wlen = {(sc, rn, r, d): int(wl) for sc, rn, r, d, *_, wl in rows}
    all_gpus = {
        (sc, rn, r, d)
        for sc, rn, r, d in con.execute(
            "SELECT DISTINCT scope, range_name, rank, device FROM windows WHERE end_ns > start_ns"
        ).fetchall()
    }
    run: list[WindowMean] = []
    groups: dict[tuple[str, str | None, str], list[WindowMean]] = {}
    for x in per_gpu:
        groups.setdefault((x.scope, x.range_name, x.metric), []).append(x)
    for (sc, rn, m), xs in groups.items():
        gpus_in_window = [g for g in all_gpus if g[0] == sc and g[1] == rn]
        if len(xs) < len(gpus_in_window):
            continue  # some GPU of the window has no measurement: no run-level number
        weights = [wlen[(x.scope, x.range_name, x.rank, x.device)] for x in xs]
        total = sum(weights)
        value = sum(x.value * w for x, w in zip(xs, weights, strict=True)) / total
        srcs = tuple(sorted({s for x in xs for s in x.sources}))
        run.append(
            WindowMean(
                sc,
                rn,
                None,
                None,
                m,
                value,
                srcs,
                sum(x.coverage * w for x, w in zip(xs, weights, strict=True)) / total,
                sum(x.samples for x in xs),
                max((x.period_ns or 0) for x in xs) or None,
            )
        )
    return per_gpu + run


def by_source(con: duckdb.DuckDBPyConnection, scope: str, range_name: str | None) -> list[dict[str, object]]:
    """Every counter log's own gpu_util mean over a window (run level), for the clock/measurement tables: lets a
    reader compare NVML, nvidia-smi and DCGM with each other and with the trace."""
    rows = con.execute(
        """
        WITH w AS (SELECT rank, device, start_ns, end_ns FROM windows
                   WHERE scope = ? AND range_name IS NOT DISTINCT FROM ? AND end_ns > start_ns),
        wl AS (SELECT sum(end_ns - start_ns) AS wlen FROM w),
        j AS (
            SELECT c.source_id, c.value, least(c.end_ns, w.end_ns) - greatest(c.start_ns, w.start_ns) AS ov
            FROM w JOIN counters c ON c.rank = w.rank AND c.device = w.device
                 AND c.start_ns < w.end_ns AND c.end_ns > w.start_ns
            WHERE c.metric = 'gpu_util' AND (c.entity IS NULL OR c.entity LIKE 'GPU %')
        )
        SELECT s.path, s.format, sum(j.value * j.ov) / sum(j.ov), least(sum(j.ov) / any_value(wl.wlen), 1.0),
               count(*), s.sample_period_ns
        FROM j JOIN sources s USING (source_id), wl GROUP BY s.source_id, s.path, s.format, s.sample_period_ns
        ORDER BY s.sample_period_ns, s.source_id""",
        [scope, range_name],
    ).fetchall()
    return [
        {"path": p, "format": f, "gpu_util": float(v), "coverage": float(cov), "samples": int(n), "sample_period_ns": per}
        for p, f, v, cov, n, per in rows
    ]


def utilization_block(
    trace: float | None, means: list[WindowMean], scope: str, range_name: str | None, rank: int | None, device: int | None
) -> dict[str, object]:
    """The verdict's `utilization` object for one window: trace, measured (+ its source), SM / tensor active."""
    found = {
        m.metric: m for m in means if m.scope == scope and m.range_name == range_name and m.rank == rank and m.device == device
    }
    util = found.get("gpu_util")
    out: dict[str, object] = {"trace": trace, "measured": util.value if util else None}
    out["measured_source"] = (util.sources[0] if len(util.sources) == 1 else list(util.sources)) if util else None
    for metric, key in MEASURED_METRICS.items():
        if metric != "gpu_util":
            out[key] = found[metric].value if metric in found else None
    return out
