"""The multi-field rules and type bytes of the spec data: the loader's API over them and the
errors it raises for a broken file."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from enginewire.spec import load
from enginewire.spec.loader import DATA_DIR, SpecError


def test_rule_api() -> None:
    spec = load()
    assert spec.ext_code("raw_view") == 3 and spec.ext_code("pickle") == 1
    assert spec.request_type_byte("ADD") == b"\x00"
    (rule,) = spec.constraints("EngineCoreRequest", "exactly-one-of")
    assert rule.fields == ["sampling_params", "pooling_params"]
    assert rule.clause == "structs.exclusive-params"
    union = spec.tagged_union("MultiModalFieldElem", "field")
    assert union.tags == {"batched": "MultiModalBatchedField", "flat": "MultiModalFlatField",
                          "shared": "MultiModalSharedField"}
    assert [s.name for s in spec.chunk_states()] == [
        "not-written", "written", "partly-read", "read-by-all"]
    with pytest.raises(KeyError, match="no extension code 'zstd'"):
        spec.ext_code("zstd")
    with pytest.raises(KeyError, match="no request type 'PING'"):
        spec.request_type_byte("PING")
    with pytest.raises(KeyError, match="not a tagged union"):
        spec.tagged_union("EngineCoreRequest", "request_id")


def test_type_byte_frames_take_their_byte_from_request_types() -> None:
    spec = load()
    table = {t.name: t.byte for t in spec.surface("request_types").types}
    seen = 0
    for message in spec.surface("frames").messages:
        for frame in message.frames:
            if frame.content == "type_byte":
                assert frame.literal_hex == f"{table[message.request_type]:02x}", message.kind
                seen += 1
    assert seen == 4


def test_changing_the_request_type_table_moves_the_frame_byte(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    _replace(data / "request_types.toml", 'name = "ADD"\nbyte = 0x00',
             'name = "ADD"\nbyte = 0x07')
    spec = load(data_dir=data)
    add = next(m for m in spec.surface("frames").messages if m.kind == "add")
    assert add.frames[0].literal_hex == "07"


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(DATA_DIR, copy)
    return copy


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path.name}"
    path.write_text(text.replace(old, new))


def _edit(file: str, old: str, new: str) -> Callable[[Path], None]:
    return lambda data: _replace(data / file, old, new)


REQUEST = "structs/EngineCoreRequest.toml"
ELEM = "structs/MultiModalFieldElem.toml"
BROKEN: dict[str, tuple[Callable[[Path], None], str, str, str]] = {
    "constraint names an unknown field": (
        _edit(REQUEST, 'fields = ["sampling_params", "pooling_params"]',
              'fields = ["sampling_params", "nope"]'),
        REQUEST, r"constraints\[0\]\.fields", "unknown: \\['nope'\\]"),
    "constraint over one field": (
        _edit(REQUEST, 'fields = ["sampling_params", "pooling_params"]',
              'fields = ["sampling_params"]'),
        REQUEST, r"constraints\[0\]\.fields", "two or more fields"),
    "constraint over a non-nullable field": (
        _edit(REQUEST, 'fields = ["sampling_params", "pooling_params"]',
              'fields = ["sampling_params", "request_id"]'),
        REQUEST, r"constraints\[0\]\.fields", "must be nullable"),
    "constraint names an unknown clause": (
        _edit(REQUEST, 'clause = "structs.exclusive-params"', 'clause = "structs.nope"'),
        REQUEST, r"constraints\[0\]\.clause", "unknown clause 'structs.nope'"),
    "constraint of an unknown kind": (
        _edit(REQUEST, 'kind = "exactly-one-of"', 'kind = "at-most-one-of"'),
        REQUEST, r"constraints\[0\]\.kind", "Expected `str`|Invalid enum value"),
    "tag names a struct outside the field type": (
        _edit(ELEM, 'shared = "MultiModalSharedField"', 'shared = "PrefixCacheStats"'),
        ELEM, r"tagged_unions\[0\]\.tags", "exactly once"),
    "tag table misses a member": (
        _edit(ELEM, 'shared = "MultiModalSharedField"\n', ''),
        ELEM, r"tagged_unions\[0\]\.tags", "exactly once"),
    "tagged union on a field that is no tuple": (
        _edit(ELEM, 'field = "field"\nclause', 'field = "data"\nclause'),
        ELEM, r"tagged_unions\[0\]\.field", "tuple\\[str, A \\| B"),
    "type_byte frame with its own byte": (
        _edit("frames.toml", 'content = "type_byte"\ndescription = "Request type ADD."',
              'content = "type_byte"\nliteral_hex = "00"\ndescription = "Request type ADD."'),
        "frames.toml", r"messages\[\d+\]\.frames\[0\]\.literal_hex", "leave literal_hex out"),
    "type_byte frame of a message without request type": (
        _edit("frames.toml", 'request_type = "ADD"\n', ''),
        "frames.toml", r"messages\[\d+\]\.request_type", "names no on-wire request type"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_rule_data_is_refused(tmp_path: Path, case: str) -> None:
    breaker, file, field_pattern, message_pattern = BROKEN[case]
    data = _copy(tmp_path)
    breaker(data)
    with pytest.raises(SpecError) as caught:
        load(data_dir=data)
    error = caught.value
    assert error.file == file, str(error)
    assert error.field is not None and re.fullmatch(field_pattern, error.field), str(error)
    assert re.search(message_pattern, error.message), str(error)
