"""How the next action is chosen: exhaustive search, random sampling, replay.

- :func:`search`: depth-first search over every choice (CHESS/loom style) with state caching:
  a state (shared memory, each thread's place in its operation tree, its buffered stores) that
  was already explored is not explored again, so equivalent interleavings that meet in one
  state (independent accesses taken in either order) are explored once. With a preemption
  bound ``K`` it covers every schedule with at most ``K`` preemptions: taking any action
  other than the thread that ran last while that thread could go on costs one; switching
  when it waits, blocks at a fence or has finished is free. A state is then explored again
  only when reached with fewer preemptions spent.
- :class:`PctStrategy`: probabilistic concurrency testing. Threads (and store buffers) get
  random priorities; the highest-priority enabled one runs; at ``depth - 1`` random steps the
  running one drops to the lowest priority. One seed is one schedule.
- :class:`ReplayStrategy`: follows a recorded schedule, then :func:`default_choice`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from enginewire.fuzz.explore.execution import Action, ExplorerError, Simulator, World
from enginewire.fuzz.explore.model import Footprint


class ScheduleError(ExplorerError):
    """A schedule names an action that is not enabled at its step."""


def default_choice(world: World, actions: Sequence[Action]) -> Action:
    """Without preempting: the thread that ran last if it can go on, else the drain of its
    store buffer it waits for at a fence, else the first enabled thread, else a drain."""
    current = world.current
    if current is not None:
        at_fence = world.nodes[current].kind in ("fence", "acq_rel")
        for action in actions:
            if action.thread == current and (action.entry is None or at_fence):
                return action
    for action in actions:
        if action.entry is None:
            return action
    return actions[0]


class ReplayStrategy:
    """Takes ``keys[i]`` at step ``i``; past the end, :func:`default_choice`.

    ``strict``: a key that is not enabled raises :class:`ScheduleError`; otherwise it is
    replaced by the default choice (used while shrinking).
    """

    def __init__(self, keys: Sequence[str], *, strict: bool = True) -> None:
        self.keys = list(keys)
        self.strict = strict

    def __call__(self, world: World, actions: list[Action]) -> Action | None:
        step = world.step
        if step < len(self.keys):
            key = self.keys[step]
            for action in actions:
                if action.key == key:
                    return action
            if self.strict:
                enabled = ", ".join(a.key for a in actions)
                raise ScheduleError(f"schedule step {step + 1}: {key!r} is not enabled "
                                    f"(enabled: {enabled})")
        return default_choice(world, actions)


class PctStrategy:
    """One PCT schedule: priorities and ``depth - 1`` change points drawn from ``seed``
    over the first ``horizon`` steps."""

    def __init__(self, seed: int, *, depth: int = 3, horizon: int = 100) -> None:
        self.rng = random.Random(seed)
        self.priority: dict[str, float] = {}
        span = max(horizon, depth)
        self.change_points = set(self.rng.sample(range(1, span + 1), max(depth - 1, 0)))
        self.lowered = 0.0

    def __call__(self, world: World, actions: list[Action]) -> Action | None:
        groups: dict[str, list[Action]] = {}
        for action in actions:
            entity = action.key if action.entry is None else action.key.split(".", 1)[0]
            groups.setdefault(entity, []).append(action)
        for entity in groups:
            if entity not in self.priority:
                self.priority[entity] = 1.0 + self.rng.random()
        best = max(groups, key=self.priority.__getitem__)
        if world.step + 1 in self.change_points:
            self.lowered -= 1.0
            self.priority[best] = self.lowered
        options = groups[best]
        return options[0] if len(options) == 1 else self.rng.choice(options)


@dataclass
class SearchStats:
    """``states``: distinct states explored; ``transitions``: actions taken; ``ends``:
    executions that ran to their end (finished or violating); ``revisits``: states reached
    again; ``complete``: nothing left to explore; ``limited``: stopped at ``max_states``;
    ``depth``: the most actions of one execution the search reached."""

    states: int = 0
    depth: int = 0
    transitions: int = 0
    ends: int = 0
    revisits: int = 0
    complete: bool = False
    limited: bool = False


_AWAKE: frozenset[str] = frozenset()


def search(sim: Simulator, *, bound: int | None,
           on_violation: Callable[[World, list[str]], bool],
           max_states: int | None = None, reduce: bool = True) -> SearchStats:
    """Depth-first search (see the module docstring). ``on_violation(world, keys)`` is called
    for each violating state reached (``keys``: the actions that led there); it returns True
    to stop the search.

    Unbounded, the search also keeps sleep sets (Godefroid): after the branch of action ``a``
    is explored, ``a`` sleeps in the sibling branches until an action that does not commute
    with it is taken, since any ordering that takes ``a`` before those is one already covered.
    A state reached again is explored again only for the actions that slept on its earlier
    visits and are awake now. A violation ends its branch, so a branch in which one was
    found (at any depth, or at a state whose first visit found one) was not explored whole:
    its action does not go to sleep, and the reduced search finds every violation the
    unreduced one finds. ``reduce=False`` turns sleep sets off (state caching stays).
    """
    stats = SearchStats()
    bounded = bound is not None
    sleeping = reduce and not bounded
    visited: dict[bytes, Any] = {}
    #: States whose exploration met a violation somewhere below them.
    cut_states: set[bytes] = set()
    # A frame: [world, actions, position, sleep, state key, cut, action being explored].
    stack: list[list[Any]] = []
    stopped = False
    reached: list[Any] = [None, False]  # the last expanded state's key, and if it was cut

    def path() -> list[str]:
        return [frame[1][frame[2] - 1].key for frame in stack]

    def expand(world: World, sleep: dict[str, Footprint]) -> list[Action] | None:
        nonlocal stopped
        reached[0], reached[1] = None, False
        actions: list[Action] = []
        if world.violation is None:
            actions = world.actions()
            if not actions:
                world.finish()
                stats.ends += 1
            elif world.step >= sim.max_steps:
                world.fail("no-termination", None,
                            f"the execution did not end within {sim.max_steps} actions",
                            "explorer")
        if world.violation is not None:
            stats.ends += 1
            reached[1] = True
            if on_violation(world, path()):
                stopped = True
            return None
        if not actions:
            return None
        current = world.current
        if bounded:
            key = world.state_key(with_current=True)
            seen = visited.get(key)
            if seen is not None and seen <= world.preemptions:
                stats.revisits += 1
                return None
            visited[key] = world.preemptions
            ranked = []
            for action in actions:
                cost = world.cost(action)
                if world.preemptions + cost > bound:  # type: ignore[operator]
                    continue
                ranked.append(((cost, action.thread != current, action.entry is not None,
                                action.thread, action.key), action))
            ranked.sort(key=lambda item: item[0])
            todo = [action for _, action in ranked]
        else:
            key = world.state_key(with_current=False)
            reached[0] = key
            asleep = frozenset(sleep) if sleep else _AWAKE
            old = visited.get(key)
            if old is None:
                visited[key] = asleep
                todo = [a for a in actions if a.key not in asleep]
            elif old <= asleep:
                stats.revisits += 1
                reached[1] = key in cut_states
                return None
            else:
                visited[key] = old & asleep
                todo = [a for a in actions if a.key in old and a.key not in asleep]
                stats.revisits += 1
            todo.sort(key=lambda a: (a.thread != current or a.entry is not None))
        stats.states += 1
        return todo

    def explored(frame: list[Any], action: Action, cut: bool) -> None:
        """The branch of ``action`` below ``frame`` is done: its action sleeps in the later
        siblings, unless a violation cut the branch short."""
        if cut:
            frame[5] = True
        elif sleeping:
            frame[3][action.key] = action.footprint

    root = sim.start(tracking=False)
    first = expand(root, {})
    if first:
        stack.append([root, first, 0, {}, reached[0], False, None])
    while stack and not stopped:
        frame = stack[-1]
        world, actions, position, sleep = frame[0], frame[1], frame[2], frame[3]
        if position >= len(actions):
            stack.pop()
            if frame[5] and frame[4] is not None:
                cut_states.add(frame[4])
            if stack:
                parent = stack[-1]
                explored(parent, parent[6], frame[5])
            continue
        frame[2] = position + 1
        action = actions[position]
        child = world.copy()
        child.perform(action)
        stats.transitions += 1
        child_sleep: dict[str, Footprint] = {}
        if sleeping:
            footprint = action.footprint
            child_sleep = {k: fp for k, fp in sleep.items() if fp.independent(footprint)}
        more = expand(child, child_sleep)
        if more:
            frame[6] = action
            stack.append([child, more, 0, child_sleep, reached[0], False, None])
            if len(stack) > stats.depth:
                stats.depth = len(stack)
        else:
            explored(frame, action, reached[1])
        if max_states is not None and stats.states >= max_states:
            stats.limited = True
            break
    stats.complete = not stack and not stopped
    return stats
