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

from enginewire.conformance.peers.ring_peer import pickle_buffers, unpickle_buffers
from enginewire.reference.errors import UnsafePickleError
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


def test_reference_pickle_bytes_equal_vllms_without_tensors_or_arrays() -> None:
    """For objects without tensors or numpy arrays the main and out-of-band buffers are
    vLLM's, byte for byte (an out-of-band PickleBuffer included)."""
    import pickle

    obj = {"ids": list(range(50)), "big": pickle.PickleBuffer(bytearray(range(256)) * 5000),
           "small": pickle.PickleBuffer(b"s" * 10), "name": "x" * 300, "t": (1.5, None)}
    ours = PickleCodec().encode(obj)
    assert len(ours) == 2
    assert [bytes(b) for b in ours] == [bytes(b) for b in pickle_buffers(obj)]


def _arrays() -> dict[str, Any]:
    import numpy

    big = numpy.arange(300_000, dtype=numpy.int64)
    return {
        "big": big,  # out of band
        "small": numpy.arange(10),
        "big-endian, Fortran order": numpy.arange(12, dtype=">f8").reshape(3, 4).T,
        "unicode": numpy.array(["ab", "c"]),
        "0-d": numpy.array(7, dtype=numpy.int16),
        "empty": numpy.empty((0, 3), dtype=numpy.float32),
        "bool": numpy.array([True, False]),
        # numpy's own reduction, byte for byte as vLLM's:
        "strided": big[::1000],
        "structured": numpy.array([(1, [2, 3])], dtype=[("x", "<i4"), ("y", "<f4", (2,))]),
        "datetime": numpy.array([0, 10**18], dtype="datetime64[ns]"),
        "with metadata": numpy.zeros(3, dtype=numpy.dtype("<f4", metadata={"unit": "m"})),
        "objects": numpy.array([1, "a"], dtype=object),
        "subclass": numpy.arange(4).view(numpy.recarray),
    }


#: The arrays the reference pickles with numpy's own reduction (vLLM's bytes).
_NUMPYS_OWN = {"strided", "structured", "datetime", "with metadata", "objects", "subclass"}


@pytest.mark.parametrize("case", sorted(_arrays()))
def test_reference_pickled_arrays_read_back_in_vllm_as_the_same_array(case: str) -> None:
    """An array in a message pickles as numpy's reduction with its dtype spelled as a string
    (payload._array_reducer), so its stream differs from vLLM's; vLLM's reader rebuilds the
    same array from it (dtype, shape, values, memory order), and the reference's allow-list
    reader reads both streams. Arrays whose dtype a string cannot carry, and arrays numpy does
    not hand over as a buffer, go as numpy's own reduction: vLLM's bytes (numpy.rec.recarray is
    not in the allow-list: the reference reader refuses that one either way)."""
    import numpy
    from ring_helpers import same_value

    array = _arrays()[case]
    obj = {"a": array, "n": 1}
    ours, theirs = PickleCodec().encode(obj), pickle_buffers(obj)
    assert len(ours) == len(theirs)
    assert ([bytes(b) for b in ours] == [bytes(b) for b in theirs]) == (case in _NUMPYS_OWN)
    for buffers in (ours, theirs):
        readings = [unpickle_buffers(buffers)]
        if case == "subclass":
            with pytest.raises(UnsafePickleError):
                PickleCodec().decode(buffers[0], [bytearray(b) for b in buffers[1:]])
        else:
            readings.append(
                PickleCodec().decode(buffers[0], [bytearray(b) for b in buffers[1:]]))
        for got in readings:
            value = got["a"]
            assert type(value) is type(array) and value.dtype == array.dtype
            assert value.dtype.metadata == array.dtype.metadata
            assert value.flags.f_contiguous == array.flags.f_contiguous or case == "strided"
            if case == "objects":
                assert value.tolist() == array.tolist()
            else:
                assert same_value(numpy.asarray(value), numpy.asarray(array)), case
