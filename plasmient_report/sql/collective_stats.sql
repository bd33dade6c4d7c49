-- Module: collective_stats
-- What the collectives moved and how fast, in NCCL's terms (nccl-tests doc/PERFORMANCE.md), and how late each rank
-- arrives. Time is the transfer part of each operation: its kernel's duration less its wait for peers, the one wait
-- definition of the collectives module (collective_members.wait_ns; for P2P, and operations seen on one rank, the
-- wait cannot be told apart and the whole kernel counts). Algorithm bandwidth algbw = S / t, S the message size as
-- nccl-tests counts it (collectives.bytes: the larger of the input and output buffers); bus bandwidth busbw = algbw ×
-- 2(n−1)/n for all-reduce, × (n−1)/n for all-gather, reduce-scatter, all-to-all, gather and scatter, × 1 for
-- broadcast, reduce and send / recv, n the group's size (collectives.group_size, else the ranks seen in the
-- instance). busbw is measured against one direction of the link the group runs on: the GPU-to-GPU fabric of its
-- GPUs (device_links: NVLink, Infinity Fabric; a mesh counts its links to the n − 1 peers), else their PCIe, when all
-- its ranks are on one host (the traces' host names; without names, assumed when every rank uses another device
-- ordinal, and said so); a group across hosts runs on the network, whose peak no trace gives. A rank's lateness to an
-- operation is how long the first rank to arrive waited for it: the instance's longest wait less its own (0 for the
-- first, the instance's lateness for the last); per step (each occurrence of an analysed range, the library's `steps`,
-- over its GPU window) and rank it is the heatmap of the report.
-- Depends: vocab, collectives, device_links, windows, steps

CREATE OR REPLACE MACRO bus_bandwidth_factor(collective, kind, n) AS
    CASE WHEN n IS NULL OR n < 1 THEN NULL
         WHEN kind = 'all_to_all' OR regexp_matches(coalesce(collective, ''), {{ALL_TO_ALL_RE}}) THEN (n - 1)::DOUBLE / n
         WHEN regexp_matches(coalesce(collective, ''), {{ALL_REDUCE_RE}}) THEN 2.0 * (n - 1) / n
         WHEN regexp_matches(coalesce(collective, ''), {{GATHER_SCATTER_RE}}) THEN (n - 1)::DOUBLE / n
         WHEN kind = 'p2p' OR regexp_matches(coalesce(collective, ''), {{ONE_TO_ONE_RE}}) THEN 1.0
    END;
COMMENT ON MACRO bus_bandwidth_factor IS 'bus_bandwidth_factor(collective, kind, n): busbw / algbw as nccl-tests defines it — 2(n-1)/n all-reduce, (n-1)/n all-gather / reduce-scatter / all-to-all / gather / scatter, 1 broadcast / reduce / send / recv; NULL for anything else (barrier) or an unknown n';

CREATE OR REPLACE TABLE collective_transfers AS
WITH c AS (
    SELECT source_id, kernel_correlation, rank, max(group_size) AS group_size
    FROM collectives GROUP BY source_id, kernel_correlation, rank
), m AS (
    SELECT m.*, c.group_size AS trace_group_size, s.host,
           max(m.wait_ns) OVER (PARTITION BY m.key, m.collective, m.seq) - m.wait_ns AS arrival_lateness_ns
    FROM collective_members m
    LEFT JOIN c ON c.source_id = m.source_id AND c.kernel_correlation = m.kernel_correlation
               AND c.rank IS NOT DISTINCT FROM m.rank
    LEFT JOIN sources s ON s.source_id = m.source_id
), inst AS (
    SELECT key, collective, seq, count(DISTINCT rank) AS seen,
           coalesce(max(trace_group_size), CASE WHEN count(DISTINCT rank) > 1 THEN count(DISTINCT rank) END) AS n,
           CASE WHEN max(trace_group_size) IS NOT NULL THEN 'trace'
                WHEN count(DISTINCT rank) > 1 THEN 'ranks seen' END AS n_source,
           count(DISTINCT host) AS hosts, count(host) = count(*) AS hosts_named,
           count(DISTINCT device) = count(DISTINCT rank) AS devices_differ
    FROM m GROUP BY key, collective, seq
), placed AS (
    SELECT *,
           CASE WHEN n IS NULL OR n < 2 THEN NULL
                WHEN hosts > 1 THEN 'several hosts'
                WHEN seen < n THEN NULL  -- members missing from the inputs: where they ran is unknown
                WHEN hosts_named THEN 'one host'
                WHEN hosts = 0 AND devices_differ THEN 'one host (assumed)'
           END AS placement
    FROM inst
), link AS (
    -- per instance, the slowest member's link: its GPU-to-GPU fabric, else its PCIe
    SELECT p.key, p.collective, p.seq,
           CASE WHEN p.placement = 'several hosts' THEN 'network'
                WHEN bool_and(l.link_gbs IS NOT NULL) THEN any_value(l.link)
                WHEN bool_and(coalesce(l.link_gbs, l.pcie_gbs) IS NOT NULL) THEN any_value(coalesce(l.pcie, l.link))
           END AS link,
           CASE WHEN p.placement LIKE 'one host%' THEN
                min(CASE WHEN l.link_gbs IS NOT NULL
                         THEN l.link_gbs * 1e9 / 2 * CASE WHEN l.link_mesh IS NOT NULL
                                                          THEN least(p.n - 1, l.link_mesh)::DOUBLE / l.link_mesh
                                                          ELSE 1.0 END
                         ELSE l.pcie_gbs * 1e9 / 2 END) END AS link_bytes_s,
           any_value(l.source) AS link_source
    FROM placed p JOIN m USING (key, collective, seq)
    LEFT JOIN device_links l ON l.rank IS NOT DISTINCT FROM m.rank AND l.device = m.device
    GROUP BY p.key, p.collective, p.seq, p.placement, p.n
)
SELECT m.key, m.collective, m.seq, m.kind, m.rank, m.device, m.kernel_id, m.source_id, m.kernel_correlation,
       m.start_ns, m.dur_ns, m.wait_ns,
       m.dur_ns - m.wait_ns AS transfer_ns, m.bytes, p.n AS group_size, p.n_source AS group_size_source,
       p.seen AS ranks_seen, m.kind <> 'p2p' AND p.seen > 1 AS wait_known,
       bus_bandwidth_factor(m.collective, m.kind, p.n) AS busbw_factor,
       CASE WHEN m.bytes > 0 AND m.dur_ns > m.wait_ns THEN m.bytes * 1e9 / (m.dur_ns - m.wait_ns) END AS algbw_bytes_s,
       CASE WHEN m.bytes > 0 AND m.dur_ns > m.wait_ns
            THEN m.bytes * 1e9 / (m.dur_ns - m.wait_ns) * bus_bandwidth_factor(m.collective, m.kind, p.n) END
           AS busbw_bytes_s,
       CASE WHEN m.kind <> 'p2p' AND p.seen > 1 THEN m.arrival_lateness_ns END AS arrival_lateness_ns,
       p.placement, l.link, l.link_bytes_s, l.link_source
FROM m JOIN placed p USING (key, collective, seq)
JOIN link l USING (key, collective, seq);
COMMENT ON TABLE collective_transfers IS 'One row per collective operation on a rank (collective_members): its transfer time, bandwidths, lateness and link';
COMMENT ON COLUMN collective_transfers.key IS 'the instance key (collective_members.key: process group, else group ranks)';
COMMENT ON COLUMN collective_transfers.collective IS 'the collective';
COMMENT ON COLUMN collective_transfers.seq IS 'sequence number in its group';
COMMENT ON COLUMN collective_transfers.kind IS 'all_to_all, p2p or collective';
COMMENT ON COLUMN collective_transfers.rank IS 'the rank';
COMMENT ON COLUMN collective_transfers.device IS 'the GPU';
COMMENT ON COLUMN collective_transfers.kernel_id IS 'its kernel (kernels.kernel_id)';
COMMENT ON COLUMN collective_transfers.source_id IS 'collectives.source_id';
COMMENT ON COLUMN collective_transfers.kernel_correlation IS 'collectives.kernel_correlation (with source_id: the collectives row)';
COMMENT ON COLUMN collective_transfers.start_ns IS 'kernel start';
COMMENT ON COLUMN collective_transfers.dur_ns IS 'kernel duration, waiting included';
COMMENT ON COLUMN collective_transfers.wait_ns IS 'its wait for peers (collective_members.wait_ns)';
COMMENT ON COLUMN collective_transfers.transfer_ns IS 'dur_ns - wait_ns: the data moving (the whole kernel when the wait is not known)';
COMMENT ON COLUMN collective_transfers.bytes IS 'message size S as nccl-tests counts it (collectives.bytes); NULL: the trace does not say';
COMMENT ON COLUMN collective_transfers.group_size IS 'n: ranks in the group (collectives.group_size, else the ranks seen in the instance when more than one)';
COMMENT ON COLUMN collective_transfers.group_size_source IS 'trace (the group size the trace records) or ranks seen';
COMMENT ON COLUMN collective_transfers.ranks_seen IS 'ranks of the instance in the inputs';
COMMENT ON COLUMN collective_transfers.wait_known IS 'true when the wait is measured (a collective seen on two or more ranks); false: transfer_ns includes any wait';
COMMENT ON COLUMN collective_transfers.busbw_factor IS 'busbw / algbw (bus_bandwidth_factor)';
COMMENT ON COLUMN collective_transfers.algbw_bytes_s IS 'algorithm bandwidth: bytes / transfer time, bytes/s';
COMMENT ON COLUMN collective_transfers.busbw_bytes_s IS 'bus bandwidth: algbw x busbw_factor, bytes/s';
COMMENT ON COLUMN collective_transfers.arrival_lateness_ns IS 'how late this rank arrived: the instance''s longest wait less its own (NULL when not measured)';
COMMENT ON COLUMN collective_transfers.placement IS 'one host (host names), one host (assumed: no host names, every rank on another device ordinal), several hosts; NULL: unknown';
COMMENT ON COLUMN collective_transfers.link IS 'the link it runs on: the GPUs'' fabric (NVLink …) or PCIe on one host, network across hosts; NULL: unknown';
COMMENT ON COLUMN collective_transfers.link_bytes_s IS 'one direction of that link, bytes/s (the slowest member''s); NULL: unknown (the network always)';
COMMENT ON COLUMN collective_transfers.link_source IS 'where the link figure comes from (peaks.toml)';

CREATE OR REPLACE TABLE collective_stats AS
SELECT w.scope, w.range_name, t.collective, t.kind, t.key AS process_group, t.group_size,
       any_value(t.group_size_source) AS group_size_source, t.bytes,
       count(*) AS ops, count(DISTINCT t.seq) AS instances, count(DISTINCT t.rank) AS ranks,
       sum(t.dur_ns) AS time_ns, avg(t.dur_ns) AS mean_ns, sum(t.wait_ns) AS wait_ns,
       sum(t.transfer_ns) AS transfer_ns, avg(t.transfer_ns) AS mean_transfer_ns,
       bool_and(t.wait_known) AS wait_known,
       sum(t.bytes) FILTER (WHERE t.algbw_bytes_s IS NOT NULL) * 1e9
           / nullif(sum(t.transfer_ns) FILTER (WHERE t.algbw_bytes_s IS NOT NULL), 0) AS algbw_bytes_s,
       any_value(t.busbw_factor) AS busbw_factor,
       sum(t.bytes) FILTER (WHERE t.algbw_bytes_s IS NOT NULL) * 1e9
           / nullif(sum(t.transfer_ns) FILTER (WHERE t.algbw_bytes_s IS NOT NULL), 0) * any_value(t.busbw_factor)
           AS busbw_bytes_s,
       CASE WHEN count(DISTINCT coalesce(t.link, '?')) = 1 THEN any_value(t.link) END AS link,
       CASE WHEN count(DISTINCT coalesce(t.placement, '?')) = 1 THEN any_value(t.placement) END AS placement,
       CASE WHEN count(t.link_bytes_s) = count(*) THEN min(t.link_bytes_s) END AS link_bytes_s,
       any_value(t.link_source) AS link_source
FROM collective_transfers t JOIN windows w
  ON w.rank IS NOT DISTINCT FROM t.rank AND w.device = t.device AND t.start_ns >= w.start_ns AND t.start_ns < w.end_ns
GROUP BY w.scope, w.range_name, t.collective, t.kind, t.key, t.group_size, t.bytes;
COMMENT ON TABLE collective_stats IS 'Per analysed window, collective, process group, group size and message size: count, time, wait, transfer and NCCL''s bandwidths';
COMMENT ON COLUMN collective_stats.scope IS 'windows.scope';
COMMENT ON COLUMN collective_stats.range_name IS 'windows.range_name';
COMMENT ON COLUMN collective_stats.collective IS 'the collective (allreduce, all_gather, …)';
COMMENT ON COLUMN collective_stats.kind IS 'all_to_all, p2p or collective';
COMMENT ON COLUMN collective_stats.process_group IS 'the process group (the instance key)';
COMMENT ON COLUMN collective_stats.group_size IS 'n, ranks in the group';
COMMENT ON COLUMN collective_stats.group_size_source IS 'trace or ranks seen';
COMMENT ON COLUMN collective_stats.bytes IS 'message size S (nccl-tests), bytes; NULL: unknown';
COMMENT ON COLUMN collective_stats.ops IS 'operations counted: one per rank and instance, starting in the window';
COMMENT ON COLUMN collective_stats.instances IS 'distinct instances (sequence numbers)';
COMMENT ON COLUMN collective_stats.ranks IS 'ranks they ran on';
COMMENT ON COLUMN collective_stats.time_ns IS 'their kernel time, waiting included, summed over ranks';
COMMENT ON COLUMN collective_stats.mean_ns IS 'mean kernel time of one operation';
COMMENT ON COLUMN collective_stats.wait_ns IS 'the part spent waiting for peers';
COMMENT ON COLUMN collective_stats.transfer_ns IS 'the rest: data moving';
COMMENT ON COLUMN collective_stats.mean_transfer_ns IS 'mean transfer time of one operation';
COMMENT ON COLUMN collective_stats.wait_known IS 'true when every operation''s wait is measured; false: transfer includes waiting (P2P, one rank seen) and the bandwidths are lower bounds';
COMMENT ON COLUMN collective_stats.algbw_bytes_s IS 'algorithm bandwidth: their bytes over their transfer time, bytes/s (NULL: no message size)';
COMMENT ON COLUMN collective_stats.busbw_factor IS 'busbw / algbw (bus_bandwidth_factor)';
COMMENT ON COLUMN collective_stats.busbw_bytes_s IS 'bus bandwidth, bytes/s: comparable with the link''s peak in one direction';
COMMENT ON COLUMN collective_stats.link IS 'the link they run on (collective_transfers.link); NULL: unknown or mixed';
COMMENT ON COLUMN collective_stats.placement IS 'one host, one host (assumed), several hosts; NULL: unknown or mixed';
COMMENT ON COLUMN collective_stats.link_bytes_s IS 'one direction of the link, bytes/s; NULL: unknown';
COMMENT ON COLUMN collective_stats.link_source IS 'where the link figure comes from';

CREATE OR REPLACE TABLE collective_lateness AS
WITH t AS (
    SELECT * FROM collective_transfers WHERE arrival_lateness_ns IS NOT NULL
), tl AS (
    SELECT l.label, t.* FROM (SELECT DISTINCT label FROM steps) l, t
), j AS (
    -- each operation to the step of each label whose GPU window holds its start on its rank
    SELECT tl.label, tl.rank, tl.arrival_lateness_ns, tl.wait_ns,
           CASE WHEN tl.start_ns < s.end_ns THEN s.name END AS step,
           CASE WHEN tl.start_ns < s.end_ns THEN s.occurrence END AS step_occurrence
    FROM tl ASOF LEFT JOIN steps s
      ON s.label = tl.label AND s.rank = tl.rank AND s.device = tl.device AND tl.start_ns >= s.start_ns
    UNION ALL
    SELECT NULL, rank, arrival_lateness_ns, wait_ns, NULL, NULL FROM t
)
SELECT label, step, step_occurrence, rank, count(*) AS ops, sum(arrival_lateness_ns) AS lateness_ns,
       max(arrival_lateness_ns) AS max_lateness_ns, sum(wait_ns) AS wait_ns,
       count(*) FILTER (WHERE arrival_lateness_ns > 0 AND wait_ns = 0) AS last_arrivals
FROM j GROUP BY label, step, step_occurrence, rank;
COMMENT ON TABLE collective_lateness IS 'Per step and rank: how late the rank arrived to the step''s collectives (the report''s heatmap); one set of rows per range of steps, and one (label NULL) for the whole profile';
COMMENT ON COLUMN collective_lateness.label IS 'the steps'' range (steps.label: ProfilerStep#*, a --range pattern); NULL: the whole profile, one row per rank';
COMMENT ON COLUMN collective_lateness.step IS 'the step (steps.name, e.g. ProfilerStep#3); NULL: outside that range''s steps (or the whole profile)';
COMMENT ON COLUMN collective_lateness.step_occurrence IS 'its occurrence number on the rank (steps.occurrence)';
COMMENT ON COLUMN collective_lateness.rank IS 'the rank';
COMMENT ON COLUMN collective_lateness.ops IS 'collective operations of the rank in the step whose wait is measured (seen on two or more ranks)';
COMMENT ON COLUMN collective_lateness.lateness_ns IS 'summed lateness: how long the first rank to arrive waited for this one, over the step''s collectives';
COMMENT ON COLUMN collective_lateness.max_lateness_ns IS 'its worst lateness to one collective in the step';
COMMENT ON COLUMN collective_lateness.wait_ns IS 'the rank''s own wait for its peers in the step';
COMMENT ON COLUMN collective_lateness.last_arrivals IS 'collectives of the step it arrived last to (it waited not at all, another waited for it)';
