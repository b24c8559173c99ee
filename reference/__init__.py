"""enginewire.reference."""
