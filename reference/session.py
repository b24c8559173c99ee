"""Sans-IO session state machines for the front end and the engine core.

Both machines are built from the ``machines`` table of the handshake surface
(``spec/data/handshake.toml``): the states, the transitions, the action each transition asks
for and the clause an illegal event breaks all come from the spec, never from this file. What
this file adds is the bookkeeping the table cannot express (which engines are managed, which
utility calls are pending, which requests are in flight) and the checks of message content
(HELLO/READY keys against the spec's ``messages`` table, request type bytes against the
request_types surface).

No sockets, no codec, no frames: engines are named by rank, messages are decoded values. The
connections of :mod:`enginewire.reference.connection` own the codec (frames, routing
identities, payloads), feed the decoded values in here, and turn the :class:`Action` objects
that come back into events. Every violation raises a
:class:`~enginewire.reference.errors.ProtocolError` subclass naming the clause it breaks:

- :class:`HandshakeError` for an illegal event during start-up (a state before the machine's
  first serving state) or of a start-up event;
- :class:`StateError` for an illegal event afterwards;
- :class:`EngineDeadError` for anything after ENGINE_CORE_DEAD;
- :class:`FramingError` for a request type byte outside the table.

A session never changes state when it raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from enginewire.spec import load
from enginewire.spec.history.release_facts import (
    STATE_KEYS,
    engine_handshake_map,
    handshake_message_at,
    init_addresses,
    init_message_at,
    utility_fields,
    utility_payload_type,
)
from enginewire.spec.loader import Spec
from enginewire.spec.schema import HandshakeMessage, StateMachine, Transition
from enginewire.spec.types import parse_type, scalar_type

from .errors import EngineDeadError, FramingError, HandshakeError, PayloadError, StateError

#: call_ids the engine uses for notifications that answer no call (vLLM's
#: EEP_NOTIFICATION_CALL_ID and FT_STATUS_CALL_ID).
RESERVED_CALL_IDS = frozenset({-1, -2})

#: The actions each role's table may name; a table naming another one is rejected when the
#: machine is built, so a spec change cannot silently add an action nobody carries out.
FRONTEND_ACTIONS = frozenset({
    "send_init", "await_ready_response", "engine_ready", "track_request", "untrack_requests",
    "register_call", "deliver_outputs", "resolve_call", "fail_pending",
})
ENGINE_ACTIONS = frozenset({
    "send_hello", "connect_channels", "send_ready_response", "send_ready", "accept_request",
    "abort_requests", "accept_call", "send_outputs", "send_utility_reply", "send_dead", "none",
})

def _simple_types(expression: str) -> tuple[type, ...] | None:
    """The Python types a scalar-typed handshake key accepts (a float key takes an int too);
    None for any other type (not checked here)."""
    found = scalar_type(parse_type(expression))
    if found is None:
        return None
    return (int, float) if found is float else (found,)


class Action(NamedTuple):
    """What a session asks its transport (or its user) to do.

    ``name`` is the ``action`` of the transition that produced it (see the handshake
    surface's ``machines`` table); ``rank`` the engine it concerns; ``data`` the value the
    action needs (documented at each method that returns actions). Immutable (a named tuple:
    several are made per request, and a frozen dataclass costs twice as much to build).
    """

    name: str
    rank: int | None = None
    data: Any = None


def machine_table(role: str, spec: Spec | None = None) -> StateMachine:
    """The ``machines`` entry of the handshake surface for ``role`` ("frontend" or "engine")."""
    spec = spec or load()
    for table in spec.surface("handshake").machines:
        if table.role == role:
            return table
    raise KeyError(f"the handshake surface has no state machine for role {role!r}")


def get_field(value: Any, name: str, default: Any = None) -> Any:
    """A field of a decoded value, whether it is a struct (attribute) or a map (key)."""
    if isinstance(value, msgspec.Struct):  # the common case, without the ABC check below
        return getattr(value, name, default)
    if isinstance(value, Mapping):
        return value.get(name, default)
    return getattr(value, name, default)


class Machine:
    """One running instance of a spec state machine.

    ``fire(event)`` moves along the transition for ``(state, event)`` and returns it; an
    event without a transition raises the table's ``illegal_event_clause`` and leaves the
    state as it was. States with no self-loop and at least one way out are *start-up states*
    (the handshake); events never seen on a self-loop or into a terminal state are *start-up
    events*. Illegal events in a start-up state, and illegal start-up events, raise
    :class:`HandshakeError`; the others :class:`StateError`.
    """

    def __init__(self, table: StateMachine, *, subject: str, actions: frozenset[str]) -> None:
        unknown = {t.action or "none" for t in table.transitions} - actions - {"none"}
        if unknown:
            raise ValueError(
                f"the {table.role} machine names actions this session does not carry out: "
                f"{sorted(unknown)}"
            )
        self.table = table
        self.role = table.role
        self.subject = subject
        self.state = table.initial
        self._transitions: dict[tuple[str, str], Transition] = {
            (t.source, t.event): t for t in table.transitions
        }
        self_loops = {t.source for t in table.transitions if t.source == t.target}
        has_exit = {t.source for t in table.transitions}
        self.terminal_states = frozenset(s.name for s in table.states if s.name not in has_exit)
        self.startup_states = frozenset(
            s.name for s in table.states if s.name in has_exit and s.name not in self_loops
        )
        later_events = {
            t.event for t in table.transitions
            if t.source == t.target or t.target in self.terminal_states
        }
        self.startup_events = frozenset(
            t.event for t in table.transitions if t.event not in later_events
        )

    @property
    def events(self) -> list[str]:
        """The events legal in the current state, sorted."""
        return sorted(event for (state, event) in self._transitions if state == self.state)

    def can(self, event: str) -> bool:
        return (self.state, event) in self._transitions

    def quiet_states(self, event: str, action: str) -> frozenset[str]:
        """The states where ``event`` is a self-loop with ``action``: firing it there changes
        nothing but what the action does (the peers' express paths take their message only
        in these)."""
        return frozenset(t.source for t in self.table.transitions
                         if t.event == event and t.target == t.source
                         and (t.action or "none") == action)

    def error_class(self, event: str) -> type[StateError]:
        if self.state in self.startup_states or event in self.startup_events:
            return HandshakeError
        return StateError

    def fire(self, event: str, *, what: str | None = None) -> Transition:
        """Take the transition for ``event`` or raise; ``what`` names the event in the message."""
        transition = self._transitions.get((self.state, event))
        if transition is None:
            raise self.error_class(event)(
                self.table.illegal_event_clause,
                f"Unexpected {what or event} {self.subject} in {self.state} state",
                expected=self.events,
                got=event,
            )
        self.state = transition.target
        return transition


def _action(transition: Transition, rank: int | None, data: Any = None) -> list[Action]:
    name = transition.action or "none"
    return [] if name == "none" else [Action(name, rank, data)]


def _common_required_keys(messages: Sequence[HandshakeMessage]) -> HandshakeMessage:
    """A message spec with the required keys every one of ``messages`` has (values unset)."""
    names = set.intersection(*({k.name for k in m.keys if k.required} for m in messages))
    keys = [
        msgspec.structs.replace(k, value=None) for k in messages[0].keys if k.name in names
    ]
    return HandshakeMessage(
        name="handshake", channel="handshake", sender="engine",
        description="the keys every engine handshake message carries", keys=keys,
    )


def _release_messages(spec: Spec) -> dict[str, HandshakeMessage]:
    """``{"HELLO": ..., "READY": ...}``: the engine's handshake messages in ``spec``'s
    release ({} for a release without the HELLO/READY handshake)."""
    out: dict[str, HandshakeMessage] = {}
    for status in ("HELLO", "READY"):
        message = handshake_message_at(spec, status)
        if message is not None:
            out[status] = message
    return out


def _no_handshake(spec: Spec, what: str) -> HandshakeError:
    return HandshakeError(
        "handshake.message-keys", f"vLLM {spec.version} has no HELLO/READY handshake: no {what}",
        expected="a release with the handshake", got=spec.version,
    )


def _check_keys(message_spec: HandshakeMessage, message: Any, clause: str) -> None:
    """Check a handshake map against the keys the spec lists for it."""
    if not isinstance(message, Mapping):
        raise HandshakeError(
            clause, f"a {message_spec.name} message is a msgpack map",
            expected="map", got=type(message).__name__,
        )
    for key in message_spec.keys:
        if key.name not in message:
            if key.required:
                raise HandshakeError(
                    clause, f"{message_spec.name} lacks the key {key.name!r}",
                    expected=[k.name for k in message_spec.keys if k.required],
                    got=sorted(map(str, message)),
                )
            continue
        value = message[key.name]
        allowed = _simple_types(key.type)
        wrong_type = allowed is not None and (
            not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)
        )
        if wrong_type:
            raise HandshakeError(
                clause, f"{message_spec.name} key {key.name!r} has the wrong type",
                expected=key.type, got=type(value).__name__,
            )
        if key.value is not None and value != key.value:
            raise HandshakeError(
                clause, f"{message_spec.name} key {key.name!r} has the wrong value",
                expected=key.value, got=value,
            )


# --- front end -----------------------------------------------------------------------------


def untrack_finished(
    tracked: set[str], outputs: Any, read: Callable[[Any, str, Any], Any] = getattr
) -> None:
    """Drop from ``tracked`` the requests an EngineCoreOutputs finishes: those with a
    finish_reason, and those its finished_requests lists. ``read`` reads a field of
    ``outputs`` (getattr for the codec's structs, :func:`get_field` for maps)."""
    listed = read(outputs, "finished_requests", None)
    if listed:
        tracked.difference_update(listed)
    items = read(outputs, "outputs", None) or ()
    try:  # the codec's structs (every decoded step): one pass, attributes only
        finished = [output.request_id for output in items if output.finish_reason is not None]
    except AttributeError:  # maps, or a struct of a release without the fields
        finished = [get_field(output, "request_id") for output in items
                    if get_field(output, "finish_reason") is not None]
    tracked.difference_update(finished)


@dataclass
class EngineLink:
    """What a front end knows about one engine it manages."""

    rank: int
    local: bool
    machine: Machine
    #: Request ids sent to this engine and not finished or aborted.
    requests: set[str] = field(default_factory=set)
    #: The decoded ready response (None for an empty one or before it came).
    ready_response: Any = None

    @property
    def state(self) -> str:
        return self.machine.state


class FrontendSession:
    """The front end's side of the session with a set of engines (one machine per engine).

    ``ranks``: the engine ranks it manages. ``local``: whether each engine must report
    ``local`` true (a bool for all, or a map rank -> bool). ``remote_headless``: what a remote
    engine's ``headless`` must be (true unless the front end does hybrid or external load
    balancing). ``handshake``: False when another process ran the handshake (vLLM's
    ``client_addresses``): the engines then start in READY, waiting for their ready
    responses. ``config_hash``: with coordinated DP, the hash READY must carry.
    """

    def __init__(
        self,
        ranks: Iterable[int] = (0,),
        *,
        local: bool | Mapping[int, bool] = True,
        remote_headless: bool = True,
        handshake: bool = True,
        config_hash: str | None = None,
        spec: Spec | None = None,
    ) -> None:
        self.spec = spec or load()
        self.table = machine_table("frontend", self.spec)
        self.remote_headless = remote_headless
        self.config_hash = config_hash
        self.dead = False
        #: call_id -> rank of every utility call sent and not yet answered.
        self.pending_calls: dict[int, int] = {}
        self._next_call_id = 1
        self.engines: dict[int, EngineLink] = {}
        # status value -> the message spec of the release that carries it (HELLO, READY).
        self._engine_messages = _release_messages(self.spec)
        self._common_keys = _common_required_keys(list(self._engine_messages.values())) \
            if self._engine_messages else HandshakeMessage(
                name="handshake", channel="handshake", sender="engine",
                description="no handshake in this release")
        self._common_keys_names = {k.name for k in self._common_keys.keys}
        for rank in ranks:
            is_local = local if isinstance(local, bool) else bool(local[rank])
            where = "local" if is_local else "remote"
            link = EngineLink(
                rank=rank,
                local=is_local,
                machine=Machine(
                    self.table, subject=f"for {where} engine {rank}", actions=FRONTEND_ACTIONS
                ),
            )
            self.engines[rank] = link
        if not self.engines:
            raise ValueError("a front end session needs at least one engine rank")
        if not handshake:
            for link in self.engines.values():
                link.machine.fire("external_handshake")

    # --- queries ---------------------------------------------------------------------------

    def link(self, rank: int) -> EngineLink:
        try:
            return self.engines[rank]
        except KeyError:
            raise StateError(
                self.table.illegal_event_clause,
                f"engine {rank} is not managed by this front end",
                expected=sorted(self.engines), got=rank,
            ) from None

    def states(self) -> dict[int, str]:
        return {rank: link.state for rank, link in self.engines.items()}

    def awaiting_handshake(self) -> list[int]:
        """Ranks still in the handshake proper (NEW or CONNECTED)."""
        return [r for r, link in self.engines.items() if link.machine.can("hello")
                or link.machine.can("ready")]

    def awaiting_ready_response(self) -> list[int]:
        return [r for r, link in self.engines.items() if link.machine.can("ready_response")]

    @property
    def running(self) -> bool:
        """True once every engine may receive requests (its ready response came)."""
        return not self.dead and all(
            link.machine.can("send_add") for link in self.engines.values()
        )

    def rank_of_request(self, request_id: str) -> int | None:
        for rank, link in self.engines.items():
            if request_id in link.requests:
                return rank
        return None

    # --- handshake channel -----------------------------------------------------------------

    def _link_for_rank(self, rank: int, clause: str) -> EngineLink:
        link = self.engines.get(rank)
        if link is None:
            raise HandshakeError(
                clause,
                "message from an engine (routing identity) this front end does not manage",
                expected=sorted(self.engines), got=rank,
            )
        return link

    def receive_handshake(self, rank: int, message: Any) -> list[Action]:
        """A decoded HELLO or READY map from engine ``rank`` (its routing identity, decoded)
        on the handshake ROUTER.

        Checks in vLLM's order: the rank, the common keys, ``local``, ``headless`` (in the
        releases that have it, 0.10.0 on), then the status against the engine's state. The
        keys are the release's (:func:`~enginewire.spec.history.release_facts.
        handshake_message_at`). Returns ``[Action("send_init", rank,
        message)]`` for a HELLO (send the init message to that engine) and
        ``[Action("await_ready_response", rank, message)]`` for a READY.
        """
        self._check_alive()
        link = self._link_for_rank(rank, "identity.known-rank")
        _check_keys(self._common_keys, message, "handshake.message-keys")
        status = message["status"]
        where = "local" if link.local else "remote"
        if message["local"] != link.local:
            raise HandshakeError(
                "handshake.local-must-match",
                f"{status} message from {'local' if message['local'] else 'remote'} engine "
                f"{link.rank}, expected it to be {where}",
                expected=link.local, got=message["local"],
            )
        if (not link.local and "headless" in self._common_keys_names
                and message["headless"] != self.remote_headless):
            raise HandshakeError(
                "handshake.headless-rule",
                f"remote engine {link.rank} must {'' if self.remote_headless else 'not '}use "
                "--headless with this front end's load balancing",
                expected=self.remote_headless, got=message["headless"],
            )
        message_spec = self._engine_messages.get(status)
        if message_spec is None:
            raise HandshakeError(
                self.table.illegal_event_clause,
                f"Unexpected {status} message for {where} engine {link.rank} in "
                f"{link.state} state",
                expected=sorted(self._engine_messages), got=status,
            )
        _check_keys(message_spec, message, "handshake.message-keys")
        event = message_spec.name.lower()
        if event == "ready" and self.config_hash is not None and link.machine.can("ready"):
            got_hash = message.get("parallel_config_hash")
            if got_hash != self.config_hash:
                raise HandshakeError(
                    "handshake.config-hash-match",
                    f"configuration mismatch for engine {link.rank}",
                    expected=self.config_hash, got=got_hash,
                )
        transition = link.machine.fire(event, what=f"{status} message")
        return _action(transition, link.rank, message)

    # --- input channel ---------------------------------------------------------------------

    def receive_ready_response(self, rank: int, response: Any) -> list[Action]:
        """The decoded ready response from engine ``rank`` (None for an empty payload).

        Returns ``[Action("engine_ready", rank, response)]``; the engine may now be sent
        requests.
        """
        self._check_alive()
        link = self._link_for_rank(rank, "handshake.ready-response-per-identity")
        if link.machine.can("send_add"):
            raise HandshakeError(
                "handshake.ready-response-per-identity",
                f"a second ready response from engine {link.rank}",
                expected="one ready response per engine", got="another",
            )
        transition = link.machine.fire("ready_response", what="ready response")
        link.ready_response = response
        return _action(transition, link.rank, response)

    def _send(self, rank: int, event: str, what: str) -> EngineLink:
        if self.dead:
            self._check_alive()
        link = self.engines.get(rank) or self.link(rank)
        if not link.machine.can(event) and link.state in link.machine.startup_states:
            raise HandshakeError(
                "frames.ready-response-first",
                f"{what} for engine {rank} before its ready response arrived",
                expected="RUNNING", got=link.state,
            )
        link.machine.fire(event, what=what)
        return link

    def send_add(self, rank: int, request_id: str) -> None:
        """Record an ADD about to go to engine ``rank``."""
        link = self._send(rank, "send_add", "ADD")
        link.requests.add(request_id)

    def send_abort(self, rank: int, request_ids: Sequence[str]) -> None:
        """Record an ABORT about to go to engine ``rank``; the ids stop being tracked."""
        link = self._send(rank, "send_abort", "ABORT")
        link.requests.difference_update(request_ids)

    def free_call_id(self) -> int:
        """A call_id no pending call uses (the next one in turn); records nothing."""
        while self._next_call_id in self.pending_calls:
            self._next_call_id += 1
        call_id = self._next_call_id
        self._next_call_id += 1
        return call_id

    def send_utility(self, rank: int, call_id: int | None = None) -> int:
        """Record a UTILITY call about to go to engine ``rank``; returns its call_id.

        Without ``call_id`` the session picks the next free one. A given call_id must be
        non-negative (negative ones are reserved) and not pending.
        """
        if call_id is None:
            call_id = self.free_call_id()
        elif call_id in self.pending_calls or call_id < 0:
            raise StateError(
                "frames.utility-call-id",
                "a utility call_id that is pending or reserved",
                expected="a fresh non-negative call_id", got=call_id,
            )
        self._send(rank, "send_utility", "UTILITY")
        self.pending_calls[call_id] = rank
        return call_id

    # --- output channel --------------------------------------------------------------------

    def receive_outputs(self, outputs: Any) -> list[Action]:
        """A decoded EngineCoreOutputs from the output PULL.

        Returns ``[Action("resolve_call", rank, utility_output)]`` for a utility reply (the
        message's other fields are ignored, as vLLM does) and
        ``[Action("deliver_outputs", rank, outputs)]`` otherwise. Finished requests (a
        finish_reason, or listed in finished_requests) stop being tracked. Outputs for request
        ids no longer tracked are legal (handshake.session.outputs-for-unknown-requests-ignored).
        """
        if self.dead:
            self._check_alive()
        # The codec's struct (the common case) is read by attribute, a map through get_field.
        field = getattr if isinstance(outputs, msgspec.Struct) else get_field
        index = field(outputs, "engine_index", 0)
        link = self.engines.get(index)
        if link is None:
            raise StateError(
                self.table.illegal_event_clause,
                f"outputs from engine index {index}, which this front end does not manage",
                expected=sorted(self.engines), got=index,
            )
        utility = field(outputs, "utility_output", None)
        if utility is not None:
            call_id = get_field(utility, "call_id")
            if call_id not in RESERVED_CALL_IDS and call_id not in self.pending_calls:
                raise StateError(
                    "handshake.session.reply-known-call-id",
                    f"utility reply from engine {index} for a call that is not pending",
                    expected=sorted(self.pending_calls), got=call_id,
                )
            transition = link.machine.fire("utility_reply", what="utility reply")
            self.pending_calls.pop(call_id, None)
            return _action(transition, link.rank, utility)
        transition = link.machine.fire("outputs", what="outputs")
        if link.requests:  # (none to untrack when none is in flight)
            untrack_finished(link.requests, outputs, field)
        return _action(transition, link.rank, outputs)

    def receive_engine_dead(self) -> list[Action]:
        """ENGINE_CORE_DEAD arrived on the output channel.

        The sentinel names no engine, so every engine that can be dead is marked DEAD and the
        session accepts nothing more. Returns one ``Action("fail_pending", rank, call_ids)``
        per engine: the utility calls to fail with an engine-dead error.
        """
        self._check_alive()
        live = [link for link in self.engines.values() if link.machine.can("engine_core_dead")]
        if not live:
            first = next(iter(self.engines.values()))
            first.machine.fire("engine_core_dead", what="ENGINE_CORE_DEAD")
        actions: list[Action] = []
        for link in live:
            transition = link.machine.fire("engine_core_dead")
            calls = sorted(c for c, r in self.pending_calls.items() if r == link.rank)
            actions += [Action(transition.action or "none", link.rank, calls)]
            link.requests.clear()
        self.dead = True
        self.pending_calls.clear()
        return actions

    def _check_alive(self) -> None:
        if self.dead:
            raise EngineDeadError(
                "handshake.session.dead-is-final",
                "the engine sent ENGINE_CORE_DEAD: nothing more is sent or accepted",
            )


# --- engine --------------------------------------------------------------------------------


class EngineSession:
    """An engine core's side of the session with its front end(s).

    ``handshake``: False when the addresses come from elsewhere (vLLM's client_addresses or
    Ray set-ups): call :meth:`use_addresses` instead of :meth:`start`/:meth:`receive_init`,
    and :meth:`begin_serving` instead of :meth:`send_ready`.
    """

    def __init__(
        self,
        rank: int = 0,
        *,
        local: bool = True,
        headless: bool = False,
        handshake: bool = True,
        spec: Spec | None = None,
        input_address: str | None = None,
    ) -> None:
        self.spec = spec or load()
        self.rank = rank
        #: The address of the input socket the handshake runs on, where the release holds it
        #: there and its init map names only the output (0.9.0).
        self.input_address = input_address
        self._init_map = init_message_at(self.spec.version).get("form") == "map"
        self.local = local
        self.headless = headless
        self.handshake = handshake
        self.machine = Machine(
            machine_table("engine", self.spec), subject=f"at engine {rank}",
            actions=ENGINE_ACTIONS,
        )
        messages = _release_messages(self.spec)
        self._hello_spec = messages.get("HELLO")
        self._ready_spec = messages.get("READY")
        self._request_events = {
            t.byte: (t.name, t.message, t.on_wire)
            for t in self.spec.surface("request_types").types
        }
        self.addresses: Any = None
        #: Request ids accepted and not yet finished or aborted.
        self.requests: set[str] = set()
        #: (client_index, call_id) of every utility call accepted and not yet answered.
        self.pending_calls: set[tuple[int, int]] = set()

    @property
    def state(self) -> str:
        return self.machine.state

    @property
    def ready_message(self) -> HandshakeMessage | None:
        """The release's READY (None: a release without the handshake)."""
        return self._ready_spec

    def _require_mode(self, handshake: bool, what: str) -> None:
        if self.handshake != handshake:
            raise HandshakeError(
                self.machine.table.illegal_event_clause,
                f"{what} does not belong to an engine "
                f"{'with' if self.handshake else 'without'} a handshake channel",
                expected="handshake" if self.handshake else "external addresses",
                got=what,
            )

    # --- start-up --------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """Returns ``[Action("send_hello", rank, hello_map)]``."""
        self._require_mode(True, "HELLO")
        if self._hello_spec is None:
            raise _no_handshake(self.spec, "HELLO")
        transition = self.machine.fire("send_hello", what="HELLO")
        hello = engine_handshake_map(self._hello_spec, local=self.local, headless=self.headless)
        return _action(transition, self.rank, hello)

    def _check_addresses(self, addresses: Any) -> None:
        inputs, outputs = get_field(addresses, "inputs"), get_field(addresses, "outputs")
        ok = (
            isinstance(inputs, list) and isinstance(outputs, list)
            and len(inputs) == len(outputs) and len(inputs) > 0
            and all(isinstance(a, str) for a in [*inputs, *outputs])
        )
        if not ok:
            raise HandshakeError(
                "handshake.init-addresses",
                "addresses need one input and one output address per front-end client",
                expected="inputs and outputs: equal-length, non-empty lists of str",
                got={"inputs": inputs, "outputs": outputs},
            )

    def receive_init(self, metadata: Any) -> list[Action]:
        """The decoded init message (EngineHandshakeMetadata).

        Returns ``[Action("connect_channels", rank, addresses)]``: connect one input DEALER
        per ``addresses.inputs`` and one output PUSH per ``addresses.outputs``.
        """
        self._require_mode(True, "init")
        if not self.machine.can("init"):
            self.machine.fire("init", what="init message")
        addresses = init_addresses(metadata, self.input_address) if self._init_map \
            else get_field(metadata, "addresses")
        self._check_addresses(addresses)
        parallel_config = get_field(metadata, "parallel_config")
        if not isinstance(parallel_config, Mapping):
            raise HandshakeError(
                "handshake.init-parallel-config", "parallel_config is a map",
                expected="map", got=type(parallel_config).__name__,
            )
        transition = self.machine.fire("init", what="init message")
        self.addresses = addresses
        return _action(transition, self.rank, addresses)

    def use_addresses(self, addresses: Any) -> list[Action]:
        """Addresses handed over by another process; same action as :meth:`receive_init`."""
        self._require_mode(False, "external addresses")
        if not self.machine.can("external_addresses"):
            self.machine.fire("external_addresses", what="external addresses")
        self._check_addresses(addresses)
        transition = self.machine.fire("external_addresses")
        self.addresses = addresses
        return _action(transition, self.rank, addresses)

    def send_ready_response(self) -> list[Action]:
        """Returns ``[Action("send_ready_response", rank, n)]``: send one ready-response
        frame on each of the ``n`` input DEALERs, before anything else on them."""
        transition = self.machine.fire("send_ready_response", what="ready response")
        return _action(transition, self.rank, len(get_field(self.addresses, "inputs")))

    def send_ready(self, extra: Mapping[str, Any] | None = None) -> list[Action]:
        """Returns ``[Action("send_ready", rank, ready_map)]``; ``extra`` holds the READY keys
        beyond status, local and headless: the optional ones (parallel_config_hash,
        coord_store_port, ...) and those the release requires (num_gpu_blocks and
        dp_stats_address before 0.20.0), checked against the release's READY."""
        self._require_mode(True, "READY")
        if self._ready_spec is None:
            raise _no_handshake(self.spec, "READY")
        known = {k.name for k in self._ready_spec.keys if k.name not in STATE_KEYS}
        for key in extra or {}:
            if key not in known:
                raise HandshakeError(
                    "handshake.ready-optional-keys", f"READY has no optional key {key!r}",
                    expected=sorted(known), got=key,
                )
        try:
            ready = engine_handshake_map(self._ready_spec, local=self.local,
                                         headless=self.headless, values=extra)
        except KeyError:
            required = [k.name for k in self._ready_spec.keys if k.required]
            raise HandshakeError(
                "handshake.message-keys",
                f"READY of vLLM {self.spec.version} requires the keys "
                f"{[k for k in required if k not in STATE_KEYS]}",
                expected=sorted(required), got=sorted(extra or {}),
            ) from None
        _check_keys(self._ready_spec, ready, "handshake.ready-optional-keys")
        transition = self.machine.fire("send_ready", what="READY")
        return _action(transition, self.rank, ready)

    def begin_serving(self) -> list[Action]:
        """Without a handshake channel: start serving right after the ready responses."""
        self._require_mode(False, "begin serving")
        return _action(self.machine.fire("begin_serving"), self.rank)

    # --- input channel ---------------------------------------------------------------------

    def request_event(self, type_frame: bytes | int) -> tuple[str, str]:
        """The (type name, message kind) a request type frame names, or a FramingError."""
        if isinstance(type_frame, int):
            byte = type_frame
        else:
            frame = bytes(type_frame)
            if len(frame) != 1:
                raise FramingError(
                    "request_types.one-byte-frame", "the request type frame is one byte",
                    expected=1, got=len(frame),
                )
            byte = frame[0]
        found = self._request_events.get(byte)
        if found is None:
            raise FramingError(
                "request_types.unknown-byte-rejected", "unknown request type byte",
                expected=sorted(b for b, (_, _, wire) in self._request_events.items() if wire),
                got=byte,
            )
        name, message, on_wire = found
        if not on_wire or message is None:
            raise FramingError(
                "request_types.sentinels-never-on-wire",
                f"request type {name} is an internal sentinel, never sent on the wire",
                got=byte,
            )
        return name, message

    def receive_request(self, type_frame: bytes | int | str, payload: Any) -> list[Action]:
        """A request from the input channel: its type frame (or the message kind
        :meth:`request_event` already read from it) and decoded payload.

        Returns ``[Action("accept_request", rank, request)]`` for ADD,
        ``[Action("abort_requests", rank, ids_in_flight)]`` for ABORT (only the ids that were
        in flight), ``[Action("accept_call", rank, (client_index, call_id, method, args))]``
        for UTILITY and nothing for START_DP_WAVE.
        """
        if isinstance(type_frame, str):
            event = type_frame
        else:
            _, event = self.request_event(type_frame)
        if not self.machine.can(event):
            self.machine.fire(event, what=f"{event.upper()} request")
        if event == "add":
            request_id = get_field(payload, "request_id")
            if type(request_id) is not str and not isinstance(request_id, str):
                raise PayloadError(
                    "structs.array.missing-required-rejected", "an ADD without a request_id",
                    expected="str", got=type(request_id).__name__,
                )
            transition = self.machine.fire(event)
            self.requests.add(request_id)
            return _action(transition, self.rank, payload)
        if event == "abort":
            if not isinstance(payload, Sequence) or isinstance(payload, str | bytes) or not all(
                isinstance(i, str) for i in payload
            ):
                raise PayloadError(
                    "frames.abort-payload", "the ABORT payload is a list of request ids",
                    expected="list[str]", got=payload,
                )
            ids = [i for i in payload if i in self.requests]
            transition = self.machine.fire(event)
            self.requests.difference_update(ids)
            return _action(transition, self.rank, ids)
        if event == "utility":
            # The release's items (no client_index up to 0.9.0: history [[utility_payload]]).
            fields = utility_fields(self.spec.version, payload)
            shape_ok = fields is not None and (
                all(isinstance(fields[k], int) and not isinstance(fields[k], bool)
                    for k in ("client_index", "call_id"))
                and isinstance(fields["method"], str) and isinstance(fields["args"], Sequence)
                and not isinstance(fields["args"], str | bytes)
            )
            if fields is None or not shape_ok:
                raise PayloadError(
                    "frames.utility-payload",
                    f"the UTILITY payload of vLLM {self.spec.version} is "
                    f"{utility_payload_type(self.spec.version)}",
                    expected=utility_payload_type(self.spec.version), got=payload,
                )
            client_index, call_id = fields["client_index"], fields["call_id"]
            clients = len(get_field(self.addresses, "outputs") or ())
            if not 0 <= client_index < clients:
                # Checked before the call is recorded: it could never be answered.
                raise PayloadError(
                    "transport.one-socket-pair-per-client",
                    "a utility call from a client this engine has no output socket for",
                    expected=f"0..{clients - 1}", got=client_index,
                )
            if (client_index, call_id) in self.pending_calls:
                raise StateError(
                    "frames.utility-call-id",
                    "a utility call whose call_id is already pending",
                    expected="a fresh call_id", got=call_id,
                )
            transition = self.machine.fire(event)
            self.pending_calls.add((client_index, call_id))
            return _action(transition, self.rank,
                           (client_index, call_id, fields["method"], fields["args"]))
        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        # tuple[int, int | none]: the exclude index is nil when no engine is excluded.
        shape_ok = (
            isinstance(payload, Sequence) and len(payload) == 2
            and is_int(payload[0]) and (payload[1] is None or is_int(payload[1]))
        )
        if not shape_ok:
            raise PayloadError(
                "frames.start-dp-wave-payload",
                "the START_DP_WAVE payload is [new_wave, exclude_engine_index]",
                expected="tuple[int, int | none]", got=payload,
            )
        return _action(self.machine.fire(event), self.rank, tuple(payload))

    # --- output channel --------------------------------------------------------------------

    def send_outputs(self, finished: Iterable[str] = ()) -> None:
        """Record request outputs about to be sent; ``finished`` ids stop being tracked."""
        self.machine.fire("send_outputs", what="outputs")
        self.requests.difference_update(finished)

    def send_utility_reply(self, client_index: int, call_id: int) -> None:
        """Record the reply to a pending utility call about to be sent."""
        if (client_index, call_id) not in self.pending_calls:
            if not self.machine.can("send_utility_reply"):
                self.machine.fire("send_utility_reply", what="utility reply")
            raise StateError(
                "frames.utility-reply",
                "a utility reply for a call that is not pending",
                expected=sorted(self.pending_calls), got=(client_index, call_id),
            )
        self.machine.fire("send_utility_reply", what="utility reply")
        self.pending_calls.discard((client_index, call_id))

    def send_dead(self) -> list[Action]:
        """Returns ``[Action("send_dead", rank)]``: send ENGINE_CORE_DEAD on every output."""
        transition = self.machine.fire("send_dead", what="ENGINE_CORE_DEAD")
        self.pending_calls.clear()
        self.requests.clear()
        return _action(transition, self.rank)
