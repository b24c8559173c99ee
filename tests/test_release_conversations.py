"""``enginewire check --version X``: the engine and front-end conversations at release X.

The reference engine and front end built for X speak X on the wire (X's struct layouts, its
HELLO/READY keys: no headless before 0.10.0, num_gpu_blocks and dp_stats_address in READY
before 0.20.0; its ready response: a struct, or an empty frame before 0.20.0; before 0.9.0
no handshake at all: X's input and output sockets on addresses given directly, ready on
``b"READY"`` in 0.8.4 and 0.8.5 and once connected before), and the suite's peers follow X
too. A check whose subject X lacks (the HELLO/READY handshake, a ready message on the wire, an
engine identity on the input, a READY key or request type that came later) is NOT APPLICABLE
with the reason, taken from the spec's history, never from a list of versions in the check.
"""

from __future__ import annotations

import threading
import time
import tomllib
from typing import Any

import msgspec
import pytest

from enginewire.conformance.framework.outcomes import FAILED, NOT_APPLICABLE, NOT_RUN, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run_check
from enginewire.conformance.targets.reference import (
    ReferenceCodec,
    ReferenceEngines,
    ReferenceFrontends,
    reference_target,
)
from enginewire.reference import structs
from enginewire.reference.codec import default_codec
from enginewire.reference.engine import (
    EngineOptions,
    ReferenceEngine,
    expected_generation,
    generation_request,
)
from enginewire.reference.errors import ProtocolError
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.reference.transport import open_socket
from enginewire.spec import load
from enginewire.spec.history.release_facts import (
    conversation_gap,
    ready_response_at,
    transport_at,
)
from enginewire.spec.loader import DATA_DIR

CONVERSATIONS = ["engine/*", "frontend/*"]

#: The timeout scale of a power test: a broken peer's check fails by waiting out its
#: (scaled) waits, so it runs at a quarter of them; the honest peers pass at the same scale,
#: so the failure is the peer's, never the shorter wait's.
POWER_SCALE = 0.25


def _run(version: str, patterns: list[str], target: Any = None,
         scale: float = 1.0) -> list[Any]:
    target = target or reference_target(version)
    spec = load(version)
    try:
        return [run_check(item, target, spec, timeout_scale=scale)
                for item in select(all_checks(), patterns=patterns)]
    finally:
        target.close()


def _failures(results: list[Any]) -> list[str]:
    return [f"{r.check.id}: {r.message}" for r in results if r.status == FAILED]


@pytest.mark.slow
def test_every_conversation_check_passes_at_0_22_0() -> None:
    """0.22.0: a ready response of four fields, EngineCoreOutput without the later fields."""
    results = _run("0.22.0", CONVERSATIONS)
    assert _failures(results) == []
    passed = [r for r in results if r.status == PASSED]
    assert len(passed) > 50
    for result in results:
        if result.status == NOT_APPLICABLE:
            assert "0.22.0" in result.message, result.message


def test_a_release_without_the_handshake_is_not_applicable_with_the_reason() -> None:
    for version, reason in (("0.7.3", "vLLM 0.7.3 has no HELLO/READY handshake"),):
        results = _run(version, ["engine/handshake/hello-first",
                                 "frontend/handshake/init-answers-hello"])
        assert [r.status for r in results] == [NOT_APPLICABLE] * 2
        assert all(reason in r.message for r in results)


def test_releases_without_the_handshake_name_what_they_lack() -> None:
    """0.8.2 has no engine identity on its PUSH/PULL input and no ready message on the wire;
    0.8.5 has both (a DEALER identity and b"READY") and its checks of them run."""
    by_id = {r.check.id: r for r in _run("0.8.2", ["engine/identity/rank-3",
                                                   "engine/handshake/ready-response-map",
                                                   "engine/serve/add-generates"])}
    identity, ready, serve = (by_id["engine/identity/rank-3"],
                              by_id["engine/handshake/ready-response-map"],
                              by_id["engine/serve/add-generates"])
    assert (identity.status, ready.status, serve.status) == (NOT_APPLICABLE, NOT_APPLICABLE,
                                                             PASSED)
    assert "0.8.2's input channel carries no engine identity" in identity.message
    assert "0.8.2's engine sends no ready message on the wire" in ready.message
    results = _run("0.8.5", ["engine/identity/rank-3", "engine/handshake/ready-response-map",
                             "engine/dp/three-identities", "frontend/requests/routed-to-engine"])
    assert [r.status for r in results] == [PASSED] * 4, [r.message for r in results]


def test_a_ready_key_that_came_later_is_not_applicable() -> None:
    """READY's parallel_config_hash came in 0.11.1 (history/constants.toml)."""
    [engine, frontend] = _run("0.10.2", ["engine/handshake/ready-hash-with-dp",
                                         "frontend/handshake/config-hash-checked"])
    for result in (engine, frontend):
        assert result.status == NOT_APPLICABLE
        assert "0.10.2's READY has no parallel_config_hash key" in result.message
    [later] = _run("0.11.2", ["engine/handshake/ready-hash-with-dp"])
    assert later.status == PASSED


def test_a_request_type_that_came_later_is_not_applicable() -> None:
    """WAKEUP came in 0.18.0."""
    [older] = _run("0.17.1", ["engine/garbage/sentinel-wakeup"])
    assert older.status == NOT_APPLICABLE
    assert "0.17.1 has no request type WAKEUP" in older.message


#: The conversation checks of ENGINE_CORE_DEAD (history/constants.toml [[engine_core_dead]]:
#: 0.8.5 on).
DEAD_CHECKS = ["engine/dead/sentinel-last", "frontend/outputs/dead-fails-pending-call",
               "frontend/outputs/dead-near-miss", "frontend/outputs/engine-core-dead"]


def test_engine_core_dead_checks_are_not_applicable_before_the_sentinel() -> None:
    """0.8.4's engine dies without ENGINE_CORE_DEAD: its checks are NOT APPLICABLE, saying
    so; at 0.8.5, the first release with the sentinel, the front end's checks of it pass."""
    results = _run("0.8.4", DEAD_CHECKS)
    assert [r.status for r in results] == [NOT_APPLICABLE] * len(DEAD_CHECKS)
    assert all("vLLM 0.8.4 has no ENGINE_CORE_DEAD" in r.message for r in results)
    results = _run("0.8.5", DEAD_CHECKS[1:])
    assert [r.status for r in results] == [PASSED] * 3, [r.message for r in results]


def test_channel_ends_follow_the_release() -> None:
    """open_socket's ends at 0.8.2: a PUSH input the front end binds, a PULL engine input,
    an output PUSH the engine binds, high-water marks only where the socket type has them."""
    from enginewire.reference.transport import channel_end

    frontend_input = channel_end("input", "frontend", "0.8.2")
    engine_input = channel_end("input", "engine", "0.8.2")
    engine_output = channel_end("output", "engine", "0.8.2")
    assert (frontend_input.socket, frontend_input.binds) == ("PUSH", True)
    assert set(frontend_input.options) == {"SNDHWM"}
    assert (engine_input.socket, engine_input.binds, engine_input.identity) == ("PULL", False,
                                                                                  None)
    assert (engine_output.socket, engine_output.binds) == ("PUSH", True)
    assert channel_end("input", "engine", "0.8.3").binds is True
    assert channel_end("input", "engine", "0.8.5").identity is not None


@pytest.mark.parametrize(("version", "address"), [("0.8.2", "input address"),
                                                  ("0.9.0", "handshake address")])
def test_command_line_frontend_spawns_engines_of_a_release_without_the_handshake(
        version: str, address: str) -> None:
    """0.8.2's engines get the input and output addresses; 0.9.0's connect to the input
    ROUTER, the handshake address there."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "enginewire", "frontend", "--version", version, "--spawn",
         "--timeout", "10", "utility", "echo", "7"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{address}: ipc://" in done.stderr
    assert done.stdout.strip() == '{"engine": 0, "method": "echo", "result": [7]}'


class _IdentityEngine(ReferenceEngine):
    """An engine built for 0.8.2 that opens 0.8.5's input and output: a DEALER with its
    identity on the input, connecting where 0.8.2's engine binds its output."""

    def _connect(self, addresses: Any) -> None:
        assert self._ctx is not None
        for address in addresses.inputs:
            self._inputs.append(open_socket(self._ctx, "input", "engine", address,
                                            identity=self.connection.identity,
                                            version="0.8.5"))
        for address in addresses.outputs:
            self._outputs.append(open_socket(self._ctx, "output", "engine", address,
                                             version="0.8.5"))


class _ReadyWaitingFrontend(ReferenceFrontend):
    """A front end built for 0.8.2 that waits for a ready message on its input, as 0.8.4's
    front end waits for b"READY" (0.8.2's engine sends none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready_on_connect = False


def test_peers_of_another_transport_fail_at_a_release_without_the_handshake() -> None:
    """At 0.8.2 an engine that speaks a DEALER with an identity frame gets no request and
    delivers no output, and a front end that waits for b"READY" never gets ready; the same
    peers' own release (0.8.5's engine) or the honest 0.8.2 peers pass."""
    # One check per side fails (each waits out its scaled waits); the honest peers pass both
    # at the same scale.
    checks = ["engine/serve/add-generates", "engine/utility/call-ids-echoed"]
    target = reference_target("0.8.2")
    target.engine = ReferenceEngines(engine_class=_IdentityEngine, version="0.8.2")
    results = _run("0.8.2", checks[:1], target, POWER_SCALE)
    assert [r.status for r in results] == [FAILED], [r.message for r in results]
    assert [r.status for r in _run("0.8.2", checks, scale=POWER_SCALE)] == [PASSED, PASSED]

    class _Frontends(ReferenceFrontends):
        def frontend_class(self) -> Any:
            return _ReadyWaitingFrontend

    checks = ["frontend/requests/add-frames", "frontend/utility/call-and-reply"]
    target = reference_target("0.8.2")
    target.frontend = _Frontends(target.codec)
    results = _run("0.8.2", checks[:1], target, POWER_SCALE)
    assert [r.status for r in results] == [FAILED], [r.message for r in results]
    assert all("wait_ready" in r.message for r in results), [r.message for r in results]
    assert [r.status for r in _run("0.8.2", checks, scale=POWER_SCALE)] == [PASSED, PASSED]


class _BigEndianIdentityEngine(ReferenceEngine):
    """An engine that writes its rank big-endian in its identity (rank 3: 00 03)."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.connection.identity = self.connection.identity[::-1]


def test_an_engine_with_a_wrong_identity_fails_at_0_8_4() -> None:
    """At 0.8.4, without the handshake, the engine's b"READY" on the input names its
    identity: an engine whose identity is its rank big-endian FAILS the identity checks (it
    runs and refuses nothing, so the waits that make a refusing engine NOT IMPLEMENTED leave
    its verdict alone); the honest engine passes them."""
    checks = ["engine/identity/rank-3", "engine/identity/rank-258", "engine/dp/three-identities"]
    target = reference_target("0.8.4")
    target.engine = ReferenceEngines(engine_class=_BigEndianIdentityEngine, version="0.8.4")
    results = _run("0.8.4", checks, target, POWER_SCALE)
    assert [r.status for r in results] == [FAILED] * 3, [r.message for r in results]
    messages = {r.check.id: r.message for r in results}
    assert messages["engine/identity/rank-3"].startswith(
        "engine 3 identifies as 0003 (2 bytes), expected 0300"), messages
    assert "expected 0000, 0100, 0200" in messages["engine/dp/three-identities"], messages
    assert [r.status for r in _run("0.8.4", checks, scale=POWER_SCALE)] == [PASSED] * 3


class _NewestLayoutEngine(ReferenceEngine):
    """An engine built for an older release that still writes the newest struct layouts."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        # The newest classes and codec; the session, READY keys and ready response form stay
        # the release's.
        self.structs = structs.ReleaseStructs()
        self.connection.codec = default_codec()


def test_an_engine_that_sends_the_newest_layout_fails_at_an_older_release() -> None:
    target = reference_target("0.22.0")
    target.engine = ReferenceEngines(engine_class=_NewestLayoutEngine, version="0.22.0")
    results = _run("0.22.0", ["engine/serve/add-generates", "engine/serve/abort"], target)
    assert [r.status for r in results] == [FAILED, FAILED], _failures(results)
    assert all("EngineCoreOutput" in r.message for r in results), [r.message for r in results]
    # The same engine at its own newest release passes: the failure is the layout.
    target = reference_target()
    target.engine = ReferenceEngines(engine_class=_NewestLayoutEngine)
    assert [r.status for r in _run("0.33.0", ["engine/serve/add-generates"], target)] \
        == [PASSED]


@pytest.mark.parametrize("version", ["0.7.3", "0.8.3", "0.8.5", "0.9.0", "0.9.1", "0.11.2",
                                     "0.27.1"])
def test_reference_front_end_and_engine_of_one_release_talk(version: str) -> None:
    """A front end at X with an engine at X: the handshake with X's keys (no headless at
    0.9.1), X's ready response (an empty frame at 0.9.1 and 0.11.2), a generation and a
    utility call; before 0.9.0 no handshake, X's sockets on the addresses the engine is given
    (0.7.3: the engine binds its output; 0.8.3: its input; 0.8.5: a DEALER input that sends
    b"READY"); at 0.9.0 the handshake on the input socket (the init a plain map, READY the
    ready response)."""
    with ReferenceFrontend(1, version=version) as frontend:
        direct = {} if frontend.handshake_address is not None else {
            "input_addresses": [frontend.input_address],
            "output_addresses": [frontend.output_address]}
        engine = ReferenceEngine(EngineOptions(handshake_address=frontend.handshake_address,
                                               handshake_timeout=10.0, version=version,
                                               **direct))
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            frontend.wait_ready(10.0)
            response = frontend.ready_responses[0]
            if ready_response_at(version) in ("empty", "READY", "none", "handshake"):
                assert response is None
            else:
                assert type(response) is frontend.connection.codec.structs.classes[
                    "EngineCoreReadyResponse"]
                assert response.vllm_version == version
            request = generation_request("r-1", [4, 5], 3, release=frontend.structs)
            frontend.add_request(request)
            tokens: list[int] = []
            reason = None
            deadline = time.monotonic() + 10.0
            while reason is None and time.monotonic() < deadline:
                for output in frontend.get_output(5.0).outputs:
                    tokens += output.new_token_ids
                    reason = output.finish_reason
            assert (tokens, int(reason)) == expected_generation(request, 4)
            assert frontend.call_utility("echo", [1, "a"], 0, 5.0) == [1, "a"]
        finally:
            engine.request_stop()
            thread.join(5.0)


def _sweep_releases() -> list[str]:
    """The last release of each minor line, and the last and first release on either side of
    each change of the input/output transport (history/constants.toml [[transport]]: 0.8.2,
    0.8.3 and 0.8.4 among them), in release order."""
    with (DATA_DIR / "history" / "releases.toml").open("rb") as handle:
        releases = tomllib.load(handle)["releases"]
    last: dict[str, str] = {}
    for release in releases:
        last[release.rsplit(".", 1)[0]] = release
    wanted = set(last.values())
    previous: tuple[Any, ...] | None = None
    for older, release in zip([None, *releases], releases, strict=False):
        found = transport_at(release)
        facts = None if found is None else (found.input, found.output, found.identity,
                                            found.clients, found.readiness)
        if older is not None and facts != previous:
            wanted.update((older, release))
        previous = facts
    return [r for r in releases if r in wanted]


#: Conversation checks left out of the sweep: each waits about a second or more for
#: something not to happen (a timeout, a message that must not come), in the same way at
#: every release; the fast test above runs them at 0.22.0.
SWEEP_SKIPS = {
    "engine/dead/sentinel-last", "engine/handshake/garbage-init",
    "engine/handshake/init-timeout", "frontend/handshake/garbage-hello",
    "frontend/handshake/local-mismatch", "frontend/handshake/missing-keys",
    "frontend/handshake/ready-before-hello", "frontend/handshake/ready-missing-key",
    "frontend/handshake/second-hello",
    "frontend/handshake/two-frame-hello", "frontend/handshake/unknown-rank-ignored",
    "frontend/handshake/unknown-status", "frontend/transport/duplicate-identity-ignored",
    "frontend/transport/no-drop-at-high-water-mark",
}


def _sweep_checks() -> list[str]:
    ids = [item.id for item in select(all_checks(), patterns=CONVERSATIONS)]
    assert SWEEP_SKIPS <= set(ids), sorted(SWEEP_SKIPS - set(ids))
    return [i for i in ids if i not in SWEEP_SKIPS]


@pytest.mark.slow
@pytest.mark.parametrize("version", _sweep_releases())
def test_conversations_pass_or_are_not_applicable_at_the_last_release_of_each_line(
        version: str) -> None:
    results = _run(version, _sweep_checks())
    assert _failures(results) == []
    statuses = {r.status for r in results} - {NOT_RUN}  # SHOULD checks: --strict only
    if conversation_gap(load(version)) is not None:
        assert statuses == {NOT_APPLICABLE}
    else:
        assert PASSED in statuses
        for result in results:
            if result.status == NOT_APPLICABLE:
                assert f"vLLM {version}" in result.message, result.message


# --- 0.9.0: HELLO, the init map and READY on the input socket ---------------------------


def test_0_9_0_holds_its_conversations_on_the_input_socket() -> None:
    """0.9.0 has a conversation (the history's readiness handshake-on-input, its init a map);
    its HELLO/READY, init and serving checks pass, and a check of a ready response of its own
    is NOT APPLICABLE naming READY on the input socket."""
    assert conversation_gap(load("0.9.0")) is None
    by_id = {r.check.id: r for r in _run("0.9.0", [
        "engine/handshake/hello-first", "engine/handshake/ready-keys",
        "engine/handshake/ready-after-connect", "engine/utility/call-ids-echoed",
        "engine/handshake/ready-response-map", "frontend/handshake/init-answers-hello",
        "frontend/requests/add-frames", "frontend/handshake/waits-for-ready-response"])}
    not_applicable = {"engine/handshake/ready-response-map",
                      "frontend/handshake/waits-for-ready-response"}
    for check_id, result in by_id.items():
        want = NOT_APPLICABLE if check_id in not_applicable else PASSED
        assert result.status == want, (check_id, result.message)
    for check_id in not_applicable:
        assert "vLLM 0.9.0's engine sends no ready response of its own: its READY map on " \
            "the input socket" in by_id[check_id].message


def test_the_0_9_0_init_is_the_release_map() -> None:
    """The 0.9.0 codec reads init as the map of [[init_message]] and refuses 0.9.1's struct."""
    codec = default_codec(version="0.9.0")
    value = {"output_socket_address": "ipc:///tmp/out", "parallel_config": {}}
    assert codec.decode("init", codec.encode("init", value)) == value
    newer = default_codec(version="0.9.1")
    struct_init = newer.encode("init", newer.structs.classes["EngineHandshakeMetadata"](
        addresses=newer.structs.classes["EngineZmqAddresses"](inputs=["a"], outputs=["b"]),
        parallel_config={}))
    with pytest.raises(ProtocolError, match="handshake.init-addresses"):
        codec.decode("init", struct_init)


@pytest.mark.parametrize(("peers", "at"), [("0.9.1", "0.9.0"), ("0.9.0", "0.9.1")])
def test_peers_of_the_other_0_9_handshake_fail(peers: str, at: str) -> None:
    """An engine or front end built for 0.9.1 (a handshake socket of its own,
    EngineHandshakeMetadata, an empty ready response) fails at 0.9.0, and one built for 0.9.0
    (the handshake on the input socket, a plain init map) fails at 0.9.1; each passes at its
    own release."""
    engine_checks = ["engine/serve/add-generates", "engine/utility/call-ids-echoed"]
    target = reference_target(at)
    target.engine = ReferenceEngines(version=peers)
    # One check per side fails (each waits out its scaled waits); each passes both at its own
    # release at the same scale.
    results = _run(at, engine_checks[:1], target, POWER_SCALE)
    assert [r.status for r in results] == [FAILED], [r.message for r in results]
    frontend_checks = ["frontend/requests/add-frames", "frontend/utility/call-and-reply"]
    target = reference_target(at)
    target.frontend = ReferenceFrontends(ReferenceCodec(version=peers))
    results = _run(at, frontend_checks[:1], target, POWER_SCALE)
    assert [r.status for r in results] == [FAILED], [r.message for r in results]
    assert [r.status for r in _run(peers, engine_checks + frontend_checks, scale=POWER_SCALE)] \
        == [PASSED] * 4


# --- 0.9.x: HELLO/READY without headless, READY with num_gpu_blocks ---------------------


def test_handshake_checks_pass_at_0_9_1_and_0_9_2() -> None:
    """0.9.1's HELLO is {status, local}, its READY adds num_gpu_blocks; 0.9.2's READY adds
    dp_stats_address; both send an empty ready response."""
    checks = ["engine/handshake/hello-first", "engine/handshake/ready-keys",
              "engine/handshake/ready-response-map", "engine/handshake/flags-follow-launch",
              "frontend/handshake/init-answers-hello", "frontend/handshake/missing-keys",
              "frontend/handshake/ready-missing-key"]
    for version in ("0.9.1", "0.9.2"):
        results = _run(version, checks)
        assert [r.status for r in results] == [PASSED] * len(checks), _failures(results)
    # The honest front end passes at the scale its power test fails at (newest keys, below).
    [honest] = _run("0.9.1", ["frontend/handshake/init-answers-hello"], scale=POWER_SCALE)
    assert honest.status == PASSED, honest.message


@pytest.fixture
def newest_handshake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference engines and front ends built while it is active send and require the
    newest HELLO/READY keys (status, local, headless), whatever release they are built for;
    the suite's peers keep the release's."""
    from enginewire.reference import codec as codec_module
    from enginewire.reference import session as session_module
    from enginewire.spec.history import release_facts

    def newest(spec: Any, status: str) -> Any:
        return release_facts.handshake_message_at(load(), status)

    monkeypatch.setattr(session_module, "handshake_message_at", newest)
    monkeypatch.setattr(codec_module, "handshake_message_at", newest)
    monkeypatch.setattr(codec_module, "_CODECS", {})  # codecs built afresh under the patch


@pytest.mark.usefixtures("newest_handshake")
def test_an_engine_sending_the_newest_keys_fails_at_0_9_1() -> None:
    results = _run("0.9.1", ["engine/handshake/hello-first", "engine/handshake/ready-keys"])
    assert [r.status for r in results] == [FAILED, FAILED]
    hello, ready = (r.message for r in results)
    assert "HELLO carries ['headless'], which vLLM 0.9.1's HELLO does not have" in hello
    assert "num_gpu_blocks" in ready and "missing" in ready, ready


@pytest.mark.usefixtures("newest_handshake")
def test_a_front_end_requiring_the_newest_keys_fails_at_0_9_1() -> None:
    [result] = _run("0.9.1", ["frontend/handshake/init-answers-hello"], scale=POWER_SCALE)
    assert result.status == FAILED
    assert "init after HELLO" in result.message


class _StructReadyEngine(ReferenceEngine):
    """An engine built for a release whose engine sends an empty ready response that sends
    an EngineCoreReadyResponse map instead (the form of 0.20.0 on)."""

    def _send_ready_responses(self) -> None:
        from enginewire.conformance.peers.zmq_peers import ready_response_value

        self.connection.send("ready_response", None)  # the session's step; frames unused
        for sock in self._inputs:
            sock.socket.send(msgspec.msgpack.encode(ready_response_value(self.options.rank)))


def test_an_engine_sending_the_wrong_ready_form_fails_at_0_9_1() -> None:
    target = reference_target("0.9.1")
    target.engine = ReferenceEngines(engine_class=_StructReadyEngine, version="0.9.1")
    [result] = _run("0.9.1", ["engine/handshake/ready-response-map"], target)
    assert result.status == FAILED
    assert "vLLM 0.9.1's engine sends one empty ready-response frame" in result.message


# --- READY keys per release (0.10.0-0.19.1: num_gpu_blocks and dp_stats_address) ---------


class _NoStatsAddressEngine(ReferenceEngine):
    """An engine built for 0.15.0 whose READY lacks dp_stats_address (as 0.9.0-0.9.1's):
    its session writes the release's READY, the frame on the wire drops the key."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        send = self.connection.send

        def without_stats_address(kind: str, value: Any = None) -> list[bytes]:
            frames = send(kind, value)
            if kind != "ready":
                return frames
            ready = msgspec.msgpack.decode(frames[0])
            del ready["dp_stats_address"]
            return [msgspec.msgpack.encode(ready)]

        self.connection.send = without_stats_address  # type: ignore[method-assign]


def test_an_engine_whose_ready_lacks_a_key_of_its_release_fails() -> None:
    target = reference_target("0.15.0")
    target.engine = ReferenceEngines(engine_class=_NoStatsAddressEngine, version="0.15.0")
    [result] = _run("0.15.0", ["engine/handshake/ready-keys"], target)
    assert result.status == FAILED
    assert "dp_stats_address" in result.message and "missing" in result.message
    [reference] = _run("0.15.0", ["engine/handshake/ready-keys"])
    assert reference.status == PASSED


def test_the_front_end_requires_its_release_ready_keys() -> None:
    [old] = _run("0.15.0", ["frontend/handshake/ready-missing-key"])
    assert old.status == PASSED
    [newest] = _run("0.33.0", ["frontend/handshake/ready-missing-key"])
    assert newest.status == NOT_APPLICABLE
    assert "vLLM 0.33.0's READY requires no key beyond" in newest.message


@pytest.mark.usefixtures("newest_handshake")
def test_a_front_end_not_requiring_its_release_ready_keys_fails() -> None:
    [result] = _run("0.15.0", ["frontend/handshake/ready-missing-key"])
    assert result.status == FAILED
    assert "without 'num_gpu_blocks'" in result.message or \
        "without 'dp_stats_address'" in result.message
