"""``enginewire check --version X``: the suite follows release X's layouts.

A check written for the newest layout that sets a field or struct release X lacks is NOT
APPLICABLE with the release named; filler fields (nil, empty, the newest default) are dropped
from the value first, and a field only X requires is set to nil. The reference built for X
passes every applicable codec check of the releases swept here."""

from __future__ import annotations

import pytest

from enginewire.conformance.framework.evidence import for_release
from enginewire.conformance.framework.outcomes import FAILED, NOT_APPLICABLE, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run_check
from enginewire.conformance.oracle.samples import minimal_request
from enginewire.conformance.targets.reference import reference_target
from enginewire.spec import load


def test_value_for_an_older_release_drops_filler_and_names_real_fields() -> None:
    spec = load("0.9.1")
    value, missing = for_release(minimal_request(), "add", spec)
    assert missing == []
    assert "mm_features" not in value and "pooling_params" not in value
    assert value["mm_inputs"] is None  # required at 0.9.1, unknown to the newest layout
    assert "skip_reading_prefix_cache" not in value["sampling_params"]
    _, missing = for_release(minimal_request(pooling_params={"dimensions": 8}), "add", spec)
    assert missing == ["EngineCoreRequest.pooling_params"]
    _, missing = for_release({"addresses": {}}, "init", spec)
    assert missing == ["EngineHandshakeMetadata"]  # the init struct came in 0.9.2


def test_newest_release_values_pass_through() -> None:
    value = minimal_request(pooling_params=None)
    assert for_release(value, "add", load()) == (value, [])


def _run(version: str, pattern: str) -> object:
    item = select(all_checks(), patterns=[pattern])[0]
    target = reference_target(version)
    try:
        return run_check(item, target, load(version))
    finally:
        target.close()


def test_check_of_a_later_field_is_not_applicable_with_the_release_named() -> None:
    result = _run("0.22.0", "codec/dict/enum-keys")
    assert result.status == NOT_APPLICABLE  # type: ignore[attr-defined]
    assert "0.22.0 has no PrefixCacheStats.hits_by_source" in result.message  # type: ignore[attr-defined]
    assert _run("0.33.0", "codec/dict/enum-keys").status == PASSED  # type: ignore[attr-defined]


def test_a_broken_older_layout_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOT APPLICABLE does not hide a real failure: a reference for 0.22.0 that writes the
    newest EngineCoreOutputs layout fails the 0.22.0 layout check."""
    from enginewire.conformance.targets import reference as reference_module

    newest = reference_module.ReferenceCodec(version="0.33.0")

    class Wrong(reference_module.ReferenceCodec):
        def encode(self, kind, value):  # type: ignore[no-untyped-def]
            return newest.encode(kind, value)

    target = reference_target("0.22.0")
    target.codec = Wrong(version="0.22.0")
    item = select(all_checks(), patterns=["codec/struct/engine-core-outputs/layout"])[0]
    try:
        assert run_check(item, target, load("0.22.0")).status == FAILED
    finally:
        target.close()


#: Releases whose every applicable codec check passes with the reference built for them.
SWEEP = ["0.20.2", "0.22.0", "0.24.0", "0.26.0", "0.27.1", "0.30.0", "0.33.0"]


@pytest.mark.slow
@pytest.mark.parametrize("version", SWEEP)
def test_reference_passes_every_applicable_codec_check(version: str) -> None:
    target = reference_target(version)
    spec = load(version)
    try:
        results = [run_check(item, target, spec)
                   for item in select(all_checks(), surfaces=["codec"])]
    finally:
        target.close()
    failed = [f"{r.check.id}: {r.message}" for r in results if r.status == FAILED]
    assert failed == []
