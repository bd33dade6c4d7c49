"""`plasmient-report measure`: known workloads on this GPU, recorded under the PyTorch profiler with NVML sampling,
then the normal pipeline on the recording — what the dashboard shows beside the fraction of peak achieved.

`kernels.py` the workloads and their analytic FLOPs / bytes (shared with `sample_traces/generate/`), `nvml.py` the
NVML sampler, `recorder.py` the recording (needs torch with CUDA and nvidia-ml-py), `report.py` the analysis of a
recording (no torch), `command.py` the command. Named `workloads` because `measure` is also a pipeline stage.
"""

from __future__ import annotations

NAMES = ("matmul", "memory", "launch", "attention")
