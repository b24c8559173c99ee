"""No pass without evidence: NotImplementedError, declared gaps, codec roles, spec-only checks.

Each test builds a broken or partial target and asserts the verdicts the runner gives it.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from enginewire.conformance.framework.outcomes import (
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    PASSED,
    SPEC_ONLY,
)
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target, is_rejection
from enginewire.conformance.targets.external import command_surfaces
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.spec import load

#: Attributes a surface reads as flags or declarations, not operations.
_FLAGS = ("unsupported", "role", "handshake", "borrowed_reads", "supports_coordinated_dp",
          "close")


class RefusesEverything:
    """Every operation of every surface raises NotImplementedError."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _FLAGS:
            raise AttributeError(name)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"{name} is not implemented")

        return refuse


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


def test_not_implemented_everywhere_passes_nothing(spec: Any) -> None:
    target = Target("nothing", codec=RefusesEverything(), ring=RefusesEverything(),
                    engine=RefusesEverything(), frontend=RefusesEverything())
    result = run(all_checks(), target, spec, strict=True)
    passed = [r.check.id for r in result.results if r.status == PASSED]
    failed = [r.check.id for r in result.results if r.status == FAILED]
    assert passed == []
    assert failed == []
    assert result.count(NOT_IMPLEMENTED) > 400


def test_spec_only_check_is_not_the_targets_pass(spec: Any) -> None:
    checks = select(all_checks(), patterns=["codec/spec/*"])
    assert checks
    result = run(checks, Target("reference", codec=ReferenceCodec()), spec, strict=True)
    assert {r.status for r in result.results} == {SPEC_ONLY}
    assert result.count(PASSED) == 0


class NotImplementedRejections(ReferenceCodec):
    """The reference codec, except that it raises NotImplementedError for whatever it
    refuses (an adapter with no decoder for a kind)."""

    def decode(self, kind: str, frames: Any) -> Any:
        try:
            return super().decode(kind, frames)
        except Exception as exc:
            raise NotImplementedError(f"cannot decode: {exc}") from None


def test_not_implemented_is_no_rejection(spec: Any) -> None:
    checks = select(all_checks(), patterns=["codec/*missing-required*", "codec/*wrong-type*",
                                            "codec/*garbage*"])
    assert checks
    good = run(checks, Target("reference", codec=ReferenceCodec()), spec, strict=True)
    assert good.count(FAILED) == 0 and good.count(PASSED) == len(checks)
    bad = run(checks, Target("partial", codec=NotImplementedRejections()), spec, strict=True)
    assert bad.count(PASSED) == 0
    assert bad.count(NOT_IMPLEMENTED) == len(checks)


def test_is_rejection() -> None:
    import msgspec

    from enginewire.reference.errors import TensorError

    assert is_rejection(msgspec.ValidationError("x"))
    assert is_rejection(TensorError("tensors.tuple-layout", "bad"))
    assert is_rejection(RuntimeError("x"))
    assert not is_rejection(NotImplementedError("x"))


class DeclaresNoOutputsDecoder(ReferenceCodec):
    unsupported = ("decode:EngineCoreOutputs", "decode:outputs")

    def decode(self, kind: str, frames: Any) -> Any:
        if kind in ("EngineCoreOutputs", "outputs"):
            raise AssertionError("a declared unsupported kind must never be called")
        return super().decode(kind, frames)


def test_declared_unsupported_kind_is_not_implemented(spec: Any) -> None:
    checks = select(all_checks(), surfaces=["codec"])
    result = run(checks, Target("partial", codec=DeclaresNoOutputsDecoder()), spec,
                 strict=True)
    missing = [r for r in result.results if r.status == NOT_IMPLEMENTED]
    assert missing and all("declared unsupported" in r.message for r in missing)
    assert result.count(FAILED) == len(
        [r for r in run(checks, Target("reference", codec=ReferenceCodec()), spec,
                        strict=True).results if r.status == FAILED])


class EngineSide(ReferenceCodec):
    """An engine-side codec: decodes what front ends send, encodes what engines send."""

    role = "engine"


class EngineSideNoOutputs(EngineSide):
    """Broken: an engine-side codec whose outputs encoder drops every output."""

    def encode(self, kind: str, value: Any) -> Any:
        if kind == "EngineCoreOutputs" and isinstance(value, dict):
            value = {**value, "outputs": []}
        return super().encode(kind, value)


def test_engine_side_codec_role(spec: Any) -> None:
    checks = select(all_checks(), surfaces=["codec"])
    result = run(checks, Target("engine-side", codec=EngineSide()), spec, strict=True)
    # (The checks of earlier releases' tensor forms are NOT APPLICABLE at the reference
    # release for that reason, not for the role.)
    outside = [r for r in result.results if r.status == NOT_APPLICABLE
               and not r.message.startswith("not in this release")]
    assert outside, "checks that encode requests lie outside an engine-side codec's role"
    assert all("(role engine)" in r.message for r in outside)
    assert any("encode:EngineCoreRequest" in r.message or "encode:add" in r.message
               for r in outside)
    assert result.count(FAILED) == 0
    assert result.count(PASSED) > 50
    broken = run(checks, Target("engine-side-broken", codec=EngineSideNoOutputs()), spec,
                 strict=True)
    assert broken.count(FAILED) > 0


_UNSUPPORTED_PROGRAM = textwrap.dedent("""
    import json, sys
    for line in sys.stdin:
        request = json.loads(line)
        answer = {"seq": request["seq"], "ok": False, "kind": "unsupported",
                  "error": "not supported"}
        sys.stdout.write(json.dumps(answer) + "\\n")
        sys.stdout.flush()
""")


def test_external_program_answering_unsupported_passes_nothing(spec: Any,
                                                              tmp_path: Path) -> None:
    program = tmp_path / "unsupported.py"
    program.write_text(_UNSUPPORTED_PROGRAM)
    surfaces = command_surfaces([f"codec={sys.executable} {program}"])
    target = Target("external", **surfaces)
    target._closers.append(surfaces["codec"].close)
    try:
        result = run(select(all_checks(), surfaces=["codec"]), target, spec, strict=True)
    finally:
        target.close()
    assert [r.check.id for r in result.results if r.status in (PASSED, FAILED)] == []
    assert result.count(NOT_IMPLEMENTED) > 300


# --- a refusal is a pass only when the target implements the kind --------------------------


class RefusesWithErrors:
    """A codec stub: every encode and decode raises ValueError (the contract's rejection)."""

    def encode(self, kind: str, value: Any) -> Any:
        raise ValueError(f"refused {kind}")

    def decode(self, kind: str, frames: Any) -> Any:
        raise ValueError(f"refused {kind}")

    def with_threshold(self, threshold: int) -> RefusesWithErrors:
        return self

    def with_insecure_serialization(self) -> RefusesWithErrors:
        return self


def test_a_codec_refusing_everything_passes_nothing(spec: Any) -> None:
    checks = select(all_checks(), surfaces=["codec"])
    result = run(checks, Target("refuses", codec=RefusesWithErrors()), spec, strict=True)
    assert [r.check.id for r in result.results if r.status == PASSED] == []
    unproven = [r for r in result.results if r.status == NOT_IMPLEMENTED]
    assert len(unproven) > 50
    assert all("no evidence that the target implements" in r.message for r in unproven)
    # The rule costs the reference nothing: it decodes and encodes every kind it refuses.
    picked = select(checks, patterns=["codec/*missing-required*", "codec/*-rejected",
                                      "codec/reject/*", "codec/message/untyped-payload-no-oob"])
    good = run(picked, Target("reference", codec=ReferenceCodec()), spec, strict=True)
    assert good.count(PASSED) == len(picked), [
        (r.check.id, r.message) for r in good.results if r.status != PASSED]


_REFUSING_PROGRAM = textwrap.dedent("""
    import json, sys
    for line in sys.stdin:
        request = json.loads(line)
        answer = {"seq": request["seq"], "ok": False, "kind": "error", "error": "refused",
                  "clause": None}
        sys.stdout.write(json.dumps(answer) + "\\n")
        sys.stdout.flush()
""")


def _external(command: str) -> Target:
    surfaces = command_surfaces([command])
    target = Target("external", **surfaces)
    target._closers.append(surfaces["codec"].close)
    return target


def test_external_program_refusing_everything_passes_nothing(spec: Any,
                                                            tmp_path: Path) -> None:
    program = tmp_path / "refuses.py"
    program.write_text(_REFUSING_PROGRAM)
    target = _external(f"codec={sys.executable} {program}")
    try:
        result = run(select(all_checks(), surfaces=["codec"]), target, spec, strict=True)
    finally:
        target.close()
    assert [r.check.id for r in result.results if r.status == PASSED] == []
    assert result.count(NOT_IMPLEMENTED) > 50


# --- codec roles over the line protocol ----------------------------------------------------

_SERVER = f"{sys.executable} -m enginewire.conformance.targets.command_server --surface codec"


def test_external_program_declares_an_engine_side_role(spec: Any) -> None:
    """``hello`` answered with role ``engine``: checks that encode what a front end sends are
    NOT APPLICABLE (the program is never asked), the rest pass as in process."""
    checks = select(all_checks(), patterns=["codec/golden/add-minimal/*",
                                            "codec/golden/outputs/*", "codec/reject/*",
                                            "codec/golden/utility/*",
                                            "codec/struct/engine-core-request/*"])
    target = _external(f"codec={_SERVER} --role engine --unsupported decode:utility")
    try:
        result = run(checks, target, spec, strict=True)
    finally:
        target.close()
    status = {r.check.id: r.status for r in result.results}
    assert status["codec/golden/add-minimal/encode"] == NOT_APPLICABLE
    assert status["codec/golden/add-minimal/decode"] == PASSED
    assert status["codec/golden/outputs/encode"] == PASSED
    assert status["codec/golden/outputs/decode"] == NOT_APPLICABLE  # engines send outputs
    assert status["codec/golden/utility/decode"] == NOT_IMPLEMENTED  # declared unsupported
    assert result.count(FAILED) == 0
    outside = [r for r in result.results if r.status == NOT_APPLICABLE]
    assert all("(role engine)" in r.message for r in outside)
    in_process = run(checks, Target("engine-side", codec=EngineSide()), spec, strict=True)
    declared = {k for k, v in status.items() if v == NOT_IMPLEMENTED}
    assert {r.check.id: r.status for r in in_process.results if r.check.id not in declared} \
        == {k: v for k, v in status.items() if k not in declared}


def test_a_malformed_hello_is_a_target_error(tmp_path: Path) -> None:
    from enginewire.conformance.targets.contract import TargetError

    program = tmp_path / "sideways.py"
    program.write_text(textwrap.dedent("""
        import json, sys
        for line in sys.stdin:
            request = json.loads(line)
            sys.stdout.write(json.dumps({"seq": request["seq"], "ok": True,
                                         "role": "sideways"}) + "\\n")
            sys.stdout.flush()
    """))
    codec = command_surfaces([f"codec={sys.executable} {program}"])["codec"]
    try:
        with pytest.raises(TargetError, match="role 'sideways'"):
            _ = codec.role
    finally:
        codec.close()


def test_command_server_refuse_all_passes_nothing(spec: Any) -> None:
    checks = select(all_checks(), patterns=["codec/struct/engine-core-*",
                                            "codec/tensor/*-rejected"])
    target = _external(f"codec={_SERVER} --refuse-all")
    try:
        result = run(checks, target, spec, strict=True)
    finally:
        target.close()
    assert result.count(PASSED) == 0
    assert result.count(NOT_IMPLEMENTED) > 20
