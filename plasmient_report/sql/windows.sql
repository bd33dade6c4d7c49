-- Module: windows
-- Fills the store's `windows`: each GPU's whole-profile window (its rank's span, rank_span) and, per requested or
-- top-level range, the union on each GPU of the GPU windows of that rank's occurrences (range_occurrences).
-- Depends: rank_span, range_windows, intervals

DELETE FROM windows;
INSERT INTO windows (scope, range_name, rank, device, start_ns, end_ns, occurrences)
SELECT 'window', NULL, g.rank, g.device, s.start_ns, s.end_ns, 1
FROM (SELECT DISTINCT rank, device FROM kernels) g JOIN rank_span s ON s.rank IS NOT DISTINCT FROM g.rank;
CREATE OR REPLACE TEMP VIEW _range_window_parts AS
SELECT {'label': label, 'rank': rank, 'device': device} AS grp, start_ns, end_ns
FROM range_occurrences WHERE is_window AND end_ns > start_ns;
INSERT INTO windows (scope, range_name, rank, device, start_ns, end_ns, occurrences)
SELECT 'range', grp.label, grp.rank, grp.device, start_ns, end_ns, n FROM interval_union('_range_window_parts');
DROP VIEW _range_window_parts;
