"""The one exception type for unusable input; the CLI prints it as one line and exits 2."""

from __future__ import annotations


class BadInput(Exception):
    """An input file or argument the tool cannot use. The message names the file and the problem."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
