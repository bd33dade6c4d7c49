-- Module: steps
-- Per step: one row per occurrence of an analysed range (a ProfilerStep, or an occurrence of a --range) on each
-- GPU of its rank, measured over the occurrence's own GPU window (range_occurrences: the window the GPU-window rule
-- gives it, SPEC §1). Its utilization, achieved fraction and losses are the sweep's stretches of the range's window
-- (stretches, scope 'range') cut at the occurrence's edges: they add up to the range's numbers when its occurrences
-- tile the GPU timeline, and achieved + losses = 1 for each step. A stretch that straddles an edge is split in
-- proportion to time, its achieved peak-time too (exact when its rate is constant; consecutive stretches of one
-- category merged across an edge carry their mean rate to both sides). Occurrences of one label that overlap on one
-- GPU (a glob matching nested names) share nothing: a stretch counts for the later-starting one, and `covered_ns`
-- says how much of each window its stretches cover. Only ranges that are analysed windows (range_labels.is_window)
-- have stretches, hence steps.
-- Depends: vocab, range_windows, stretches, window_kernels, kernel_class, device_peaks

CREATE OR REPLACE TEMP TABLE _st_occ AS
SELECT label, name, rank, device, occurrence, cpu_start_ns, cpu_end_ns, start_ns, end_ns, launched, window_kind, cut
FROM range_occurrences WHERE is_window AND end_ns > start_ns;

CREATE OR REPLACE TEMP TABLE _st_str AS
SELECT range_name AS label, rank, device, start_ns, end_ns, category, layer, busy, achieved_ns
FROM stretches WHERE scope = 'range' AND end_ns > start_ns AND range_name IN (SELECT DISTINCT label FROM _st_occ);

-- The occurrences' edges that fall strictly inside a stretch (stretches of a window do not overlap: the last one to
-- start before the edge holds it, or none does); the stretch is cut there.
CREATE OR REPLACE TEMP TABLE _st_cut AS
WITH e AS (
    SELECT DISTINCT label, rank, device, t FROM (
        SELECT label, rank, device, start_ns AS t FROM _st_occ UNION ALL SELECT label, rank, device, end_ns FROM _st_occ)
)
SELECT s.label, s.rank, s.device, s.start_ns AS sid, e.t
FROM e ASOF JOIN _st_str s
  ON s.label = e.label AND s.rank IS NOT DISTINCT FROM e.rank AND s.device = e.device AND s.start_ns < e.t
WHERE e.t < s.end_ns;

CREATE OR REPLACE TEMP TABLE _st_piece AS
WITH pts AS (
    SELECT label, rank, device, start_ns AS sid, start_ns AS t FROM _st_str
    UNION ALL SELECT label, rank, device, sid, t FROM _st_cut
), p AS (
    SELECT label, rank, device, sid, t AS ps, lead(t) OVER (PARTITION BY label, rank, device, sid ORDER BY t) AS pe
    FROM pts
)
SELECT p.label, p.rank, p.device, p.ps, coalesce(p.pe, s.end_ns) AS pe, s.category, s.layer, s.busy,
       s.achieved_ns * (coalesce(p.pe, s.end_ns) - p.ps) / (s.end_ns - s.start_ns) AS achieved_ns
FROM p JOIN _st_str s
  ON s.label = p.label AND s.rank IS NOT DISTINCT FROM p.rank AND s.device = p.device AND s.start_ns = p.sid;

-- Each piece to the occurrence it lies in (the last to start at or before it, when the piece ends inside it).
CREATE OR REPLACE TEMP TABLE _st_in AS
SELECT o.label, o.rank, o.device, o.occurrence, p.ps, p.pe, p.category, p.layer, p.busy, p.achieved_ns
FROM _st_piece p ASOF JOIN _st_occ o
  ON o.label = p.label AND o.rank IS NOT DISTINCT FROM p.rank AND o.device = p.device AND o.start_ns <= p.ps
WHERE p.pe <= o.end_ns;

CREATE OR REPLACE TABLE step_losses AS
SELECT label, rank, device, occurrence, category, any_value(layer) AS layer,
       exact_sum((pe - ps) - achieved_ns, {{NS_FIXED_SCALE}}) AS lost_ns
FROM _st_in WHERE category IS NOT NULL GROUP BY label, rank, device, occurrence, category
HAVING exact_sum((pe - ps) - achieved_ns, {{NS_FIXED_SCALE}}) > 0;
COMMENT ON TABLE step_losses IS 'Each step''s loss waterfall: peak-time lost per category in the occurrence''s GPU window';
COMMENT ON COLUMN step_losses.label IS 'range_labels.label (the range pattern)';
COMMENT ON COLUMN step_losses.rank IS 'the rank';
COMMENT ON COLUMN step_losses.device IS 'the GPU';
COMMENT ON COLUMN step_losses.occurrence IS 'range_occurrences.occurrence (0…, by CPU start on its rank)';
COMMENT ON COLUMN step_losses.category IS 'the loss category (vocab.CATEGORIES)';
COMMENT ON COLUMN step_losses.layer IS 'its layer: cluster, pipeline, op, kernel, host, device';
COMMENT ON COLUMN step_losses.lost_ns IS 'peak-time lost in the step to that category; over steps.gpu_ns it is the category''s share of the step';

CREATE OR REPLACE TABLE steps AS
WITH agg AS (
    SELECT label, rank, device, occurrence, sum(pe - ps) AS covered_ns, coalesce(sum(pe - ps) FILTER (WHERE busy), 0) AS busy_ns,
           exact_sum(achieved_ns, {{NS_FIXED_SCALE}}) AS achieved_ns
    FROM _st_in GROUP BY ALL
), top AS (
    SELECT label, rank, device, occurrence, category AS largest_loss, lost_ns AS largest_loss_ns
    FROM (SELECT *, row_number() OVER (PARTITION BY label, rank, device, occurrence ORDER BY lost_ns DESC, category) AS n
          FROM step_losses) WHERE n = 1
), kern AS (
    -- the activities that start in the occurrence, cut to it: its compute-class time and what is unknown of it
    SELECT o.label, o.rank, o.device, o.occurrence,
           sum(least(w.end_ns, o.end_ns) - w.start_ns) FILTER (WHERE w.class IN ('compute', 'memory', 'unknown')) AS kernel_ns,
           sum(least(w.end_ns, o.end_ns) - w.start_ns) FILTER (WHERE w.class = 'unknown') AS unknown_ns,
           sum(least(w.end_ns, o.end_ns) - w.start_ns) FILTER (WHERE w.class IN ('compute', 'memory', 'unknown')
                                                                AND w.flops > 0) AS kernel_ns_with_flops,
           exact_sum(CASE WHEN w.class IN ('compute', 'memory') AND w.flops > 0 AND w.peak_flop_s > 0
                          THEN w.flops * (least(w.end_ns, o.end_ns) - w.start_ns) / w.dur_ns END, 1.0) AS flops
    FROM (SELECT wk.range_name, wk.rank, wk.device, wk.start_ns, wk.end_ns, kc.class, kc.peak_flop_s, k.flops,
                 (k.end_ns - k.start_ns)::DOUBLE AS dur_ns
          FROM window_kernels wk JOIN kernel_class kc USING (kernel_id) JOIN kernels k USING (kernel_id)
          WHERE wk.scope = 'range' AND wk.end_ns > wk.start_ns) w
    ASOF JOIN _st_occ o
      ON o.label = w.range_name AND o.rank IS NOT DISTINCT FROM w.rank AND o.device = w.device AND o.start_ns <= w.start_ns
    WHERE w.start_ns < o.end_ns
    GROUP BY ALL
), med AS (
    -- over the whole steps: a step the recording cut is a lower bound, not a step time
    SELECT label, median(end_ns - start_ns) FILTER (WHERE NOT coalesce(cut, false)) AS median_ns
    FROM _st_occ GROUP BY label
)
SELECT o.label, o.name, o.rank, o.device, o.occurrence, o.cpu_start_ns, o.cpu_end_ns, o.start_ns, o.end_ns,
       o.end_ns - o.start_ns AS gpu_ns, o.cpu_end_ns - o.cpu_start_ns AS cpu_ns, o.window_kind, o.launched,
       coalesce(a.covered_ns, 0) AS covered_ns, coalesce(a.busy_ns, 0) AS busy_ns,
       coalesce(a.busy_ns, 0)::DOUBLE / (o.end_ns - o.start_ns) AS utilization,
       CASE WHEN hp.peak_flop_s IS NOT NULL THEN coalesce(a.achieved_ns, 0) END AS achieved_ns,
       CASE WHEN hp.peak_flop_s IS NOT NULL THEN coalesce(a.achieved_ns, 0) / (o.end_ns - o.start_ns) END
           AS achieved_fraction_of_peak,
       k.flops, coalesce(k.kernel_ns, 0) AS kernel_ns, coalesce(k.kernel_ns_with_flops, 0) AS kernel_ns_with_flops,
       coalesce(k.unknown_ns, 0) AS unknown_ns, t.largest_loss, t.largest_loss_ns, hp.peak_flop_s,
       CASE WHEN NOT coalesce(o.cut, false) THEN (o.end_ns - o.start_ns) / m.median_ns - 1.0 END
           AS excess_over_median, o.cut
FROM _st_occ o
LEFT JOIN agg a ON a.label = o.label AND a.rank IS NOT DISTINCT FROM o.rank AND a.device = o.device
               AND a.occurrence = o.occurrence
LEFT JOIN top t ON t.label = o.label AND t.rank IS NOT DISTINCT FROM o.rank AND t.device = o.device
               AND t.occurrence = o.occurrence
LEFT JOIN kern k ON k.label = o.label AND k.rank IS NOT DISTINCT FROM o.rank AND k.device = o.device
                AND k.occurrence = o.occurrence
LEFT JOIN (SELECT * FROM device_peaks WHERE headline) hp ON hp.rank IS NOT DISTINCT FROM o.rank AND hp.device = o.device
JOIN med m ON m.label = o.label
ORDER BY o.label, o.rank, o.device, o.occurrence;
COMMENT ON TABLE steps IS 'One row per step: an occurrence of an analysed range on one GPU, over its own GPU window';
COMMENT ON COLUMN steps.label IS 'range_labels.label: the --range pattern, or the top-level range name with #N folded to #*';
COMMENT ON COLUMN steps.name IS 'the range''s own name (e.g. ProfilerStep#5)';
COMMENT ON COLUMN steps.rank IS 'the rank';
COMMENT ON COLUMN steps.device IS 'the GPU';
COMMENT ON COLUMN steps.occurrence IS 'occurrence number of the label on its rank (0…, by CPU start)';
COMMENT ON COLUMN steps.cpu_start_ns IS 'the range''s CPU-side start';
COMMENT ON COLUMN steps.cpu_end_ns IS 'the range''s CPU-side end';
COMMENT ON COLUMN steps.start_ns IS 'GPU window start (range_occurrences.start_ns)';
COMMENT ON COLUMN steps.end_ns IS 'GPU window end (range_occurrences.end_ns)';
COMMENT ON COLUMN steps.gpu_ns IS 'GPU step time: the length of its GPU window';
COMMENT ON COLUMN steps.cpu_ns IS 'the length of its CPU interval';
COMMENT ON COLUMN steps.window_kind IS 'gpu (placed by the work it launched), cpu (launched nothing: its CPU interval), gpu_annotation (only a GPU-stream copy)';
COMMENT ON COLUMN steps.launched IS 'GPU activities on this GPU whose launching call starts inside its CPU interval';
COMMENT ON COLUMN steps.covered_ns IS 'the part of the window its stretches cover (gpu_ns unless occurrences of the label overlap)';
COMMENT ON COLUMN steps.busy_ns IS 'time with a kernel or copy resident';
COMMENT ON COLUMN steps.utilization IS 'busy_ns / gpu_ns';
COMMENT ON COLUMN steps.achieved_ns IS 'peak-time achieved in the window (NULL: the GPU has no peak)';
COMMENT ON COLUMN steps.achieved_fraction_of_peak IS 'achieved_ns / gpu_ns: the step''s achieved fraction of peak (each kernel against the peak of its own precision)';
COMMENT ON COLUMN steps.flops IS 'FLOPs of the activities that start in the step (cut to it), NULL when none has an estimate';
COMMENT ON COLUMN steps.kernel_ns IS 'compute-class time (classes compute, memory, unknown) of the activities that start in the step';
COMMENT ON COLUMN steps.kernel_ns_with_flops IS 'the part of kernel_ns with a FLOP estimate';
COMMENT ON COLUMN steps.unknown_ns IS 'the part of kernel_ns in kernels of class unknown (matmul-class work nothing estimates)';
COMMENT ON COLUMN steps.largest_loss IS 'the category that lost the most peak-time in the step';
COMMENT ON COLUMN steps.largest_loss_ns IS 'peak-time it lost';
COMMENT ON COLUMN steps.peak_flop_s IS 'the GPU''s headline peak FLOP/s (device_peaks.headline)';
COMMENT ON COLUMN steps.excess_over_median IS 'gpu_ns over the median whole step of the label (all ranks), minus 1: 0.2 is 20% slower than the median step; NULL for a cut step (its time is a lower bound)';
COMMENT ON COLUMN steps.cut IS 'range_occurrences.cut: the profiler''s recording cut the step (it began before or ended after it), so `gpu_ns` is a lower bound';

CREATE OR REPLACE VIEW step_stats AS
-- the step times over the whole steps (those the recording did not cut), over all when every step was cut; the
-- utilization and achieved fraction over every measured window (a cut step's recorded part is measured too)
WITH s AS (
    SELECT *, NOT coalesce(cut, false) OR NOT bool_or(NOT coalesce(cut, false)) OVER (PARTITION BY label) AS timed
    FROM steps
)
SELECT label, count(*) AS steps, count(*) FILTER (WHERE coalesce(cut, false)) AS cut_steps,
       count(*) FILTER (WHERE timed) AS timed_steps, count(DISTINCT rank) AS ranks,
       count(DISTINCT (rank, device)) AS gpus, max(occurrence) + 1 AS per_rank,
       avg(gpu_ns) FILTER (WHERE timed) AS mean_ns, median(gpu_ns) FILTER (WHERE timed) AS median_ns,
       min(gpu_ns) FILTER (WHERE timed) AS min_ns, max(gpu_ns) FILTER (WHERE timed) AS max_ns,
       coalesce(stddev_samp(gpu_ns) FILTER (WHERE timed), 0) AS stddev_ns,
       coalesce(stddev_samp(gpu_ns) FILTER (WHERE timed), 0) / avg(gpu_ns) FILTER (WHERE timed) AS cv,
       sum(achieved_ns) / sum(gpu_ns) AS achieved_fraction_of_peak, sum(busy_ns) / sum(gpu_ns) AS utilization
FROM s GROUP BY label;
COMMENT ON VIEW step_stats IS 'Per analysed range: its steps'' GPU step times (all ranks and GPUs together)';
COMMENT ON COLUMN step_stats.label IS 'steps.label';
COMMENT ON COLUMN step_stats.steps IS 'step rows (occurrences × GPUs)';
COMMENT ON COLUMN step_stats.cut_steps IS 'steps the profiler''s recording cut (steps.cut)';
COMMENT ON COLUMN step_stats.timed_steps IS 'steps the step-time columns are over: the whole ones, or every step when all were cut';
COMMENT ON COLUMN step_stats.ranks IS 'ranks with steps';
COMMENT ON COLUMN step_stats.gpus IS 'GPUs with steps';
COMMENT ON COLUMN step_stats.per_rank IS 'occurrences on the rank with the most';
COMMENT ON COLUMN step_stats.mean_ns IS 'mean GPU step time (of the timed steps)';
COMMENT ON COLUMN step_stats.median_ns IS 'median GPU step time (of the timed steps)';
COMMENT ON COLUMN step_stats.min_ns IS 'fastest timed step';
COMMENT ON COLUMN step_stats.max_ns IS 'slowest timed step';
COMMENT ON COLUMN step_stats.stddev_ns IS 'sample standard deviation of the timed step times (0 for one step)';
COMMENT ON COLUMN step_stats.cv IS 'stddev_ns / mean_ns: the spread of the step times';
COMMENT ON COLUMN step_stats.achieved_fraction_of_peak IS 'the steps'' achieved peak-time over their windows (NULL when a GPU has no peak)';
COMMENT ON COLUMN step_stats.utilization IS 'the steps'' busy time over their windows';

DROP TABLE _st_occ;
DROP TABLE _st_str;
DROP TABLE _st_cut;
DROP TABLE _st_piece;
DROP TABLE _st_in;
