"""enginewire: wire specification and conformance suite for LLM engine IPC.

This package holds the ``enginewire`` command line (:mod:`.cli`) and the documentation site
(:mod:`.docsite`, ``enginewire docs build``, with the pictures of :mod:`.diagrams`), the top
layer: it may import every other enginewire package (spec <- reference <- conformance <- fuzz
<- bench <- cli).
"""
__version__ = "0.1.0"
