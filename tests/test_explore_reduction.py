"""The sleep-set reduction is sound: on the reference and on every broken ring end of the
mutant catalogue, the reduced search finds exactly the violations (kind and clause) the
unreduced one finds, under every memory model, for small rings; and it takes fewer
transitions."""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.fuzz.explore import ReferenceTarget, RingConfig, explore
from enginewire.fuzz.mutants import MUTANTS

BROKEN = sorted(name for name, mutant in MUTANTS.items() if mutant.explorable)
MODELS = ("sc", "tso", "weak")


def _target(name: str) -> Any:
    return ReferenceTarget() if name == "reference" else MUTANTS[name].explorer_target()


def _found(name: str, config: RingConfig, model: str, reduce: bool) -> tuple[set, Any]:
    result = explore(_target(name), config, model=model, keep_going=True, shrink=False,
                     reduce=reduce, max_states=400_000)
    assert result.complete, result.summary()
    return {(f.violation.kind, f.violation.clause) for f in result.findings}, result


def _same(name: str, config: RingConfig, model: str) -> tuple[int, int]:
    reduced, fewer = _found(name, config, model, True)
    full, more = _found(name, config, model, False)
    assert reduced == full, (name, config.spell(), model, reduced ^ full)
    return fewer.transitions, more.transitions


def test_the_reduction_finds_what_the_full_search_finds_on_one_chunk() -> None:
    for name in ["reference", *BROKEN]:
        for model in MODELS:
            _same(name, RingConfig(readers=1, chunks=1, messages=2), model)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", ["reference", *BROKEN])
@pytest.mark.parametrize("size", ["1x2x3", "2x1x2"])
def test_the_reduction_finds_what_the_full_search_finds(name: str, model: str,
                                                         size: str) -> None:
    reduced, full = _same(name, RingConfig.parse(size), model)
    assert reduced <= full


def test_the_reduction_takes_fewer_transitions_on_the_reference() -> None:
    reduced, full = _same("reference", RingConfig(readers=1, chunks=2, messages=2), "tso")
    assert reduced < full
