"""Differential encoder fuzzing: a target's encode against the spec oracle's bytes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import enginewire.fuzz.mutants  # noqa: F401 - registers the mutant:NAME target provider
from enginewire.cli import main
from enginewire.conformance.oracle.samples import minimal_request
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.conformance.targets.resolve import load_target
from enginewire.fuzz.differential import (
    EncoderCampaign,
    compare_encoding,
    encode_wire,
    encoder_kinds,
    fuzz_encoder,
    msgpack_tokens,
    oracle_frames,
)
from enginewire.fuzz.mutants import codec_mutants
from enginewire.reference import structs


def test_tokens_carry_paths_and_rebuild_the_bytes() -> None:
    data = msgspec.msgpack.encode({"a": [1, 2.5, "x"], "b": {"c": None}})
    tokens = msgpack_tokens(data)
    assert b"".join(t.raw for t in tokens) == data
    assert [(t.path, t.kind) for t in tokens if t.kind not in ("key",)] == [
        ("$", "map"), ("$.a", "array"), ("$.a[0]", "int"), ("$.a[1]", "float64"),
        ("$.a[2]", "str"), ("$.b", "map"), ("$.b.c", "nil")]
    with pytest.raises(ValueError):
        msgpack_tokens(data[:-1])


def test_the_oracle_writes_what_msgspec_writes() -> None:
    """A default SamplingParams: msgspec sizes the map header of an omit_defaults struct for
    all its fields (de 0000), and the oracle does too."""
    request = minimal_request()
    frames = oracle_frames("add", request)
    assert frames.frames == [bytes(f) for f in ReferenceCodec().encode("add", request)]
    assert msgspec.msgpack.encode(structs.SamplingParams()) == b"\xde\x00\x00"
    assert encode_wire({}) == b"\x80"


def test_the_reference_encoder_is_the_oracle() -> None:
    kinds = ["add", "outputs", "abort", "utility", "hello"]
    report = fuzz_encoder(ReferenceCodec().encode, kinds, EncoderCampaign(max_examples=8,
                                                                         seed=0))
    assert report.findings == [], report.render()
    assert report.cases == 8 * len(kinds)


@pytest.mark.slow
def test_the_reference_encoder_is_the_oracle_for_every_kind() -> None:
    codec = ReferenceCodec()
    report = fuzz_encoder(codec.encode, encoder_kinds(codec), EncoderCampaign(
        max_examples=60, seed=1))
    assert report.findings == [], report.render()


def test_a_float_written_as_float32_is_named_with_its_struct_path_and_clause() -> None:
    codec = codec_mutants.FloatsAsFloat32()
    request = minimal_request()
    request["arrival_time"] = 1.5
    found = compare_encoding(codec.encode, "add", request)
    assert found is not None
    assert (found.problem, found.clause) == ("encoding-differs", "structs.float.float64")
    assert found.where == "EngineCoreRequest.arrival_time at $[5]"
    assert "float32 1.5" in found.message and "same value" in found.message
    assert codec.decode("add", codec.encode("add", request)) is not None


def test_swapped_fields_are_misread() -> None:
    request = minimal_request(prompt_token_ids=[1, 2])
    found = compare_encoding(codec_mutants.SwappedStructFields().encode, "add", request)
    assert found is not None and found.problem == "misread"
    assert found.clause == "structs.array.field-order"
    assert "EngineCoreRequest.prompt_token_ids" in found.where


def test_a_swapped_type_byte_is_a_misread_request_type() -> None:
    found = compare_encoding(codec_mutants.SwappedTypeBytes().encode, "add", minimal_request())
    assert found is not None
    assert (found.problem, found.clause, found.where) == (
        "misread", "request_types.byte-table", "frame 0")


def test_kinds_follow_the_codec_role() -> None:
    class Frontend(ReferenceCodec):
        role = "frontend"

    kinds = encoder_kinds(Frontend())
    assert "add" in kinds and "outputs" not in kinds
    target = load_target("reference")
    try:
        assert "outputs" in encoder_kinds(target.codec)
    finally:
        target.close()


def test_the_command(capsys: Any) -> None:
    assert main(["fuzz", "--surface", "encoder", "--target", "mutant:floats-as-float32",
                 "--kind", "add", "--max-examples", "10", "--seed", "0",
                 "--no-database"]) == 1
    out = capsys.readouterr().out
    assert "[encoder] add: encoding-differs" in out and "structs.float.float64" in out
    assert main(["fuzz", "--surface", "encoder", "--target", "reference", "--kind", "abort",
                 "--max-examples", "5", "--seed", "0", "--no-database"]) == 0
