from collections.abc import Sequence
from typing import Any

def encode(n: int, nodes: Sequence[Sequence[tuple[Any, ...]]]) -> tuple[bytes, bytes]: ...
