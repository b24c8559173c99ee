"""Codec checks: tensors and arrays, enums, maps, floats, nil, utility results, multimodal items,
insecure serialization, and every message kind's frames (request types, handshake messages,
outputs, ENGINE_CORE_DEAD), with malformed input for each.

Tensor checks carry their tensor (or array) in the release's carrier field
(:mod:`._carriers`: ``EngineCoreOutput.pooling_output`` and ``routed_experts`` where the
release has them, else a tensor field of a struct an output field reaches); malformed tuples
are put there by hand with msgspec and handed to ``decode("EngineCoreOutput", frames)``.
Checks of the ``[dtype, shape, data]`` tuple run in the ``numpy`` form too (vLLM 0.8.4 sends
a tensor as the tuple of its numpy view): they state a tensor's dtype by its torch name and
:func:`._carriers.tuple_dtype` writes it as the release does (numpy's dtype.str at 0.8.4). They
are NOT APPLICABLE where the release has no tuple (``tensor_form`` ``pickle``: vLLM 0.7.3-0.8.3
pickle a tensor's numpy view into an extension type, and an ndarray falls to the generic pickle
extension), where their subject is the torch name itself (the torch dtype vocabulary, IPC
handles), and where the release lacks the dtype (numpy has no bfloat16). The earlier forms have
checks of their own.
"""

from __future__ import annotations

import fractions
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from enginewire.conformance.checks._carriers import (
    FORM_NAMES,
    carrier,
    carriers,
    numpy_twin,
    require_form,
    tensor_form,
    tuple_dtype,
)
from enginewire.conformance.checks._helpers import (
    MESSAGE_SAMPLES,
    as_bytes,
    decode,
    encode,
    expect_encode_refused,
    expect_rejection,
    expect_value,
    expect_wire,
    field_value,
    message_sample,
    message_spec,
    ready_form,
    require_message,
    require_rejection,
)
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.evidence import in_release
from enginewire.conformance.framework.registry import (
    CheckFailure,
    CheckSkip,
    NotInRelease,
    Reproduction,
    check,
    require_field,
)
from enginewire.conformance.oracle.samples import Sampler, minimal_request
from enginewire.conformance.oracle.values import TensorValue, neutral, tensor_value
from enginewire.conformance.oracle.wire import expected_wire, raw_decode, show
from enginewire.conformance.peers.zmq_peers import request_type_frame
from enginewire.conformance.targets.contract import CodecSurface
from enginewire.spec import load
from enginewire.spec.history.release_facts import (
    pickle_free_gap,
    pickle_opt_in_gap,
    utility_fields,
    utility_payload_at,
    utility_value,
)

Ext = msgspec.msgpack.Ext
#: The extension type codes (tensors surface, ext_codes).
RAW_VIEW = load().ext_code("raw_view")
PICKLE = load().ext_code("pickle")
CLOUDPICKLE = load().ext_code("cloudpickle")
#: A rejection may also cite the general rule that a payload must match its type.
GENERAL = "frames.payload-matches-type"
OUTPUT = "EngineCoreOutput"


# --- helpers -----------------------------------------------------------------------------


def _request(spec: Any, **fields: Any) -> dict[str, Any]:
    """:func:`minimal_request` laid out as the run's release sends it (NOT APPLICABLE when
    ``fields`` set something the release lacks)."""
    return in_release(minimal_request(**fields), "EngineCoreRequest", spec)


def _index(spec: Any, struct: str, field: str) -> int:
    """The position of ``field`` in ``struct``; NOT APPLICABLE when the release lacks it."""
    require_field(spec, struct, field)
    return [f.name for f in spec.struct(struct).fields].index(field)


def _output(**fields: Any) -> dict[str, Any]:
    return {"request_id": "req-t", "new_token_ids": [1], **fields}


def _threshold(spec: Any) -> int:
    """The inline threshold of the tensors surface; NOT APPLICABLE for a release that has
    none (``history/constants.toml`` ``tensor_threshold``: vLLM 0.7.3-0.8.3 send a tensor as
    an extension type wrapping a pickle stream, with nothing inline or out of band)."""
    threshold = spec.surface("tensors").threshold_default
    if threshold is None:
        form = tensor_form(spec)
        raise NotInRelease(f"vLLM {spec.version} has no inline threshold for tensors: it "
                           f"sends a tensor as {FORM_NAMES[form]} (tensors surface, "
                           f"tensor_form {form!r})")
    return int(threshold)


def _require_opt_in(spec: Any) -> None:
    """NOT APPLICABLE where the release has no insecure-serialization opt-in (the tensors
    surface's ``pickle_opt_in``, from history/constants.toml ``[[pickle_opt_in]]``; the
    reason names the release that introduced it): there pickle travels without one, which
    the codec/ext/pickle-without-opt-in checks hold the target to."""
    gap = pickle_opt_in_gap(spec)
    if gap is not None:
        raise NotInRelease(gap)


def _uint8(n: int) -> Any:
    import torch

    return (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8)


def _uint8_array(n: int) -> Any:
    import numpy as np

    return (np.arange(n) % 251).astype("|u1")


def _carry(spec: Any, family: str, value: Any) -> dict[str, Any]:
    """A neutral EngineCoreOutput carrying ``value`` in the release's ``family`` carrier
    (NOT APPLICABLE where the release has none)."""
    return carrier(spec, family).output(spec, value)


def _tuple_in(frames: list[bytes], spec: Any, family: str = "tensor") -> Any:
    """The ``[dtype, shape, data]`` tuple in the carrier of an encoded EngineCoreOutput
    (NOT APPLICABLE where the release writes ``family`` in no tuple form)."""
    require_form(spec, family, "tuple", "numpy")
    return carrier(spec, family).entry(frames)


def _in_form(spec: Any, data_tuple: Any, family: str = "tensor",
             clauses: Sequence[str] = ()) -> Any:
    """``data_tuple`` (a tensor's dtype its torch name) as the release writes it: a tensor's
    dtype through :func:`tuple_dtype` (numpy's dtype.str in the numpy form, vLLM 0.8.4), so
    that a malformed tuple is malformed only where it was meant to be. NOT APPLICABLE where
    the release writes ``family`` in no tuple form, and for a check of ``clauses`` only the
    torch-named tuple has (the torch dtype name, an IPC handle's map) outside that form."""
    if family != "tensor":
        require_form(spec, family, "tuple")
        return data_tuple
    if set(clauses) & _TUPLE_FORM_ONLY:
        form = tensor_form(spec)
        if form != "tuple":
            raise NotInRelease(f"vLLM {spec.version} sends no torch dtype name and no IPC "
                               f"handle: a tensor travels as {FORM_NAMES[form]} (tensors "
                               f"surface, tensor_form {form!r})")
        return data_tuple
    require_form(spec, family, "tuple", "numpy")
    if isinstance(data_tuple, list) and data_tuple and isinstance(data_tuple[0], str):
        return [tuple_dtype(spec, data_tuple[0]), *data_tuple[1:]]
    return data_tuple


def _output_frames(spec: Any, data_tuple: Any, oob: list[bytes] | tuple = (),
                   family: str = "tensor", clauses: Sequence[str] = ()) -> list[bytes]:
    """An EngineCoreOutput whose ``family`` carrier holds the tuple ``data_tuple``, as given
    but for the dtype the release writes (:func:`_in_form`)."""
    entry = _in_form(spec, data_tuple, family, clauses)
    return carrier(spec, family).frames(spec, entry, oob)


def _decoded_tensor(codec: Any, frames: list[bytes], family: str = "tensor",
                    spec: Any = None) -> Any:
    value = decode(codec, OUTPUT, frames)
    run_spec = spec if spec is not None else getattr(codec, "run_spec", None) or load()
    return neutral(carrier(run_spec, family).decoded(value))


def _expect_placement(frames: list[bytes], spec: Any, value: Any, *, inline: bool,
                      family: str, threshold: int, rule: str) -> None:
    """The ``family`` carrier of ``frames`` holds ``value`` inline (or out of band as index
    1, its bytes in frame 1). The placement rule of the tuple form: the numpy form (vLLM 0.8.4)
    has its own, the fixed threshold."""
    if tensor_form(spec, family) == "numpy":
        raise NotInRelease(f"vLLM {spec.version} places a tensor by a fixed threshold of "
                           f"{spec.surface('tensors').threshold_default} bytes, a 0-d one "
                           "always inline (tensors.fixed-threshold: the "
                           "codec/tensor/fixed-threshold-* checks)")
    require_form(spec, family, "tuple")
    entry = _tuple_in(frames, spec, family)
    tv = tensor_value(value)
    notes = {"nbytes": len(tv.data), "threshold": threshold, "shape": list(tv.shape)}
    if not isinstance(entry, list) or len(entry) != 3:
        raise CheckFailure(f"{carrier(spec, family).name} is not a [dtype, shape, data] "
                           f"array: {show(entry)}",
                           Reproduction(received=frames, notes=notes))
    data = entry[2]
    if inline:
        if not (isinstance(data, Ext) and data.code == RAW_VIEW):
            raise CheckFailure(
                f"{len(tv.data)} bytes with threshold {threshold} must go inline as "
                f"Ext({RAW_VIEW}) ({rule}), got {show(data)}"[:300],
                Reproduction(received=frames, notes=notes),
            )
        if bytes(data.data) != tv.data:
            raise CheckFailure("inline data bytes differ from the tensor's bytes",
                               Reproduction(received=frames, notes=notes))
        if len(frames) != 1:
            raise CheckFailure(f"inline data but {len(frames) - 1} out-of-band frames",
                               Reproduction(received=frames, notes=notes))
    else:
        if not isinstance(data, int) or isinstance(data, bool) or data != 1:
            raise CheckFailure(
                f"{len(tv.data)} bytes with threshold {threshold} must go out of band as "
                f"index 1 ({rule}), got {show(data)}"[:300],
                Reproduction(received=frames, notes=notes),
            )
        if len(frames) != 2 or frames[1] != tv.data:
            raise CheckFailure(
                "the out-of-band frame must be frame 1 and hold exactly the tensor's bytes",
                Reproduction(received=frames, notes=notes),
            )


def _codec_with(codec: Any, threshold: int) -> Any:
    return codec.with_threshold(threshold)


# --- tensor placement: the inline threshold ------------------------------------------------


def _register_threshold_checks() -> None:
    cases = (("minus-one", -1, True), ("exact", 0, False), ("plus-one", 1, False))
    for family, make, clause in (
        ("tensor", _uint8, "tensors.tensor-inline-below-threshold"),
        ("ndarray", _uint8_array, "tensors.ndarray-inline-below-threshold"),
    ):
        for label, delta, inline in cases:

            def run(codec: Any, ctx: Any, *, _delta: int = delta, _inline: bool = inline,
                    _field: str = family, _make: Any = make, _family: str = family) -> None:
                threshold = _threshold(ctx.spec)
                value = _make(threshold + _delta)
                frames = encode(codec, OUTPUT, _carry(ctx.spec, _field, value))
                _expect_placement(frames, ctx.spec, value, inline=_inline, family=_field,
                                  threshold=threshold, rule="inline iff nbytes < threshold")
                decoded = _decoded_tensor(codec, frames, _field)
                if decoded != tensor_value(value):
                    raise CheckFailure(f"decoded {_family} differs: {decoded!r}",
                                       Reproduction(received=frames))

            check(
                f"codec/{family}/inline-threshold-{label}",
                clauses=[clause],
                surface="codec",
                description=f"a {family} of threshold{delta:+d} bytes goes "
                            f"{'inline' if inline else 'out of band'} (default threshold)",
            )(run)

        for threshold, size, inline, label in ((16, 15, True, "custom-minus-one"),
                                                (16, 16, False, "custom-exact"),
                                                (1024, 512, True, "custom-raised")):

            def run_custom(codec: Any, ctx: Any, *, _t: int = threshold, _n: int = size,
                           _inline: bool = inline, _field: str = family,
                           _make: Any = make) -> None:
                configured = _codec_with(codec, _t)
                value = _make(_n)
                frames = encode(configured, OUTPUT, _carry(ctx.spec, _field, value))
                _expect_placement(frames, ctx.spec, value, inline=_inline, family=_field,
                                  threshold=_t, rule="inline iff nbytes < threshold")

            check(
                f"codec/{family}/threshold-{label}",
                clauses=[clause, "tensors.threshold-configurable"],
                surface="codec",
                requires=["codec.threshold"],
                description=f"with threshold {threshold}, a {size}-byte {family} goes "
                            f"{'inline' if inline else 'out of band'}",
            )(run_custom)


_register_threshold_checks()


# --- placement by bytes, not elements: multi-byte dtypes at the default threshold ------------


def _float32(n: int) -> Any:
    import torch

    return torch.arange(n, dtype=torch.float32) / 8


def _float32_array(n: int) -> Any:
    import numpy as np

    return (np.arange(n) / 8).astype("<f4")


def _register_multibyte_checks() -> None:
    """A float32 tensor of threshold/4 elements is exactly threshold bytes: out of band. A
    codec that counts elements instead of bytes keeps it inline and fails here."""
    for family, make, clause in (
        ("tensor", _float32, "tensors.tensor-inline-below-threshold"),
        ("ndarray", _float32_array, "tensors.ndarray-inline-below-threshold"),
    ):
        for label, delta, inline in (("minus-one", -1, True), ("exact", 0, False)):

            def run(codec: Any, ctx: Any, *, _delta: int = delta, _inline: bool = inline,
                    _field: str = family, _make: Any = make) -> None:
                threshold = _threshold(ctx.spec)
                value = _make(threshold // 4 + _delta)
                frames = encode(codec, OUTPUT, _carry(ctx.spec, _field, value))
                _expect_placement(frames, ctx.spec, value, inline=_inline, family=_field,
                                  threshold=threshold,
                                  rule="inline iff nbytes < threshold, bytes not elements")

            check(
                f"codec/{family}/float32-threshold-{label}",
                clauses=[clause],
                surface="codec",
                description=f"a float32 {family} of threshold/4{delta:+d} elements goes "
                            f"{'inline' if inline else 'out of band'} (bytes, not elements)",
            )(run)

    for label, delta, inline in (("minus-one", -1, True), ("exact", 0, False)):

        def run_request(codec: Any, ctx: Any, *, _delta: int = delta,
                        _inline: bool = inline) -> None:
            threshold = _threshold(ctx.spec)
            value = _float32(threshold // 4 + _delta).reshape(1, -1)
            request = {**minimal_request("req-f32"), "prompt_embeds": value}
            frames = encode(codec, "EngineCoreRequest", request)
            entry = raw_decode(frames[0])
            entry = entry[_index(ctx.spec, "EngineCoreRequest", "prompt_embeds")] if isinstance(
                entry, list) else None
            data = entry[2] if isinstance(entry, list) and len(entry) == 3 else None
            notes = {"nbytes": 4 * value.numel(), "threshold": threshold}
            went_inline = isinstance(data, Ext) and data.code == RAW_VIEW
            went_oob = isinstance(data, int) and not isinstance(data, bool) and data == 1
            if (_inline and not went_inline) or (not _inline and not went_oob):
                raise CheckFailure(
                    f"prompt_embeds of {4 * value.numel()} bytes ({value.numel()} float32) "
                    f"with threshold {threshold} must go "
                    f"{'inline' if _inline else 'out of band'}, got {show(data)}"[:300],
                    Reproduction(received=frames, notes=notes))
            if not _inline and (len(frames) != 2 or frames[1] != tensor_value(value).data):
                raise CheckFailure("the out-of-band frame must hold exactly the tensor's bytes",
                                   Reproduction(received=frames, notes=notes))

        check(
            f"codec/tensor/request-float32-threshold-{label}",
            clauses=["tensors.tensor-inline-below-threshold"],
            surface="codec",
            description=f"a request's float32 prompt_embeds of threshold/4{delta:+d} elements "
                        f"goes {'inline' if inline else 'out of band'}",
        )(run_request)


_register_multibyte_checks()


@check("codec/tensor/with-threshold-default-identical",
       clauses=["tensors.threshold-configurable"], surface="codec",
       requires=["codec.threshold"])
def _with_threshold_default(codec: Any, ctx: Any) -> None:
    """with_threshold(default) is the same implementation and encodes exactly as the codec."""
    threshold = _threshold(ctx.spec)
    configured = codec.with_threshold(threshold)
    own = getattr(codec, "inner", codec)
    other = getattr(configured, "inner", configured)
    reference = ("enginewire.reference", "enginewire.conformance.targets.reference")
    if type(other).__module__.startswith(reference) and not type(own).__module__.startswith(
            reference):
        raise CheckFailure(
            f"with_threshold returned a {type(other).__module__}.{type(other).__name__}, a "
            f"reference codec, not the target's own {type(own).__name__}: the threshold "
            "checks would test the reference")
    values = [
        (OUTPUT, _carry(ctx.spec, "tensor", _float32(threshold // 4))),
        (OUTPUT, _carry(ctx.spec, "ndarray", _float32_array(threshold // 4 - 1))),
        (OUTPUT, _carry(ctx.spec, "tensor", _uint8(threshold - 1))),
        ("EngineCoreRequest", {**minimal_request("req-w"),
                               "prompt_embeds": _float32(threshold // 4).reshape(1, -1)}),
    ]
    for kind, value in values:
        mine = encode(codec, kind, value)
        theirs = encode(configured, kind, value)
        if mine != theirs:
            raise CheckFailure(
                f"{kind}: with_threshold({threshold}) encodes differently from the codec "
                "itself (the default threshold)",
                Reproduction(received=theirs, notes={"codec": [f.hex()[:120] for f in mine]}))


@check("codec/tensor/zero-dim-by-size", clauses=["tensors.tensor-inline-below-threshold"],
       surface="codec", requires=["codec.threshold"])
def _tensor_zero_dim(codec: CodecSurface, ctx: CheckContext) -> None:
    """A 0-d tensor follows the size rule: 8 bytes with threshold 4 go out of band."""
    import torch

    value = torch.tensor(2.5, dtype=torch.float64)
    frames = encode(_codec_with(codec, 4), OUTPUT, _carry(ctx.spec, "tensor", value))
    _expect_placement(frames, ctx.spec, value, inline=False, family="tensor",
                      threshold=4, rule="0-d tensors are placed by size")


@check("codec/ndarray/zero-dim-always-inline", clauses=["tensors.ndarray-inline-below-threshold"],
       surface="codec", requires=["codec.threshold"])
def _ndarray_zero_dim(codec: CodecSurface, ctx: CheckContext) -> None:
    """A 0-d ndarray goes inline whatever the threshold (8 bytes with threshold 1)."""
    import numpy as np

    value = np.array(2.5, dtype="<f8")
    frames = encode(_codec_with(codec, 1), OUTPUT, _carry(ctx.spec, "ndarray", value))
    _expect_placement(frames, ctx.spec, value, inline=True, family="ndarray",
                      threshold=1, rule="a 0-d ndarray is always inline")


@check("codec/tensor/non-cpu-out-of-band", clauses=["tensors.non-cpu-out-of-band"],
       surface="codec")
def _non_cpu(codec: CodecSurface, ctx: CheckContext) -> None:
    """A tensor on an accelerator goes out of band whatever its size, as CPU bytes."""
    import torch

    if not torch.cuda.is_available():
        raise CheckSkip("no CUDA device: a non-CPU tensor cannot be made here")
    value = torch.arange(4, dtype=torch.float32, device="cuda")
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    _expect_placement(frames, ctx.spec, value.cpu(), inline=False, family="tensor",
                      threshold=_threshold(ctx.spec), rule="non-CPU tensors go out of band")


# --- the tuple and its parts ---------------------------------------------------------------


@check("codec/tensor/tuple-layout", clauses=["tensors.tuple-layout", "structs.tensor-fields"],
       surface="codec")
def _tuple_layout(codec: CodecSurface, ctx: CheckContext) -> None:
    """A tensor field travels as [dtype, shape, data]: three elements in that order."""
    import torch

    value = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    entry = _tuple_in(frames, ctx.spec)
    expected: list[Any] = [tuple_dtype(ctx.spec, "float32"), [2, 3],
                           Ext(RAW_VIEW, tensor_value(value).data)]
    if not (isinstance(entry, list) and len(entry) == 3 and entry[0] == expected[0]
            and entry[1] == expected[1] and isinstance(entry[2], Ext)
            and bytes(entry[2].data) == expected[2].data):
        raise CheckFailure(f"expected {show(expected)}, got {show(entry)}"[:400],
                           Reproduction(received=frames))


@check("codec/tensor/type-from-schema", clauses=["tensors.type-from-schema"], surface="codec")
def _type_from_schema(codec: CodecSurface, ctx: CheckContext) -> None:
    """A tensor field decodes to a tensor, an ndarray field to an array, an untyped one stays
    a plain [dtype, shape, bytes] array."""
    import numpy as np
    import torch

    tensor = torch.arange(3, dtype=torch.int16)
    array = np.arange(3, dtype="<i2")
    raw = Ext(RAW_VIEW, array.tobytes())
    tensor_entry = _in_form(ctx.spec, ["int16", [3], raw])
    require_form(ctx.spec, "ndarray", "tuple")
    holds_tensor, holds_array = carrier(ctx.spec, "tensor"), carrier(ctx.spec, "ndarray")
    wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
    holds_tensor.put(ctx.spec, wire, tensor_entry)
    holds_array.put(ctx.spec, wire, ["<i2", [3], raw])
    wire[_index(ctx.spec, OUTPUT, "kv_transfer_params")] = {"t": ["<i2", [3], raw]}
    frames = [msgspec.msgpack.encode(wire)]
    value = decode(codec, OUTPUT, frames)
    got_tensor = neutral(holds_tensor.decoded(value))
    got_array = neutral(holds_array.decoded(value))
    got_any = neutral(field_value(value, "kv_transfer_params"))
    problems = []
    if not (isinstance(got_tensor, TensorValue) and got_tensor.family == "tensor"
            and got_tensor == tensor_value(tensor)):
        problems.append(f"{holds_tensor.name}: expected a torch tensor, got {got_tensor!r}")
    if not (isinstance(got_array, TensorValue) and got_array.family == "ndarray"
            and got_array == tensor_value(array)):
        problems.append(f"{holds_array.name}: expected an ndarray, got {got_array!r}")
    if got_any != {"t": ["<i2", [3], array.tobytes()]}:
        problems.append(f"kv_transfer_params.t: expected the plain array, got {got_any!r}")
    if problems:
        raise CheckFailure("; ".join(problems), Reproduction(sent=frames, received=neutral(value)))


def _sent_dtype(frames: list[bytes], spec: Any) -> Any:
    """The dtype a tensor carrier shows on the wire: the tuple's first element, or in the
    pickle form the dtype.str of the array the extension's pickle stream holds."""
    entry = carrier(spec, "tensor").entry(frames)
    if tensor_form(spec) == "pickle":
        return _pickled_array(entry, spec, frames).dtype.str
    return entry[0] if isinstance(entry, list) and entry else entry


def _pickled_array(entry: Any, spec: Any, frames: list[bytes]) -> Any:
    """The numpy array in a pickle-form tensor entry (tensors.pickle-form): an extension of
    the release's ``tensor`` code whose payload unpickles, resolving only numpy's array
    rebuilders, to an ndarray."""
    from enginewire.reference.errors import ProtocolError
    from enginewire.reference.tensors import unpickle_array

    code = spec.ext_code("tensor")
    if not (isinstance(entry, Ext) and entry.code == code):
        raise CheckFailure(f"a tensor of vLLM {spec.version} travels as msgpack extension "
                           f"type {code} (a pickled numpy array), got {show(entry)}"[:300],
                           Reproduction(received=frames))
    try:
        return unpickle_array(bytes(entry.data))
    except ProtocolError as exc:
        raise CheckFailure(f"the tensor extension's payload: {exc}",
                           Reproduction(received=frames)) from exc


def _dtype_bytes(itemsize: int, is_bool: bool) -> bytes:
    if is_bool:
        return b"\x01\x00\x01\x01"[: 2 * itemsize]
    return bytes(range(1, 2 * itemsize + 1))


def _register_dtype_checks() -> None:
    from enginewire.spec import load

    tensors = load().surface("tensors")
    for name in tensors.torch_dtypes:

        def run(codec: Any, ctx: Any, *, _name: str = name) -> None:
            import torch

            dtype = getattr(torch, _name, None)
            if not isinstance(dtype, torch.dtype):
                raise CheckSkip(f"this torch has no dtype {_name}")
            size = torch.empty((), dtype=dtype).element_size()
            raw = _dtype_bytes(size, dtype == torch.bool)
            value = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
            want = _name if tensor_form(ctx.spec) == "tuple" else numpy_twin(ctx.spec, _name)
            frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
            sent = _sent_dtype(frames, ctx.spec)
            if sent != want:
                raise CheckFailure(
                    f"a torch.{_name} tensor must carry dtype {want!r} at vLLM "
                    f"{ctx.spec.version} ({tensor_form(ctx.spec)} form), got {sent!r}",
                    Reproduction(received=frames),
                )
            decoded = _decoded_tensor(codec, frames)
            if decoded != TensorValue(_name, (2,), raw, "tensor"):
                raise CheckFailure(f"torch.{_name} round trip gave {decoded!r}",
                                   Reproduction(received=frames))

        check(f"codec/tensor/dtype/{name}", clauses=["tensors.torch-dtype-name"],
              surface="codec", description=f"a torch.{name} tensor travels as dtype "
              f"{name!r} and decodes to the same bytes")(run)

    for text in tensors.numpy_dtypes:

        def run_np(codec: Any, ctx: Any, *, _text: str = text) -> None:
            import numpy as np

            dtype = np.dtype(_text)
            raw = _dtype_bytes(dtype.itemsize, dtype.kind == "b")
            value = np.frombuffer(raw, dtype=dtype)
            frames = encode(codec, OUTPUT, _carry(ctx.spec, "ndarray", value))
            entry = _tuple_in(frames, ctx.spec, "ndarray")
            if not isinstance(entry, list) or not entry or entry[0] != _text:
                raise CheckFailure(
                    f"an ndarray of {_text} must carry dtype {_text!r}, got "
                    f"{entry[0] if isinstance(entry, list) and entry else entry!r}",
                    Reproduction(received=frames),
                )
            decoded = _decoded_tensor(codec, frames, "ndarray")
            if decoded != TensorValue(_text, (2,), raw, "ndarray"):
                raise CheckFailure(f"{_text} round trip gave {decoded!r}",
                                   Reproduction(received=frames))

        slug = text.replace("<", "le-").replace(">", "be-").replace("|", "")
        check(f"codec/ndarray/dtype/{slug}", clauses=["tensors.numpy-dtype-str"],
              surface="codec", description=f"an ndarray of {text} travels as dtype "
              f"{text!r} and decodes to the same bytes")(run_np)


_register_dtype_checks()


#: Clauses only the newest tuple form has (a torch dtype name, an IPC handle's map).
_TUPLE_FORM_ONLY = frozenset({"tensors.torch-dtype-name",
                              "tensors.ipc-handle-needs-side-channel"})


_FOUR_FLOATS = bytes(16)

_MALFORMED: list[tuple[str, list[str], str, Any, tuple, str]] = [
    # id suffix, clauses, description, tuple, oob frames, family of the carrier
    ("tensor/dtype-alias-rejected", ["tensors.torch-dtype-name"],
     "the torch alias 'half' as dtype", ["half", [2], Ext(RAW_VIEW, bytes(4))], (),
     "tensor"),
    ("tensor/dtype-prefixed-rejected", ["tensors.torch-dtype-name"],
     "the dtype 'torch.float32' (prefixed)",
     ["torch.float32", [4], Ext(RAW_VIEW, _FOUR_FLOATS)], (), "tensor"),
    ("tensor/dtype-unknown-rejected", ["tensors.torch-dtype-name"],
     "an unknown dtype name (float33)", ["float33", [4], Ext(RAW_VIEW, _FOUR_FLOATS)], (),
     "tensor"),
    ("ndarray/dtype-spelling-rejected", ["tensors.numpy-dtype-str"],
     "the dtype spelling 'int32' (not a dtype.str)",
     ["int32", [4], Ext(RAW_VIEW, _FOUR_FLOATS)], (), "ndarray"),
    ("ndarray/dtype-object-rejected", ["tensors.numpy-dtype-str", "tensors.no-object-arrays"],
     "the object dtype '|O'", ["|O", [2], Ext(RAW_VIEW, bytes(16))], (),
     "ndarray"),
    ("tensor/shape-negative-rejected", ["tensors.shape-non-negative"],
     "a shape of [-1]", ["float32", [-1], Ext(RAW_VIEW, _FOUR_FLOATS)], (), "tensor"),
    ("tensor/shape-bool-rejected", ["tensors.shape-non-negative"],
     "a shape of [true]", ["uint8", [True], Ext(RAW_VIEW, b"\x01")], (), "tensor"),
    ("tensor/shape-float-rejected", ["tensors.shape-non-negative"],
     "a shape of [4.0]", ["float32", [4.0], Ext(RAW_VIEW, _FOUR_FLOATS)], (), "tensor"),
    ("tensor/shape-not-array-rejected", ["tensors.shape-non-negative"],
     "a shape that is an int", ["float32", 4, Ext(RAW_VIEW, _FOUR_FLOATS)], (),
     "tensor"),
    ("tensor/bytes-short-rejected", ["tensors.byte-length-matches-shape"],
     "12 bytes for 4 float32", ["float32", [4], Ext(RAW_VIEW, bytes(12))], (), "tensor"),
    ("tensor/bytes-long-rejected", ["tensors.byte-length-matches-shape"],
     "20 bytes for 4 float32", ["float32", [4], Ext(RAW_VIEW, bytes(20))], (), "tensor"),
    ("ndarray/bytes-short-rejected", ["tensors.byte-length-matches-shape"],
     "12 bytes for 2 <i8", ["<i8", [2], Ext(RAW_VIEW, bytes(12))], (), "ndarray"),
    ("tensor/bytes-oob-short-rejected", ["tensors.byte-length-matches-shape"],
     "an out-of-band frame of 12 bytes for 4 float32", ["float32", [4], 1], (bytes(12),),
     "tensor"),
    ("tensor/data-bin-rejected", ["tensors.data-form"],
     "data as msgpack bin instead of Ext 3", ["float32", [4], _FOUR_FLOATS], (),
     "tensor"),
    ("tensor/data-bool-rejected", ["tensors.data-form"],
     "data true (not an index)", ["float32", [4], True], (_FOUR_FLOATS,), "tensor"),
    ("tensor/data-str-rejected", ["tensors.data-form"],
     "data as a string", ["float32", [4], "abcdabcdabcdabcd"], (), "tensor"),
    ("tensor/data-float-rejected", ["tensors.data-form"],
     "data as a float", ["float32", [4], 1.0], (_FOUR_FLOATS,), "tensor"),
    ("tensor/tuple-short-rejected", ["tensors.tuple-layout"],
     "a two-element tuple", ["float32", [4]], (), "tensor"),
    ("tensor/tuple-long-rejected", ["tensors.tuple-layout"],
     "a four-element tuple", ["float32", [4], Ext(RAW_VIEW, _FOUR_FLOATS), 0], (),
     "tensor"),
    ("tensor/index-negative-rejected", ["tensors.index-in-range"],
     "index -1", ["float32", [4], -1], (_FOUR_FLOATS,), "tensor"),
    ("ndarray/index-negative-rejected", ["tensors.index-in-range"],
     "index -1 (the last frame, read as Python indexes a list)", ["<i8", [2], -1],
     (_FOUR_FLOATS,), "ndarray"),
    ("tensor/index-past-end-rejected", ["tensors.index-in-range", "frames.oob-count-matches"],
     "index 2 with one out-of-band frame", ["float32", [4], 2], (_FOUR_FLOATS,),
     "tensor"),
    ("tensor/index-missing-frame-rejected", ["frames.oob-count-matches",
                                             "tensors.index-in-range"],
     "index 1 with no out-of-band frame", ["float32", [4], 1], (), "tensor"),
    ("tensor/ipc-handle-rejected", ["tensors.ipc-handle-needs-side-channel"],
     "an IPC handle map without a side channel",
     ["float32", [4], {"sender_id": "s", "message_id": 1, "tensor_id": 0}], (),
     "tensor"),
    ("ext/pickle-rejected", ["tensors.ext-pickle-opt-in"],
     "Ext 1 (pickle) without the opt-in", ["float32", [1], Ext(PICKLE, pickle.dumps(4))], (),
     "tensor"),
]


def _register_malformed() -> None:
    for suffix, clauses, what, entry, oob, field in _MALFORMED:

        def run(codec: Any, ctx: Any, *, _entry: Any = entry, _oob: tuple = oob,
                _field: str = field, _what: str = what, _clauses: list = clauses) -> None:
            if "tensors.ext-pickle-opt-in" in _clauses:
                _require_opt_in(ctx.spec)
            frames = _output_frames(ctx.spec, _entry, list(_oob), _field, _clauses)
            expect_rejection(codec, OUTPUT, frames, _clauses,
                             f"{carrier(ctx.spec, _field).name} with {_what}")

        check(f"codec/{suffix}", clauses=clauses, surface="codec",
              description=f"a decoder rejects {what}")(run)


_register_malformed()


@check("codec/tensor/index-zero-rejected", clauses=["tensors.index-in-range"], surface="codec")
def _index_zero(codec: CodecSurface, ctx: CheckContext) -> None:
    """Index 0 (the msgpack frame itself) is rejected, even when its length fits the shape."""
    length = 64
    for _ in range(8):
        frames = _output_frames(ctx.spec, ["uint8", [length], 0])
        if len(frames[0]) == length:
            break
        length = len(frames[0])
    expect_rejection(codec, OUTPUT, frames, "tensors.index-in-range",
                     f"{carrier(ctx.spec, 'tensor').name} with index 0 and shape [{length}] "
                     "(frame 0's length)")


@check("codec/tensor/index-shared-rejected", clauses=["tensors.index-used-once"],
       surface="codec")
def _index_shared(codec: CodecSurface, ctx: CheckContext) -> None:
    """Two values naming the same out-of-band frame are rejected (the release's first two
    tensor carriers)."""
    entry = _in_form(ctx.spec, ["float32", [4], 1])
    found = carriers(ctx.spec, "tensor")
    if len(found) < 2:
        raise NotInRelease(f"vLLM {ctx.spec.version} has fewer than two fields that carry a "
                           "tensor in EngineCoreOutput")
    wire = raw_decode(found[0].frames(ctx.spec, entry)[0])
    found[1].put(ctx.spec, wire, entry)
    frames = [msgspec.msgpack.encode(wire), _FOUR_FLOATS]
    expect_rejection(codec, OUTPUT, frames, "tensors.index-used-once",
                     "two tensors naming out-of-band frame 1")


@check("codec/tensor/unreferenced-frame-rejected", clauses=["frames.oob-count-matches"],
       surface="codec")
def _unreferenced_frame(codec: CodecSurface, ctx: CheckContext) -> None:
    """A payload with an out-of-band frame nothing refers to is rejected."""
    frames = _output_frames(ctx.spec, ["float32", [4], 1], [_FOUR_FLOATS, b"spare"])
    expect_rejection(codec, OUTPUT, frames, "frames.oob-count-matches",
                     "an out-of-band frame no value names")


@check("codec/ext/unknown-code-rejected", clauses=["tensors.ext-codes-known"], surface="codec")
def _unknown_ext(codec: CodecSurface, ctx: CheckContext) -> None:
    """An extension type other than 1, 2 and 3 is rejected (in an untyped position)."""
    wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
    wire[_index(ctx.spec, OUTPUT, "kv_transfer_params")] = {"x": Ext(9, b"\x00\x01")}
    expect_rejection(codec, OUTPUT, [msgspec.msgpack.encode(wire)], "tensors.ext-codes-known",
                     "Ext 9 in kv_transfer_params")


@check("codec/ext/pickle-in-any-rejected", clauses=["tensors.ext-pickle-opt-in"],
       surface="codec")
def _pickle_any(codec: CodecSurface, ctx: CheckContext) -> None:
    """Ext 1 (pickle) and Ext 2 (cloudpickle) in an untyped field are rejected without opt-in."""
    _require_opt_in(ctx.spec)
    for code in (PICKLE, CLOUDPICKLE):
        wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
        wire[_index(ctx.spec, OUTPUT, "kv_transfer_params")] = {"x": Ext(code, pickle.dumps(7))}
        expect_rejection(codec, OUTPUT, [msgspec.msgpack.encode(wire)],
                         "tensors.ext-pickle-opt-in", f"Ext {code} in kv_transfer_params")


@check("codec/ext/insecure-function-cloudpickle", clauses=["tensors.insecure-function-cloudpickle"],
       surface="codec", requires=["codec.insecure"])
def _insecure_encoding(codec: CodecSurface, ctx: CheckContext) -> None:
    """With the opt-in, a function goes as Ext 2 and another object as Ext 1 (pickle)."""
    _require_opt_in(ctx.spec)
    codes = {e.name: e.code for e in ctx.spec.surface("tensors").ext_codes}
    if "cloudpickle" not in codes:
        raise NotInRelease(f"vLLM {ctx.spec.version} has no cloudpickle extension type")
    PICKLE, CLOUDPICKLE = codes["pickle"], codes["cloudpickle"]  # noqa: N806 - the release's
    insecure = codec.with_insecure_serialization()  # type: ignore[attr-defined]

    def probe(x: int) -> int:
        return x

    frames = encode(insecure, "utility", in_release(
        [0, 1, "m", [probe, fractions.Fraction(1, 3)]], "utility", ctx.spec))
    fields = utility_fields(ctx.spec.version, raw_decode(frames[1]))
    args = fields["args"] if fields is not None else None
    if not (isinstance(args, list) and len(args) == 2 and isinstance(args[0], Ext)
            and isinstance(args[1], Ext)):
        raise CheckFailure(f"expected two extension values in args, got {show(args)}",
                           Reproduction(received=frames))
    if args[0].code != CLOUDPICKLE or args[1].code != PICKLE:
        raise CheckFailure(
            f"a function must travel as Ext {CLOUDPICKLE} and a Fraction as Ext {PICKLE}, got "
            f"Ext {args[0].code} "
            f"and Ext {args[1].code}", Reproduction(received=frames))
    if pickle.loads(args[1].data) != fractions.Fraction(1, 3):  # noqa: S301 - our own value
        raise CheckFailure("the Ext 1 payload does not unpickle to the value sent",
                           Reproduction(received=frames))


def pickle_probe(x: int) -> int:
    """A plain module-level function: what the pickle-without-opt-in checks send (pickle
    writes it by reference, cloudpickle by value)."""
    return x


def _pickle_codes(spec: Any) -> tuple[int, int | None]:
    """The release's ``pickle`` code and its ``cloudpickle`` code (None where it has none);
    NOT APPLICABLE where the release has the opt-in (:func:`pickle_free_gap`)."""
    gap = pickle_free_gap(spec)
    if gap is not None:
        raise NotInRelease(gap)
    codes = {e.name: e.code for e in spec.surface("tensors").ext_codes}
    return codes["pickle"], codes.get("cloudpickle")


@check("codec/ext/pickle-without-opt-in/encode", clauses=["tensors.pickle-without-opt-in"],
       surface="codec")
def _pickle_free_encoding(codec: CodecSurface, ctx: CheckContext) -> None:
    """A release without the opt-in: the codec as it is (no insecure option) sends a
    Fraction in utility args as the pickle extension type, and a function as cloudpickle
    where the release has that code."""
    pickle_code, cloudpickle_code = _pickle_codes(ctx.spec)
    sent: list[Any] = [fractions.Fraction(1, 3)]
    if cloudpickle_code is not None:
        sent.append(pickle_probe)
    value = in_release([0, 1, "m", sent], "utility", ctx.spec)
    try:
        frames = as_bytes(codec.encode("utility", value))
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - a refusal is this check's failure
        raise CheckFailure(
            f"the encoder refused a {', '.join(type(v).__name__ for v in sent)} in utility "
            f"args ({type(exc).__name__}: {str(exc)[:200]}): vLLM {ctx.spec.version} pickles "
            "them without any opt-in", Reproduction(notes={"value": repr(value)[:200]})
        ) from exc
    fields = utility_fields(ctx.spec.version, raw_decode(frames[1]))
    args = fields["args"] if fields is not None else None
    want = [pickle_code] + ([cloudpickle_code] if cloudpickle_code is not None else [])
    got = [a.code if isinstance(a, Ext) else None for a in args] \
        if isinstance(args, list) else None
    if not isinstance(args, list) or got != want:
        raise CheckFailure(f"utility args of vLLM {ctx.spec.version} must be the extension "
                           f"types {want} (pickle, cloudpickle), got {show(args)}",
                           Reproduction(received=frames))
    if pickle.loads(args[0].data) != fractions.Fraction(1, 3):  # noqa: S301 - our own value
        raise CheckFailure(f"the Ext {pickle_code} payload does not unpickle to the Fraction "
                           "sent", Reproduction(received=frames))


@check("codec/ext/pickle-without-opt-in/decode", clauses=["tensors.pickle-without-opt-in"],
       surface="codec")
def _pickle_free_decoding(codec: CodecSurface, ctx: CheckContext) -> None:
    """A release without the opt-in: the codec as it is (no insecure option) unpickles the
    pickle extension type (and cloudpickle where the release has it) in utility args."""
    pickle_code, cloudpickle_code = _pickle_codes(ctx.spec)
    value = fractions.Fraction(1, 3)
    entries = [Ext(code, pickle.dumps(value))
               for code in (pickle_code, cloudpickle_code) if code is not None]
    payload = in_release([0, 1, "m", entries], "utility", ctx.spec)
    frames = [ctx.spec.request_type_byte("UTILITY"), msgspec.msgpack.encode(payload)]
    what = f"utility args of extension types {[e.code for e in entries]} (pickle streams)"
    try:
        decoded = codec.decode("utility", list(frames))
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - a rejection is this check's failure
        raise CheckFailure(
            f"the decoder rejected {what} ({type(exc).__name__}: {str(exc)[:200]}): vLLM "
            f"{ctx.spec.version} unpickles them without any opt-in", Reproduction(sent=frames)
        ) from exc
    fields = utility_fields(ctx.spec.version, list(decoded) if isinstance(decoded, tuple)
                            else decoded)
    args = list(fields["args"]) if fields is not None else None
    if args != [value] * len(entries):
        raise CheckFailure(f"{what} decoded as {show(args)}, expected {len(entries)} x "
                           f"{value!r}", Reproduction(sent=frames, received=decoded))


# --- tensors: encoder duties ---------------------------------------------------------------


@check("codec/tensor/non-contiguous-c-order", clauses=["tensors.c-order-bytes"], surface="codec")
def _non_contiguous(codec: CodecSurface, ctx: CheckContext) -> None:
    """A transposed (non-contiguous) tensor travels as its elements in C order."""
    import torch

    value = torch.arange(6, dtype=torch.int32).reshape(2, 3).t()
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    entry = _tuple_in(frames, ctx.spec)
    want = tensor_value(value)
    data = entry[2] if isinstance(entry, list) and len(entry) == 3 else None
    got = bytes(data.data) if isinstance(data, Ext) else (
        frames[data] if isinstance(data, int) and 0 < data < len(frames) else None)
    dtype = tuple_dtype(ctx.spec, "int32")
    if entry[:2] != [dtype, [3, 2]] or got != want.data:
        raise CheckFailure(
            f"expected [{dtype!r}, [3, 2], <C-order bytes {want.data.hex()}>], got "
            f"{show(entry[:2])} with {got.hex() if got is not None else show(data)}",
            Reproduction(received=frames))


@check("codec/ndarray/non-contiguous-c-order", clauses=["tensors.c-order-bytes"],
       surface="codec")
def _non_contiguous_array(codec: CodecSurface, ctx: CheckContext) -> None:
    """A transposed ndarray travels as its elements in C order."""
    import numpy as np

    value = np.arange(6, dtype="<i4").reshape(2, 3).T
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "ndarray", value))
    entry = _tuple_in(frames, ctx.spec, "ndarray")
    data = entry[2] if isinstance(entry, list) and len(entry) == 3 else None
    got = bytes(data.data) if isinstance(data, Ext) else None
    if entry[:2] != ["<i4", [3, 2]] or got != np.ascontiguousarray(value).tobytes():
        raise CheckFailure(f"expected C-order bytes of the transposed array, got {show(entry)}",
                           Reproduction(received=frames))


@check("codec/tensor/empty", clauses=["tensors.empty"], surface="codec")
def _empty(codec: CodecSurface, ctx: CheckContext) -> None:
    """A tensor with a zero in its shape carries no bytes and decodes to the empty tensor."""
    import torch

    value = torch.empty((0, 4), dtype=torch.float32)
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    entry = _tuple_in(frames, ctx.spec)
    data = entry[2] if isinstance(entry, list) and len(entry) == 3 else None
    carried = bytes(data.data) if isinstance(data, Ext) else (
        frames[data] if isinstance(data, int) and 0 < data < len(frames) else None)
    dtype = tuple_dtype(ctx.spec, "float32")
    if entry[:2] != [dtype, [0, 4]] or carried != b"":
        raise CheckFailure(f"expected [{dtype!r}, [0, 4], <no bytes>], got {show(entry)}",
                           Reproduction(received=frames))
    decoded = _decoded_tensor(codec, frames)
    if decoded != TensorValue("float32", (0, 4), b"", "tensor"):
        raise CheckFailure(f"the empty tensor decoded as {decoded!r}",
                           Reproduction(received=frames))


@check("codec/tensor/decoder-accepts-large-inline", clauses=["tensors.decoder-accepts-both-forms"],
       surface="codec")
def _large_inline(codec: CodecSurface, ctx: CheckContext) -> None:
    """A decoder takes 4 KiB of tensor data sent inline (a peer with a higher threshold)."""
    data = bytes(range(256)) * 16
    frames = _output_frames(ctx.spec, ["uint8", [4096], Ext(RAW_VIEW, data)])
    decoded = _decoded_tensor(codec, frames)
    if decoded != TensorValue("uint8", (4096,), data, "tensor"):
        raise CheckFailure(f"decoded {decoded!r}", Reproduction(sent=frames))


@check("codec/tensor/decoder-accepts-small-out-of-band",
       clauses=["tensors.decoder-accepts-both-forms"], surface="codec")
def _small_oob(codec: CodecSurface, ctx: CheckContext) -> None:
    """A decoder takes 4 bytes of tensor data sent out of band (a peer with a lower threshold)."""
    frames = _output_frames(ctx.spec, ["uint8", [4], 1], [b"\x01\x02\x03\x04"])
    decoded = _decoded_tensor(codec, frames)
    if decoded != TensorValue("uint8", (4,), b"\x01\x02\x03\x04", "tensor"):
        raise CheckFailure(f"decoded {decoded!r}", Reproduction(sent=frames))


def _mm_elem(spec: Any, key: str, data: Any, field: list[Any]) -> dict[str, Any]:
    """A MultiModalFieldElem ``key`` holding ``data``, with the modality and key the release's
    layout carries in each element (until vLLM 0.15.1)."""
    names = {f.name for f in spec.struct("MultiModalFieldElem").fields}
    extra = {"modality": "image", "key": key} if {"modality", "key"} <= names else {}
    return {**extra, "data": data, "field": field}


def _batched(spec: Any) -> list[Any]:
    """The field of a batched element: the factory and the arguments the release's
    MultiModalBatchedField has (keep_on_cpu came in vLLM 0.13.0)."""
    names = {f.name for f in spec.struct("MultiModalBatchedField").fields}
    return ["batched", {k: v for k, v in {"keep_on_cpu": False}.items() if k in names}]


def _feature(spec: Any, data: Any) -> dict[str, Any]:
    """A MultiModalFeatureSpec whose one field ``x`` holds ``data``, as the run's release
    lays it out."""
    value = {"data": {"x": _mm_elem(spec, "x", data, _batched(spec))},
             "modality": "image", "identifier": "i",
             "mm_position": {"offset": 0, "length": 1, "is_embed": None}, "mm_hash": None}
    return in_release(value, "MultiModalFeatureSpec", spec)


def _nested_carrier(spec: Any, data: Any) -> tuple[str, Any, Callable[[Any], Any],
                                                   Callable[[Any, Any], Any]]:
    """Where the release carries nested tensors: a MultiModalFeatureSpec's field ``x`` (vLLM
    0.10.2 on), else a bare MultiModalFieldElem. Returns the kind, the value holding ``data``,
    a getter of the data from a decoded map and a setter of it into a copy of one."""
    if "MultiModalFeatureSpec" in spec.structs:
        def get(raw: Any) -> Any:
            return raw.get("data", {}).get("x", {}).get("data") if isinstance(raw, dict) \
                else None

        def put(raw: Any, bad: Any) -> Any:
            return {**raw, "data": {"x": {**raw["data"]["x"], "data": bad}}}

        return "MultiModalFeatureSpec", _feature(spec, data), get, put
    require_field(spec, "MultiModalFieldElem", "data")
    return ("MultiModalFieldElem", _mm_elem(spec, "x", data, _batched(spec)),
            lambda raw: raw.get("data") if isinstance(raw, dict) else None,
            lambda raw, bad: {**raw, "data": bad})


@check("codec/tensor/nested-tensors", clauses=["tensors.nested-tensors"], surface="codec")
def _nested_tensors(codec: CodecSurface, ctx: CheckContext) -> None:
    """A multimodal field's data [small, [big, 2, 0.5], []] travels as a tensor tuple inline,
    an array holding a tuple out of band and two numbers, and an empty array; it decodes with
    tensors at every depth."""
    small, big = _uint8(4), _uint8(max(_threshold(ctx.spec), 1))
    require_form(ctx.spec, "tensor", "tuple")
    kind, value, get, put = _nested_carrier(ctx.spec, [small, [big, 2, 0.5], []])
    frames = encode(codec, kind, value)
    raw = raw_decode(frames[0])
    data = get(raw)
    want = [["uint8", [4], Ext(RAW_VIEW, bytes(range(4)))], [["uint8", [len(big)], 1], 2, 0.5],
            []]
    if data != want or frames[1:] != [tensor_value(big).data]:
        raise CheckFailure(f"data travels as {show(data)} with {len(frames) - 1} out-of-band "
                           f"frame(s); expected {show(want)} with 1",
                           Reproduction(received=frames))
    decoded = neutral(decode(codec, kind, frames))
    got = get(decoded)
    expected = [tensor_value(small), [tensor_value(big), 2, 0.5], []]
    if got != expected:
        raise CheckFailure(f"data decoded as {got!r}, expected {expected!r}",
                           Reproduction(sent=frames, received=decoded))
    for bad in ("text", [1, "x"], {"k": 1}):
        wire = put(raw, bad)
        expect_rejection(codec, kind, [msgspec.msgpack.encode(wire)],
                         ["tensors.nested-tensors", GENERAL], f"nested tensors {bad!r}")


@check("codec/tensor/index-order", clauses=["tensors.index-base-one",
                                            "frames.payload-msgpack-first"], surface="codec")
def _index_order(codec: CodecSurface, ctx: CheckContext) -> None:
    """Out-of-band values are numbered 1, 2, 3 in the order they are written."""
    require_field(ctx.spec, OUTPUT, "pooling_output", "prompt_token_id_logprobs")
    threshold = _threshold(ctx.spec)
    first, second, third = _uint8(threshold), _uint8(threshold + 1), _uint8(threshold + 2)
    value = {
        "outputs": [
            _output(pooling_output=first, prompt_token_id_logprobs=second),
            {"request_id": "req-u", "new_token_ids": [], "pooling_output": third},
        ],
        "timestamp": 1.5,
    }
    frames = encode(codec, "EngineCoreOutputs", value)
    expect_wire(frames, value, "EngineCoreOutputs", ctx.spec, threshold=threshold,
                what="three out-of-band tensors")


@check("codec/tensor/round-trip-request-embeds", clauses=["structs.tensor-fields",
                                                          "frames.payload-msgpack-first"],
       surface="codec")
def _prompt_embeds(codec: CodecSurface, ctx: CheckContext) -> None:
    """An ADD's prompt_embeds (bfloat16, out of band) survives encode and decode."""
    import torch

    embeds = torch.arange(256, dtype=torch.float32).reshape(64, 4).to(torch.bfloat16)
    value = minimal_request(prompt_embeds=embeds, prompt_token_ids=None)
    frames = encode(codec, "add", value)
    decoded = decode(codec, "add", frames)
    expect_value(decoded, value, "EngineCoreRequest", ctx.spec, what="prompt_embeds",
                 sent=frames, fields=["request_id", "prompt_embeds", "prompt_token_ids"])


@check("codec/ndarray/object-refused", clauses=["tensors.no-object-arrays",
                                                "structs.no-implicit-pickle"], surface="codec")
def _object_array(codec: CodecSurface, ctx: CheckContext) -> None:
    """An encoder refuses an object ndarray (it is not wire data)."""
    import numpy as np

    _require_opt_in(ctx.spec)

    value = np.array([object(), object()], dtype=object)
    expect_encode_refused(codec, OUTPUT, _carry(ctx.spec, "ndarray", value), "an object ndarray")



# --- structs beyond layout -----------------------------------------------------------------


@check("codec/struct/private-fields-travel", clauses=["structs.map.private-fields-travel"],
       surface="codec")
def _private_fields(codec: CodecSurface, ctx: CheckContext) -> None:
    """SamplingParams._all_stop_token_ids is written and read like any field."""
    value = {"stop_token_ids": [9], "_all_stop_token_ids": {9}}
    frames = encode(codec, "SamplingParams", value)
    wire = raw_decode(frames[0])
    if not isinstance(wire, dict) or wire.get("_all_stop_token_ids") != [9]:
        raise CheckFailure(f"expected _all_stop_token_ids: [9] on the wire, got {show(wire)}",
                           Reproduction(received=frames))
    decoded = decode(codec, "SamplingParams", frames)
    got = neutral(field_value(decoded, "_all_stop_token_ids"))
    if set(got or ()) != {9}:
        raise CheckFailure(f"_all_stop_token_ids decoded as {got!r}", Reproduction(sent=frames))


@check("codec/struct/declared-fields-only", clauses=["structs.map.declared-fields-only"],
       surface="codec")
def _declared_only(codec: CodecSurface, ctx: CheckContext) -> None:
    """Only declared fields of SamplingParams and StructuredOutputsParams reach the wire.
    (StructuredOutputsParams where the release has it: vLLM 0.11.0 on.)"""
    problems = []
    for name, value in (("SamplingParams", Sampler(ctx.spec).struct("SamplingParams")),
                        ("StructuredOutputsParams", {"regex": "a+"})):
        if name not in ctx.spec.structs:
            continue
        declared = {f.name for f in ctx.spec.struct(name).fields}
        frames = encode(codec, name, value)
        wire = raw_decode(frames[0])
        extra = sorted(set(wire) - declared) if isinstance(wire, dict) else ["<not a map>"]
        if extra:
            problems.append(f"{name}: undeclared keys {extra}")
    if problems:
        raise CheckFailure("; ".join(problems))


@check("codec/enum/value-on-wire", clauses=["structs.enum.value"], surface="codec")
def _enum_value(codec: CodecSurface, ctx: CheckContext) -> None:
    """finish_reason LENGTH travels as the int 1, an event type as its int.
    (The event is PREEMPTED, 3; SCHEDULED, 2, before vLLM 0.8.4.)"""
    kinds = [m.value for m in ctx.spec.enum("EngineCoreEventType").members]
    value = _output(finish_reason=1,
                    events=[{"type": 3 if 3 in kinds else kinds[-1], "timestamp": 2.5}])
    frames = encode(codec, OUTPUT, value)
    expect_wire(frames, value, OUTPUT, ctx.spec, what="enums as values")
    decoded = decode(codec, OUTPUT, frames)
    expect_value(decoded, value, OUTPUT, ctx.spec, what="enums", sent=frames,
                 fields=["finish_reason", "events"])


@check("codec/enum/unknown-value-rejected", clauses=["structs.enum.value"], surface="codec")
def _enum_unknown(codec: CodecSurface, ctx: CheckContext) -> None:
    """A finish_reason that is not a member (9) is rejected."""
    wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
    wire[_index(ctx.spec, OUTPUT, "finish_reason")] = 9
    expect_rejection(codec, OUTPUT, [msgspec.msgpack.encode(wire)],
                     ["structs.enum.value", GENERAL], "finish_reason 9")


@check("codec/enum/name-rejected", clauses=["structs.enum.value"], surface="codec")
def _enum_name(codec: CodecSurface, ctx: CheckContext) -> None:
    """A finish_reason sent by name ("LENGTH") is rejected. A str where the array-encoded
    EngineCoreOutput has an int field also breaks structs.array.type-checked."""
    wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
    wire[_index(ctx.spec, OUTPUT, "finish_reason")] = "LENGTH"
    expect_rejection(codec, OUTPUT, [msgspec.msgpack.encode(wire)],
                     ["structs.enum.value", "structs.array.type-checked", GENERAL],
                     "finish_reason 'LENGTH'")


@check("codec/dict/int-keys", clauses=["structs.enum.dict-keys"], surface="codec")
def _int_keys(codec: CodecSurface, ctx: CheckContext) -> None:
    """SamplingParams.logit_bias keys travel as msgpack ints, never strings."""
    value = {"logit_bias": {5: 0.5, 70000: -1.0}}
    frames = encode(codec, "SamplingParams", value)
    wire = raw_decode(frames[0])
    bias = wire.get("logit_bias") if isinstance(wire, dict) else None
    if not isinstance(bias, dict) or set(bias) != {5, 70000}:
        raise CheckFailure(f"expected int keys 5 and 70000, got {bias!r}",
                           Reproduction(received=frames))
    decoded = decode(codec, "SamplingParams", frames)
    if neutral(field_value(decoded, "logit_bias")) != {5: 0.5, 70000: -1.0}:
        raise CheckFailure("logit_bias did not round trip", Reproduction(sent=frames))


@check("codec/dict/enum-keys", clauses=["structs.enum.dict-keys"], surface="codec")
def _enum_keys(codec: CodecSurface, ctx: CheckContext) -> None:
    """PrefixCacheStats.hits_by_source keys travel as the enum's values ("device")."""
    require_field(ctx.spec, "PrefixCacheStats", "hits_by_source")
    value = {"hits_by_source": {"device": 3, "disk": 1}}
    frames = encode(codec, "PrefixCacheStats", value)
    wire = raw_decode(frames[0])
    keys = wire.get("hits_by_source") if isinstance(wire, dict) else None
    if keys != {"device": 3, "disk": 1}:
        raise CheckFailure(f"expected {{'device': 3, 'disk': 1}}, got {keys!r}",
                           Reproduction(received=frames))


@check("codec/set/array", clauses=["structs.set.array"], surface="codec")
def _set_array(codec: CodecSurface, ctx: CheckContext) -> None:
    """finished_requests (a set) travels as an array and decodes to the same set."""
    value = {"finished_requests": {"a", "b", "c"}, "timestamp": 1.5}
    frames = encode(codec, "EngineCoreOutputs", value)
    wire = raw_decode(frames[0])
    got = wire[_index(ctx.spec, "EngineCoreOutputs", "finished_requests")]
    if not isinstance(got, list) or sorted(got) != ["a", "b", "c"]:
        raise CheckFailure(f"expected an array of a, b, c, got {got!r}",
                           Reproduction(received=frames))


@check("codec/set/duplicates-collapse", clauses=["structs.set.array"], surface="codec")
def _set_duplicates(codec: CodecSurface, ctx: CheckContext) -> None:
    """A set arriving with a repeated element decodes to one element."""
    wire = list(expected_wire({"timestamp": 1.5}, "EngineCoreOutputs", ctx.spec).value)
    wire[_index(ctx.spec, "EngineCoreOutputs", "finished_requests")] = ["a", "a", "b"]
    frames = [msgspec.msgpack.encode(wire)]
    decoded = decode(codec, "EngineCoreOutputs", frames)
    got = neutral(field_value(decoded, "finished_requests"))
    if set(got) != {"a", "b"} or len(got) != 2:
        raise CheckFailure(f"expected {{'a', 'b'}}, got {got!r}", Reproduction(sent=frames))


@check("codec/float/float64-on-wire", clauses=["structs.float.float64"], surface="codec")
def _float64(codec: Any, ctx: Any) -> None:
    """A float field (arrival_time 0.5) is written as msgpack float64 (0xcb)."""
    frames = encode(codec, "EngineCoreRequest", minimal_request(arrival_time=0.5))
    if b"\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00" not in frames[0]:
        raise CheckFailure("arrival_time 0.5 is not written as cb 3fe0000000000000",
                           Reproduction(received=frames))


@check("codec/float/accepts-float32-and-int", clauses=["structs.float.float64"],
       surface="codec")
def _float_forms(codec: CodecSurface, ctx: CheckContext) -> None:
    """A decoder takes float32 (0xca) and an integer for a float field."""
    index = _index(ctx.spec, "EngineCoreRequest", "arrival_time")
    base = expected_wire(_request(ctx.spec), "EngineCoreRequest", ctx.spec).value
    for label, raw, want in (("float32", b"\xca\x3f\x00\x00\x00", 0.5), ("int", b"\x07", 7.0)):
        marker = 123456.75
        wire = list(base)
        wire[index] = marker
        encoded = msgspec.msgpack.encode(wire)
        frame = encoded.replace(msgspec.msgpack.encode(marker), raw)
        decoded = decode(codec, "EngineCoreRequest", [frame], form=label)
        got = field_value(decoded, "arrival_time")
        if got != want:
            raise CheckFailure(f"arrival_time sent as {label} decoded as {got!r}",
                               Reproduction(sent=[frame]))


@check("codec/none/nil", clauses=["structs.none.nil"], surface="codec")
def _nil(codec: CodecSurface, ctx: CheckContext) -> None:
    """A None field travels as nil; nil for a non-nullable field (request_id) is rejected."""
    frames = encode(codec, "EngineCoreRequest", _request(ctx.spec))
    wire = raw_decode(frames[0])
    nullable = _index(ctx.spec, "EngineCoreRequest", "cache_salt")
    if wire[nullable] is not None:
        raise CheckFailure(f"cache_salt None travelled as {wire[nullable]!r}",
                           Reproduction(received=frames))
    wire[_index(ctx.spec, "EngineCoreRequest", "request_id")] = None
    expect_rejection(codec, "EngineCoreRequest", [msgspec.msgpack.encode(wire)],
                     ["structs.none.nil", "structs.array.type-checked", GENERAL],
                     "request_id nil")


@check("codec/utility-result/pair", clauses=["structs.utility-result.pair",
                                             "frames.utility-reply"], surface="codec")
def _utility_pair(codec: CodecSurface, ctx: CheckContext) -> None:
    """A utility result travels as [null, value] inside UtilityOutput."""
    require_field(ctx.spec, "UtilityResult")
    value = {"timestamp": 1.5, "utility_output": {
        "call_id": 77, "result": {"type_info": None, "value": [1, "two", {"k": 3}]}}}
    frames = encode(codec, "EngineCoreOutputs", value)
    wire = raw_decode(frames[0])
    got = wire[_index(ctx.spec, "EngineCoreOutputs", "utility_output")]
    if got != [77, None, [None, [1, "two", {"k": 3}]]]:
        raise CheckFailure(f"expected [77, null, [null, [1, 'two', {{'k': 3}}]]], got {show(got)}",
                           Reproduction(received=frames))
    decoded = decode(codec, "EngineCoreOutputs", frames)
    out = neutral(field_value(decoded, "utility_output"))
    if out.get("call_id") != 77 or (out.get("result") or {}).get("value") != [1, "two", {"k": 3}]:
        raise CheckFailure(f"utility_output decoded as {out!r}", Reproduction(sent=frames))


@check("codec/utility-result/type-info-rejected",
       clauses=["structs.utility-result.type-info-insecure-only"], surface="codec")
def _utility_type_info(codec: CodecSurface, ctx: CheckContext) -> None:
    """A UtilityResult whose type_info is not nil is rejected without the opt-in."""
    require_field(ctx.spec, "UtilityResult")
    _require_opt_in(ctx.spec)
    wire = list(expected_wire({"timestamp": 1.5}, "EngineCoreOutputs", ctx.spec).value)
    wire[_index(ctx.spec, "EngineCoreOutputs", "utility_output")] = [
        5, None, [["builtins", "int"], 3]]
    expect_rejection(codec, "EngineCoreOutputs", [msgspec.msgpack.encode(wire)],
                     "structs.utility-result.type-info-insecure-only",
                     "type_info ['builtins', 'int']")


@check("codec/no-implicit-pickle", clauses=["structs.no-implicit-pickle"], surface="codec")
def _no_pickle(codec: CodecSurface, ctx: CheckContext) -> None:
    """An encoder fails on a value the spec does not describe (a Fraction in utility args)."""
    _require_opt_in(ctx.spec)
    expect_encode_refused(codec, "utility",
                          in_release([0, 1, "m", [fractions.Fraction(1, 3)]], "utility",
                                     ctx.spec),
                           "a fractions.Fraction in utility args")


def _mm_field(spec: Any) -> str:
    """The EngineCoreRequest field of the release's multimodal items: ``mm_features`` (vLLM
    0.10.2 on), ``mm_kwargs`` (0.10.1: one map of MultiModalFieldElem per item); NOT
    APPLICABLE before, where ``mm_inputs`` is untyped (its items are no spec struct)."""
    names = {f.name for f in spec.struct("EngineCoreRequest").fields}
    for name in ("mm_features", "mm_kwargs"):
        if name in names:
            return name
    raise NotInRelease(f"vLLM {spec.version} has no typed multimodal item "
                       "(EngineCoreRequest.mm_inputs is untyped there)")


def _mm_request(spec: Any, factory: str, kwargs: dict[str, Any]) -> list[bytes]:
    """An ADD whose one multimodal item's element ``pixel_values`` names ``factory``."""
    where = _mm_field(spec)
    elem = _mm_elem(spec, "pixel_values", ["float32", [2], Ext(RAW_VIEW, bytes(8))],
                    [factory, kwargs])
    if where == "mm_features":
        item: Any = in_release({
            "data": {"pixel_values": elem},
            "modality": "image",
            "identifier": "img-0",
            "mm_position": {"offset": 0, "length": 2, "is_embed": None},
            "mm_hash": None,
        }, "MultiModalFeatureSpec", spec)
    else:
        item = {"pixel_values": elem}
    wire = list(expected_wire(_request(spec), "EngineCoreRequest", spec).value)
    wire[_index(spec, "EngineCoreRequest", where)] = [item]
    return [spec.request_type_byte("ADD"), msgspec.msgpack.encode(wire)]


def _first_mm_item(spec: Any, decoded: Any) -> Any:
    """The first multimodal item of a decoded ADD (neutral), or None."""
    items = decoded.get(_mm_field(spec)) if isinstance(decoded, dict) else None
    return items[0] if items else None


@check("codec/mm/item-map", clauses=["structs.mm-item.map"], surface="codec")
def _mm_item(codec: CodecSurface, ctx: CheckContext) -> None:
    """An ADD with one multimodal item ({data, field: ['batched', kwargs]}) decodes."""
    frames = _mm_request(ctx.spec, "batched", {"keep_on_cpu": False})
    item = _first_mm_item(ctx.spec, neutral(decode(codec, "add", frames)))
    if _mm_field(ctx.spec) == "mm_features":
        ok = isinstance(item, dict) and item.get("identifier") == "img-0"
    else:
        elem = item.get("pixel_values") if isinstance(item, dict) else None
        factory = _batched(ctx.spec)[0]
        ok = isinstance(elem, dict) and (elem.get("field") or [None])[0] == factory
    if not ok:
        raise CheckFailure(f"{_mm_field(ctx.spec)} decoded as {[item]!r}"[:300],
                           Reproduction(sent=frames))


@check("codec/mm/unknown-factory-rejected", clauses=["structs.mm-item.known-factories-only"],
       surface="codec")
def _mm_factory(codec: CodecSurface, ctx: CheckContext) -> None:
    """A multimodal field naming a factory other than batched, flat, shared is rejected."""
    frames = _mm_request(ctx.spec, "flat_from_sizes", {"modality": "image"})
    expect_rejection(codec, "add", frames, ["structs.mm-item.known-factories-only",
                                            "frames.payload-matches-type"],
                     "factory 'flat_from_sizes'")


@check("codec/mm/slice-triple", clauses=["structs.slice.triple"], surface="codec")
def _slices(codec: CodecSurface, ctx: CheckContext) -> None:
    """A flat multimodal field's slices travel as [start, stop, step] triples and decode."""
    frames = _mm_request(ctx.spec, "flat", {"keep_on_cpu": False, "slices": [[0, 2, None]],
                                            "dim": 0})
    item = _first_mm_item(ctx.spec, neutral(decode(codec, "add", frames)))
    if not item:
        raise CheckFailure(f"{_mm_field(ctx.spec)} lost", Reproduction(sent=frames))
    text = repr(item)
    if "slice(0, 2, None)" not in text and "[0, 2, None]" not in text:
        raise CheckFailure(f"the slice [0, 2, null] did not survive: {text[:300]}",
                           Reproduction(sent=frames))


# --- message kinds -------------------------------------------------------------------------

#: A sample value for every message kind the codec surface names.
#: The one frame of each ready-response form that is no msgpack struct.
_READY_LITERALS = {"empty": b"", "READY": b"READY"}


def _ready_literal(spec: Any, kind: str) -> bytes | None:
    """The literal frame of the ready response at the run's release, None for a struct (or
    another kind)."""
    return _READY_LITERALS.get(ready_form(spec)) if kind == "ready_response" else None


def _check_frames(spec: Any, kind: str, frames: list[bytes], value: Any) -> list[str]:
    """Problems with ``frames`` against the spec's frame list for ``kind`` (sender side)."""
    literal = _ready_literal(spec, kind)
    if literal is not None:
        if frames != [literal]:
            return [f"vLLM {spec.version}'s ready response is the one frame {literal!r}, got "
                    f"{[bytes(f) for f in frames]!r}"]
        return []
    message = message_spec(spec, kind)
    problems: list[str] = []
    position = 0
    for frame_spec in message.frames:
        if frame_spec.content == "identity":
            continue
        if frame_spec.repeated:
            position = len(frames)
            continue
        if position >= len(frames):
            problems.append(f"missing frame {frame_spec.name!r}")
            break
        frame = frames[position]
        if frame_spec.content in ("type_byte", "literal"):
            want = bytes.fromhex(frame_spec.literal_hex or "")
            if frame != want:
                problems.append(f"frame {position} ({frame_spec.name}) must be {want.hex()}, "
                                f"got {frame.hex()}")
        elif frame_spec.content == "msgpack":
            try:
                actual = raw_decode(frame)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"frame {position} is not msgpack: {exc}")
            else:
                form = expected_wire(value, frame_spec.payload or "any", spec)
                from enginewire.conformance.oracle.wire import compare_wire

                problems += [f"payload {p}" for p in compare_wire(form.value, actual)[:3]]
        position += 1
    if position < len(frames):
        problems.append(f"{len(frames) - position} unexpected trailing frame(s)")
    return problems


def _register_message_checks() -> None:
    frame_clauses = {
        "hello": ["handshake.hello-first", "handshake.message-keys", "frames.frame-count"],
        "ready": ["handshake.message-keys", "frames.frame-count"],
        "init": ["handshake.init-answers-hello", "handshake.init-addresses",
                 "frames.plain-msgpack-control"],
        "ready_response": ["frames.ready-response-first", "frames.plain-msgpack-control"],
        "add": ["frames.type-byte-before-payload", "request_types.one-byte-frame",
                "request_types.byte-table"],
        "abort": ["frames.abort-payload", "request_types.byte-table"],
        "utility": ["frames.utility-payload", "request_types.byte-table"],
        "outputs": ["frames.outputs-payload"],
        "engine_core_dead": ["frames.engine-core-dead-literal"],
        "utility_reply": ["frames.utility-reply"],
        "start_dp_wave": ["frames.start-dp-wave-payload", "frames.type-byte-before-payload"],
        "coordinator_outputs": ["frames.coordinator-outputs-single-frame"],
        "stats_update": ["frames.stats-update-payload"],
        "coordinator_subscribe": ["frames.coordinator-subscribe-first"],
        "coordinator_ready": ["frames.coordinator-subscribe-first"],
        "coordinator_unsubscribe": ["frames.unsubscribe-ignored"],
        "stats_unsubscribe": ["frames.unsubscribe-ignored"],
    }
    for kind, clauses in frame_clauses.items():
        slug = kind.replace("_", "-")

        def run(codec: Any, ctx: Any, *, _kind: str = kind) -> None:
            value = message_sample(ctx.spec, _kind)
            frames = encode(codec, _kind, value)
            problems = _check_frames(ctx.spec, _kind, frames, value)
            if problems:
                raise CheckFailure(f"{_kind}: {problems[0]}"
                                   + (f" (and {len(problems) - 1} more)"
                                      if len(problems) > 1 else ""),
                                   Reproduction(received=frames, notes={"value": value,
                                                                        "problems": problems}))

        check(f"codec/message/{slug}/frames", clauses=clauses, surface="codec",
              description=f"{kind} encodes to the frames the spec lists")(run)

        if MESSAGE_SAMPLES.get(kind, 0) is None:
            continue

        def run_trip(codec: Any, ctx: Any, *, _kind: str = kind) -> None:
            value = message_sample(ctx.spec, _kind)
            frames = encode(codec, _kind, value)
            decoded = decode(codec, _kind, frames)
            if _ready_literal(ctx.spec, _kind) is not None:
                if decoded is not None:
                    raise CheckFailure(f"{_kind}: the literal frame {frames!r} decoded as "
                                       f"{neutral(decoded)!r}, expected no value",
                                       Reproduction(sent=frames))
                return
            payload = next(f.payload for f in message_spec(ctx.spec, _kind).frames
                           if f.content == "msgpack")
            expect_value(decoded, value, payload, ctx.spec, what=f"{_kind} round trip",
                         sent=frames)

        check(f"codec/message/{slug}/round-trip", clauses=[clauses[0]], surface="codec",
              description=f"{kind} decodes back to the value it was encoded from")(run_trip)


_register_message_checks()

#: (subscription kind, unsubscription kind) of each coordinator publisher's channel.
_SUBSCRIPTION_PAIRS = (("coordinator_subscribe", "coordinator_unsubscribe"),
                       ("stats_subscribe", "stats_unsubscribe"))


def _literal_frames(spec: Any, kind: str) -> list[bytes]:
    """The frames of a literal-only message kind, as the spec writes them."""
    return [bytes.fromhex(f.literal_hex or "") for f in message_spec(spec, kind).frames]


@check("codec/message/unsubscribe-told-apart",
       clauses=["frames.unsubscribe-ignored", "frames.frame-count"], surface="codec")
def _unsubscribe_told_apart(codec: CodecSurface, ctx: CheckContext) -> None:
    """On coordinator_input and stats_publish the unsubscription (the single frame the spec
    gives coordinator_unsubscribe / stats_unsubscribe) decodes as that kind and as nothing
    else: not as the subscription, and the subscription not as it. NOT APPLICABLE where the
    release has no DP coordinator (:func:`require_message`: no such channels, no
    such messages)."""
    require_message(ctx.spec, *(k for pair in _SUBSCRIPTION_PAIRS for k in pair))
    for subscribe, unsubscribe in _SUBSCRIPTION_PAIRS:
        sub_frames = _literal_frames(ctx.spec, subscribe)
        unsub_frames = _literal_frames(ctx.spec, unsubscribe)
        value = decode(codec, unsubscribe, unsub_frames)
        if value is not None:
            raise CheckFailure(f"{unsubscribe} decoded to {value!r}, expected no value",
                               Reproduction(sent=unsub_frames, received=neutral(value)))
        expect_rejection(codec, subscribe, unsub_frames, "frames.frame-count",
                         f"the unsubscription as {subscribe}", spec=ctx.spec)
        expect_rejection(codec, unsubscribe, sub_frames, "frames.frame-count",
                         f"the subscription as {unsubscribe}", spec=ctx.spec)


@check("codec/message/untyped-payload-no-oob", clauses=["frames.untyped-payload-no-oob"],
       surface="codec")
def _untyped_oob(codec: CodecSurface, ctx: CheckContext) -> None:
    """A utility call whose args hold a large tensor is refused, not sent with a buffer."""
    # Outside the try: a release without an inline threshold is NOT APPLICABLE, no refusal.
    value = in_release([0, 1, "m", [_uint8(4 * _threshold(ctx.spec))]], "utility", ctx.spec)
    try:
        frames = codec.encode("utility", value)
    except Exception as exc:  # noqa: BLE001 - refusing is conformant
        require_rejection(exc, "encode('utility') with a large tensor argument", codec=codec,
                          kind="utility", spec=ctx.spec, operation="encode")
        return
    frames = list(frames)
    if len(frames) > 2:
        raise CheckFailure(f"utility went out with {len(frames) - 2} out-of-band frame(s)",
                           Reproduction(received=frames))


@check("codec/message/control-no-extensions", clauses=["frames.plain-msgpack-control"],
       surface="codec")
def _control_plain(codec: CodecSurface, ctx: CheckContext) -> None:
    """Handshake messages and the ready response are one frame of plain msgpack.
    (Where the release sends the ready response as a literal frame: exactly that frame.)"""
    absent: list[str] = []
    for kind in ("hello", "ready", "init", "ready_response"):
        try:
            value = message_sample(ctx.spec, kind)
            literal = _ready_literal(ctx.spec, kind)
        except NotInRelease as exc:
            absent.append(str(exc))
            continue
        frames = encode(codec, kind, value)
        if len(frames) != 1:
            raise CheckFailure(f"{kind} has {len(frames)} frames", Reproduction(received=frames))
        if literal is not None:
            if frames != [literal]:
                raise CheckFailure(f"{kind} of vLLM {ctx.spec.version} must be the frame "
                                   f"{literal!r}, got {frames[0]!r}",
                                   Reproduction(received=frames))
            continue
        found: list[int] = []

        def note(code: int, data: memoryview, _found: list[int] = found) -> None:
            _found.append(code)

        msgspec.msgpack.decode(frames[0], ext_hook=note)
        if found:
            raise CheckFailure(f"{kind} carries extension types {found}",
                               Reproduction(received=frames))
    if len(absent) == 4:
        raise NotInRelease("; ".join(absent))


def _payload_of(codec: Any, kind: str, spec: Any) -> list[bytes]:
    return encode(codec, kind, message_sample(spec, kind))


def _utility_items(spec: Any, *, call_id: Any = 7) -> list[Any]:
    """A valid UTILITY payload of ``spec``'s release, its items in the release's order
    (history/constants.toml ``[[utility_payload]]``: no client index up to 0.9.0), with
    ``call_id`` as given."""
    return utility_value(spec.version, client_index=0, call_id=call_id,
                         method="is_sleeping", args=[])


def _utility_short_what(spec: Any) -> str:
    items = utility_payload_at(spec.version)
    return (f"a utility payload of {len(items) - 1} items ({', '.join(items[:-1])}), one "
            f"short of the release's {len(items)} ({', '.join(items)})")


def _utility_call_id_what(spec: Any) -> str:
    items = utility_payload_at(spec.version)
    return (f"a utility payload whose call_id (item {items.index('call_id')} of "
            f"{', '.join(items)}) is the string '7'")


def _type_what(name: str, what: str) -> tuple[str, Callable[[Any], str]]:
    """A :data:`_BAD_INPUT` description naming request type ``name``'s byte: ``what`` with
    ``{byte}`` standing for "the type byte of NAME" in the release-neutral description and
    for "type byte 0xNN (NAME)", the byte at the run's release, in the message."""
    return (what.format(byte=f"the type byte of {name}"),
            lambda spec: what.format(
                byte=f"type byte 0x{spec.request_type_byte(name).hex()} ({name})"))


#: suffix, kind, clauses, what (a description, or the description and the message's
#: account of the input at the run's release), frames builder (valid frames and the run's
#: spec -> bad frames).
_BAD_INPUT: list[tuple[str, str, list[str], str | tuple[str, Callable[[Any], str]], Any]] = [
    ("unknown-type-byte", "add", ["request_types.unknown-byte-rejected"],
     "type byte 0x07", lambda f, _s: [b"\x07", *f[1:]]),
    ("sentinel-executor-failed", "add", ["request_types.sentinels-never-on-wire",
                                         "request_types.unknown-byte-rejected"],
     _type_what("EXECUTOR_FAILED", "{byte}"),
     lambda f, spec: [request_type_frame(spec, "EXECUTOR_FAILED"), *f[1:]]),
    ("sentinel-wakeup", "abort", ["request_types.sentinels-never-on-wire",
                                  "request_types.unknown-byte-rejected"],
     _type_what("WAKEUP", "{byte}"),
     lambda f, spec: [request_type_frame(spec, "WAKEUP"), *f[1:]]),
    ("type-frame-two-bytes", "add", ["request_types.one-byte-frame",
                                     "request_types.unknown-byte-rejected"],
     "a two-byte type frame 00 00", lambda f, _s: [b"\x00\x00", *f[1:]]),
    ("type-frame-empty", "abort", ["request_types.one-byte-frame",
                                   "request_types.unknown-byte-rejected"],
     "an empty type frame", lambda f, _s: [b"", *f[1:]]),
    ("wrong-type-for-kind", "abort", ["frames.frame-count", "request_types.byte-table",
                                      "request_types.unknown-byte-rejected"],
     _type_what("UTILITY", "an ABORT payload under {byte}"),
     lambda f, spec: [request_type_frame(spec, "UTILITY"), *f[1:]]),
    ("missing-payload", "add", ["frames.frame-count"],
     "a type frame with no payload", lambda f, _s: f[:1]),
    ("extra-frame-after-abort", "abort", ["frames.frame-count",
                                          "frames.untyped-payload-no-oob"],
     "an abort followed by a stray frame", lambda f, _s: [*f, b"stray"]),
    ("garbage-payload", "add", ["frames.payload-matches-type"],
     "payload bytes c1 (never valid msgpack)", lambda f, _s: [f[0], b"\xc1"]),
    ("truncated-payload", "add", ["frames.payload-matches-type"],
     "a payload cut in half", lambda f, _s: [f[0], f[1][: len(f[1]) // 2]]),
    ("abort-not-strings", "abort", ["frames.abort-payload", "frames.payload-matches-type"],
     "an abort payload [1, 2]", lambda f, _s: [f[0], msgspec.msgpack.encode([1, 2])]),
    ("abort-not-array", "abort", ["frames.abort-payload", "frames.payload-matches-type"],
     "an abort payload that is a string", lambda f, _s: [f[0], msgspec.msgpack.encode("req-0")]),
    ("utility-short", "utility", ["frames.utility-payload", "frames.payload-matches-type"],
     ("a utility payload one item short of the release's", _utility_short_what),
     lambda f, spec: [f[0], msgspec.msgpack.encode(_utility_items(spec)[:-1])]),
    ("utility-call-id-string", "utility", ["frames.utility-payload",
                                           "frames.payload-matches-type"],
     ("a utility call_id that is a string", _utility_call_id_what),
     lambda f, spec: [f[0], msgspec.msgpack.encode(_utility_items(spec, call_id="7"))]),
    ("engine-core-dead-extra-frame", "engine_core_dead", ["frames.engine-core-dead-literal"],
     "ENGINE_CORE_DEAD plus an empty frame", lambda f, _s: [*f, b""]),
    ("engine-core-dead-wrong-bytes", "engine_core_dead", ["frames.engine-core-dead-literal"],
     "the frame ENGINE_CORE_DEAD with a trailing space", lambda f, _s: [f[0] + b" "]),
    ("hello-missing-headless", "hello", ["handshake.message-keys"],
     "a HELLO without headless", lambda f, _s: _without_key(f, "HELLO", "headless")),
    ("hello-not-a-map", "hello", ["handshake.message-keys", "frames.payload-matches-type"],
     "a HELLO that is an array", lambda f, _s: [msgspec.msgpack.encode(["HELLO", True, False])]),
    ("hello-two-frames", "hello", ["frames.frame-count", "frames.untyped-payload-no-oob"],
     "a HELLO of two frames", lambda f, _s: [*f, b""]),
    ("init-missing-addresses", "init", ["handshake.init-addresses",
                                        "structs.map.absent-key-default"],
     "an init map without addresses",
     lambda f, _s: [msgspec.msgpack.encode({"parallel_config": {}})]),
    ("outputs-garbage", "outputs", ["frames.payload-matches-type"],
     "an outputs frame that is not msgpack", lambda f, _s: [b"\xc1\xc1"]),
]


def _without_key(frames: list[bytes], what: str, key: str) -> list[bytes]:
    """The handshake map of ``frames`` without ``key``; NOT APPLICABLE where the release's
    map has no such key (HELLO's headless came in 0.10.0)."""
    value = msgspec.msgpack.decode(frames[0])
    if key not in value:
        raise NotInRelease(f"{what} has no {key} key (history/constants.toml [[handshake]])")
    value.pop(key)
    return [msgspec.msgpack.encode(value)]


def _described(what: str | tuple[str, Callable[[Any], str]]) -> str:
    """The release-neutral description of a :data:`_BAD_INPUT` entry's input."""
    return what if isinstance(what, str) else what[0]


def _bad_input(codec: Any, spec: Any, kind: str, what: str | tuple[str, Callable[[Any], str]],
               make: Any) -> tuple[list[bytes], str]:
    """The malformed frames of a :data:`_BAD_INPUT` entry at ``spec``'s release and the
    account of them for messages; NOT APPLICABLE (naming the release) where the release
    lacks what the entry changes."""
    valid = _payload_of(codec, kind, spec)  # NOT APPLICABLE where the release lacks the kind
    try:
        frames = [bytes(f) for f in make(valid, spec)]
    except NotInRelease as exc:  # the release lacks a key or a request type of the entry
        why = str(exc)
        raise NotInRelease(why if why.startswith("vLLM ") else f"vLLM {spec.version}'s {why}"
                           ) from None
    said = what if isinstance(what, str) else what[1](spec)
    return frames, f"{kind}: {said}"


def _register_bad_input() -> None:
    for suffix, kind, clauses, what, make in _BAD_INPUT:

        def run(codec: Any, ctx: Any, *, _kind: str = kind, _clauses: list = clauses,
                _what: Any = what, _make: Any = make) -> None:
            frames, said = _bad_input(codec, ctx.spec, _kind, _what, _make)
            expect_rejection(codec, _kind, frames, _clauses, said, spec=ctx.spec)

        check(f"codec/reject/{suffix}", clauses=clauses, surface="codec",
              description=f"decoding {kind} rejects {_described(what)}")(run)


_register_bad_input()


@check("codec/reject/names-the-clause", clauses=["frames.rejection-names-clause"],
       surface="codec")
def _names_the_clause(codec: CodecSurface, ctx: CheckContext) -> None:
    """(SHOULD) Every malformed input of the codec/reject checks that the codec rejects is
    rejected with an error that names a clause (``.clause``), not only refused. (Whether it
    is rejected at all, and with the right clause, is each codec/reject check's verdict.)"""
    unnamed: list[str] = []
    rejected = 0
    for _suffix, kind, _clauses, what, make in _BAD_INPUT:
        try:
            frames, said = _bad_input(codec, ctx.spec, kind, what, make)
        except NotInRelease:
            continue  # an input of what the release lacks (HELLO's headless before 0.10.0)
        try:
            codec.decode(kind, list(frames))
        except Exception as exc:  # noqa: BLE001 - a rejection is what is judged
            require_rejection(exc, said, sent=frames)
            rejected += 1
            if getattr(exc, "clause", None) is None:
                unnamed.append(f"{said} ({type(exc).__name__}: {str(exc)[:80]})")
    if not rejected:
        raise CheckFailure(f"none of the {len(_BAD_INPUT)} malformed inputs was rejected")
    if unnamed:
        raise CheckFailure(
            f"{len(unnamed)} of {rejected} rejections name no clause, the first: "
            f"{unnamed[0]}", Reproduction(notes={"unnamed": unnamed[:10]}))


@check("codec/spec/array-structs-append-only", clauses=["structs.array.append-only"],
       surface="codec")
def _append_only(codec: CodecSurface, ctx: CheckContext) -> None:
    """(Spec structure, any target) Every array-encoded struct of the reference version is its
    layout at the release before (``spec/data/history/releases.toml``) with defaulted fields
    appended: no field inserted, removed, reordered or retyped. Earlier releases broke the rule
    many times (docs/spec/breaks.md); the clause's vllm_deviation says so."""
    """(Spec structure, any target) Every array-encoded struct only ever grew at its end:
    no field appears in an earlier vLLM version than a field before it, and no field before
    the end was removed."""
    from enginewire.spec import load
    from enginewire.spec.history.consistency import layout_change
    from enginewire.spec.history.wheels import read_releases
    from enginewire.spec.loader import DATA_DIR, REFERENCE_VLLM_VERSION
    from enginewire.spec.schema import StructSpec

    releases = read_releases(DATA_DIR)
    if REFERENCE_VLLM_VERSION not in releases or releases.index(REFERENCE_VLLM_VERSION) == 0:
        raise CheckFailure("no release before the reference version in "
                           "spec/data/history/releases.toml to compare with",
                           Reproduction(notes={"releases": releases}))
    previous = releases[releases.index(REFERENCE_VLLM_VERSION) - 1]
    full, before = load(), load(previous)
    problems = []
    for item in full.structs.values():
        old = before.structs.get(item.name)
        if not isinstance(item, StructSpec) or item.encoding not in ("array", "tuple") \
                or not isinstance(old, StructSpec):
            continue
        if layout_change(old, item):
            problems.append(f"{item.name}: {[f.name for f in old.fields]} at {previous} -> "
                            f"{[f.name for f in item.fields]} at {REFERENCE_VLLM_VERSION}")
    if problems:
        raise CheckFailure(f"array structs changed other than by appending: {problems[0]}",
                           Reproduction(notes={"problems": problems}))


# --- the tensor forms of earlier releases ---------------------------------------------------


@check("codec/tensor/pickle-form", clauses=["tensors.pickle-form"], surface="codec")
def _pickle_form(codec: CodecSurface, ctx: CheckContext) -> None:
    """(vLLM 0.7.3-0.8.3) A tensor travels as the release's ``tensor`` extension type whose
    payload is a pickle stream of its numpy view (the same dtype, shape and C-order bytes),
    and decodes back to the tensor."""
    import torch

    require_form(ctx.spec, "tensor", "pickle")
    value = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    array = _pickled_array(carrier(ctx.spec, "tensor").entry(frames), ctx.spec, frames)
    want = tensor_value(value)
    got = (array.dtype.str, tuple(array.shape), array.tobytes())
    if got != ("<f4", want.shape, want.data) or len(frames) != 1:
        raise CheckFailure(f"the pickled array is {got[0]} {list(got[1])} with "
                           f"{len(got[2])} bytes in {len(frames)} frame(s); expected <f4 "
                           f"{list(want.shape)}, the tensor's {len(want.data)} bytes, one frame",
                           Reproduction(received=frames))
    decoded = _decoded_tensor(codec, frames, spec=ctx.spec)
    if decoded != want:
        raise CheckFailure(f"the tensor decoded as {decoded!r}", Reproduction(received=frames))


@check("codec/tensor/pickle-form-decode", clauses=["tensors.pickle-form"], surface="codec")
def _pickle_form_decode(codec: CodecSurface, ctx: CheckContext) -> None:
    """(vLLM 0.7.3-0.8.3) A decoder builds the tensor from a pickled numpy array in the
    ``tensor`` extension type, whatever pickle protocol wrote it (vLLM writes the default)."""
    import numpy as np

    require_form(ctx.spec, "tensor", "pickle")
    array = np.arange(4, dtype="<i4")
    for protocol in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        entry = Ext(ctx.spec.ext_code("tensor"), pickle.dumps(array, protocol=protocol))
        wire = list(expected_wire(_output(), OUTPUT, ctx.spec).value)
        carrier(ctx.spec, "tensor").put(ctx.spec, wire, entry)
        frames = [msgspec.msgpack.encode(wire)]
        decoded = _decoded_tensor(codec, frames, spec=ctx.spec)
        if decoded != TensorValue("int32", (4,), array.tobytes(), "tensor"):
            raise CheckFailure(f"an int32 array pickled with protocol {protocol} decoded as "
                               f"{decoded!r}", Reproduction(sent=frames))


@check("codec/tensor/numpy-form", clauses=["tensors.numpy-form", "tensors.tuple-layout"],
       surface="codec")
def _numpy_form(codec: CodecSurface, ctx: CheckContext) -> None:
    """(vLLM 0.8.4) A tensor travels as the tuple of its numpy view: numpy's dtype.str, not
    the torch name; it decodes back to the tensor."""
    import torch

    require_form(ctx.spec, "tensor", "numpy")
    value = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8
    frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
    entry = carrier(ctx.spec, "tensor").entry(frames)
    want = tensor_value(value)
    if not (isinstance(entry, list) and len(entry) == 3 and entry[:2] == ["<f4", [2, 3]]
            and isinstance(entry[2], Ext) and entry[2].code == RAW_VIEW
            and bytes(entry[2].data) == want.data):
        raise CheckFailure(f"expected ['<f4', [2, 3], Ext({RAW_VIEW}, <24 bytes>)], got "
                           f"{show(entry)}"[:300], Reproduction(received=frames))
    decoded = _decoded_tensor(codec, frames, spec=ctx.spec)
    if decoded != want:
        raise CheckFailure(f"the tensor decoded as {decoded!r}", Reproduction(received=frames))


def _register_fixed_threshold_checks() -> None:
    """(vLLM 0.8.4) A 0-d tensor goes inline whatever its size; any other inline below the
    fixed threshold (512 bytes), out of band at it."""
    cases = (("zero-dim", lambda t: _float64_scalar(), True),
             ("minus-one", lambda t: _uint8(t - 1), True),
             ("exact", lambda t: _uint8(t), False))
    for label, make, inline in cases:

        def run(codec: Any, ctx: Any, *, _make: Any = make, _inline: bool = inline) -> None:
            require_form(ctx.spec, "tensor", "numpy")
            threshold = _threshold(ctx.spec)
            value = _make(threshold)
            frames = encode(codec, OUTPUT, _carry(ctx.spec, "tensor", value))
            entry = carrier(ctx.spec, "tensor").entry(frames)
            data = entry[2] if isinstance(entry, list) and len(entry) == 3 else None
            went_inline = isinstance(data, Ext) and data.code == RAW_VIEW and len(frames) == 1
            went_oob = (type(data) is int and data == 1 and len(frames) == 2
                        and frames[1] == tensor_value(value).data)
            if (_inline and not went_inline) or (not _inline and not went_oob):
                raise CheckFailure(
                    f"a {len(tensor_value(value).data)}-byte tensor of shape "
                    f"{list(value.shape)} with the fixed threshold {threshold} must go "
                    f"{'inline' if _inline else 'out of band as index 1'}, got "
                    f"{show(data)} in {len(frames)} frame(s)"[:300],
                    Reproduction(received=frames))

        check(f"codec/tensor/fixed-threshold-{label}", clauses=["tensors.fixed-threshold"],
              surface="codec", description=f"(vLLM 0.8.4) a tensor {label} goes "
              f"{'inline' if inline else 'out of band'} at the fixed threshold")(run)


def _float64_scalar() -> Any:
    import torch

    return torch.tensor(2.5, dtype=torch.float64)


_register_fixed_threshold_checks()


# --- the ndarray pickle fallback of earlier releases -----------------------------------------

#: Where the fallback checks carry ndarrays: a release with no ndarray form has no field typed
#: ndarray either, so they travel in an untyped position, UtilityOutput.result.
_FALLBACK_HOLDER = ("UtilityOutput", "result")


def _fallback_frames(spec: Any, result: Any) -> list[bytes]:
    """A UtilityOutput whose result is the wire value ``result``; NOT APPLICABLE where the
    release sends an ndarray in a form of its own (``ndarray_form`` not ``pickle``)."""
    require_form(spec, "ndarray", "pickle")
    struct, field = _FALLBACK_HOLDER
    wire = list(expected_wire({"call_id": 1}, struct, spec).value)
    position = _index(spec, struct, field)
    wire.extend([None] * (position + 1 - len(wire)))
    wire[position] = result
    return [msgspec.msgpack.encode(wire)]


@check("codec/ndarray/pickle-fallback", clauses=["tensors.ndarray-pickle-fallback"],
       surface="codec")
def _ndarray_pickle_fallback(codec: CodecSurface, ctx: CheckContext) -> None:
    """(vLLM 0.7.3-0.8.3, which have no insecure opt-in) An ndarray (a float32 one and a
    transposed int64 one) travels as the release's ``pickle`` extension type whose
    payload is one pickle stream of the array (its dtype, shape and C-order bytes), and
    decodes back to the array. (Native byte order: numpy's pickle below protocol 5 loads a
    big-endian array in native order, with equal values.)"""
    import numpy as np

    require_form(ctx.spec, "ndarray", "pickle")
    struct, field = _FALLBACK_HOLDER
    arrays = [(np.arange(6).reshape(2, 3) / 8).astype("<f4"),
              np.arange(6, dtype="<i8").reshape(2, 3).T]
    frames = encode(codec, struct, {"call_id": 1, field: arrays})
    wire = raw_decode(frames[0])
    sent = wire[_index(ctx.spec, struct, field)] if isinstance(wire, list) else None
    code = ctx.spec.ext_code("pickle")
    if not (isinstance(sent, list) and len(sent) == 2 and len(frames) == 1
            and all(isinstance(e, Ext) and e.code == code for e in sent)):
        raise CheckFailure(f"an ndarray of vLLM {ctx.spec.version} travels as msgpack "
                           f"extension type {code} (pickle) in one frame, got {show(sent)} "
                           f"in {len(frames)} frame(s)"[:300], Reproduction(received=frames))
    from enginewire.reference.errors import ProtocolError
    from enginewire.reference.tensors import unpickle_array

    for array, entry in zip(arrays, sent, strict=True):
        try:
            got = unpickle_array(bytes(entry.data), "tensors.ndarray-pickle-fallback",
                                 f"extension type {code}'s payload")
        except ProtocolError as exc:
            raise CheckFailure(str(exc), Reproduction(received=frames)) from exc
        if tensor_value(got) != tensor_value(array):
            raise CheckFailure(f"the pickled array is {tensor_value(got)!r}, expected "
                               f"{tensor_value(array)!r}", Reproduction(received=frames))
    decoded = neutral(field_value(decode(codec, struct, frames), field))
    if decoded != [tensor_value(a) for a in arrays]:
        raise CheckFailure(f"the arrays decoded as {decoded!r}", Reproduction(received=frames))


@check("codec/ndarray/pickle-fallback-decode", clauses=["tensors.ndarray-pickle-fallback"],
       surface="codec")
def _ndarray_pickle_fallback_decode(codec: CodecSurface, ctx: CheckContext) -> None:
    """(vLLM 0.7.3-0.8.3, which have no insecure opt-in) A decoder builds the ndarray from the
    ``pickle`` extension type, whatever pickle protocol wrote it (vLLM writes the default)."""
    import numpy as np

    array = np.arange(4, dtype="<i4")
    struct, field = _FALLBACK_HOLDER
    for protocol in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        frames = _fallback_frames(ctx.spec, Ext(ctx.spec.ext_code("pickle"),
                                                pickle.dumps(array, protocol=protocol)))
        decoded = neutral(field_value(decode(codec, struct, frames), field))
        if decoded != tensor_value(array):
            raise CheckFailure(f"an int32 array pickled with protocol {protocol} decoded as "
                               f"{decoded!r}", Reproduction(sent=frames))
