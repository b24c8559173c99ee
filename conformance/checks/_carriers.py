"""Where a tensor or ndarray check carries its value in the release the suite follows.

A check that sends one tensor (or one ndarray) puts it in a field of an ``EngineCoreOutput``.
Which field depends on the release: :func:`carrier` picks, from the loaded spec's structs, the
first field whose type is ``tensor`` (or ``ndarray``), nil allowed, reached from
``EngineCoreOutput`` through fields of a struct type, shallowest first and in field order:
``pooling_output`` and ``routed_experts`` where the release has them (0.9.2 and 0.14.0 on),
else a field of a nested struct (``new_prompt_logprobs_tensors.logprob_token_ids``, a
``LogprobsTensors``, at every release; ``new_logprobs.logprob_token_ids``, a ``LogprobsLists``
of arrays, at 0.11.1-0.13.0). A release with no such field at all makes the check NOT
APPLICABLE, saying so.

A nested struct's other tensor and array fields hold empty values (zero bytes: inline in the
tuple forms, so the checked value's out-of-band index stays 1), its other required fields the
sampler's values.

:func:`require_form` makes a check NOT APPLICABLE where the release writes a tensor or array in
another form than the one the check is about (the tensors surface's ``tensor_form`` and
``ndarray_form``: ``tuple``, ``numpy`` or ``pickle``). :func:`tuple_dtype` gives the dtype string
a tensor of a torch dtype carries in the release's tuple: the torch name in the ``tuple`` form,
numpy's dtype.str of the tensor's numpy view (:func:`numpy_twin`) in the ``numpy`` form, so that
one check states its tuple once and runs at both.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from enginewire.conformance.checks._helpers import field_value
from enginewire.conformance.framework.registry import CheckFailure, NotInRelease, Reproduction
from enginewire.conformance.oracle.samples import Sampler
from enginewire.conformance.oracle.wire import expected_wire, raw_decode
from enginewire.spec.schema import StructSpec
from enginewire.spec.types import parse_type, tensor_family

OUTPUT = "EngineCoreOutput"
#: How deep below EngineCoreOutput a carrier is looked for.
_MAX_DEPTH = 3

#: What each form is, for NOT APPLICABLE reasons.
FORM_NAMES = {
    "tuple": "the [dtype, shape, data] tuple",
    "numpy": "the [dtype, shape, data] tuple of its numpy view (numpy's dtype.str)",
    "pickle": "a msgpack extension type wrapping a pickle stream",
}


@dataclass(frozen=True)
class Step:
    """One field on the way from EngineCoreOutput to the carrier."""

    struct: str
    field: str
    #: The field's position in an array- or tuple-encoded struct (None in a map).
    index: int | None


@dataclass(frozen=True)
class Carrier:
    """A tensor (or ndarray) field of a release, as a path of fields from EngineCoreOutput."""

    family: str
    steps: tuple[Step, ...]

    @property
    def name(self) -> str:
        """The fields from EngineCoreOutput on (``pooling_output``,
        ``new_logprobs.logprob_token_ids``)."""
        return ".".join(s.field for s in self.steps)

    @property
    def where(self) -> str:
        """``EngineCoreOutput.a.b`` for messages."""
        return ".".join([OUTPUT, *(s.field for s in self.steps)])

    def output(self, spec: Any, value: Any) -> dict[str, Any]:
        """A neutral EngineCoreOutput whose carrier field holds ``value``."""
        inner: Any = value
        for step in reversed(self.steps[1:]):
            inner = {**_filled(spec, step.struct), step.field: inner}
        return {"request_id": "req-t", "new_token_ids": [1], self.steps[0].field: inner}

    def entry(self, frames: Sequence[bytes]) -> Any:
        """The carrier's wire value in frame 0 of an encoded EngineCoreOutput."""
        wire = raw_decode(frames[0])
        try:
            return self.at(wire)
        except (TypeError, IndexError, KeyError) as exc:
            raise CheckFailure(f"EngineCoreOutput frame 0 is not the spec's layout (no "
                               f"{self.where})", Reproduction(received=list(frames))) from exc

    def at(self, wire: Any) -> Any:
        for step in self.steps:
            wire = wire[step.index if step.index is not None else step.field]
        return wire

    def frames(self, spec: Any, entry: Any, oob: Sequence[bytes] = ()) -> list[bytes]:
        """An EngineCoreOutput whose carrier holds the wire value ``entry`` exactly as given
        (the nested structs' other tensor fields empty, in the release's form)."""
        wire = list(expected_wire({"request_id": "req-t", "new_token_ids": [1]}, OUTPUT,
                                  spec).value)
        self.put(spec, wire, entry)
        return [msgspec.msgpack.encode(wire), *oob]

    def put(self, spec: Any, wire: Any, entry: Any) -> None:
        """Set the carrier of the raw EngineCoreOutput ``wire`` to ``entry``, filling a nil
        nested struct on the way with :func:`_empty_wire_struct`."""
        holder: Any = wire
        for position, step in enumerate(self.steps):
            key = step.index if step.index is not None else step.field
            if position == len(self.steps) - 1:
                holder[key] = entry
            else:
                if holder[key] is None:
                    holder[key] = _empty_wire_struct(spec, self.steps[position + 1].struct)
                holder = holder[key]

    def decoded(self, value: Any) -> Any:
        """The carrier's value in a decoded EngineCoreOutput."""
        for step in self.steps:
            value = field_value(value, step.field)
        return value


def tensor_form(spec: Any, family: str = "tensor") -> str:
    """The release's form of a tensor (``family`` ``tensor``) or an ndarray."""
    surface = spec.surface("tensors")
    return str(surface.tensor_form if family == "tensor" else surface.ndarray_form)


def require_form(spec: Any, family: str, *forms: str) -> str:
    """The release's form of ``family``; NOT APPLICABLE unless it is one of ``forms``."""
    form = tensor_form(spec, family)
    if form not in forms:
        raise NotInRelease(f"vLLM {spec.version} sends a {family} as {FORM_NAMES[form]} "
                           f"(tensors surface, {family}_form {form!r}), not in the form this "
                           "check is about")
    return form


def numpy_twin(spec: Any, name: str) -> str:
    """numpy's dtype.str of the numpy view of a torch ``name`` tensor (the reference's
    ``TORCH_TO_NUMPY``), the dtype the ``numpy`` and ``pickle`` forms send; NOT APPLICABLE for
    a torch dtype numpy lacks (bfloat16, complex32, the float8 and float4 types): such a tensor
    cannot travel in those forms."""
    from enginewire.reference.tensors import TORCH_TO_NUMPY

    twin = TORCH_TO_NUMPY.get(name)
    if twin is None:
        form = tensor_form(spec)
        raise NotInRelease(f"vLLM {spec.version} sends a tensor through its numpy view "
                           f"({form} form: {FORM_NAMES[form]}), and numpy has no {name}")
    return twin


def tuple_dtype(spec: Any, name: str) -> str:
    """The dtype string a tensor of torch dtype ``name`` carries in the release's
    ``[dtype, shape, data]`` tuple: ``name`` in the ``tuple`` form, :func:`numpy_twin` in the
    ``numpy`` form (vLLM 0.8.4); NOT APPLICABLE in the ``pickle`` form (no tuple at all)."""
    if require_form(spec, "tensor", "tuple", "numpy") == "tuple":
        return name
    return numpy_twin(spec, name)


def carrier(spec: Any, family: str) -> Carrier:
    """The field a ``family`` (``tensor`` or ``ndarray``) check carries its value in at the
    release of ``spec`` (see the module docstring); NOT APPLICABLE where there is none."""
    found = _carriers(spec, family)
    if not found:
        article = "an" if family == "ndarray" else "a"
        raise NotInRelease(f"vLLM {spec.version} has no field that carries {article} {family} "
                           f"(none of type {family} in {OUTPUT} or the structs its fields "
                           "reach)")
    return found[0]


def carriers(spec: Any, family: str) -> list[Carrier]:
    """Every carrier of ``family`` at the release, in :func:`carrier`'s order."""
    return _carriers(spec, family)


def _carriers(spec: Any, family: str) -> list[Carrier]:
    found: list[Carrier] = []
    level: list[tuple[tuple[Step, ...], str]] = [((), OUTPUT)]
    for _depth in range(_MAX_DEPTH):
        below: list[tuple[tuple[Step, ...], str]] = []
        for path, name in level:
            item = spec.structs.get(name)
            if not isinstance(item, StructSpec):
                continue
            positional = item.encoding in ("array", "tuple")
            for index, fld in enumerate(item.fields):
                expr = parse_type(fld.type).without_none()
                step = Step(name, fld.name, index if positional else None)
                if tensor_family(expr) == family:
                    found.append(Carrier(family, (*path, step)))
                elif isinstance(spec.structs.get(expr.name), StructSpec):
                    below.append(((*path, step), expr.name))
        level = below
    return found


def empty_value(family: str) -> Any:
    """A value of ``family`` with no bytes (int64, shape [0])."""
    import numpy as np

    if family == "ndarray":
        return np.empty(0, dtype="<i8")
    import torch

    return torch.empty(0, dtype=torch.int64)


def _filled(spec: Any, struct: str) -> dict[str, Any]:
    """A neutral ``struct`` with its required fields set and its tensor and array fields
    empty."""
    value = dict(Sampler(spec).required(struct))
    for fld in spec.struct(struct).fields:
        family = tensor_family(parse_type(fld.type).without_none())
        if family is not None:
            value[fld.name] = empty_value(family)
    return value


def empty_wire(spec: Any, family: str) -> Any:
    """The wire value of :func:`empty_value` in the release's form."""
    import numpy as np

    form = tensor_form(spec, family)
    if form == "pickle":
        return msgspec.msgpack.Ext(spec.ext_code("tensor"),
                                   pickle.dumps(np.empty(0, dtype="<i8")))
    raw_view = spec.ext_code("raw_view")
    dtype = "int64" if family == "tensor" and form == "tuple" else "<i8"
    return [dtype, [0], msgspec.msgpack.Ext(raw_view, b"")]


def _empty_wire_struct(spec: Any, struct: str) -> Any:
    """The wire value of :func:`_filled` ``struct`` (tensor fields by :func:`empty_wire`,
    trailing defaulted fields left out)."""
    item = spec.struct(struct)
    sample = Sampler(spec).required(struct)
    values: dict[str, Any] = {}
    for fld in item.fields:
        family = tensor_family(parse_type(fld.type).without_none())
        if family is not None:
            values[fld.name] = empty_wire(spec, family)
        elif fld.name in sample:
            values[fld.name] = expected_wire(sample[fld.name], fld.type, spec).value
    if item.encoding in ("map", "dataclass"):
        return values
    out: list[Any] = []
    for fld in item.fields:
        if fld.name not in values:
            break
        out.append(values[fld.name])
    return out
