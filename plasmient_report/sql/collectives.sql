-- Module: collectives
-- Communication kernels and collective instances, defined once. A communication kernel is an NCCL / RCCL kernel
-- or, by name, an NVSHMEM / DeepEP / symmetric-memory / custom all-reduce / MSCCL++ one. Its kind: `all_to_all`
-- (an all-to-all by name, or send/recv kernels launched inside an all-to-all op or range: `c10d::alltoall_base_`,
-- `nccl:all_to_all`, an `AllToAll` NVTX range), `p2p` (other send/recv: pipeline traffic), `collective`. An
-- instance is one operation seen on several ranks: the same key (collective_key), collective and sequence number.
-- Its wait — the one definition the waterfall's `collective_wait` and the straggler rule PR101 share — is each
-- member's duration above the instance's shortest one: the last rank to arrive waits least, every other rank spins
-- until it comes (clock-independent; equal to start lateness once the ranks' clocks are aligned by the ends of
-- their collectives, as the align stage does).
-- Depends: vocab, kernel_launch, collective_key

CREATE OR REPLACE TABLE comm_kernels AS
WITH names AS (
    -- is_communication_kernel's pattern read once per distinct name, not per kernel (27 k long templated names:
    -- 26 -> 3 ms on a 100 MiB trace). The name is an aggregate's result (any_value), so the optimizer cannot push
    -- the pattern's filter under the grouping (it does through DISTINCT, a projection or a materialized CTE)
    SELECT any_value(coalesce(name, '')) AS n FROM kernels GROUP BY name
), comm_names AS (
    SELECT n FROM names WHERE is_communication_kernel(NULL, n)
), c AS (
    SELECT k.kernel_id, k.source_id, k.rank, k.device, k.name, k.correlation, kl.launch_thread, kl.launch_start_ns
    FROM kernels k LEFT JOIN kernel_launch kl USING (kernel_id)
    WHERE k.kind = 'nccl' OR coalesce(k.name, '') IN (SELECT n FROM comm_names)
), coll AS (
    SELECT source_id, kernel_correlation, any_value(collective) AS collective FROM collectives
    GROUP BY source_id, kernel_correlation
), a2a_ctx AS (
    SELECT source_id, thread, start_ns, end_ns FROM ops WHERE name IN (SELECT n FROM names_matching('ops', {{ALL_TO_ALL_RE}}))
    UNION ALL
    SELECT source_id, thread, start_ns, end_ns FROM ranges
    WHERE NOT on_gpu AND domain IS DISTINCT FROM 'python' AND regexp_matches(name, {{ALL_TO_ALL_RE}})
), in_a2a AS (
    SELECT DISTINCT c.kernel_id FROM c JOIN a2a_ctx x
      ON x.source_id = c.source_id AND x.thread = c.launch_thread
     AND x.start_ns <= c.launch_start_ns AND x.end_ns >= c.launch_start_ns
)
SELECT c.kernel_id, c.rank, c.device, co.collective,
       CASE WHEN regexp_matches(coalesce(co.collective, ''), {{ALL_TO_ALL_RE}})
                 OR c.kernel_id IN (SELECT kernel_id FROM in_a2a) THEN 'all_to_all'
            WHEN regexp_matches(coalesce(co.collective, ''), {{P2P_COLLECTIVE_RE}})
                 OR regexp_matches(c.name, {{P2P_KERNEL_RE}}) THEN 'p2p'
            ELSE 'collective' END AS kind
FROM c LEFT JOIN coll co ON co.source_id = c.source_id AND co.kernel_correlation = c.correlation;
COMMENT ON TABLE comm_kernels IS 'One row per communication kernel, with what kind of communication it is';
COMMENT ON COLUMN comm_kernels.kernel_id IS 'kernels.kernel_id';
COMMENT ON COLUMN comm_kernels.rank IS 'the rank';
COMMENT ON COLUMN comm_kernels.device IS 'the GPU';
COMMENT ON COLUMN comm_kernels.collective IS 'the collective the trace names for it (collectives.collective), when any';
COMMENT ON COLUMN comm_kernels.kind IS 'all_to_all, p2p (send/recv outside an all-to-all: pipeline traffic) or collective';

CREATE OR REPLACE TABLE collective_members AS
WITH c AS (
    SELECT collective_key(c.process_group, c.group_ranks) AS key, c.collective, c.seq, c.rank, c.device, k.kernel_id,
           c.source_id, c.kernel_correlation,
           c.start_ns, c.end_ns, c.end_ns - c.start_ns AS dur_ns, c.bytes,
           coalesce(ck.kind, CASE WHEN regexp_matches(coalesce(c.collective, ''), {{ALL_TO_ALL_RE}}) THEN 'all_to_all'
                                  WHEN regexp_matches(coalesce(c.collective, ''), {{P2P_COLLECTIVE_RE}}) THEN 'p2p'
                                  ELSE 'collective' END) AS kind
    FROM collectives c
    LEFT JOIN (SELECT * FROM kernels WHERE kernel_id IN (SELECT kernel_id FROM comm_kernels)) k
           ON k.source_id = c.source_id AND k.correlation = c.kernel_correlation
    LEFT JOIN comm_kernels ck USING (kernel_id)
), inst AS (
    SELECT key, collective, seq, count(DISTINCT rank) AS n_ranks, min(dur_ns) AS min_dur_ns FROM c GROUP BY ALL
)
SELECT c.*, i.n_ranks, i.min_dur_ns,
       -- P2P pairs with the peer's opposite operation, not by sequence number: no wait estimate
       CASE WHEN c.kind <> 'p2p' AND i.n_ranks > 1 THEN c.dur_ns - i.min_dur_ns ELSE 0 END AS wait_ns
FROM c JOIN inst i USING (key, collective, seq);
COMMENT ON TABLE collective_members IS 'One row per collective operation on a rank (a collectives row), with its instance and its wait';
COMMENT ON COLUMN collective_members.key IS 'the instance key: process group, else group ranks, else empty';
COMMENT ON COLUMN collective_members.collective IS 'collectives.collective';
COMMENT ON COLUMN collective_members.seq IS 'collectives.seq: the same seq on two ranks is the same operation';
COMMENT ON COLUMN collective_members.rank IS 'the rank';
COMMENT ON COLUMN collective_members.device IS 'the GPU';
COMMENT ON COLUMN collective_members.kernel_id IS 'its kernel (kernels.kernel_id; NULL when not found)';
COMMENT ON COLUMN collective_members.source_id IS 'collectives.source_id';
COMMENT ON COLUMN collective_members.kernel_correlation IS 'collectives.kernel_correlation (with source_id: the collectives row)';
COMMENT ON COLUMN collective_members.start_ns IS 'kernel start';
COMMENT ON COLUMN collective_members.end_ns IS 'kernel end';
COMMENT ON COLUMN collective_members.dur_ns IS 'kernel duration (waiting for peers included)';
COMMENT ON COLUMN collective_members.bytes IS 'message size';
COMMENT ON COLUMN collective_members.kind IS 'all_to_all, p2p or collective (comm_kernels.kind)';
COMMENT ON COLUMN collective_members.n_ranks IS 'ranks seen in the instance';
COMMENT ON COLUMN collective_members.min_dur_ns IS 'the shortest member duration of the instance (the last rank to arrive)';
COMMENT ON COLUMN collective_members.wait_ns IS 'time this rank waited for its peers: dur_ns - min_dur_ns (0 for p2p and instances seen on one rank)';

CREATE OR REPLACE VIEW collective_instances AS
SELECT key, collective, seq, any_value(kind) AS kind, count(DISTINCT rank) AS n_ranks, min(dur_ns) AS min_dur_ns,
       max(wait_ns) AS lateness_ns, arg_min(rank, dur_ns) AS last_rank, min(start_ns) AS first_start_ns,
       max(start_ns) AS last_start_ns, max(bytes) AS bytes
FROM collective_members GROUP BY key, collective, seq;
COMMENT ON VIEW collective_instances IS 'One row per collective instance (key, collective, seq)';
COMMENT ON COLUMN collective_instances.key IS 'process group, else group ranks';
COMMENT ON COLUMN collective_instances.collective IS 'the collective';
COMMENT ON COLUMN collective_instances.seq IS 'sequence number in its group';
COMMENT ON COLUMN collective_instances.kind IS 'all_to_all, p2p or collective';
COMMENT ON COLUMN collective_instances.n_ranks IS 'ranks seen';
COMMENT ON COLUMN collective_instances.min_dur_ns IS 'shortest member duration: the transfer itself';
COMMENT ON COLUMN collective_instances.lateness_ns IS 'how late the last rank arrived: the longest member wait';
COMMENT ON COLUMN collective_instances.last_rank IS 'the rank that arrived last (the one that waited least)';
COMMENT ON COLUMN collective_instances.first_start_ns IS 'earliest member kernel start';
COMMENT ON COLUMN collective_instances.last_start_ns IS 'latest member kernel start';
COMMENT ON COLUMN collective_instances.bytes IS 'message size';

CREATE OR REPLACE VIEW pipeline_schedule AS
SELECT count(DISTINCT rank) AS stages, count(DISTINCT rank) >= 2 AS found
FROM comm_kernels WHERE kind = 'p2p';
COMMENT ON VIEW pipeline_schedule IS 'Whether the run is pipeline-parallel: point-to-point send/recv (outside all-to-alls) on two or more ranks. Only then is P2P time a pipeline bubble';
COMMENT ON COLUMN pipeline_schedule.stages IS 'ranks with pipeline P2P kernels';
COMMENT ON COLUMN pipeline_schedule.found IS 'true when a pipeline schedule is found (two or more stages)';
