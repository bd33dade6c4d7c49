-- Module: device_links
-- Every GPU's links from the peak table (`[gpu.interconnect]` of peaks.toml through plasmient_report/peaks.py;
-- filled by the measure stage): the GPU-to-GPU fabric built into the part (NVLink through NVSwitch, AMD Infinity
-- Fabric) and the host link (PCIe), each as the datasheet's bidirectional figure and as one direction — the figure
-- NCCL's bus bandwidth is measured against (nccl-tests doc/PERFORMANCE.md). Optional bridges are not assumed; a GPU
-- the table does not know, or whose links it does not give, has NULLs, never a guess.

CREATE OR REPLACE TABLE device_links (
    rank            INTEGER,
    device          INTEGER,
    gpu_key         VARCHAR,
    link            VARCHAR,
    link_gbs        DOUBLE,
    link_mesh       INTEGER,
    pcie            VARCHAR,
    pcie_gbs        DOUBLE,
    source          VARCHAR
);
COMMENT ON TABLE device_links IS 'One row per GPU: its GPU-to-GPU and host links from the peak table';
COMMENT ON COLUMN device_links.rank IS 'the GPU''s rank';
COMMENT ON COLUMN device_links.device IS 'the GPU''s device ordinal in that process';
COMMENT ON COLUMN device_links.gpu_key IS 'the peak-table key (NULL: unknown GPU)';
COMMENT ON COLUMN device_links.link IS 'the GPU-to-GPU fabric built into the part (NVLink 4 (18 links), Infinity Fabric, …); NULL: none or unknown';
COMMENT ON COLUMN device_links.link_gbs IS 'its datasheet bandwidth per GPU, GB/s, both directions together';
COMMENT ON COLUMN device_links.link_mesh IS 'a full mesh of this many links, one per peer (AMD): with n GPUs, n - 1 of them carry a collective; NULL: a switch (every peer at full bandwidth)';
COMMENT ON COLUMN device_links.pcie IS 'the host link (PCIe Gen5 x16, …)';
COMMENT ON COLUMN device_links.pcie_gbs IS 'its datasheet bandwidth, GB/s, both directions together';
COMMENT ON COLUMN device_links.source IS 'where the figures come from';
