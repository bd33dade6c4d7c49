"""Many runs: `plasmient-report batch ARCHIVE...` maps the per-run pipeline over every run of folders or archives
(archive → group → mapper on an executor → reducer) and writes a fleet summary. See docs/batch.md."""

from __future__ import annotations

from .job import BatchResult, Progress, run_batch

__all__ = ["BatchResult", "Progress", "run_batch"]
