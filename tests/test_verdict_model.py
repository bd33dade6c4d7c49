"""The typed verdict (verdict_model.py): what judge writes converts to it exactly, its generated files (the JSON
Schema, docs/verdict.md) are the ones committed, and verdict.json only ever holds finite numbers."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from plasmient_report import pipeline, verdict_model
from plasmient_report.errors import BadInput
from plasmient_report.render import verdict as verdict_render
from plasmient_report.verdict_model import Verdict

from .conftest import sample_file

# Every committed sample run, whole and with --range (the range verdicts fill other keys: run.range,
# occurrences, missing-range entries).
CASES = [
    (["h200_single/kineto_single.pt.trace.json.gz"], []),
    (["h200_single/kineto_single.pt.trace.json.gz"], ["phase:*"]),
    (
        ["h200_single/kineto_single.pt.trace.json.gz", "h200_single/nvidia_smi_dmon.txt", "h200_single/nvml_samples.csv"],
        ["phase:train_step", "no_such_range"],
    ),
    (["h200_single/nsys_single.sqlite"], []),
    (["h200x2_ddp/kineto"], []),
    (["h200x2_ddp/nsys/nsys_ddp.sqlite"], []),
    (["h200x2_pipeline/m4"], []),
    (["h200_attention"], []),
    (["h200_sync_stack"], []),
    (["h200_align"], []),
]


@pytest.fixture(scope="module")
def verdicts() -> list[dict]:
    out = []
    for rels, ranges in CASES:
        try:
            res = pipeline.analyse([sample_file(r) for r in rels], pipeline.Options(ranges=ranges))
        except BadInput as e:  # a range matching nothing on its own is refused; that case keeps one that matches
            raise AssertionError(f"{rels} {ranges}: {e}") from None
        try:
            out.append(res.verdict)
        finally:
            res.close()
    return out


def test_every_sample_verdict_is_the_typed_verdict(verdicts: list[dict]) -> None:
    for v in verdicts:
        # Unknown fields are forbidden by the model: a key judge adds without the model fails here.
        typed = msgspec.convert(v, Verdict, strict=True)
        # And nothing is lost on the way: the typed verdict encodes back to the same document (defaults of keys
        # judge does not write yet aside).
        assert _written(verdict_model.to_dict(typed), json.loads(verdict_render.dumps(v)))


def _written(back: object, orig: object) -> bool:
    """`back` holds everything of `orig` (it may add the defaults of keys judge does not write yet)."""
    if isinstance(orig, dict):
        return isinstance(back, dict) and all(k in back and _written(back[k], x) for k, x in orig.items())
    if isinstance(orig, list):
        return isinstance(back, list) and len(back) == len(orig) and all(map(_written, back, orig))
    return back == orig


def test_the_model_is_strict() -> None:
    with pytest.raises(BadInput, match="schema"):
        verdict_model.from_dict({"schema": "plasmient.verdict/0"})
    with pytest.raises(BadInput, match="not a JSON object"):
        verdict_model.from_dict([1, 2])


def test_an_unknown_key_is_caught(verdicts: list[dict]) -> None:
    v = json.loads(json.dumps(verdicts[0]))
    v["ranks"][0]["new_key"] = 1
    with pytest.raises(msgspec.ValidationError, match="unknown field `new_key`"):
        msgspec.convert(v, Verdict, strict=True)
    assert verdict_model.from_dict(v, strict=False).ranks[0].rank == verdicts[0]["ranks"][0]["rank"]


def test_generated_docs_and_schema_are_committed() -> None:
    """docs/verdict.md and verdict.schema.json are generated from the model; regenerate with
    `python -m plasmient_report.verdict_model --write` when the model changes."""
    assert verdict_model.DOC_PATH.read_text(encoding="utf-8") == verdict_model.doc_text()
    assert verdict_model.SCHEMA_PATH.read_text(encoding="utf-8") == verdict_model.schema_text()


def test_every_key_is_documented_with_a_meaning() -> None:
    rows = verdict_model.key_rows()
    assert len(rows) > 100
    for path, _type, desc, _required in rows:
        assert desc.strip(), f"{path} has no meaning in the model"
        assert f"| `{path}` |" in verdict_model.DOC_PATH.read_text(encoding="utf-8")
    # The contract's new keys are there (CONTRACTS.md).
    paths = {r[0] for r in rows}
    for key in (
        "achieved_by_precision[].fraction",
        "hardware_estimate.metric",
        "peak.precisions",
        "coverage.unknown_flops_time_fraction",
        "coverage.kernels_linked_to_ops_fraction",
        "ranks[].host",
        "ranks[].gpu",
        "ranges[].ranks",
        "ranges[].window",
        "ranges[].per_occurrence_ns",
    ):
        assert key in paths, key


def test_the_schema_validates_real_verdicts(verdicts: list[dict]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(verdict_model.SCHEMA_PATH.read_text(encoding="utf-8"))
    for v in verdicts:
        jsonschema.validate(json.loads(verdict_render.dumps(v)), schema)
    broken = json.loads(verdict_render.dumps(verdicts[0]))
    broken["losses"][0]["fraction"] = "a lot"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_verdict_json_holds_finite_numbers_only(verdicts: list[dict]) -> None:
    v = json.loads(json.dumps(verdicts[0]))
    v["achieved_fraction_of_peak"] = math.nan
    v["losses"][0]["fraction"] = math.inf
    v["top_kernels"][0]["flops"] = -math.inf
    text = verdict_render.dumps(v)
    doc = json.loads(text)  # strict JSON (allow_nan=False wrote it)
    assert doc["achieved_fraction_of_peak"] is None and doc["losses"][0]["fraction"] is None
    assert doc["top_kernels"][0]["flops"] is None
    assert "NaN" not in text and "Infinity" not in text


def test_load_verdict_refuses_non_finite_numbers(verdicts: list[dict], tmp_path) -> None:
    p = tmp_path / "verdict.json"
    text = json.dumps(verdicts[0])
    p.write_text(text.replace('"achieved_fraction_of_peak": ', '"achieved_fraction_of_peak": 1e999, "x": ', 1))
    with pytest.raises(BadInput, match="not a finite number|not valid JSON"):
        verdict_model.load_verdict(p)


def test_headroom_text_says_what_it_is_about():
    # report.html prints headroom.text after the verdict on its own ("VERDICT: busy. unknown: at most 59.5x" read
    # as if the verdict were unknown): every wording names the headroom
    from plasmient_report.judge import headroom

    assert headroom(1 / 59.5, lower_bound=True).text.startswith("headroom unknown: at most 59.5x")
    for h in (headroom(None), headroom(None, True), headroom(0.0), headroom(0.0, True), headroom(0.001, True), headroom(0.25)):
        assert "headroom" in h.text or "below peak" in h.text, h.text
    assert headroom(0.25).factor == 4.0
