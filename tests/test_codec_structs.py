"""The msgspec classes of enginewire.reference.structs follow the spec's struct files."""

from __future__ import annotations

import enum
import typing

import msgspec
import pytest

from enginewire.conformance.oracle.samples import CONTEXTUAL, Sampler
from enginewire.conformance.oracle.values import build, complete, differences, neutral
from enginewire.reference import structs
from enginewire.reference.codec import Codec
from enginewire.reference.structs import NdarraySlot, TensorSlot, UnionSlot
from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, StructSpec

SPEC = load()
BUILT = structs.build()
STRUCTS = sorted(n for n, s in SPEC.structs.items() if isinstance(s, StructSpec))
ENUMS = sorted(n for n, s in SPEC.structs.items() if isinstance(s, EnumSpec))


def test_every_struct_and_enum_is_built() -> None:
    assert sorted(BUILT.classes) == STRUCTS
    assert sorted(BUILT.enums) == ENUMS


def test_module_attributes_are_the_default_version() -> None:
    assert structs.EngineCoreRequest is BUILT["EngineCoreRequest"]
    with pytest.raises(AttributeError):
        structs.NoSuchStruct  # noqa: B018


@pytest.mark.parametrize("name", STRUCTS)
def test_layout_follows_the_spec(name: str) -> None:
    spec = SPEC.struct(name)
    cls = BUILT[name]
    names = [f.name for f in spec.fields]
    if spec.encoding == "tuple":
        assert issubclass(cls, tuple) and list(cls._fields) == names
        required = [f.name for f in spec.fields if f.required]
        assert [n for n in names if n not in cls._field_defaults] == required
        return
    assert list(cls.__struct_fields__) == names
    config = cls.__struct_config__
    assert config.array_like == (spec.encoding == "array")
    assert config.omit_defaults == (spec.omit_defaults and spec.encoding != "dataclass")
    for fld, info in zip(spec.fields, msgspec.structs.fields(cls), strict=True):
        has_default = (info.default is not msgspec.NODEFAULT
                       or info.default_factory is not msgspec.NODEFAULT)
        assert has_default == (not fld.required), fld.name


@pytest.mark.parametrize("name", ENUMS)
def test_enum_members_follow_the_spec(name: str) -> None:
    spec = SPEC.enum(name)
    cls = BUILT[name]
    assert [(m.name, m.value) for m in cls] == [(m.name, m.value) for m in spec.members]
    assert issubclass(cls, enum.IntEnum) == (spec.wire == "int")


def test_type_expressions() -> None:
    assert BUILT.type_of("tensor | none") == typing.Optional[TensorSlot]  # noqa: UP045
    assert BUILT.type_of("ndarray") is NdarraySlot
    assert BUILT.type_of("dict[int, float]") == dict[int, float]
    assert BUILT.type_of("tuple[int, ...]") == tuple[int, ...]
    slot = BUILT.type_of("list[slice] | list[list[slice]]")
    assert issubclass(slot, UnionSlot) and slot.members == (list[slice], list[list[slice]])


def test_mutable_defaults_are_fresh() -> None:
    first, second = structs.SchedulerStats(), structs.SchedulerStats()
    assert first.prefix_cache_stats == second.prefix_cache_stats
    assert first.prefix_cache_stats is not second.prefix_cache_stats
    assert structs.EngineCoreOutputs().outputs is not structs.EngineCoreOutputs().outputs


def test_enum_defaults_are_members() -> None:
    assert structs.SamplingParams().output_kind is structs.RequestOutputKind.CUMULATIVE


def _resolve(name: str) -> typing.Any:
    return BUILT.classes.get(name) or BUILT.enums.get(name)


@pytest.mark.parametrize("full", [True, False], ids=["every-field", "required-only"])
@pytest.mark.parametrize("name", [n for n in STRUCTS if n not in CONTEXTUAL])
def test_sample_round_trip(name: str, full: bool) -> None:
    pytest.importorskip("torch")
    sampler = Sampler(SPEC)
    value = sampler.struct(name, full=full)
    obj = build(value, name, SPEC, _resolve)
    codec = Codec()
    frames = codec.encode(name, obj)
    decoded = codec.decode(name, frames)
    assert differences(complete(value, name, SPEC), neutral(decoded)) == []
    assert [bytes(memoryview(f).cast("B")) for f in codec.encode(name, decoded)] == [
        bytes(memoryview(f).cast("B")) for f in frames
    ]
