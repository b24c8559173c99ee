"""enginewire.conformance: the conformance suite (``enginewire check``).

- :mod:`.targets`: the target contract (codec, ring, engine, frontend) and target loading;
- :mod:`.registry`: ``@check``, :class:`CheckFailure`, :class:`Reproduction`;
- :mod:`.runner`: running checks under time limits; :mod:`.expected`: expected-failure lists;
- :mod:`.reports`: terminal, JSON, JUnit and HTML reports, clause coverage;
- :mod:`.checks`: the checks, one module per surface (and generated struct/golden checks);
- :mod:`.wire`, :mod:`.values`, :mod:`.samples`: the spec-derived wire oracle and values;
- :mod:`.peers`, :mod:`.ring_peer`, :mod:`.executor_peer`: the suite's own front end, engine,
  ring ends, and executor and worker messages;
- :mod:`.reference_target`, :mod:`.vllm_target`, :mod:`.vllm_frontend`, :mod:`.external`:
  built-in targets;
- :mod:`.pytest_plugin`: the checks as pytest items (``--enginewire-target``).

See docs/conformance.md.
"""

from .registry import Check, CheckFailure, CheckSkip, NotImplementedSurface, Reproduction, check

__all__ = ["Check", "CheckFailure", "CheckSkip", "NotImplementedSurface", "Reproduction", "check"]
