"""The one exception type for unusable input; the CLI prints it as one line and exits 2."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _visible(s: str) -> str:
    """Control characters (a newline in a file name) as escapes: the message stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], s)


class BadInput(Exception):
    """An input file or argument the tool cannot use. The message names the file and the problem, on one line
    (a library's multi-line error text is joined)."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = _visible(str(path)) if path is not None else None
        self.problem = _visible(" ".join(str(problem).split()))
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)
