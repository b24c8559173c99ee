"""enginewire.conformance.checks."""
