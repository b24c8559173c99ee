"""What one side of a session said, reduced to facts a replay can compare (sans-IO).

A replay cannot expect a target to repeat a recording frame for frame: an engine batches
outputs by timing, stamps them with its clock, a front end stamps arrival times. So each
decoded message (an :class:`~.annotate.Annotation`) becomes facts, each under a key, and two
runs are compared fact by fact:

engine side
    ``("hello"|"ready", rank)``: the HELLO/READY map; ``("ready_response", rank)``: the ready
    response; ``("request", request_id)``: ``{"tokens": [...], "finish_reason", "stop_reason"}``
    accumulated over every output for it; ``("utility", call_id)``: the utility output (result
    or failure); ``("dead",)``: ENGINE_CORE_DEAD.
front-end side
    ``("init", rank)``: the init message without its addresses (the one thing a tap or a
    replay rewrites); ``("add", request_id)``: the request without ``arrival_time``;
    ``("abort", n)``: the n-th abort's ids; ``("call", n)``: the n-th utility call's
    ``[client_index, method, args]`` (by order: a front end picks its call ids at random, so
    :attr:`Facts.call_ids` keeps them in order for a replay to answer each call by its own id).

:meth:`Facts.uncovered` says which recorded fact a run has not reached yet (a replay waits for
it before sending the next message); :func:`first_divergence` compares two runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from enginewire.conformance.oracle.values import differences, neutral
from enginewire.reference.session import get_field

from .annotate import Annotation

Key = tuple[Any, ...]


@dataclass
class Facts:
    """Facts by key, in the order first seen, with the index of the message that first
    showed each."""

    values: dict[Key, Any] = field(default_factory=dict)
    first_seen: dict[Key, int] = field(default_factory=dict)
    _aborts: int = 0
    #: The call_id of each utility call, in order.
    call_ids: list[int] = field(default_factory=list)

    def _put(self, key: Key, value: Any, index: int) -> None:
        self.first_seen.setdefault(key, index)
        self.values[key] = value

    def add(self, annotation: Annotation, index: int) -> None:
        """The facts of one decoded message (undecodable messages add none)."""
        kind, value, rank = annotation.kind, annotation.value, annotation.rank
        if kind is None:
            return
        if kind in ("hello", "ready"):
            self._put((kind, rank), neutral(value), index)
        elif kind == "ready_response":
            self._put(("ready_response", rank), neutral(value), index)
        elif kind in ("outputs", "utility_reply"):
            for output in get_field(value, "outputs") or ():
                key = ("request", get_field(output, "request_id"))
                fact = self.values.get(key) or {"tokens": [], "finish_reason": None,
                                                 "stop_reason": None}
                fact = {**fact, "tokens": fact["tokens"] + list(
                    get_field(output, "new_token_ids") or ())}
                if get_field(output, "finish_reason") is not None:
                    fact["finish_reason"] = neutral(get_field(output, "finish_reason"))
                    fact["stop_reason"] = neutral(get_field(output, "stop_reason"))
                self._put(key, fact, index)
            utility = get_field(value, "utility_output")
            if utility is not None:
                fact = neutral(utility)
                if isinstance(fact, dict):
                    fact.pop("call_id", None)
                self._put(("utility", get_field(utility, "call_id")), fact, index)
        elif kind == "engine_core_dead":
            self._put(("dead",), True, index)
        elif kind == "init":
            fact = neutral(value)
            if isinstance(fact, dict):
                fact.pop("addresses", None)
            self._put(("init", rank), fact, index)
        elif kind == "add":
            fact = neutral(value)
            if isinstance(fact, dict):
                fact.pop("arrival_time", None)
            self._put(("add", get_field(value, "request_id")), fact, index)
        elif kind == "abort":
            self._put(("abort", self._aborts), list(value), index)
            self._aborts += 1
        elif kind == "utility":
            self._put(("call", len(self.call_ids)),
                      neutral([value[0], value[2], list(value[3])]), index)
            self.call_ids.append(value[1])

    def uncovered(self, expected: Facts) -> Key | None:
        """The first fact of ``expected`` this run has not reached (a request with fewer
        tokens, or not finished where ``expected`` finished it, counts as not reached)."""
        for key, want in expected.values.items():
            have = self.values.get(key)
            if have is None:
                return key
            if key[0] == "request" and (
                len(have["tokens"]) < len(want["tokens"])
                or (want["finish_reason"] is not None and have["finish_reason"] is None)
            ):
                return key
        return None

    def final(self, key: Key) -> bool:
        """Whether ``key``'s fact can no longer grow (a finished request; any other fact)."""
        if key not in self.values:
            return False
        return key[0] != "request" or self.values[key]["finish_reason"] is not None


@dataclass(frozen=True)
class Divergence:
    """The first fact on which a target's run differs from the recording."""

    key: Key
    recorded: Any
    got: Any
    #: Index (in the recording) of the message that first showed the recorded fact; None for
    #: a fact only the target has.
    record_index: int | None

    def describe(self) -> str:
        where = (f"recorded message #{self.record_index}" if self.record_index is not None
                 else "not in the recording")
        text = f"first divergence at {self.key!r} ({where}):"
        if isinstance(self.recorded, dict) and isinstance(self.got, dict):
            for line in differences(self.recorded, self.got):
                text += f"\n  {line}"
        return text + f"\n  recorded: {self.recorded!r}\n  target:   {self.got!r}"


_MISSING = "<never sent>"


def first_divergence(recorded: Facts, got: Facts) -> Divergence | None:
    """The first recorded fact (in recording order) the run lacks or differs on, else the
    first fact only the run has; None when they agree."""
    for key, want in recorded.values.items():
        have = got.values.get(key, _MISSING)
        if have != want:
            return Divergence(key, want, have, recorded.first_seen[key])
    for key, have in got.values.items():
        if key not in recorded.values:
            return Divergence(key, _MISSING, have, None)
    return None
