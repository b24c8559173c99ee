"""The checks of socket options, identities, segment modes and front ends without a handshake
channel: each passes on the reference and fails on a deliberately broken in-process target."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
import zmq

from enginewire.conformance.framework.outcomes import FAILED, NOT_APPLICABLE, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import (
    ReferenceCodec,
    ReferenceEngines,
    ReferenceFrontendClient,
    ReferenceFrontends,
    ReferenceRing,
)
from enginewire.spec import load


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


def _verdicts(patterns: list[str], target: Target, spec: Any) -> dict[str, Any]:
    checks = select(all_checks(), patterns=patterns)
    assert len(checks) == len(patterns), [c.id for c in checks]
    result = run(checks, target, spec)
    return {r.check.id: r for r in result.results}


def _frontends(**changes: Any) -> Target:
    return Target(name="frontend", frontend=_Frontends(**changes))


class _Frontends(ReferenceFrontends):
    """The reference front end, optionally broken after it bound its sockets (options a
    socket reads when a peer connects: ROUTER_HANDOVER) or in its session."""

    def __init__(self, *, input_options: dict[int, int] | None = None,
                 ignore_config_hash: bool = False) -> None:
        super().__init__(ReferenceCodec())
        self.input_options = input_options or {}
        self.ignore_config_hash = ignore_config_hash

    def start_frontend(self, launch: Any) -> ReferenceFrontendClient:
        client = super().start_frontend(launch)
        for option, value in self.input_options.items():
            client.frontend._input.socket.setsockopt(option, value)
        if self.ignore_config_hash:
            client.frontend.session.config_hash = None
        return client


# --- transport.hwm-zero ------------------------------------------------------------------------


def test_a_front_end_with_the_default_high_water_mark_is_caught(
        spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    import enginewire.reference.transport as transport

    patterns = ["frontend/transport/no-drop-at-high-water-mark",
                "frontend/transport/high-water-marks-zero"]
    honest = _verdicts(patterns, _frontends(), spec)
    assert [r.status for r in honest.values()] == [PASSED, PASSED], [
        r.message for r in honest.values()]
    original = transport.channel_end

    def default_hwm(channel: str, role: str, version: str | None = None) -> Any:
        # A listener copies its socket's options when it binds: the option must be set first.
        end = original(channel, role, version)
        if (channel, role) == ("input", "frontend"):
            end = msgspec.structs.replace(end, options={**end.options, "SNDHWM": 1000})
        return end

    monkeypatch.setattr(transport, "channel_end", default_hwm)
    broken = _verdicts(patterns, _frontends(), spec)
    dropped = broken["frontend/transport/no-drop-at-high-water-mark"]
    assert dropped.status == FAILED
    assert "lost while the engine was not reading" in dropped.message
    options = broken["frontend/transport/high-water-marks-zero"]
    assert options.status == FAILED
    assert options.first_line == "the input ROUTER has SNDHWM 1000, expected 0"


def test_an_engine_with_a_high_water_mark_is_caught(spec: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import enginewire.reference.engine as engine_module

    check = ["engine/transport/high-water-marks-zero"]
    target = Target(name="engine", engine=ReferenceEngines())
    assert _verdicts(check, target, spec)[check[0]].status == PASSED
    original = engine_module.open_socket

    def with_hwm(ctx: Any, channel: str, role: str, address: str, **kwargs: Any) -> Any:
        opened = original(ctx, channel, role, address, **kwargs)
        if channel == "output":
            opened.socket.setsockopt(zmq.SNDHWM, 1000)  # after connect: read back all the same
        return opened

    monkeypatch.setattr(engine_module, "open_socket", with_hwm)
    result = _verdicts(check, target, spec)[check[0]]
    assert result.status == FAILED
    assert result.first_line == "the output PUSH has SNDHWM 1000, expected 0"


# --- transport.identity-reuse-needs-old-connection-gone ------------------------------------------


def test_a_front_end_handing_identities_over_is_caught(spec: Any) -> None:
    check = ["frontend/transport/duplicate-identity-ignored"]
    assert _verdicts(check, _frontends(), spec)[check[0]].status == PASSED
    broken = _verdicts(check, _frontends(input_options={zmq.ROUTER_HANDOVER: 1}), spec)
    assert broken[check[0]].status == FAILED
    assert "went to a second connection" in broken[check[0]].message


# --- handshake.config-hash-match ------------------------------------------------------------------


def test_a_front_end_ignoring_the_config_hash_is_caught(spec: Any) -> None:
    check = ["frontend/handshake/config-hash-checked"]
    assert _verdicts(check, _frontends(), spec)[check[0]].status == PASSED
    broken = _verdicts(check, _frontends(ignore_config_hash=True), spec)[check[0]]
    assert broken.status == FAILED
    assert "parallel_config_hash differs" in broken.message


# --- frames.engine-core-dead-fatal, frames.engine-core-dead-literal ------------------------------


class _DeadIsSilent(ReferenceFrontendClient):
    """Leaves a pending utility call waiting after ENGINE_CORE_DEAD (as vLLM 0.33.0 does)."""

    def call_utility(self, method: str, args: list[Any], engine_index: int = 0,
                     timeout: float = 5.0) -> Any:
        import time

        started = time.monotonic()
        try:
            return super().call_utility(method, args, engine_index, timeout)
        except ConnectionError:
            # Waits out the timeout, as a stuck call would, unless the front end stops.
            self._stopping.wait(max(0.0, timeout - (time.monotonic() - started)))
            raise TimeoutError(f"no reply to {method}") from None


class _AnyMalformedIsDeath(ReferenceFrontendClient):
    """Takes any output message it cannot read for ENGINE_CORE_DEAD."""

    def next_outputs(self, timeout: float) -> Any:
        try:
            return super().next_outputs(timeout)
        except TimeoutError:
            raise
        except Exception as exc:  # noqa: BLE001 - the bug being simulated
            raise ConnectionError(f"engine dead: {exc}") from exc


class _WithClient(ReferenceFrontends):
    def __init__(self, client_class: type) -> None:
        super().__init__(ReferenceCodec())
        self.client_class = client_class

    def start_frontend(self, launch: Any) -> ReferenceFrontendClient:
        return self.client_class(launch, self.codec)


def test_a_front_end_leaving_calls_pending_after_death_is_caught(spec: Any) -> None:
    check = ["frontend/outputs/dead-fails-pending-call"]
    assert _verdicts(check, _frontends(), spec)[check[0]].status == PASSED
    broken = Target(name="silent", frontend=_WithClient(_DeadIsSilent))
    result = _verdicts(check, broken, spec)[check[0]]
    assert result.status == FAILED
    assert result.first_line.endswith("was still waiting 3 s later")


def test_a_front_end_taking_a_near_miss_for_death_is_caught(spec: Any) -> None:
    check = ["frontend/outputs/dead-near-miss"]
    assert _verdicts(check, _frontends(), spec)[check[0]].status == PASSED
    broken = Target(name="jumpy", frontend=_WithClient(_AnyMalformedIsDeath))
    result = _verdicts(check, broken, spec)[check[0]]
    assert result.status == FAILED
    assert "report the engine dead" in result.message


# --- front ends without a handshake channel -----------------------------------------------------


class _NoHandshakeClient(ReferenceFrontendClient):
    def __init__(self, launch: Any, codec: Any) -> None:
        from enginewire.reference.frontend import ReferenceFrontend

        super().__init__(launch, codec, functools.partial(ReferenceFrontend, handshake=False))


class _NoHandshake(ReferenceFrontends):
    """The reference front end given its engines' addresses (``handshake=False``)."""

    handshake = False

    def start_frontend(self, launch: Any) -> ReferenceFrontendClient:
        return _NoHandshakeClient(launch, self.codec)


def test_a_front_end_without_handshake_runs_the_rest(spec: Any) -> None:
    checks = [c for c in select(all_checks(), surfaces=["frontend"]) if c.level(spec) == "MUST"]
    target = Target(name="no-handshake", frontend=_NoHandshake(ReferenceCodec()))
    result = run(checks, target, spec)
    by_status: dict[str, list[str]] = {}
    for item in result.results:
        by_status.setdefault(item.status, []).append(item.check.id)
    needs_handshake = {c.id for c in checks if "frontend.handshake" in c.requires}
    assert set(by_status[NOT_APPLICABLE]) == needs_handshake
    assert len(needs_handshake) >= 10
    assert set(by_status) == {PASSED, NOT_APPLICABLE}, by_status.get(FAILED)
    # Not applicable is never a pass, and not a failure either.
    assert result.count(PASSED) == len(checks) - len(needs_handshake)
    assert result.ok


def test_without_handshake_the_ready_response_is_still_awaited(spec: Any) -> None:
    """The ready-response checks run in both modes, and catch a front end that does not wait."""

    class Eager(_NoHandshakeClient):
        def wait_ready(self, timeout: float) -> None:
            return None

    class EagerFrontends(_NoHandshake):
        def start_frontend(self, launch: Any) -> ReferenceFrontendClient:
            return Eager(launch, self.codec)

    patterns = ["frontend/handshake/waits-for-ready-response",
                "frontend/handshake/every-engine-ready"]
    target = Target(name="eager", frontend=EagerFrontends(ReferenceCodec()))
    assert {r.status for r in _verdicts(patterns, target, spec).values()} == {FAILED}


# --- ring.notify.sub-conflate, ring.payload.trusted-only -----------------------------------------


class _NoConflate(ReferenceRing):
    """A reader whose notify SUB lacks CONFLATE."""

    def attach_reader(self, handle: Any, rank: int) -> Any:
        end = super().attach_reader(handle, rank)
        queue = end.queue
        queue._notify_socket.close(linger=0)
        sock = queue._resources.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(handle.notify_address)
        queue._notify_socket = sock
        return end


class _SharedSegment(ReferenceRing):
    """A writer whose segment every user may read and write."""

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> Any:
        writer = super().create_writer(n_reader=n_reader, max_chunk_bytes=max_chunk_bytes,
                                       max_chunks=max_chunks)
        os.chmod(f"/dev/shm/{writer.handle.shm_name.lstrip('/')}", 0o666)
        return writer


def test_a_reader_without_conflate_is_caught(spec: Any) -> None:
    check = ["ring/reader/notify-sub-conflate"]
    assert _verdicts(check, Target(name="ok", ring=ReferenceRing()), spec)[check[0]].status \
        == PASSED
    result = _verdicts(check, Target(name="no-conflate", ring=_NoConflate()), spec)[check[0]]
    assert result.status == FAILED
    assert "with CONFLATE 0" in result.message


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
def test_a_segment_open_to_everyone_is_caught(spec: Any) -> None:
    check = ["ring/writer/segment-owner-only"]
    assert _verdicts(check, Target(name="ok", ring=ReferenceRing()), spec)[check[0]].status \
        == PASSED
    result = _verdicts(check, Target(name="shared", ring=_SharedSegment()), spec)[check[0]]
    assert result.status == FAILED
    assert result.first_line.startswith("the ring segment has mode 0666")


def test_not_applicable_is_reported_apart(spec: Any) -> None:
    from enginewire.conformance.framework import reports

    checks = select(all_checks(), patterns=["frontend/handshake/init-answers-hello",
                                            "frontend/handshake/second-hello"])
    target = Target(name="no-handshake", frontend=_NoHandshake(ReferenceCodec()))
    result = run(checks, target, spec)
    assert [r.status for r in result.results] == [NOT_APPLICABLE, NOT_APPLICABLE]
    summary = reports.to_builtins(result)["summary"]
    assert (summary["not_applicable"], summary["passed"], summary["failed"]) == (2, 0, 0)
    skipped = reports.junit_tree(result).findall(".//skipped")
    assert [s.get("message", "").split(":")[0] for s in skipped] == ["not applicable"] * 2
    text = reports.render_terminal(result)
    assert "2 not applicable" in text and text.endswith("0 passed, 0 failed")
