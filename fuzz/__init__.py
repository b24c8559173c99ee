"""enginewire.fuzz: property-based fuzzing, schedule exploration and the mutant catalogue.

- :mod:`.strategies`: Hypothesis strategies of valid values of every spec type and kind;
- :mod:`.mutations`: malformed input (one broken rule per case, labelled with its clause);
- :mod:`.campaigns`: malformed-input campaigns against a target (``enginewire fuzz``);
- :mod:`.differential`: a target's encoder against the spec oracle's bytes
  (``enginewire fuzz --surface encoder``);
- :mod:`.profiles`: Hypothesis settings profiles;
- :mod:`.explore`: the ring's schedule explorer (``enginewire explore``);
- :mod:`.mutants`: deliberately broken targets and their kill matrix (``enginewire mutants``).

Layer: above ``enginewire.conformance``. This package may import ``enginewire.spec``,
``enginewire.reference``, ``enginewire.conformance`` and Hypothesis, never bench or the
command line.
"""
