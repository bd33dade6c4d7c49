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
