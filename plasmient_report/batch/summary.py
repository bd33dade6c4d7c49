"""The fleet summary's rows: one per run and one per rank (GPU) of it, read from the run's verdict.json.

The columns are the Arrow schema below (docs/batch.md documents each). Rows hold only what the verdict and the
inputs say — no times, process ids or absolute work paths — so every executor writes the same summary.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..metrics import CATEGORIES

TOP_FINDINGS = 3
LOSS_COLUMNS = tuple(f"loss_{c}" for c in CATEGORIES)

SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),          # `<archive label>/<run folder or prefix>`
    pa.field("level", pa.string(), nullable=False),           # 'run' (whole run) | 'rank' (one GPU of it)
    pa.field("rank", pa.int32()),                              # null on run rows
    pa.field("device", pa.int32()),                            # CUDA ordinal in that rank's process; null on run rows
    pa.field("status", pa.string(), nullable=False),          # 'ok' | 'failed'
    pa.field("error", pa.string()),                            # the failure, one line (failed runs)
    pa.field("formats", pa.string()),                          # trace/log formats read, '+'-joined (kineto, nsys-sqlite, …)
    pa.field("gpu", pa.string()),                              # GPU name(s) as the trace gives them
    pa.field("peak_gpu", pa.string()),                         # the peak-table entry used
    pa.field("precision", pa.string()),                        # precision of the peak
    pa.field("peak_tflops", pa.float64()),
    pa.field("world_size", pa.int32()),                        # ranks in the run
    pa.field("window_ns", pa.int64()),                         # analysed window (the run's: the longest rank)
    pa.field("utilization", pa.float64()),                     # fraction of the window with a kernel resident (trace)
    pa.field("utilization_measured", pa.float64()),            # from NVML / DCGM / nvidia-smi samples, when given
    pa.field("achieved_fraction_of_peak", pa.float64()),
    pa.field("achieved_is_lower_bound", pa.bool_()),           # low FLOP coverage: a lower bound (run rows)
    pa.field("headroom", pa.float64()),                        # 1 / achieved fraction of peak
    pa.field("verdict", pa.string()),                          # verdict word (run rows)
    *[pa.field(c, pa.float64()) for c in LOSS_COLUMNS],       # lost fraction of the window per category
    pa.field("top_loss", pa.string()),                         # the largest loss category
    pa.field("top_findings", pa.list_(pa.string())),           # up to 3: `PR101 36%: title`, by lost fraction
    pa.field("findings", pa.int32()),                          # findings in total (rank rows: about that rank)
    pa.field("inputs", pa.list_(pa.string())),                 # input files as analysed (relative to the batch out
                                                               # folder when unpacked from an archive)
    pa.field("input_sha256", pa.list_(pa.string())),           # sha256 of each input, same order
    pa.field("report", pa.string()),                           # `runs/<run>/report.html` (or verdict.json), relative
    pa.field("tool_version", pa.string()),
])


def _losses(items: list[dict[str, Any]]) -> dict[str, float]:
    out = {c: 0.0 for c in LOSS_COLUMNS}
    for item in items:
        col = f"loss_{item.get('category')}"
        if col in out and item.get("fraction") is not None:
            out[col] += float(item["fraction"])
    return out


def _top_loss(items: list[dict[str, Any]]) -> str | None:
    best = max((i for i in items if i.get("fraction")), key=lambda i: i["fraction"], default=None)
    return best["category"] if best else None


def _findings(findings: list[dict[str, Any]]) -> list[str]:
    ranked = sorted(findings, key=lambda f: (-(f.get("lost_fraction") or 0.0), f.get("rule") or ""))
    out = []
    for f in ranked[:TOP_FINDINGS]:
        lost = f.get("lost_fraction")
        share = f" {lost:.0%}" if lost is not None else ""
        out.append(f"{f.get('rule')}{share}: {f.get('title')}")
    return out


def _headroom(achieved: float | None) -> float | None:
    return 1.0 / achieved if achieved else None


def rows_ok(run_id: str, verdict: dict[str, Any], inputs: list[str], hashes: list[str], report: str) -> list[dict[str, Any]]:
    """The run row and its rank rows, from one verdict."""
    run = verdict.get("run") or {}
    peak = verdict.get("peak") or {}
    util = verdict.get("utilization") or {}
    sources = (verdict.get("clock") or {}).get("sources") or []
    gpus = run.get("gpus") or []
    findings = verdict.get("findings") or []
    names = sorted({g.get("name") for g in gpus if g.get("name")})
    common = {
        "run_id": run_id, "status": "ok", "error": None,
        "formats": "+".join(sorted({s.get("format") for s in sources if s.get("format")})) or None,
        "peak_gpu": peak.get("gpu"), "precision": peak.get("precision"), "peak_tflops": peak.get("tflops"),
        "world_size": len(run.get("ranks") or []), "inputs": inputs, "input_sha256": hashes, "report": report,
        "tool_version": (verdict.get("tool") or {}).get("version"),
    }
    achieved = verdict.get("achieved_fraction_of_peak")
    rows = [{
        **common, "level": "run", "rank": None, "device": None, "gpu": ", ".join(names) or None,
        "window_ns": run.get("window_ns"), "utilization": util.get("trace"), "utilization_measured": util.get("measured"),
        "achieved_fraction_of_peak": achieved, "achieved_is_lower_bound": verdict.get("achieved_is_lower_bound"),
        "headroom": (verdict.get("headroom") or {}).get("factor"), "verdict": verdict.get("verdict"),
        **_losses(verdict.get("losses") or []), "top_loss": _top_loss(verdict.get("losses") or []),
        "top_findings": _findings(findings), "findings": len(findings),
    }]
    for r in sorted(verdict.get("ranks") or [], key=lambda r: (r.get("rank") is None, r.get("rank"), r.get("device"))):
        mine = [f for f in findings if f.get("rank") == r.get("rank")]
        gpu = next((g.get("name") for g in gpus if g.get("rank") == r.get("rank") and g.get("device") == r.get("device")),
                   None)
        rutil = r.get("utilization") or {}
        rows.append({
            **common, "level": "rank", "rank": r.get("rank"), "device": r.get("device"), "gpu": gpu,
            "window_ns": r.get("window_ns"), "utilization": rutil.get("trace"), "utilization_measured": rutil.get("measured"),
            "achieved_fraction_of_peak": r.get("achieved_fraction_of_peak"), "achieved_is_lower_bound": None,
            "headroom": _headroom(r.get("achieved_fraction_of_peak")), "verdict": None,
            **_losses(r.get("losses") or []), "top_loss": _top_loss(r.get("losses") or []),
            "top_findings": _findings(mine), "findings": len(mine),
        })
    return rows


def row_failed(run_id: str, error: str, inputs: list[str], hashes: list[str] | None) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: None for f in SCHEMA}
    row.update(run_id=run_id, level="run", status="failed", error=error, inputs=inputs, input_sha256=hashes)
    return row


def table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows in a fixed order (run id, then the run row, then ranks), whatever order the executor finished in."""
    ordered = sorted(rows, key=lambda r: (r["run_id"], r["level"] != "run", r["rank"] if r["rank"] is not None else -1,
                                          r["device"] if r["device"] is not None else -1))
    return pa.Table.from_pylist(ordered, schema=SCHEMA)
