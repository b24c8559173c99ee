"""Adapters over the installed vLLM (``--target vllm``), all in one place.

- :mod:`.target`: the ``vllm`` target: codec (``MsgpackEncoder``/``MsgpackDecoder``), ring
  (``MessageQueue``, executor and workers), engine (``EngineCoreProc``) and front end;
- :mod:`.frontend_client`: vLLM's front-end client (``AsyncMPClient``) set up against the
  suite's engines;
- :mod:`.engine_core`: vLLM's real engine core (``EngineCoreProc``) launched by its own
  ``CoreEngineProcManager`` on the CPU platform, with its executor and worker processes;
- :mod:`.standin`: the one stand-in there, the worker (vLLM's model layer), named by vLLM's
  ``ParallelConfig.worker_cls``;
- :mod:`.api_server`: vLLM's real OpenAI-compatible API server (``vllm serve``) in a child
  process, with a tiny tokenizer written on the spot, its own engine core or an external one
  (the reference's) behind it;
- :mod:`.ring_memory`: vLLM's unmodified ring steps over a memory the caller provides (the
  ``ring.memory`` capability, and the base of the explorer's vLLM target);
- :mod:`.objects`: vLLM objects with exactly the field values of a reference value, for
  byte-level comparisons with vLLM's encoder.

The explorer's vLLM ring target (``enginewire explore --target vllm``) stays in
:mod:`enginewire.fuzz.explore.vllm_ring`, built on :mod:`.ring_memory` over the explorer's
instrumented memory (the suite may not import the explorer).

This package may import vLLM (inside functions: importing it needs no vLLM), ``enginewire.spec``,
``enginewire.reference`` and ``enginewire.conformance.targets``/``oracle``, nothing higher.
"""
