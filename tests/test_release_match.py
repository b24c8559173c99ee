"""``enginewire spec match TARGET`` for codec targets: a codec written against an older
release's layouts (built from the history itself, :func:`layout_source`) is named by that
release, and a codec that moved a field is reported with the first differing position."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginewire.cli import main
from enginewire.conformance.release_match import match_codec
from enginewire.spec.history.match import layout_source
from enginewire.spec.versions import parse_version

#: Structs whose fields are scalars or other structs of this list: the mirror encodes them with
#: plain msgspec classes. PrefixCacheStats and SchedulerStats changed layout after 0.22.0.
NAMES = ["PrefixCacheStats", "SpecDecodingStats", "KVCacheEvictionEvent", "CUDAGraphStat",
         "DebugPerfStats", "PerfStats", "SchedulerStats"]
RELEASES = ["0.20.0", "0.22.0", "0.25.0", "0.32.0", "0.33.0"]

_CODEC = '''
import msgspec
import {structs} as structs


class Codec:
    """Encodes with the mirrored classes."""

    def encode(self, kind, value):
        cls = getattr(structs, kind)
        # msgspec converts a map only into a map struct; an array struct is built by name.
        obj = cls(**value) if cls.__struct_config__.array_like else msgspec.convert(value, cls)
        return [msgspec.msgpack.encode(obj)]

    def decode(self, kind, frames):
        return msgspec.to_builtins(msgspec.msgpack.decode(bytes(frames[0]),
                                                          type=getattr(structs, kind)))


codec = Codec()


class Target:
    """A target with only a codec surface (``--target mirror_x:Target``)."""

    codec = codec
'''


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("mirror_")]:
        sys.modules.pop(name, None)


def _write(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}_structs.py").write_text(source)
    (folder / f"{name}.py").write_text(_CODEC.format(structs=f"{name}_structs"))


def test_codec_written_against_an_older_release_is_named_by_it(mirror: Path) -> None:
    _write(mirror, "mirror_old", layout_source("0.22.0", NAMES))
    import mirror_old  # type: ignore[import-not-found]

    found = {r.name: r for r in match_codec(mirror_old.codec, RELEASES, NAMES)}
    for name in NAMES:
        assert "0.22.0" in found[name].matches, (name, found[name])
    assert "0.33.0" not in found["PrefixCacheStats"].matches
    assert "0.33.0" not in found["SchedulerStats"].matches


def test_codec_with_a_moved_field_gets_the_nearest_release_and_position(mirror: Path) -> None:
    source = layout_source("0.22.0", ["UtilityOutput"])
    assert "    call_id: int\n    failure_message:" in source
    moved = source.replace("    call_id: int\n", "").replace(
        "    failure_message: str | None = None\n",
        "    failure_message: str | None\n    call_id: int\n")
    _write(mirror, "mirror_moved", moved)
    import mirror_moved  # type: ignore[import-not-found]

    found = match_codec(mirror_moved.codec, RELEASES, ["UtilityOutput"])[0]
    assert found.matches == [] and found.nearest == "0.20.0", found
    assert found.position == "position 0"
    assert found.spec_meaning == "call_id: int"
    assert found.target_meaning == "the value of failure_message"


def test_map_struct_with_an_extra_key_names_the_key(mirror: Path) -> None:
    source = layout_source("0.22.0", NAMES).replace(
        "    preempted_hits: int = 0\n", "    preempted_hits: int = 0\n    zz_extra: int = 5\n")
    _write(mirror, "mirror_extra", source)
    import mirror_extra  # type: ignore[import-not-found]

    found = {r.name: r for r in match_codec(mirror_extra.codec, RELEASES, NAMES)}
    extra = found["PrefixCacheStats"]
    assert extra.matches == [] and extra.position == "key 'zz_extra'", extra
    assert extra.target_meaning == "5 (no field of the sample has it)"
    assert extra.spec_meaning == "(no such key)"


def test_spec_match_cli_probes_an_in_process_codec(mirror: Path, capsys) -> None:
    _write(mirror, "mirror_cli", layout_source("0.22.0", ["SpecDecodingStats"]))
    status = main(["spec", "match", "mirror_cli:Target", "--struct", "SpecDecodingStats",
                   "--struct", "PrefixCacheStats"])
    captured = capsys.readouterr()
    out = captured.out
    line = next((x for x in out.splitlines() if x.startswith("SpecDecodingStats: ")), "")
    # 0.22.0 lies in a run of releases with the same layout: "matches A-B", A <= 0.22.0 <= B.
    first, _, last = line.removeprefix("SpecDecodingStats: matches ").partition("-")
    assert parse_version(first) <= parse_version("0.22.0") <= parse_version(last), (line,
                                                                                   captured.err)
    # PrefixCacheStats is refused by a codec that does not know it: the command fails.
    assert status == 1
    assert "PrefixCacheStats: the target encoded no release's sample" in out


def test_spec_match_cli_refuses_a_target_without_a_codec(capsys) -> None:
    assert main(["spec", "match", "none"]) == 2
    assert "no codec surface" in capsys.readouterr().err


@pytest.mark.slow
def test_spec_match_probes_an_external_codec_program(capsys) -> None:
    """The reference served over the ``--target-cmd`` line protocol speaks 0.33.0's
    EngineCoreOutputs, and the probe says so through the external program."""
    server = f"{sys.executable} -m enginewire.conformance.targets.command_server --surface codec"
    status = main(["spec", "match", "none", "--target-cmd", f"codec={server}",
                   "--struct", "EngineCoreOutputs"])
    assert status == 0
    assert capsys.readouterr().out.strip() == "EngineCoreOutputs: matches 0.33.0"
