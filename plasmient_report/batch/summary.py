"""The fleet summary's rows: one per run and one per rank (GPU) of it, read from the run's verdict.json, and one
per file or folder of the inputs that is in no run (`unread`, with why).

The columns are the Arrow schema below (docs/batch.md documents each). Rows hold only what the verdict and the
inputs say — no times, process ids or absolute work paths — so every executor writes the same summary.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..errors import path_text
from ..metrics import CATEGORIES
from ..verdict_model import Finding, Loss, Verdict

TOP_FINDINGS = 3
LOSS_COLUMNS = tuple(f"loss_{c}" for c in CATEGORIES)

SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),  # `<archive label>/<run folder or prefix>`
        pa.field("level", pa.string(), nullable=False),  # 'run' (whole run) | 'rank' (one GPU of it) |
        # 'unread' (a file or folder in no run; error: why)
        pa.field("rank", pa.int32()),  # null on run rows
        pa.field("device", pa.int32()),  # CUDA ordinal in that rank's process; null on run rows
        pa.field("status", pa.string(), nullable=False),  # 'ok' | 'failed' | 'not analysed' (unread rows)
        pa.field("error", pa.string()),  # the failure, one line (failed runs; why, unread)
        pa.field("formats", pa.string()),  # trace/log formats read, '+'-joined (kineto, nsys-sqlite, …)
        pa.field("gpu", pa.string()),  # GPU name(s) as the trace gives them
        pa.field("peak_gpu", pa.string()),  # the peak-table entry used
        pa.field("precision", pa.string()),  # precision of the peak
        pa.field("peak_tflops", pa.float64()),
        pa.field("world_size", pa.int32()),  # ranks in the run
        pa.field("window_ns", pa.int64()),  # analysed window (the run's: the longest rank)
        pa.field("utilization", pa.float64()),  # fraction of the window with a kernel resident (trace)
        pa.field("utilization_measured", pa.float64()),  # from NVML / DCGM / nvidia-smi samples, when given
        pa.field("achieved_fraction_of_peak", pa.float64()),
        pa.field("achieved_is_lower_bound", pa.bool_()),  # low FLOP coverage: a lower bound (run rows)
        pa.field("headroom", pa.float64()),  # 1 / achieved fraction of peak
        pa.field("verdict", pa.string()),  # verdict word (run rows)
        *[pa.field(c, pa.float64()) for c in LOSS_COLUMNS],  # lost fraction of the window per category
        pa.field("top_loss", pa.string()),  # the largest loss category
        pa.field("top_findings", pa.list_(pa.string())),  # up to 3: `PR101 36%: title`, by lost fraction
        pa.field("findings", pa.int32()),  # findings in total (rank rows: about that rank)
        pa.field("inputs", pa.list_(pa.string())),  # input files as analysed (relative to the batch out
        # folder when unpacked from an archive)
        pa.field("input_sha256", pa.list_(pa.string())),  # sha256 of each input, same order
        pa.field("report", pa.string()),  # `runs/<run>/report.html` (or verdict.json), relative
        pa.field("tool_version", pa.string()),
    ]
)


def _losses(items: list[Loss]) -> dict[str, float]:
    out = {c: 0.0 for c in LOSS_COLUMNS}
    for item in items:
        col = f"loss_{item.category}"
        if col in out:
            out[col] += item.fraction
    return out


def _top_loss(items: list[Loss]) -> str | None:
    best = max((i for i in items if i.fraction), key=lambda i: i.fraction, default=None)
    return best.category if best else None


def _findings(findings: list[Finding]) -> list[str]:
    ranked = sorted(findings, key=lambda f: (-(f.lost_fraction or 0.0), f.rule))
    out = []
    for f in ranked[:TOP_FINDINGS]:
        share = f" {f.lost_fraction:.0%}" if f.lost_fraction is not None else ""
        out.append(f"{f.rule}{share}: {f.title}")
    return out


def _headroom(achieved: float | None) -> float | None:
    return 1.0 / achieved if achieved else None


def rows_ok(run_id: str, verdict: Verdict, inputs: list[str], hashes: list[str], report: str) -> list[dict[str, Any]]:
    """The run row and its rank rows, from one (typed) verdict."""
    run, peak = verdict.run, verdict.peak
    names = sorted({g.name for g in run.gpus if g.name})
    common = {
        "run_id": run_id,
        "status": "ok",
        "error": None,
        "formats": "+".join(sorted({s.format for s in verdict.clock.sources if s.format})) or None,
        "peak_gpu": peak.gpu,
        "precision": peak.precision,
        "peak_tflops": peak.tflops,
        "world_size": len(run.ranks),
        "inputs": [path_text(p) for p in inputs],
        "input_sha256": hashes,
        "report": report,
        "tool_version": verdict.tool.version,
    }
    rows = [
        {
            **common,
            "level": "run",
            "rank": None,
            "device": None,
            "gpu": ", ".join(names) or None,
            "window_ns": run.window_ns,
            "utilization": verdict.utilization.trace,
            "utilization_measured": verdict.utilization.measured,
            "achieved_fraction_of_peak": verdict.achieved_fraction_of_peak,
            "achieved_is_lower_bound": verdict.achieved_is_lower_bound,
            "headroom": verdict.headroom.factor,
            "verdict": verdict.verdict,
            **_losses(verdict.losses),
            "top_loss": _top_loss(verdict.losses),
            "top_findings": _findings(verdict.findings),
            "findings": len(verdict.findings),
        }
    ]
    for r in sorted(verdict.ranks, key=lambda r: (r.rank is None, r.rank or 0, r.device is None, r.device or 0)):
        mine = [f for f in verdict.findings if f.rank == r.rank]
        gpu = r.gpu or next((g.name for g in run.gpus if g.rank == r.rank and g.device == r.device), None)
        rows.append(
            {
                **common,
                "level": "rank",
                "rank": r.rank,
                "device": r.device,
                "gpu": gpu,
                "window_ns": r.window_ns,
                "utilization": r.utilization.trace,
                "utilization_measured": r.utilization.measured,
                "achieved_fraction_of_peak": r.achieved_fraction_of_peak,
                "achieved_is_lower_bound": None,
                "headroom": _headroom(r.achieved_fraction_of_peak),
                "verdict": None,
                **_losses(r.losses),
                "top_loss": _top_loss(r.losses),
                "top_findings": _findings(mine),
                "findings": len(mine),
            }
        )
    return rows


def row_failed(run_id: str, error: str, inputs: list[str], hashes: list[str] | None) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: None for f in SCHEMA}
    row.update(
        run_id=run_id,
        level="run",
        status="failed",
        error=path_text(error),
        inputs=[path_text(p) for p in inputs],
        input_sha256=hashes,
    )
    return row


def row_unread(path: str, why: str) -> dict[str, Any]:
    """A file or folder of the batch's inputs that no run took, and why."""
    row: dict[str, Any] = {f.name: None for f in SCHEMA}
    row.update(run_id=path_text(path), level="unread", status="not analysed", error=path_text(why), inputs=[path_text(path)])
    return row


def table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows in a fixed order (run id, then the run row, then ranks), whatever order the executor finished in."""
    level_order = {"run": 0, "rank": 1, "unread": 2}
    ordered = sorted(
        rows,
        key=lambda r: (
            level_order.get(r["level"], 3) == 2,
            r["run_id"],
            level_order.get(r["level"], 3),
            r["rank"] if r["rank"] is not None else -1,
            r["device"] if r["device"] is not None else -1,
        ),
    )
    return pa.Table.from_pylist(ordered, schema=SCHEMA)
