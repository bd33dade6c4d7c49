"""Kineto schema variants: the category names of each torch generation, argument keys that changed case, the
top-level document (device properties, distributedInfo, time base), and which GPU each kernel's device id is.

Everything that differs between torch 1.8 and today lives here, apart from the decode (`decode.py`), so a faster
decoder only has to call these functions: `category_sql` / `canonical_category` for `cat`, `normalise_keys` on
the event bytes (old argument spellings), `map_devices` for the `devices` rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

# `cat` as each generation writes it (compared lower-cased) → today's name. torch 1.8–1.9 (libkineto
# output_json.cpp before June 2021): Kernel, Memcpy, Memset, Runtime, Operator, User (a GPU-side user range on
# "stream N user"), Python; mid-2021 `gpu_user_Annotation`; today's names map to themselves.
CATEGORY_ALIASES: dict[str, str] = {
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "operator": "cpu_op",
    "python": "python_function",
    "user": "gpu_user_annotation",
    "user annotation": "user_annotation",
}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation")
CPU_CATS = ("cpu_op", "user_annotation", "python_function")
API_CATS = ("cuda_runtime", "cuda_driver")
# The profiler's own spans: Kineto writes one complete event of category `Trace` per recording, named
# `PyTorch Profiler (N)`, from when it started collecting to when it stopped.
SPAN_CATS = ("trace",)
# The profiler's own overhead: CUPTI's overhead records, which Kineto writes as complete events of category
# `overhead` on no thread of the program (pid -1): `Activity Buffer Request` (CUPTI asking for a buffer, at the
# first activities), `Buffer Flush`, `Lazy Function Loading` (a kernel's module loaded at its first launch),
# `Instrumentation`, `Resource`.
OVERHEAD_CATS = ("overhead",)
# Categories of accelerators that are not GPUs (no kernels this tool can measure): prefix → what the trace is.
NON_GPU_ACCELERATORS = {"mtia": "a Meta MTIA accelerator trace (mtia_* events)"}

# Argument keys whose spelling changed: older spellings → today's (torch 1.8–1.9 wrote `external id` on GPU and
# runtime events and `Input dims` on ops). Keys differing only in case cannot both be columns of one decoded
# struct, so a decoder renames the old spellings in the event bytes (`normalise_keys`) and reads today's; for
# the same reason the allocator's `Bytes` ([memory] events) is read as `Memory Bytes` (copies have `bytes`).
ARG_RENAMES: dict[str, str] = {"external id": "External id", "Input dims": "Input Dims", "Bytes": "Memory Bytes"}
_RENAMES = tuple((f'"{old}"'.encode(), f'"{new}"'.encode()) for old, new in ARG_RENAMES.items())


def normalise_keys(events: bytes) -> bytes:
    """Events (JSON bytes) with old argument spellings renamed. Only a key can be `"external id"` followed by
    `:` with unescaped quotes (inside a JSON string those quotes are escaped), so this is exact."""
    for old, new in _RENAMES:
        if old in events:
            events = events.replace(old + b":", new + b":").replace(old + b" :", new + b" :")
    return events


# The old spellings as `cat` values in event bytes (case-sensitive: today's are all lower case), so a decoder can
# take the plain path for segments without any (`has_old_categories`). One regex pass (its literal `"cat"` prefix
# makes it a fast scan).
_OLD_CATEGORY = re.compile(rb'"cat"\s*:\s*"(?:Kernel|Memcpy|Memset|Runtime|Driver|Operator|Python|User|gpu_user_A)')


def has_old_categories(events: bytes) -> bool:
    """Whether these event bytes may hold a category of an older torch (a false positive only costs time)."""
    return _OLD_CATEGORY.search(events) is not None


def canonical_category(cat: str | None) -> str | None:
    if cat is None:
        return None
    low = cat.lower()
    return CATEGORY_ALIASES.get(low, low)


def category_sql(expr: str, old: bool = True) -> str:
    """SQL: the canonical category of the VARCHAR `expr` (NULL stays NULL); `old=False` for events known to hold
    no old spelling (`has_old_categories`): then the category is `expr` itself."""
    if not old:
        return expr
    cases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in CATEGORY_ALIASES.items())
    return f"CASE lower({expr}) {cases} ELSE lower({expr}) END"


def arg_sql(args: str, key: str) -> str:
    """SQL: the argument `key` of the STRUCT column `args` (old spellings were renamed by `normalise_keys`)."""
    return f'{args}."{key}"'


def non_gpu_accelerator(categories: dict[str, int]) -> str | None:
    """What a trace without GPU work is, when its categories say (an MTIA trace); None otherwise."""
    for prefix, what in NON_GPU_ACCELERATORS.items():
        n = sum(c for cat, c in categories.items() if cat and cat.startswith(prefix))
        if n:
            return f"{what}, no GPU kernels"
    return None


# ------------------------------------------------------------------------------------------- the document


class DeviceProp(msgspec.Struct):
    id: int | None = None
    name: str | None = None
    totalGlobalMem: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    numSms: int | None = None
    warpSize: int | None = None
    # cudaDeviceProp's own spellings, as the early block (`computeProperties`) has them
    major: int | None = None
    minor: int | None = None
    multiProcessorCount: int | None = None

    def __post_init__(self) -> None:
        if self.computeMajor is None:
            self.computeMajor = self.major
        if self.computeMinor is None:
            self.computeMinor = self.minor
        if self.numSms is None:
            self.numSms = self.multiProcessorCount


class PgConfig(msgspec.Struct):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | None = None


class DistributedInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None
    pg_config: list[PgConfig] | None = None
    nccl_version: str | None = None


class TraceHead(msgspec.Struct):
    """The top-level keys this tool reads (any order; every one optional). Values of the wrong type are read
    leniently (`decode_head`): a harness's odd `deviceProperties` does not refuse the trace."""

    traceEvents: msgspec.Raw = msgspec.Raw()
    deviceProperties: msgspec.Raw = msgspec.Raw()
    # The same entries under their first name (Kineto of early 2021, torch 1.8: id, name, major, minor, …)
    computeProperties: msgspec.Raw = msgspec.Raw()
    distributedInfo: msgspec.Raw = msgspec.Raw()
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw()
    schemaVersion: msgspec.Raw = msgspec.Raw()
    cuda_runtime_version: msgspec.Raw = msgspec.Raw()
    hip_runtime_version: msgspec.Raw = msgspec.Raw()
    roctracer_version: msgspec.Raw = msgspec.Raw()
    host_name: msgspec.Raw = msgspec.Raw()
    # Kineto's own log lines (torch >= 2.4), kept raw: only read for what the profiler says it lost.
    INFO: msgspec.Raw = msgspec.Raw()
    WARNING: msgspec.Raw = msgspec.Raw()
    ERROR: msgspec.Raw = msgspec.Raw()


@dataclass
class Head:
    """The document's top level, typed."""

    has_events: bool = True
    devices: list[DeviceProp] = field(default_factory=list)
    distributed: DistributedInfo | None = None
    base_time_ns: int | None = None
    schema_version: int | None = None
    host: str | None = None
    rocm: bool = False
    log_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _lenient(raw: msgspec.Raw, typ: object) -> object | None:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=typ)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


def decode_head(buf: bytes) -> Head:
    """The small non-event part of a trace. Raises msgspec.DecodeError on JSON that is not an object."""
    th = msgspec.json.decode(buf, type=TraceHead)
    head = Head(has_events=bool(th.traceEvents))
    props, key = (th.deviceProperties, "deviceProperties") if th.deviceProperties else (th.computeProperties, "computeProperties")
    entries = _lenient(props, list[msgspec.Raw])
    if props and not isinstance(entries, list):
        head.notes.append(f"{key} is not a list: left out")
    for raw in entries if isinstance(entries, list) else []:
        d = _lenient(raw, DeviceProp)
        if isinstance(d, DeviceProp):
            head.devices.append(d)
        else:
            head.notes.append(f"a {key} entry of unexpected types was left out")
    di = _lenient(th.distributedInfo, DistributedInfo)
    head.distributed = di if isinstance(di, DistributedInfo) else None
    base = _lenient(th.baseTimeNanoseconds, int)
    head.base_time_ns = base if isinstance(base, int) and not isinstance(base, bool) else None
    sv = _lenient(th.schemaVersion, int)
    head.schema_version = sv if isinstance(sv, int) and not isinstance(sv, bool) else None
    host = _lenient(th.host_name, str)
    head.host = host if isinstance(host, str) else None
    head.rocm = (
        bool(th.hip_runtime_version)
        or bool(th.roctracer_version)
        or any((d.name or "").startswith("AMD") or d.warpSize == 64 for d in head.devices)
    )
    for raw in (th.INFO, th.WARNING, th.ERROR):
        v = _lenient(raw, object)
        head.log_lines += [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str)]
    return head


# -------------------------------------------------------------------------------------- devices → GPUs


@dataclass(frozen=True)
class DeviceRow:
    """One `devices` row: a device id kernels ran on and the properties that describe it."""

    device: int
    name: str | None
    sm_count: int | None
    memory_bytes: int | None
    compute_capability: str | None
    vendor: str | None


def _sane(d: DeviceProp) -> DeviceProp:
    """Properties out of any plausible range (a corrupt entry) read as unknown."""
    sms = d.numSms if d.numSms is not None and 0 < d.numSms < 2**31 else None
    mem = d.totalGlobalMem if d.totalGlobalMem is not None and 0 < d.totalGlobalMem < 2**63 else None
    ok = lambda v: v if v is not None and 0 <= v < 1000 else None  # noqa: E731
    return DeviceProp(
        id=d.id,
        name=d.name,
        totalGlobalMem=mem,
        computeMajor=ok(d.computeMajor),
        computeMinor=ok(d.computeMinor),
        numSms=sms,
        warpSize=d.warpSize,
    )


def _signature(d: DeviceProp) -> tuple[object, ...]:
    return (d.name or "", d.numSms, d.totalGlobalMem, d.computeMajor, d.computeMinor)


def _vendor(d: DeviceProp, rocm: bool) -> str | None:
    name = d.name or ""
    if name.startswith("AMD") or d.warpSize == 64 or (rocm and not name):
        return "AMD"
    if "NVIDIA" in name or name.startswith(("Tesla", "Quadro", "GeForce", "TITAN")) or d.warpSize == 32:
        return "NVIDIA"
    return None


def map_devices(used: Sequence[int], props: Sequence[DeviceProp], rocm: bool = False) -> tuple[list[DeviceRow], list[str]]:
    """The properties of each device id kernels ran on. A kernel's `device` is the index of its
    `deviceProperties` entry on CUDA; ROCm traces number GPUs after the host's CPU agents (device 2 or 9 with
    one entry of id 0): then the single entry, or the one every entry agrees on, is that GPU. A device no entry
    describes gets a row without a name (the peak is then unknown, and the notes say why)."""
    notes: list[str] = []
    clean = [_sane(p) for p in props if p.id is not None and 0 <= p.id < 2**31]
    by_id = {p.id: p for p in clean}
    alike = len({_signature(p) for p in clean}) == 1
    rows: list[DeviceRow] = []
    remapped: list[int] = []
    for dev in sorted(set(used)):
        p = by_id.get(dev)
        if p is None and clean and alike:
            p = clean[0]
            remapped.append(dev)
        if p is None:
            if clean:
                notes.append(
                    f"kernels on device {dev} match no deviceProperties entry (ids "
                    f"{', '.join(str(q.id) for q in clean)}, not all alike): GPU unknown (give --gpu)"
                )
            rows.append(DeviceRow(dev, None, None, None, None, "AMD" if rocm else None))
            continue
        cc = f"{p.computeMajor}.{p.computeMinor}" if p.computeMajor is not None else None
        rows.append(DeviceRow(dev, p.name or None, p.numSms, p.totalGlobalMem, cc, _vendor(p, rocm)))
    if remapped:
        what = "the one deviceProperties entry" if len(clean) == 1 else f"the {len(clean)} identical deviceProperties entries"
        notes.append(
            f"kernels on device {', '.join(map(str, remapped))} described by {what} "
            f"(id {', '.join(str(q.id) for q in clean)}): device ids are not entry indexes in this trace"
        )
    return rows, notes
