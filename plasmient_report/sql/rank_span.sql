-- Module: rank_span
-- A rank's profiled span, defined once: from the first to the last event of that rank in any trace table
-- (kernels and copies, CPU ops, CUDA calls, annotations; Python stack frames left out). Each GPU's whole-profile
-- window (`windows.scope = 'window'`) is its rank's span. `rank_span_of` gives the same over other tables of
-- those columns (the align stage reads the store's times through its clock so far).

CREATE OR REPLACE MACRO rank_span_of(kernels_t, ops_t, api_calls_t, ranges_t) AS TABLE
SELECT rank, min(s) AS start_ns, max(e) AS end_ns FROM (
    SELECT rank, start_ns AS s, end_ns AS e FROM query_table(kernels_t) UNION ALL
    SELECT rank, start_ns, end_ns FROM query_table(ops_t) UNION ALL
    SELECT rank, start_ns, end_ns FROM query_table(api_calls_t) UNION ALL
    SELECT rank, start_ns, end_ns FROM query_table(ranges_t) WHERE domain IS DISTINCT FROM 'python'
) GROUP BY rank;
COMMENT ON MACRO TABLE rank_span_of IS 'rank_span_of(''kernels'', ''ops'', ''api_calls'', ''ranges''): one row (rank, start_ns, end_ns) per rank over the four tables or views named';

CREATE OR REPLACE VIEW rank_span AS SELECT * FROM rank_span_of('kernels', 'ops', 'api_calls', 'ranges');
COMMENT ON VIEW rank_span IS 'One row per rank: its profiled span';
COMMENT ON COLUMN rank_span.rank IS 'the rank';
COMMENT ON COLUMN rank_span.start_ns IS 'first event of the rank (kernel, op, CUDA call or annotation)';
COMMENT ON COLUMN rank_span.end_ns IS 'last event end of the rank';
