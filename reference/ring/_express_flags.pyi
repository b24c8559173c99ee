"""The flag section of the ring's express path, compiled (``_express_flags.c``)."""

from typing import Literal

def publish_single(view: memoryview, row: int, n_reader: int, chunk: int,
                   body: bytes, /) -> bool: ...
def read_single(view: memoryview, row: int, own: int, chunk: int,
                limit: int, /) -> bytes | None | Literal[False]: ...
