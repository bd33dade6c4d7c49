from collections.abc import Sequence

MAX_COLS: int

def read(
    fd: int, page_size: int, usable: int, n_pages: int, root: int, cols: Sequence[int], kinds: bytes, lo: int, hi: int
) -> tuple[int, list[bytes], list[bytes | None], list[bytes | None]] | None: ...
