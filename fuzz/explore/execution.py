"""Executions of a ring target: its threads' own code, interleaved at memory accesses.

How the target's code runs. A thread of a ring target (the writer, one reader) talks to the
others only through the ring's shared memory, and its code is deterministic: what it does next
depends only on the values its loads returned so far. So the explorer runs each thread's real
code *alone*, over a memory that answers its loads with given values and records every access
it makes (:class:`ThreadProgram`). Each distinct history of loaded values is run once; the
runs form a tree per thread (a :class:`Node` per operation, a branch per value a load can
return). The explorer then interleaves those trees over a model of the shared memory
(:class:`World`): every interleaving it reports is one the real code, run as threads over
real shared memory, can take under the memory model, and replaying a schedule drives the same
code down the same paths. Python objects shared between threads of one process (rather than
bytes of the ring) are invisible to this decomposition; ring ends live in different processes.

Scheduling points are the accesses other threads can observe: loads, and stores under ``sc``.
Under ``tso``/``weak`` a store goes into the thread's store buffer (no scheduling point), and
its becoming visible (a *drain*) is an action of its own. What a thread does between two
points (buffering stores, fences with an empty buffer, loads its own buffer answers, receiving
a message) happens at once.

Waiting: a thread that yields (``sched_yield``, a spin-wait stand-in) would, if nothing it read
since its last yield has changed, read the same values again and yield again; so it is blocked
until one of those bytes changes. That keeps spin loops finite, and a state in which every
unfinished thread is blocked is a deadlock. A fence under ``tso``/``weak`` blocks its thread
until its store buffer has drained.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from enginewire.fuzz.explore.checks import FlagDiscipline, describe_receipt
from enginewire.fuzz.explore.model import AddressMap, Footprint, MemoryModel, Region
from enginewire.reference.errors import ProtocolError, RingError
from enginewire.reference.ring.framing import decode_chunk
from enginewire.reference.ring.layout import RingLayout

WRITER = "writer"
READER = "reader"

#: Operations a thread may run between two loads before the explorer gives up on it.
MAX_OPS_WITHOUT_LOAD = 100_000

_local = threading.local()


class ExplorerError(RuntimeError):
    """The explorer could not run the target as asked (not a finding about the target)."""


class _Stop(BaseException):
    """Unwinds a thread's code at the first load past the values it was given (a
    BaseException, so the target's ``except Exception`` cannot swallow it)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """A property an execution broke: ``kind`` names it, ``clause`` is the spec clause it
    breaks (None for end-to-end properties such as a lost message), ``step`` the action at
    which it was detected."""

    kind: str
    clause: str | None
    message: str
    step: int
    actor: str

    @property
    def protocol(self) -> bool:
        """A flag-discipline violation (rather than a wrong message, a deadlock, ...)."""
        return self.kind in FlagDiscipline.KINDS


@dataclass(slots=True)
class Event:
    """One line of a trace. ``step`` is the action's number, None for what a thread does
    alone between two actions (buffering a store, waiting, receiving a message)."""

    step: int | None
    actor: str
    kind: str
    lo: int
    hi: int
    value: bytes
    note: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """One choice of the scheduler. ``key`` is the token a schedule spells it with:
    ``w``/``r0``/``r1``... for a thread's pending access, ``dw``/``dr0`` for the oldest store
    of that thread's buffer (``tso``), ``dw.5`` for its store number 5 (``weak``)."""

    key: str
    thread: int
    entry: int | None
    footprint: Footprint


@dataclass(frozen=True)
class ThreadSpec:
    """One thread of a target: ``body(context)`` runs its code to completion."""

    key: str
    name: str
    role: str
    rank: int | None
    body: Callable[[ThreadContext], None]


@dataclass
class ThreadContext:
    """What a target thread's body gets: its memory, the ring's layout, what each reader
    must receive (``payloads``, one bytes per message), ``received(payload)`` to report each
    message a reader takes out of the ring, and the buffers of each message the writer sends
    (``messages``: one buffer, the payload, unless the configuration has out-of-band
    buffers; a reader reports a message of several buffers by their
    :func:`~enginewire.fuzz.explore.schedule.received_form`)."""

    memory: ThreadMemory
    layout: RingLayout
    payloads: list[bytes]
    received: Callable[[bytes], None]
    rank: int | None
    messages: list[list[bytes]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Node:
    """One operation of a thread: ``load``/``read`` (children by the bytes returned),
    ``store`` (``data`` at ``lo``), ``fence``, ``acq_rel`` (an acquire-release fence),
    ``yield``, ``receive`` (``data`` is the
    message), ``done``, or ``raise`` (``note`` says what, ``clause`` if it names one)."""

    id: int
    kind: str
    lo: int = 0
    hi: int = 0
    data: bytes = b""
    note: str = ""
    clause: str | None = None
    next: Node | None = None
    children: dict[bytes, Node] | None = None
    #: The values the thread's loads returned before this operation.
    history: tuple[bytes, ...] = ()
    #: The load before this one on the thread's path (loads only).
    previous: Node | None = None


class ThreadMemory:
    """The :class:`~enginewire.reference.ring.protocol.RingMemory` a thread's code runs on
    while the explorer records it: loads return the given values in order; the first load
    past them ends the run."""

    __slots__ = ("_feed", "_fed", "_expected", "ops", "_ids", "_stopped", "_since_load",
                 "_amap")

    def __init__(self, feed: tuple[bytes, ...], expected: Sequence[tuple[str, int, int]],
                 ids: itertools.count, amap: AddressMap | None = None) -> None:
        self._amap = amap
        self._feed = feed
        self._expected = expected
        self._fed = 0
        self.ops: list[Node] = []
        self._ids = ids
        self._stopped = False
        self._since_load = 0

    def _record(self, kind: str, lo: int = 0, hi: int = 0, data: bytes = b"") -> None:
        if self._stopped:
            raise _Stop
        if self._fed == len(self._feed):
            self._since_load += 1
            if self._since_load > MAX_OPS_WITHOUT_LOAD:
                raise ExplorerError(f"a thread ran {MAX_OPS_WITHOUT_LOAD} operations without "
                                    "loading from the ring: a loop the explorer cannot interleave")
            self.ops.append(Node(next(self._ids), kind, lo, hi, data, history=self._feed))

    def _placed(self, method: str, lo: int, hi: int) -> None:
        """Past the values given, an access the spec's layout does not allow ends the run
        with a ``layout`` operation naming the clause (see :meth:`AddressMap.misplaced`)."""
        if self._amap is None or self._fed < len(self._feed) or self._stopped:
            return
        found = self._amap.misplaced(method, lo, hi)
        if found is not None:
            clause, message = found
            self.ops.append(Node(next(self._ids), "layout", lo, hi, note=message,
                                 clause=clause, history=self._feed))
            self._stopped = True
            raise _Stop

    def _access(self, kind: str, lo: int, hi: int) -> bytes:
        if self._stopped:
            raise _Stop
        if self._fed < len(self._feed):
            if self._expected[self._fed] != (kind, lo, hi):
                raise ExplorerError("the thread's code made other accesses on a re-run with the "
                                    "same values: it does not behave the same way twice")
            value = self._feed[self._fed]
            self._fed += 1
            return value
        self._record(kind, lo, hi)
        self._stopped = True
        raise _Stop

    def load(self, offset: int) -> int:
        self._placed("load", offset, offset + 1)
        return self._access("load", offset, offset + 1)[0]

    def read(self, offset: int, length: int) -> bytes:
        self._placed("read", offset, offset + length)
        return self._access("read", offset, offset + length)

    def store(self, offset: int, value: int) -> None:
        self._placed("store", offset, offset + 1)
        self._record("store", offset, offset + 1, bytes((value,)))

    def write(self, offset: int, data: Any) -> None:
        raw = bytes(memoryview(data).cast("B"))
        if raw:
            self._placed("write", offset, offset + len(raw))
            self._record("store", offset, offset + len(raw), raw)

    def fence(self) -> None:
        self._record("fence")

    def fence_acq_rel(self) -> None:
        self._record("acq_rel")

    def yield_(self) -> None:
        self._record("yield")

    def notify(self) -> None:
        """The writer's notification (its notify socket send): an ordered event."""
        self._record("notify")

    def wait_notify(self) -> None:
        """A reader blocks on its notify socket with no recheck of the flags. Notifications
        are hints that may be lost (ring.notify.hint-only), so the explorer never delivers
        one: the thread waits for good."""
        self._record("wait_notify")

    def received(self, payload: Any) -> None:
        self._record("receive", data=bytes(payload))

    @property
    def exhausted(self) -> bool:
        return self._fed == len(self._feed)


def current_memory() -> ThreadMemory | None:
    """The explorer memory of the code running now, None outside the explorer (for
    stand-ins of module-level fence and yield functions)."""
    return getattr(_local, "memory", None)


class ThreadProgram:
    """The tree of one thread's operations, grown by running its code on demand."""

    def __init__(self, spec: ThreadSpec, layout: RingLayout, payloads: list[bytes],
                 ids: itertools.count, check_layout: bool = True,
                 messages: list[list[bytes]] | None = None) -> None:
        self.spec = spec
        self.layout = layout
        self.payloads = payloads
        self.messages = messages if messages is not None else [[p] for p in payloads]
        self._ids = ids
        self._root: Node | None = None
        self.runs = 0
        #: Accesses are checked against the spec's layout (AddressMap.misplaced).
        self._amap = AddressMap(layout) if check_layout else None

    def root(self) -> Node:
        if self._root is None:
            self._root = self._run((), None)
        return self._root

    def child(self, node: Node, value: bytes) -> Node:
        """The operation after ``node`` (a load or read) returned ``value``."""
        children = node.children
        assert children is not None
        found = children.get(value)
        if found is None:
            found = children[value] = self._run(node.history + (value,), node)
        return found

    def _run(self, feed: tuple[bytes, ...], last_load: Node | None) -> Node:
        self.runs += 1
        expected: list[tuple[str, int, int]] = []
        load = last_load
        while load is not None:
            expected.append((load.kind, load.lo, load.hi))
            load = load.previous
        expected.reverse()
        memory = ThreadMemory(feed, expected, self._ids, self._amap)
        context = ThreadContext(memory, self.layout, self.payloads, memory.received,
                                self.spec.rank, self.messages)
        previous = getattr(_local, "memory", None)
        _local.memory = memory
        try:
            self.spec.body(context)
            memory.ops.append(Node(next(self._ids), "done", history=feed))
        except _Stop:
            pass
        except ExplorerError:
            raise
        except Exception as exc:  # noqa: BLE001 - any escape from target code is a finding
            if not memory.exhausted:
                raise ExplorerError("the thread's code raised on a re-run with values it "
                                    f"handled before: {exc!r}") from exc
            clause = exc.clause if isinstance(exc, ProtocolError) else None
            memory.ops.append(Node(next(self._ids), "raise", note=f"{type(exc).__name__}: {exc}",
                                   clause=clause, history=feed))
        finally:
            _local.memory = previous
        if not memory.exhausted:
            raise ExplorerError("the thread's code ended early on a re-run with the same values: "
                                "it does not behave the same way twice")
        ops = memory.ops
        for first, second in itertools.pairwise(ops):
            first.next = second
        last = ops[-1]
        if last.kind in ("load", "read"):
            last.children = {}
            last.previous = last_load
        return ops[0]


class _Entry:
    """A store waiting in a thread's store buffer, with the action that drains it."""

    __slots__ = ("seq", "lo", "data", "action")

    def __init__(self, seq: int, lo: int, data: bytes, action: Action) -> None:
        self.seq = seq
        self.lo = lo
        self.data = data
        self.action = action


class Simulator:
    """Everything fixed for one target configuration: programs, layout, model, checks."""

    def __init__(self, *, layout: RingLayout, model: MemoryModel, threads: Sequence[ThreadSpec],
                 payloads: Sequence[bytes], check_protocol: bool = True,
                 max_steps: int = 10_000, framing: str | None = None,
                 check_layout: bool = True,
                 messages: Sequence[Sequence[bytes]] | None = None) -> None:
        self.layout = layout
        #: What a published chunk must hold (checked when the writer sets its written flag):
        #: None (nothing: the target moves raw bytes), ``"valid"`` (the spec's chunk framing)
        #: or ``"buffers"`` (that framing around exactly the message's buffers).
        self.framing = framing
        #: Accesses, publish and release indices checked against the spec's ring.
        self.check_layout = check_layout
        self.amap = AddressMap(layout)
        self.model = model
        self.specs = list(threads)
        self.payloads = list(payloads)
        #: The buffers of each message the writer sends (default: the payload alone).
        self.messages = ([list(m) for m in messages] if messages is not None
                         else [[p] for p in self.payloads])
        self.check_protocol = check_protocol
        self.max_steps = max_steps
        self.discipline = FlagDiscipline(self.amap)
        self.buffered = model.buffered
        ids = itertools.count()
        self.programs = [ThreadProgram(spec, layout, self.payloads, ids, check_layout,
                                       self.messages)
                         for spec in self.specs]
        self._footprints: dict[tuple[int, str, int, int], Footprint] = {}
        self._node_actions: dict[int, Action] = {}

    def start(self, *, recording: bool = False, tracking: bool = True) -> World:
        """The state before any action: each thread has run up to its first scheduling point.
        ``tracking`` keeps the list of actions taken (``World.keys``)."""
        world = World(self, recording, tracking)
        for index in range(len(self.specs)):
            world.settle(index)
            if world.violation is not None:
                break
        return world

    def footprint(self, owner: int, kind: str, lo: int, hi: int) -> Footprint:
        """What an action touches; a store also reads what the flag-discipline check reads
        (when that check is on)."""
        key = (owner, kind, lo, hi)
        found = self._footprints.get(key)
        if found is None:
            if kind == "store":
                reads = self.amap.check_footprint(lo, hi) if self.check_protocol else ()
                found = Footprint(owner, reads, ((lo, hi),))
            else:
                found = Footprint(owner, ((lo, hi),), ())
            self._footprints[key] = found
        return found

    def node_action(self, index: int, node: Node) -> Action:
        """The action of thread ``index`` paused at ``node`` (a load, read or sc store)."""
        found = self._node_actions.get(node.id)
        if found is None:
            found = Action(self.specs[index].key, index, None,
                           self.footprint(index, node.kind, node.lo, node.hi))
            self._node_actions[node.id] = found
        return found

    def entry(self, index: int, seq: int, lo: int, data: bytes) -> _Entry:
        key = self.specs[index].key
        key = f"d{key}" if self.model is MemoryModel.TSO else f"d{key}.{seq}"
        action = Action(key, index, seq, self.footprint(index, "store", lo, lo + len(data)))
        return _Entry(seq, lo, data, action)

    @property
    def runs(self) -> int:
        """How many times the target's thread code was run to grow the operation trees."""
        return sum(program.runs for program in self.programs)


_GLOBAL = frozenset({"load", "read", "store"})


class World:
    """One state of an execution; :meth:`perform` takes an action, :meth:`copy` branches.

    Per thread (parallel lists): ``nodes`` (its pending operation), ``observed`` (offset ->
    value it read since its last yield; replaced, never mutated, once shared), ``buffers``
    (its store buffer, oldest first), ``stores`` (stores it has buffered so far).
    """

    __slots__ = ("sim", "memory", "nodes", "observed", "buffers", "stores", "current",
                 "preemptions", "step", "keys", "events", "violation", "recording", "received",
                 "flagged", "notified")

    def __init__(self, sim: Simulator, recording: bool, tracking: bool) -> None:
        self.sim = sim
        self.memory = bytearray(sim.amap.size)
        self.nodes = [program.root() for program in sim.programs]
        count = len(self.nodes)
        self.observed: list[dict[int, int]] = [{} for _ in range(count)]
        self.buffers: list[tuple[_Entry, ...]] = [() for _ in range(count)]
        self.stores = [0] * count
        self.current: int | None = None
        self.preemptions = 0
        self.step = 0
        self.keys: list[str] | None = [] if tracking or recording else None
        self.events: list[Event] = []
        self.violation: Violation | None = None
        self.recording = recording
        self.received: list[tuple[bytes, ...]] = [() for _ in range(count)]
        #: Per thread: how many chunks it has published (writer) or released (reader), in
        #: program order (a function of its history, so not part of the state key).
        self.flagged = [0] * count
        #: Per thread: how many notifications it has sent (program order).
        self.notified = [0] * count

    def copy(self) -> World:
        other = World.__new__(World)
        other.sim = self.sim
        other.memory = bytearray(self.memory)
        other.nodes = list(self.nodes)
        other.observed = list(self.observed)
        other.buffers = list(self.buffers)
        other.stores = list(self.stores)
        other.current = self.current
        other.preemptions = self.preemptions
        other.step = self.step
        other.keys = None if self.keys is None else list(self.keys)
        other.events = list(self.events) if self.recording else self.events
        other.violation = self.violation
        other.recording = self.recording
        other.received = list(self.received)
        other.flagged = list(self.flagged)
        other.notified = list(self.notified)
        return other

    def state_key(self, *, with_current: bool) -> bytes:
        """Identifies the state: memory, each thread's place in its tree (which fixes its
        history, hence everything it holds), the publishes, releases and notifications the
        program-order checks counted, and which of its stores are still buffered."""
        numbers = [node.id for node in self.nodes]
        # What the program-order checks count (publishes and releases that were new as the
        # thread saw them, notifications): not a function of a thread's history alone.
        numbers.extend(self.flagged)
        numbers.extend(self.notified)
        if self.sim.buffered:
            for buffer in self.buffers:
                numbers.append(len(buffer))
                numbers.extend(entry.seq for entry in buffer)
        if with_current:
            numbers.append(-1 if self.current is None else self.current)
        return bytes(self.memory) + array("q", numbers).tobytes()

    # --- choices ------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        """The actions enabled now: threads paused at an access, then drainable stores."""
        sim = self.sim
        node_action = sim.node_action
        actions = [node_action(index, node) for index, node in enumerate(self.nodes)
                   if node.kind in _GLOBAL]
        if sim.buffered:
            tso = sim.model is MemoryModel.TSO
            for buffer in self.buffers:
                if not buffer:
                    continue
                if tso:
                    actions.append(buffer[0].action)
                else:
                    actions.extend(entry.action for entry in _weak_drainable(buffer))
        return actions

    def cost(self, action: Action) -> int:
        """1 if taking ``action`` preempts the thread that ran last (it could go on), else 0."""
        current = self.current
        if current is None or (action.entry is None and action.thread == current):
            return 0
        return 1 if self.nodes[current].kind in _GLOBAL else 0

    def perform(self, action: Action) -> None:
        self.preemptions += self.cost(action)
        self.step += 1
        if self.keys is not None:
            self.keys.append(action.key)
        index = action.thread
        if action.entry is not None:
            self._drain(index, action.entry)
        else:
            self.current = index
            node = self.nodes[index]
            if node.kind == "store":
                self._program_store(index, node)
                if self.violation is not None:
                    return
                self._make_visible(index, node.lo, node.data, pending=(), seq=None)
                if self.violation is not None:
                    return
                self.nodes[index] = node.next  # type: ignore[assignment]
            else:
                lo, hi = node.lo, node.hi
                value = self._view(index, lo, hi)
                observed = dict(self.observed[index])
                for offset in range(lo, hi):
                    observed[offset] = value[offset - lo]
                self.observed[index] = observed
                if self.recording:
                    self._event(self.step, index, node.kind, lo, hi, value)
                self.nodes[index] = self.sim.programs[index].child(node, value)
            self.settle(index)
        self._wake()

    def finish(self) -> None:
        """No action is enabled: check for deadlock and that every reader got everything."""
        sim = self.sim
        waiting = [i for i, node in enumerate(self.nodes) if node.kind != "done"]
        if waiting:
            trusting = [sim.specs[i].name for i in waiting
                        if self.nodes[i].kind == "wait_notify"]
            if trusting:
                self.fail("lost-notification", "ring.notify.hint-only",
                          f"{', '.join(trusting)} waits for a notification and never rechecks "
                          "the flags: a notification is only a hint, and one that is lost "
                          "(the notify socket drops them at SNDHWM 1) leaves it asleep on "
                          "what the writer published", "explorer")
                return
            parts = []
            for index in waiting:
                name = sim.specs[index].name
                if self.nodes[index].kind == "yield":
                    parts.append(f"{name} waits on {self._describe_observed(index)}")
                else:
                    parts.append(f"{name} waits at a {self.nodes[index].kind}")
            self.fail("deadlock", None, "deadlock: " + "; ".join(parts), "explorer")
            return
        for index, spec in enumerate(sim.specs):
            got = len(self.received[index])
            if spec.role == READER and got != len(sim.payloads):
                self.fail("lost", None, f"{spec.name} ended with {got} of "
                           f"{len(sim.payloads)} messages", spec.name)
                return

    # --- what a thread does alone -------------------------------------------------------

    def settle(self, index: int) -> None:
        """Run thread ``index`` through what it does alone, up to its next scheduling point,
        a wait, or its end."""
        sim = self.sim
        program = sim.programs[index]
        buffered = sim.buffered
        nodes = self.nodes
        while self.violation is None:
            node = nodes[index]
            kind = node.kind
            if kind == "load" or kind == "read":
                buffer = self.buffers[index]
                if not buffer:
                    return
                own = _own_bytes(buffer, node.lo, node.hi)
                if own is None:
                    return
                observed = dict(self.observed[index])
                for offset in range(node.lo, node.hi):
                    observed[offset] = own[offset - node.lo]
                self.observed[index] = observed
                if self.recording:
                    self._event(None, index, kind, node.lo, node.hi, own,
                                "from its own store buffer")
                nodes[index] = program.child(node, own)
            elif kind == "store":
                if not buffered:
                    return
                self._program_store(index, node)
                if self.violation is not None:
                    return
                seq = self.stores[index] = self.stores[index] + 1
                self.buffers[index] = self.buffers[index] + (
                    sim.entry(index, seq, node.lo, node.data),)
                if self.recording:
                    self._event(None, index, "buffer", node.lo, node.hi, node.data,
                                f"store #{seq}, not visible yet")
                nodes[index] = node.next  # type: ignore[assignment]
            elif kind == "fence" or kind == "acq_rel":
                # An acquire-release fence orders nothing TSO leaves unordered; under weak the
                # reference issues the full barrier for it (ring.fence.acquire-release).
                if self.buffers[index] and (kind == "fence" or sim.model is MemoryModel.WEAK):
                    if self.recording:
                        self._event(None, index, "fence", 0, 0, b"",
                                    f"waits for its {len(self.buffers[index])} buffered "
                                    "store(s)")
                    return
                nodes[index] = node.next  # type: ignore[assignment]
            elif kind == "yield":
                if self.observed[index] and self._unchanged(index):
                    if self.recording:
                        self._event(None, index, "wait", 0, 0, b"",
                                    "until " + self._describe_observed(index) + " changes")
                    return
                self.observed[index] = {}
                nodes[index] = node.next  # type: ignore[assignment]
            elif kind == "receive":
                self._receive(index, node.data)
                nodes[index] = node.next  # type: ignore[assignment]
            elif kind == "notify":
                self._notify(index)
                nodes[index] = node.next  # type: ignore[assignment]
            elif kind == "wait_notify":
                if self.recording:
                    self._event(None, index, "wait", 0, 0, b"",
                                "for a notification, with no recheck of the flags")
                return
            elif kind == "layout":
                self.fail("layout", node.clause,
                          f"{sim.specs[index].name}: {node.note}", sim.specs[index].name)
                return
            elif kind == "raise":
                spec = sim.specs[index]
                self.fail("exception", node.clause, f"{spec.name} raised {node.note}",
                           spec.name)
                return
            else:
                return

    def _wake(self) -> None:
        """Blocked threads whose condition now holds run on to their next point."""
        woke = True
        nodes = self.nodes
        while woke and self.violation is None:
            woke = False
            for index, node in enumerate(nodes):
                kind = node.kind
                if kind == "fence" or kind == "acq_rel":
                    if self.buffers[index]:
                        continue
                elif kind == "yield":
                    if not self.observed[index] or self._unchanged(index):
                        continue
                    if self.recording:
                        self._event(None, index, "wake", 0, 0, b"", "a value it waits on changed")
                    self.observed[index] = {}
                else:
                    continue
                nodes[index] = node.next  # type: ignore[assignment]
                self.settle(index)
                woke = True

    def _receive(self, index: int, payload: bytes) -> None:
        sim = self.sim
        received = self.received[index]
        kind, note = describe_receipt(sim.payloads, len(received), payload)
        self.received[index] = received + (payload,)
        name = sim.specs[index].name
        if self.recording:
            self._event(None, index, "receive", 0, 0, payload, note)
        if kind is not None:
            self.fail(kind, None, f"{name} received {note}", name)

    # --- program order ------------------------------------------------------------------

    def _program_store(self, index: int, node: Node) -> None:
        """Checks on a store in the thread's program order (before it is visible to anyone):
        the chunk each end publishes or releases against the spec's index arithmetic
        (ring.writer.advance-modulo, ring.reader.advance-modulo: both ends start at 0 and
        advance modulo max_chunks), and the framing of a chunk the writer publishes."""
        sim = self.sim
        if not sim.check_layout:
            return
        place = sim.amap.place(node.lo)
        if place.region is Region.DATA:
            last = sim.amap.place(node.hi - 1)
            if last.region is not Region.DATA or last.chunk != place.chunk:
                self._straddles(index, node, place.chunk)
            return
        if node.hi - node.lo != 1 or node.data != b"\x01":
            return
        spec = sim.specs[index]
        if spec.role == WRITER:
            if place.region is not Region.WRITTEN_FLAG:
                return
            clause, what = "ring.writer.advance-modulo", "published"
        else:
            if place.region is not Region.READ_FLAG or place.index != spec.rank:
                return
            clause, what = "ring.reader.advance-modulo", "released"
        if self._view(index, node.lo, node.hi) == node.data:
            return  # already 1 as this thread sees it: not a new publish or release
        count = self.flagged[index]
        self.flagged[index] = count + 1
        due = count % sim.layout.max_chunks
        if place.chunk != due:
            self.fail("index", clause,
                      f"{spec.name} {what} message {count} in chunk {place.chunk}; the spec's "
                      f"arithmetic puts message {count} of a {sim.layout.max_chunks}-chunk ring "
                      f"in chunk {due} (both ends start at 0 and advance modulo max_chunks)",
                      spec.name)
            return
        if spec.role == WRITER and sim.framing is not None and count < len(sim.payloads):
            lo = sim.layout.chunk_offset(place.chunk)
            chunk = self._view(index, lo, lo + sim.layout.max_chunk_bytes)
            problem = framing_problem(chunk, sim.messages[count] if sim.framing == "buffers"
                                      else None)
            if problem is not None:
                clause, message = problem
                self.fail("framing", clause,
                          f"{spec.name} published message {count} in chunk {place.chunk} "
                          f"framed against the spec: {message}", spec.name)

    def _notify(self, index: int) -> None:
        """The writer sends a notification: the chunk it announces must be published (its
        written flag 1 stored, in program order, since the last notification) and visible
        (no written flag store still in the writer's store buffer):
        ring.notify.after-written-flag."""
        sim = self.sim
        name = sim.specs[index].name
        sent = self.notified[index]
        self.notified[index] = sent + 1
        if self.recording:
            self._event(None, index, "notify", 0, 0, b"", "notify socket send")
        if not sim.check_layout:
            return
        pending = [entry for entry in self.buffers[index]
                   if sim.amap.place(entry.lo).region is Region.WRITTEN_FLAG
                   and entry.data == b"\x01"]
        if self.flagged[index] <= sent:
            self.fail("notify-before-written", "ring.notify.after-written-flag",
                      f"{name} sends notification {sent + 1} having published "
                      f"{self.flagged[index]} chunk(s): the written flag of the chunk it "
                      "announces is not set yet", name)
        elif pending:
            self.fail("notify-before-written", "ring.notify.after-written-flag",
                      f"{name} sends a notification while its store of "
                      f"{sim.amap.describe(pending[0].lo, pending[0].lo + 1)} = 1 is still in "
                      "its store buffer (no fence between the written flag and the notify)",
                      name)

    def _straddles(self, index: int, node: Node, chunk: int) -> None:
        """A data store that runs from chunk ``chunk`` past its end: a framing overrun when
        the spec's header at the chunk's start (as this thread sees it) says its buffers run
        past the chunk (ring.framing.within-chunk), else a write at offsets the spec's layout
        does not give this chunk (ring.layout.data-region)."""
        sim = self.sim
        layout = sim.layout
        lo = layout.chunk_offset(chunk)
        view = self._view(index, lo, lo + layout.max_chunk_bytes)
        overrun = False
        try:
            decode_chunk(view)
        except RingError as exc:
            overrun = exc.clause == "ring.framing.within-chunk"
        name = sim.specs[index].name
        where = sim.amap.describe(node.lo, node.hi)
        if overrun or node.lo == lo:
            self.fail("framing", "ring.framing.within-chunk",
                      f"{name} writes past the end of chunk {chunk} ({where}): the framing "
                      "runs past max_chunk_bytes", name)
        else:
            self.fail("layout", "ring.layout.data-region",
                      f"{name} writes {where}, across the spec's chunk boundary at offset "
                      f"{lo + layout.max_chunk_bytes}, with no spec chunk header at chunk "
                      f"{chunk}'s start (offset {lo}) announcing it: its chunks are not where "
                      "the spec's layout puts them", name)

    # --- memory -------------------------------------------------------------------------

    def _view(self, index: int, lo: int, hi: int) -> bytes:
        buffer = self.buffers[index]
        if not buffer:
            return bytes(self.memory[lo:hi])
        view = bytearray(self.memory[lo:hi])
        for entry in buffer:
            start, end = max(lo, entry.lo), min(hi, entry.lo + len(entry.data))
            if start < end:
                view[start - lo:end - lo] = entry.data[start - entry.lo:end - entry.lo]
        return bytes(view)

    def _unchanged(self, index: int) -> bool:
        observed = self.observed[index]
        if self.buffers[index]:
            view = self._view
            return all(view(index, a, a + 1)[0] == v for a, v in observed.items())
        memory = self.memory
        return all(memory[a] == v for a, v in observed.items())

    def _describe_observed(self, index: int) -> str:
        describe = self.sim.amap.describe
        observed = self.observed[index]
        return ", ".join(f"{describe(a, a + 1)} = {observed[a]}" for a in sorted(observed))

    def _drain(self, index: int, seq: int) -> None:
        buffer = self.buffers[index]
        position = next((i for i, entry in enumerate(buffer) if entry.seq == seq), None)
        if position is None:  # pragma: no cover - actions() offers only buffered entries
            raise ExplorerError(f"thread {index} has no buffered store #{seq}")
        entry = buffer[position]
        self.buffers[index] = buffer[:position] + buffer[position + 1:]
        self._make_visible(index, entry.lo, entry.data, pending=buffer[:position], seq=seq)

    def _make_visible(self, index: int, lo: int, data: bytes, *,
                      pending: Sequence[_Entry], seq: int | None) -> None:
        sim = self.sim
        spec = sim.specs[index]
        hi = lo + len(data)
        finding = None
        if sim.check_protocol:
            finding = sim.discipline.check(self.memory, spec.role, spec.rank, lo, data,
                                           pending=[(e.lo, e.data) for e in pending])
        if self.recording:
            before = bytes(self.memory[lo:hi])
            note = sim.discipline.transition(self.memory, lo, data)
            if seq is not None:
                note = f"store #{seq} becomes visible" + (f"; {note}" if note else "")
            elif before == data and not note:
                note = "(value unchanged)"
            self._event(self.step, index, "drain" if seq is not None else "store", lo, hi,
                        data, note)
        self.memory[lo:hi] = data
        if finding is not None:
            kind, clause, message = finding
            self.fail(kind, clause, message, spec.name)

    def fail(self, kind: str, clause: str | None, message: str, actor: str) -> None:
        """Record a violation (the first one of an execution stands)."""
        if self.violation is None:
            self.violation = Violation(kind, clause, message, self.step, actor)

    def _event(self, step: int | None, index: int, kind: str, lo: int, hi: int, value: bytes,
               note: str = "") -> None:
        self.events.append(Event(step, self.sim.specs[index].name, kind, lo, hi, bytes(value),
                                 note))


def framing_problem(chunk: bytes, buffers: Sequence[bytes] | None) -> tuple[str, str] | None:
    """The framing clause a published in-ring chunk breaks, with what it holds, or None.

    With ``buffers`` (the message's), the buffer count and every length prefix are compared
    with the real buffers, bounds-checked, and every buffer's bytes with the message's
    (:func:`~enginewire.conformance.peers.ring_peer.framing_differences`); then, and without
    them, the chunk must decode (``decode_chunk`` of the reference, whose errors name their
    clause). A chunk with the overflow marker is not compared (its buffers go over the XPUB).
    """
    if buffers is not None and chunk[:1] == b"\x00":
        from enginewire.conformance.peers.ring_peer import framing_differences

        found = framing_differences(chunk, list(buffers))
        if found:
            return found[0]
    try:
        decode_chunk(chunk)
    except RingError as exc:
        return (exc.clause, str(exc))
    return None


def _own_bytes(buffer: tuple[_Entry, ...], lo: int, hi: int) -> bytes | None:
    """The bytes ``[lo, hi)`` as the thread's own buffered stores say, None unless they
    cover every byte."""
    covered = bytearray(hi - lo)
    hit = bytearray(hi - lo)
    for entry in buffer:
        start, end = max(lo, entry.lo), min(hi, entry.lo + len(entry.data))
        if start < end:
            covered[start - lo:end - lo] = entry.data[start - entry.lo:end - entry.lo]
            hit[start - lo:end - lo] = b"\x01" * (end - start)
    return bytes(covered) if all(hit) else None


def _weak_drainable(buffer: tuple[_Entry, ...]) -> list[_Entry]:
    """Under ``weak``: every buffered store with no older store to an overlapping address."""
    drainable = []
    for i, entry in enumerate(buffer):
        lo, hi = entry.lo, entry.lo + len(entry.data)
        if all(older.lo >= hi or older.lo + len(older.data) <= lo for older in buffer[:i]):
            drainable.append(entry)
    return drainable


@dataclass
class Outcome:
    """How one execution ended: ``status`` is ``finished``, ``violation`` or ``pruned``."""

    status: str
    violation: Violation | None
    steps: int
    preemptions: int
    keys: list[str]
    events: list[Event] = field(default_factory=list)
    received: dict[str, list[bytes]] = field(default_factory=dict)


def outcome_of(world: World, keys: Sequence[str] | None = None,
               status: str | None = None) -> Outcome:
    """The outcome of the execution that reached ``world`` by ``keys`` (default: the keys
    the world tracked)."""
    sim = world.sim
    received = {spec.name: list(world.received[i]) for i, spec in enumerate(sim.specs)
                if spec.role == READER}
    if status is None:
        status = "violation" if world.violation is not None else "finished"
    if keys is None:
        assert world.keys is not None
        keys = world.keys
    return Outcome(status, world.violation, world.step, world.preemptions, list(keys),
                   list(world.events), received)


def run_forward(sim: Simulator, choose: Callable[[World, list[Action]], Action | None], *,
                recording: bool = False) -> Outcome:
    """One execution from the start, ``choose`` picking every action (None: stop, pruned)."""
    world = sim.start(recording=recording)
    while world.violation is None:
        actions = world.actions()
        if not actions:
            world.finish()
            break
        if world.step >= sim.max_steps:
            world.fail("no-termination", None,
                        f"the execution did not end within {sim.max_steps} actions", "explorer")
            break
        action = choose(world, actions)
        if action is None:
            return outcome_of(world, status="pruned")
        world.perform(action)
    return outcome_of(world)
