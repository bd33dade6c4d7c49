-- Module: memory
-- Device memory over time and at its peak, per GPU, from the allocator's own records (memory_events). Two origins:
-- `allocator` (Kineto `[memory]` events of `profile_memory=True`): allocated is what live tensors hold (`Total
-- Allocated`), reserved what the caching allocator holds from the driver (`Total Reserved`), both after each event;
-- traces before torch 1.10 give neither, and allocated is then the running sum of the events' sizes — relative to
-- the profile's start, so memory allocated before it is not counted, and said so. `driver` (Nsight Systems
-- `--cuda-memory-usage=true`): the CUDA driver's allocations and frees, so reserved is the process's device memory
-- as the driver sees it (a caching allocator's segments plus what libraries allocated themselves) and allocated is
-- unknown (NULL: the driver does not see tensors); reserved too is NULL when the report missed allocations (the
-- capture began after the process). The peak is the largest value recorded and the first time it was reached;
-- against the device's memory (devices.memory_bytes) it says how close a rank ran to the limit.

CREATE OR REPLACE VIEW memory_timeline AS
SELECT rank, device, ts_ns,
       CASE WHEN origin = 'driver' THEN total_allocated
            ELSE coalesce(total_allocated,
                          sum(bytes_delta) OVER (PARTITION BY source_id, rank, device ORDER BY ts_ns, addr
                                                 ROWS UNBOUNDED PRECEDING)) END AS allocated_bytes,
       total_reserved AS reserved_bytes,
       CASE WHEN origin = 'driver' THEN total_reserved IS NOT NULL ELSE total_allocated IS NOT NULL END AS absolute,
       bytes_delta,
       coalesce(origin, 'allocator') AS origin
FROM memory_events;
COMMENT ON VIEW memory_timeline IS 'One row per allocator event: the GPU''s allocated and reserved bytes after it';
COMMENT ON COLUMN memory_timeline.rank IS 'the rank';
COMMENT ON COLUMN memory_timeline.device IS 'the GPU';
COMMENT ON COLUMN memory_timeline.ts_ns IS 'when';
COMMENT ON COLUMN memory_timeline.allocated_bytes IS 'bytes held by live tensors after the event (the allocator''s Total Allocated; else the running sum of the events, relative to the profile''s start); NULL for origin driver (unknown)';
COMMENT ON COLUMN memory_timeline.reserved_bytes IS 'bytes the caching allocator holds from the driver after the event (origin driver: the process''s device memory as the driver sees it); NULL: not recorded or unknown';
COMMENT ON COLUMN memory_timeline.absolute IS 'true when the totals are complete (the allocator''s own; driver: every allocation of the process seen); false: allocated is a running sum from the profile''s start (allocator) or reserved unknown (driver)';
COMMENT ON COLUMN memory_timeline.bytes_delta IS 'the event''s size: positive for an allocation, negative for a free';
COMMENT ON COLUMN memory_timeline.origin IS '`allocator` (the framework''s caching allocator, Kineto) or `driver` (CUDA allocations, nsys)';

CREATE OR REPLACE TABLE memory_peaks AS
WITH t AS (SELECT * FROM memory_timeline WHERE rank IS NOT NULL),
pk AS (
    SELECT rank, device, count(*) AS events, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns,
           max(allocated_bytes) AS peak_allocated_bytes, max(reserved_bytes) AS peak_reserved_bytes,
           bool_and(absolute) AS absolute, min(origin) AS origin,
           arg_min(allocated_bytes - bytes_delta, ts_ns) AS allocated_at_start_bytes,
           arg_min(reserved_bytes, ts_ns) AS reserved_at_start_bytes,
           arg_max(allocated_bytes, ts_ns) AS allocated_at_end_bytes
    FROM t GROUP BY rank, device
), reached AS (
    SELECT t.rank, t.device,
           min(t.ts_ns) FILTER (WHERE t.allocated_bytes = pk.peak_allocated_bytes) AS peak_allocated_ns,
           min(t.ts_ns) FILTER (WHERE t.reserved_bytes = pk.peak_reserved_bytes) AS peak_reserved_ns
    FROM t JOIN pk USING (rank, device) GROUP BY t.rank, t.device
), dev AS (
    SELECT rank, device, max(memory_bytes) AS memory_bytes FROM devices GROUP BY rank, device
)
SELECT pk.rank, pk.device, pk.events, pk.first_ns, pk.last_ns, pk.absolute,
       pk.peak_allocated_bytes, reached.peak_allocated_ns, pk.peak_reserved_bytes, reached.peak_reserved_ns,
       CASE WHEN pk.absolute THEN pk.allocated_at_start_bytes END AS allocated_at_start_bytes,
       pk.reserved_at_start_bytes, pk.allocated_at_end_bytes,
       dev.memory_bytes AS device_memory_bytes,
       CASE WHEN pk.absolute AND dev.memory_bytes > 0 THEN pk.peak_allocated_bytes / dev.memory_bytes END
           AS peak_allocated_fraction,
       CASE WHEN dev.memory_bytes > 0 THEN pk.peak_reserved_bytes / dev.memory_bytes END AS peak_reserved_fraction,
       pk.origin
FROM pk JOIN reached USING (rank, device) LEFT JOIN dev USING (rank, device);
COMMENT ON TABLE memory_peaks IS 'One row per GPU with allocator events: its peak allocated and reserved memory, when, and against the device''s memory';
COMMENT ON COLUMN memory_peaks.rank IS 'the rank';
COMMENT ON COLUMN memory_peaks.device IS 'the GPU';
COMMENT ON COLUMN memory_peaks.events IS 'allocator events recorded';
COMMENT ON COLUMN memory_peaks.first_ns IS 'first event';
COMMENT ON COLUMN memory_peaks.last_ns IS 'last event';
COMMENT ON COLUMN memory_peaks.absolute IS 'true when the totals are complete; false: allocated is relative to the profile''s start (torch < 1.10), or (origin driver) reserved is unknown because the capture began after the process';
COMMENT ON COLUMN memory_peaks.peak_allocated_bytes IS 'the most bytes live tensors held';
COMMENT ON COLUMN memory_peaks.peak_allocated_ns IS 'when that peak was first reached';
COMMENT ON COLUMN memory_peaks.peak_reserved_bytes IS 'the most bytes the caching allocator held from the driver (origin driver: the most device memory the process held, libraries'' own allocations included; NULL: not recorded or unknown)';
COMMENT ON COLUMN memory_peaks.peak_reserved_ns IS 'when that peak was first reached';
COMMENT ON COLUMN memory_peaks.allocated_at_start_bytes IS 'allocated before the first event (NULL without the allocator''s totals)';
COMMENT ON COLUMN memory_peaks.reserved_at_start_bytes IS 'reserved after the first event';
COMMENT ON COLUMN memory_peaks.allocated_at_end_bytes IS 'allocated after the last event';
COMMENT ON COLUMN memory_peaks.device_memory_bytes IS 'the device''s memory (devices.memory_bytes); NULL: not in the trace';
COMMENT ON COLUMN memory_peaks.peak_allocated_fraction IS 'peak allocated / device memory (NULL: unknown)';
COMMENT ON COLUMN memory_peaks.peak_reserved_fraction IS 'peak reserved / device memory: how close the rank ran to the limit (NULL: unknown)';
COMMENT ON COLUMN memory_peaks.origin IS '`allocator` (Kineto [memory] events) or `driver` (nsys CUDA allocation records)';
