"""Shrinking a violating schedule to a shorter one that breaks the same property.

First :func:`shortest_schedule` searches breadth-first, from the start, for the fewest actions
that break the same property (within the preemption bound of the search that found it, if it
had one); a state reached before is not expanded again, and the search gives up past a budget
of actions. Then :func:`shrink` edits the schedule it has.

A candidate schedule is replayed leniently (a choice that is not enabled becomes the default,
non-preempting choice, and so does everything past the end), so any edit of the choice list is
a valid candidate. A candidate is kept when it shows a violation of the same kind in fewer
steps, or in as many steps with fewer preemptions, and never past ``max_preemptions`` (so a
violation found within a preemption bound stays within it).
Edits, repeated until none helps or the budget of replays is spent:

1. the shortest prefix (cut at a thread switch) after which running without preemption still
   breaks the property;
2. dropping one run of consecutive choices of one thread;
3. shortening one such run by one choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from enginewire.fuzz.explore.execution import Outcome, Simulator, World

#: Replays a choice list leniently.
Runner = Callable[[Sequence[str]], Outcome]


def _runs(keys: Sequence[str]) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    for key in keys:
        if runs and runs[-1][0] == key:
            runs[-1] = (key, runs[-1][1] + 1)
        else:
            runs.append((key, 1))
    return runs


def _flatten(runs: Sequence[tuple[str, int]]) -> list[str]:
    return [key for key, count in runs for _ in range(count)]


def shrink(run: Runner, found: Outcome, *, budget: int = 300,
           max_preemptions: int | None = None) -> Outcome:
    """The smallest violating execution reachable from ``found`` by the edits above."""
    assert found.violation is not None
    kind = found.violation.kind
    cap = max_preemptions
    best = found
    spent = 0

    def score(outcome: Outcome) -> tuple[int, int]:
        assert outcome.violation is not None
        return (outcome.violation.step, outcome.preemptions)

    def attempt(keys: list[str]) -> bool:
        nonlocal best, spent
        spent += 1
        outcome = run(keys)
        if (outcome.violation is not None and outcome.violation.kind == kind
                and (cap is None or outcome.preemptions <= cap)
                and score(outcome) < score(best)):
            best = outcome
            return True
        return False

    improved = True
    while improved and spent < budget:
        improved = False
        assert best.violation is not None
        runs = _runs(best.keys[:best.violation.step])
        for cut in range(len(runs)):
            if spent >= budget:
                break
            if attempt(_flatten(runs[:cut])):
                improved = True
                break
        if improved:
            continue
        for index in range(len(runs)):
            if spent >= budget:
                break
            if attempt(_flatten(runs[:index] + runs[index + 1:])):
                improved = True
                break
        if improved:
            continue
        for index, (key, count) in enumerate(runs):
            if spent >= budget:
                break
            if count > 1 and attempt(_flatten(runs[:index] + [(key, count - 1)]
                                              + runs[index + 1:])):
                improved = True
                break
    return best


def shortest_schedule(sim: Simulator, kind: str, *, max_depth: int,
                      max_preemptions: int | None = None,
                      max_transitions: int = 100_000) -> list[str] | None:
    """The shortest schedule, at most ``max_depth`` actions long and within
    ``max_preemptions`` (None: any), that ends in a violation of ``kind``, with the fewest
    preemptions among the shortest; None if there is none or the search takes
    ``max_transitions`` actions first."""
    root = sim.start(tracking=False)
    if root.violation is not None:
        return [] if root.violation.kind == kind else None
    frontier: list[tuple[World, Any]] = [(root, None)]
    visited = {root.state_key(with_current=False): 0}
    transitions = 0
    for _ in range(max_depth):
        level: dict[bytes, tuple[World, Any]] = {}
        best: tuple[int, Any] | None = None
        for world, path in frontier:
            for action in sorted(world.actions(), key=world.cost):
                transitions += 1
                if transitions > max_transitions:
                    return None
                child = world.copy()
                child.perform(action)
                if max_preemptions is not None and child.preemptions > max_preemptions:
                    continue
                child_path = (path, action.key)
                if child.violation is None and not child.actions():
                    child.finish()
                if child.violation is not None:
                    if child.violation.kind == kind and (best is None
                                                         or child.preemptions < best[0]):
                        best = (child.preemptions, child_path)
                    continue
                key = child.state_key(with_current=False)
                seen = visited.get(key)
                if seen is not None and seen <= child.preemptions:
                    continue
                visited[key] = child.preemptions
                level[key] = (child, child_path)
        if best is not None:
            return _unwind(best[1])
        if not level:
            return None
        frontier = list(level.values())
    return None


def _unwind(path: Any) -> list[str]:
    keys: list[str] = []
    while path is not None:
        path, key = path
        keys.append(key)
    keys.reverse()
    return keys
