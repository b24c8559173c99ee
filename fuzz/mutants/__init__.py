"""enginewire.fuzz.mutants."""
