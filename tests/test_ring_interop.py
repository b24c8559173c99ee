"""The reference ring against vLLM's own MessageQueue, on the same segment, both directions.

vLLM's MessageQueue needs no torch.distributed when built directly: the writer is constructed
in this process and readers attach with ``MessageQueue.create_from_handle(handle, rank)`` in
processes of their own, as the multiprocessing executor's workers do.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
from ring_helpers import (
    STEP_TIMEOUT,
    Readers,
    RingEnv,
    message,
    readers,
    reference_reader,
    ring_env,
    tensor_message,
    vllm_reader,
)

from enginewire.reference.ring import Handle, MessageQueue
from enginewire.reference.ring.framing import needs_overflow
from enginewire.reference.ring.payload import PickleCodec

pytest.importorskip("vllm")
pytest.importorskip("torch")

pytestmark = pytest.mark.vllm
__all__ = ["readers", "ring_env"]  # fixtures used by name

CHUNK = 4096
COUNT = 10_000
BIG_CHUNK = 4 * 1024 * 1024
TENSOR_COUNT = 12


def vllm_queue_class() -> Any:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue as VllmQueue

    return VllmQueue


def within(timeout: float, fn: Callable[[], None]) -> None:
    """Run ``fn`` (a vLLM call without a timeout of its own) in a thread, at most ``timeout`` s."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"{fn} did not return within {timeout} s")
    if errors:
        raise errors[0]


def test_stream_overflows_often_enough() -> None:
    codec = PickleCodec()
    overflowing = sum(needs_overflow(codec.encode(message(i, CHUNK)), CHUNK) for i in range(100))
    assert 20 <= overflowing <= 60


def test_vllm_writer_reference_readers(ring_env: RingEnv, readers: Readers) -> None:
    """10,000 messages, overflow sizes included, to two reference readers, then tensors."""
    writer = vllm_queue_class()(2, 2, max_chunk_bytes=CHUNK, max_chunks=6)
    tensor_writer = vllm_queue_class()(1, 1, max_chunk_bytes=BIG_CHUNK, max_chunks=3)
    try:
        for queue in (writer, tensor_writer):
            ring_env.segments.append(queue.export_handle().buffer_handle[3])
        # vLLM's handle as the reference's own (same fields): the reader processes need not
        # import vLLM to unpickle it.
        handle = Handle.from_any(writer.export_handle())
        assert handle.__dict__ == writer.export_handle().__dict__
        for rank in range(2):
            readers.start(reference_reader, handle, rank, COUNT, CHUNK)
        readers.start(reference_reader, Handle.from_any(tensor_writer.export_handle()), 0,
                      TENSOR_COUNT, BIG_CHUNK, "pickle", "tensors")
        within(STEP_TIMEOUT, writer.wait_until_ready)
        within(STEP_TIMEOUT, tensor_writer.wait_until_ready)
        for index in range(COUNT):
            writer.enqueue(message(index, CHUNK), timeout=STEP_TIMEOUT)
        for index in range(TENSOR_COUNT):
            tensor_writer.enqueue(tensor_message(index), timeout=STEP_TIMEOUT)
        reports = readers.reports(timeout=120)
    finally:
        del writer, tensor_writer
        gc.collect()  # vLLM closes its sockets and unlinks its segment at collection
    assert reports == [{"received": COUNT, "error": None}] * 2 + [
        {"received": TENSOR_COUNT, "error": None}]


def test_reference_writer_vllm_readers(ring_env: RingEnv, readers: Readers) -> None:
    """10,000 messages, overflow sizes included, to two vLLM readers, then tensors."""
    with MessageQueue(2, 2, max_chunk_bytes=CHUNK, max_chunks=6,
                      ipc_dir=ring_env.ipc_dir) as writer, \
            MessageQueue(1, 1, max_chunk_bytes=BIG_CHUNK, max_chunks=3,
                         ipc_dir=ring_env.ipc_dir) as tensor_writer:
        handle, tensor_handle = writer.export_handle(), tensor_writer.export_handle()
        readers.start(vllm_reader, [(handle, 0, COUNT, CHUNK, "bytes"),
                                    (tensor_handle, 0, TENSOR_COUNT, BIG_CHUNK, "tensors")])
        readers.start(vllm_reader, [(handle, 1, COUNT, CHUNK, "bytes")])
        # vLLM's readers import vLLM first: give them time to subscribe.
        writer.wait_until_ready(timeout=120)
        for index in range(COUNT):
            writer.enqueue(message(index, CHUNK), timeout=STEP_TIMEOUT)
        tensor_writer.wait_until_ready(timeout=STEP_TIMEOUT)
        for index in range(TENSOR_COUNT):
            tensor_writer.enqueue(tensor_message(index), timeout=STEP_TIMEOUT)
        reports = readers.reports(timeout=120)
    assert reports == [
        [{"received": COUNT, "error": None}, {"received": TENSOR_COUNT, "error": None}],
        [{"received": COUNT, "error": None}],
    ]


def test_reference_pickle_bytes_equal_vllms_without_tensors() -> None:
    """For objects without tensors the main and out-of-band buffers are vLLM's, byte for byte."""
    import copyreg
    import io
    import pickle

    import numpy
    from vllm.distributed.device_communicators import shm_broadcast

    obj = {"ids": list(range(50)), "big": numpy.arange(300_000, dtype=numpy.int64),
           "small": numpy.arange(10), "name": "x" * 300}
    buffers: list[Any] = []

    def callback(buffer: pickle.PickleBuffer) -> bool:  # vLLM's rule, spelled out
        raw = buffer.raw()
        if len(raw) < 1024 * 1024:
            return True
        buffers.append(raw)
        return False

    with io.BytesIO() as stream:
        pickler = pickle.Pickler(stream, protocol=pickle.HIGHEST_PROTOCOL,
                                 buffer_callback=callback)
        pickler.dispatch_table = {**copyreg.dispatch_table,
                                  shm_broadcast.torch.Tensor: shm_broadcast._reduce_tensor}
        pickler.dump(obj)
        vllm_buffers = [stream.getvalue(), *buffers]
    ours = PickleCodec().encode(obj)
    assert [bytes(b) for b in ours] == [bytes(b) for b in vllm_buffers]
