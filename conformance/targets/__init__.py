"""Targets: the contract an implementation under test fulfils, and the built-in ones.

- :mod:`.contract`: the surfaces (codec, ring, engine, frontend), capabilities and modes,
  :class:`Target`, :class:`RingHandle`, the launch records;
- :mod:`.resolve`: ``--target`` text to a :class:`Target`, and :func:`register_provider`
  for the ``PREFIX:NAME`` targets of higher layers;
- :mod:`.reference`: the reference implementation as a target;
- :mod:`.external`: external programs per surface (``--target-cmd``) and
  :mod:`.command_server`, the line-protocol server that serves an in-process target as one;
- :mod:`.vllm`: every adapter over the installed vLLM.

This package may import ``enginewire.spec``, ``enginewire.reference``,
``enginewire.conformance.framework.registry``, ``enginewire.conformance.oracle`` and
``enginewire.conformance.peers`` (external programs carry ring payloads as the suite's ring
ends do), never the checks or a higher layer.
"""
