"""What report.html saves at start-up changes no byte of it: matplotlib imported without the Artist `set`
docstrings (render/_mpl.py) draws the page it draws imported as usual, and the compiled-template cache
(html._template_cache) gives the page of freshly compiled templates, cold, warm, unwritable or corrupted."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, sample_file

SAMPLE = "h200_single/kineto_single.pt.trace.json.gz"

_PAGE = """
import hashlib, pathlib, sys
{before}
import matplotlib.artist
from plasmient_report import pipeline
from plasmient_report.render import html
res = pipeline.analyse([pathlib.Path(sys.argv[1])], pipeline.Options())
page = html.render(res.con, res.typed)
res.close()
print(hashlib.sha256(page.encode()).hexdigest(), matplotlib.artist.kwdoc.__module__, len(page))
"""


def _page(before: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PAGE.format(before=before), str(sample_file(SAMPLE))],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_page_is_the_same_without_set_docstrings() -> None:
    plain = _page("import matplotlib.figure  # loaded first: _mpl imports nothing specially")
    quick = _page("")
    assert quick[0] == plain[0], "report.html differs when matplotlib is imported without the set docstrings"
    assert quick[1] == "matplotlib.artist"  # kwdoc restored
    assert int(quick[2]) > 10_000  # a real page (charts inlined)
    assert hashlib.sha256(b"").hexdigest() != quick[0]


_RENDER = """
import pathlib, sys
from plasmient_report import pipeline
from plasmient_report.render import html
res = pipeline.analyse([pathlib.Path(sys.argv[1])], pipeline.Options())
sys.stdout.write(html.render(res.con, res.typed))
res.close()
"""


def _rendered(cache_home: Path) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cache_home), "XDG_CACHE_HOME": str(cache_home / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", _RENDER, str(sample_file(SAMPLE))], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_template_cache_gives_the_same_page(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "plasmient-report" / "templates"
    cold = _rendered(tmp_path)
    cached = sorted(folder.iterdir())
    assert cached, "no compiled template was kept"
    assert _rendered(tmp_path) == cold  # warm: loaded from the cache
    for f in cached:
        f.write_bytes(b"j2 not a template")  # corrupted: compiled again
    assert _rendered(tmp_path) == cold


def test_unwritable_template_cache_is_no_cache(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder would go")
    assert "<svg" in _rendered(tmp_path)
