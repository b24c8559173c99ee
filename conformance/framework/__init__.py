"""The conformance framework: how checks are declared, selected, run and reported.

- :mod:`.registry`: ``@check``, :class:`Check`, :class:`CheckFailure`, :class:`Reproduction`,
  selection by glob, the check-ID rules;
- :mod:`.context`: what a running check gets (clean-up callbacks, time limits);
- :mod:`.runner`: running checks under time limits; :mod:`.outcomes`: the verdicts;
- :mod:`.expected`: expected-failure lists; :mod:`.reports`: terminal, JSON, JUnit, HTML
  reports and clause coverage.

This package may import ``enginewire.spec``, ``enginewire.reference`` and
``enginewire.conformance.targets.contract`` (what a target is); it never imports the checks
by name except through :func:`.registry.all_checks`, nor any higher layer.
"""
