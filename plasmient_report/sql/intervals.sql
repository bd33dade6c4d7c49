-- Module: intervals
-- Interval union, written once ("gaps and islands"): the overlapping or touching intervals of each group merged
-- into maximal islands. The input is a table or view with columns `grp` (any type; a STRUCT for composite keys),
-- `start_ns`, `end_ns`; the output has one row per island.

CREATE OR REPLACE MACRO interval_union(tbl) AS TABLE
WITH s AS (
    SELECT grp, start_ns, end_ns,
           max(end_ns) OVER (PARTITION BY grp ORDER BY start_ns, end_ns
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM query_table(tbl)
    WHERE end_ns >= start_ns
), g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY grp ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM s
)
SELECT grp, min(start_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS n FROM g GROUP BY grp, island;
COMMENT ON MACRO TABLE interval_union IS 'interval_union(''view''): one row (grp, start_ns, end_ns, n) per island of the overlapping or touching intervals (grp, start_ns, end_ns) of each group; n = intervals merged';

-- Time bins for joining many intervals with many windows (a profile's steps): a hash join of every interval with
-- every window of its rank, then the overlap test, costs intervals × windows; instead each side is repeated in
-- the bins it covers (`bins`, the last one `nmax`: an interval reaching beyond the windows stops there), the join
-- is on the bin as well, and a pair is kept in its first common bin only (`bin_of` of the later start), once.
-- `bin_grid('windows')`: the bins' origin t0, width bw and last bin nmax: 4,096 bins over the windows' span.
CREATE OR REPLACE MACRO bin_grid(tbl) AS TABLE
WITH s AS (SELECT min(start_ns) AS t0, greatest((max(end_ns) - min(start_ns)) // 4096, 1) AS bw, max(end_ns) AS hi
           FROM query_table(tbl) WHERE end_ns > start_ns)
SELECT t0, bw, (hi - 1 - t0) // bw AS nmax FROM s;
CREATE OR REPLACE MACRO bin_of(t, t0, bw, nmax) AS least(greatest(t - t0, 0) // bw, nmax);
CREATE OR REPLACE MACRO bins(s, e, t0, bw, nmax) AS
    generate_series(bin_of(s, t0, bw, nmax), bin_of(greatest(e - 1, s), t0, bw, nmax));
COMMENT ON MACRO TABLE bin_grid IS 'bin_grid(''view''): one row (t0, bw, nmax): 4,096 time bins (each at least 1 ns) over the span of the view''s intervals (start_ns, end_ns)';
COMMENT ON MACRO bin_of IS 'bin_of(t, t0, bw, nmax): the bin of time t (bins of width bw from t0, clamped to [0, nmax])';
COMMENT ON MACRO bins IS 'bins(s, e, t0, bw, nmax): the bins the interval [s, e) covers (a point s: its bin), as a list to unnest';
