"""enginewire: wire specification and conformance suite for LLM engine IPC."""
__version__ = "0.1.0"
