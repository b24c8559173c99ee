"""``enginewire check --version X``: the suite follows release X's layouts.

A check written for the newest layout that sets a field or struct release X lacks is NOT
APPLICABLE with the release named; filler fields (nil, empty, the newest default) are dropped
from the value first, and a field only X requires is set to nil. Checks that build values
themselves lay them out for X, and test X's own form of what changed shape (the ready
response, multimodal items). The reference built for X passes every applicable codec check
at every derived release."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from enginewire.conformance.framework.evidence import for_release
from enginewire.conformance.framework.outcomes import (
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    PASSED,
)
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
    _, missing = for_release({"addresses": {}}, "init", load("0.9.0"))
    assert missing == ["EngineHandshakeMetadata"]  # the init struct came in 0.9.1


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


#: (Codec subclass, version) -> a ReferenceCodec whose codecs are of that class.
CodecTarget = Callable[[type, str], Any]


@pytest.fixture
def codec_target() -> CodecTarget:
    """A reference codec target for a release whose codecs (every threshold, with or without
    the insecure opt-in) are built by a given subclass of the reference Codec: the one way
    the tests here break one part of the reference for one release."""
    from enginewire.conformance.targets import reference as reference_module

    def make(codec_class: type, version: str) -> Any:
        class Target(reference_module.ReferenceCodec):
            def make_codec(self, threshold, insecure):  # type: ignore[no-untyped-def]
                return codec_class(threshold=threshold, allow_insecure=insecure,
                                   version=self.version)

        return Target(version=version)

    return make


def _status(version: str, pattern: str, codec: object = None) -> tuple[str, str]:
    """The verdict and message of the one check ``pattern`` against the reference built for
    ``version`` (its codec replaced by ``codec`` where given)."""
    item = select(all_checks(), patterns=[pattern])[0]
    target = reference_target(version)
    if codec is not None:
        target.codec = codec
    try:
        result = run_check(item, target, load(version))
    finally:
        target.close()
    return result.status, result.message  # type: ignore[attr-defined]


@pytest.mark.parametrize(("version", "pattern"), [
    ("0.9.1", "codec/message/ready-response/frames"),      # one empty frame
    ("0.9.1", "codec/message/ready-response/round-trip"),
    ("0.9.1", "codec/message/control-no-extensions"),
    ("0.9.1", "codec/message/add/frames"),                 # eos_token_id, mm_inputs, ...
    ("0.9.1", "codec/message/add/round-trip"),
    ("0.9.1", "codec/float/accepts-float32-and-int"),
    ("0.9.1", "codec/tensor/nested-tensors"),              # in a bare MultiModalFieldElem
    ("0.9.1", "codec/struct/declared-fields-only"),        # no StructuredOutputsParams yet
    ("0.8.4", "codec/message/ready-response/frames"),      # the literal frame READY
    ("0.8.4", "codec/message/ready-response/round-trip"),
    ("0.7.3", "codec/message/outputs/round-trip"),         # no engine_index yet
    ("0.7.3", "codec/enum/value-on-wire"),                 # no PREEMPTED event yet
    ("0.10.1", "codec/mm/item-map"),                       # items in mm_kwargs
    ("0.10.1", "codec/mm/unknown-factory-rejected"),
    ("0.10.2", "codec/tensor/nested-tensors"),             # no keep_on_cpu yet
    ("0.13.0", "codec/mm/slice-triple"),                   # mm_features, no mm_hash yet
])
def test_older_release_checks_pass_in_the_release_layout(version: str, pattern: str) -> None:
    status, message = _status(version, pattern)
    assert status == PASSED, message


@pytest.mark.parametrize(("version", "pattern", "reason"), [
    ("0.9.1", "codec/mm/item-map", "vLLM 0.9.1 has no typed multimodal item"),
    ("0.9.1", "codec/utility-result/pair", "vLLM 0.9.1 has no UtilityResult"),
    ("0.9.0", "codec/message/ready-response/frames",
     "vLLM 0.9.0 has no ready response of its own"),
    ("0.7.3", "codec/message/init/frames", "vLLM 0.7.3 has no EngineHandshakeMetadata"),
    ("0.8.4", "codec/tensor/nested-tensors",
     "vLLM 0.8.4 sends a tensor as the [dtype, shape, data] tuple of its numpy view"),
    ("0.7.3", "codec/tensor/tuple-layout",
     "vLLM 0.7.3 sends a tensor as a msgpack extension type wrapping a pickle stream"),
    ("0.7.3", "codec/tensor/inline-threshold-exact",
     "vLLM 0.7.3 has no inline threshold for tensors"),
    ("0.9.1", "codec/ndarray/dtype/le-f4", "vLLM 0.9.1 has no field that carries an ndarray"),
    ("0.11.0", "codec/ndarray/dtype/le-i8",
     "vLLM 0.11.0 has no field that carries an ndarray"),
    ("0.9.1", "codec/tensor/pickle-form", "vLLM 0.9.1 sends a tensor as the [dtype, shape, "
     "data] tuple (tensors surface, tensor_form 'tuple')"),
    ("0.8.4", "codec/tensor/dtype/bfloat16", "numpy has no bfloat16"),
    ("0.8.4", "codec/tensor/dtype-alias-rejected", "vLLM 0.8.4 sends no torch dtype name"),
    ("0.8.4", "codec/tensor/ipc-handle-rejected", "vLLM 0.8.4 sends no torch dtype name and "
     "no IPC handle"),
    ("0.8.4", "codec/tensor/type-from-schema",
     "vLLM 0.8.4 has no field that carries an ndarray"),
    ("0.8.4", "codec/tensor/inline-threshold-exact",
     "vLLM 0.8.4 places a tensor by a fixed threshold of 512 bytes"),
    # Not a refusal: with a valid UTILITY of the release as evidence it would pass.
    ("0.7.3", "codec/message/untyped-payload-no-oob",
     "vLLM 0.7.3 has no inline threshold for tensors"),
    # Messages a release lacks (history/constants.toml [[engine_core_dead]],
    # [[dp_coordinator]], [[handshake]]): NOT APPLICABLE, never NOT IMPLEMENTED.
    ("0.8.4", "codec/reject/engine-core-dead-extra-frame",
     "vLLM 0.8.4 has no ENGINE_CORE_DEAD"),
    ("0.8.4", "codec/message/engine-core-dead/frames", "the sentinel came in vLLM 0.8.5"),
    ("0.8.4", "codec/reject/hello-not-a-map", "vLLM 0.8.4 has no HELLO/READY handshake"),
    ("0.9.0", "codec/message/unsubscribe-told-apart", "vLLM 0.9.0 has no DP coordinator"),
    ("0.7.3", "codec/message/unsubscribe-told-apart",
     "vllm/v1/engine/coordinator.py came in vLLM 0.9.1"),
    ("0.9.0", "codec/message/start-dp-wave/frames", "no coordinator_input channel"),
])
def test_what_a_release_lacks_is_not_applicable_with_the_reason(version: str, pattern: str,
                                                                reason: str) -> None:
    status, message = _status(version, pattern)
    assert status == NOT_APPLICABLE and reason in message, (status, message)


def test_a_codec_writing_the_newest_forms_fails_the_release_aware_checks(
        codec_target: CodecTarget) -> None:
    """The release-aware checks have power: a codec for 0.8.4 that writes the newest ready
    response (an empty frame for none), one for 0.10.1 that leaves mm_kwargs' factories
    unchecked and one for 0.9.1 that decodes an element's nested tensors as plain msgpack all
    fail; 0.9.1's ADD in the newest layout fails its frames check."""
    from enginewire.conformance.targets import reference as reference_module

    newest = reference_module.ReferenceCodec(version="0.33.0")

    class NewestReadyResponse(reference_module.ReferenceCodec):
        def encode(self, kind, value):  # type: ignore[no-untyped-def]
            if kind == "ready_response" and value is None:
                return newest.encode(kind, value)
            return super().encode(kind, value)

    codec = NewestReadyResponse(version="0.8.4")
    for pattern in ("codec/message/ready-response/frames",
                    "codec/message/control-no-extensions"):
        status, message = _status("0.8.4", pattern, codec)
        assert status == FAILED and "READY" in message, (pattern, status, message)

    from enginewire.reference.codec import Codec

    class Unchecked(Codec):
        def _validate_mm_item(self, item):  # type: ignore[no-untyped-def]
            return None

    status, _ = _status("0.10.1", "codec/mm/unknown-factory-rejected",
                        codec_target(Unchecked, "0.10.1"))
    assert status == FAILED

    class RawElements(reference_module.ReferenceCodec):
        def decode(self, kind, frames):  # type: ignore[no-untyped-def]
            if kind == "MultiModalFieldElem":  # the msgpack map as it came, no tensors
                import msgspec

                return msgspec.msgpack.decode(bytes(frames[0]))
            return super().decode(kind, frames)

    # 0.9.1's nested tensors travel in a bare MultiModalFieldElem.
    status, message = _status("0.9.1", "codec/tensor/nested-tensors",
                              RawElements(version="0.9.1"))
    assert status == FAILED and "decoded as" in message, message

    class NewestAdd(reference_module.ReferenceCodec):
        def encode(self, kind, value):  # type: ignore[no-untyped-def]
            if kind == "add":
                return newest.encode(kind, minimal_request())
            return super().encode(kind, value)

    status, message = _status("0.9.1", "codec/message/add/frames", NewestAdd(version="0.9.1"))
    assert status == FAILED and "payload" in message, message


def test_the_tensors_surface_follows_the_release() -> None:
    """load(X) gives X's tensor forms, extension codes and threshold, from the history."""
    expected = {
        "0.7.3": ("pickle", "pickle", None, False, {"tensor": 1, "pickle": 2}),
        "0.8.3": ("pickle", "pickle", None, False, {"tensor": 1, "pickle": 2, "cloudpickle": 3}),
        "0.8.4": ("numpy", "tuple", 512, False, {"pickle": 1, "cloudpickle": 2, "raw_view": 3}),
        "0.8.5": ("tuple", "tuple", 256, True, {"pickle": 1, "cloudpickle": 2, "raw_view": 3}),
        "0.33.0": ("tuple", "tuple", 256, True, {"pickle": 1, "cloudpickle": 2, "raw_view": 3}),
    }
    for version, (tensor, ndarray, threshold, configurable, codes) in expected.items():
        surface = load(version).surface("tensors")
        assert (surface.tensor_form, surface.ndarray_form, surface.threshold_default,
                surface.threshold_configurable) == (tensor, ndarray, threshold, configurable)
        assert {e.name: e.code for e in surface.ext_codes} == codes, version
    assert "tensors.pickle-form" in load("0.7.3").clauses
    assert "tensors.torch-dtype-name" not in load("0.8.4").clauses
    assert "tensors.pickle-form" not in load("0.8.4").clauses


@pytest.mark.parametrize(("version", "family", "where"), [
    ("0.7.3", "tensor", "EngineCoreOutput.new_prompt_logprobs_tensors.logprob_token_ids"),
    ("0.9.1", "tensor", "EngineCoreOutput.new_prompt_logprobs_tensors.logprob_token_ids"),
    ("0.9.2", "tensor", "EngineCoreOutput.pooling_output"),
    ("0.11.1", "ndarray", "EngineCoreOutput.new_logprobs.logprob_token_ids"),
    ("0.13.0", "ndarray", "EngineCoreOutput.new_logprobs.logprob_token_ids"),
    ("0.14.0", "ndarray", "EngineCoreOutput.routed_experts"),
])
def test_the_carrier_is_a_field_the_release_has(version: str, family: str, where: str) -> None:
    from enginewire.conformance.checks._carriers import carrier

    assert carrier(load(version), family).where == where


#: Tuple checks that state a tensor's dtype by its torch name and run in 0.8.4's numpy form
#: (the name written as numpy's dtype.str).
NUMPY_FORM_CHECKS = ("tuple-layout", "empty", "non-contiguous-c-order",
                     "decoder-accepts-large-inline", "decoder-accepts-small-out-of-band",
                     "index-zero-rejected", "index-shared-rejected",
                     "unreferenced-frame-rejected", "bytes-short-rejected")


@pytest.mark.parametrize(("version", "pattern"), [
    ("0.7.3", "codec/tensor/pickle-form"),
    ("0.7.3", "codec/tensor/pickle-form-decode"),
    ("0.7.3", "codec/tensor/dtype/float32"),
    ("0.8.3", "codec/tensor/dtype/int64"),
    ("0.8.4", "codec/tensor/numpy-form"),
    ("0.8.4", "codec/tensor/dtype/float32"),
    ("0.8.4", "codec/tensor/fixed-threshold-minus-one"),
    ("0.8.4", "codec/tensor/fixed-threshold-exact"),
    ("0.8.4", "codec/tensor/shape-negative-rejected"),
    *[("0.8.4", f"codec/tensor/{name}") for name in NUMPY_FORM_CHECKS],
    ("0.9.1", "codec/tensor/tuple-layout"),                # in new_prompt_logprobs_tensors
    ("0.9.1", "codec/tensor/dtype/bfloat16"),
    ("0.9.1", "codec/tensor/inline-threshold-exact"),
    ("0.9.1", "codec/tensor/index-shared-rejected"),       # two LogprobsTensors fields
    ("0.12.0", "codec/ndarray/dtype/le-f4"),               # in new_logprobs
    ("0.12.0", "codec/ndarray/inline-threshold-exact"),
    ("0.12.0", "codec/tensor/type-from-schema"),
])
def test_tensor_checks_run_at_older_releases(version: str, pattern: str) -> None:
    status, message = _status(version, pattern)
    assert status == PASSED, message


def _newest_form_codec(codec_target: CodecTarget, version: str, form: str = "tuple") -> object:
    """A reference codec for ``version`` that writes and reads tensors in ``form`` (by default
    the newest: the [dtype, shape, data] tuple with the torch name, threshold 256)."""
    from enginewire.reference.codec import Codec

    class NewestForm(Codec):
        def __init__(self, **options):  # type: ignore[no-untyped-def]
            super().__init__(**options)
            self.tensor_form = form
            self._raw_view_ext = 3
            if options.get("threshold") is None:
                self.threshold = 256

    return codec_target(NewestForm, version)


@pytest.mark.parametrize(("version", "pattern", "form"), [
    ("0.7.3", "codec/tensor/pickle-form", "tuple"),
    ("0.7.3", "codec/tensor/dtype/float32", "tuple"),
    ("0.8.3", "codec/tensor/dtype/int64", "tuple"),
    ("0.8.4", "codec/tensor/numpy-form", "tuple"),
    ("0.8.4", "codec/tensor/dtype/float32", "tuple"),
    ("0.8.4", "codec/tensor/fixed-threshold-minus-one", "tuple"),  # 511 bytes >= 256
    *[("0.8.4", f"codec/tensor/{name}", "tuple") for name in NUMPY_FORM_CHECKS],
    ("0.9.1", "codec/tensor/dtype/float32", "numpy"),
    ("0.9.1", "codec/tensor/tuple-layout", "numpy"),
])
def test_a_codec_writing_another_tensor_form_fails(version: str, pattern: str, form: str,
                                                    codec_target: CodecTarget) -> None:
    """Power: a codec built for X that writes tensors in another release's form (the newest
    tuple at 0.7.3-0.8.4, 0.8.4's numpy view at 0.9.1, in its nested carrier) fails X's
    tensor checks."""
    status, message = _status(version, pattern, _newest_form_codec(codec_target, version, form))
    assert status == FAILED, message


#: The checks of the ndarray pickle fallback (tensors.ndarray-pickle-fallback).
FALLBACK_CHECKS = ("pickle-fallback", "pickle-fallback-decode")


def _fallback_releases() -> list[str]:
    """The releases whose ndarray form is the pickle fallback, per the spec's history."""
    return [v for v in ("0.7.3", "0.8.3", "0.8.4", "0.8.5")
            if load(v).surface("tensors").ndarray_form == "pickle"]


@pytest.mark.parametrize("name", FALLBACK_CHECKS)
def test_the_ndarray_pickle_fallback_checks_follow_the_ndarray_form(name: str) -> None:
    """They pass on the reference wherever the history says an ndarray falls to pickle
    (0.7.3-0.8.3), and are NOT APPLICABLE, naming the release's own form, where it has one."""
    assert _fallback_releases() == ["0.7.3", "0.8.3"]
    for version in _fallback_releases():
        status, message = _status(version, f"codec/ndarray/{name}")
        assert status == PASSED, (version, message)
    status, message = _status("0.8.4", f"codec/ndarray/{name}")
    assert status == NOT_APPLICABLE and "ndarray_form 'tuple'" in message, message


def _broken_fallbacks() -> dict[str, type]:
    """Codecs for 0.7.3 each wrong about the ndarray pickle fallback in one way."""


    from enginewire.reference.codec import Codec
    from enginewire.reference.errors import TensorError

    class TupleArrays(Codec):
        """Writes and reads an ndarray in the newest tuple form."""

        def __init__(self, **options):  # type: ignore[no-untyped-def]
            super().__init__(**options)
            self.ndarray_form = "tuple"

    class OptInOnly(Codec):
        """Treats an array's pickle like any pickle: only with the opt-in."""

        def _encode_ndarray(self, value, aux):  # type: ignore[no-untyped-def]
            if self.allow_insecure:
                return self._pickle(value)
            raise TensorError("structs.no-implicit-pickle", "pickle needs the opt-in")

        def _ext_hook(self, code, data):  # type: ignore[no-untyped-def]
            if code == self._pickle_ext and not self.allow_insecure:
                raise TensorError("tensors.ext-pickle-opt-in", "pickle needs the opt-in")
            return super()._ext_hook(code, data)

    return {"tuple": TupleArrays, "opt-in-only": OptInOnly}


@pytest.mark.parametrize(("name", "broken"), [
    ("pickle-fallback", "tuple"),
    ("pickle-fallback", "opt-in-only"),
    ("pickle-fallback-decode", "opt-in-only"),
])
def test_a_codec_wrong_about_the_ndarray_pickle_fallback_fails(
        name: str, broken: str, codec_target: CodecTarget) -> None:
    """Power: a codec for 0.7.3 that writes an ndarray in the tuple form fails the round trip,
    and one that allows an array's pickle only with an opt-in the release does not have fails
    both fallback checks (the reference passes: the test above)."""
    codec = codec_target(_broken_fallbacks()[broken], "0.7.3")
    status, message = _status("0.7.3", f"codec/ndarray/{name}", codec)
    assert status == FAILED, message


def test_a_pickle_form_decoder_that_runs_any_pickle_is_told_apart() -> None:
    """The reference reads the pickle form without running code: a stream naming another
    global is rejected with tensors.pickle-form."""
    import pickle

    import msgspec

    from enginewire.conformance.checks._carriers import carrier
    from enginewire.reference.codec import Codec
    from enginewire.reference.errors import ProtocolError

    spec = load("0.7.3")
    wire = [None] * len(spec.struct("EngineCoreOutput").fields)
    wire[:2] = ["r", [1]]
    carrier(spec, "tensor").put(spec, wire, msgspec.msgpack.Ext(1, pickle.dumps(print)))
    with pytest.raises(ProtocolError) as caught:
        Codec(version="0.7.3").decode("EngineCoreOutput", [msgspec.msgpack.encode(wire)])
    assert caught.value.clause == "tensors.pickle-form"


def _derived_releases() -> list[str]:
    import tomllib

    from enginewire.spec.loader import DATA_DIR

    with (DATA_DIR / "history" / "releases.toml").open("rb") as handle:
        return list(tomllib.load(handle)["releases"])


#: Every derived release: the reference built for each passes every applicable codec check
#: (the codec checks of all of them run in well under a minute).
SWEEP = _derived_releases()


def test_the_sweep_covers_every_derived_release() -> None:
    assert SWEEP[0] == "0.7.3" and SWEEP[-1] == "0.33.0" and len(SWEEP) == len(set(SWEEP))


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
    # Every refusal the reference makes is backed by a valid message of its kind.
    assert [r.check.id for r in results if r.status == NOT_IMPLEMENTED] == []


# --- the insecure-serialization opt-in per release ------------------------------------------


def test_the_pickle_opt_in_follows_the_release() -> None:
    """load(X) carries X's opt-in from history/constants.toml [[pickle_opt_in]]: none before
    0.9.0 (the opt-in clauses do not hold there, tensors.pickle-without-opt-in does, and the
    pickle extension types are allowed always), VLLM_ALLOW_INSECURE_SERIALIZATION from 0.9.0;
    the reference codec follows it."""
    from enginewire.reference.codec import Codec
    from enginewire.spec.history.release_facts import pickle_opt_in_since

    assert pickle_opt_in_since() == ("0.9.0", "VLLM_ALLOW_INSECURE_SERIALIZATION")
    for version, setting in (("0.7.3", None), ("0.8.3", None), ("0.8.5", None),
                             ("0.9.0", "VLLM_ALLOW_INSECURE_SERIALIZATION"),
                             ("0.33.0", "VLLM_ALLOW_INSECURE_SERIALIZATION")):
        spec = load(version)
        surface = spec.surface("tensors")
        assert surface.pickle_opt_in == setting, version
        opt_in = setting is not None
        for clause in ("tensors.ext-pickle-opt-in", "tensors.insecure-function-cloudpickle",
                       "structs.no-implicit-pickle"):
            assert (clause in spec.clauses) == opt_in, (version, clause)
        assert ("tensors.pickle-without-opt-in" in spec.clauses) != opt_in, version
        pickle_ext = next(e for e in surface.ext_codes if e.name == "pickle")
        assert pickle_ext.allowed.startswith("always") != opt_in, (version, pickle_ext)
        assert Codec(version=version).pickle_allowed != opt_in, version
        assert Codec(version=version, allow_insecure=True).pickle_allowed


def test_a_release_without_the_opt_in_pickles_both_ways() -> None:
    """The reference for 0.8.5 encodes a Fraction in utility args as Ext 1 and decodes it
    back, and for 0.7.3 sends an ndarray (its pickle fallback) with no insecure option; the
    reference for 0.9.0 refuses both without the option."""
    import fractions

    import numpy as np

    from enginewire.reference.codec import Codec
    from enginewire.reference.errors import ProtocolError

    value = (1, "m", (fractions.Fraction(1, 3),))
    frames = Codec(version="0.8.5").encode("utility", value)
    assert Codec(version="0.8.5").decode("utility", frames)[2] == (fractions.Fraction(1, 3),)
    with pytest.raises(ProtocolError) as caught:
        Codec(version="0.9.0").encode("utility", value)
    assert caught.value.clause == "structs.no-implicit-pickle"
    with pytest.raises(ProtocolError) as caught:
        Codec(version="0.9.0").decode("utility", frames)
    assert caught.value.clause == "tensors.ext-pickle-opt-in"
    array = np.arange(3, dtype="<i8")
    sent = Codec(version="0.7.3").encode("utility", (1, "m", (array,)))
    [got] = Codec(version="0.7.3").decode("utility", sent)[2]
    assert np.array_equal(got, array)


@pytest.mark.parametrize("version", ["0.7.3", "0.8.5"])
@pytest.mark.parametrize("pattern", ["codec/ext/pickle-in-any-rejected",
                                     "codec/ext/pickle-rejected",
                                     "codec/ext/insecure-function-cloudpickle",
                                     "codec/no-implicit-pickle"])
def test_opt_in_checks_are_not_applicable_before_the_release_that_introduced_it(
        version: str, pattern: str) -> None:
    status, message = _status(version, pattern)
    assert status == NOT_APPLICABLE, (status, message)
    assert (f"vLLM {version} has no insecure-serialization opt-in "
            "(VLLM_ALLOW_INSECURE_SERIALIZATION came in vLLM 0.9.0)") in message, message


def _opt_in_demanding_codec(version: str) -> object:
    """A reference codec for ``version`` that demands the opt-in whatever the release:
    it refuses to pickle and unpickle unless built with the insecure option (the newest
    releases' behaviour, wrong before 0.9.0)."""
    from enginewire.conformance.targets import reference as reference_module
    from enginewire.reference.codec import Codec

    class Demanding(Codec):
        def __init__(self, **options):  # type: ignore[no-untyped-def]
            super().__init__(**options)
            self.pickle_allowed = self.allow_insecure

    class DemandingCodec(reference_module.ReferenceCodec):
        def make_codec(self, threshold, insecure):  # type: ignore[no-untyped-def]
            return Demanding(threshold=threshold, allow_insecure=insecure,
                             version=self.version)

    return DemandingCodec(version=version)


@pytest.mark.parametrize("version", ["0.7.3", "0.8.3", "0.8.5"])
@pytest.mark.parametrize("direction", ["encode", "decode"])
def test_a_codec_that_demands_the_opt_in_fails_before_it_existed(version: str,
                                                                   direction: str) -> None:
    """Power: at a release without the opt-in the reference passes
    codec/ext/pickle-without-opt-in/*, and a codec that still demands the opt-in fails them;
    from 0.9.0 on they are NOT APPLICABLE, naming the opt-in."""
    pattern = f"codec/ext/pickle-without-opt-in/{direction}"
    status, message = _status(version, pattern)
    assert status == PASSED, message
    status, message = _status(version, pattern, _opt_in_demanding_codec(version))
    assert status == FAILED, message
    assert f"vLLM {version}" in message and "without any opt-in" in message, message
    status, message = _status("0.9.0", pattern)
    assert status == NOT_APPLICABLE and "only with the opt-in " \
        "VLLM_ALLOW_INSECURE_SERIALIZATION, from vLLM 0.9.0 on" in message, message


# --- the UTILITY payload of 0.7.3-0.9.0 ---------------------------------------------------------


def _utility_codec(version: str, accept: str) -> object:
    """A reference codec for ``version`` whose UTILITY decoder is lax in one way:
    ``short`` fills a payload one item short with empty args, ``call-id`` reads a string
    call_id as its integer. Each still rejects the newest layout's bad payload at 0.9.0
    (a four-item payload is too long there, and [0, 7, 'is_sleeping'] has an int as
    method), which is what the checks sent before they followed the release."""
    import msgspec

    from enginewire.conformance.targets import reference as reference_module
    from enginewire.spec.history.release_facts import utility_payload_at

    items = utility_payload_at(version)

    class Lax(reference_module.ReferenceCodec):
        def decode(self, kind, frames):  # type: ignore[no-untyped-def]
            if kind == "utility" and len(frames) == 2:
                payload = msgspec.msgpack.decode(bytes(frames[1]))
                if accept == "short" and len(payload) == len(items) - 1:
                    payload = [*payload, []]
                if accept == "call-id" and len(payload) == len(items):
                    at = items.index("call_id")
                    if isinstance(payload[at], str) and payload[at].isdigit():
                        payload[at] = int(payload[at])
                frames = [frames[0], msgspec.msgpack.encode(payload)]
            return super().decode(kind, frames)

    return Lax(version=version)


@pytest.mark.parametrize(("pattern", "accept", "said"), [
    ("codec/reject/utility-short", "short",
     "a utility payload of 2 items (call_id, method), one short of the release's 3 "
     "(call_id, method, args)"),
    ("codec/reject/utility-call-id-string", "call-id",
     "a utility payload whose call_id (item 0 of call_id, method, args) is the string '7'"),
])
def test_utility_payload_checks_follow_the_release(pattern: str, accept: str,
                                                   said: str) -> None:
    """At 0.9.0 the UTILITY payload is [call_id, method, args]: the reference passes both
    checks on evidence (a valid UTILITY of the release decodes), and a codec that accepts
    the release's bad payload fails with a message that describes that payload."""
    import msgspec

    from enginewire.reference.errors import ProtocolError

    status, message = _status("0.9.0", pattern)
    assert status == PASSED, message
    lax = _utility_codec("0.9.0", accept)
    status, message = _status("0.9.0", pattern, lax)
    assert status == FAILED, message
    assert message.startswith(f"utility: {said}: decode('utility') accepted"), message
    old = [0, 7, "is_sleeping"] if accept == "short" else [0, "7", "is_sleeping", []]
    type_byte = bytes(load("0.9.0").request_type_byte("UTILITY"))
    with pytest.raises(ProtocolError) as caught:  # what the checks sent before: not caught
        lax.decode("utility", [type_byte, msgspec.msgpack.encode(old)])  # type: ignore[attr-defined]
    assert caught.value.clause == "frames.payload-matches-type", caught.value
    description = select(all_checks(), patterns=[pattern])[0].description
    assert "three" not in description and "four" not in description


# --- valid samples of every message at the releases before the handshake and coordinator -----

#: 0.7.3 and 0.8.4 (no HELLO/READY handshake, no ENGINE_CORE_DEAD, no DP coordinator) and
#: 0.9.0 (HELLO on the input socket and ENGINE_CORE_DEAD, still no DP coordinator).
OLD_RELEASES = ["0.7.3", "0.8.4", "0.9.0"]

#: kind -> the reject checks of that kind which found no valid sample at these releases
#: (NOT IMPLEMENTED against the reference), and the releases among them that have the kind.
SAMPLED_REJECTS: dict[str, tuple[list[str], list[str]]] = {
    "abort": (["codec/reject/abort-not-array", "codec/reject/abort-not-strings",
               "codec/reject/extra-frame-after-abort",
               "codec/reject/type-frame-empty", "codec/reject/wrong-type-for-kind"],
              OLD_RELEASES),
    "engine_core_dead": (["codec/reject/engine-core-dead-extra-frame",
                          "codec/reject/engine-core-dead-wrong-bytes"], ["0.9.0"]),
    "hello": (["codec/reject/hello-not-a-map", "codec/reject/hello-two-frames"], ["0.9.0"]),
}


@pytest.mark.parametrize("version", OLD_RELEASES)
def test_every_message_of_an_old_release_has_a_valid_sample(version: str) -> None:
    """valid_sample gives every message kind the release has a message the reference of that
    release decodes, and says NOT APPLICABLE (NotInRelease) for a kind it lacks."""
    from enginewire.conformance.checks._helpers import valid_sample
    from enginewire.conformance.framework.registry import NotInRelease
    from enginewire.conformance.targets.reference import ReferenceCodec

    spec = load(version)
    codec = ReferenceCodec(version=version)
    sampled, lacking, none = [], [], []
    for message in spec.surface("frames").messages:
        try:
            sample = valid_sample(message.kind, spec)
        except NotInRelease:
            lacking.append(message.kind)
            continue
        if sample is None:
            none.append(message.kind)
            continue
        codec.decode(message.kind, list(sample[1]))  # raises where the sample is not valid
        sampled.append(message.kind)
    assert none == []
    assert {"add", "abort", "utility", "outputs"} <= set(sampled)
    assert {"coordinator_subscribe", "stats_subscribe", "start_dp_wave"} <= set(lacking)
    has = {kind for kind, (_checks, releases) in SAMPLED_REJECTS.items()
           if version in releases}
    assert has <= set(sampled) and not (set(SAMPLED_REJECTS) - has) & set(sampled)


def _results(version: str, patterns: list[str], codec: object = None) -> dict[str, Any]:
    """The results of the checks ``patterns`` against the reference built for ``version``
    (its codec replaced by ``codec`` where given), by check id."""
    target = reference_target(version)
    if codec is not None:
        target.codec = codec
    spec = load(version)
    try:
        return {item.id: run_check(item, target, spec)
                for item in select(all_checks(), patterns=patterns)}
    finally:
        target.close()


@pytest.mark.parametrize("version", OLD_RELEASES)
def test_no_message_check_lacks_a_sample_at_an_old_release(version: str) -> None:
    """Against the reference, no message or reject check of an old release is NOT
    IMPLEMENTED: each refusal is backed by a valid message of the release, or the release
    lacks the kind and the check is NOT APPLICABLE."""
    results = _results(version, ["codec/message/*", "codec/reject/*"])
    assert [i for i, r in results.items() if r.status == NOT_IMPLEMENTED] == []
    assert [i for i, r in results.items() if r.status == FAILED] == []
    for checks, releases in SAMPLED_REJECTS.values():
        want = PASSED if version in releases else NOT_APPLICABLE
        assert {i: results[i].status for i in checks} == dict.fromkeys(checks, want)
    assert results["codec/message/unsubscribe-told-apart"].status == NOT_APPLICABLE
    # The WAKEUP sentinel came in 0.18.0 (request_types.toml), EXECUTOR_FAILED in 0.8.5.
    assert results["codec/reject/sentinel-wakeup"].status == NOT_APPLICABLE
    assert results["codec/reject/sentinel-executor-failed"].status == (
        NOT_APPLICABLE if version in ("0.7.3", "0.8.4") else PASSED)


def _accepting(version: str, kind: str) -> object:
    """A reference codec for ``version`` that accepts whatever it is given as ``kind``:
    frames it would reject decode as nothing. A valid message of the kind still decodes, so
    the checks have their evidence that it implements the kind."""
    from enginewire.conformance.targets import reference as reference_module

    class Accepting(reference_module.ReferenceCodec):
        def decode(self, asked, frames):  # type: ignore[no-untyped-def]
            try:
                return super().decode(asked, frames)
            except Exception:
                if asked != kind:
                    raise
                return None

    return Accepting(version=version)


@pytest.mark.parametrize(("version", "kind"), [
    (version, kind) for kind, (_checks, releases) in SAMPLED_REJECTS.items()
    for version in releases])
def test_reject_checks_now_run_at_old_releases_fail_a_codec_that_accepts(version: str,
                                                                         kind: str) -> None:
    checks, _releases = SAMPLED_REJECTS[kind]
    results = _results(version, checks, _accepting(version, kind))
    assert {i: r.status for i, r in results.items()} == dict.fromkeys(checks, FAILED)
    assert all(f"decode({kind!r}) accepted the frames" in r.message for r in results.values())


def test_unsubscribe_told_apart_runs_once_the_coordinator_exists() -> None:
    """0.9.1 has the DP coordinator: the check runs there and passes on the reference, and
    fails a codec that takes the unsubscription for a subscription."""
    assert _results("0.9.1", ["codec/message/unsubscribe-told-apart"])[
        "codec/message/unsubscribe-told-apart"].status == PASSED
    result = _results("0.9.1", ["codec/message/unsubscribe-told-apart"],
                      _accepting("0.9.1", "coordinator_subscribe"))
    assert result["codec/message/unsubscribe-told-apart"].status == FAILED
