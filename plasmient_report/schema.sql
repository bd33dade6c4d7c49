-- The store: every parser fills these tables; every later stage reads only them.
-- All *_ns columns are int64 UTC epoch nanoseconds after alignment (SPEC §3), on the clock of the `clock` table.
-- Every table and column carries a COMMENT: docs/schema.md is generated from them
-- (`python -m plasmient_report.schema_doc > docs/schema.md`; tests/test_schema_doc.py checks the two agree).

CREATE TABLE IF NOT EXISTS sources (
    source_id             INTEGER PRIMARY KEY,
    path                  VARCHAR NOT NULL,
    format                VARCHAR NOT NULL,
    format_version        VARCHAR,
    host                  VARCHAR,
    rank                  INTEGER,
    rank_method           VARCHAR,
    world_size            INTEGER,
    clock_anchor          VARCHAR,
    base_time_ns          BIGINT,
    offset_ns             BIGINT DEFAULT 0,
    offset_method         VARCHAR,
    offset_uncertainty_ns BIGINT,
    sha256                VARCHAR,
    size_bytes            BIGINT,
    events                BIGINT,
    first_ns              BIGINT,
    last_ns               BIGINT,
    notes                 VARCHAR,
    time_zone             VARCHAR,
    sample_period_ns      BIGINT,
    incomplete            VARCHAR,
    dropped_events        BIGINT
);
COMMENT ON TABLE sources IS 'One row per input file';
COMMENT ON COLUMN sources.source_id IS 'id of the input within this run (0…)';
COMMENT ON COLUMN sources.path IS 'the input path as given';
COMMENT ON COLUMN sources.format IS '`kineto`, `nsys-sqlite`, `nsys-parquetdir` (`nsys export --type parquetdir`), `nsys-arrow` (`--type arrowdir` folder or `--type arrow` stream; all three nsys exports fill the same rows); counter logs `nvml-csv`, `nvidia-smi-dmon`, `nvidia-smi-query`, `dcgmi-dmon`, `dcgm-exporter`; `ncu-csv` (Nsight Compute)';
COMMENT ON COLUMN sources.format_version IS 'what the file says of its version (`kineto schema 1`, `(no baseTimeNanoseconds)` for old traces; `nsys 2025.3.2.0 (schema 3.20.3)`)';
COMMENT ON COLUMN sources.host IS 'host name when the trace carries it';
COMMENT ON COLUMN sources.rank IS 'rank of this source';
COMMENT ON COLUMN sources.rank_method IS 'how the rank was found: `distributedInfo`, `filename` (`rank-3`, `rank3`), `order` (input order), `renumbered` (clash); nsys: `env:RANK` / `env:PMI_RANK` / `env:SLURM_PROCID` … (the captured environment), `multi` (a report of several GPU processes: each row carries its process''s rank); `counters` for counter logs and Nsight Compute files (not ranks: matched to trace GPUs by the align stage)';
COMMENT ON COLUMN sources.world_size IS 'world size from `distributedInfo`; nsys: the number of GPU processes, or `WORLD_SIZE` / `PMI_SIZE` / `SLURM_NTASKS` from the environment';
COMMENT ON COLUMN sources.clock_anchor IS '`native` (Kineto baseTimeNanoseconds; nsys `TARGET_INFO_SESSION_START_TIME.utcEpochNs`, or a time-normalised export; NVML CSV `wall_ns`; Prometheus query JSON), `epoch_us` (old traces: ts already epoch µs), `relative` (no anchor: times are not UTC); counter logs: `anchored` (local time read in `time_zone`), `prefixed` (an epoch/ISO prefix per line or scrape), `synthesized` (no time in the log: file mtime − k·period, low confidence); `none` (Nsight Compute: no times)';
COMMENT ON COLUMN sources.base_time_ns IS 'the anchor added to source times';
COMMENT ON COLUMN sources.offset_ns IS 'clock offset added to every time of this source after its anchor (`corrected = anchored + offset_ns`): a copy of `clock.offset_ns`, the align stage''s record';
COMMENT ON COLUMN sources.offset_method IS 'how the offset was found: a copy of `clock.method`';
COMMENT ON COLUMN sources.offset_uncertainty_ns IS 'uncertainty of the source''s absolute time: a copy of `clock.uncertainty_ns`';
COMMENT ON COLUMN sources.sha256 IS 'SHA-256 of the input file (batch resumes by it)';
COMMENT ON COLUMN sources.size_bytes IS 'input file size';
COMMENT ON COLUMN sources.events IS 'number of trace events in the file';
COMMENT ON COLUMN sources.first_ns IS 'first kernel start of this source (counter logs: first sample start)';
COMMENT ON COLUMN sources.last_ns IS 'last kernel end of this source (counter logs: last sample end)';
COMMENT ON COLUMN sources.notes IS 'what the parser noticed (ROCm trace, leniently read args, malformed lines skipped and counted, columns not read, the time zone assumed, host events cut to the profiler''s recording, …)';
COMMENT ON COLUMN sources.time_zone IS 'local-time logs (nvidia-smi, ISO prefixes without zone): the IANA zone their times were read in (`--tz`, else this machine''s)';
COMMENT ON COLUMN sources.sample_period_ns IS 'counter logs: the effective sampling period — how often the values change (NVML refreshes utilization every ~200 ms on an H200 however often it is polled)';
COMMENT ON COLUMN sources.incomplete IS 'what the recorder itself says it lost, `; `-separated: Kineto''s log in the trace (`CUPTI stopped early` — its activity buffer filled up —, `N dropped records`), nsys''s warnings in `DIAGNOSTIC_EVENT` (`Not all CUDA events might have been collected.`, dropped records, buffer overflows); NULL when it says nothing';
COMMENT ON COLUMN sources.dropped_events IS 'the number of events the recorder says it dropped, when it gives one';

CREATE TABLE IF NOT EXISTS clock (
    source_id           INTEGER PRIMARY KEY,
    offset_ns           BIGINT NOT NULL,
    method              VARCHAR NOT NULL,
    uncertainty_ns      BIGINT,
    reference_source_id INTEGER
);
COMMENT ON TABLE clock IS 'One row per input: its clock record, written by the align stage (SPEC §3). Each step refines the record (the anchor, `--offset`, ranks aligned on the ends of their collectives, counter logs placed by correlation); then every time column of the source''s rows is moved by offset_ns, once. All times in the store are on this clock';
COMMENT ON COLUMN clock.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN clock.offset_ns IS 'ns added to every time of this input (after its anchor) to put it on the common clock';
COMMENT ON COLUMN clock.method IS 'how: the anchor kind (offset 0: its own clock kept), `forced` (`--offset`), `collectives` (ranks: ends of the same collective made to coincide), `correlation` (counter log shifted to the trace''s busy time), `zone` (a jump of whole quarter-hours: a log read in the wrong time zone; the correlation refines it when it can)';
COMMENT ON COLUMN clock.uncertainty_ns IS 'uncertainty of the input''s absolute time: 1 µs for native trace anchors; for `collectives`, the median residual of collective ends, at least 50 µs (NCCL''s own spread of ends between ranks, which ends cannot see below); one effective sampling period (`sources.sample_period_ns`) for counter logs; 0 for `forced`; NULL when unknown (synthesized, relative)';
COMMENT ON COLUMN clock.reference_source_id IS '`collectives`: the input this one was aligned to (NULL otherwise)';

CREATE TABLE IF NOT EXISTS devices (
    source_id          INTEGER,
    rank               INTEGER,
    device             INTEGER,
    gpu_uuid           VARCHAR,
    bus_id             VARCHAR,
    name               VARCHAR,
    sm_count           INTEGER,
    memory_bytes       BIGINT,
    compute_capability VARCHAR,
    vendor             VARCHAR
);
COMMENT ON TABLE devices IS 'One row per GPU seen';
COMMENT ON COLUMN devices.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN devices.rank IS 'its rank (counter logs: the trace GPU it was matched to)';
COMMENT ON COLUMN devices.device IS 'device ordinal in that process, as `kernels.device` (nsys: CUPTI `deviceId`; the physical GPU behind it comes from `TARGET_INFO_CUDA_DEVICE(pid, cudaId → gpuId)`, else `TARGET_INFO_GPU.cuDevice`, else the host''s one GPU; with none of those, only the model: the host''s GPUs'' when they are one model, else that of `TARGET_INFO_GPU.id = deviceId` as nsys''s own reports join, said in the notes. Kineto: one row per device id GPU work ran on, described by the `deviceProperties` entry of that id, else — ROCm traces number GPUs after the CPU agents, device 2 or 9 with one entry of id 0 — by the single entry or the one all entries agree on)';
COMMENT ON COLUMN devices.gpu_uuid IS 'GPU identity when the source has it (for matching counter logs), as nvidia-smi prints it (`GPU-963dfaf6-…`)';
COMMENT ON COLUMN devices.bus_id IS 'PCI bus id as the source writes it (nsys `0000:00:06.0`)';
COMMENT ON COLUMN devices.name IS 'device name as the trace gives it (`NVIDIA H200`) — matched against the peak table. A device the trace does not name, or names generically (`""`, `AMD Radeon Graphics`), is identified from its compute capability, SM/CU count and memory against the peak table and gets that entry''s name (the source''s notes say so; when several entries with different peaks fit, the name stays and the notes list them)';
COMMENT ON COLUMN devices.sm_count IS 'streaming multiprocessors';
COMMENT ON COLUMN devices.memory_bytes IS 'device memory';
COMMENT ON COLUMN devices.compute_capability IS '`9.0`';
COMMENT ON COLUMN devices.vendor IS '`NVIDIA` / `AMD` when known';

CREATE TABLE IF NOT EXISTS kernels (
    kernel_id    BIGINT,
    source_id    INTEGER,
    rank         INTEGER,
    device       INTEGER,
    stream       BIGINT,
    start_ns     BIGINT,
    end_ns       BIGINT,
    raw_start    DOUBLE,
    name         VARCHAR,
    kind         VARCHAR,
    correlation  BIGINT,
    external_id  BIGINT,
    grid_x INTEGER, grid_y INTEGER, grid_z INTEGER,
    block_x INTEGER, block_y INTEGER, block_z INTEGER,
    regs         INTEGER,
    smem         BIGINT,
    copy_kind    VARCHAR,
    bytes        DOUBLE,
    op_id        BIGINT,
    flops_op_id  BIGINT,
    flops        DOUBLE,
    flops_source VARCHAR
);
COMMENT ON TABLE kernels IS 'One row per GPU activity (kernel, memcpy, memset)';
COMMENT ON COLUMN kernels.kernel_id IS 'unique id in the run';
COMMENT ON COLUMN kernels.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN kernels.rank IS 'the rank it ran on';
COMMENT ON COLUMN kernels.device IS 'the GPU: CUDA device ordinal as the process saw it';
COMMENT ON COLUMN kernels.stream IS 'CUDA stream';
COMMENT ON COLUMN kernels.start_ns IS 'execution start';
COMMENT ON COLUMN kernels.end_ns IS 'execution end';
COMMENT ON COLUMN kernels.raw_start IS 'start in the source''s own unit (Kineto µs, nsys ns since capture start)';
COMMENT ON COLUMN kernels.name IS 'kernel name (demangled) or `Memcpy HtoD (Pageable -> Device)` / `Memset (Device)`';
COMMENT ON COLUMN kernels.kind IS '`compute`, `nccl` (NCCL/RCCL collective or P2P kernel), `memcpy`, `memset`';
COMMENT ON COLUMN kernels.correlation IS 'CUDA correlation id, joins the launching `api_calls` row (same source). CUPTI ids are per process: in an nsys report of several GPU processes it is `pid · 2³² + correlationId`, so it stays unique in the source';
COMMENT ON COLUMN kernels.external_id IS 'Kineto External id, joins the op that launched it';
COMMENT ON COLUMN kernels.grid_x IS 'launch grid, x';
COMMENT ON COLUMN kernels.grid_y IS 'launch grid, y';
COMMENT ON COLUMN kernels.grid_z IS 'launch grid, z';
COMMENT ON COLUMN kernels.block_x IS 'block size, x';
COMMENT ON COLUMN kernels.block_y IS 'block size, y';
COMMENT ON COLUMN kernels.block_z IS 'block size, z';
COMMENT ON COLUMN kernels.regs IS 'registers per thread';
COMMENT ON COLUMN kernels.smem IS 'shared memory per block (bytes)';
COMMENT ON COLUMN kernels.copy_kind IS 'for memcpy: `HtoD`, `DtoH`, `DtoD`, `PtoP`, `UVM HtoD`, …; nsys adds the host side''s memory kind: `HtoD (Pageable)`, `DtoH (Pinned)` (from `srcKind` / `dstKind`)';
COMMENT ON COLUMN kernels.bytes IS 'bytes moved: memcpy/memset as traced; compute kernels share their op''s byte model by duration (estimates implying more than 12 TB/s, 1.5x the fastest HBM in the peak table, are dropped)';
COMMENT ON COLUMN kernels.op_id IS 'the op that launched it (`ops.op_id`): the trace''s External-id link when that op ran on the launching thread and the launch started inside it, else the innermost op enclosing the launch on its thread (`kernel_launch.op_link` says which)';
COMMENT ON COLUMN kernels.flops_op_id IS 'the op that owns its FLOPs: the outermost op with a FLOP figure open at launch. Its FLOPs are split by duration over its matmul-like kernels; its other kernels (helpers: split-K reductions, attention''s dO·O) carry none of them';
COMMENT ON COLUMN kernels.flops IS 'FLOPs attributed to this kernel (SPEC §4), written once by the measure stage (`kernel_flops.py`): Nsight Compute, else `--model-flops`, else the owning op''s share';
COMMENT ON COLUMN kernels.flops_source IS '`op` (the trace''s `flops` arg), `model` (shape model in `flops.py`), `ncu`, `user`, or NULL';

CREATE TABLE IF NOT EXISTS ops (
    source_id    INTEGER,
    rank         INTEGER,
    pid          BIGINT,
    thread       BIGINT,
    start_ns     BIGINT,
    end_ns       BIGINT,
    raw_start    DOUBLE,
    name         VARCHAR,
    op_id        BIGINT,
    external_id  BIGINT,
    parent_op_id BIGINT,
    depth        INTEGER,
    seq          BIGINT,
    input_dims   VARCHAR,
    input_types  VARCHAR,
    concrete_inputs VARCHAR,
    flops        DOUBLE,
    flops_source VARCHAR,
    bytes        DOUBLE,
    precision    VARCHAR
);
COMMENT ON TABLE ops IS 'One row per CPU op (`cpu_op`) or NVTX op range';
COMMENT ON COLUMN ops.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN ops.rank IS 'the rank';
COMMENT ON COLUMN ops.pid IS 'host process';
COMMENT ON COLUMN ops.thread IS 'host thread';
COMMENT ON COLUMN ops.start_ns IS 'start';
COMMENT ON COLUMN ops.end_ns IS 'end';
COMMENT ON COLUMN ops.raw_start IS 'start in the source''s own unit';
COMMENT ON COLUMN ops.name IS '`aten::mm`, `autograd::engine::evaluate_function: MmBackward0`, … (nsys: the bare name from the `emit_nvtx` text `aten::mm, seq = 12, op_id = 345, sizes = […]`)';
COMMENT ON COLUMN ops.op_id IS 'unique id in the run';
COMMENT ON COLUMN ops.external_id IS 'Kineto External id (NULL for nsys: kernels link to NVTX ops through the launch''s correlation, thread and time)';
COMMENT ON COLUMN ops.parent_op_id IS 'the enclosing op on its thread';
COMMENT ON COLUMN ops.depth IS 'nesting on its thread (0 = top level)';
COMMENT ON COLUMN ops.seq IS 'autograd sequence number';
COMMENT ON COLUMN ops.input_dims IS 'the trace''s `Input Dims`, as JSON text (nsys `emit_nvtx(record_shapes=True)`: from `sizes = [[…]]`, the same JSON)';
COMMENT ON COLUMN ops.input_types IS 'the trace''s `Input type`, as JSON text (NULL for nsys: no dtypes exist there, so the peak precision is assumed — bf16 — unless `--peak-precision` says otherwise)';
COMMENT ON COLUMN ops.concrete_inputs IS 'the trace''s `Concrete Inputs`, as JSON text (NULL for nsys)';
COMMENT ON COLUMN ops.flops IS 'FLOPs of the op (from the trace, else the model)';
COMMENT ON COLUMN ops.flops_source IS '`op` or `model`';
COMMENT ON COLUMN ops.bytes IS 'DRAM bytes the op moves, a model: matmul-like ops read each operand once and write the output once (`flops.op_bytes`); ops that launched kernels otherwise read each tensor input once and write one output the size of the first (`flops.op_traffic_bytes`; in-place ops read and write the first input)';
COMMENT ON COLUMN ops.precision IS 'precision of a matmul-like op from its input dtype (`bf16`, `fp32`, …)';

CREATE TABLE IF NOT EXISTS api_calls (
    source_id   INTEGER,
    rank        INTEGER,
    pid         BIGINT,
    thread      BIGINT,
    start_ns    BIGINT,
    end_ns      BIGINT,
    name        VARCHAR,
    kind        VARCHAR,
    correlation BIGINT,
    external_id BIGINT,
    cbid        INTEGER
);
COMMENT ON TABLE api_calls IS 'One row per CUDA runtime/driver call (and, from nsys, per OS runtime call). `osrt` rows come from nsys `OSRT_API` (`--trace=osrt`): `pthread_cond_wait`, `read`, `poll`, `ioctl`, `sem_timedwait`, … with no correlation; only the outermost call of a nested stack (`nestingLevel` 0), only of the GPU processes (the ranks), and only inside the span of that process''s CUDA calls and GPU work (start-up and shutdown are left out)';
COMMENT ON COLUMN api_calls.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN api_calls.rank IS 'the rank';
COMMENT ON COLUMN api_calls.pid IS 'host process';
COMMENT ON COLUMN api_calls.thread IS 'the OS thread id (nsys: the low 24 bits of `globalTid`, the same numbering as `ops.thread`)';
COMMENT ON COLUMN api_calls.start_ns IS 'start';
COMMENT ON COLUMN api_calls.end_ns IS 'end';
COMMENT ON COLUMN api_calls.name IS '`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaStreamSynchronize`, … (nsys names lose their `_v7000` version suffix)';
COMMENT ON COLUMN api_calls.kind IS '`runtime` / `driver` (nsys `eventClass` 0/1); `osrt` for nsys OS runtime calls';
COMMENT ON COLUMN api_calls.correlation IS 'CUDA correlation id: joins `kernels` (same source)';
COMMENT ON COLUMN api_calls.external_id IS 'Kineto External id';
COMMENT ON COLUMN api_calls.cbid IS 'CUPTI callback id (NULL for nsys)';

CREATE TABLE IF NOT EXISTS syncs (
    source_id   INTEGER,
    rank        INTEGER,
    device      INTEGER,
    stream      BIGINT,
    start_ns    BIGINT,
    end_ns      BIGINT,
    kind        VARCHAR,
    correlation BIGINT
);
COMMENT ON TABLE syncs IS 'One row per GPU-side synchronization record (Kineto `cuda_sync`, nsys `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`)';
COMMENT ON COLUMN syncs.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN syncs.rank IS 'the rank';
COMMENT ON COLUMN syncs.device IS 'the GPU';
COMMENT ON COLUMN syncs.stream IS 'CUDA stream';
COMMENT ON COLUMN syncs.start_ns IS 'start';
COMMENT ON COLUMN syncs.end_ns IS 'end';
COMMENT ON COLUMN syncs.kind IS '`Stream Sync`, `Event Sync`, `Context Sync`, … (nsys `syncType` 1–4 → `Event Sync`, `Stream Wait Event`, `Stream Sync`, `Context Sync`)';
COMMENT ON COLUMN syncs.correlation IS 'correlation id of the synchronizing call';

CREATE TABLE IF NOT EXISTS profiler_overhead (
    source_id   INTEGER,
    rank        INTEGER,
    name        VARCHAR,
    start_ns    BIGINT,
    end_ns      BIGINT
);
COMMENT ON TABLE profiler_overhead IS 'One row per overhead record on the host (Kineto `overhead` events: CUPTI''s overhead records, on no thread of the program; nsys: CUPTI_ACTIVITY_KIND_OVERHEAD and nsys''s own PROFILER_OVERHEAD). The GPU idle under a set-up one before the rank''s first GPU activity is start-up: the profiler''s own (vocab.PROFILER_SETUP_RE: buffer requests, nsys''s profiling initialization), or the driver''s that CUPTI reports (vocab.DRIVER_SETUP_RE: lazy function loading, the module loads of first launches, which the program pays unprofiled too)';
COMMENT ON COLUMN profiler_overhead.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN profiler_overhead.rank IS 'the rank';
COMMENT ON COLUMN profiler_overhead.name IS '`Activity Buffer Request`, `Buffer Flush`, `Lazy Function Loading`, `Instrumentation`, `Resource`; nsys: `CUDA profiling initialization`, `CUPTI Buffer flush`, `Command Buffer Full`, …';
COMMENT ON COLUMN profiler_overhead.start_ns IS 'start';
COMMENT ON COLUMN profiler_overhead.end_ns IS 'end';

CREATE TABLE IF NOT EXISTS ranges (
    source_id   INTEGER,
    rank        INTEGER,
    pid         BIGINT,
    thread      BIGINT,
    device      INTEGER,
    domain      VARCHAR,
    name        VARCHAR,
    start_ns    BIGINT,
    end_ns      BIGINT,
    depth       INTEGER,
    on_gpu      BOOLEAN,
    external_id BIGINT,
    cut         BOOLEAN
);
COMMENT ON TABLE ranges IS 'One row per annotation (record_function, NVTX, ProfilerStep#N)';
COMMENT ON COLUMN ranges.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN ranges.rank IS 'the rank';
COMMENT ON COLUMN ranges.pid IS 'host process (CPU side)';
COMMENT ON COLUMN ranges.thread IS 'host thread (CPU side)';
COMMENT ON COLUMN ranges.device IS 'GPU for `on_gpu` copies';
COMMENT ON COLUMN ranges.domain IS '`user_annotation` (CPU side), `gpu_user_annotation` (Kineto''s GPU-stream copy), `python` (Kineto `python_function` events of a `with_stack=True` trace: one range per Python frame, named `file.py(LINE): function` with the line of its `def`; used to name the Python site of host syncs, never as analysis windows or in the per-range breakdown), NVTX domain name (nsys: `default` for domain 0, else the name its DomainCreate event registered, e.g. `NCCL`, `MPI`, `CCCL`). nsys push/pop and start/end ranges that ended; `emit_nvtx` op ranges go to `ops`, not here';
COMMENT ON COLUMN ranges.name IS '`phase:train_step`, `ProfilerStep#3`, `nccl:all_reduce`, …';
COMMENT ON COLUMN ranges.start_ns IS 'start';
COMMENT ON COLUMN ranges.end_ns IS 'end (Kineto: ranges, ops and Python frames are cut to the profiler''s recording — its `PyTorch Profiler (N)` span widened to the GPU activities and runtime calls — and the source''s notes say which: a `ProfilerStep#N` left open at exit closes seconds after the profiler stopped; `start_ns` likewise)';
COMMENT ON COLUMN ranges.depth IS 'reserved for the nesting depth: no parser computes it yet (always NULL)';
COMMENT ON COLUMN ranges.on_gpu IS 'true for the GPU-timeline copy (which can end early; `--range` uses the CPU side when present)';
COMMENT ON COLUMN ranges.external_id IS 'Kineto External id';
COMMENT ON COLUMN ranges.cut IS 'true when the profiler''s recording cut it (Kineto: it began before or ended after the recording, see `end_ns`): its `start_ns` / `end_ns` are the recording''s edge and its time a lower bound; false when whole; NULL where that is unknown: a Kineto trace without the profiler''s span (often an iteration cut out of a longer trace), nsys, GPU-side annotations and Python frames';

CREATE TABLE IF NOT EXISTS collectives (
    source_id          INTEGER,
    rank               INTEGER,
    device             INTEGER,
    stream             BIGINT,
    kernel_correlation BIGINT,
    start_ns           BIGINT,
    end_ns             BIGINT,
    collective         VARCHAR,
    process_group      VARCHAR,
    process_group_desc VARCHAR,
    group_ranks        VARCHAR,
    group_size         INTEGER,
    seq                INTEGER,
    in_nelems          BIGINT,
    out_nelems         BIGINT,
    dtype              VARCHAR,
    bytes              BIGINT,
    peer               INTEGER
);
COMMENT ON TABLE collectives IS 'One row per NCCL operation on a rank';
COMMENT ON COLUMN collectives.source_id IS 'the input (sources.source_id)';
COMMENT ON COLUMN collectives.rank IS 'the rank';
COMMENT ON COLUMN collectives.device IS 'the GPU its kernel ran on';
COMMENT ON COLUMN collectives.stream IS 'its kernel''s stream';
COMMENT ON COLUMN collectives.kernel_correlation IS '`kernels.correlation` of its kernel';
COMMENT ON COLUMN collectives.start_ns IS 'its kernel''s start';
COMMENT ON COLUMN collectives.end_ns IS 'its kernel''s end (the interval includes waiting for peers)';
COMMENT ON COLUMN collectives.collective IS '`allreduce`, `all_gather`, `_reduce_scatter_base`, … (the trace''s `Collective name`, else from the kernel name: nsys `ncclDevKernel_AllReduce_Sum_bf16_RING_LL` → `allreduce`, `ncclDevKernel_SendRecv` → `sendrecv`)';
COMMENT ON COLUMN collectives.process_group IS 'process group name (nsys: `nccl:<communicator id, 16 hex digits>` from NCCL''s NVTX payloads, set only when every NCCL kernel of the report matched its NCCL call; `seq` then counts within it)';
COMMENT ON COLUMN collectives.process_group_desc IS 'process group description';
COMMENT ON COLUMN collectives.group_ranks IS 'the group''s ranks (`[0, 1]`; nsys: the store ranks of the communicator''s members in communicator-rank order, when all of them are processes of the same report)';
COMMENT ON COLUMN collectives.group_size IS 'the group''s size (nsys: the communicator''s `No. of ranks`)';
COMMENT ON COLUMN collectives.seq IS 'occurrence number of this collective in its process group on this rank (0…): the same `seq` on two ranks is the same operation';
COMMENT ON COLUMN collectives.in_nelems IS 'input message size in elements';
COMMENT ON COLUMN collectives.out_nelems IS 'output message size in elements';
COMMENT ON COLUMN collectives.dtype IS 'element type (nsys: from the kernel name when it has one, `bf16`; no element counts)';
COMMENT ON COLUMN collectives.bytes IS 'message size in bytes (max of in/out × element size; nsys: NCCL''s NVTX payload `Message size [bytes]`, when the report was exported with `--include-blobs true` — the NCCL call range (domain `NCCL`) is matched to the kernel whose launch it contains on the same thread)';
COMMENT ON COLUMN collectives.peer IS 'peer rank for send/recv (nsys: the payload''s `Peer rank`, a rank in the communicator, when NCCL records one)';

-- How a counter log's times were anchored (its closed vocabulary as a type: one byte a sample, not a string —
-- an nsys export's 10 kHz GPU metrics are millions of rows).
CREATE TYPE IF NOT EXISTS counter_time_source AS ENUM ('native', 'anchored', 'prefixed', 'synthesized');
CREATE TABLE IF NOT EXISTS counters (
    source_id   INTEGER,
    rank        INTEGER,
    device      INTEGER,
    gpu_uuid    VARCHAR,
    metric      VARCHAR,
    start_ns    BIGINT,
    end_ns      BIGINT,
    value       DOUBLE,
    time_source counter_time_source,
    gpu_index   INTEGER,
    entity      VARCHAR,
    raw_time    VARCHAR
);
COMMENT ON TABLE counters IS 'One row per device-counter sample, as an interval (filled by counter-log parsers). Metric vocabulary: `gpu_util` (NVML utilization.gpu = dmon `sm` = DCGM GPUTL), `mem_util`, `gr_engine_active`, `sm_active`, `sm_occupancy`, `tensor_active`, `tensor_imma_active`, `tensor_hmma_active`, `tensor_dfma_active`, `dram_active`, `fp16_active`, `fp32_active`, `fp64_active`, `int_active`, `enc_util`, `dec_util`, `jpg_util`, `ofa_util` (fractions 0–1); `pcie_tx_bytes_s`, `pcie_rx_bytes_s`, `nvlink_tx_bytes_s`, `nvlink_rx_bytes_s` (bytes/s; nvidia-smi MB/s read as MiB/s); `power_w`, `energy_j` (a counter), `sm_clock_mhz` (dmon `pclk`), `mem_clock_mhz`, `graphics_clock_mhz`, `temp_c`, `mem_temp_c`, `fb_used_bytes`, `fb_free_bytes`, `bar1_used_bytes` (nvidia-smi MiB), `power_violation` (fraction), `thermal_violation` (0/1), `fan_speed` (fraction), `ecc_sbe_errors`, `ecc_dbe_errors`, `pcie_replay_errors`. DCGM fields map by short name or numeric id (GPUTL 203, SMACT 1002, TENSO 1004, DRAMA 1005, FP16A/FP32A/FP64A 1008/1007/1006, PCITX/PCIRX 1009/1010, NVLTX/NVLRX 1011/1012, POWER 155, SMCLK 100, …); dcgm-exporter families by DCGM field name (old and renamed, e.g. `DCGM_FI_PROF_SM_ACTIVE` / `…_SM_UTIL_RATIO`). Nsight Systems GPU metrics (`--gpu-metrics-devices`) land here too, from the report itself (`time_source` `native`, `rank` and `device` of the process that used the GPU, `gpu_index` = that device ordinal, `gpu_uuid`): `GPU_METRICS` joined to `TARGET_INFO_GPU_METRICS` on (typeId, metricId), the GPU from `typeId & 0xFF`; samples with a negative timestamp are dropped; the period is `1 / GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY` (else the series'' mean spacing). Metric names: `SMs Active` → `sm_active`, `SM Issue` → `sm_issue`, `Tensor Active` → `tensor_active`, `DRAM Read/Write Bandwidth` → `dram_read` / `dram_write`, `GR Active` → `gr_engine_active`, `GPC Clock Frequency` → `sm_clock_mhz`, `SYS Clock Frequency` → `sys_clock_mhz`, `PCIe RX/TX Throughput` → `pcie_rx` / `pcie_tx`; others snake_cased with their unit suffix (`compute_warps_in_flight_avg`; `[Throughput %]` dropped). `%` metrics are fractions 0–1; clocks MHz (some nsys versions store Hz under a `[MHz]` name: converted); other values as exported';
COMMENT ON COLUMN counters.source_id IS 'the log (sources.source_id)';
COMMENT ON COLUMN counters.rank IS 'the trace GPU''s rank the sample belongs to, once matched (by UUID, else PCI bus id, else device index when exactly one trace GPU has it); NULL when the log''s GPU matches none (said in the notes)';
COMMENT ON COLUMN counters.device IS 'the trace GPU''s device ordinal, once matched (as rank)';
COMMENT ON COLUMN counters.gpu_uuid IS '`GPU-…` when the log names it';
COMMENT ON COLUMN counters.metric IS 'a name of the vocabulary above';
COMMENT ON COLUMN counters.start_ns IS '`t − period`: the sample logged at t covers the period before it (period = that GPU''s median sample spacing; `--dcgm-period` for logs without times)';
COMMENT ON COLUMN counters.end_ns IS '`t`, the time the sample was logged';
COMMENT ON COLUMN counters.value IS 'in the vocabulary''s unit; utilisations are fractions 0–1';
COMMENT ON COLUMN counters.time_source IS 'the log''s anchor: `native`, `anchored`, `prefixed`, `synthesized` (see `sources.clock_anchor`)';
COMMENT ON COLUMN counters.gpu_index IS 'the GPU as the log numbers it (nvidia-smi / NVML / DCGM index); NULL for a MIG instance';
COMMENT ON COLUMN counters.entity IS 'DCGM / exporter entity (`GPU 0`, `GPU-I 3`); MIG instances are kept here and never matched to a GPU';
COMMENT ON COLUMN counters.raw_time IS 'the time as written in the log (local time string, epoch prefix, wall_ns)';

CREATE TABLE IF NOT EXISTS memory_events (
    source_id       INTEGER,
    rank            INTEGER,
    device          INTEGER,
    pid             BIGINT,
    thread          BIGINT,
    ts_ns           BIGINT,
    bytes_delta     BIGINT,
    total_allocated BIGINT,
    total_reserved  BIGINT,
    addr            BIGINT,
    origin          VARCHAR DEFAULT 'allocator'
);
COMMENT ON TABLE memory_events IS 'One row per device-memory allocator event (Kineto `profile_memory=True`) or CUDA device allocation / free (Nsight Systems `--cuda-memory-usage=true`: CUDA_GPU_MEMORY_USAGE_EVENTS). Only device memory is kept (Kineto `Device Type` 1 CUDA, 6 HIP; nsys `memKind` Device, Array); host allocations, managed memory and module globals are not. Events whose size or totals are no numbers are left out';
COMMENT ON COLUMN memory_events.source_id IS 'the trace (sources.source_id)';
COMMENT ON COLUMN memory_events.rank IS 'its rank';
COMMENT ON COLUMN memory_events.device IS 'the GPU (as `kernels.device`): the event''s `Device Id`; when the trace''s kernels ran on one device id and the allocator names one other (ROCm numbers kernel devices after the CPU agents), the kernels''';
COMMENT ON COLUMN memory_events.pid IS 'the process that allocated or freed';
COMMENT ON COLUMN memory_events.thread IS 'the thread that allocated or freed';
COMMENT ON COLUMN memory_events.ts_ns IS 'when (UTC epoch ns, on the clock as every time of the trace)';
COMMENT ON COLUMN memory_events.bytes_delta IS 'the `[memory]` event''s `Bytes` (nsys: the record''s `bytes`): positive for an allocation, negative for a free';
COMMENT ON COLUMN memory_events.total_allocated IS 'the caching allocator''s allocated bytes after the event (`Total Allocated`; NULL in traces before torch 1.10); NULL for origin `driver`: the driver does not see which parts of its allocations live tensors use';
COMMENT ON COLUMN memory_events.total_reserved IS 'the caching allocator''s reserved bytes after the event (`Total Reserved`; NULL before torch 1.10). Origin `driver`: the process''s device memory on that GPU after the record — the non-pool allocations it still holds plus each memory pool''s size (`localMemoryPoolSize`) — which under a caching allocator is its reserved memory plus what libraries allocated themselves; NULL when the report did not see every allocation of the process (the capture began after it)';
COMMENT ON COLUMN memory_events.addr IS 'the block''s address (`Addr`; nsys `address`), pairing an allocation with its free';
COMMENT ON COLUMN memory_events.origin IS '`allocator`: an event of the framework''s caching allocator (Kineto `[memory]`); `driver`: a device allocation / free as the CUDA driver saw it (nsys: `cudaMalloc` / `cudaFree`, `cuMemSetAccess` / `cuMemUnmap` of mapped pages, `cudaMallocAsync` / `cudaFreeAsync` from a pool)';

CREATE TABLE IF NOT EXISTS ncu_kernels (
    source_id        INTEGER,
    launch_id        BIGINT,
    occurrence       INTEGER,
    name             VARCHAR,
    device           INTEGER,
    process_id       BIGINT,
    grid             VARCHAR,
    block            VARCHAR,
    duration_ns      DOUBLE,
    flops            DOUBLE,
    flops_tensor     DOUBLE,
    flops_fp64       DOUBLE,
    flops_fp32       DOUBLE,
    flops_fp16       DOUBLE,
    tensor_precision VARCHAR,
    dram_bytes       DOUBLE,
    kernel_id        BIGINT
);
COMMENT ON TABLE ncu_kernels IS 'One row per Nsight Compute profiled launch';
COMMENT ON COLUMN ncu_kernels.source_id IS 'the CSV (sources.source_id)';
COMMENT ON COLUMN ncu_kernels.launch_id IS 'its `ID`';
COMMENT ON COLUMN ncu_kernels.occurrence IS 'how many launches of the same name came before it in the CSV (0…)';
COMMENT ON COLUMN ncu_kernels.name IS 'kernel name as ncu prints it';
COMMENT ON COLUMN ncu_kernels.device IS 'device as ncu prints it';
COMMENT ON COLUMN ncu_kernels.process_id IS 'process as ncu prints it';
COMMENT ON COLUMN ncu_kernels.grid IS 'grid as ncu prints it';
COMMENT ON COLUMN ncu_kernels.block IS 'block as ncu prints it';
COMMENT ON COLUMN ncu_kernels.duration_ns IS '`gpu__time_duration.sum` (the launch replayed alone: not a time on the trace''s clock)';
COMMENT ON COLUMN ncu_kernels.flops IS 'tensor + FP64 + FP32 + FP16 FLOPs; NULL when tensor instructions ran but the CSV has no `sm__ops_path_tensor_*` counts, or when it has no CUDA-core count (FFMA / FMUL / FADD) and no tensor op for the launch (unknown, not 0)';
COMMENT ON COLUMN ncu_kernels.flops_tensor IS 'Σ `sm__ops_path_tensor_src_*` (executed tensor-core work, tile padding included)';
COMMENT ON COLUMN ncu_kernels.flops_fp64 IS '2·fma + mul + add FP64 thread instructions (`sm__sass_thread_inst_executed_op_d*_pred_on`), from `.sum` or rate × time';
COMMENT ON COLUMN ncu_kernels.flops_fp32 IS '2·fma + mul + add FP32 thread instructions (`sm__sass_thread_inst_executed_op_f*_pred_on`), from `.sum` or rate × time';
COMMENT ON COLUMN ncu_kernels.flops_fp16 IS '2·fma + mul + add FP16 thread instructions (`sm__sass_thread_inst_executed_op_h*_pred_on`), from `.sum` or rate × time';
COMMENT ON COLUMN ncu_kernels.tensor_precision IS 'source precision carrying most tensor ops (`bf16`, `fp16`, `tf32`, `fp8`, …)';
COMMENT ON COLUMN ncu_kernels.dram_bytes IS '`dram__bytes_read.sum + dram__bytes_write.sum` (GB20x: `dram__bytes_op_read.sum + dram__bytes_op_write.sum`; else `dram__bytes.sum`, or its rate × duration)';
COMMENT ON COLUMN ncu_kernels.kernel_id IS 'the trace kernel it was joined to (name, then occurrence order per rank); that kernel''s `flops` / `bytes` are these, `flops_source = ''ncu''`';

CREATE TABLE IF NOT EXISTS windows (
    scope      VARCHAR,
    range_name VARCHAR,
    rank       INTEGER,
    device     INTEGER,
    start_ns   BIGINT,
    end_ns     BIGINT,
    occurrences INTEGER
);
COMMENT ON TABLE windows IS 'The analysed windows. A range''s window on a GPU is the union of the GPU windows of that rank''s occurrences (`range_occurrences`): each runs from max(its CPU start, the end of the GPU work launched before it on the streams it uses and, on its other streams, until its own first activity began) to max(its CPU end, the end of the last activity it launched), so that consecutive steps tile the GPU timeline when the host runs ahead; an occurrence that launched nothing keeps its CPU interval (SPEC §1, measurements.md#range_windows)';
COMMENT ON COLUMN windows.scope IS '`window`: each GPU''s profiled window, its rank''s span (`rank_span`: from the first to the last event of the rank); `range`: a `--range` or a top-level range';
COMMENT ON COLUMN windows.range_name IS 'the pattern, or the top-level name with `#N` → `#*` (NULL for `window`)';
COMMENT ON COLUMN windows.rank IS 'the rank';
COMMENT ON COLUMN windows.device IS 'the GPU';
COMMENT ON COLUMN windows.start_ns IS 'start of the window (or of one of its merged intervals)';
COMMENT ON COLUMN windows.end_ns IS 'its end';
COMMENT ON COLUMN windows.occurrences IS 'range occurrences merged into this interval';

CREATE TABLE IF NOT EXISTS metrics (
    scope                     VARCHAR,
    range_name                VARCHAR,
    rank                      INTEGER,
    device                    INTEGER,
    window_ns                 BIGINT,
    occurrences               INTEGER,
    busy_ns                   BIGINT,
    utilization               DOUBLE,
    flops                     DOUBLE,
    achieved_flop_s           DOUBLE,
    achieved_fraction_of_peak DOUBLE,
    capped_ns                 BIGINT,
    kernel_ns                 BIGINT,
    kernel_ns_with_flops      BIGINT,
    peak_flop_s               DOUBLE,
    achieved_ns               DOUBLE,
    unknown_ns                BIGINT,
    unmeasured_ns             BIGINT,
    communication_ns          BIGINT,
    activity_ns               BIGINT
);
COMMENT ON TABLE metrics IS 'The numbers per window, per GPU and combined per run';
COMMENT ON COLUMN metrics.scope IS 'as in `windows`';
COMMENT ON COLUMN metrics.range_name IS 'as in `windows`';
COMMENT ON COLUMN metrics.rank IS 'the rank; NULL for the run-level row (GPUs combined)';
COMMENT ON COLUMN metrics.device IS 'the GPU; NULL for the run-level row';
COMMENT ON COLUMN metrics.window_ns IS 'total length of the window(s)';
COMMENT ON COLUMN metrics.occurrences IS 'range occurrences in the window';
COMMENT ON COLUMN metrics.busy_ns IS 'time with at least one kernel or copy resident';
COMMENT ON COLUMN metrics.utilization IS 'busy_ns / window_ns (what nvidia-smi would show)';
COMMENT ON COLUMN metrics.flops IS '∫ R dt: FLOPs done in the window, kernels cut pro rata, each stretch capped at peak';
COMMENT ON COLUMN metrics.achieved_flop_s IS 'flops / window';
COMMENT ON COLUMN metrics.achieved_fraction_of_peak IS 'the peak-time equivalent: Σ over kernels of FLOPs / P(their precision), each stretch capped at the peak, over the window (achieved_ns / window_ns); NULL when the GPU has no peak; run level: Σ achieved_ns / Σ window_ns. `metrics_by_precision` breaks it down';
COMMENT ON COLUMN metrics.capped_ns IS 'time where FLOP estimates implied more than peak (capped; flagged in the verdict)';
COMMENT ON COLUMN metrics.kernel_ns IS 'compute-kernel time in the window (kernel classes compute, memory, unknown)';
COMMENT ON COLUMN metrics.kernel_ns_with_flops IS 'the part of kernel_ns with a FLOP estimate';
COMMENT ON COLUMN metrics.peak_flop_s IS 'the GPU''s headline peak (the verdict''s precision)';
COMMENT ON COLUMN metrics.achieved_ns IS 'peak-time achieved (Σ over the window''s stretches); achieved_ns + unmeasured_ns + Σ losses.lost_ns = window_ns';
COMMENT ON COLUMN metrics.unknown_ns IS 'time of `unknown` kernels in the window (may do matmul-class work, nothing estimates it): coverage is 1 − unknown_ns / kernel_ns';
COMMENT ON COLUMN metrics.unmeasured_ns IS 'time with no loss category: a kernel with a FLOP estimate ran on a GPU with no peak';
COMMENT ON COLUMN metrics.communication_ns IS 'communication-kernel time in the window (the verdict''s communication share)';
COMMENT ON COLUMN metrics.activity_ns IS 'all kernel / copy time in the window';

-- losses: a view over the sweep's stretches (plasmient_report/sql/losses.sql), created by the measure stage.

CREATE TABLE IF NOT EXISTS findings (
    rule_id        VARCHAR,
    layer          VARCHAR,
    severity       VARCHAR,
    rank           INTEGER,
    lost_fraction  DOUBLE,
    title          VARCHAR,
    evidence       VARCHAR,
    recommendation VARCHAR,
    category       VARCHAR,
    fix            VARCHAR,
    key            VARCHAR,
    scope          VARCHAR,
    range_name     VARCHAR
);
COMMENT ON TABLE findings IS 'One row per rule finding (`plasmient-report rules` lists the rules)';
COMMENT ON COLUMN findings.rule_id IS 'the rule''s stable ID (`PR101`); `plasmient-report rules --explain PR101` prints its page';
COMMENT ON COLUMN findings.layer IS '`cluster`, `pipeline`, `op`, `kernel`, `host`, `device`, `memory`';
COMMENT ON COLUMN findings.severity IS 'from lost_fraction: `high` (≥ 10% of the window), `medium` (≥ 2%), `low`; `info` when the finding claims no loss, unless its rule flags a risk and sets it (PR701: memory near the device''s limit)';
COMMENT ON COLUMN findings.rank IS 'the rank the finding is about (the late rank, the throttled GPU''s rank); NULL when it is run-wide';
COMMENT ON COLUMN findings.lost_fraction IS 'the share of the analysed window (Σ over GPUs, as the verdict''s losses) that the finding explains, taken from the `losses` view: the lost time of its category inside the intervals it names — never more than that category lost; NULL when it claims none (a risk such as PR701, which the waterfall never counts)';
COMMENT ON COLUMN findings.title IS 'one line: what was found, with numbers';
COMMENT ON COLUMN findings.evidence IS 'JSON: the ranks, kernels, ops, times (`*_ns`) and numbers behind it (keys per rule, see its page)';
COMMENT ON COLUMN findings.recommendation IS 'what to do, with concrete numbers';
COMMENT ON COLUMN findings.category IS 'the loss category whose time it explains (NULL: several, e.g. PR504 idle gaps, PR602 the headline gap; or none, for a risk that claims no lost time, PR701)';
COMMENT ON COLUMN findings.fix IS 'the one-line fix; the verdict''s `losses[].recommendation` uses the best finding''s fix for its category';
COMMENT ON COLUMN findings.key IS 'what the finding is about, stable across runs (a kernel name, `rank 1`): `plasmient-report diff` matches findings on (rule_id, rank, key)';
COMMENT ON COLUMN findings.scope IS 'the analysed window, as in `windows` (`range` with the first `--range`, else `window`)';
COMMENT ON COLUMN findings.range_name IS 'the range pattern of a `range` scope (NULL for `window`)';
