-- Module: range_windows
-- A range's GPU window follows the work it launched (SPEC §1): an occurrence runs on each GPU of its rank from
-- max(its CPU start, the end of the GPU work launched before it) to max(its CPU end, the end of the last GPU
-- activity it launched). "The work launched before it" is that on the streams the occurrence itself uses — a
-- stream runs its work in order, so the occurrence's own work there waits for it — and, on the GPU's other
-- streams, only until the occurrence's own first activity starts: work on another stream (an all-to-all on a
-- communication stream beside the compute) may overlap the occurrence's without delaying it, and counting it whole
-- would cut the window short of the occurrence's own serial work; while nothing of its own has started, the GPU is
-- still busy with earlier work (an occurrence whose stream waits on another's event starts when that work ends).
-- "Launched by it": the launching runtime call (kernel_launch) starts inside the CPU range, on any thread of the
-- rank; an activity whose launch is not in the trace (launched before the profiler started, or its record lost) is
-- never launched by a range and counts as launched before it — before each occurrence whose own first activity on
-- that GPU it precedes. Consecutive steps thus tile the GPU timeline when the host runs ahead, and keep the GPU's
-- waits on the host (data loading, a sync) in the step that caused them — also when a step's first activity (a
-- prefetch on a side stream) starts while the work launched before it on its compute stream still runs: that
-- activity's time is then measured in the previous step's window. An occurrence that launched nothing on a GPU
-- keeps its CPU interval there. A rank that has only Kineto's GPU-stream copies of the range (no CPU side) keeps
-- those. An activity launched inside two occurrences of one label (a glob matching nested names) is counted for
-- the later-starting one.
-- Depends: range_labels, kernel_launch, intervals

CREATE OR REPLACE TEMP TABLE _range_instances AS
WITH x AS (
    SELECT l.label, l.is_window, r.name, r.rank, r.device AS gpu_device, r.on_gpu, r.start_ns, r.end_ns,
           coalesce(r.cut, false) AS cut, bool_or(NOT r.on_gpu) OVER (PARTITION BY l.label, r.rank) AS has_cpu
    FROM ranges r JOIN range_labels l ON l.name = r.name
    WHERE r.end_ns > r.start_ns AND r.domain IS DISTINCT FROM 'python'
)
SELECT label, is_window, name, rank, gpu_device, on_gpu, start_ns AS cpu_start_ns, end_ns AS cpu_end_ns, cut,
       (row_number() OVER (PARTITION BY label, rank ORDER BY start_ns, end_ns, name) - 1)::INTEGER AS occurrence
FROM x WHERE NOT on_gpu OR NOT has_cpu;

CREATE OR REPLACE TABLE range_launches AS
WITH lab AS (SELECT DISTINCT label, rank FROM _range_instances WHERE NOT on_gpu),
la AS (
    SELECT kl.kernel_id, kl.rank, kl.launch_start_ns, lab.label FROM kernel_launch kl
    JOIN lab ON lab.rank IS NOT DISTINCT FROM kl.rank WHERE kl.launch_start_ns IS NOT NULL
)
SELECT la.label, la.rank, o.occurrence, la.kernel_id
FROM la ASOF JOIN (SELECT * FROM _range_instances WHERE NOT on_gpu) o
  ON o.label = la.label AND o.rank IS NOT DISTINCT FROM la.rank AND o.cpu_start_ns <= la.launch_start_ns
WHERE la.launch_start_ns <= o.cpu_end_ns;
COMMENT ON TABLE range_launches IS 'The GPU activities each range occurrence launched (its launching call starts inside the CPU range)';
COMMENT ON COLUMN range_launches.label IS 'range_labels.label';
COMMENT ON COLUMN range_launches.rank IS 'the rank';
COMMENT ON COLUMN range_launches.occurrence IS 'range_occurrences.occurrence';
COMMENT ON COLUMN range_launches.kernel_id IS 'the activity (kernels.kernel_id)';

CREATE OR REPLACE TABLE range_occurrences AS
WITH occ AS (SELECT * FROM _range_instances), acts AS (
    SELECT k.kernel_id, k.rank, k.device, k.stream, k.start_ns, k.end_ns, kl.launch_start_ns
    FROM kernels k LEFT JOIN kernel_launch kl USING (kernel_id)
), launched_s AS (
    -- per occurrence, GPU and stream: its own activities there
    SELECT r.label, r.rank, r.occurrence, a.device, a.stream, count(*) AS n, min(a.start_ns) AS first_start_ns,
           max(a.end_ns) AS last_end_ns
    FROM range_launches r JOIN acts a USING (kernel_id)
    GROUP BY ALL
), prior AS (
    -- per GPU stream, in launch order: the latest end of everything launched so far
    SELECT rank, device, stream, launch_start_ns,
           max(end_ns) OVER (PARTITION BY rank, device, stream ORDER BY launch_start_ns, end_ns
                             ROWS UNBOUNDED PRECEDING) AS end_before_ns
    FROM acts WHERE launch_start_ns IS NOT NULL
), prior_unlaunched AS (
    -- activities with no launch record, per GPU stream in start order: the latest end of those started so far
    SELECT rank, device, stream, start_ns,
           max(end_ns) OVER (PARTITION BY rank, device, stream ORDER BY start_ns, end_ns
                             ROWS UNBOUNDED PRECEDING) AS end_before_ns
    FROM acts WHERE launch_start_ns IS NULL
), ls0 AS (
    SELECT l.*, o.cpu_start_ns,
           min(l.first_start_ns) OVER (PARTITION BY l.label, l.rank, l.occurrence, l.device) AS occ_first_start_ns
    FROM launched_s l
    JOIN occ o ON o.label = l.label AND o.rank IS NOT DISTINCT FROM l.rank AND o.occurrence = l.occurrence
    WHERE NOT o.on_gpu
), ls1 AS (
    SELECT ls0.*, p.end_before_ns AS launched_before_ns
    FROM ls0 ASOF LEFT JOIN prior p
      ON p.rank IS NOT DISTINCT FROM ls0.rank AND p.device = ls0.device
     AND p.stream IS NOT DISTINCT FROM ls0.stream AND p.launch_start_ns < ls0.cpu_start_ns
), ls AS (
    SELECT ls1.*, greatest(coalesce(ls1.launched_before_ns, 0), coalesce(u.end_before_ns, 0)) AS end_before_ns
    FROM ls1 ASOF LEFT JOIN prior_unlaunched u
      ON u.rank IS NOT DISTINCT FROM ls1.rank AND u.device = ls1.device
     AND u.stream IS NOT DISTINCT FROM ls1.stream AND u.start_ns < ls1.occ_first_start_ns
), launched AS (
    SELECT label, rank, occurrence, device, sum(n) AS n, min(first_start_ns) AS first_start_ns,
           max(last_end_ns) AS last_end_ns, max(end_before_ns) AS end_before_ns
    FROM ls GROUP BY ALL
), prior_all AS (
    -- per GPU, all its streams, in launch order: the latest end of everything launched so far
    SELECT rank, device, launch_start_ns,
           max(end_ns) OVER (PARTITION BY rank, device ORDER BY launch_start_ns, end_ns
                             ROWS UNBOUNDED PRECEDING) AS end_before_ns
    FROM acts WHERE launch_start_ns IS NOT NULL
), prior_unlaunched_all AS (
    SELECT rank, device, start_ns,
           max(end_ns) OVER (PARTITION BY rank, device ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS end_before_ns
    FROM acts WHERE launch_start_ns IS NULL
), og AS (
    SELECT o.*, g.device FROM occ o
    JOIN (SELECT DISTINCT rank, device FROM kernels) g
      ON g.rank IS NOT DISTINCT FROM o.rank AND (NOT o.on_gpu OR o.gpu_device IS NULL OR g.device = o.gpu_device)
), b0 AS (
    SELECT og.*, l.n, l.first_start_ns, l.last_end_ns, coalesce(l.end_before_ns, 0) AS end_before_ns,
           p.end_before_ns AS all_launched_before_ns
    FROM og LEFT JOIN launched l
      ON l.label = og.label AND l.rank IS NOT DISTINCT FROM og.rank AND l.occurrence = og.occurrence AND l.device = og.device
    ASOF LEFT JOIN prior_all p
      ON p.rank IS NOT DISTINCT FROM og.rank AND p.device = og.device AND p.launch_start_ns < og.cpu_start_ns
), b1 AS (
    SELECT b0.*, greatest(coalesce(b0.all_launched_before_ns, 0), coalesce(u.end_before_ns, 0)) AS end_before_all_ns
    FROM b0 ASOF LEFT JOIN prior_unlaunched_all u
      ON u.rank IS NOT DISTINCT FROM b0.rank AND u.device = b0.device AND u.start_ns < b0.first_start_ns
), b AS (
    -- the start: after the work launched before it on its own streams, and after the work on any stream until
    -- its own first activity began (the GPU was busy with earlier work then, on whichever stream: a wait on
    -- another stream's event shows as its first activity starting when that work ends)
    SELECT b1.*, greatest(b1.cpu_start_ns, b1.end_before_ns, least(b1.end_before_all_ns, b1.first_start_ns)) AS gpu_start_ns
    FROM b1
)
SELECT b.label, b.is_window, b.name, b.rank, b.device, b.occurrence, b.cpu_start_ns, b.cpu_end_ns,
       CASE WHEN coalesce(b.n, 0) = 0 THEN b.cpu_start_ns
            -- the spec's start, also when some of its own work (a prefetch on a side stream) began earlier, while the
            -- work launched before it still ran: consecutive steps then tile the GPU (their lengths add up to the span)
            WHEN b.gpu_start_ns < greatest(b.cpu_end_ns, b.last_end_ns) THEN b.gpu_start_ns
            -- (a guard: an occurrence whose start would be its end begins at its own first activity)
            ELSE least(b.gpu_start_ns, b.first_start_ns) END AS start_ns,
       CASE WHEN coalesce(b.n, 0) > 0 THEN greatest(b.cpu_end_ns, b.last_end_ns) ELSE b.cpu_end_ns END AS end_ns,
       coalesce(b.n, 0) AS launched,
       CASE WHEN b.on_gpu THEN 'gpu_annotation' WHEN coalesce(b.n, 0) > 0 THEN 'gpu' ELSE 'cpu' END AS window_kind,
       b.cut
FROM b;
COMMENT ON TABLE range_occurrences IS 'One row per range occurrence and GPU of its rank: its CPU interval and its GPU window';
COMMENT ON COLUMN range_occurrences.label IS 'range_labels.label';
COMMENT ON COLUMN range_occurrences.is_window IS 'range_labels.is_window';
COMMENT ON COLUMN range_occurrences.name IS 'the range''s name';
COMMENT ON COLUMN range_occurrences.rank IS 'the rank';
COMMENT ON COLUMN range_occurrences.device IS 'the GPU';
COMMENT ON COLUMN range_occurrences.occurrence IS 'occurrence number of the label on its rank (0…, by CPU start)';
COMMENT ON COLUMN range_occurrences.cpu_start_ns IS 'the range''s CPU-side start (GPU-stream copy: its start)';
COMMENT ON COLUMN range_occurrences.cpu_end_ns IS 'the range''s CPU-side end';
COMMENT ON COLUMN range_occurrences.start_ns IS 'GPU window start: max(CPU start, end of the work launched before it on the streams it uses, and on the other streams until its own first activity began)';
COMMENT ON COLUMN range_occurrences.end_ns IS 'GPU window end: max(CPU end, end of the last activity it launched)';
COMMENT ON COLUMN range_occurrences.launched IS 'GPU activities on this GPU whose launching call starts inside the CPU range';
COMMENT ON COLUMN range_occurrences.window_kind IS 'gpu (placed by the work it launched), cpu (launched nothing here: its CPU interval), gpu_annotation (only a GPU-stream copy exists)';
COMMENT ON COLUMN range_occurrences.cut IS 'ranges.cut: the profiler''s recording cut its range, so its CPU interval and window end at the recording''s edge and its time is a lower bound';
DROP TABLE _range_instances;
