"""The peak table: dense datasheet peaks per GPU and precision, matched by the device name in the trace."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class GpuPeaks:
    key: str
    name: str
    match: str
    tflops: dict[str, float]
    memory_bandwidth_gbs: float | None
    source: str

    def peak_flop_s(self, precision: str) -> float | None:
        t = self.tflops.get(precision)
        return t * 1e12 if t else None


@dataclass(frozen=True)
class Peak:
    """The peak one analysis uses."""

    gpu: str | None
    gpu_key: str | None
    precision: str
    flop_s: float | None
    bandwidth_bytes_s: float | None
    source: str
    known: bool


def load_table(extra: Path | None = None) -> list[GpuPeaks]:
    """Built-in table, with entries of `extra` (same layout) placed first so they override."""
    text = resources.files("plasmient_report").joinpath("peaks.toml").read_text(encoding="utf-8")
    rows = tomllib.loads(text)["gpu"]
    if extra is not None:
        try:
            user = tomllib.loads(Path(extra).read_text(encoding="utf-8")).get("gpu", [])
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise BadInput(extra, f"cannot read peaks file ({e})") from None
        if not isinstance(user, list):
            raise BadInput(extra, "peaks file must hold [[gpu]] tables")
        rows = list(user) + rows
    table = []
    for r in rows:
        try:
            table.append(GpuPeaks(
                key=str(r["key"]), name=str(r.get("name", r["key"])), match=str(r.get("match", re.escape(r["key"]))),
                tflops={p: float(r[p]) for p in PRECISIONS if p in r},
                memory_bandwidth_gbs=float(r["memory_bandwidth_gbs"]) if "memory_bandwidth_gbs" in r else None,
                source=str(r.get("source", "user peaks file"))))
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(extra, f"bad [[gpu]] entry {r!r} ({e})") from None
    return table


def match_gpu(name: str | None, table: list[GpuPeaks]) -> GpuPeaks | None:
    if not name:
        return None
    for g in table:
        if re.search(g.match, name, re.IGNORECASE) or g.key.lower() == name.lower():
            return g
    return None


def choose_peak(device_name: str | None, precision: str, table: list[GpuPeaks],
                gpu_override: str | None = None, tflops_override: float | None = None) -> Peak:
    name = gpu_override or device_name
    g = match_gpu(name, table)
    if tflops_override is not None:
        return Peak(gpu=name, gpu_key=g.key if g else None, precision=precision, flop_s=tflops_override * 1e12,
                    bandwidth_bytes_s=g.memory_bandwidth_gbs * 1e9 if g and g.memory_bandwidth_gbs else None,
                    source="--peak-tflops", known=True)
    if g is None:
        return Peak(gpu=name, gpu_key=None, precision=precision, flop_s=None, bandwidth_bytes_s=None,
                    source=f"unknown GPU {name!r}: no peak (give --gpu or --peak-tflops)", known=False)
    flop_s = g.peak_flop_s(precision)
    src = g.source
    fallback = {"tf32": "fp32", "bf16": "fp16", "fp16": "bf16", "fp64_tensor": "fp64"}.get(precision)
    if flop_s is None and fallback and g.peak_flop_s(fallback):
        flop_s, src = g.peak_flop_s(fallback), g.source + f" (no {precision} figure: {fallback} used)"
        precision = fallback
    return Peak(gpu=g.name, gpu_key=g.key, precision=precision, flop_s=flop_s,
                bandwidth_bytes_s=g.memory_bandwidth_gbs * 1e9 if g.memory_bandwidth_gbs else None,
                source=src if flop_s else f"{g.name} has no {precision} figure in the table", known=flop_s is not None)
