"""Every file the installed package reads at run time is in the wheel: `pip install .` (the README's first quick-start
command) copies only the Python modules and the files `[tool.setuptools.package-data]` names. A data file added
beside the code and not named there works from the checkout (and in an editable install) and is missing from a real
one — as the SQL library's modules once were (`KeyError: 'collective_key'` on the bundled sample).

The globs are resolved the way setuptools resolves them (relative to the package's folder, `glob` semantics); .ci/run
also installs the package as the README does and runs it on the bundled sample.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport the package depends on there
    import tomli as tomllib  # type: ignore[no-redef]

from .conftest import ROOT

PACKAGE = ROOT / "plasmient_report"
# Sources of the compiled parts and their type stubs: used by the build and by mypy, never read at run time.
BUILD_ONLY = {".py", ".pyc", ".c", ".pyi", ".so", ".pyd"}


def _data_files() -> set[Path]:
    found = set()
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found |= {Path(folder, f) for f in files if Path(f).suffix not in BUILD_ONLY}
    return found


def _packaged(patterns: list[str]) -> set[Path]:
    return {Path(p) for pat in patterns for p in glob.glob(str(PACKAGE / pat)) if Path(p).is_file()}


def test_every_data_file_of_the_package_is_in_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["plasmient_report"]
    data = _data_files()
    assert {p.name for p in data} >= {"schema.sql", "peaks.toml", "collective_key.sql", "report.html.j2"}  # it looks
    missing = sorted(str(p.relative_to(ROOT)) for p in data - _packaged(patterns))
    assert missing == [], f"not in pyproject.toml's package-data, so not installed by `pip install .`: {missing}"
