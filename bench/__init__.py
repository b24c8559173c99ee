"""``enginewire bench``: the ring, the codec and the peers against vLLM and raw baselines.

Command line: ``enginewire bench [--target T ...] [--quick] [--json PATH] [--plot DIR]``
(:mod:`.commands`). From Python::

    from enginewire.bench import BenchConfig, run, render, write_json

    results = run(BenchConfig.quick(targets=("reference",)))
    print(render(results))
    write_json(results, "results.json")

Modules, in the order a run uses them:

- :mod:`.config`: :class:`BenchConfig`, the grid and the time bounds (``full`` and ``quick``);
- :mod:`.runner`: :func:`run`: set-up once, then rounds that alternate the contenders;
- :mod:`.ring`, :mod:`.codec`, :mod:`.peers`: what one measurement of each bench does;
- :mod:`.results`: :class:`Results`, per-round samples, paired ratios, the reference targets;
- :mod:`.report` (tables, JSON) and :mod:`.plots` (PNG files, matplotlib).

The method is described in ``docs/bench.md``.
"""

from .config import BenchConfig
from .report import render, write_json
from .results import Results, Series
from .runner import run

__all__ = ["BenchConfig", "Results", "Series", "render", "run", "write_json"]
