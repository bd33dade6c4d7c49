"""Nsight Compute CSV (`ncu --csv`, the long "details" page or the wide `--page raw`) → `ncu_kernels`.

One row per profiled launch: duration, DRAM bytes and FLOPs counted by the hardware — tensor ops from
`sm__ops_path_tensor_src_*` (by source precision), FP32/FP64/FP16 from the FFMA/FMUL/FADD thread-instruction
counts (2·fma + mul + add, the NERSC roofline method), from the `.sum` counts or, in roofline sections, from
`.sum.per_cycle_elapsed` × cycles/s × duration. A launch's FLOPs are unknown (not 0) when the CSV has no CUDA-core
count for it and no tensor op either. DRAM bytes are read + write (`dram__bytes_read/_write`, on GB20x
`dram__bytes_op_read/_write`), else `dram__bytes`. Thousands separators (either locale) and auto-scaled units
(`usecond`, `Mbyte`, `Gbyte/second`) are undone. The align stage joins launches to trace kernels by name and
occurrence order (ncu replays kernels one by one, so its times mean nothing on the trace's clock).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ..errors import BadInput
from . import _counters as C
from .base import Format, ParseOptions, Sniff, SourceInfo

ID_COLS = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)
FMA_OPS = {"fp32": ("ffma", "fmul", "fadd"), "fp64": ("dfma", "dmul", "dadd"), "fp16": ("hfma", "hmul", "hadd")}
# Display names of the default sections (details page without --metrics) that we can use.
DISPLAY = {"Duration": "gpu__time_duration.sum", "DRAM Bytes": "dram__bytes.sum"}
_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_BASE_RE = re.compile(r"^([KkMGTPmun]?)(byte|inst|cycle|hz|Hz|warp|sector|request|thread|block|flop|register|B)$")
RATE_SUFFIXES = (".sum.per_second", ".sum.per_cycle_elapsed")


def looks_like_ncu(text_head: str) -> bool:
    return any(line.startswith('"ID","Process ID"') for line in text_head.splitlines()[:50])


def unit_factor(unit: str) -> float:
    """Multiplier from the printed unit to the base unit: ns for times, bytes, per-second for rates."""
    u = (unit or "").strip()
    if not u or u == "%":
        return 1.0
    num, _, den = u.partition("/")
    if num in _TIME_NS:
        f = _TIME_NS[num]
    else:
        m = _BASE_RE.match(num)
        f = _PREFIX[m.group(1)] if m else 1.0
    if den:
        if den in _TIME_NS:
            f = f * 1e9 / _TIME_NS[den]  # per <den> → per second
        else:
            m = _BASE_RE.match(den)
            f /= _PREFIX[m.group(1)] if m else 1.0
    return f


def _locale_is_dotted(values: list[str]) -> bool:
    """True for the '27.595.520' / '1.234,5' locale; False (the default) for '27,595,520.5'. A lone '10,240'
    says nothing; grouped thousands or a short decimal part do."""

    def says(v: str, group: str, dec: str) -> bool:
        g, d = re.escape(group), re.escape(dec)
        return bool(
            re.fullmatch(rf"-?\d{{1,3}}({g}\d{{3}}){{2,}}", v)
            or re.fullmatch(rf"-?\d{{1,3}}({g}\d{{3}})+{d}\d+", v)
            or re.fullmatch(rf"-?\d+{d}(\d{{1,2}}|\d{{4,}})", v)
        )

    dotted = sum(1 for v in values if says(v, ".", ","))
    commas = sum(1 for v in values if says(v, ",", "."))
    return dotted > commas


def _number(v: str, dotted: bool) -> float | None:
    v = v.strip().strip('"')
    if not v or v.lower() in ("n/a", "no data", "nan", "(!) n/a"):
        return None
    v = v.replace(",", "") if not dotted else v.replace(".", "").replace(",", ".")
    try:
        return float(v)
    except ValueError:
        return None


@dataclass
class Launch:
    launch_id: int
    name: str
    device: int | None
    process_id: int | None
    grid: str | None
    block: str | None
    metrics: dict[str, float]


def _launches(path: Path, text: str) -> tuple[list[Launch], str]:
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # ==PROF== lines and app output are not CSV
    if not lines:
        raise BadInput(path, "no CSV rows (ncu output without --csv?)")
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    if "Kernel Name" not in header:
        raise BadInput(path, "Nsight Compute CSV without a 'Kernel Name' column")
    col = {h: i for i, h in enumerate(header)}
    if "Metric Name" in col and "Metric Value" in col:
        return _long(path, rows, col), "details page (long)"
    return _wide(path, rows, header, col), "raw page (wide)"


def _id_fields(r: list[str], col: dict[str, int]) -> tuple[str, int | None, int | None, str | None, str | None]:
    def get(name: str) -> str | None:
        return r[col[name]] if name in col and col[name] < len(r) else None

    def as_int(x: str | None) -> int | None:
        x = (x or "").replace(",", "").replace(".", "")
        return int(x) if x.isascii() and x.isdigit() and len(x) < 10 else None  # an id, not a number to overflow

    return get("Kernel Name") or "", as_int(get("Device")), as_int(get("Process ID")), get("Grid Size"), get("Block Size")


def _wide(path: Path, rows: list[list[str]], header: list[str], col: dict[str, int]) -> list[Launch]:
    body = rows[1:]
    units: list[str] = [""] * len(header)
    if body and (body[0][col["ID"]] if "ID" in col else "") == "":
        units, body = body[0], body[1:]
    wanted = [i for i, h in enumerate(header) if _wanted(h)]
    dotted = _locale_is_dotted([r[i] for r in body[:50] for i in wanted if i < len(r)])
    out = []
    for n, r in enumerate(body):
        if len(r) != len(header):
            raise BadInput(path, f"CSV row {n + 2} has {len(r)} fields, the header {len(header)}")
        name, dev, pid, grid, block = _id_fields(r, col)
        m: dict[str, float] = {}
        for i in wanted:
            x = _number(r[i], dotted)
            if x is not None:
                m[header[i]] = x * unit_factor(units[i] if i < len(units) else "")
        lid = _number(r[col["ID"]], False) if "ID" in col else None
        out.append(Launch(_launch_id(lid, n), name, dev, pid, grid, block, m))
    return out


def _long(path: Path, rows: list[list[str]], col: dict[str, int]) -> list[Launch]:
    iname, iunit, ival = col["Metric Name"], col.get("Metric Unit"), col["Metric Value"]
    dotted = _locale_is_dotted([r[ival] for r in rows[1:400] if len(r) > ival])
    by_id: dict[str, Launch] = {}
    for n, r in enumerate(rows[1:]):
        if len(r) <= ival:
            raise BadInput(path, f"CSV row {n + 2} has {len(r)} fields, the header {len(rows[0])}")
        key = r[col["ID"]] if "ID" in col else str(n)
        metric = DISPLAY.get(r[iname], r[iname])
        if key not in by_id:
            name, dev, pid, grid, block = _id_fields(r, col)
            lid = _number(key, False)
            by_id[key] = Launch(_launch_id(lid, len(by_id)), name, dev, pid, grid, block, {})
        if not _wanted(metric):
            continue
        x = _number(r[ival], dotted)
        if x is not None:
            by_id[key].metrics[metric] = x * unit_factor(r[iunit] if iunit is not None else "")
    return list(by_id.values())


def _launch_id(lid: float | None, default: int) -> int:
    return int(lid) if lid is not None and 0 <= lid < 2**62 else default  # NaN, inf, huge: no id


def _wanted(h: str) -> bool:
    return (
        h.startswith(
            (
                "gpu__time_duration.",
                "dram__bytes",
                "sm__ops_path_tensor_src_",
                "smsp__ops_path_tensor_src_",
                "sm__inst_executed_pipe_tensor.sum",
            )
        )
        or "_cycles_elapsed.avg.per_second" in h
        or (("sass_thread_inst_executed_op_" in h) and "_pred_on.sum" in h and ".peak" not in h)
    )


def _count(m: dict[str, float], base: str, dur_s: float | None) -> float | None:
    """Total count of `base` (e.g. smsp__sass_thread_inst_executed_op_ffma_pred_on): .sum, else rate × time."""
    if f"{base}.sum" in m:
        return m[f"{base}.sum"]
    if dur_s is None:
        return None
    if f"{base}.sum.per_second" in m:
        return m[f"{base}.sum.per_second"] * dur_s
    if f"{base}.sum.per_cycle_elapsed" in m:
        unit = base.split("__", 1)[0]
        hz = (
            m.get(f"{unit}__cycles_elapsed.avg.per_second")
            or m.get("smsp__cycles_elapsed.avg.per_second")
            or m.get("sm__cycles_elapsed.avg.per_second")
        )
        return m[f"{base}.sum.per_cycle_elapsed"] * hz * dur_s if hz else None
    return None


@dataclass
class Counted:
    duration_ns: float | None
    dram_bytes: float | None
    flops: float | None
    tensor: float | None
    by_precision: dict[str, float | None]
    tensor_precision: str | None
    tensor_unknown: bool


def count_flops(m: dict[str, float]) -> Counted:
    dur = next((m[k] for k in ("gpu__time_duration.sum", "gpu__time_duration.avg", "gpu__time_duration.max") if k in m), None)
    dur_s = dur / 1e9 if dur is not None else None
    dram: float | None
    if "dram__bytes_read.sum" in m and "dram__bytes_write.sum" in m:
        dram = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
    elif "dram__bytes_op_read.sum" in m and "dram__bytes_op_write.sum" in m:
        # their names on GB20x (RTX 50): `ncu --query-metrics --chip gb202` (2025.3) lists dram__bytes_op_read / _write,
        # "# of bytes read from / written to DRAM", where gh100, gb100 and ga100 list dram__bytes_read / _write
        dram = m["dram__bytes_op_read.sum"] + m["dram__bytes_op_write.sum"]
    else:
        dram = _count(m, "dram__bytes", dur_s)
    by: dict[str, float | None] = {}
    for prec, (fma, mul, add) in FMA_OPS.items():
        parts = []
        for op, weight in ((fma, 2.0), (mul, 1.0), (add, 1.0)):
            c = _count(m, f"sm__sass_thread_inst_executed_op_{op}_pred_on", dur_s)
            if c is None:
                c = _count(m, f"smsp__sass_thread_inst_executed_op_{op}_pred_on", dur_s)
            if c is not None:
                parts.append(weight * c)
        by[prec] = sum(parts) if parts else None
    tensor_bases = sorted({k.split(".")[0] for k in m if k.startswith("sm__ops_path_tensor_src_")}) or sorted(
        {k.split(".")[0] for k in m if k.startswith("smsp__ops_path_tensor_src_")}
    )
    tensor: float | None = None
    prec_of: dict[str, float] = {}
    for b in tensor_bases:
        c = _count(m, b, dur_s)
        if c is None:
            continue
        p = re.search(r"_src_([a-z0-9]+)", b)
        key = p.group(1) if p else "tensor"
        prec_of[key] = prec_of.get(key, 0.0) + c
        tensor = (tensor or 0.0) + c
    tensor_unknown = False
    if tensor is None:
        inst = m.get("sm__inst_executed_pipe_tensor.sum")
        if inst == 0:
            tensor = 0.0
        elif inst is not None:
            tensor_unknown = True  # tensor instructions ran, but no per-precision op counts to turn into FLOPs
    known = [v for v in (*by.values(), tensor) if v is not None]
    # No tensor work (or none counted) and no CUDA-core count: the kernel's FLOPs are not known, not 0 (a CSV of a
    # tensor path's op count alone, 0 for a kernel that does its arithmetic on the CUDA cores).
    no_core_count = all(v is None for v in by.values())
    flops = None if tensor_unknown or not known or (no_core_count and not tensor) else float(sum(known))
    tp = max(prec_of, key=lambda k: prec_of[k]) if prec_of and max(prec_of.values()) > 0 else None
    return Counted(dur, dram, flops, tensor, by, tp, tensor_unknown)


def ingest(path: Path, con, source_id: int, options: ParseOptions | None = None) -> SourceInfo:
    launches, version = _launches(path, C.read_text(path))
    if not launches:
        raise BadInput(path, "Nsight Compute CSV without profiled launches")
    occ: dict[str, int] = {}
    cols: dict[str, list] = {
        k: []
        for k in (
            "launch_id",
            "occurrence",
            "name",
            "device",
            "process_id",
            "grid",
            "block",
            "duration_ns",
            "flops",
            "flops_tensor",
            "flops_fp64",
            "flops_fp32",
            "flops_fp16",
            "tensor_precision",
            "dram_bytes",
        )
    }
    unknown_tensor = 0
    for ln in launches:
        c = count_flops(ln.metrics)
        unknown_tensor += c.tensor_unknown
        cols["launch_id"].append(ln.launch_id)
        cols["occurrence"].append(occ.get(ln.name, 0))
        occ[ln.name] = occ.get(ln.name, 0) + 1
        cols["name"].append(ln.name)
        cols["device"].append(ln.device)
        cols["process_id"].append(ln.process_id)
        cols["grid"].append(ln.grid)
        cols["block"].append(ln.block)
        cols["duration_ns"].append(c.duration_ns)
        cols["flops"].append(c.flops)
        cols["flops_tensor"].append(c.tensor)
        cols["flops_fp64"].append(c.by_precision["fp64"])
        cols["flops_fp32"].append(c.by_precision["fp32"])
        cols["flops_fp16"].append(c.by_precision["fp16"])
        cols["tensor_precision"].append(c.tensor_precision)
        cols["dram_bytes"].append(c.dram_bytes)
    tbl = pa.table({k: pa.array(v) for k, v in cols.items()})
    con.register("_ncu_rows", tbl)
    con.execute(f"""
        INSERT INTO ncu_kernels (source_id, launch_id, occurrence, name, device, process_id, grid, block, duration_ns,
                                 flops, flops_tensor, flops_fp64, flops_fp32, flops_fp16, tensor_precision, dram_bytes)
        SELECT {int(source_id)}, launch_id, occurrence, name, device, process_id, grid, block, duration_ns, flops,
               flops_tensor, flops_fp64, flops_fp32, flops_fp16, tensor_precision, dram_bytes FROM _ncu_rows""")
    con.unregister("_ncu_rows")
    notes = []
    with_flops = sum(1 for f in cols["flops"] if f is not None)
    notes.append(f"{len(launches)} launches, {with_flops} with FLOP counts")
    if unknown_tensor:
        notes.append(
            f"{unknown_tensor} launches ran tensor instructions but the CSV has no sm__ops_path_tensor_* "
            "counts: their FLOPs are left to the shape models (collect --section "
            "SpeedOfLight_HierarchicalTensorRooflineChart or --metrics sm__ops_path_tensor_src_*.sum)"
        )
    if with_flops:
        notes.append(
            "tensor-op counts are the work the tensor cores executed, tile padding included: a GEMM whose "
            "sizes are not multiples of its tile counts a few % more than 2·M·N·K"
        )
    return SourceInfo(
        format="ncu-csv",
        format_version=version,
        rank=None,
        rank_method="counters",
        clock_anchor="none",
        events=len(launches),
        notes=notes,
    )


def sniff(s: Sniff) -> str | None:
    first = s.first_line
    if first.startswith('"ID","Process ID"') or first.startswith("==PROF==") or looks_like_ncu(s.text):
        return "ncu-csv"
    return None


FORMATS = (Format("ncu-csv", "Nsight Compute CSV", ingest, auxiliary=True),)
