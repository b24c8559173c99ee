"""enginewire.reference: the reference implementation of every surface of the spec.

- :mod:`.codec`, :mod:`.structs`, :mod:`.tensors`: values to ZMQ frames and back (sans-IO);
- :mod:`.session`: the front end's and the engine core's state machines (sans-IO);
- :mod:`.transport`, :mod:`.addresses`: ZMQ sockets and addresses, made and cleaned up;
- :mod:`.engine`, :mod:`.frontend`: a reference engine core and front end over ZMQ;
- :mod:`.ring`: the shared-memory broadcast ring and its ``MessageQueue``;
- :mod:`.errors`: the one ``ProtocolError`` hierarchy, each error naming its spec clause.

Layer: above ``enginewire.spec``. This package may import ``enginewire.spec`` and third-party
packages, never conformance, fuzz, bench or the command line.
"""
