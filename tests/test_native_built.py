"""The compiled parts are present where CI says they must be (PLASMIENT_REQUIRE_NATIVE=1, `.ci/run`).

Without a C compiler `pip install` leaves them out and the Python ways do the work; their tests then skip
(tests/test_ingest_kineto_native.py, tests/test_perfetto.py, tests/test_nsys_pages.py). CI builds them, so there a
skip would hide that the native ways went untested: this test turns it into a failure."""

from __future__ import annotations

import os

import pytest

from plasmient_report.parsers.kineto import decode
from plasmient_report.parsers.nsys import reader
from plasmient_report.render import perfetto

required = os.environ.get("PLASMIENT_REQUIRE_NATIVE") == "1"


@pytest.mark.skipif(not required, reason="PLASMIENT_REQUIRE_NATIVE is not set (only CI requires the C extensions)")
def test_native_extensions_built() -> None:
    assert decode._native is not None, "the native Kineto scan (_scan.c) is not built: install with `pip install -e .`"
    assert decode.NATIVE
    assert perfetto._pbenc is not None, "the native protobuf encoder (_pbenc.c) is not built"
    assert hasattr(perfetto._pbenc, "counters"), "the native protobuf encoder is an old build (no `counters`)"
    assert perfetto.NATIVE
    assert reader._native is not None, "the nsys GPU metrics' page reader (_sqlpages.c) is not built"
