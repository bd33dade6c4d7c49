"""A GPU activity no parser could place on a GPU (kernels.device NULL) is left out of the store and counted in
its source's notes, whatever parser wrote it (pipeline._drop_unplaced): measured as a GPU of its own, it made the
waterfall sum past 100% (fuzzing, session 37). The parsers drop such rows themselves; this is the store's guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from plasmient_report import metrics, parsers, pipeline

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_single" / "kineto_single.pt.trace.json.gz"


def _analyse(monkeypatch: pytest.MonkeyPatch | None) -> tuple[dict[str, float], float | None, list[tuple], str | None]:
    if monkeypatch is not None:
        real = parsers.ingest_one

        def with_unplaced(d, con, i, opts=None):  # type: ignore[no-untyped-def]
            info = real(d, con, i, opts)
            # two copies of real kernels, with no GPU: what a parser that could not place them would write
            con.execute(
                "INSERT INTO kernels SELECT * REPLACE (NULL::INTEGER AS device, kernel_id + 10000000 AS kernel_id) "
                "FROM kernels WHERE source_id = ? ORDER BY kernel_id LIMIT 2",
                [i],
            )
            return info

        monkeypatch.setattr(parsers, "ingest_one", with_unplaced)
    res = pipeline.analyse([SAMPLE], pipeline.Options())
    try:
        con = res.con
        losses = metrics.loss_fractions(con, "window", None, None)  # the run's: every GPU's window together
        (achieved,) = con.execute(
            "SELECT achieved_fraction_of_peak FROM metrics WHERE scope = 'window' AND range_name IS NULL "
            "AND rank IS NULL AND device IS NULL"
        ).fetchone() or (None,)
        gpus = con.execute("SELECT DISTINCT rank, device FROM kernels ORDER BY ALL").fetchall()
        (notes,) = con.execute("SELECT notes FROM sources WHERE source_id = 0").fetchone() or (None,)
        return losses, achieved, gpus, notes
    finally:
        res.close()


def test_kernels_on_no_gpu_are_left_out_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_losses, clean_achieved, clean_gpus, clean_notes = _analyse(None)
    losses, achieved, gpus, notes = _analyse(monkeypatch)
    assert all(d is not None for _, d in gpus) and gpus == clean_gpus  # no GPU of its own
    assert notes is not None and "2 GPU activities on no known GPU left out" in notes
    assert not clean_notes or "no known GPU" not in clean_notes
    # the same measurement as without them, and still whole: achieved + losses = 100% of the window
    assert achieved is not None and clean_achieved is not None
    assert achieved == pytest.approx(clean_achieved, abs=1e-12)
    assert losses == pytest.approx(clean_losses, abs=1e-12)
    assert achieved + sum(losses.values()) == pytest.approx(1.0, abs=1e-9)
