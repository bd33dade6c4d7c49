-- Module: rank_span
-- A rank's profiled span, defined once: from the first to the last event of that rank in any trace table
-- (kernels and copies, CPU ops, CUDA calls, annotations; Python stack frames left out). Each GPU's whole-profile
-- window (`windows.scope = 'window'`) is its rank's span.

CREATE OR REPLACE VIEW rank_span AS
SELECT rank, min(s) AS start_ns, max(e) AS end_ns FROM (
    SELECT rank, start_ns AS s, end_ns AS e FROM kernels UNION ALL
    SELECT rank, start_ns, end_ns FROM ops UNION ALL
    SELECT rank, start_ns, end_ns FROM api_calls UNION ALL
    SELECT rank, start_ns, end_ns FROM ranges WHERE domain IS DISTINCT FROM 'python'
) GROUP BY rank;
COMMENT ON VIEW rank_span IS 'One row per rank: its profiled span';
COMMENT ON COLUMN rank_span.rank IS 'the rank';
COMMENT ON COLUMN rank_span.start_ns IS 'first event of the rank (kernel, op, CUDA call or annotation)';
COMMENT ON COLUMN rank_span.end_ns IS 'last event end of the rank';
