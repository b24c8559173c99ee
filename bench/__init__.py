"""``enginewire bench``: the ring, the codec and the peers against vLLM and raw baselines.

Command line: ``enginewire bench [--target T ...] [--quick] [--json PATH] [--plot DIR]``
(:mod:`.commands`). From Python::

    from enginewire.bench import BenchConfig, run, render, write_json

    results = run(BenchConfig.quick(targets=("reference",)))
    print(render(results))
    write_json(results, "results.json")

Modules, in the order a run uses them:

- :mod:`.config`: :class:`BenchConfig`, the grid and the time bounds (``full`` and ``quick``);
- :mod:`.rounds`: :func:`run`: set-up once, then rounds that alternate the contenders;
- :mod:`.ring_bench`, :mod:`.codec_bench`, :mod:`.peer_bench`: what one measurement of each
  bench does;
- :mod:`.results`: :class:`Results`, per-round samples, paired ratios, the reference targets;
- :mod:`.report` (tables, JSON) and :mod:`.plots` (PNG files, matplotlib).

The method is described in ``docs/bench.md``.

Layer: above ``enginewire.fuzz``. This package may import ``enginewire.spec``,
``enginewire.reference``, ``enginewire.conformance`` (targets by name) and ``enginewire.fuzz``,
never the command line.
"""

from enginewire.bench.config import BenchConfig
from enginewire.bench.report import render, write_json
from enginewire.bench.results import Results, Series
from enginewire.bench.rounds import run

__all__ = ["BenchConfig", "Results", "Series", "render", "run", "write_json"]
