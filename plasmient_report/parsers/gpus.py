"""Naming a GPU a trace does not name: a device with no name, or a generic one no peak-table entry knows
("AMD Radeon Graphics" is what HIP reports for an Instinct GPU without its marketing name), is identified from
the properties the trace records (compute capability / gfx version, SM or CU count, memory size) against the peak
table, and the trace's notes say so. Shared by every trace parser."""

from __future__ import annotations

import duckdb

from .. import peaks


def name_from_properties(
    name: str | None, vendor: str | None, compute_capability: str | None, sm_count: int | None, memory_bytes: int | None
) -> tuple[str | None, str | None]:
    """(the name to store, a note) for one device. A name the peak table knows is kept as it is (a note only when
    the device's memory size or SM count contradicts the entry it matches: peaks.contradiction)."""
    if name and peaks.match_gpu(name, peaks.load_table()) is not None:
        # a name the table knows, kept — said when the device's memory or SM count contradicts its entry
        return name, peaks.contradiction(name, vendor, compute_capability, sm_count, memory_bytes, peaks.load_table())
    if not (compute_capability or sm_count or memory_bytes):
        return name, None
    ident = peaks.identify(vendor=vendor, compute_capability=compute_capability, sm_count=sm_count, memory_bytes=memory_bytes)
    said = f"named {name!r} in the trace (no GPU of the peak table)" if name else "GPU not named in the trace"
    sentence = ident.sentence.replace("GPU not named in the trace", said, 1)
    if ident.gpu is None:
        return name, sentence if not name else None  # a named GPU that is just not in the table: the peak says so
    return ident.gpu.name, sentence


def name_devices(con: duckdb.DuckDBPyConnection, source_id: int) -> list[str]:
    """Apply `name_from_properties` to this source's `devices` rows; the notes to add."""
    notes: list[str] = []
    rows = con.execute(
        """SELECT DISTINCT device, name, vendor, compute_capability, sm_count, memory_bytes
                          FROM devices WHERE source_id = ?""",
        [source_id],
    ).fetchall()
    for device, name, vendor, cc, sms, mem in rows:
        new, note = name_from_properties(name, vendor, cc, sms, mem)
        if new != name:
            con.execute(
                "UPDATE devices SET name = ? WHERE source_id = ? AND device = ? AND name IS NOT DISTINCT FROM ?",
                [new, source_id, device, name],
            )
        if note:
            notes.append(f"device {device}: {note}")
    return list(dict.fromkeys(notes))
