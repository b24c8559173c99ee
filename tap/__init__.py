"""``enginewire tap``: watch a front end and its engine cores talk, decode and check every frame.

Layer: above ``enginewire.bench``. This package may import ``enginewire.spec``,
``enginewire.reference`` and ``enginewire.conformance`` (and itself), nothing else of
enginewire; nothing but the command line (``enginewire/cli.py``) imports it.

- :mod:`.releases`: the one place that turns a release into a codec, and the hook that names the
  releases whose layout would explain a broken clause (the history, where it is installed);
- :mod:`.capture`: the capture file format (sans-IO records and their reader/writer);
- :mod:`.annotate`: decoding and checking one recorded message (sans-IO), and its line/JSON form;
- :mod:`.rewrite`: the init message's addresses, the one thing the tap changes (sans-IO);
- :mod:`.vectors`: a recording's messages as golden vectors;
- :mod:`.facts`: what a replay compares (sans-IO);
- :mod:`.proxy`: the ZMQ forwarding loop;
- :mod:`.replay`: one side of a recording played against a live target;
- :mod:`.commands`: ``enginewire tap`` and ``enginewire replay``.
"""
