"""matplotlib for report.html, imported without writing the property list into the docstring of every Artist
class's `set` method.

matplotlib builds those docstrings while its modules load (`Artist.__init_subclass__` calls `artist.kwdoc` for
each of ~100 classes, and several modules interpolate `kwdoc` output into others): ~70 ms of every run's start-up,
for text only `help()` shows. While the figure, collection, patch, ticker and SVG modules load, `kwdoc` returns
an empty string; it is restored afterwards, so anything that calls it later gets matplotlib's own. Nothing but
docstrings differs (the page is byte-identical: tests/test_render_startup.py draws it both ways). If
matplotlib is already loaded, or no longer has `kwdoc`, the modules are simply imported."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib
import matplotlib.artist


@contextmanager
def _without_set_docstrings() -> Iterator[None]:
    original = getattr(matplotlib.artist, "kwdoc", None)
    if original is None or "matplotlib.figure" in sys.modules:
        yield
        return
    matplotlib.artist.kwdoc = lambda artist: ""
    try:
        yield
    finally:
        matplotlib.artist.kwdoc = original


with _without_set_docstrings():
    import matplotlib.backends.backend_svg
    from matplotlib.backends.backend_mixed import MixedModeRenderer
    from matplotlib.backends.backend_svg import RendererSVG
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    from matplotlib.transforms import ScaledTranslation

__all__ = [
    "Figure",
    "FuncFormatter",
    "Line2D",
    "MaxNLocator",
    "MixedModeRenderer",
    "Patch",
    "PolyCollection",
    "RendererSVG",
    "ScaledTranslation",
    "matplotlib",
    "to_rgba",
]
