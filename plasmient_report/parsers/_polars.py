"""polars, imported on first use. Only the counter-log parsers need it, and importing it costs every run ~45 MiB
of resident memory and ~0.1 s, Kineto and nsys runs included: `pl` here is the module itself to type checkers and,
at run time, a stand-in that imports polars when an attribute is first read."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["pl"]

if TYPE_CHECKING:
    import polars as pl
else:

    class _Lazy:
        """Attribute reads go to polars, imported the first time."""

        _module: ModuleType | None = None

        def __getattr__(self, name: str) -> Any:
            if _Lazy._module is None:
                _Lazy._module = importlib.import_module("polars")
            return getattr(_Lazy._module, name)

    pl = _Lazy()
