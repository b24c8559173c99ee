"""The byte-level facts ``enginewire spec export`` states hold for the reference encoder."""

from __future__ import annotations

import json

import msgspec

from enginewire.cli import main
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.spec.wire_facts import wire_facts


def test_export_carries_the_facts(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["spec", "export"]) == 0
    exported = json.loads(capsys.readouterr().out)["wire_encoding"]
    assert exported == wire_facts()
    assert "de 00 05" in exported["msgpack"]["map_structs"]


def test_the_facts_are_what_the_encoder_writes() -> None:
    codec = ReferenceCodec()
    five = {"n": 2, "temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "seed": 3}
    frame = bytes(codec.encode("SamplingParams", five)[0])
    assert frame[:3] == bytes.fromhex("de0005")
    assert msgspec.msgpack.encode(1.0) == bytes.fromhex("cb3ff0000000000000")
    assert msgspec.msgpack.encode(msgspec.msgpack.Ext(3, b"abcd"))[:2] == bytes.fromhex("d603")
