"""The conformance checks, one module per surface, registered with ``@check`` on import.

- :mod:`.codec_messages`, :mod:`.codec_structs`, :mod:`.codec_golden`: the codec surface;
- :mod:`.ring_protocol`, :mod:`.ring_executor`: the ring surface and executor RPC over it;
- :mod:`.engine_conversation`: an engine core driven by the suite's front end;
- :mod:`.frontend_conversation`: a front end served by the suite's engines;
- :mod:`._helpers`: what several check modules share.

:func:`enginewire.conformance.framework.registry.all_checks` imports every module here.
This package may import ``enginewire.spec``, ``enginewire.reference`` and the rest of
``enginewire.conformance`` (framework, targets.contract, peers, oracle), nothing higher.
"""
