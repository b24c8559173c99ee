"""The shared-memory broadcast ring and the ``MessageQueue`` built on it (vLLM-compatible).

Read it in this order:

- :mod:`.layout`: where every byte lives (pure arithmetic);
- :mod:`.framing`: how a message's buffers sit in one chunk (sans-IO encode/decode);
- :mod:`.protocol`: the writer's and readers' flag steps over an injectable memory;
- :mod:`.shm`: the real shared-memory segment behind that memory;
- :mod:`.wait`: how the ends wait between two failed checks;
- :mod:`.payload`: the pickle (vLLM-compatible) and msgspec payload codecs;
- :mod:`.express`: one message's steps and codec work in one call per end, over shared memory
  (held byte for byte to the steps);
- :mod:`.queue`: ``MessageQueue``, sockets and all;
- :mod:`.rpc`: the executor RPC's request and reply messages (sans-IO);
- :mod:`.executor`: vLLM's executor and worker ends of that RPC over ``MessageQueue``.

The spec of all of it is ``spec/data/ring.toml`` (``enginewire spec show ring.<clause>``).

This package may import ``enginewire.spec`` and the rest of ``enginewire.reference``.
"""

from .executor import Executor, Worker
from .framing import DecodedChunk, decode_chunk, encode_chunk, framed_size, needs_overflow
from .layout import RingLayout
from .payload import MsgspecCodec, PayloadCodec, PickleCodec
from .protocol import BytearrayMemory, ChunkState, RingMemory, RingReader, RingWriter, classify
from .queue import Handle, MessageQueue, QueueClosed
from .rpc import ReplyCodec, ResponseStatus
from .shm import ShmMemory, ShmSegment, memory_fence
from .wait import Backoff, WaitPolicy

__all__ = [
    "Backoff",
    "BytearrayMemory",
    "ChunkState",
    "DecodedChunk",
    "Executor",
    "Handle",
    "MessageQueue",
    "MsgspecCodec",
    "PayloadCodec",
    "PickleCodec",
    "QueueClosed",
    "ReplyCodec",
    "ResponseStatus",
    "RingLayout",
    "RingMemory",
    "RingReader",
    "RingWriter",
    "ShmMemory",
    "ShmSegment",
    "WaitPolicy",
    "Worker",
    "classify",
    "decode_chunk",
    "encode_chunk",
    "framed_size",
    "memory_fence",
    "needs_overflow",
]
