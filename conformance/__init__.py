"""enginewire.conformance."""
