"""The spec-derived value oracles: what the bytes and values must be, from the spec alone.

- :mod:`.wire`: the expected msgpack bytes of any value (:func:`expected_wire`), raw decoding
  and comparison;
- :mod:`.values`: neutral values (structs as dicts by field name), normalization and diffs;
- :mod:`.samples`: valid sample values of every struct and message kind;
- :mod:`.golden`: golden vectors (frames recorded from vLLM's own encoders).

This package may import ``enginewire.spec`` and ``enginewire.reference`` (its tensor and error
types); :mod:`.golden` also imports :mod:`enginewire.conformance.targets.vllm.target` when it
re-records vectors from vLLM. Nothing higher.
"""
