"""Any ring with the ``ring.memory`` capability as an explorer target, and cross pairings.

:class:`MemoryRingTarget` runs a conformance target's ring surface (``memory_writer`` /
``memory_reader``, capability ``ring.memory`` of
:mod:`enginewire.conformance.targets.contract`) over the explorer's memory, in-process: the
adapter an implementer already wrote for ``enginewire check`` is the one the explorer runs.

:class:`PairedTarget` runs one target's writer with another target's readers. Its name is
``WRITER>READERS`` (``mutant:flag-order>reference``), which :func:`resolve_target` resolves
again, so a finding's schedule replays. :func:`~enginewire.fuzz.explore.explorer.cross_explore`
explores a target three ways (:data:`PAIRINGS`):

- ``writer``: the target's writer with the reference readers;
- ``readers``: the reference writer with the target's readers;
- ``own``: the target's own writer and readers.

The reference ends follow the spec exactly, so a deviation that a target's two ends agree on
(index arithmetic, chunk framing, layout) passes ``own`` and shows in ``writer`` or
``readers`` with the clause of the deviation: the explorer's address map is the spec's layout
(:meth:`~enginewire.fuzz.explore.model.AddressMap.misplaced`), each end's chunk index is
compared with the spec's arithmetic and every published chunk's framing with the message
(:meth:`~enginewire.fuzz.explore.execution.World._program_store`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from enginewire.fuzz.explore.execution import ThreadContext
from enginewire.fuzz.explore.ring_targets import MemoryRingTarget, RingTarget
from enginewire.fuzz.explore.schedule import RingConfig
from enginewire.reference.ring.layout import RingLayout

#: The three pairings of :func:`cross_explore`, in the order they run.
PAIRINGS = ("writer", "readers", "own")
PAIRING_TITLES = {
    "writer": "its writer with the reference readers",
    "readers": "the reference writer with its readers",
    "own": "its own writer and readers",
}


class PairedTarget(RingTarget):
    """``writer``'s writer with ``readers``' readers over one ring (the spec's layout of the
    writer's target)."""

    def __init__(self, writer: RingTarget, readers: RingTarget) -> None:
        self.writer = writer
        self.readers = readers
        self.name = f"{writer.name}>{readers.name}"
        self.framing = writer.framing
        self.spec_layout = writer.spec_layout and readers.spec_layout
        self.oob = writer.oob and readers.oob

    def layout(self, config: RingConfig) -> RingLayout:
        return self.writer.layout(config)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.writer.installed())
            if self.readers is not self.writer:
                stack.enter_context(self.readers.installed())
            yield

    def run_writer(self, context: ThreadContext) -> None:
        self.writer.run_writer(context)

    def run_reader(self, context: ThreadContext) -> None:
        self.readers.run_reader(context)


def resolve_target(name: str) -> RingTarget:
    """``--target`` text to a ring target.

    - ``WRITER>READERS``: a :class:`PairedTarget` of the two, each resolved by this function;
    - ``reference``, ``vllm``, ``vllm-enqueue`` and the vLLM what-ifs: the explorer's
      built-in targets (:func:`~enginewire.fuzz.explore.builtin_rings.builtin_targets`);
    - ``package.module:attr`` naming a :class:`RingTarget` (an instance, a subclass, or a
      function returning one);
    - anything ``enginewire check --target`` resolves
      (:func:`enginewire.conformance.targets.resolve.load_target`: ``mutant:NAME``,
      ``package.module:attr``) whose ring has the ``ring.memory`` capability, through
      :class:`MemoryRingTarget`.
    """
    from enginewire.fuzz.explore.builtin_rings import builtin_targets

    if ">" in name:
        writer, _, readers = name.partition(">")
        return PairedTarget(resolve_target(writer), resolve_target(readers))
    builtins = builtin_targets()
    if name in builtins:
        return builtins[name]()
    if ":" not in name:
        raise ValueError(f"unknown target {name!r}: expected one of {', '.join(builtins)}, "
                         "WRITER>READERS, a conformance target with the ring.memory capability "
                         "or package.module:attr")
    module_name, attr = name.split(":", 1)
    found: Any = None
    if module_name.replace(".", "").replace("_", "").isalnum():
        with contextlib.suppress(ImportError):
            found = importlib.import_module(module_name)
            for part in attr.split("."):
                found = getattr(found, part, None)
                if found is None:
                    break
    if isinstance(found, type) and issubclass(found, RingTarget):
        found = found()
    elif found is not None and not isinstance(found, RingTarget) and callable(found):
        with contextlib.suppress(TypeError):
            made = found()
            if isinstance(made, RingTarget):
                found = made
            elif callable(getattr(made, "close", None)):
                made.close()  # a conformance target factory: resolved below as such
    if isinstance(found, RingTarget):
        found.name = name
        return found
    return _conformance_target(name)


def _conformance_target(name: str) -> RingTarget:
    from enginewire.conformance.targets.contract import TargetError
    from enginewire.conformance.targets.resolve import load_target

    try:
        target = load_target(name)
    except TargetError as exc:
        raise ValueError(str(exc)) from None
    try:
        if not target.has("ring.memory"):
            raise ValueError(f"{name} is neither an explorer RingTarget nor a conformance "
                             "target with the ring.memory capability (memory_writer and "
                             "memory_reader on its ring surface)")
        return MemoryRingTarget(target.surface("ring"), name)
    finally:
        target.close()
