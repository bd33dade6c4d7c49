"""dcgm-exporter metrics → `counters`: Prometheus text scrapes, or a Prometheus range-query JSON answer.

Scrape lines carry no time of their own: a file of several scrapes separates them by an `<epoch>\\t` prefix on
each line or a `# scrape_ts=<epoch>` comment before each scrape ('prefixed'); a sample's own trailing
timestamp wins. Prometheus `query_range` / `query` JSON (`[[unix_s, "v"], …]`) is 'native'. Parsing of the text
format is prometheus_client's. Names are DCGM field names (old and renamed ones).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import BadInput
from . import _counters as C
from ._polars import pl
from .base import Format, ParseOptions, Sniff, SourceInfo

MIB = float(1 << 20)
# DCGM field name → (metric, factor). *_RATIO names (DCGM 4 renames) are 0–1; the old *_UTIL names are %.
NAMES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("mem_temp_c", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power_w", 1.0),
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", 0.01),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("gpu_util", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL_RATIO": ("mem_util", 1.0),
    "DCGM_FI_DEV_ENC_UTIL": ("enc_util", 0.01),
    "DCGM_FI_DEV_DEC_UTIL": ("dec_util", 0.01),
    "DCGM_FI_DEV_FB_FREE": ("fb_free_bytes", MIB),
    "DCGM_FI_DEV_FB_USED": ("fb_used_bytes", MIB),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("pcie_tx_bytes_s", 1024.0),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("pcie_rx_bytes_s", 1024.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_s", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": ("tensor_imma_active", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("tensor_hmma_active", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": ("tensor_dfma_active", 1.0),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("int_active", 1.0),
}
PREFIX_RE = re.compile(r"^(\d{9,19}(?:\.\d+)?)\t(.*)$")
SCRAPE_TS_RE = re.compile(r"^#\s*scrape_ts\s*=\s*(\d{9,19}(?:\.\d+)?)\s*$")


def _epoch_ns(text: str) -> int:
    whole, _, frac = text.partition(".")
    if len(whole) > 11:  # ms / µs / ns epochs
        return int(whole) * 10 ** (19 - len(whole))
    return int(whole) * 10**9 + int((frac + "000000000")[:9])


def _scrapes(text: str) -> tuple[list[tuple[int | None, str]], int]:
    """Split a file into (time, text) scrapes; second value: lines given a time by neither convention."""
    scrapes: list[tuple[int | None, list[str]]] = []
    cur_t: int | None = None
    cur: list[str] = []
    prefixed = 0
    for line in text.splitlines():
        m = PREFIX_RE.match(line)
        if m:
            t = _epoch_ns(m.group(1))
            prefixed += 1
            if t != cur_t and cur:
                scrapes.append((cur_t, cur))
                cur = []
            cur_t = t
            cur.append(m.group(2))
            continue
        m = SCRAPE_TS_RE.match(line.strip())
        if m:
            if cur:
                scrapes.append((cur_t, cur))
            cur, cur_t = [], _epoch_ns(m.group(1))
            continue
        cur.append(line)
    if cur:
        scrapes.append((cur_t, cur))
    return [(t, "\n".join(lines) + "\n") for t, lines in scrapes], prefixed


def _labels_row(labels: dict[str, str]) -> tuple[int | None, str | None, str | None, str | None, str]:
    gpu = labels.get("gpu", labels.get("minor_number"))
    idx = int(gpu) if gpu is not None and gpu.isascii() and gpu.isdigit() and len(gpu) < 10 else None
    uuid = labels.get("UUID") or labels.get("uuid") or None
    bus = labels.get("pci_bus_id") or None
    name = labels.get("modelName") or None
    gi = labels.get("GPU_I_ID")
    entity = f"GPU-I {gi}" if gi not in (None, "") else f"GPU {gpu}" if gpu is not None else "GPU"
    return idx, uuid, bus, name, entity


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    text = C.read_text(path)
    notes: list[str] = []
    rec: dict[str, list] = {k: [] for k in ("t_ns", "raw_time", "gpu_index", "gpu_uuid", "entity", "metric", "value")}
    devices: dict[tuple, tuple] = {}
    unknown: set[str] = set()
    head = text.lstrip()[:1]
    if head in ("{", "["):
        anchor, version = "native", "Prometheus query JSON"
        _from_query_json(path, text, rec, devices, unknown)
    else:
        scrapes, prefixed = _scrapes(text)
        stamped = [s for s in scrapes if s[0] is not None]
        version = "Prometheus text"
        if stamped:
            anchor = "prefixed"
            if len(stamped) < len(scrapes) and any(s[1].strip() for s in scrapes if s[0] is None):
                notes.append("text before the first scrape time was ignored")
            scrapes = stamped
        else:
            anchor = "synthesized"
            scrapes = [(C.file_mtime_ns(path), s[1]) for s in scrapes]
            notes.append(
                "no scrape times (no '<epoch>\\t' prefix or '# scrape_ts=' comment): one scrape at the "
                "file's mtime, low confidence"
            )
        # imported here: prometheus_client costs every run ~25 ms of start-up, and only this format needs it
        from prometheus_client.parser import text_string_to_metric_families

        bad = 0
        for t_ns, body in scrapes:
            try:
                families = list(text_string_to_metric_families(body))
            except (ValueError, TypeError, IndexError) as e:
                bad += 1
                if bad == 1:
                    notes.append(f"unreadable scrape skipped ({str(e)[:80]})")
                continue
            for fam in families:
                for smp in fam.samples:
                    if smp.name not in NAMES and smp.name.endswith("_total") and smp.name[:-6] in NAMES:
                        smp = smp._replace(name=smp.name[:-6])  # the client names counter samples *_total
                    if smp.name not in NAMES:
                        if smp.name.startswith("DCGM_"):
                            unknown.add(smp.name)
                        continue
                    idx, uuid, bus, name, entity = _labels_row(smp.labels)
                    metric, factor = NAMES[smp.name]
                    ts = float(smp.timestamp) * 1e9 if smp.timestamp is not None else float(t_ns or 0)
                    t = int(ts) if math.isfinite(ts) else 0  # no time: dropped by _add
                    _add(rec, t, str(t_ns), idx, uuid, entity, metric, smp.value * factor)
                    devices[(idx, uuid, bus)] = (idx, uuid, bus, name, None)
        if bad > 1:
            notes.append(f"{bad} unreadable scrapes skipped")
    if not rec["t_ns"]:
        raise BadInput(path, "dcgm-exporter file has no DCGM_FI_* samples we read")
    if unknown:
        notes.append(f"metrics not read: {', '.join(sorted(unknown)[:12])}")
    long = pl.DataFrame(
        rec,
        schema={
            "t_ns": pl.Int64,
            "raw_time": pl.Utf8,
            "gpu_index": pl.Int32,
            "gpu_uuid": pl.Utf8,
            "entity": pl.Utf8,
            "metric": pl.Utf8,
            "value": pl.Float64,
        },
    )
    # A *_RATIO family logged in % (exporters differ): values above 1.5 mean percent.
    frac = list(C.FRACTION_METRICS)
    over = (
        long.filter(pl.col("metric").is_in(frac))
        .group_by("metric")
        .agg(pl.col("value").max())
        .filter(pl.col("value") > 1.5)["metric"]
        .to_list()
    )
    if over:
        long = long.with_columns(
            pl.when(pl.col("metric").is_in(over)).then(pl.col("value") / 100).otherwise(pl.col("value")).alias("value")
        )
        notes.append(f"{', '.join(over)} were in percent: divided by 100")
    wide = long.pivot(
        on="metric", index=["t_ns", "raw_time", "gpu_index", "gpu_uuid", "entity"], values="value", aggregate_function="mean"
    )
    w = C.emit(con, source_id, wide, anchor)
    notes += w.notes
    C.add_devices(con, source_id, [d for d in devices.values() if d[0] is not None or d[1] is not None])
    if long.filter(pl.col("entity").str.starts_with("GPU-I")).height:
        notes.append("MIG instance series (GPU_I_ID) are kept with their entity, not matched to a GPU")
    return SourceInfo(
        format="dcgm-exporter",
        format_version=version,
        rank=None,
        rank_method="counters",
        clock_anchor=anchor,
        events=w.rows,
        notes=notes,
        sample_period_ns=w.effective_period_ns,
    )


def _add(
    rec: dict[str, list], t: int, raw: str, idx: int | None, uuid: str | None, entity: str, metric: str, value: float
) -> None:
    if not -(2**62) < t < 2**62:  # no time (before 1823 or after 2116): the sample is left out
        return
    rec["t_ns"].append(t)
    rec["raw_time"].append(raw)
    rec["gpu_index"].append(idx if not entity.startswith("GPU-I") else None)
    rec["gpu_uuid"].append(uuid)
    rec["entity"].append(entity)
    rec["metric"].append(metric)
    rec["value"].append(value)


def _from_query_json(path: Path, text: str, rec: dict[str, list], devices: dict, unknown: set[str]) -> None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(path, f"malformed JSON ({e})") from None
    except RecursionError:
        raise BadInput(path, "JSON nested too deeply to be a Prometheus answer") from None
    except ValueError:  # (an integer of more digits than Python converts: sys.get_int_max_str_digits())
        raise BadInput(path, "malformed JSON (an integer too long to read)") from None
    data = doc.get("data", doc) if isinstance(doc, dict) else {"result": doc}
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise BadInput(path, "Prometheus JSON without data.result")
    for series in result:
        if not isinstance(series, dict) or not isinstance(series.get("metric") or {}, dict):
            continue
        labels = {k: str(v) for k, v in (series.get("metric") or {}).items()}
        name = labels.get("__name__", "")
        if name not in NAMES:
            if name.startswith("DCGM_"):
                unknown.add(name)
            continue
        metric, factor = NAMES[name]
        idx, uuid, bus, model, entity = _labels_row(labels)
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        for point in points if isinstance(points, list) else []:
            try:
                ts, v = point
                val, t = float(v), int(round(float(ts) * 1e9))
            except (TypeError, ValueError, OverflowError):
                continue  # not a [time, "value"] pair of numbers
            _add(rec, t, str(ts), idx, uuid, entity, metric, val * factor)
        devices[(idx, uuid, bus)] = (idx, uuid, bus, model, None)


def sniff(s: Sniff) -> str | None:
    return "dcgm-exporter" if "DCGM_FI_" in s.text else None


FORMATS = (Format("dcgm-exporter", "dcgm-exporter scrape", ingest, auxiliary=True),)
