"""enginewire.conformance: the conformance suite (``enginewire check``).

- :mod:`.framework`: ``@check`` and the registry, the runner, verdicts, expected-failure
  lists, reports;
- :mod:`.targets`: the target contract (codec, ring, engine, frontend), resolution of
  ``--target`` names, and the built-in targets (reference, vLLM, external programs);
- :mod:`.peers`: the suite's own peers (ZMQ front end and engine, ring ends, executor and
  worker messages);
- :mod:`.oracle`: the spec-derived oracles (expected wire bytes, neutral values, samples,
  golden vectors);
- :mod:`.checks`: the checks, one module per surface (and generated struct/golden checks);
- :mod:`.release_match`: ``enginewire spec match TARGET`` for codec targets (which releases'
  layouts a codec speaks, probed with each release's samples);
- :mod:`.commands` (``enginewire check``) and :mod:`.pytest_plugin` (the checks as pytest
  items, ``--enginewire-target``); ``data/``: expected-failure lists and golden vectors.

Layer: above ``enginewire.reference``. This package may import ``enginewire.spec``,
``enginewire.reference`` and itself, never fuzz, bench or the command line: those register
what they add (e.g. ``mutant:NAME`` targets) through
:func:`.targets.resolve.register_provider`. See docs/conformance.md.
"""

from enginewire.conformance.framework.registry import (
    Check,
    CheckFailure,
    CheckSkip,
    NotImplementedSurface,
    Reproduction,
    check,
)

__all__ = ["Check", "CheckFailure", "CheckSkip", "NotImplementedSurface", "Reproduction", "check"]
