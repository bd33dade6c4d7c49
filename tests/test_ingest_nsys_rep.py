"""`.nsys-rep` inputs: a newer sibling export is used; else `nsys export` into a cache beside the output;
else one line with the exact command."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from plasmient_report.errors import BadInput
from plasmient_report.parsers import nsys_rep

from .conftest import sample_file


def _rep(tmp: Path) -> Path:
    rep = tmp / "in" / "run.nsys-rep"
    rep.parent.mkdir()
    shutil.copy(sample_file("h200_single/nsys_single.nsys-rep"), rep)
    return rep


def test_newer_sibling_sqlite_is_used(tmp_path):
    rep = _rep(tmp_path)
    db = rep.with_suffix(".sqlite")
    shutil.copy(sample_file("h200_single/nsys_single.sqlite"), db)
    os.utime(db, (rep.stat().st_mtime + 10, rep.stat().st_mtime + 10))
    assert nsys_rep.resolve(rep, tmp_path / "cache") == db


def test_without_nsys_the_exact_command_is_given(tmp_path, monkeypatch):
    rep = _rep(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("NSYS", raising=False)
    with pytest.raises(BadInput) as e:
        nsys_rep.resolve(rep, tmp_path / "cache")
    assert "nsys export --type sqlite" in str(e.value) and str(rep) in str(e.value)


def test_export_goes_to_the_cache_not_beside_the_input(tmp_path, monkeypatch):
    rep = _rep(tmp_path)
    rep.parent.chmod(0o555)  # a read-only input folder
    fake = tmp_path / "nsys"
    src = sample_file("h200_single/nsys_single.sqlite")
    fake.write_text(f"""#!/bin/sh
# stand-in for `nsys export`: copies a real export to the --output path
while [ $# -gt 0 ]; do case "$1" in --output) out="$2"; shift;; esac; shift; done
cp "{src}" "$out"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NSYS", str(fake))
    try:
        db = nsys_rep.resolve(rep, tmp_path / "cache")
        assert db.exists() and tmp_path / "cache" in db.parents
        assert sorted(p.name for p in rep.parent.iterdir()) == ["run.nsys-rep"]
        assert nsys_rep.resolve(rep, tmp_path / "cache") == db  # cached
    finally:
        rep.parent.chmod(0o755)
