"""The rule engine (SPEC §5), laid out like ruff's: the code table matches the rule files, the fixture folders and
the generated pages; selection, thresholds and plugins work as documented; each rule runs in its own schema and
leaves nothing behind; a window too short to judge gets no findings; the program's kind is read, not assumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plasmient_report import judge, pipeline, rules
from plasmient_report.rules import DOC_SECTIONS, LAYERS, STATUSES, Explanation, Finding, rule
from plasmient_report.rules.codes import CODES
from plasmient_report.rules.docs import pages
from plasmient_report.vocab import CATEGORIES

from ..conftest import ROOT, kernel, sample_file, write_trace
from .expect import analyse, claims_within_waterfall, ddp_sample, single_phase
from .traces import runtime

RULES_DIR = ROOT / "plasmient_report" / "rules"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plasmient_report.cli", *args], capture_output=True, text=True, timeout=300)


# ---- the code table, the files, the fixtures, the pages -----------------------------------------------------


def test_code_table_matches_the_rule_files_and_fixture_folders():
    codes = [c.code for c in CODES]
    assert len(codes) == len(set(codes))
    # SPEC §5's list: these codes stay as they are
    assert set(codes) >= {
        "PR101",
        "PR102",
        "PR201",
        "PR301",
        "PR302",
        "PR401",
        "PR402",
        "PR403",
        "PR501",
        "PR502",
        "PR503",
        "PR504",
        "PR601",
        "PR602",
    }
    files = {f"{p.parent.name}.{p.stem}" for p in RULES_DIR.glob("*/*.py") if p.stem != "__init__"}
    assert files == {c.module for c in CODES}, "one rule per file in rules/<layer>/, each in codes.py"
    for c in CODES:
        assert c.layer in LAYERS and c.status in STATUSES
        assert str(LAYERS.index(c.layer) + 1) == c.code[2], f"{c.code}: the hundreds digit is the layer"
        folder = ROOT / "tests" / "rules" / c.code
        assert any(folder.glob("test_*.py")), f"tests/rules/{c.code}/ needs its fixtures"


def test_catalog_from_the_table():
    catalog = {r.id: r for r in rules.builtin_rules()}
    for c in CODES:
        r = catalog[c.code]
        assert (r.layer, r.name, r.status) == (c.layer, c.name, c.status)
        assert r.category is None or r.category in CATEGORIES
        page = r.page()
        positions = [page.index(f"## {s}") for s in DOC_SECTIONS]
        assert positions == sorted(positions), r.id
        # every threshold the rule has is on its page, with its default
        for k, v in {**rules.COMMON_THRESHOLDS, **r.thresholds}.items():
            assert f"- `{k}` = {v:g}" in page, (r.id, k)


def test_docs_pages_match_the_rules():
    folder = ROOT / "docs" / "rules"
    want = pages()
    have = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.md")}
    stale = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    assert not stale, f"docs/rules/ is stale ({', '.join(stale)}): python -m plasmient_report.rules --write"


def test_rules_command_lists_and_explains():
    r = cli("rules")
    assert r.returncode == 0
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln[:2] == "PR"}
    for c in CODES:
        assert c.code in lines and c.status in lines[c.code] and c.name in lines[c.code]
    r = cli("rules", "--explain", "PR101")
    assert r.returncode == 0 and r.stdout == rules.find_rule("PR101").page()
    assert cli("rules", "--explain", "host-sync-stall").stdout.startswith("# PR502")
    bad = cli("rules", "--explain", "PR999")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    listing = json.loads(cli("rules", "--json").stdout)
    assert {x["id"]: x["status"] for x in listing} == {c.code: c.status for c in CODES}


# ---- selection and thresholds --------------------------------------------------------------------------------


def test_select_and_ignore(tmp_path):
    path = sample_file("h200_single/kineto_single.pt.trace.json.gz")
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["PR5"])
    assert {f["rule"] for f in v["findings"]} == {"PR502", "PR504"}
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["PR5"], rule_ignore=["PR504"])
    assert {f["rule"] for f in v["findings"]} == {"PR502"}
    v = analyse([path], ranges=["phase:host_stall"], rule_select=["host-sync-stall"])
    assert {f["rule"] for f in v["findings"]} == {"PR502"}
    # the CLI, and the findings table of the stored run
    out = tmp_path / "out"
    r = cli(str(path), "--range", "phase:host_stall", "--out", str(out), "--select", "PR502,PR504", "--ignore", "PR504", "--json")
    assert r.returncode == 0, r.stderr
    assert {f["rule"] for f in json.loads(r.stdout)["findings"]} == {"PR502"}
    rows = cli("query", str(out / "run.duckdb"), "SELECT rule_id, category FROM findings", "--csv").stdout
    assert rows.splitlines()[1:] == ["PR502,sync_stall"]
    bad = cli(str(path), "--out", str(tmp_path / "o2"), "--select", "PR999")
    assert bad.returncode == 2 and "PR999" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_rules_config_thresholds(tmp_path):
    path = sample_file("h200_single/kineto_single.pt.trace.json.gz")
    cfg = tmp_path / "rules.toml"
    cfg.write_text('ignore = ["PR602"]\n[PR504]\nmin_gap_ms = 25\n[rules.PR502]\nmax_findings = 1\n')
    v = analyse([path], ranges=["phase:host_stall"], rules_config=cfg)
    assert not [f for f in v["findings"] if f["rule"] == "PR504"]  # no gap reaches 25 ms (20 ms sleeps)
    assert len([f for f in v["findings"] if f["rule"] == "PR502"]) == 1
    for text, msg in (
        ("[PR504]\nmin_gap = 3\n", "unknown threshold"),
        ("[PR999]\nx = 1\n", "no such rule"),
        ("[PR504]\nmin_gap_ms = 'big'\n", "a number"),
        ("[PR504\n", "cannot read"),
    ):
        cfg.write_text(text)
        r = cli(str(path), "--out", str(tmp_path / "o"), "--rules-config", str(cfg))
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (text, r.stderr)


def test_preview_rules_run_only_when_named(monkeypatch):
    from dataclasses import replace

    from plasmient_report.rules import registry

    real = registry.builtin_rules

    def with_preview() -> list[rules.Rule]:
        return [replace(r, status="preview") if r.id == "PR602" else r for r in real()]

    monkeypatch.setattr(registry, "builtin_rules", with_preview)
    assert "PR602" not in {r.id for r in rules.configure().rules}
    assert "PR602" not in {r.id for r in rules.configure(["PR6"]).rules}
    assert "PR602" in {r.id for r in rules.configure(["PR602"]).rules}
    assert "PR602" in {r.id for r in rules.configure(["utilization-vs-achieved-gap"]).rules}


# ---- plugins -------------------------------------------------------------------------------------------------


@rule(
    "XT901",
    name="every-kernel-count",
    layer="kernel",
    title="Counts kernels (a test plugin)",
    category=None,
    thresholds={"min_kernels": 1},
    explanation=Explanation(
        what_it_does="Counts kernels.", why_is_this_bad="It is not.", example="`42 kernels`.", how_to_fix="Nothing to fix."
    ),
)
def _plugin_rule(ctx, t):
    # a table of its own: it lands in the rule's schema, not the store (the other plugin makes one of the same name)
    ctx.con.execute("CREATE TABLE scratch AS SELECT count(*) AS n FROM rule_kernels")
    n = ctx.rows("SELECT n FROM scratch")[0]["n"]
    if n >= t.min_kernels:
        yield Finding(
            title=f"{n} kernels",
            recommendation="none",
            fix="none",
            lost_fraction=None,
            key="count",
            evidence={"kernels": n, "schema": ctx.schema},
        )


@rule("XT902", name="docstring-page", layer="host", title="A page in its docstring (the first layout's names)")
def _docstring_rule(ctx, t):
    """
    ## What it detects
    Nothing: it makes a table called `scratch` too.

    ## Why it costs peak
    It does not.

    ## How to fix
    Nothing.

    ## Example
    `ok`.
    """
    ctx.con.execute("CREATE TABLE scratch AS SELECT 1 AS n")
    yield Finding(title="ok", recommendation="none", fix="none", lost_fraction=None, key="ok", evidence={"schema": ctx.schema})


def test_third_party_rules_through_entry_points(monkeypatch, tiny_trace):
    from importlib import metadata

    class EP:
        def __init__(self, name: str, target: Any) -> None:
            self.name, self.value, self._t = name, f"tests:{name}", target

        def load(self) -> Any:
            if isinstance(self._t, Exception):
                raise self._t
            return self._t

    def fake(group: str) -> list[EP]:
        assert group == rules.ENTRY_POINT_GROUP
        return [EP("good", [_plugin_rule, _docstring_rule]), EP("broken", ImportError("no module named nope"))]

    monkeypatch.setattr(metadata, "entry_points", fake)
    catalog, notes = rules.all_rules()
    assert {"XT901", "XT902"} <= {r.id for r in catalog} and any("broken" in n for n in notes)
    assert rules.find_rule("XT902", catalog).explanation.what_it_does.startswith("Nothing")
    v = analyse([tiny_trace], rule_select=["XT9"])
    got = {f["rule"]: f for f in v["findings"]}
    assert got["XT901"]["evidence"]["kernels"] == 2 and got["XT901"]["severity"] == "info"
    # each rule ran in its own schema: two tables called `scratch`, no clash, none left in the store
    assert got["XT901"]["evidence"]["schema"] != got["XT902"]["evidence"]["schema"]
    assert any("broken" in n for n in v["notes"])


def test_pages_are_checked():
    with pytest.raises(ValueError, match="sections"):

        @rule("XT903", name="undocumented", layer="host", title="t", category=None)
        def _bad(ctx, t):
            """## What it does
            only one section"""
            return []

    with pytest.raises(ValueError, match="PR101"):
        rule("bad id", name="x", layer="host", title="t", category=None)(_plugin_rule.check)


# ---- the run: schemas, short windows, claims ------------------------------------------------------------------


def test_rules_leave_the_store_as_they_found_it(tiny_trace):
    res = pipeline.analyse([tiny_trace], pipeline.Options())
    try:
        con = res.con
        assert con.execute("SELECT current_database()").fetchone()[0] != "rule_pr101"
        attached = {n for (n,) in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        assert not {n for n in attached if n.startswith("rule_")}, attached
        temp = {n for (n,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
        temp |= {n for (n,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
        assert not {n for n in temp if n.startswith(("rule_", "_rule", "_gaps"))}, temp
    finally:
        res.close()


def test_a_window_too_short_to_judge_gets_no_findings(tmp_path):
    # Construction: one 0.02 µs kernel in a 0.3 µs trace (the shape of kineto's out-of-order-sync unit test).
    ev = [
        runtime("cudaLaunchKernel", 0.0, 0.1, corr=1),
        kernel("k", 0.2, 0.02, 0, 1),
        runtime("cudaDeviceSynchronize", 0.12, 0.18, corr=2),
    ]
    v = analyse([write_trace(tmp_path / "short.json", ev)])
    assert v["findings"] == []
    assert any("too short to judge" in n for n in v["notes"]), v["notes"]
    # measured (0.3 µs, the kernel resident 0.02 of it), but given no verdict word of its own: a word for 0.3 µs of
    # work would be a verdict on noise
    assert v["run"]["window_ns"] == pytest.approx(300, abs=2)
    assert v["utilization"]["trace"] == pytest.approx(0.02 / 0.3, rel=0.05)
    assert v["verdict"] == "too short to judge"
    # its waterfall keeps the measured shares, with no advice: no line may say "CUDA graphs" of 0.3 µs
    assert v["losses"] and sum(x["fraction"] for x in v["losses"]) == pytest.approx(1.0, abs=1e-6)
    assert {x["recommendation"] for x in v["losses"]} == {judge.NOT_JUDGED}, v["losses"]


def test_the_program_is_read_not_assumed(tmp_path, tiny_trace):
    ev = [runtime("cudaLaunchKernel", 0.0, 3.0, corr=1), kernel("scale_kernel", 5.0, 100.0, 0, 1)]
    for paths, pytorch in (([write_trace(tmp_path / "c.json", ev)], False), ([tiny_trace], True)):
        res = pipeline.analyse(paths, pipeline.Options())
        try:
            assert res.con.execute("SELECT pytorch, runtime FROM program").fetchone() == (pytorch, "cuda")
        finally:
            res.close()


@pytest.mark.parametrize("phase", ["compute_bound", "memory_bound", "launch_bound", "host_stall", "train_step"])
def test_findings_never_claim_more_than_lost(phase):
    v = single_phase(phase)
    claims_within_waterfall(v)
    for f in v["findings"]:
        assert f["severity"] in ("high", "medium", "low", "info") and f["title"] and f["recommendation"]
        json.dumps(f["evidence"], allow_nan=False)


def test_multi_rank_claims():
    claims_within_waterfall(ddp_sample())


def test_the_waterfall_line_takes_the_best_findings_fix():
    # the line of a category a rule explained carries that rule's one-line fix (judge.best_fixes)
    v = single_phase("host_stall")
    ss = next(x for x in v["losses"] if x["category"] == "sync_stall")
    best = max((f for f in v["findings"] if f["category"] == "sync_stall"), key=lambda f: f["lost_fraction"])
    assert ss["recommendation"] == best["fix"]


def test_docs_readme_lists_every_code():
    text = (Path(ROOT) / "docs" / "rules" / "README.md").read_text(encoding="utf-8")
    for c in CODES:
        assert f"[{c.code}]({c.code}.md)" in text
