"""The explorer's memory models and engine, on litmus tests and small hand-made targets.

Each litmus test is a two-thread program over raw ring offsets whose forbidden outcome makes
the reader report a message the writer never sent; whether the explorer reaches it says which
reorderings the model allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from enginewire.fuzz.explore import (
    ExplorerError,
    RingConfig,
    RingTarget,
    ThreadContext,
    explore,
)
from enginewire.fuzz.explore.model import AddressMap, MemoryModel
from enginewire.fuzz.explore.schedule import Schedule, decode_choices, encode_choices
from enginewire.reference.ring.layout import RingLayout

Body = Callable[[ThreadContext], None]


class Litmus(RingTarget):
    """A writer body and a reader body over a ring of ``payload_bytes``-byte chunks (bytes
    used freely, not as the spec lays a ring out)."""

    spec_layout = False

    def __init__(self, writer: Body, reader: Body, name: str = "litmus") -> None:
        self.writer = writer
        self.reader = reader
        self.name = name

    def layout(self, config: RingConfig) -> RingLayout:
        return RingLayout(config.readers, config.payload_bytes, config.chunks)

    def run_writer(self, context: ThreadContext) -> None:
        self.writer(context)

    def run_reader(self, context: ThreadContext) -> None:
        self.reader(context)


ONE = RingConfig(readers=1, chunks=2, messages=1, payload_bytes=1)
# Layout of ONE: data chunk 0 at 0, chunk 1 at 1; rows (written, r0) at 2-3 and 4-5.
X, Y, FLAG, RESULT = 0, 1, 2, 4


def message_passing(fenced: bool) -> Litmus:
    """MP: data then flag; the reader waits for the flag and must then see the data."""

    def writer(context: ThreadContext) -> None:
        context.memory.store(X, 1)
        if fenced:
            context.memory.fence()
        context.memory.store(FLAG, 1)

    def reader(context: ThreadContext) -> None:
        memory = context.memory
        while not memory.load(FLAG):
            memory.yield_()
        context.received(bytes((memory.load(X),)))

    return Litmus(writer, reader, f"mp-{'fenced' if fenced else 'plain'}")


def store_buffering(fenced: bool | str) -> Litmus:
    """SB: each thread stores its flag, then loads the other's; both loading 0 is forbidden
    under sc, allowed once stores can wait in a store buffer. ``fenced``: a full fence
    between each thread's store and load, ``"acq_rel"`` an acquire-release one."""

    def fence(memory: Any) -> None:
        if fenced == "acq_rel":
            memory.fence_acq_rel()
        elif fenced:
            memory.fence()

    def writer(context: ThreadContext) -> None:
        memory = context.memory
        memory.store(X, 1)
        fence(memory)
        memory.store(RESULT, memory.load(Y) + 1)

    def reader(context: ThreadContext) -> None:
        memory = context.memory
        memory.store(Y, 1)
        fence(memory)
        seen_x = memory.load(X)
        while not (result := memory.load(RESULT)):
            memory.yield_()
        both_zero = seen_x == 0 and result - 1 == 0
        context.received(b"\x00" if both_zero else b"\x01")

    return Litmus(writer, reader, f"sb-{'fenced' if fenced else 'plain'}")


def kinds(target: RingTarget, model: str, config: RingConfig = ONE) -> set[str]:
    result = explore(target, config, model=model, check="behavior", keep_going=True)
    assert result.complete
    return {finding.violation.kind for finding in result.findings}


@pytest.mark.parametrize("model", ["sc", "tso", "weak"])
def test_message_passing_needs_a_fence_only_under_weak(model: str) -> None:
    assert kinds(message_passing(fenced=True), model) == set()
    expected = {"torn"} if model == "weak" else set()
    assert kinds(message_passing(fenced=False), model) == expected


@pytest.mark.parametrize("model", ["sc", "tso", "weak"])
def test_store_buffering_needs_a_fence_under_tso_and_weak(model: str) -> None:
    assert kinds(store_buffering(fenced=True), model) == set()
    expected = set() if model == "sc" else {"torn"}
    assert kinds(store_buffering(fenced=False), model) == expected


def test_an_acquire_release_fence_lets_store_buffering_through_under_tso() -> None:
    """An earlier store and a later load are what an acquire-release fence leaves unordered
    (a lock taken and released on Arm: the what-if of tests/test_explore_vllm.py)."""
    assert kinds(store_buffering(fenced="acq_rel"), "tso") == {"torn"}


def test_weak_keeps_stores_to_one_address_in_order() -> None:
    def writer(context: ThreadContext) -> None:
        context.memory.store(X, 1)
        context.memory.store(X, 2)
        context.memory.store(FLAG, 1)

    def reader(context: ThreadContext) -> None:
        memory = context.memory
        first = memory.load(X)
        second = memory.load(X)
        # Seeing 2 and then 1 would be the two stores to X out of order.
        context.received(b"\x00" if (first, second) == (2, 1) else b"\x01")

    assert kinds(Litmus(writer, reader), "weak") == set()


def test_a_thread_reads_its_own_buffered_store() -> None:
    def writer(context: ThreadContext) -> None:
        context.memory.store(FLAG, 1)

    def reader(context: ThreadContext) -> None:
        memory = context.memory
        memory.store(Y, 7)
        context.received(b"\x01" if memory.load(Y) == 7 else b"\x00")

    for model in ("tso", "weak"):
        assert kinds(Litmus(writer, reader), model) == set()


def test_deadlock_names_what_each_thread_waits_on() -> None:
    def writer(context: ThreadContext) -> None:
        context.memory.store(X, 1)

    def reader(context: ThreadContext) -> None:
        while not context.memory.load(FLAG):
            context.memory.yield_()

    result = explore(Litmus(writer, reader), ONE)
    assert [f.violation.kind for f in result.findings] == ["deadlock"]
    assert "reader r0 waits on chunk 0 written flag = 0" in result.findings[0].violation.message


def test_an_exception_in_target_code_is_a_finding_with_its_clause() -> None:
    from enginewire.reference.errors import RingError

    def writer(context: ThreadContext) -> None:
        if context.memory.load(FLAG) == 0:
            raise RingError("ring.writer.wait-writable", "refused")

    def reader(context: ThreadContext) -> None:
        context.received(b"\x01")

    finding = explore(Litmus(writer, reader), ONE).findings[0]
    assert finding.violation.kind == "exception"
    assert finding.violation.clause == "ring.writer.wait-writable"
    assert "RingError" in finding.violation.message


def test_a_thread_that_never_ends_is_reported() -> None:
    def writer(context: ThreadContext) -> None:
        value = 0
        while True:
            value = 1 - value
            context.memory.store(X, value)
            context.memory.load(X)

    def reader(context: ThreadContext) -> None:
        context.received(b"\x01")

    result = explore(Litmus(writer, reader), ONE, max_steps=50, shrink=False)
    assert [f.violation.kind for f in result.findings] == ["no-termination"]


def test_code_that_does_not_behave_the_same_way_twice_is_refused() -> None:
    calls = []

    def writer(context: ThreadContext) -> None:
        calls.append(1)
        if len(calls) > 1:
            context.memory.load(X)
        context.memory.load(FLAG)

    def reader(context: ThreadContext) -> None:
        context.received(b"\x01")

    with pytest.raises(ExplorerError, match="same way twice"):
        explore(Litmus(writer, reader), ONE)


def test_addresses_are_named_after_the_ring_layout() -> None:
    amap = AddressMap(RingLayout(n_reader=2, max_chunk_bytes=9, max_chunks=2))
    assert amap.describe(18, 19) == "chunk 0 written flag"
    assert amap.describe(23, 24) == "chunk 1 read flag r1"
    assert amap.describe(19, 21) == "chunk 0 read flags r0..r1"
    assert amap.describe(3, 4) == "chunk 0 data[3]"
    assert amap.describe(16, 18) == "chunk 1 data[7..8]"
    assert amap.describe(17, 20) == "chunk 1 data[8] + chunk 0 written flag + chunk 0 read flag r0"


def test_schedule_strings_round_trip() -> None:
    keys = ["w", "w", "w", "r0", "dw.3", "dr1", "dr1", "r1"]
    assert encode_choices(keys) == "w*3,r0,dw.3,dr1*2,r1"
    assert decode_choices("w*3,r0,dw.3,dr1*2,r1") == keys
    schedule = Schedule.parse("pkg.mod:target/weak/2x2x3x4/w*3,r0")
    assert schedule.target == "pkg.mod:target"
    assert schedule.model is MemoryModel.WEAK
    assert (schedule.config.readers, schedule.config.chunks, schedule.config.messages,
            schedule.config.payload_bytes) == (2, 2, 3, 4)
    assert str(schedule) == "pkg.mod:target/weak/2x2x3x4/w*3,r0"
    with pytest.raises(ValueError, match="bad schedule choice"):
        decode_choices("w,x9")
    with pytest.raises(ValueError, match="memory model"):
        Schedule.parse("reference/arm/2x2x3/w")
