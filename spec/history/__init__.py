"""Version history of the wire structs, derived from released vLLM wheels.

- :mod:`.wheels`: which releases, and their wheels in a local cache (``pip download``);
- :mod:`.extract`: the classes and constants of one wheel, read by ``ast``;
  :mod:`.protocol_facts`: its handshake keys, ready response, ring chunk framing and tensor
  form; :mod:`.constants`: the derived constants tables as they stand at one release;
- :mod:`.derive`: every release's layouts merged into version ranges in ``spec/data``;
- :mod:`.compat`: what happens when a front end of one release talks to an engine of another,
  confirmed by encoding with one release's classes (:mod:`enginewire.spec.classes`) and
  decoding with the other's; :mod:`.compat_matrix`: every pair at once;
- :mod:`.breaks`: every wire-breaking change between consecutive releases, confirmed the same way;
- :mod:`.match`: which releases a module of msgspec structs matches (a codec target is probed
  by :mod:`enginewire.conformance.release_match`, registered through
  :func:`.match.register_codec_matcher`);
- :mod:`.realwheels`: the same messages through the wheels' own classes, one subprocess each.

Layer: part of the spec. This package may import the rest of :mod:`enginewire.spec`, the
standard library and third-party packages (matplotlib only inside the functions that draw);
never the reference, the suite or the tools above them.
"""
