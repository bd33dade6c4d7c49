"""The one exception type for unusable input; the CLI prints it as one line and exits 2."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_text(p: object) -> str:
    """A path as text that can be printed and stored anywhere: bytes of a file name that are not UTF-8 (held by
    Python as lone surrogates) become `\\xNN` escapes."""
    s = str(p)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # surrogates that no byte produced: shown as code points
            s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def _visible(s: str) -> str:
    """Control characters (a newline in a file name) and undecodable bytes as escapes: the message stays one
    printable line."""
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], path_text(s))


class BadInput(Exception):
    """An input file or argument the tool cannot use. The message names the file and the problem, on one line
    (a library's multi-line error text is joined)."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = _visible(str(path)) if path is not None else None
        self.problem = _visible(" ".join(str(problem).split()))
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGTERM, SIGHUP) — handled exactly like Ctrl-C: every `finally` runs, the
    scratch and staging folders are removed, the CLI prints "interrupted" and exits 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)
