-- Module: device_peaks
-- The peak FLOP/s of every GPU at every precision, from the peak table (peaks.toml through plasmient_report/peaks.py;
-- filled by the measure stage): one row per (GPU, precision). A precision the GPU lacks falls back as the table
-- says (tf32 → fp32, bf16 → fp16) and `peak_precision` names the figure used; with none, `peak_flop_s` is NULL,
-- never invented. `--peak-precision` maps every precision to the one given; `--peak-tflops` to that figure.

CREATE OR REPLACE TABLE device_peaks (
    rank              INTEGER,
    device            INTEGER,
    precision         VARCHAR,
    peak_precision    VARCHAR,
    peak_flop_s       DOUBLE,
    bandwidth_bytes_s DOUBLE,
    gpu               VARCHAR,
    gpu_key           VARCHAR,
    source            VARCHAR,
    headline          BOOLEAN
);
COMMENT ON TABLE device_peaks IS 'Peak FLOP/s per GPU and precision (one row per rank, device, precision)';
COMMENT ON COLUMN device_peaks.rank IS 'the GPU''s rank';
COMMENT ON COLUMN device_peaks.device IS 'the GPU''s device ordinal in that process';
COMMENT ON COLUMN device_peaks.precision IS 'a kernel precision (fp64, fp64_tensor, fp32, tf32, bf16, fp16, fp8, int8)';
COMMENT ON COLUMN device_peaks.peak_precision IS 'the precision whose figure is used for it (after the table''s fallback or --peak-precision); NULL when none';
COMMENT ON COLUMN device_peaks.peak_flop_s IS 'dense peak FLOP/s (TOPS for int8); NULL: the GPU or this precision has no figure';
COMMENT ON COLUMN device_peaks.bandwidth_bytes_s IS 'HBM bandwidth, bytes/s (NULL when unknown)';
COMMENT ON COLUMN device_peaks.gpu IS 'the peak-table name of the GPU (the trace''s name when it matched none)';
COMMENT ON COLUMN device_peaks.gpu_key IS 'the peak-table key (NULL: unknown GPU)';
COMMENT ON COLUMN device_peaks.source IS 'where the figure comes from (datasheet, --peak-tflops, or why there is none)';
COMMENT ON COLUMN device_peaks.headline IS 'true on the row of the run''s headline precision (one per GPU): the peak of the verdict';
