"""Version history of the wire structs, derived from released vLLM wheels.

- :mod:`.wheels`: which releases, and their wheels in a local cache (``pip download``);
- :mod:`.extract`: the classes and constants of one wheel, read by ``ast``;
- :mod:`.derive`: every release's layouts merged into version ranges in ``spec/data``;
- :mod:`.compat`: what happens when a front end of one release talks to an engine of another;
- :mod:`.match`: which releases a module of msgspec structs matches.
"""
