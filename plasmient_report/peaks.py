"""The peak table: dense datasheet peaks per GPU and precision, each entry with its source.

- `match_gpu(name)`: the entry for a device name as a trace writes it (the first entry whose regex matches);
- `lookup(query)`: the entry a user means (`--gpu`, `plasmient-report peaks NAME`): a key, alias or name, or a
  prefix of one that only one entry has; an ambiguous one is refused with the candidates;
- `identify(...)`: the entry a trace's device properties describe when it gives no usable name;
- `contradiction(...)`: what to say when a device's memory or SM count contradicts the entry its name matches;
- `choose_peak(...)` → `Peak`: the peak one analysis uses, with every precision's figure, so each kernel can be
  measured against its own precision (`Peak.flop_s_for(precision)`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
# When a chip has no figure for a precision, the figure its work runs at instead, in order: an fp32 matmul on a
# chip without TF32 tensor cores runs at the fp32 rate; fp64 without fp64 tensor cores at the fp64 rate; bf16
# and fp16 share the tensor rate on every chip that has both (a bf16 figure missing means no bf16 hardware: the
# fp16 tensor rate is the nearest thing the silicon offers). fp8 and int8 have no stand-in.
FALLBACK: dict[str, tuple[str, ...]] = {"tf32": ("fp32",), "fp64_tensor": ("fp64",), "bf16": ("fp16",), "fp16": ("bf16",)}
MEMORY_TOLERANCE = 0.08  # nominal memory vs what the device reports (GB or GiB, less reserved memory)
SAME_FIGURES = 0.01  # entries whose figures agree this closely are the same peak


@dataclass(frozen=True)
class Interconnect:
    """A GPU's links as its datasheet gives them (bidirectional GB/s per GPU; `[gpu.interconnect]` in the table)."""

    link: str | None = None  # the GPU-to-GPU fabric built into the part (NVLink, Infinity Fabric)
    link_gbs: float | None = None
    link_mesh: int | None = None  # a full mesh of this many links, one per peer (AMD); None: a switch (NVSwitch)
    pcie: str | None = None  # the host link
    pcie_gbs: float | None = None
    source: str = ""

    def link_bytes_s(self, peers: int) -> float | None:
        """One direction of the GPU-to-GPU fabric, bytes/s, usable with `peers` other GPUs of the node: all of it
        through a switch; on a mesh, the links to those peers."""
        if not self.link_gbs:
            return None
        per_dir = self.link_gbs * 1e9 / 2
        return per_dir * min(peers, self.link_mesh) / self.link_mesh if self.link_mesh else per_dir

    @property
    def pcie_bytes_s(self) -> float | None:
        """One direction of the host link, bytes/s."""
        return self.pcie_gbs * 1e9 / 2 if self.pcie_gbs else None


@dataclass(frozen=True)
class GpuPeaks:
    """One entry of the table."""

    key: str
    name: str
    match: str
    tflops: dict[str, float]
    memory_bandwidth_gbs: float | None
    source: str
    aliases: tuple[str, ...] = ()
    vendor: str | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_gb: float | None = None
    interconnect: Interconnect | None = None

    def peak_flop_s(self, precision: str) -> float | None:
        t = self.tflops.get(precision)
        return t * 1e12 if t else None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases, self.name)


@dataclass(frozen=True)
class Peak:
    """The peak one analysis uses: the GPU, the headline precision and its figure (`flop_s`), and every
    precision's figure (`tflops`) so that each kernel is measured against its own precision's peak.

    `forced` (from --peak-tflops): one figure for every precision. `known`: the headline figure exists."""

    gpu: str | None
    gpu_key: str | None
    precision: str
    flop_s: float | None
    bandwidth_bytes_s: float | None
    source: str
    known: bool
    tflops: tuple[tuple[str, float], ...] = ()
    forced: bool = False

    @property
    def available_precisions(self) -> tuple[str, ...]:
        """The precisions with a figure of their own (in PRECISIONS order); all of them when forced."""
        if self.forced:
            return PRECISIONS
        have = dict(self.tflops)
        return tuple(p for p in PRECISIONS if p in have)

    def precision_for(self, precision: str, fallback: bool = True) -> str | None:
        """The precision whose figure measures work of `precision` on this GPU: itself when the table has it,
        else its stand-in (FALLBACK) when `fallback`, else None (the chip has no such figure)."""
        if self.forced:
            return precision
        have = dict(self.tflops)
        if precision in have:
            return precision
        if fallback:
            return next((f for f in FALLBACK.get(precision, ()) if f in have), None)
        return None

    def flop_s_for(self, precision: str, fallback: bool = True) -> float | None:
        """Peak FLOP/s for work of `precision` (fp64, fp64_tensor, fp32, tf32, bf16, fp16, fp8, int8); None when
        the GPU is unknown or has no figure for it (nor a stand-in, with `fallback`)."""
        if self.forced:
            return self.flop_s
        p = self.precision_for(precision, fallback)
        return dict(self.tflops)[p] * 1e12 if p is not None else None


def _entry(r: Mapping[str, object]) -> GpuPeaks:
    key = str(r["key"])
    aliases = r.get("aliases", ())
    if isinstance(aliases, str) or not isinstance(aliases, (list, tuple)):
        raise TypeError("aliases must be a list of names")
    match = str(r.get("match", re.escape(key)))
    re.compile(match)
    sm = r.get("sm_count")
    mem = r.get("memory_gb")
    ic = r.get("interconnect")
    if ic is not None and not isinstance(ic, dict):
        raise TypeError("interconnect must be a table")
    return GpuPeaks(
        key=key,
        name=str(r.get("name", key)),
        match=match,
        tflops={p: float(r[p]) for p in PRECISIONS if p in r},  # type: ignore[arg-type]
        memory_bandwidth_gbs=float(r["memory_bandwidth_gbs"]) if "memory_bandwidth_gbs" in r else None,  # type: ignore[arg-type]
        source=str(r.get("source", "user peaks file")),
        aliases=tuple(str(a) for a in aliases),
        vendor=str(r["vendor"]) if "vendor" in r else None,
        compute_capability=str(r["compute_capability"]) if "compute_capability" in r else None,
        sm_count=int(sm) if sm is not None else None,  # type: ignore[call-overload]
        memory_gb=float(mem) if mem is not None else None,  # type: ignore[arg-type]
        interconnect=_interconnect(ic) if ic else None,
    )


def _interconnect(r: Mapping[str, object]) -> Interconnect:
    def num(k: str) -> float | None:
        v = r.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"interconnect {k} must be a positive number")
        return float(v)

    mesh = r.get("link_mesh")
    if mesh is not None and (isinstance(mesh, bool) or not isinstance(mesh, int) or mesh < 1):
        raise ValueError("interconnect link_mesh must be a positive whole number of links")
    return Interconnect(
        link=str(r["link"]) if "link" in r else None,
        link_gbs=num("link_gbs"),
        link_mesh=mesh,
        pcie=str(r["pcie"]) if "pcie" in r else None,
        pcie_gbs=num("pcie_gbs"),
        source=str(r.get("source", "user peaks file")),
    )


@lru_cache(maxsize=1)
def _builtin() -> tuple[GpuPeaks, ...]:
    text = resources.files("plasmient_report").joinpath("peaks.toml").read_text(encoding="utf-8")
    return tuple(_entry(r) for r in tomllib.loads(text)["gpu"])


def load_table(extra: Path | None = None) -> list[GpuPeaks]:
    """Built-in table, with entries of `extra` (same layout) placed first so they override."""
    table = list(_builtin())
    if extra is None:
        return table
    try:
        user = tomllib.loads(Path(extra).read_text(encoding="utf-8")).get("gpu", [])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise BadInput(extra, f"cannot read peaks file ({e})") from None
    if not isinstance(user, list):
        raise BadInput(extra, "peaks file must hold [[gpu]] tables")
    out = []
    for r in user:
        try:
            if not isinstance(r, dict):
                raise TypeError("not a table")
            out.append(_entry(r))
        except (KeyError, TypeError, ValueError, re.error) as e:
            raise BadInput(extra, f"bad [[gpu]] entry {r!r} ({e})") from None
    return out + table


# A laptop GPU shares its desktop namesake's number, not its chip ('RTX 4090 Laptop GPU': AD103, 76 SMs, against
# the desktop's AD102, 128): it matches only an entry that names it a laptop part.
_MOBILE_RE = re.compile(r"(?i)\b(laptop|mobile|max-q)\b")


def match_gpu(name: str | None, table: list[GpuPeaks]) -> GpuPeaks | None:
    """The entry for a device name as a trace writes it ('NVIDIA H100 80GB HBM3'): the first whose regex matches,
    or whose key is the name (a laptop GPU: only an entry of a laptop part)."""
    if not name:
        return None
    mobile = bool(_MOBILE_RE.search(name))
    for g in table:
        if mobile and not _MOBILE_RE.search(g.name):
            continue
        if re.search(g.match, name, re.IGNORECASE) or g.key.lower() == name.lower():
            return g
    return None


def _strip_vendor(s: str) -> str:
    """A device name without its vendor and brand words ('NVIDIA Tesla V100-SXM2' → 'V100-SXM2')."""
    s = re.sub(r"(?i)^(nvidia|amd|tesla|geforce|instinct|quadro)\b\s*", "", s.strip())
    return re.sub(r"(?i)^(nvidia|amd|tesla|geforce|instinct|quadro)\b\s*", "", s)


def _norm(s: str) -> str:
    return re.sub(r"[^0-9a-z]", "", _strip_vendor(s).lower())


def different_models(a: str | None, b: str | None, table: list[GpuPeaks]) -> bool:
    """Whether two device names, as two tools write them, are surely different GPU models: each matches an entry,
    not the same one, and neither name is the other's start once vendor words and punctuation are dropped ('NVIDIA
    H100' may be the 'NVIDIA H100 PCIe' another tool names in full). Names the table does not know prove nothing."""
    if not a or not b:
        return False
    x, y = _norm(a), _norm(b)
    if x.startswith(y) or y.startswith(x):
        return False
    ga, gb = match_gpu(a, table), match_gpu(b, table)
    return ga is not None and gb is not None and ga.key != gb.key


def lookup(query: str, table: list[GpuPeaks]) -> GpuPeaks:
    """The entry a user means by `query` (a key, alias or name, any case, spaces and dashes ignored; or the start
    of one that only one entry has; or a device name as a trace writes it). Raises BadInput when the query is
    ambiguous (with the candidates) or unknown."""
    q = _norm(query)
    if not q:
        raise BadInput(None, "--gpu: empty GPU name")
    exact = [g for g in table if any(_norm(n) == q for n in g.names)]
    if exact:
        return exact[0]  # a user entry (placed first) overrides the built-in one of the same name
    starts = list(dict.fromkeys(g.key for g in table if any(_norm(n).startswith(q) for n in g.names)))
    if len(starts) == 1:
        return next(g for g in table if g.key == starts[0])
    if len(starts) > 1:
        raise BadInput(None, f"GPU {query!r} is ambiguous: it could be {', '.join(starts)} (give one of these)")
    g = match_gpu(query, table)
    if g is not None and len(q) >= 4:
        return g
    raise BadInput(
        None, f"unknown GPU {query!r} (see `plasmient-report peaks`; known: {', '.join(dict.fromkeys(x.key for x in table))})"
    )


# --------------------------------------------------------------------------------- identification


@dataclass(frozen=True)
class Identification:
    gpu: GpuPeaks | None  # the entry, when the properties single one out (or entries with the same figures)
    candidates: tuple[str, ...]  # keys of the entries the properties fit
    sentence: str  # what was found, for the source's notes


def _same_figures(a: GpuPeaks, b: GpuPeaks) -> bool:
    if set(a.tflops) != set(b.tflops):
        return False
    close = lambda x, y: abs(x - y) <= SAME_FIGURES * max(abs(x), abs(y))  # noqa: E731
    bw_ok = (a.memory_bandwidth_gbs is None) == (b.memory_bandwidth_gbs is None) and (
        a.memory_bandwidth_gbs is None or close(a.memory_bandwidth_gbs, b.memory_bandwidth_gbs or 0.0)
    )
    return bw_ok and all(close(a.tflops[p], b.tflops[p]) for p in a.tflops)


def _memory_fits(nominal_gb: float, memory_bytes: int) -> bool:
    return any(abs(memory_bytes / unit - nominal_gb) <= MEMORY_TOLERANCE * nominal_gb for unit in (1e9, 2**30))


# What the sentence of a GPU identified from its properties says (the verdict's notes repeat those sentences).
IDENTIFIED_MARK = "from its properties"


def identify(
    vendor: str | None,
    compute_capability: str | None,
    sm_count: int | None,
    memory_bytes: int | None,
    table: list[GpuPeaks] | None = None,
) -> Identification:
    """The table entry a device's properties describe (compute capability / gfx version, SM or CU count, memory
    size), for traces that do not name the GPU. Only a property the device reports is compared; the compute
    capability and the SM count are both required. Entries that fit and share their figures (MI210 and one GCD of
    an MI250) count as one answer."""
    rows = list(table if table is not None else _builtin())
    units = "CUs" if vendor == "AMD" else "SMs"
    what = ", ".join(
        x
        for x in (
            f"compute capability {compute_capability}" if compute_capability else None,
            f"{sm_count} {units}" if sm_count else None,
            f"{memory_bytes / 2**30:.0f} GiB" if memory_bytes else None,
        )
        if x
    )
    if not compute_capability or not sm_count:
        return Identification(
            None, (), f"GPU not named in the trace and its properties ({what or 'none'}) are too few to identify it: give --gpu"
        )
    fit = [
        g
        for g in rows
        if g.compute_capability == compute_capability
        and g.sm_count == sm_count
        and (vendor is None or g.vendor is None or g.vendor == vendor)
        and (memory_bytes is None or g.memory_gb is None or _memory_fits(g.memory_gb, memory_bytes))
    ]
    keys = tuple(dict.fromkeys(g.key for g in fit))
    if not fit:
        return Identification(None, (), f"GPU not named in the trace, and no GPU in the peak table has {what}: give --gpu")
    first = fit[0]
    if all(_same_figures(first, g) for g in fit[1:]):
        others = [g.key for g in fit[1:] if g.key != first.key]
        also = f" (or {', '.join(others)}: the same peak figures)" if others else ""
        return Identification(
            first, keys, f"GPU not named in the trace, identified as {first.name}{also} {IDENTIFIED_MARK} ({what})"
        )
    return Identification(
        None,
        keys,
        f"GPU not named in the trace, and its properties ({what}) fit {', '.join(keys)}, whose peaks differ: give --gpu",
    )


# What the sentence of a named GPU whose properties contradict the entry its name matches says.
CONTRADICTED_MARK = "does not fit the entry its name matches"


def contradiction(
    name: str,
    vendor: str | None,
    compute_capability: str | None,
    sm_count: int | None,
    memory_bytes: int | None,
    table: list[GpuPeaks] | None = None,
) -> str | None:
    """A sentence when the device's reported SM / CU count, or a memory size larger than its model's, contradicts
    the entry its name matches (a generic "NVIDIA H100" with 95 GiB is no 80 GB H100 SXM; a MIG slice has a
    fraction of the SMs), else None.
    The name's entry still gives the peaks — the sentence says they are assumed, and which entries of the same
    model the properties fit instead."""
    rows = list(table if table is not None else _builtin())
    g = match_gpu(name, rows)
    if g is None:
        return None
    # more memory than the entry's model has is another model; less may be a smaller-memory variant of the same
    # figures (a 16 GB V100 SXM2 beside the 32 GB entry) or a MIG slice, which its SM count tells
    memory_off = bool(
        memory_bytes
        and g.memory_gb
        and not _memory_fits(g.memory_gb, memory_bytes)
        and memory_bytes / 2**30 > g.memory_gb * (1 + MEMORY_TOLERANCE)
    )
    sms_off = bool(sm_count and g.sm_count and sm_count != g.sm_count)
    if not (memory_off or sms_off):
        return None
    units = "CUs" if vendor == "AMD" else "SMs"
    what = ", ".join(
        x
        for x in (
            f"{memory_bytes / 2**30:.0f} GiB" if memory_off and memory_bytes else None,
            f"{sm_count} {units}" if sms_off else None,
        )
        if x
    )
    has = ", ".join(x for x in (f"{g.memory_gb:g} GB" if memory_off else None, f"{g.sm_count} {units}" if sms_off else None) if x)
    # entries of the same model (the name's first model token is one of the key's) that the properties fit
    model = next((t.upper() for t in re.findall(r"[A-Za-z]*\d+[A-Za-z]*", _strip_vendor(name))), None)
    ident = identify(vendor, compute_capability, sm_count, memory_bytes, rows)
    alt = [x.name for x in rows if x.key in ident.candidates and x.key != g.key and model and model in x.key.upper().split("-")]
    maybe = f", and by its properties it may be {' or '.join(alt)}" if alt else ""
    return (
        f"named {name!r} in the trace with {what}, which {CONTRADICTED_MARK} ({g.name}: {has}){maybe}: its peaks "
        f"are assumed to be {g.name}'s — give --gpu if it is another model"
    )


# ----------------------------------------------------------------------------------------- choice


def choose_peak(
    device_name: str | None,
    precision: str,
    table: list[GpuPeaks],
    gpu_override: str | None = None,
    tflops_override: float | None = None,
) -> Peak:
    """The peak of one GPU at the headline `precision`: the entry `--gpu` names (refused when ambiguous or
    unknown), else the one the device name matches; `--peak-tflops` forces one figure for every precision."""
    if gpu_override:
        try:
            g = lookup(gpu_override, table)
        except BadInput as e:
            # a GPU the table does not list is fine with --peak-tflops (the figure is the user's); never an
            # ambiguous name
            if tflops_override is None or "ambiguous" in str(e):
                raise
            g = None
        name: str | None = g.name if g else gpu_override
    else:
        g = match_gpu(device_name, table)
        name = device_name
    figures = tuple(sorted(g.tflops.items())) if g else ()
    bw = g.memory_bandwidth_gbs * 1e9 if g and g.memory_bandwidth_gbs else None
    if tflops_override is not None:
        return Peak(
            gpu=g.name if g else name,
            gpu_key=g.key if g else None,
            precision=precision,
            flop_s=tflops_override * 1e12,
            bandwidth_bytes_s=bw,
            source="--peak-tflops",
            known=True,
            tflops=figures,
            forced=True,
        )
    if g is None:
        return Peak(
            gpu=name,
            gpu_key=None,
            precision=precision,
            flop_s=None,
            bandwidth_bytes_s=None,
            source=f"unknown GPU {name!r}: no peak (give --gpu or --peak-tflops)"
            if name
            else "GPU not named in the trace: no peak (give --gpu or --peak-tflops)",
            known=False,
        )
    base = Peak(
        gpu=g.name,
        gpu_key=g.key,
        precision=precision,
        flop_s=None,
        bandwidth_bytes_s=bw,
        source=g.source,
        known=False,
        tflops=figures,
    )
    used = base.precision_for(precision)
    if used is None:
        return Peak(
            gpu=g.name,
            gpu_key=g.key,
            precision=precision,
            flop_s=None,
            bandwidth_bytes_s=bw,
            source=f"{g.name} has no {precision} figure in the table",
            known=False,
            tflops=figures,
        )
    src = g.source if used == precision else g.source + f" (no {precision} figure: {used} used)"
    return Peak(
        gpu=g.name,
        gpu_key=g.key,
        precision=used,
        flop_s=g.tflops[used] * 1e12,
        bandwidth_bytes_s=bw,
        source=src,
        known=True,
        tflops=figures,
    )
