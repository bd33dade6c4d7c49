"""The table of rule codes (ruff's `codes.rs` is the model): each built-in rule's code, layer, file and status, in
one place. A code's rule lives in `rules/<layer>/<rule_name>.py` and its page is `docs/rules/<CODE>.md`; its
fixtures are in `tests/rules/<CODE>/`. Codes are stable: a rule that goes away is marked deprecated, never
renumbered. Hundreds digit = layer: 1 cluster, 2 pipeline, 3 op, 4 kernel, 5 host, 6 device, 7 memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    layer: str
    rule_name: str  # the module in rules/<layer>/ (snake_case); the rule's name is the same in kebab-case
    status: str  # stable, preview or deprecated (base.STATUSES)

    @property
    def module(self) -> str:
        return f"{self.layer}.{self.rule_name}"

    @property
    def name(self) -> str:
        return self.rule_name.replace("_", "-")


CODES: tuple[Code, ...] = (
    Code("PR101", "cluster", "straggler_rank", "stable"),
    Code("PR102", "cluster", "exposed_communication", "stable"),
    Code("PR201", "pipeline", "pipeline_bubble", "stable"),
    Code("PR301", "op", "memory_bound_kernel", "stable"),
    Code("PR302", "op", "unfused_elementwise_chain", "stable"),
    Code("PR401", "kernel", "matmul_without_tensor_cores", "stable"),
    Code("PR402", "kernel", "gemm_wave_quantization", "stable"),
    Code("PR403", "kernel", "pageable_or_sync_memcpy", "stable"),
    Code("PR501", "host", "launch_bound_stream", "stable"),
    Code("PR502", "host", "host_sync_stall", "stable"),
    Code("PR503", "host", "input_bound_step", "stable"),
    Code("PR504", "host", "gpu_idle_gap", "stable"),
    Code("PR601", "device", "clock_throttling", "stable"),
    Code("PR602", "device", "utilization_vs_achieved_gap", "stable"),
    Code("PR701", "memory", "device_memory_pressure", "stable"),
)
