"""How the ring's writer and readers wait: spin, then yield, then sleep or poll.

The flag protocol (:mod:`.protocol`) never waits; the loops in :mod:`.queue` call
:meth:`Backoff.pause` between two failed checks. A pure ``sched_yield`` loop, as vLLM's readers
run for a second after every read, wastes the processor the writer needs when processes
outnumber cores; a :class:`Backoff` instead escalates:

0. before any of this, the per-message calls (``MessageQueue.enqueue`` and ``dequeue`` on
   their express path, :mod:`.express`, timeout not 0) give the processor away
   (``sched_yield``) and check the flags again, up to ``express.FIRST_TURNS`` times within the
   yield stage's time: the turns that end most waits where processes outnumber cores, taken
   without building the wait (a turn costs a yield and a check of two flags, as a minimal
   ring's does; the stages below cost 1.7 µs to 2.6 µs to enter);
1. ``spin_checks`` checks back to back (a message usually lands within microseconds;
   :func:`spin`);
2. ``sched_yield`` until ``yield_for_s`` (20 ms) has passed since the wait began
   (:func:`spin_yield`, then :meth:`Backoff.pause`): long enough to outlast the time a busy
   scheduler keeps the other end off the processor (with 1 ms, waits escalated to blocks and
   sleeps in the runs whose rate fell, docs/bench.md), short enough that an idle end stops
   taking a core a fiftieth of the time vLLM's readers take (1 s);
3. readers: wait on the writer's notify socket, at first for ``poll_min_s``, each time twice as
   long, never longer than the recheck interval ``recheck_s`` (clause ring.notify.hint-only).
   A notification wakes the reader at once; a dropped one (PUB drops at SNDHWM 1, most often
   right after a read) costs at most the current interval, because the flags, not the
   notification, say whether a chunk is readable;
   the writer, which gets no notification: sleeps that double from ``sleep_min_s`` to
   ``sleep_max_s``.

While it waits, an end checks every ``liveness_check_s`` that the processes it waits for still
run (clause ring.liveness.peer-dead) and raises
:class:`~enginewire.reference.errors.RingPeerDead` when one does not.

Every wait is bounded by its deadline: :meth:`Backoff.pause` raises
:class:`~enginewire.reference.errors.ProtocolTimeout` (a ``TimeoutError``) once it has passed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from enginewire.spec import load

from ..errors import ProtocolTimeout

#: An idle reader re-reads the flags at least this often, notification or not.
READER_RECHECK_INTERVAL_S: float = (
    load().ring_constant("reader_recheck_interval_ms", int) / 1000)
#: A waiting end checks this often that the processes it waits for still run.
LIVENESS_CHECK_INTERVAL_S = load().ring_constant("liveness_check_ms", int) / 1000
#: What a check returns once it succeeds.
_Found = TypeVar("_Found")


@dataclass(frozen=True)
class WaitPolicy:
    """The escalation of one wait; times in seconds."""

    spin_checks: int = 2
    yield_for_s: float = 20e-3
    sleep_min_s: float = 50e-6
    sleep_max_s: float = 500e-6
    poll_min_s: float = 1e-3
    recheck_s: float = READER_RECHECK_INTERVAL_S
    #: How often a waiting end checks that its peers still run (ring.liveness.peer-dead).
    liveness_check_s: float = LIVENESS_CHECK_INTERVAL_S


DEFAULT_POLICY = WaitPolicy()


def spin(check: Callable[[], _Found | None], policy: WaitPolicy,
         timeout: float | None) -> _Found | None:
    """After one failed ``check``: repeat it back to back up to ``policy.spin_checks`` times
    (the first stage of a wait, without a :class:`Backoff` to build) and return what it found.

    None when every check failed, or at once when ``timeout`` is 0 (which allows one check);
    the caller then waits with ``Backoff(..., checks=policy.spin_checks)`` (whose first pause
    raises at once with a timeout of 0).
    """
    if timeout is not None and timeout <= 0:
        return None
    for _ in range(policy.spin_checks):
        found = check()
        if found is not None:
            return found
    return None


def spin_yield(check: Callable[[], _Found | None], policy: WaitPolicy, timeout: float | None,
               started: float) -> _Found | None:
    """The second stage of a wait, after :func:`spin`: ``sched_yield`` and check again until
    ``policy.yield_for_s`` (or ``timeout``) has passed since ``started``; what the check found,
    or None (the caller then builds a :class:`Backoff` with the same ``started``, which goes
    on with the third stage).

    The loop a minimal ring waits in, one yield, one check and one clock read per turn, with
    no :class:`Backoff` to build: a caught-up reader goes through it on most messages, and
    what it costs is taken from the process it yields to.
    """
    until = started + (policy.yield_for_s if timeout is None
                       else min(policy.yield_for_s, timeout))
    clock = time.monotonic
    give_way = os.sched_yield
    while clock() < until:
        give_way()
        found = check()
        if found is not None:
            return found
    return None


class Backoff:
    """The state of one wait: create it when the first check fails, call :meth:`pause` after
    every failed check.

    ``block(seconds)`` (readers only) waits for a notification for at most ``seconds``
    (and at least one millisecond); it returns False when it returned without blocking (a
    reader announcing its block, clause ring.notify.waiting-state), and the next block then
    waits as long as this one would have. ``checks`` counts failed checks already made back to back
    (see :func:`spin`).
    ``timeout`` None waits forever; 0 allows exactly one check. ``liveness`` (raising when a
    peer died) runs every ``policy.liveness_check_s`` once the wait has lasted that long.
    ``started`` (default: now) is when the wait began, for a wait whose first stages ran
    before (:func:`spin_yield`): the stages and the deadline count from it.
    """

    __slots__ = ("policy", "clause", "what", "timeout", "deadline", "started",
                 "_checks", "_sleep", "_poll", "_block", "_liveness", "_next_liveness")

    def __init__(self, policy: WaitPolicy, timeout: float | None, *, clause: str, what: str,
                 block: Callable[[float], bool | None] | None = None, checks: int = 0,
                 liveness: Callable[[], None] | None = None,
                 started: float | None = None) -> None:
        self.policy = policy
        self.clause = clause
        self.what = what
        self.timeout = timeout
        self.started = time.monotonic() if started is None else started
        self.deadline = math.inf if timeout is None else self.started + timeout
        self._checks = checks
        self._sleep = policy.sleep_min_s
        self._poll = policy.poll_min_s
        self._block = block
        self._liveness = liveness
        self._next_liveness = self.started + policy.liveness_check_s

    def remaining(self) -> float:
        """Seconds left before the deadline (``inf`` without a timeout)."""
        return self.deadline - time.monotonic()

    def expire(self) -> ProtocolTimeout:
        return ProtocolTimeout(self.clause, f"timed out waiting for {self.what}",
                               expected=f"within {self.timeout:.3f} s",
                               got=f"{time.monotonic() - self.started:.3f} s")

    def pause(self) -> None:
        """Wait a little before the next check, or raise ProtocolTimeout at the deadline."""
        policy = self.policy
        self._checks += 1
        now = time.monotonic()
        if now >= self.deadline:
            raise self.expire()
        if self._liveness is not None and now >= self._next_liveness:
            self._next_liveness = now + policy.liveness_check_s
            self._liveness()
        if self._checks <= policy.spin_checks:
            return
        waited = now - self.started
        if waited < policy.yield_for_s:
            os.sched_yield()
            return
        left = self.deadline - now
        if self._block is not None:
            if self._liveness is not None:
                left = min(left, policy.liveness_check_s)
            if self._block(min(self._poll, policy.recheck_s, left)) is not False:
                self._poll *= 2  # False: it did not block (it announced the block first)
            return
        time.sleep(min(self._sleep, left))
        self._sleep = min(self._sleep * 2, policy.sleep_max_s)
