-- Module: kernel_launch
-- Every GPU activity's launch and the op that launched it. The launch is the CUDA runtime / driver call with the
-- activity's correlation id (Kineto `cuda_runtime` / `cuda_driver`, nsys CUPTI_ACTIVITY_KIND_RUNTIME). The op link
-- is checked, not taken on trust: an External-id link holds only when that op ran on the launching thread and the
-- launch started inside it (a runtime event's External id may equal its correlation id and name an unrelated op);
-- otherwise the innermost CPU op enclosing the launch on its thread (nsys: NVTX op ranges) is the launcher.

CREATE OR REPLACE TABLE kernel_launch AS
WITH RECURSIVE api AS (
    -- one launching call per correlation id; a driver call under a runtime call shares its id: the outer one
    SELECT source_id, correlation, arg_min(thread, start_ns) AS thread, min(start_ns) AS start_ns,
           arg_min(end_ns, start_ns) AS end_ns, arg_min(name, start_ns) AS name,
           arg_min(external_id, start_ns) AS external_id
    FROM api_calls WHERE correlation IS NOT NULL AND kind IS DISTINCT FROM 'osrt'
    GROUP BY source_id, correlation
), k AS (
    SELECT k.kernel_id, k.source_id, k.rank, a.thread, a.start_ns AS launch_start_ns, a.end_ns AS launch_end_ns,
           a.name AS launch_name, coalesce(k.external_id, a.external_id) AS ext
    FROM kernels k LEFT JOIN api a ON a.source_id = k.source_id AND a.correlation = k.correlation
), ext_ops AS (
    SELECT o.source_id, o.external_id, o.op_id, o.thread, o.start_ns, o.end_ns, o.depth,
           count(*) OVER (PARTITION BY o.source_id, o.external_id) AS n_same
    FROM ops o WHERE o.external_id IS NOT NULL
), by_ext AS (
    SELECT k.kernel_id, arg_max(o.op_id, coalesce(o.depth, 0)) AS op_id, bool_and(k.thread IS NULL) AS unchecked
    FROM k JOIN ext_ops o ON o.source_id = k.source_id AND o.external_id = k.ext
    WHERE (k.thread IS NOT NULL AND o.thread = k.thread AND o.start_ns <= k.launch_start_ns
           AND o.end_ns >= k.launch_start_ns)
       -- no launch record to check against: only an unambiguous id is taken
       OR (k.thread IS NULL AND o.n_same = 1)
    GROUP BY k.kernel_id
), unlinked AS (
    -- the launches no External id links, each looked up on its thread below
    SELECT * FROM k WHERE thread IS NOT NULL AND kernel_id NOT IN (SELECT kernel_id FROM by_ext)
), latest AS (
    -- of the ops that start at one time on a thread (a child often starts in its parent's µs), the innermost: the
    -- latest to start in the nesting order, so that the ASOF join below has one op per start to take; only on the
    -- threads of such launches (none where every launch has its External id: the ops are not sorted for nothing)
    SELECT o.source_id, o.thread, o.start_ns, o.op_id, o.end_ns, o.parent_op_id
    FROM ops o SEMI JOIN unlinked u ON u.source_id = o.source_id AND u.thread = o.thread
    QUALIFY row_number() OVER (PARTITION BY o.source_id, o.thread, o.start_ns
                               ORDER BY o.depth DESC NULLS LAST, o.op_id DESC) = 1
), hit AS (
    -- the latest op on the launching thread that started before the launch …
    SELECT k.kernel_id, k.launch_start_ns, o.op_id, o.end_ns, o.parent_op_id
    FROM unlinked k
    ASOF JOIN latest o ON o.source_id = k.source_id AND o.thread = k.thread AND o.start_ns <= k.launch_start_ns
), up AS (
    -- … or, when it had ended, its nearest ancestor still open at the launch
    SELECT kernel_id, launch_start_ns, op_id, end_ns, parent_op_id, 0 AS lvl FROM hit
    UNION ALL
    SELECT u.kernel_id, u.launch_start_ns, p.op_id, p.end_ns, p.parent_op_id, u.lvl + 1
    FROM up u JOIN ops p ON p.op_id = u.parent_op_id
    WHERE u.end_ns < u.launch_start_ns AND u.lvl < 64
), enclosing AS (
    SELECT kernel_id, arg_min(op_id, lvl) AS op_id FROM up WHERE end_ns >= launch_start_ns GROUP BY kernel_id
)
SELECT k.kernel_id, k.source_id, k.rank, k.thread AS launch_thread, k.launch_start_ns, k.launch_end_ns, k.launch_name,
       coalesce(e.op_id, f.op_id) AS op_id,
       CASE WHEN e.op_id IS NOT NULL AND e.unchecked THEN 'external_id_unchecked'
            WHEN e.op_id IS NOT NULL THEN 'external_id'
            WHEN f.op_id IS NOT NULL THEN 'enclosing' END AS op_link
FROM k LEFT JOIN by_ext e USING (kernel_id) LEFT JOIN enclosing f USING (kernel_id);
COMMENT ON TABLE kernel_launch IS 'One row per GPU activity: the call that launched it and the op it came from';
COMMENT ON COLUMN kernel_launch.kernel_id IS 'kernels.kernel_id';
COMMENT ON COLUMN kernel_launch.source_id IS 'the source';
COMMENT ON COLUMN kernel_launch.rank IS 'the rank';
COMMENT ON COLUMN kernel_launch.launch_thread IS 'host thread of the launching call (NULL: no launch record in the trace)';
COMMENT ON COLUMN kernel_launch.launch_start_ns IS 'start of the launching call (NULL: no launch record)';
COMMENT ON COLUMN kernel_launch.launch_end_ns IS 'end of the launching call';
COMMENT ON COLUMN kernel_launch.launch_name IS 'the launching call (cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, …)';
COMMENT ON COLUMN kernel_launch.op_id IS 'the op that launched it (ops.op_id; copied to kernels.op_id)';
COMMENT ON COLUMN kernel_launch.op_link IS 'how: external_id (the trace''s link, checked against thread and time), external_id_unchecked (no launch record; an unambiguous id), enclosing (the innermost op open on the launching thread), NULL (none)';
