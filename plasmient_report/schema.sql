-- The store: every parser fills these tables; every later stage reads only them.
-- All *_ns columns are int64 UTC epoch nanoseconds after alignment (SPEC §3).
-- docs/schema.md documents each column; keep the two in step.

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

CREATE TABLE IF NOT EXISTS clock (
    source_id           INTEGER PRIMARY KEY,
    offset_ns           BIGINT NOT NULL,
    method              VARCHAR NOT NULL,
    uncertainty_ns      BIGINT,
    reference_source_id INTEGER
);

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
    external_id BIGINT
);

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

CREATE TABLE IF NOT EXISTS counters (
    source_id   INTEGER,
    rank        INTEGER,
    device      INTEGER,
    gpu_uuid    VARCHAR,
    metric      VARCHAR,
    start_ns    BIGINT,
    end_ns      BIGINT,
    value       DOUBLE,
    time_source VARCHAR,
    gpu_index   INTEGER,
    entity      VARCHAR,
    raw_time    VARCHAR
);

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
    addr            BIGINT
);

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

CREATE TABLE IF NOT EXISTS windows (
    scope      VARCHAR,
    range_name VARCHAR,
    rank       INTEGER,
    device     INTEGER,
    start_ns   BIGINT,
    end_ns     BIGINT,
    occurrences INTEGER
);

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
