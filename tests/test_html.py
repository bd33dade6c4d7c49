"""report.html (SPEC §6, issue 7): structure checked with an HTML parser, and the page as a person sees it —
opened in headless Chromium through the DevTools protocol (over a pipe: no port, no network)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from plasmient_report import pipeline
from plasmient_report.render import html as html_render

from .conftest import corpus_file

SECTIONS = (
    "headline",
    "waterfall",
    "findings",
    "timeline",
    "ranks",
    "steps",
    "kernels",
    "ops",
    "shapes",
    "roofline",
    "ranges",
    "collectives",
    "memory",
    "launch-stats",
    "counters",
    "clock",
    "coverage",
    "notes",
    "perfetto",
)
ALLOWED_URLS = ("https://ui.perfetto.dev",)
MAX_BYTES = 5 * 1024 * 1024


class Page(HTMLParser):
    """The parts of a page the tests look at: ids with their text and attributes, URLs, scripts, sections."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.by_id: dict[str, dict[str, str]] = {}
        self.text_of: dict[str, str] = {}
        self.urls: list[tuple[str, str, str]] = []
        self.tags: dict[str, int] = {}
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k in ("src", "href", "xlink:href", "action", "poster", "data"):
            if k in a:
                self.urls.append((tag, k, a[k]))
        if "style" in a and "url(" in a["style"]:
            self.urls.append((tag, "style", a["style"]))
        ident = a.get("id")
        if ident and tag not in ("path", "g", "clippath", "image", "use"):
            self.by_id[ident] = {"tag": tag, **a}
            self.text_of[ident] = ""
        if tag not in (
            "br",
            "img",
            "meta",
            "link",
            "input",
            "hr",
            "col",
            "source",
            "wbr",
            "area",
            "base",
            "embed",
            "param",
            "track",
        ):
            self._open.append((tag, ident))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in self._open:
            if ident in self.text_of:
                self.text_of[ident] += data


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def report(inputs: list[Path], out: Path) -> tuple[Path, dict[str, Any], float]:
    """Analyse, then time only the HTML render."""
    res = pipeline.analyse(inputs, pipeline.Options())
    t0 = time.perf_counter()
    html_render.write(res.con, res.verdict, out)
    return out, res.verdict, time.perf_counter() - t0


def shown_pct(x: float) -> str:
    """How the page prints a fraction (the documented format, written here independently of the renderer):
    one decimal below 1%, none above."""
    return f"{x * 100:.1f}%" if 0 < x < 0.01 else f"{round(x * 100)}%"


def shown_achieved(verdict: dict[str, Any]) -> str:
    """The headline achieved fraction: 'unknown' when null, '≥ N%' when a lower bound (two decimals below 1%)."""
    ach = verdict["achieved_fraction_of_peak"]
    if ach is None:
        return "unknown"
    if verdict["achieved_is_lower_bound"]:
        return "≥ " + (f"{ach * 100:.2f}%" if 0 < ach < 0.01 else shown_pct(ach))
    return shown_pct(ach)


def check_structure(path: Path, verdict: dict[str, Any]) -> Page:
    assert path.stat().st_size < MAX_BYTES
    page = parse(path)
    text = path.read_text(encoding="utf-8")
    # Self-contained: nothing fetched from anywhere. Only in-page anchors, inline data, and the Perfetto link.
    for tag, attr, url in page.urls:
        if url.startswith(("#", "data:")) or url in ALLOWED_URLS:
            continue
        pytest.fail(f"external reference <{tag} {attr}={url[:80]!r}> in report.html")
    assert page.tags.get("link", 0) == 0 and page.tags.get("iframe", 0) == 0
    assert "@import" not in text and "<script src" not in text
    for section in SECTIONS:
        assert section in page.by_id and page.by_id[section]["tag"] == "section", f"section #{section} missing"
    # Headline numbers: the verdict's own values, printed as the terminal prints them.
    util = verdict["utilization"]["trace"]
    assert float(page.by_id["headline-utilization"]["data-value"]) == pytest.approx(util, rel=1e-12)
    assert page.text_of["headline-utilization"].strip() == shown_pct(util)
    ach = verdict["achieved_fraction_of_peak"]
    if ach is not None:
        assert float(page.by_id["headline-achieved"]["data-value"]) == pytest.approx(ach, rel=1e-12)
    assert page.text_of["headline-achieved"].strip() == shown_achieved(verdict)
    if verdict["achieved_is_lower_bound"] and ach is not None:  # never a confident near-zero: said in words
        cov = verdict["coverage"]
        unknown = cov.get("unknown_flops_time_fraction")
        assert "lower bound" in page.text_of["headline-lower-bound"]
        if unknown is not None:  # the share of compute time nothing estimates is what makes it a bound
            assert shown_pct(unknown) in page.text_of["headline-lower-bound"]
        else:
            assert shown_pct(cov["kernels_with_flops_time_fraction"]) in page.text_of["headline-lower-bound"]
    if ach is None:
        assert "no peak known" in page.text_of["headline-unknown"] or "FLOP" in page.text_of["headline-unknown"]
    if verdict["utilization"].get("measured") is not None:
        assert float(page.by_id["headline-measured"]["data-value"]) == pytest.approx(verdict["utilization"]["measured"])
    assert page.text_of["verdict-word"].strip() == verdict["verdict"]
    # The waterfall adds up: achieved + every category = 100%.
    if verdict["losses"] and ach is not None:
        assert page.text_of["waterfall-total"].strip() == "100%"
    if not verdict["findings"]:
        assert "no-findings" in page.by_id
    assert "ui.perfetto.dev" in text and "trace.pftrace" in text
    # Charts are inline SVG from matplotlib, not images fetched from anywhere.
    if ach is not None:
        assert page.tags.get("svg", 0) >= 2  # waterfall and timeline at least
    return page


def test_tiny_trace_report(tiny_trace: Path, tmp_path: Path) -> None:
    path, verdict, _ = report([tiny_trace], tmp_path / "report.html")
    page = check_structure(path, verdict)
    # Ground truth of the fixture (conftest): one rank, utilization 0.205.
    assert page.text_of["headline-utilization"].strip() == "20%"
    assert "nvjet_sm90_tst_gemm" in path.read_text(encoding="utf-8")


@pytest.mark.corpus
def test_single_gpu_corpus_report(tmp_path: Path) -> None:
    path, verdict, seconds = report([corpus_file("h200-single-kineto/kineto_single.json.gz")], tmp_path / "r.html")
    page = check_structure(path, verdict)
    text = path.read_text(encoding="utf-8")
    for name in ("phase:compute_bound", "phase:train_step"):  # the per-range table
        assert name in text
    assert "roofline" in page.by_id and "No roofline" not in text
    print(f"h200 single: {path.stat().st_size / 1e3:.0f} kB, rendered in {seconds:.2f} s")


@pytest.mark.corpus
def test_two_rank_corpus_report(tmp_path: Path) -> None:
    path, verdict, _ = report([corpus_file("h200x2-small/kineto")], tmp_path / "r.html")
    check_structure(path, verdict)
    text = path.read_text(encoding="utf-8")
    # Per-rank table and strips for both ranks; the late rank's wait is visible as collective wait.
    assert "rank 0" in text and "rank 1" in text
    assert "collective wait" in text


@pytest.mark.corpus
def test_largest_public_kineto_report(tmp_path: Path) -> None:
    src = corpus_file("public-kineto-hta/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    path, verdict, seconds = report([src], tmp_path / "r.html")
    check_structure(path, verdict)
    print(f"public ns_resolution trace: {path.stat().st_size / 1e3:.0f} kB, rendered in {seconds:.2f} s")


def test_many_ranks(tmp_path: Path) -> None:
    """16 ranks: one row per rank, strips for all of them, the per-rank breakdown collapsed, still small."""
    from .conftest import annotation, cpu_op, kernel, launch, write_trace

    folder = tmp_path / "run"
    folder.mkdir()
    n = 2048
    for rank in range(16):
        late = 50.0 * rank  # each rank's GEMM starts later: a staircase on the shared clock
        ev = [
            annotation("phase:work", 0.0, 1000.0),
            cpu_op("aten::mm", 10.0, 20.0, ext=5, dims=[[n, n], [n, n]], types=["c10::BFloat16", "c10::BFloat16"]),
            launch(12.0, ext=5, corr=50),
            kernel("nvjet_sm90_tst_gemm", 100.0 + late, 100.0, ext=5, corr=50),
        ]
        write_trace(folder / f"rank-{rank}.pt.trace.json", ev, rank=rank)
    path, verdict, _ = report([folder], tmp_path / "report.html")
    page = check_structure(path, verdict)
    assert len(verdict["ranks"]) == 16
    text = path.read_text(encoding="utf-8")
    assert "rank 15" in text and "<details>" in text  # many ranks: the breakdown starts collapsed
    assert path.stat().st_size < 1_000_000
    assert page.tags.get("svg", 0) >= 3  # waterfall, timeline, per-rank bars


def test_unknown_gpu(tmp_path: Path) -> None:
    """No peak known: no waterfall or roofline, said in words; the rest of the page still renders."""
    from .conftest import cpu_op, kernel, launch, write_trace

    ev = [
        cpu_op("aten::add_", 10.0, 5.0, ext=6),
        launch(11.0, ext=6, corr=51),
        kernel("vectorized_elementwise_kernel", 20.0, 50.0, ext=6, corr=51),
    ]
    trace = write_trace(tmp_path / "t.pt.trace.json", ev, gpu="Mystery Accelerator 9000")
    path, verdict, _ = report([trace], tmp_path / "report.html")
    assert verdict["peak"]["tflops"] is None
    page = parse(path)
    assert all(s in page.by_id for s in SECTIONS)
    text = path.read_text(encoding="utf-8")
    assert ("No loss waterfall" in text or "The achieved fraction is unknown" in text) and "No roofline" in text
    assert page.text_of["headline-achieved"].strip() == "unknown"
    assert "no peak known for this GPU" in page.text_of["headline-unknown"]


def test_unknown_gpu_table_covers_the_window(tmp_path: Path) -> None:
    """No peak: the loss table ends with the share in no loss (the GEMM's 20%, conftest.unknown_gpu_trace, by
    construction), and its total is 100% of the window."""
    from .conftest import unknown_gpu_trace

    res = pipeline.analyse([unknown_gpu_trace(tmp_path / "t.json")], pipeline.Options(ranges=["work"]))
    try:
        html_render.write(res.con, res.verdict, tmp_path / "report.html")
    finally:
        res.close()
    page = parse(tmp_path / "report.html")
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "The achieved fraction is unknown" in text
    assert "headroom unknown (no peak known for this GPU)" in text
    row = text[text.index("achieved + inefficiency") :]
    assert row[: row.index("</tr>")].count("20%") == 1
    assert page.text_of["waterfall-total"].strip() == "100%"


def test_timeline_drawn_when_the_peak_is_known_and_the_achieved_fraction_is_not(tmp_path: Path) -> None:
    """A known GPU whose GEMM has no FLOP estimate (no shapes): achieved is unknown, but the time-based losses and
    the unknown work are measured, so the timeline is drawn (a public 4-rank V100 report had read "no peak is known
    for this GPU" under a header naming its 125 TFLOP/s peak). Without a peak it stays out, and says so."""
    from .conftest import annotation, cpu_op, kernel, launch, unknown_gpu_trace, write_trace

    ev = [
        annotation("work", 0.0, 1000.0),
        cpu_op("aten::mm", 10.0, 5.0, ext=1),  # (no input shapes: no FLOP estimate)
        launch(11.0, 1, 10),
        kernel("nvjet_sm90_tst_gemm", 100.0, 200.0, ext=1, corr=10),
    ]
    for name, trace, drawn in (
        ("known", write_trace(tmp_path / "known.json", ev), True),
        ("unknown", unknown_gpu_trace(tmp_path / "unknown.json"), False),
    ):
        res = pipeline.analyse([trace], pipeline.Options(ranges=["work"]))
        try:
            assert res.verdict["achieved_fraction_of_peak"] is None or not drawn, name
            assert (res.verdict["peak"]["tflops"] is not None) == drawn, name
            html_render.write(res.con, res.verdict, tmp_path / f"{name}.html")
        finally:
            res.close()
        text = (tmp_path / f"{name}.html").read_text(encoding="utf-8")
        section = text[text.index('<section id="timeline">') :]
        section = section[: section.index("</section>")]
        assert ("<svg" in section) == drawn and ("No timeline" in section) != drawn, name
        if not drawn:
            assert "no peak is known for this GPU" in section


def test_report_reads_only_the_store(tiny_trace: Path, tmp_path: Path) -> None:
    """The renderer works from a stored run.duckdb (read-only) and the verdict: no input file is needed."""
    from plasmient_report import store

    res = pipeline.analyse([tiny_trace], pipeline.Options())
    store.copy_store(res.con, tmp_path / "run.duckdb")
    tiny_trace.unlink()
    con = store.open_readonly(tmp_path / "run.duckdb")
    html_render.write(con, res.verdict, tmp_path / "report.html")
    check_structure(tmp_path / "report.html", res.verdict)


def test_findings_and_counters_render(tiny_trace: Path, tmp_path: Path) -> None:
    """Findings (as the rules will emit them) and counter rows (as the counter parsers will fill them) show up."""
    res = pipeline.analyse([tiny_trace], pipeline.Options())
    ((s, e),) = res.con.execute("SELECT start_ns, end_ns FROM windows WHERE scope = 'window'").fetchall()
    step = (e - s) // 10
    res.con.execute(
        """INSERT INTO counters (source_id, rank, device, metric, start_ns, end_ns, value, time_source)
                       SELECT 9, NULL, 0, 'gpu_util', ? + i * ?, ? + (i + 1) * ?, CASE WHEN i < 3 THEN 100 ELSE 0 END,
                              'native' FROM range(10) t(i)""",
        [s, step, s, step],
    )
    verdict = dict(res.verdict)
    verdict["findings"] = [
        {
            "rule": "PR999",
            "layer": "kernel",
            "category": None,
            "severity": "high",
            "rank": 0,
            "lost_fraction": 0.42,
            "title": "a <test> finding",
            "evidence": {"kernel": "nvjet_sm90_tst_gemm", "ms": 0.2},
            "recommendation": "do the thing",
            "fix": "the thing",
            "key": "k",
        }
    ]
    path = tmp_path / "report.html"
    html_render.write(res.con, verdict, path)
    page = check_structure(path, verdict)
    text = path.read_text(encoding="utf-8")
    assert "PR999" in text and "a &lt;test&gt; finding" in text and "do the thing" in text and "42%" in text
    assert "no-findings" not in page.by_id
    assert "gpu_util" in text and "No device-counter samples" not in text


def test_timeline_bins_are_honest(tiny_trace: Path) -> None:
    """A loss interval spanning many bins colours all of them; bins sum to the window."""
    res = pipeline.analyse([tiny_trace], pipeline.Options())
    windows = html_render.gpu_windows(res.con)
    spans = html_render.own_spans(windows, nbins=100)
    binned = html_render.bin_intervals(res.con, html_render.LOSS_SOURCE, spans)
    labels, choice = html_render.where_peak_went(binned, spans)
    lost = binned.weighted.sum()
    window_ns = windows[0][3] - windows[0][2]
    achieved = res.verdict["achieved_fraction_of_peak"]
    assert lost / window_ns == pytest.approx(1 - achieved, abs=1e-9)  # binning loses and invents no time
    assert (choice >= 0).all()
    # The fixture's window is idle except 100–300 µs (the GEMM) and 995–1000 µs: most bins are idle losses.
    idle = sum(1 for c in choice[0] if labels[c] in ("launch_bound", "host_other", "sync_stall"))
    assert idle >= 70


def test_bin_intervals_against_every_bin_one_by_one() -> None:
    """Each interval's overlap with each bin, and its value times that overlap, summed per (span, bin, key), as a
    loop over every bin computes it: intervals inside one bin, across a bin edge, over many bins, ending on an edge,
    starting before the grid or running past it, outside it, and empty ones."""
    import duckdb
    import numpy as np

    rng = np.random.default_rng(11)
    spans = [html_render.Span(0, 0, 1_000, 1000 / 7, 40, 1_000, 6_714), html_render.Span(1, 0, 5_000, 250.0, 12, 5_000, 8_000)]
    rows = []
    for span_i, sp in enumerate(spans):
        lo, hi = sp.g0_ns - 400, sp.g0_ns + int(sp.bin_ns * sp.nbins) + 400
        for _ in range(400):
            s = int(rng.integers(lo, hi))
            e = s + int(rng.choice([0, 1, int(rng.integers(1, 60)), int(rng.integers(60, 3000))]))
            rows.append((sp.rank, sp.device, s, e, f"k{int(rng.integers(0, 3))}", float(rng.normal()), span_i))
        edge = int(sp.g0_ns + 3 * sp.bin_ns)
        rows.append((sp.rank, sp.device, edge - 50, edge, "k0", 2.0, span_i))  # ends on a bin edge
    con = duckdb.connect()
    con.execute("CREATE TABLE t (rank INTEGER, device INTEGER, s BIGINT, e BIGINT, key VARCHAR, val DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", [r[:6] for r in rows])
    got = html_render.bin_intervals(con, "SELECT rank, device, s, e, key, val FROM t", spans)
    keys = sorted({r[4] for r in rows})
    assert got.keys == keys
    want_ov = np.zeros((len(spans), max(sp.nbins for sp in spans), len(keys)))
    want_wv = np.zeros_like(want_ov)
    for _, _, s, e, key, val, span_i in rows:
        sp = spans[span_i]
        if e <= s:
            continue
        for b in range(sp.nbins):
            ov = min(e - sp.g0_ns, (b + 1) * sp.bin_ns) - max(s - sp.g0_ns, b * sp.bin_ns)
            if ov > 0:
                want_ov[span_i, b, keys.index(key)] += ov
                want_wv[span_i, b, keys.index(key)] += val * ov
    assert got.overlap_ns == pytest.approx(want_ov, rel=1e-9, abs=1e-6)
    assert got.weighted == pytest.approx(want_wv, rel=1e-9, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# The browser: Chromium driven through the DevTools protocol over --remote-debugging-pipe.


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chrome:
    """A minimal DevTools client: JSON messages separated by NUL on fds 3 (to Chrome) and 4 (from Chrome)."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def pipe_fds() -> None:  # in the child: Chromium reads commands on fd 3 and writes answers on fd 4
            a = fcntl.fcntl(to_r, fcntl.F_DUPFD_CLOEXEC, 10)
            b = fcntl.fcntl(from_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-sync",
                "--hide-scrollbars",
                "--mute-audio",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipe_fds,
        )
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self._from_r], [], [], left)
            if ready:
                chunk = os.read(self._from_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may already be gone
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_w)
        os.close(self._from_r)


def open_in_chromium(exe: str, html: Path, shot: Path, dark: bool, profile: Path) -> dict[str, Any]:
    """Load the page, collect console errors and exceptions, read the headline from the DOM, screenshot it."""
    chrome = Chrome(exe, profile)
    try:
        target = chrome.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        chrome.session = chrome.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            chrome.send(f"{domain}.enable")
        chrome.send(
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark" if dark else "light"}]}
        )
        chrome.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        chrome.events.clear()
        chrome.send("Page.navigate", {"url": html.resolve().as_uri()})
        chrome.wait_for("Page.loadEventFired")

        def js(expr: str) -> Any:
            r = chrome.send("Runtime.evaluate", {"expression": expr, "returnByValue": True})
            if "exceptionDetails" in r:
                raise AssertionError(f"{expr}: {r['exceptionDetails']}")
            return r["result"].get("value")

        found = {
            "utilization": js("document.getElementById('headline-utilization').innerText"),
            "achieved": js("document.getElementById('headline-achieved').innerText"),
            "verdict": js("document.getElementById('verdict-word').innerText"),
            "findings": js("document.getElementById('findings').innerText"),
            "sections": js("Array.from(document.querySelectorAll('main > section')).map(s => s.id)"),
            "svg_drawn": js(
                "Array.from(document.querySelectorAll('svg.chart-svg')).every(s => s.getBoundingClientRect().width > 100)"
            ),
            "background": js("getComputedStyle(document.body).backgroundColor"),
            "page_width": js("document.documentElement.scrollWidth"),
            # Tables that do not fit their box (and so scroll inside it): at 1280 px, none of ours should.
            "tables_cut": js("""Array.from(document.querySelectorAll('main table')).filter(t => {
                const box = t.parentElement;
                return box.scrollWidth > box.clientWidth + 1
                    || t.getBoundingClientRect().right > document.querySelector('main').getBoundingClientRect().right + 1;
            }).map(t => (t.closest('section') || {}).id + ':' + (t.id || t.tHead.innerText.slice(0, 30)))"""),
            "kernel_cells": js(
                "Array.from(document.querySelectorAll('#kernels tbody td.kname')).map(td => [td.innerText, td.title])"
            ),
            "text": js("document.querySelector('main').innerText"),
        }
        height = js("Math.ceil(document.documentElement.scrollHeight)")
        chrome.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": int(min(height, 16000)), "deviceScaleFactor": 1, "mobile": False},
        )
        png = chrome.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        shot.write_bytes(base64.b64decode(png))
        # Then use the sortable tables the way a reader would: click a header twice, rows reverse.
        found["sorted"] = js("""(() => {
            const th = document.querySelector('#ranges table.sortable thead th, #kernels table.sortable thead th');
            const rows = () => Array.from(th.closest('table').tBodies[0].rows).map(r => r.cells[th.cellIndex].innerText);
            th.click(); const up = rows(); th.click(); const down = rows();
            return th.dataset.dir === 'desc' && JSON.stringify(up.slice().reverse()) === JSON.stringify(down)
                   || new Set(up).size < up.length; })()""")
        errors = []
        for m in chrome.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("text", "exception"))
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                errors.append(p["entry"].get("text", ""))
        found["errors"] = errors
        return found
    finally:
        chrome.close()


BROWSER_CASES = {
    "tiny": None,
    "h200-single": "h200-single-kineto/kineto_single.json.gz",
    "h200x2": "h200x2-small/kineto",
}


@pytest.mark.browser
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("case", list(BROWSER_CASES))
def test_report_in_chromium(case: str, dark: bool, tiny_trace: Path, tmp_path: Path) -> None:
    exe = chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); .ci/run installs it")
    rel = BROWSER_CASES[case]
    inputs = [tiny_trace] if rel is None else [corpus_file(rel)]
    path, verdict, _ = report(inputs, tmp_path / "report.html")
    shot = tmp_path / f"report-{case}-{'dark' if dark else 'light'}.png"
    seen = open_in_chromium(exe, path, shot, dark, tmp_path / "profile")
    print(f"screenshot: {shot}")
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert seen["utilization"].strip() == shown_pct(verdict["utilization"]["trace"])
    assert seen["achieved"].strip() == shown_achieved(verdict)
    assert seen["verdict"].strip() == verdict["verdict"]
    if verdict["findings"]:
        assert verdict["findings"][0]["title"] in seen["findings"]
    else:
        assert "No findings" in seen["findings"]
    assert list(seen["sections"]) == list(SECTIONS)
    assert seen["svg_drawn"] and seen["sorted"]
    assert seen["page_width"] <= 1280, "the page scrolls sideways"
    # Issue 15: no table is cut off or scrolls at a laptop's width (the per-rank matrix of many ranks may scroll in
    # its own box); kernel names never read alike (shortened in the middle; the full name on hover).
    assert [t for t in seen["tables_cut"] if not t.startswith("ranks:")] == []
    cells = seen["kernel_cells"]
    assert cells and len({text for text, _ in cells}) == len(cells), cells
    titles = [title for _, title in cells]
    assert len(set(titles)) == len(titles) and {k["name"] for k in verdict["top_kernels"]} <= set(titles)
    # No raw JSON and no share of a window above 100% anywhere in the text.
    assert "[]" not in seen["text"] and "{}" not in seen["text"]
    import re

    assert not [m for m in re.findall(r"(\d+(?:\.\d+)?)%", seen["text"]) if float(m) > 100.5]
    # The theme follows prefers-color-scheme.
    assert seen["background"] == ("rgb(21, 24, 28)" if dark else "rgb(255, 255, 255)")
    assert shot.stat().st_size > 10_000


def test_a_cells_sort_key_keeps_integers_and_twelve_digits_of_a_float() -> None:
    """data-sort: an integer exactly (a time in ns keeps every digit), a float to 12 significant digits, which order
    the values the page tells apart and do not move with the last digits a parallel sum's order changes (the mean of
    a counter's 12.6 M samples in a 486 MiB nsys export: 1662.7386163476472 in one run, 1662.738616347647 in the
    next)."""
    assert html_render.sort_key(1662.7386163476472) == html_render.sort_key(1662.738616347647) == "1662.73861635"
    assert html_render.sort_key(1_790_857_026_123_456_789) == "1790857026123456789"
    assert [html_render.sort_key(x) for x in (None, float("nan"), float("inf"))] == ["", "", ""]
    values = [-3.5, 0.0, 1e-9, 0.5, 0.5000001, 3.0, 1234.5, 2.5e17]
    assert sorted(reversed(values), key=lambda v: float(html_render.sort_key(v))) == values


def test_an_empty_bar_keeps_its_row_inside_the_chart() -> None:
    # A waterfall whose last row, achieved, is 0% (an elementwise-only program on a known GPU, a public nsys report)
    # had that row drawn on its x axis: the bars are one polygon collection without the empty ones, and the axes
    # scaled to the others only. `barh` scales to every bar, empty ones too (height 0.7 about each row).
    import numpy as np

    fig = html_render._figure(4, 2)
    ax = fig.add_subplot()
    html_render._hbars(ax, np.arange(3), np.array([1.0, 0.5, 0.0]), np.zeros(3), ["#111111", "#222222", "#333333"], 0.7)
    lo, hi = sorted(ax.get_ylim())
    assert lo <= -0.35 and hi >= 2 + 0.35
