-- Module: stretches
-- The sweep (SPEC §4), kept: each analysed window of each GPU is cut into stretches where the set of resident
-- kernels and the host's activity are constant. In a busy stretch the active kernels' rates, each a fraction of the
-- peak of its own precision, add up to R; min(R, 1)·Δt is achieved and the rest lost to one category, by the most
-- useful class resident: compute_inefficiency (a compute-bound kernel), unknown_flops (an unknown one), memory_bound,
-- then collective_wait (a communication kernel's wait for its peers), pipeline_bubble (pipeline P2P),
-- collective_transfer, memcpy. An idle stretch (nothing resident) is lost to what the host is doing: startup (a
-- set-up call; or, in the whole profile, before the GPU's first activity when set-up calls fall there),
-- input_bound (inside a DataLoader range), sync_stall (the idle gap began as a host sync blocking on the GPU
-- returned — the queue ran dry behind it), launch_bound (inside a launch call; or anywhere in a gap about one launch long —
-- vocab.LAUNCH_GAP_MAX_NS — in which the host launches: the per-op path of Python, dispatcher and launch), else
-- host_other; but from when the gap's next activity had been launched (its launch call returned), beyond a launch's
-- latency, host_other whatever the host did: the GPU waited on work the trace does not hold, not on the host. On a
-- GPU with no peak, a stretch where a kernel with a FLOP
-- estimate runs has no category (nothing can be said of it); the others are time-based and keep theirs.
-- Consecutive stretches of one category are merged; `losses` and `idle_gaps` are read from here.
-- Depends: vocab, intervals, window_kernels, kernel_class, host_activity, device_peaks, kernel_launch

CREATE OR REPLACE TEMP TABLE _sw_w AS
SELECT row_number() OVER (ORDER BY w.scope, w.range_name, w.rank, w.device, w.start_ns) AS wid, w.*,
       hp.peak_flop_s AS peak
FROM windows w
LEFT JOIN (SELECT * FROM device_peaks WHERE headline) hp ON hp.rank IS NOT DISTINCT FROM w.rank AND hp.device = w.device
WHERE w.end_ns > w.start_ns;

-- Each activity cut to its window; a communication kernel split at start + wait: the first part waits for peers.
-- Class codes: 7 bits per class, packed so that one running sum counts them all.
CREATE OR REPLACE TEMP TABLE _sw_parts AS
WITH k AS (
    SELECT w.wid, w.start_ns AS ws, w.end_ns AS we, k.start_ns AS ks, k.end_ns AS ke, kc.class, kc.wait_ns,
           kc.pipeline, kk.flops,
           CASE WHEN kc.peak_flop_s > 0 AND kk.flops > 0 AND kc.class IN ('compute', 'memory')
                THEN kk.flops / (kk.end_ns - kk.start_ns) / (kc.peak_flop_s / 1e9) END AS rate
    FROM window_kernels k
    JOIN _sw_w w ON w.scope = k.scope AND w.range_name IS NOT DISTINCT FROM k.range_name
                AND w.rank IS NOT DISTINCT FROM k.rank AND w.device = k.device AND w.start_ns = k.window_start_ns
    JOIN kernel_class kc USING (kernel_id)
    JOIN kernels kk USING (kernel_id)
)
SELECT wid, greatest(ks, ws) AS s, least(ks + wait_ns, we) AS e, (1::BIGINT << 28) AS code, 0::BIGINT AS rate
FROM k WHERE class = 'communication' AND wait_ns > 0
UNION ALL
SELECT wid, greatest(ks + CASE WHEN class = 'communication' THEN wait_ns ELSE 0 END, ws), least(ke, we),
       CASE class WHEN 'compute' THEN CASE WHEN rate IS NOT NULL THEN 1::BIGINT ELSE 1::BIGINT << 21 END
                  WHEN 'memory' THEN 1::BIGINT << 7
                  WHEN 'unknown' THEN 1::BIGINT << 14
                  WHEN 'communication' THEN CASE WHEN pipeline THEN 1::BIGINT << 35 ELSE 1::BIGINT << 42 END
                  ELSE 1::BIGINT << 49 END,
       -- rates in fixed point: their running sum is exact, whatever order equal times are added in
       coalesce(round(rate * {{RATE_FIXED_SCALE}})::BIGINT, 0)
FROM k;

-- Busy stretches: where the set of resident activities is constant (one running sum of the packed class counts
-- and one of the rates). This block and the busy islands below are also computed in numpy (sql/native.py:
-- sweep_segments, the same rows from one sort of the cut points); the SQL is the definition it is tested against.
-- native: sweep_segments {
CREATE OR REPLACE TEMP TABLE _sw_seg AS
WITH ev AS (
    SELECT wid, s AS t, code AS dk, rate AS dr FROM _sw_parts WHERE e > s
    UNION ALL SELECT wid, e, -code, -rate FROM _sw_parts WHERE e > s
), agg AS (
    SELECT wid, t, sum(dk)::BIGINT AS dk, sum(dr)::HUGEINT AS dr FROM ev GROUP BY wid, t
), run AS (
    SELECT wid, t, lead(t) OVER c AS t_next, sum(dk) OVER c AS k, sum(dr) OVER c AS r
    FROM agg
    WINDOW c AS (PARTITION BY wid ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT wid, t, t_next,
       (k::BIGINT & 127)::INTEGER AS cb, ((k::BIGINT >> 7) & 127)::INTEGER AS mb,
       ((k::BIGINT >> 14) & 127)::INTEGER AS uk, ((k::BIGINT >> 21) & 127)::INTEGER AS um,
       ((k::BIGINT >> 28) & 127)::INTEGER AS nw, ((k::BIGINT >> 35) & 127)::INTEGER AS pp,
       ((k::BIGINT >> 42) & 127)::INTEGER AS nc, ((k::BIGINT >> 49) & 127)::INTEGER AS cp,
       greatest(r::DOUBLE / {{RATE_FIXED_SCALE}}, 0.0) AS r
FROM run WHERE t_next IS NOT NULL AND t_next > t AND k::BIGINT > 0;

-- Idle gaps: the complement, in each window, of the union of its activities (intervals.sql), each with the sync
-- (if any) whose return began it.
CREATE OR REPLACE TEMP VIEW _sw_parts_v AS SELECT wid AS grp, s AS start_ns, e AS end_ns FROM _sw_parts WHERE e > s;
CREATE OR REPLACE TEMP TABLE _sw_busy AS SELECT grp AS wid, start_ns, end_ns FROM interval_union('_sw_parts_v');
-- }
CREATE OR REPLACE TEMP TABLE _sw_gaps AS
WITH b AS (
    SELECT wid, start_ns, end_ns FROM _sw_busy
    UNION ALL SELECT wid, start_ns, start_ns FROM _sw_w
    UNION ALL SELECT wid, end_ns, end_ns FROM _sw_w
), o AS (
    SELECT wid, lag(end_ns) OVER (PARTITION BY wid ORDER BY start_ns, end_ns) AS gs, start_ns AS ge FROM b
), gw AS (
    SELECT o.wid, o.gs AS start_ns, o.ge AS end_ns, w.scope, w.range_name, w.rank, w.device
    FROM o JOIN _sw_w w USING (wid) WHERE o.gs IS NOT NULL AND o.ge > o.gs
), syncs AS (
    SELECT rank, thread, name, start_ns, end_ns FROM api_calls
    WHERE name IN (SELECT n FROM names_matching('api_calls', {{SYNC_API_RE}})) AND kind IS DISTINCT FROM 'osrt'
), j AS (
    -- the first sync to return once the GPU went idle (or just before): if it was blocking when the GPU went idle
    -- (it began before) and returned inside the gap, the host had blocked on the GPU and the queue ran dry behind
    -- it. One called after the GPU went idle waited for nothing: the gap is what the host did before it.
    SELECT gw.*, y.name AS y_name, y.thread AS y_thread, y.start_ns AS y_start, y.end_ns AS y_end,
           y.end_ns < gw.end_ns AND y.start_ns <= gw.start_ns + {{SYNC_TOLERANCE_NS}} AS blocked
    FROM gw ASOF LEFT JOIN syncs y ON y.rank IS NOT DISTINCT FROM gw.rank AND y.end_ns >= gw.start_ns - {{SYNC_TOLERANCE_NS}}
)
SELECT wid, row_number() OVER (PARTITION BY wid ORDER BY start_ns) AS gap_no, scope, range_name, rank, device,
       start_ns, end_ns, coalesce(blocked, false) AS after_sync,
       CASE WHEN blocked THEN y_name END AS sync_name,
       CASE WHEN blocked THEN y_thread END AS sync_thread,
       CASE WHEN blocked THEN y_start END AS sync_start_ns,
       CASE WHEN blocked THEN y_end END AS sync_end_ns
FROM j;

-- When the activity that ends each gap had been launched (its launch call returned): from then on, beyond a
-- launch's latency, the GPU idled with work queued — waiting on something the trace does not hold, not the host.
CREATE OR REPLACE TEMP TABLE _sw_queued AS
SELECT g.wid, g.gap_no, min(kl.launch_end_ns) AS queued_ns,
       g.end_ns - greatest(g.start_ns, min(kl.launch_end_ns)) > {{LAUNCH_GAP_MAX_NS}} AS pending
FROM _sw_gaps g JOIN kernels k ON k.rank IS NOT DISTINCT FROM g.rank AND k.device = g.device AND k.start_ns = g.end_ns
JOIN kernel_launch kl USING (kernel_id)
GROUP BY g.wid, g.gap_no, g.start_ns, g.end_ns;

-- What the host does inside the gaps. A gap about one launch long (≤ vocab.LAUNCH_GAP_MAX_NS) is named whole, by
-- what the host does anywhere in it (its activity merged per rank and kind: one look-up per kind). A longer gap is
-- cut where the host's activity changes: its host intervals swept with it, packed 15 bits per kind (launch call,
-- launching op, set-up call, loader).
CREATE OR REPLACE TEMP VIEW _sw_host_v AS
SELECT {'rank': rank, 'kind': CASE WHEN kind IN ('launch_call', 'launch_op') THEN 'launch' ELSE kind END} AS grp,
       start_ns, end_ns
FROM host_activity WHERE end_ns > start_ns;
CREATE OR REPLACE TEMP TABLE _sw_hunion AS
SELECT grp.rank AS rank, grp.kind AS kind, start_ns, end_ns FROM interval_union('_sw_host_v');
-- Short gaps (about one launch long) named whole (also computed in numpy: sql/native.py short_gaps).
-- native: short_gaps {
CREATE OR REPLACE TEMP TABLE _sw_short AS
WITH short AS (
    SELECT * FROM _sw_gaps WHERE end_ns - start_ns <= {{LAUNCH_GAP_MAX_NS}}
), sk AS (
    SELECT s.wid, s.gap_no, s.rank, s.start_ns, s.end_ns, s.after_sync, x.kind
    FROM short s CROSS JOIN (VALUES ('launch'), ('startup'), ('loader')) x(kind)
), sj AS (
    -- merged intervals do not overlap: the last one to start before the gap ends overlaps it, or none does
    SELECT sk.*, h.end_ns > sk.start_ns AS present FROM sk ASOF LEFT JOIN _sw_hunion h
      ON h.rank IS NOT DISTINCT FROM sk.rank AND h.kind = sk.kind AND h.start_ns < sk.end_ns
)
SELECT wid, gap_no, start_ns AS t, end_ns AS t_next, 0 AS h_call, 0 AS h_op,
       max(CASE WHEN kind = 'startup' AND present THEN 1 ELSE 0 END) AS h_startup,
       max(CASE WHEN kind = 'loader' AND present THEN 1 ELSE 0 END) AS h_loader,
       start_ns AS gap_start, end_ns - start_ns AS gap_ns, any_value(after_sync) AS after_sync,
       coalesce(bool_or(kind = 'launch' AND present), false) AS gap_launching
FROM sj GROUP BY wid, gap_no, start_ns, end_ns;
-- }
CREATE OR REPLACE TEMP TABLE _sw_idle AS
WITH long AS (
    -- (qcut: from when the gap's next activity sat queued, where it did beyond a launch's latency)
    SELECT g.*, CASE WHEN q.pending THEN greatest(g.start_ns, q.queued_ns) END AS qcut
    FROM _sw_gaps g LEFT JOIN _sw_queued q ON q.wid = g.wid AND q.gap_no = g.gap_no
    WHERE g.end_ns - g.start_ns > {{LAUNCH_GAP_MAX_NS}}
), b AS (
    -- (time bins: each host interval meets the few windows of its bins, not every window of its rank: intervals.sql)
    SELECT * FROM bin_grid('_sw_w')
), wb AS (
    SELECT w.wid, w.rank, w.start_ns, w.end_ns, unnest(bins(w.start_ns, w.end_ns, b.t0, b.bw, b.nmax)) AS bin
    FROM _sw_w w, b
), hb AS (
    SELECT h.rank, h.kind, h.start_ns, h.end_ns, unnest(bins(h.start_ns, h.end_ns, b.t0, b.bw, b.nmax)) AS bin
    FROM host_activity h, b
), h AS (
    SELECT w.wid, greatest(h.start_ns, w.start_ns) AS s, least(h.end_ns, w.end_ns) AS e,
           CASE h.kind WHEN 'launch_call' THEN 1::BIGINT WHEN 'launch_op' THEN 1::BIGINT << 15
                       WHEN 'startup' THEN 1::BIGINT << 30 ELSE 1::BIGINT << 45 END AS code
    FROM hb h JOIN wb w
      ON h.bin = w.bin AND w.rank IS NOT DISTINCT FROM h.rank AND h.start_ns < w.end_ns AND h.end_ns > w.start_ns, b
    WHERE h.bin = greatest(bin_of(h.start_ns, b.t0, b.bw, b.nmax), bin_of(w.start_ns, b.t0, b.bw, b.nmax))
), hi AS (
    -- the host intervals that overlap a long gap (gaps do not overlap: the last to start before the interval ends)
    SELECT h.* FROM h ASOF JOIN long g ON g.wid = h.wid AND g.start_ns < h.e WHERE g.end_ns > h.s AND h.e > h.s
), ev AS (
    SELECT wid, start_ns AS t, 1 AS dg, 0::BIGINT AS dh, gap_no FROM long
    UNION ALL SELECT wid, end_ns, -1, 0::BIGINT, NULL FROM long
    UNION ALL SELECT wid, s, 0, code, NULL FROM hi
    UNION ALL SELECT wid, e, 0, -code, NULL FROM hi
    UNION ALL SELECT wid, qcut, 0, 0::BIGINT, NULL FROM long WHERE qcut IS NOT NULL  -- a cut point only
), agg AS (
    SELECT wid, t, sum(dg)::INTEGER AS dg, sum(dh)::BIGINT AS dh, max(gap_no) AS gap_no FROM ev GROUP BY wid, t
), run AS (
    SELECT wid, t, lead(t) OVER c AS t_next, sum(dg) OVER c AS g, sum(dh) OVER c AS h
    FROM agg WINDOW c AS (PARTITION BY wid ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), seg AS (
    SELECT wid, t, t_next, (h::BIGINT & 32767)::INTEGER AS h_call,
           ((h::BIGINT >> 15) & 32767)::INTEGER AS h_op, ((h::BIGINT >> 30) & 32767)::INTEGER AS h_startup,
           ((h::BIGINT >> 45) & 32767)::INTEGER AS h_loader
    FROM run WHERE g > 0 AND t_next IS NOT NULL AND t_next > t
), long_seg AS (
    SELECT seg.*, g.gap_no, g.start_ns AS gap_start, g.end_ns - g.start_ns AS gap_ns, g.after_sync,
           coalesce(seg.t >= g.qcut, false) AS queued
    FROM seg ASOF JOIN long g ON g.wid = seg.wid AND g.start_ns <= seg.t
)
SELECT wid, gap_no, t, t_next, h_call, h_op, h_startup, h_loader, gap_start, gap_ns, after_sync, gap_launching,
       h_startup > 0 AS gap_setup, false AS queued
FROM _sw_short
UNION ALL
SELECT wid, gap_no, t, t_next, h_call, h_op, h_startup, h_loader, gap_start, gap_ns, after_sync,
       bool_or(h_call > 0 OR h_op > 0) OVER (PARTITION BY wid, gap_no) AS gap_launching,
       -- (set-up calls made while the next activity sat queued held nothing back)
       bool_or(h_startup > 0 AND NOT queued) OVER (PARTITION BY wid, gap_no) AS gap_setup, queued
FROM long_seg;

-- Every stretch, busy and idle, with its category.
CREATE OR REPLACE TEMP TABLE _sw_c AS
SELECT wid, t, t_next, true AS busy, r,
       CASE WHEN um > 0 THEN NULL
            WHEN cb > 0 THEN 'compute_inefficiency'
            WHEN uk > 0 THEN 'unknown_flops'
            WHEN mb > 0 THEN 'memory_bound'
            WHEN nw > 0 THEN 'collective_wait'
            WHEN pp > 0 THEN 'pipeline_bubble'
            WHEN nc > 0 THEN 'collective_transfer'
            ELSE 'memcpy' END AS category
FROM _sw_seg
UNION ALL
SELECT i.wid, i.t, i.t_next, false, 0.0,
       -- idle with the next activity queued (beyond a launch's latency): the GPU waited on work the trace does not
       -- hold, not on anything the host did — no host cause is claimed (the note and PR504 say what it was)
       CASE WHEN i.queued THEN 'host_other'
            WHEN i.h_startup > 0 THEN 'startup'
            WHEN i.h_loader > 0 THEN 'input_bound'
            WHEN i.after_sync THEN 'sync_stall'
            WHEN i.h_call > 0 OR (i.gap_launching AND i.gap_ns <= {{LAUNCH_GAP_MAX_NS}}) THEN 'launch_bound'
            -- the whole profile's time before its GPU's first activity, when the program's CUDA set-up falls in it
            -- (the trace holds the process's start): the program setting up (imports, model building,
            -- compilation), not a loss a steady state repeats; a profile begun mid-run keeps its host causes
            WHEN w.scope = 'window' AND i.gap_start = w.start_ns AND i.gap_setup AND i.gap_ns > {{LAUNCH_GAP_MAX_NS}}
            THEN 'startup'
            ELSE 'host_other' END
FROM _sw_idle i JOIN _sw_w w USING (wid);

-- The islands: consecutive stretches of one category (also computed in numpy: sql/native.py stretch_islands).
-- native: stretch_islands {
CREATE OR REPLACE TEMP TABLE _sw_m AS
WITH l AS (
    -- busy and idle stretches tile each window; busy and idle categories differ: a change of category is a new island
    SELECT *, (category IS DISTINCT FROM lag(category) OVER (PARTITION BY wid ORDER BY t))::INTEGER AS chg FROM _sw_c
), isl AS (
    SELECT *, sum(chg) OVER (PARTITION BY wid ORDER BY t ROWS UNBOUNDED PRECEDING) AS island FROM l
)
SELECT wid, island, min(t) AS start_ns, max(t_next) AS end_ns, any_value(category) AS category,
       any_value(busy) AS busy,
       CASE WHEN any_value(category) IS NOT NULL
            THEN exact_sum(least(r, 1.0) * (t_next - t), {{NS_FIXED_SCALE}}) END AS achieved_ns,
       sum(CASE WHEN r > 1.0 + 1e-9 THEN t_next - t ELSE 0 END) AS capped_ns,
       exact_sum(r * (t_next - t), {{NS_FIXED_SCALE}}) AS uncapped_ns
FROM isl GROUP BY wid, island;
-- }
CREATE OR REPLACE TABLE stretches AS
SELECT w.scope, w.range_name, w.rank, w.device, m.start_ns, m.end_ns, m.category, category_layer(m.category) AS layer,
       m.busy, m.achieved_ns, (m.end_ns - m.start_ns) - m.achieved_ns AS lost_ns, m.capped_ns::BIGINT AS capped_ns,
       m.uncapped_ns, w.start_ns AS window_start_ns
FROM _sw_m m JOIN _sw_w w USING (wid);

CREATE OR REPLACE TABLE idle_gaps AS
SELECT g.* EXCLUDE (wid, gap_no), coalesce(i.launching, false) AS launching, n.queued_ns,
       CASE WHEN n.queued_ns IS NULL THEN NULL
            WHEN g.end_ns - greatest(g.start_ns, n.queued_ns) > {{LAUNCH_GAP_MAX_NS}}
            THEN g.end_ns - greatest(g.start_ns, n.queued_ns) ELSE 0 END AS pending_ns
FROM _sw_gaps g
LEFT JOIN (SELECT wid, gap_start, bool_or(gap_launching) AS launching FROM _sw_idle GROUP BY ALL) i
  ON i.wid = g.wid AND i.gap_start = g.start_ns
LEFT JOIN _sw_queued n ON n.wid = g.wid AND n.gap_no = g.gap_no;

DROP VIEW _sw_parts_v;
DROP VIEW _sw_host_v;
DROP TABLE _sw_hunion;
DROP TABLE _sw_parts;
DROP TABLE _sw_seg;
DROP TABLE _sw_busy;
DROP TABLE _sw_gaps;
DROP TABLE _sw_queued;
DROP TABLE _sw_idle;
DROP TABLE _sw_short;
DROP TABLE _sw_c;
DROP TABLE _sw_m;
DROP TABLE _sw_w;
COMMENT ON TABLE stretches IS 'The sweep''s stretches, consecutive ones of one category merged: achieved and lost peak-time with the cause';
COMMENT ON COLUMN stretches.scope IS 'windows.scope';
COMMENT ON COLUMN stretches.range_name IS 'windows.range_name';
COMMENT ON COLUMN stretches.rank IS 'the rank';
COMMENT ON COLUMN stretches.device IS 'the GPU';
COMMENT ON COLUMN stretches.start_ns IS 'start';
COMMENT ON COLUMN stretches.end_ns IS 'end';
COMMENT ON COLUMN stretches.category IS 'the loss category of its lost time (vocab.CATEGORIES); NULL: a kernel with a FLOP estimate ran on a GPU with no peak, so nothing is said of it';
COMMENT ON COLUMN stretches.layer IS 'the category''s layer: cluster, pipeline, op, kernel, host, device';
COMMENT ON COLUMN stretches.busy IS 'true when a kernel or copy was resident';
COMMENT ON COLUMN stretches.achieved_ns IS 'peak-time achieved: the integral of min(R, 1) dt, R the sum of the resident kernels'' fractions of their own peaks (NULL with no category)';
COMMENT ON COLUMN stretches.lost_ns IS 'peak-time lost: duration - achieved_ns';
COMMENT ON COLUMN stretches.capped_ns IS 'time in it where R exceeded 1 and was capped (an estimate or a peak is wrong)';
COMMENT ON COLUMN stretches.uncapped_ns IS 'the integral of R dt before capping';
COMMENT ON COLUMN stretches.window_start_ns IS 'start of the window interval it belongs to';
COMMENT ON TABLE idle_gaps IS 'One row per idle gap (maximal stretch with nothing resident) of each analysed window, with the sync that began it';
COMMENT ON COLUMN idle_gaps.scope IS 'windows.scope';
COMMENT ON COLUMN idle_gaps.range_name IS 'windows.range_name';
COMMENT ON COLUMN idle_gaps.rank IS 'the rank';
COMMENT ON COLUMN idle_gaps.device IS 'the GPU';
COMMENT ON COLUMN idle_gaps.start_ns IS 'gap start (the window''s start when it begins idle)';
COMMENT ON COLUMN idle_gaps.end_ns IS 'gap end';
COMMENT ON COLUMN idle_gaps.launching IS 'true when the host is inside a launch call or an op that launches at some time in the gap';
COMMENT ON COLUMN idle_gaps.after_sync IS 'true when the first host sync to return from vocab.SYNC_TOLERANCE_NS before the gap''s start on returned inside it and had begun by its start (within the tolerance: it was blocking when the GPU went idle): its idle time not claimed by start-up or data loading is sync_stall';
COMMENT ON COLUMN idle_gaps.sync_name IS 'that sync call';
COMMENT ON COLUMN idle_gaps.sync_thread IS 'its host thread';
COMMENT ON COLUMN idle_gaps.sync_start_ns IS 'its start';
COMMENT ON COLUMN idle_gaps.sync_end_ns IS 'its return';
COMMENT ON COLUMN idle_gaps.queued_ns IS 'when the activity that ends the gap had been launched (its launch call returned; NULL when its launch is not in the trace): from then on, beyond a launch''s latency, the GPU idled with work queued';
COMMENT ON COLUMN idle_gaps.pending_ns IS 'how long the GPU idled with the gap''s next activity queued (end_ns - greatest(start_ns, queued_ns)) when that is more than a launch''s latency (vocab.LAUNCH_GAP_MAX_NS), else 0; NULL without queued_ns. That idle time waited on work the trace does not hold, not on the host';
