"""The conformance suite's own machinery: registry, runner, time limits, expected-failure
lists, report formats, coverage, and the power of checks to catch broken targets."""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import msgspec
import pytest

from enginewire.cli import main
from enginewire.conformance.framework import reports
from enginewire.conformance.framework.expected import ExpectedFailures, ExpectedFileError
from enginewire.conformance.framework.outcomes import (
    CHANGED_FAILURE,
    EXPECTED_FAILURE,
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    NOT_RUN,
    PASSED,
    SKIPPED,
    SPEC_ONLY,
    UNEXPECTED_FAILURE,
    UNEXPECTED_PASS,
)
from enginewire.conformance.framework.registry import (
    SURFACES,
    Check,
    CheckFailure,
    Reproduction,
    all_checks,
    check,
    select,
)
from enginewire.conformance.framework.runner import run, run_check
from enginewire.conformance.targets.contract import (
    CAPABILITIES,
    MODES,
    Target,
    TargetError,
    Unsupported,
)
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.conformance.targets.resolve import load_target
from enginewire.spec import load

REPO = Path(__file__).resolve().parents[1]
REFERENCE_EXPECTED = REPO / "conformance" / "data" / "expected" / "reference.txt"


# --- deliberately broken codecs (each must be caught) ---------------------------------------


class LessOrEqualThreshold(ReferenceCodec):
    """Puts a tensor of exactly threshold bytes inline: `<=` where the spec says `<`."""

    def __init__(self, threshold: int | None = None, insecure: bool = False) -> None:
        self.nominal = load().surface("tensors").threshold_default if threshold is None \
            else threshold
        super().__init__(self.nominal + 1, insecure)

    def with_threshold(self, threshold: int) -> LessOrEqualThreshold:
        return LessOrEqualThreshold(threshold, self.insecure)


class SwappedRequestFields(ReferenceCodec):
    """Writes EngineCoreRequest's prompt_token_ids and mm_features in each other's place."""

    def encode(self, kind: str, value: Any) -> Any:
        frames = list(super().encode(kind, value))
        index = {"add": 1, "EngineCoreRequest": 0}.get(kind)
        if index is None:
            return frames
        wire = msgspec.msgpack.decode(bytes(frames[index]),
                                      ext_hook=lambda c, d: msgspec.msgpack.Ext(c, bytes(d)))
        wire[1], wire[2] = wire[2], wire[1]
        frames[index] = msgspec.msgpack.encode(wire)
        return frames


class AcceptsNegativeIndex(ReferenceCodec):
    """Reads an out-of-band index the way Python indexes a list: -1 is the last frame."""

    def decode(self, kind: str, frames: Any) -> Any:
        frames = list(frames)
        if kind == "EngineCoreOutput" and len(frames) == 2:
            head = msgspec.msgpack.decode(bytes(frames[0]))
            if isinstance(head, list) and len(head) > 4 and isinstance(head[4], list) \
                    and head[4][2] == -1:
                head[4][2] = 1
                frames[0] = msgspec.msgpack.encode(head)
        return super().decode(kind, frames)


class HangingCodec(ReferenceCodec):
    """Never answers decode (until released), like a target stuck on a lock."""

    release = threading.Event()

    def decode(self, kind: str, frames: Any) -> Any:
        self.release.wait(30)
        return super().decode(kind, frames)


def codec_target(codec: Any, name: str = "broken") -> Target:
    return Target(name=name, codec=codec)


BROKEN_THRESHOLD = codec_target(LessOrEqualThreshold(), "less-or-equal-threshold")
CODEC_ONLY = codec_target(ReferenceCodec(), "codec-only")


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


def _by_id(check_id: str) -> Check:
    found = [c for c in all_checks() if c.id == check_id]
    assert found, f"no check {check_id}"
    return found[0]


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


# --- registry -----------------------------------------------------------------------------


def test_every_check_names_clauses_the_spec_has(spec: Any) -> None:
    report = reports.coverage(spec, all_checks())
    assert report["unknown_clauses"] == {}


def test_check_ids_are_unique_and_start_with_their_surface() -> None:
    ids = [c.id for c in all_checks()]
    assert len(ids) == len(set(ids))
    assert all(c.id.startswith(c.surface + "/") for c in all_checks())


def test_check_ids_never_look_like_clause_ids(spec: Any) -> None:
    ids = {c.id for c in all_checks()}
    assert not any("." in check_id for check_id in ids)
    assert not ids & set(spec.clauses)


def test_registry_rejects_malformed_checks() -> None:
    with pytest.raises(ValueError, match="must start with"):
        check("ring/oops", clauses=["ring.x"], surface="codec")(lambda s, c: None)
    with pytest.raises(ValueError, match="at least one clause"):
        check("codec/no-clauses", clauses=[], surface="codec")(lambda s, c: None)
    with pytest.raises(ValueError, match="surface must be one of"):
        check("wire/x", clauses=["a.b"], surface="wire")(lambda s, c: None)
    with pytest.raises(ValueError, match="looks like a clause ID"):
        check("ring.writer.made-up-framing", clauses=["ring.writer.fence-before-check"],
              surface="ring")(lambda s, c: None)
    with pytest.raises(ValueError, match="separated by '/'"):
        check("codec/Upper Case", clauses=["a.b"], surface="codec")(lambda s, c: None)


def test_level_comes_from_the_strongest_clause(spec: Any) -> None:
    should = next(cid for cid, ref in spec.clauses.items() if ref.clause.level == "SHOULD")
    must = next(cid for cid, ref in spec.clauses.items() if ref.clause.level == "MUST")
    only_should = Check("codec/t", (should,), "codec", lambda s, c: None, "t")
    mixed = Check("codec/t", (should, must), "codec", lambda s, c: None, "t")
    assert only_should.level(spec) == "SHOULD"
    assert mixed.level(spec) == "MUST"


def test_every_must_clause_has_a_check(spec: Any) -> None:
    report = reports.coverage(spec, all_checks())
    assert report["uncovered"]["MUST"] == []
    assert report["unknown_clauses"] == {}


# --- runner -------------------------------------------------------------------------------


def test_a_hung_target_fails_the_check_instead_of_hanging(spec: Any) -> None:
    def waits_on_target(codec: Any, ctx: Any) -> None:
        codec.decode("abort", [b"\x01", msgspec.msgpack.encode(["r"])])

    item = Check("codec/test/hangs", ("frames.abort-payload",), "codec", waits_on_target,
                 "hangs", timeout=0.5)
    codec = HangingCodec()
    try:
        result = run_check(item, codec_target(codec), spec)
    finally:
        HangingCodec.release.set()
    assert result.status == FAILED
    assert result.message.startswith("timed out after 0.5 s")
    assert result.duration_s < 5


def test_cleanups_run_after_a_failing_check(spec: Any) -> None:
    closed = []

    def fails(codec: Any, ctx: Any) -> None:
        ctx.on_cleanup(lambda: closed.append(True))
        directory = ctx.tmpdir
        closed.append(directory)
        raise CheckFailure("wrong", Reproduction(sent=[b"\x00\x01"], received="nope"))

    item = Check("codec/test/fails", ("frames.abort-payload",), "codec", fails, "fails")
    result = run_check(item, CODEC_ONLY, spec)
    assert result.status == FAILED
    assert result.message == "wrong"
    assert result.reproduction is not None
    assert result.reproduction.to_builtins()["sent_hex"] == ["0001"]
    assert closed[-1] is True
    assert not Path(closed[0]).exists()


def test_an_exception_escaping_a_check_fails_it_with_its_clause(spec: Any) -> None:
    class Boom(Exception):
        clause = "frames.frame-count"

    def raises(codec: Any, ctx: Any) -> None:
        raise Boom("bad frames")

    result = run_check(Check("codec/test/raises", ("frames.frame-count",), "codec", raises, "r"),
                       CODEC_ONLY, spec)
    assert result.status == FAILED
    assert result.message == "Boom [frames.frame-count]: bad frames"
    assert "Traceback" in (result.traceback or "")


def test_a_failure_a_probe_refuses_is_not_implemented(spec: Any) -> None:
    """A check that waited without looking at the target's probes and failed: the runner asks
    them once more before the clean-ups. A probe raising ``NotImplementedError`` makes the
    verdict NOT IMPLEMENTED naming it; a probe that answers leaves the failure (and a
    passing check is not asked)."""
    from enginewire.conformance.framework.evidence import probe_while_waiting

    asked: list[str] = []

    def probe(refuses: bool) -> Any:
        def alive() -> bool:
            asked.append("alive")
            if refuses:
                raise Unsupported("engine.alive: no code for it")
            return True
        return alive

    def waits_then(refuses: bool, fails: bool = True) -> Any:
        def body(engine: Any, ctx: Any) -> None:
            probe_while_waiting("the engine peer's alive", probe(refuses))
            if fails:
                raise CheckFailure("nothing came on input 0: the engine's ready message")
        return Check("engine/test/waits", ("identity.little-endian-rank",), "engine", body,
                     "waits")

    target = Target("t", engine=object())
    refused = run_check(waits_then(True), target, spec)
    assert (refused.status, refused.message) == (
        NOT_IMPLEMENTED, "the target does not implement the engine peer's alive "
                         "(Unsupported: engine.alive: no code for it)")
    assert refused.reproduction is None
    misbehaved = run_check(waits_then(False), target, spec)
    assert (misbehaved.status, misbehaved.message) == (
        FAILED, "nothing came on input 0: the engine's ready message")
    asked.clear()
    assert run_check(waits_then(True, fails=False), target, spec).status == PASSED
    assert asked == []


def test_unsupported_capability_is_not_implemented_without_running(spec: Any) -> None:
    no_threshold = ReferenceCodec()
    no_threshold.unsupported = ("codec.threshold",)
    needs_threshold = [c for c in all_checks() if "codec.threshold" in c.requires]
    assert needs_threshold
    result = run(needs_threshold, codec_target(no_threshold), spec, strict=True)
    assert {r.status for r in result.results} == {NOT_IMPLEMENTED}
    assert all("does not implement codec.threshold" in r.message for r in result.results)


class Refusing:
    """A surface with code for nothing: it has every operation and capability of the target
    contract (any attribute is one), and each raises ``contract.Unsupported``. With
    ``hands_out``, the operations that hand out an object (a ring end, a peer, a front-end
    client, a derived codec) do, and every operation of that object refuses instead (reading
    a ring end's handle too), except ``stop``/``close``, which free nothing."""

    role = "both"
    unsupported: tuple[str, ...] = ()
    #: Flags the suite reads as data: the tensor arena is not implemented (so the check of
    #: its refusal runs, and refuses), coordinated DP is offered (capability).
    tensor_arena = False
    supports_coordinated_dp = True

    def __init__(self, name: str, hands_out: frozenset[str] = frozenset()) -> None:
        self._name = name
        self._hands_out = hands_out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if "." in self._name and name in ("stop", "close"):
            return lambda *args, **kwargs: None
        if name in ("handle", "response_handle", "broadcast_handle"):  # data of a ring end
            raise Unsupported(f"{self._name}.{name}: no code for it")

        def operation(*args: Any, **kwargs: Any) -> Any:
            if name in self._hands_out:
                return Refusing(f"{self._name}.{name}()")
            raise Unsupported(f"{self._name}.{name}: no code for it")

        return operation


def refusing_target(hands_out: frozenset[str] = frozenset()) -> Target:
    return Target("refusing", **{s: Refusing(s, hands_out) for s in SURFACES})


#: What a check may report on a target with code for nothing (never PASSED, never FAILED).
NO_CODE_STATUSES = {NOT_IMPLEMENTED, NOT_APPLICABLE, SKIPPED, SPEC_ONLY}


def assert_nothing_passes(result: Any) -> None:
    """Every check of ``result`` is NOT IMPLEMENTED, or says why it is not about the target:
    NOT APPLICABLE (not in this release, outside the role), SKIPPED (cannot run here: no CUDA
    device) or SPEC ONLY (a codec check that called no target: a fact of the spec)."""
    wrong = [f"{r.check.id}: {r.status} {r.message}" for r in result.results
             if r.status not in NO_CODE_STATUSES]
    assert not wrong, "\n".join(wrong)
    unexplained = [r.check.id for r in result.results if not r.message.strip()]
    assert not unexplained
    for r in result.results:
        if r.status == NOT_IMPLEMENTED:
            assert "no code for it" in r.message or "does not implement" in r.message, r
        if r.status == SPEC_ONLY:
            assert r.check.surface == "codec", r


#: Releases whose engine and front end the suite meets over another transport than the
#: newest release's (history/constants.toml ``[[transport]]``): no handshake, the engine
#: connecting its input (0.7.3); no handshake, its b"READY" on the input (0.8.4); the
#: handshake on the input socket (0.9.0). The newest release (None) is the fourth.
RELEASES = [None, "0.7.3", "0.8.4", "0.9.0"]


def _release(version: str | None) -> Any:
    return load() if version is None else load(version)


def _ran(result: Any) -> list[Any]:
    """The verdicts about the target: neither NOT APPLICABLE nor SKIPPED."""
    return [r for r in result.results if r.status not in (NOT_APPLICABLE, SKIPPED)]


@pytest.mark.parametrize("version", RELEASES, ids=lambda v: v or "newest")
def test_every_check_refuses_to_pass_a_target_with_code_for_nothing(version: str | None) -> None:
    """Every registered check, of every surface, with --strict, against a target whose every
    operation raises ``contract.Unsupported``, at the newest release and at the releases
    whose engine and front end speak another transport: none passes or fails (a check that
    passes on such a target passed without evidence), and each ends at once (the first call
    refuses)."""
    target = refusing_target()
    assert set(target.implemented()) == set(SURFACES)
    assert all(target.has(capability) for capability in CAPABILITIES)
    assert all(target.applies(mode) for mode in MODES)
    checks = all_checks()
    assert {c.surface for c in checks} == set(SURFACES)
    result = run(checks, target, _release(version), strict=True)
    assert len(result.results) == len(checks)
    assert_nothing_passes(result)
    assert result.count(NOT_IMPLEMENTED) > 0.9 * len(_ran(result))
    assert {r.check.surface for r in result.results if r.status == NOT_IMPLEMENTED} \
        == set(SURFACES)


#: The operations that hand out an object (a derived codec, a ring end, an executor or worker,
#: a running engine, a front-end client).
HANDED_OUT = frozenset({
    "with_threshold", "with_insecure_serialization", "create_writer", "attach_reader",
    "memory_writer", "memory_reader", "create_remote_writer", "create_executor",
    "start_worker", "start_engine", "start_frontend"})


@pytest.mark.parametrize("version", RELEASES, ids=lambda v: v or "newest")
def test_objects_handed_out_by_a_target_with_code_for_nothing_pass_no_check(
        version: str | None) -> None:
    """The target hands out codecs, ring ends, engines and front-end clients, and every
    operation of those refuses, also on a check's background thread (a reader's
    wait_until_ready, the front end's wait_ready) and while the suite waits (a running
    engine's alive), with or without the release's handshake: no check passes, none waits
    for the suite's peers to time out, and every engine check the release has is NOT
    IMPLEMENTED naming the refused alive(). The one failure: a handed-out reader attached to
    a ring whose handle names a tensor arena, which a reader without the arena must refuse.
    At an older release only the surfaces the suite meets over the release's transport run
    (engine, front end): the others do not wait on the target's peers."""
    checks = all_checks()
    if version is not None:
        checks = [c for c in checks if c.surface in ("engine", "frontend")]
    result = run(checks, refusing_target(HANDED_OUT), _release(version), strict=True)
    failed = [r for r in result.results if r.status == FAILED]
    assert [r.check.id for r in failed] \
        == ([] if version else ["ring/reader/refuses-tensor-arena"])
    result.results = [r for r in result.results if r.status != FAILED]
    assert_nothing_passes(result)
    refused_hello = select(checks, patterns=["frontend/handshake/*"])
    assert {r.status for r in result.results if r.check in refused_hello} \
        <= {NOT_IMPLEMENTED, NOT_APPLICABLE}
    engine = [r for r in _ran(result) if r.check.surface == "engine"]
    assert engine
    wrong = [f"{r.check.id}: {r.status} {r.message}" for r in engine
             if r.status != NOT_IMPLEMENTED or "start_engine().alive" not in r.message]
    assert not wrong, "\n".join(wrong)


class DeafFrontends:
    """A front end that binds nothing and hears nothing: wait_ready waits out its time."""

    def start_frontend(self, launch: Any) -> Any:
        class Client:
            stopped = threading.Event()

            def wait_ready(self, timeout: float) -> None:
                if not self.stopped.wait(timeout):
                    raise TimeoutError(f"no engine within {timeout:g} s")

            def stop(self, timeout: float = 5.0) -> None:
                self.stopped.set()

            def alive(self) -> bool:
                return not self.stopped.is_set()

        return Client()


def test_silence_of_a_deaf_front_end_is_no_refusal(spec: Any) -> None:
    """A front end that never bound its handshake address sends no init after a garbage HELLO
    either: the check fails it, since it does not answer a well-formed HELLO. Half the waits:
    what a deaf front end does not send would not come later either, and its wait_ready (15 s
    scaled) still outlasts the check's 1 s for the bad HELLO plus 8 s scaled for the good one."""
    result = run(select(all_checks(), patterns=["frontend/handshake/garbage-hello"]),
                 Target("deaf", frontend=DeafFrontends()), spec, timeout_scale=0.5)
    [verdict] = result.results
    assert verdict.status == FAILED
    assert "nor after a well-formed HELLO from engine 0" in verdict.message


def test_should_checks_run_only_with_strict(spec: Any) -> None:
    should = [c for c in all_checks() if c.level(spec) != "MUST"]
    assert should
    loose = run(should[:2], CODEC_ONLY, spec)
    assert {r.status for r in loose.results} == {NOT_RUN}
    strict = run(should[:2], Target("all", codec=ReferenceCodec()), spec, strict=True)
    assert NOT_RUN not in {r.status for r in strict.results}


def test_higher_layers_add_target_names_through_providers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``PREFIX:NAME`` resolves through a registered provider; without one it is an error
    that lists the providers there are; built-in names cannot be taken over."""
    from enginewire.conformance.targets import resolve

    monkeypatch.setattr(resolve, "_PROVIDERS", {})
    monkeypatch.setattr(resolve, "_PROVIDER_MODULES", {})
    with pytest.raises(TargetError, match="none registered"):
        load_target("demo:one")
    seen: list[str] = []

    def provide(name: str) -> Target:
        seen.append(name)
        return Target(f"demo:{name}", codec=ReferenceCodec())

    resolve.register_provider("demo", provide, "demo:NAME (a test provider)")
    target = load_target("demo:one")
    assert (target.name, seen) == ("demo:one", ["one"])
    assert target.has("codec")
    with pytest.raises(TargetError, match=r"demo:NAME \(a test provider\)"):
        load_target("nonsense")
    with pytest.raises(ValueError, match="built-in"):
        resolve.register_provider("vllm", provide)
    with pytest.raises(ValueError, match="lower-case identifier"):
        resolve.register_provider("Bad-Prefix", provide)
    # A provider named by its module: listed at once, imported when a target names it, and a
    # module that does not register the prefix is a clear error.
    resolve.register_provider_module("lazy", "json", "lazy:NAME (registers nothing)")
    assert resolve.providers()["lazy"] == "lazy:NAME (registers nothing)"
    with pytest.raises(TargetError, match="importing json did not register .* 'lazy'"):
        load_target("lazy:one")
    with pytest.raises(ValueError, match="built-in"):
        resolve.register_provider_module("none", "json")


def test_target_loading_errors_are_clear() -> None:
    with pytest.raises(TargetError, match="unknown target"):
        load_target("nonsense")
    with pytest.raises(TargetError, match="cannot import"):
        load_target("no_such_module_xyz:thing")
    with pytest.raises(TargetError, match="mutant:"):
        load_target("mutant:definitely-not-a-mutant")


# --- check power: broken targets are caught ------------------------------------------------


def test_inclusive_threshold_is_caught_by_the_exact_threshold_check(spec: Any) -> None:
    result = run(select(all_checks(), patterns=["codec/tensor/inline-threshold-*"]),
                 BROKEN_THRESHOLD, spec)
    verdicts = {r.check.id: r.status for r in result.results}
    assert verdicts == {
        "codec/tensor/inline-threshold-minus-one": PASSED,
        "codec/tensor/inline-threshold-exact": FAILED,
        "codec/tensor/inline-threshold-plus-one": PASSED,
    }
    failure = next(r for r in result.results if r.status == FAILED)
    assert "must go out of band" in failure.message


def test_swapped_struct_fields_are_caught(spec: Any) -> None:
    target = codec_target(SwappedRequestFields())
    checks = select(all_checks(), patterns=["codec/struct/engine-core-request/layout",
                                            "codec/message/add/frames",
                                            "codec/golden/add-minimal/encode"])
    result = run(checks, target, spec)
    assert [r.status for r in result.results] == [FAILED] * len(checks)


def test_negative_index_acceptance_is_caught(spec: Any) -> None:
    target = codec_target(AcceptsNegativeIndex())
    result = run([_by_id("codec/tensor/index-negative-rejected")], target, spec)
    assert result.results[0].status == FAILED
    assert "accepted the frames" in result.results[0].message
    honest = run([_by_id("codec/tensor/index-negative-rejected")], CODEC_ONLY, spec)
    assert honest.results[0].status == PASSED


# --- expected-failure lists ----------------------------------------------------------------


def test_expected_file_parsing() -> None:
    parsed = ExpectedFailures.parse("# header\n\ncodec/a  # starts like this\ncodec/b\n")
    assert parsed.entries == {"codec/a": "starts like this", "codec/b": None}
    assert parsed.header == ["# header"]
    with pytest.raises(ExpectedFileError, match="listed twice"):
        ExpectedFailures.parse("codec/a\ncodec/a\n")
    with pytest.raises(ExpectedFileError, match="CHECK_ID"):
        ExpectedFailures.parse("codec/a codec/b\n")
    with pytest.raises(ExpectedFileError, match="separate their parts with '/'"):
        ExpectedFailures.parse("ring.writer.made-up-framing\n")


def _threshold_run(spec: Any, listing: str) -> Any:
    checks = select(all_checks(), patterns=["codec/tensor/inline-threshold-*"])
    return run(checks, BROKEN_THRESHOLD, spec, expected=ExpectedFailures.parse(listing))


def test_listed_failure_with_matching_message_is_expected(spec: Any) -> None:
    result = _threshold_run(spec, "codec/tensor/inline-threshold-exact  # 256 bytes with\n")
    exact = next(r for r in result.results if r.check.id.endswith("exact"))
    assert exact.expectation == EXPECTED_FAILURE
    assert result.ok


def test_unlisted_failure_fails_the_run(spec: Any) -> None:
    result = _threshold_run(spec, "")
    exact = next(r for r in result.results if r.check.id.endswith("exact"))
    assert exact.expectation == UNEXPECTED_FAILURE
    assert not result.ok


def test_unexpected_pass_fails_the_run(spec: Any) -> None:
    result = _threshold_run(spec, "codec/tensor/inline-threshold-exact\n"
                                  "codec/tensor/inline-threshold-plus-one\n")
    plus = next(r for r in result.results if r.check.id.endswith("plus-one"))
    assert plus.expectation == UNEXPECTED_PASS
    assert not result.ok


def test_changed_failure_message_fails_the_run(spec: Any) -> None:
    result = _threshold_run(spec, "codec/tensor/inline-threshold-exact  # some other text\n")
    exact = next(r for r in result.results if r.check.id.endswith("exact"))
    assert exact.expectation == CHANGED_FAILURE
    assert not result.ok


def test_update_expected_rewrites_the_file(tmp_path: Path, capsys: Any) -> None:
    listing = tmp_path / "expected.txt"
    listing.write_text("# known problems\ncodec/tensor/inline-threshold-plus-one  # stale\n")
    args = ["check", "--target", "test_conformance_framework:BROKEN_THRESHOLD",
            "-k", "codec/tensor/inline-threshold-*", "--no-progress",
            "--expected-failures", str(listing)]
    assert main(args) == 1
    capsys.readouterr()
    assert main([*args, "--update-expected"]) == 0
    rewritten = ExpectedFailures.load(listing)
    assert rewritten.header == ["# known problems"]
    assert list(rewritten.entries) == ["codec/tensor/inline-threshold-exact"]
    assert rewritten.entries["codec/tensor/inline-threshold-exact"].startswith("256 bytes")
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert _last_line(out) == "2 passed, 1 failed"


# --- the command and its reports ----------------------------------------------------------


def test_reports_are_written_and_parse(tmp_path: Path, capsys: Any) -> None:
    paths = {name: tmp_path / f"report.{name}" for name in ("json", "xml", "html")}
    code = main(["check", "--target", "test_conformance_framework:BROKEN_THRESHOLD",
                 "-k", "codec/tensor/inline-threshold-*",
                 "--surface", "codec", "--no-progress",
                 "--json", str(paths["json"]), "--junit", str(paths["xml"]),
                 "--html", str(paths["html"])])
    out = capsys.readouterr().out
    assert code == 1
    assert _last_line(out) == "2 passed, 1 failed"
    assert "FAIL codec/tensor/inline-threshold-exact [tensors.tensor-inline-below-threshold]" \
        in out

    data = json.loads(paths["json"].read_text())
    assert data["format"] == "enginewire-conformance/1"
    assert data["ok"] is False
    assert data["summary"]["passed"] == 2 and data["summary"]["failed"] == 1
    assert data["summary"]["unexpected_failure"] == 1
    failed = [r for r in data["results"] if r["status"] == "failed"]
    assert failed[0]["id"] == "codec/tensor/inline-threshold-exact"
    assert failed[0]["clauses"] == ["tensors.tensor-inline-below-threshold"]
    assert failed[0]["reproduction"]["received"]
    assert set(data["surfaces"]) == {"codec"}

    root = ET.parse(paths["xml"]).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["codec"]
    cases = {c.get("name"): c for c in suites[0].findall("testcase")}
    exact = cases["codec/tensor/inline-threshold-exact"]
    assert exact.get("classname") == "tensors.tensor-inline-below-threshold"
    assert exact.find("failure") is not None
    assert suites[0].get("failures") == "1" and suites[0].get("tests") == "3"

    page = paths["html"].read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "codec/tensor/inline-threshold-exact" in page
    # Self-contained: inline style and script only, nothing fetched from elsewhere.
    assert " src=" not in page and "http" not in page.split("<body>")[1]
    # It leads with what needs action, before the table of every check.
    assert page.index("Needs action (1)") < page.index("All checks, in suite order")
    assert "docs/spec/tensors.md#tensors.tensor-inline-below-threshold" in page


def test_list_and_coverage_commands(capsys: Any, spec: Any) -> None:
    assert main(["check", "--list", "--surface", "codec"]) == 0
    out = capsys.readouterr().out
    assert "codec/tensor/inline-threshold-exact  [tensors.tensor-inline-below-threshold]  MUST" \
        in out
    assert _last_line(out).endswith(" checks")
    code = main(["check", "--coverage"])
    out = capsys.readouterr().out
    assert "MUST clauses without a check: 0" in out
    assert code == 0


def test_codec_surface_of_the_reference_passes(capsys: Any) -> None:
    code = main(["check", "--surface", "codec", "--no-progress",
                 "--expected-failures", str(REFERENCE_EXPECTED)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    passed, failed = _last_line(out).split(", ")
    assert int(passed.split()[0]) > 300
    assert failed.endswith(" failed")
