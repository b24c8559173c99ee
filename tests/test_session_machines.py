"""The spec's state-machine tables, exercised exhaustively: every state x every event."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from enginewire.reference.errors import HandshakeError, StateError
from enginewire.reference.session import (
    ENGINE_ACTIONS,
    FRONTEND_ACTIONS,
    Machine,
    machine_table,
)
from enginewire.spec import load

ROLES = {"frontend": FRONTEND_ACTIONS, "engine": ENGINE_ACTIONS}


def _cases(role: str) -> list[tuple[str, str]]:
    table = machine_table(role)
    events = sorted({t.event for t in table.transitions})
    return list(itertools.product([s.name for s in table.states], events))


def _machine(role: str, state: str) -> Machine:
    machine = Machine(machine_table(role), subject="under test", actions=ROLES[role])
    machine.state = state
    return machine


@pytest.mark.parametrize("role", sorted(ROLES))
def test_table_is_well_formed(role: str) -> None:
    table = machine_table(role)
    names = [s.name for s in table.states]
    assert len(names) == len(set(names))
    keys = [(t.source, t.event) for t in table.transitions]
    assert len(keys) == len(set(keys)), "a (state, event) pair has two transitions"
    # Every state is reachable from the initial one.
    reached, frontier = {table.initial}, [table.initial]
    while frontier:
        state = frontier.pop()
        for t in table.transitions:
            if t.source == state and t.target not in reached:
                reached.add(t.target)
                frontier.append(t.target)
    assert reached == set(names)
    assert load().clause(table.illegal_event_clause).level == "MUST"


@pytest.mark.parametrize(("state", "event"), _cases("frontend"))
def test_frontend_every_state_event(state: str, event: str) -> None:
    _check_pair("frontend", state, event)


@pytest.mark.parametrize(("state", "event"), _cases("engine"))
def test_engine_every_state_event(state: str, event: str) -> None:
    _check_pair("engine", state, event)


def _check_pair(role: str, state: str, event: str) -> None:
    table = machine_table(role)
    expected = {(t.source, t.event): t.target for t in table.transitions}.get((state, event))
    machine = _machine(role, state)
    if expected is not None:
        transition = machine.fire(event)
        assert machine.state == expected == transition.target
        return
    with pytest.raises(StateError) as caught:
        machine.fire(event)
    assert caught.value.clause == table.illegal_event_clause
    assert f"Unexpected {event}" in str(caught.value) and f"in {state} state" in str(caught.value)
    assert caught.value.got == event
    assert caught.value.expected == machine.events
    assert machine.state == state, "an illegal event must not change the state"
    startup = state in machine.startup_states or event in machine.startup_events
    assert isinstance(caught.value, HandshakeError) is startup


def test_startup_states_are_the_handshake() -> None:
    frontend = _machine("frontend", "NEW")
    engine = _machine("engine", "START")
    assert frontend.startup_states == {"NEW", "CONNECTED", "READY"}
    assert engine.startup_states == {"START", "HELLO_SENT", "INIT_RECEIVED"}
    assert frontend.terminal_states == engine.terminal_states == {"DEAD"}
    assert "hello" in frontend.startup_events and "send_add" not in frontend.startup_events


@pytest.mark.parametrize("role", sorted(ROLES))
def test_unknown_action_in_table_is_refused(role: str) -> None:
    table = machine_table(role)
    broken = msgspec.structs.replace(
        table,
        transitions=[msgspec.structs.replace(table.transitions[0], action="launch_rockets")],
    )
    with pytest.raises(ValueError, match="launch_rockets"):
        Machine(broken, subject="x", actions=ROLES[role])


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_known_action_is_used(role: str) -> None:
    used = {t.action for t in machine_table(role).transitions if t.action not in ("", "none")}
    assert used == ROLES[role] - {"none"}, "an action the session carries out left the spec"


def test_dead_accepts_nothing() -> None:
    for role in ROLES:
        table = machine_table(role)
        assert not [t for t in table.transitions if t.source == "DEAD"]


@pytest.mark.vllm
def test_frontend_states_include_vllm_core_engine_states() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.engine.utils import CoreEngineState

    states = {s.name for s in machine_table("frontend").states}
    assert {member.name for member in CoreEngineState} <= states


def test_every_clause_the_peers_raise_exists() -> None:
    import re
    from pathlib import Path

    import enginewire.reference as reference

    root = Path(reference.__file__).parent
    pattern = re.compile(
        r'"((?:handshake|transport|frames|identity|request_types|structs|tensors|ring)'
        r'\.[a-z0-9_.-]+)"'
    )
    spec = load()
    for name in ("session.py", "engine.py", "frontend.py"):
        used = set(pattern.findall((root / name).read_text()))
        assert used, name
        assert used <= set(spec.clauses), (name, sorted(used - set(spec.clauses)))
