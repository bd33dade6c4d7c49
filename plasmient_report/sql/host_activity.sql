-- Module: host_activity
-- What each rank's host is doing, as intervals, for naming idle GPU time: `launch_call` (a kernel / graph launch or
-- async memset call), `launch_op` (a top-level CPU op that launches GPU work: the framework's per-op overhead
-- before its launch), `startup` (one-time set-up calls — context and module loading, library handles, device
-- queries, stream / event creation, allocations and frees, but not those inside the rank's GPU span when calls of
-- that name keep coming all through its GPU work: vocab.STARTUP_RECURRING_* — the first CUDA call of a process when it is long: it
-- creates the context —, and a launch call of vocab.SLOW_LAUNCH_NS or more: a kernel's first launch loading its
-- module; and the set-up overhead records: the profiler's own before the rank's first GPU activity,
-- vocab.PROFILER_SETUP_RE (its buffer requests), named `profiler: NAME`, and the driver's that CUPTI reports,
-- vocab.DRIVER_SETUP_RE (lazy function loading), by their names),
-- `loader` (DataLoader ranges, or ops in old traces).
-- Depends: vocab

CREATE OR REPLACE TABLE host_activity AS
WITH api AS (
    SELECT * FROM api_calls WHERE kind IS DISTINCT FROM 'osrt' AND end_ns >= start_ns
), api_names AS (
    -- the patterns read once per distinct name (the name is an aggregate's result: the filters below are not pushed
    -- back under the grouping, onto every call)
    SELECT n, regexp_matches(n, {{LAUNCH_API_RE}}) AS is_launch, regexp_matches(n, {{STARTUP_API_RE}}) AS is_setup
    FROM (SELECT any_value(name) AS n FROM api GROUP BY name)
), launch AS (
    SELECT * FROM api WHERE name IN (SELECT n FROM api_names WHERE is_launch)
), first_call AS (
    SELECT rank, arg_min(name, start_ns) AS name, min(start_ns) AS start_ns, arg_min(end_ns, start_ns) AS end_ns
    FROM api GROUP BY rank
), kspan AS (
    SELECT rank, min(start_ns) AS s, max(end_ns) AS e FROM kernels GROUP BY rank
), setup AS (
    -- each set-up call with the tenth of its rank's GPU span (first kernel to last) it falls in
    SELECT a.rank, a.name, a.start_ns, a.end_ns,
           CASE WHEN a.start_ns >= k.s AND a.start_ns < k.e
                THEN floor((a.start_ns - k.s) * {{STARTUP_RECURRING_BINS}} / (k.e - k.s))::INTEGER END AS bin
    FROM api a LEFT JOIN kspan k ON k.rank IS NOT DISTINCT FROM a.rank AND k.e > k.s
    WHERE a.name IN (SELECT n FROM api_names WHERE is_setup)
), recurring AS (
    -- a set-up call that keeps coming all through the GPU work (an allocator freeing and allocating every step,
    -- device queries per op) is steady-state host work, not one-time start-up
    SELECT rank, name FROM setup WHERE regexp_matches(name, {{STARTUP_RECURRABLE_API_RE}}) GROUP BY rank, name
    HAVING count(*) FILTER (WHERE bin IS NOT NULL) >= {{STARTUP_RECURRING_MIN_CALLS}}
       AND count(DISTINCT bin) >= {{STARTUP_RECURRING_MIN_BINS}}
), launch_ops AS (
    SELECT DISTINCT o.op_id, o.rank, o.start_ns, o.end_ns, o.name
    FROM launch l ASOF JOIN (SELECT * FROM ops WHERE depth = 0) o
      ON o.source_id = l.source_id AND o.thread = l.thread AND o.start_ns <= l.start_ns
    WHERE o.end_ns >= l.start_ns
)
SELECT rank, CASE WHEN end_ns - start_ns >= {{SLOW_LAUNCH_NS}} THEN 'startup' ELSE 'launch_call' END AS kind, name,
       start_ns, end_ns
FROM launch
UNION ALL
SELECT rank, 'launch_op', name, start_ns, end_ns FROM launch_ops
UNION ALL
SELECT rank, 'startup', name, start_ns, end_ns FROM setup
WHERE bin IS NULL OR NOT EXISTS (
    SELECT 1 FROM recurring r WHERE r.rank IS NOT DISTINCT FROM setup.rank AND r.name = setup.name)
UNION ALL
SELECT rank, 'startup', name, start_ns, end_ns FROM first_call
WHERE end_ns - start_ns >= {{STARTUP_FIRST_CALL_MIN_NS}} AND NOT regexp_matches(name, {{STARTUP_API_RE}})
  -- (a copy or a sync is long for its copy or its wait: a profile begun mid-run starts on one)
  AND NOT regexp_matches(name, {{COPY_API_RE}}) AND NOT regexp_matches(name, {{SYNC_API_RE}})
UNION ALL
SELECT p.rank, 'startup', CASE WHEN regexp_matches(p.name, {{PROFILER_SETUP_RE}}) THEN {{PROFILER_PREFIX}} || p.name
                               ELSE p.name END, p.start_ns, p.end_ns
FROM profiler_overhead p LEFT JOIN kspan k ON k.rank IS NOT DISTINCT FROM p.rank
WHERE p.end_ns > p.start_ns AND (regexp_matches(p.name, {{DRIVER_SETUP_RE}})
      -- the profiler's set-up before the rank's first GPU activity; later (a buffer requested mid-run) it is the
      -- profiler's overhead while it records, not start-up (PR504 names it in the gap it falls in)
      OR regexp_matches(p.name, {{PROFILER_SETUP_RE}}) AND (k.s IS NULL OR p.start_ns < k.s))
UNION ALL
SELECT rank, 'loader', name, start_ns, end_ns FROM ranges
WHERE NOT on_gpu AND domain IS DISTINCT FROM 'python' AND regexp_matches(name, {{DATALOADER_RE}})
UNION ALL
-- (torch <= 1.9 records the DataLoader's __next__ as an op, category Operator)
SELECT rank, 'loader', name, start_ns, end_ns FROM ops WHERE name IN (SELECT n FROM names_matching('ops', {{DATALOADER_RE}}));
COMMENT ON TABLE host_activity IS 'One row per host interval that names idle GPU time';
COMMENT ON COLUMN host_activity.rank IS 'the rank';
COMMENT ON COLUMN host_activity.kind IS 'launch_call, launch_op, startup or loader';
COMMENT ON COLUMN host_activity.name IS 'the call, op or range';
COMMENT ON COLUMN host_activity.start_ns IS 'start';
COMMENT ON COLUMN host_activity.end_ns IS 'end';
