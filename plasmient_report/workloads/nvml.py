"""NVML sampling in a background thread: utilization (what nvidia-smi and the dashboards show), SM clock and
power every `period` seconds, written as the plain CSV the `nvml_csv` parser reads
(`wall_ns,gpu_util,mem_util,sm_clock_mhz,power_w`; `wall_ns` = time.time_ns(), UTC epoch).
Needs nvidia-ml-py (`import pynvml`). Used by `plasmient-report measure` and by `sample_traces/generate/`."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

HEADER = "wall_ns,gpu_util,mem_util,sm_clock_mhz,power_w\n"


class NvmlSampler:
    """Samples one GPU (NVML index) every `period` s until stop(); rows (wall_ns, gpu %, memory %, MHz, W)."""

    def __init__(self, nvml_index: int, period: float = 0.010) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        self.period = period
        self.rows: list[tuple[int, int, int, int, float]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nv, h = self.nv, self.h
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
                clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                pw = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                self.rows.append((time.time_ns(), u.gpu, u.memory, clk, pw))
            except Exception as e:  # noqa: BLE001 — one failed sample is not the end of the recording
                print("nvml sample failed:", e, file=sys.stderr)
            nxt += self.period
            dt = nxt - time.monotonic()
            if dt > 0:
                time.sleep(dt)
            else:
                nxt = time.monotonic()

    def start(self) -> None:
        self._t.start()

    def stop(self, path: str | Path) -> int:
        """Stop sampling and write the CSV; returns the number of samples."""
        self._stop.set()
        self._t.join()
        with open(path, "w") as f:
            f.write(HEADER)
            for r in self.rows:
                f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.3f}\n")
        return len(self.rows)


def nvml_index_for_cuda(device_index: int = 0) -> tuple[int, str | None]:
    """NVML index and UUID of the GPU that CUDA calls `device_index` (matched by UUID: CUDA and NVML may order
    GPUs differently unless CUDA_DEVICE_ORDER=PCI_BUS_ID); (device_index, None) when they cannot be matched."""
    import pynvml
    import torch

    try:
        pynvml.nvmlInit()
        uuid = "GPU-" + str(torch.cuda.get_device_properties(device_index).uuid)
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return int(pynvml.nvmlDeviceGetIndex(h)), uuid
    except Exception as e:  # noqa: BLE001 — an old driver or torch without .uuid: fall back to the same index
        print(
            f"could not match CUDA device {device_index} to NVML by UUID ({e}); using NVML index {device_index}", file=sys.stderr
        )
        return device_index, None


def driver_version() -> str | None:
    import pynvml

    try:
        pynvml.nvmlInit()
        v: Any = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001
        return None
