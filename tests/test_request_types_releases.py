"""The request type bytes of every release: ``request_types.toml`` entries carry version ranges
(UTILITY 0x02 up to vLLM 0.8.2 and 0x03 from 0.8.3; START_DP 0x02 at 0.8.3-0.8.4,
START_DP_WAVE from 0.8.5; EXECUTOR_FAILED from 0.8.5, WAKEUP from 0.18.0), ``load(X)`` keeps
X's, and the reference codec, engine session, suite peers and checks speak X's bytes; the spec
check holds the table to the history's ``[[request_types]]`` rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest
from test_release_checks import _status

from enginewire.conformance.framework.outcomes import FAILED, NOT_APPLICABLE, PASSED
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.reference.codec import Codec
from enginewire.reference.errors import FramingError
from enginewire.reference.session import EngineSession
from enginewire.spec import load
from enginewire.spec.history.release_facts import message_gap, request_types_at
from enginewire.spec.loader import DATA_DIR, SpecError
from enginewire.spec.versions import VersionRange


def _table(version: str) -> dict[str, int]:
    return {t.name: t.byte for t in load(version).surface("request_types").types}


def test_each_release_loads_its_own_table() -> None:
    assert _table("0.7.3") == {"ADD": 0, "ABORT": 1, "UTILITY": 2}
    assert _table("0.8.2") == {"ADD": 0, "ABORT": 1, "UTILITY": 2}
    assert _table("0.8.4") == {"ADD": 0, "ABORT": 1, "START_DP": 2, "UTILITY": 3}
    assert _table("0.8.5") == {"ADD": 0, "ABORT": 1, "START_DP_WAVE": 2, "UTILITY": 3,
                               "EXECUTOR_FAILED": 4}
    assert _table("0.18.0") == {**_table("0.8.5"), "WAKEUP": 5}
    assert _table("0.33.0") == _table("0.18.0")
    assert load("0.7.3").request_type_byte("UTILITY") == b"\x02"
    assert load("0.8.4").request_type_byte("START_DP") == b"\x02"
    assert load("0.8.4").request_type_byte("UTILITY") == b"\x03"
    with pytest.raises(KeyError, match="no request type 'START_DP_WAVE'.*0.8.4.*START_DP 0x02"):
        load("0.8.4").request_type_byte("START_DP_WAVE")
    # The surface exists from the oldest release it has entries for, and the table the loader
    # gives is the history's at the releases these tests name.
    assert "0.7.3" in VersionRange.parse(load("0.7.3").surface("request_types").versions)
    for version in ("0.7.3", "0.8.3", "0.8.4", "0.8.5", "0.17.1", "0.18.0"):
        assert _table(version) == request_types_at(version), version


def test_type_frames_and_messages_follow_the_release() -> None:
    """The frames surface's type bytes are the release's; a request whose type the release
    lacks has no byte, the codec has no such kind, and message_gap says why."""
    def type_hex(version: str) -> dict[str, str | None]:
        return {m.kind: m.frames[0].literal_hex for m in load(version).surface("frames").messages
                if m.request_type}

    assert type_hex("0.7.3") == {"add": "00", "abort": "01", "utility": "02",
                                 "start_dp_wave": None}
    assert type_hex("0.8.4")["utility"] == "03" and type_hex("0.8.4")["start_dp_wave"] is None
    assert type_hex("0.9.1")["start_dp_wave"] == "02"
    gap = message_gap(load("0.8.4"), "start_dp_wave")
    assert gap is not None and "0.8.4 has no request type START_DP_WAVE" in gap, gap
    assert "START_DP 0x02" in gap
    assert message_gap(load("0.7.3"), "utility") is None
    assert "start_dp_wave" not in Codec(version="0.7.3").message_kinds
    with pytest.raises(KeyError, match="0.7.3 has no start_dp_wave message"):
        Codec(version="0.7.3").encode("start_dp_wave", [1, None])


def test_reference_codec_writes_and_reads_the_release_bytes() -> None:
    old = Codec(version="0.7.3")
    frames = [bytes(f) for f in old.encode("utility", [7, "is_sleeping", []])]
    assert frames[0] == b"\x02"
    assert old.decode_message("input", frames, sender="frontend").kind == "utility"
    with pytest.raises(FramingError) as caught:  # 0x03 names nothing at 0.7.3
        old.decode_message("input", [b"\x03", frames[1]], sender="frontend")
    assert caught.value.clause == "request_types.unknown-byte-rejected"

    mid = Codec(version="0.8.4")
    frames = [bytes(f) for f in mid.encode("utility", [7, "is_sleeping", []])]
    assert frames[0] == b"\x03"
    assert mid.decode_message("input", frames, sender="frontend").kind == "utility"
    # 0x02 is START_DP there, a request the spec describes no message of: never a UTILITY.
    with pytest.raises(FramingError):
        mid.decode_message("input", [b"\x02", msgspec.msgpack.encode(None)], sender="frontend")


def test_reference_engine_session_reads_the_release_bytes() -> None:
    old = EngineSession(spec=load("0.7.3"))
    assert old.request_event(b"\x02") == ("UTILITY", "utility")
    with pytest.raises(FramingError) as caught:
        old.request_event(b"\x04")  # no sentinel before 0.8.5: an unknown byte
    assert caught.value.clause == "request_types.unknown-byte-rejected"
    newest = EngineSession(spec=load())
    assert newest.request_event(b"\x03") == ("UTILITY", "utility")
    with pytest.raises(FramingError) as caught:
        newest.request_event(b"\x04")
    assert caught.value.clause == "request_types.sentinels-never-on-wire"


class NewestTypeBytes(ReferenceCodec):
    """A codec for an older release that writes the newest release's type bytes."""

    def encode(self, kind, value):  # type: ignore[no-untyped-def]
        frames = list(super().encode(kind, value))
        if kind in ("add", "abort", "utility"):
            frames[0] = load().request_type_byte(kind.upper())
        return frames


class ReadsNewestTypeBytes(ReferenceCodec):
    """A codec for an older release that reads only the newest release's UTILITY byte."""

    def decode(self, kind, frames):  # type: ignore[no-untyped-def]
        if kind == "utility" and bytes(frames[0]) != load().request_type_byte("UTILITY"):
            raise FramingError("request_types.unknown-byte-rejected", "utility type frame",
                               expected=load().request_type_byte("UTILITY"),
                               got=bytes(frames[0]))
        return super().decode(kind, frames)


def test_a_codec_with_the_newest_type_bytes_fails_at_0_7_3() -> None:
    """The type-byte checks have power at 0.7.3: the reference passes them; a codec writing
    UTILITY as 0x03 fails the utility frames check, one that reads only 0x03 the round trip;
    at 0.8.4, whose UTILITY is 0x03 too, the newest bytes pass."""
    pattern = "codec/message/utility/frames"
    assert _status("0.7.3", pattern)[0] == PASSED
    status, message = _status("0.7.3", pattern, NewestTypeBytes(version="0.7.3"))
    assert status == FAILED and "03" in message and "02" in message, (status, message)
    status, _ = _status("0.7.3", "codec/message/utility/round-trip",
                        ReadsNewestTypeBytes(version="0.7.3"))
    assert status == FAILED
    assert _status("0.8.4", pattern, NewestTypeBytes(version="0.8.4"))[0] == PASSED


def test_sentinel_checks_are_not_applicable_before_the_sentinels() -> None:
    status, message = _status("0.7.3", "codec/reject/sentinel-executor-failed")
    assert status == NOT_APPLICABLE and "0.7.3 has no request type EXECUTOR_FAILED" in message, (
        message)
    status, message = _status("0.17.1", "codec/reject/sentinel-wakeup")
    assert status == NOT_APPLICABLE and "0.17.1 has no request type WAKEUP" in message, message
    status, message = _status("0.7.3", "codec/reject/wrong-type-for-kind")
    assert status == PASSED, message


def test_spec_check_fails_when_the_table_disagrees_with_the_history(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A request_types.toml that gives 0.7.3-0.8.2 the newest UTILITY byte loads, and the
    spec check names each release where it disagrees with [[request_types]]."""
    from enginewire.cli import main

    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "request_types.toml"
    text = path.read_text()
    old = 'byte = 0x02\nversions = "0.7.3-0.8.2"'
    assert old in text
    path.write_text(text.replace(old, 'byte = 0x03\nversions = "0.7.3-0.8.2"'))
    assert load("0.7.3", data).request_type_byte("UTILITY") == b"\x03"
    assert main(["spec", "check", "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert "request_types.toml at 0.7.3: ADD 0x00, ABORT 0x01, UTILITY 0x03; " \
        "history/constants.toml [[request_types]] says ADD 0x00, ABORT 0x01, UTILITY 0x02" in err
    assert "request_types.toml at 0.8.3" not in err


def test_consistency_names_each_release_that_disagrees(tmp_path: Path) -> None:
    """WAKEUP a release early: the consistency pass names 0.17.1, and no other release."""
    from enginewire.spec.history import consistency

    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "request_types.toml"
    path.write_text(path.read_text().replace('versions = "0.18.0+"', 'versions = "0.17.1+"'))
    found = [p for p in consistency.problems(data) if p.startswith("request_types.toml")]
    assert len(found) == 1 and found[0].startswith("request_types.toml at 0.17.1:"), found
    assert "WAKEUP 0x05" in found[0] and "[[request_types]] says" in found[0]


def test_overlapping_entries_are_a_spec_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "request_types.toml"
    text = path.read_text()
    path.write_text(text.replace('versions = "0.8.3-0.8.4"', 'versions = "0.8.2-0.8.4"'))
    with pytest.raises(SpecError, match="at a release a name has one byte and a byte one name"):
        load("0.8.4", data)
