"""Shrinking a violating schedule to a shorter one that breaks the same property.

A candidate schedule is replayed leniently (a choice that is not enabled becomes the default,
non-preempting choice, and so does everything past the end), so any edit of the choice list is
a valid candidate. A candidate is kept when it shows a violation of the same kind in fewer
steps, or in as many steps with fewer preemptions. Edits, repeated until none helps or the
budget of replays is spent:

1. the shortest prefix (cut at a thread switch) after which running without preemption still
   breaks the property;
2. dropping one run of consecutive choices of one thread;
3. shortening one such run by one choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .engine import Outcome

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


def shrink(run: Runner, found: Outcome, *, budget: int = 300) -> Outcome:
    """The smallest violating execution reachable from ``found`` by the edits above."""
    assert found.violation is not None
    kind = found.violation.kind
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
