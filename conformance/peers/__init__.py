"""The suite's own peers: what the suite runs on the other side of a target.

- :mod:`.zmq_peers`: a conformance front end and a conformance engine core over ZMQ, speaking
  the wire through the oracle (:mod:`enginewire.conformance.oracle.wire`), able to send any
  frames at all;
- :mod:`.ring_peer`: byte-level ring writer and reader ends with their own flag logic;
- :mod:`.executor_peer`: the executor's and workers' RPC messages over the suite's ring ends.

This package may import ``enginewire.spec``, ``enginewire.reference``,
``enginewire.conformance.oracle`` and ``enginewire.conformance.targets.contract``, never the
checks, the framework's runner or a higher layer.
"""
