"""enginewire.fuzz."""
