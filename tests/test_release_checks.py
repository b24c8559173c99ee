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
FALLBACK_CHECKS = ("pickle-fallback", "pickle-fallback-decode", "pickle-fallback-other-rejected",
                   "pickle-fallback-object-refused")


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
    import pickle

    import msgspec

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

    class TrustsPickle(Codec):
        """Unpickles whatever the pickle extension holds, as vLLM 0.7.3 does."""

        def _ext_hook(self, code, data):  # type: ignore[no-untyped-def]
            if code == self._pickle_ext:
                return pickle.loads(data)  # noqa: S301 - the streams are the test's own
            return super()._ext_hook(code, data)

    class PicklesObjects(Codec):
        """Pickles an object array too."""

        def _encode_ndarray(self, value, aux):  # type: ignore[no-untyped-def]
            return msgspec.msgpack.Ext(self._pickle_ext, pickle.dumps(value))

    return {"tuple": TupleArrays, "opt-in-only": OptInOnly, "trusts-pickle": TrustsPickle,
            "pickles-objects": PicklesObjects}


@pytest.mark.parametrize(("name", "broken"), [
    ("pickle-fallback", "tuple"),
    ("pickle-fallback", "opt-in-only"),
    ("pickle-fallback-decode", "tuple"),
    ("pickle-fallback-decode", "opt-in-only"),
    ("pickle-fallback-other-rejected", "trusts-pickle"),
    ("pickle-fallback-object-refused", "pickles-objects"),
])
def test_a_codec_wrong_about_the_ndarray_pickle_fallback_fails(
        name: str, broken: str, codec_target: CodecTarget) -> None:
    """Power: a codec for 0.7.3 that writes an ndarray in the tuple form, allows an array's
    pickle only with the opt-in, unpickles any stream, or pickles an object array fails the
    fallback check about it (the reference passes: the test above)."""
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
