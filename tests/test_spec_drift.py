"""``enginewire spec diff``: the pure comparison, and the comparison with the installed vLLM.

The first half builds an :class:`Implementation` from the spec itself, changes one fact and
checks that :func:`compare` names it; it needs no vLLM. The second half (marked ``vllm``)
introspects the installed vLLM and checks the spec matches it, and that edited copies of the
spec files make ``run_diff`` fail naming the edited fact.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from enginewire.spec import load, parse_type
from enginewire.spec.drift import (
    ROOT_CLASSES,
    EnumInfo,
    FieldInfo,
    Implementation,
    StructInfo,
    compare,
    describe_vllm,
    notes,
    run_diff,
)
from enginewire.spec.loader import DATA_DIR, Spec
from enginewire.spec.schema import EnumSpec

# --- pure comparison ---------------------------------------------------------------------


def implementation_from_spec(spec: Spec) -> Implementation:
    """An implementation that agrees with ``spec`` on every fact compare() looks at."""
    impl = Implementation(name="spec", version=spec.version)
    for struct in spec.structs.values():
        if isinstance(struct, EnumSpec):
            impl.classes[struct.vllm_class] = EnumInfo(
                struct.vllm_class, struct.wire, tuple((m.name, m.value) for m in struct.members))
            continue
        refs = {name: spec.structs[name].vllm_class
                for f in struct.fields for name in parse_type(f.type).names()}
        fields = tuple(FieldInfo(f.name, f.type, f.required, f.default, f.default_factory)
                       for f in struct.fields)
        impl.classes[struct.vllm_class] = StructInfo(
            struct.vllm_class, struct.encoding, struct.omit_defaults, fields, refs)
    impl.request_types = {t.name: bytes([t.byte]) for t in spec.surface("request_types").types}
    tensors = spec.surface("tensors")
    impl.ext_codes = {c.name.upper(): c.code for c in tensors.ext_codes}
    impl.threshold_default = tensors.threshold_default
    impl.threshold_env = tensors.threshold_env
    identity = spec.surface("identity")
    impl.identities = [("test", identity.width, identity.byteorder)]
    return impl


def replace_struct(impl: Implementation, qualname: str, **changes) -> None:
    impl.classes[qualname] = dataclasses.replace(impl.classes[qualname], **changes)


@pytest.fixture()
def spec() -> Spec:
    return load()


@pytest.fixture()
def agreeing(spec: Spec) -> Implementation:
    return implementation_from_spec(spec)


def messages(spec: Spec, impl: Implementation) -> list[str]:
    return [str(d) for d in compare(spec, impl)]


def test_agreeing_implementation_has_no_differences(spec, agreeing) -> None:
    assert messages(spec, agreeing) == []


def test_moved_field_is_named_with_both_positions(spec, agreeing) -> None:
    qualname = spec.struct("EngineCoreRequest").vllm_class
    fields = list(agreeing.classes[qualname].fields)
    session = fields.pop(20)
    fields.insert(5, session)
    replace_struct(agreeing, qualname, fields=tuple(fields))
    assert messages(spec, agreeing) == ["EngineCoreRequest.session_id: position 20 in spec, "
                                        "5 in vllm"]


def test_changed_type_default_and_required_are_named(spec, agreeing) -> None:
    qualname = spec.struct("EngineCoreOutputs").vllm_class
    fields = list(agreeing.classes[qualname].fields)
    fields[0] = dataclasses.replace(fields[0], default="1")
    fields[3] = dataclasses.replace(fields[3], type="int")
    fields[8] = FieldInfo("weight_version", "str | none", True)
    replace_struct(agreeing, qualname, fields=tuple(fields))
    assert messages(spec, agreeing) == [
        "EngineCoreOutputs.engine_index: default 0 in spec, default 1 in vllm",
        "EngineCoreOutputs.timestamp: type 'float' in spec, 'int' in vllm",
        "EngineCoreOutputs.weight_version: default null in spec, required in vllm",
    ]


def test_union_order_is_not_a_difference(spec, agreeing) -> None:
    qualname = spec.struct("EngineCoreOutput").vllm_class
    fields = list(agreeing.classes[qualname].fields)
    assert fields[6].name == "stop_reason"
    fields[6] = dataclasses.replace(fields[6], type="none | str | int")
    replace_struct(agreeing, qualname, fields=tuple(fields))
    assert messages(spec, agreeing) == []


def test_added_and_removed_fields_are_named(spec, agreeing) -> None:
    qualname = spec.struct("UtilityOutput").vllm_class
    fields = agreeing.classes[qualname].fields
    replace_struct(agreeing, qualname,
                   fields=fields[:2] + (FieldInfo("elapsed", "float", False, "0.0"),))
    assert messages(spec, agreeing) == [
        "UtilityOutput.result: in spec (position 2), not in vllm",
        "UtilityOutput.elapsed: in vllm (position 2, type 'float'), not in spec",
    ]


def test_encoding_and_omit_defaults_are_compared(spec, agreeing) -> None:
    qualname = spec.struct("EngineCoreRequest").vllm_class
    replace_struct(agreeing, qualname, encoding="map", omit_defaults=False)
    assert messages(spec, agreeing) == [
        "EngineCoreRequest: encoding 'array' in spec, 'map' in vllm",
        "EngineCoreRequest: omit_defaults true in spec, false in vllm",
    ]


def test_enum_value_change_and_new_member_are_named(spec, agreeing) -> None:
    qualname = spec.enum("FinishReason").vllm_class
    members = dict(agreeing.classes[qualname].members)
    members["REPETITION"] = 5
    members["TIMEOUT"] = 6
    agreeing.classes[qualname] = EnumInfo(qualname, "int", tuple(members.items()))
    assert messages(spec, agreeing) == [
        "FinishReason.REPETITION: value 4 in spec, 5 in vllm",
        "FinishReason.TIMEOUT: value 6 in vllm, not in spec",
    ]


def test_class_missing_from_spec_is_reported(spec, agreeing) -> None:
    trimmed = dataclasses.replace(
        spec, structs={n: s for n, s in spec.structs.items() if n != "PrefillStats"})
    found = messages(trimmed, agreeing)
    assert found == ["EngineCoreOutput.prefill_stats: type names vllm class "
                     "vllm.v1.metrics.stats:PrefillStats, which the spec does not describe"]


def test_missing_root_is_reported(spec, agreeing) -> None:
    trimmed = dataclasses.replace(
        spec, structs={n: s for n, s in spec.structs.items() if n != "UtilityOutput"})
    assert "vllm.v1.engine:UtilityOutput" in ROOT_CLASSES
    assert any(m.startswith("vllm.v1.engine:UtilityOutput: a payload type")
               for m in messages(trimmed, agreeing))


def test_request_type_byte_and_constants_are_compared(spec, agreeing) -> None:
    agreeing.request_types["ADD"] = b"\x07"
    agreeing.ext_codes["RAW_VIEW"] = 9
    agreeing.threshold_default = 512
    agreeing.identities.append(("engine", 4, "big"))
    assert messages(spec, agreeing) == [
        "request_types.ADD: byte 0x00 in spec, 07 in vllm",
        "tensors.ext_codes.raw_view: code 3 in spec, 9 in vllm",
        "tensors.threshold_default: 256 in spec, 512 in vllm",
        "identity.width: 2 in spec, 4 in vllm (engine)",
        "identity.byteorder: little in spec, big in vllm (engine)",
    ]


def test_ring_constants_compared_only_where_the_spec_has_them(spec, agreeing) -> None:
    agreeing.ring_constants = {"max_chunks_default": 10, "notify_poll_interval_s": 2.0}
    ring = spec.surface("ring")
    with_constants = dataclasses.replace(spec, surfaces={
        **spec.surfaces,
        "ring": msgspec.structs.replace(ring, constants={"max_chunks_default": 12}),
    })
    assert messages(with_constants, agreeing) == [
        "ring.constants.max_chunks_default: 12 in spec, 10 in vllm"]


def test_unimportable_implementation_exits_2(spec, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert run_diff(spec, against="vllm") == 2
    assert "cannot import vllm" in capsys.readouterr().err


# --- against the installed vLLM ----------------------------------------------------------


@pytest.fixture(scope="module")
def installed() -> Implementation:
    pytest.importorskip("vllm")
    spec = load()
    return describe_vllm(s.vllm_class for s in spec.structs.values())


def copy_spec(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    return data


def edit_field_block(path: Path, field: str, edit) -> None:
    """Apply ``edit(blocks, index)`` to the ``[[fields]]`` blocks of one struct file."""
    head, *blocks = path.read_text().split("[[fields]]\n")
    index = next(i for i, b in enumerate(blocks) if b.startswith(f'name = "{field}"\n'))
    edit(blocks, index)
    path.write_text(head + "".join("[[fields]]\n" + b for b in blocks))


@pytest.mark.vllm
def test_installed_vllm_has_no_drift(installed) -> None:
    assert messages(load(), installed) == []


@pytest.mark.vllm
def test_installed_vllm_is_described_by_introspection(installed) -> None:
    request = installed.classes["vllm.v1.engine:EngineCoreRequest"]
    assert isinstance(request, StructInfo)
    assert (request.encoding, request.omit_defaults, len(request.fields)) == ("array", True, 22)
    assert installed.request_types["UTILITY"] == b"\x03"
    assert installed.ext_codes == {"PICKLE": 1, "CLOUDPICKLE": 2, "RAW_VIEW": 3}
    assert installed.ring_constants["oob_threshold_bytes"] == 1024 * 1024
    assert {(w, o) for _, w, o in installed.identities} == {(2, "little")}
    assert installed.unavailable == {}


@pytest.mark.vllm
def test_annotations_narrower_than_the_wire_are_compared_as_sent_with_notes(installed) -> None:
    def field(qualname: str, name: str) -> FieldInfo:
        info = installed.classes[qualname]
        assert isinstance(info, StructInfo)
        return next(f for f in info.fields if f.name == name)

    # NestedTensors is the grammar's nested_tensors; the encoder writes nil for data=None.
    assert field("vllm.multimodal.inputs:MultiModalFieldElem", "data").type == \
        "nested_tensors | none"
    # publisher is declared None and made 'null' by __post_init__: the string travels.
    publisher = field("vllm.config.kv_events:KVEventsConfig", "publisher")
    assert (publisher.type, publisher.default) == ("str", '"null"')
    found = notes(load(), installed)
    assert [n.split(":", 1)[0] for n in found] == ["KVEventsConfig.publisher",
                                                   "MultiModalFieldElem.data"]


@pytest.mark.vllm
def test_moved_field_in_spec_copy_fails_diff(installed, tmp_path, capsys) -> None:
    data = copy_spec(tmp_path)

    current = [f.name for f in load().struct("EngineCoreRequest").fields]

    def move_session_id(blocks: list[str], index: int) -> None:
        moved = blocks.pop(index)
        # before the block of the field at position 11 (older releases' entries lie between)
        at = next(i for i, b in enumerate(blocks) if b.startswith(f'name = "{current[11]}"\n')
                  and not re.search(r'^versions = "[0-9.]+(-[0-9.]+)?"$', b, re.MULTILINE))
        blocks.insert(at, moved)

    edit_field_block(data / "structs" / "EngineCoreRequest.toml", "session_id", move_session_id)
    modified = load(data_dir=data)
    assert [f.name for f in modified.struct("EngineCoreRequest").fields][11] == "session_id"
    assert run_diff(modified, against="vllm") == 1
    out = capsys.readouterr().out
    assert "EngineCoreRequest.session_id: position 11 in spec, 20 in vllm" in out


@pytest.mark.vllm
def test_changed_default_in_spec_copy_is_reported(installed, tmp_path) -> None:
    data = copy_spec(tmp_path)

    def change_default(blocks: list[str], index: int) -> None:
        assert 'default = "0"' in blocks[index]
        blocks[index] = blocks[index].replace('default = "0"', 'default = "1"')

    edit_field_block(data / "structs" / "EngineCoreRequest.toml", "client_index", change_default)
    assert messages(load(data_dir=data), installed) == [
        "EngineCoreRequest.client_index: default 1 in spec, default 0 in vllm"]


@pytest.mark.vllm
def test_changed_type_byte_in_spec_copy_is_reported(installed, tmp_path) -> None:
    data = copy_spec(tmp_path)
    path = data / "request_types.toml"
    text = path.read_text()
    assert text.count("byte = 0x01\n") == 1
    path.write_text(text.replace("byte = 0x01\n", "byte = 0x09\n"))
    assert messages(load(data_dir=data), installed) == [
        "request_types.ABORT: byte 0x09 in spec, 01 in vllm"]


@pytest.mark.slow
@pytest.mark.vllm
def test_cli_diff_against_vllm_exits_0() -> None:
    pytest.importorskip("vllm")
    result = subprocess.run(
        [sys.executable, "-m", "enginewire", "spec", "diff", "--against", "vllm"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no differences" in result.stdout
    assert "note: MultiModalFieldElem.data: annotated 'nested_tensors'" in result.stdout
