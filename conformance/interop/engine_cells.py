"""Engine cells: one front end with one engine core over ``ipc`` or ``tcp``
(:func:`run_engine_cell`), and the session helpers the data-parallel cells share
(:class:`_Outputs`, the one reader of the front end's outputs; :func:`_start_session`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from .common import (
    ABORT_QUIET_S,
    ABORT_TOKENS,
    ADD_PROMPT,
    ADD_TOKENS,
    FINISH_ABORT,
    FINISH_LENGTH,
    STEP_TIMEOUT,
    Cell,
    ExchangeFailure,
    HandshakeLauncher,
    Implementation,
    _addresses,
    _left_files,
    _remove_files,
    _Script,
    classify,
)

# --- engine cells ----------------------------------------------------------------------------


def _neutral(value: Any) -> Any:
    from enginewire.conformance.oracle.values import neutral

    return neutral(value)


class _Outputs:
    """What the front end delivered, per request: tokens, finish reason, when it was last seen
    and the ``engine_index`` of the outputs batch that carried it (the one reader of a
    front end's outputs, for the engine and the data-parallel cells)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, int] = {}
        self.last_seen: dict[str, float] = {}
        self.engine_index: dict[str, int | None] = {}

    def read(self, timeout: float) -> bool:
        """Read one batch (False: none within ``timeout``)."""
        try:
            batch = _neutral(self.client.next_outputs(timeout))
        except TimeoutError:
            return False
        except ConnectionError as exc:
            raise ExchangeFailure(f"the front end saw the engine die: {exc}",
                                  "frames.engine-core-dead-fatal", "engine") from exc
        for output in (batch or {}).get("outputs") or []:
            request_id = output["request_id"]
            self.engine_index[request_id] = (batch or {}).get("engine_index")
            self.tokens.setdefault(request_id, []).extend(output.get("new_token_ids") or [])
            self.last_seen[request_id] = time.monotonic()
            if output.get("finish_reason") is not None:
                self.finish[request_id] = int(output["finish_reason"])
        return True


def _request(request_id: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    from enginewire.conformance.oracle.samples import minimal_request

    request = minimal_request(request_id, prompt_token_ids=list(prompt), arrival_time=time.time())
    request["sampling_params"] = {**request["sampling_params"], "max_tokens": max_tokens}
    return request


def _start_session(frontend_impl: Implementation, engine_impl: Implementation,
                   addresses: tuple[str, str, str], launches: list[Any],
                   state: dict[str, Any], timeout: float,
                   started: list[Any] | None = None) -> list[Any]:
    """Start the engines of ``launches`` and then the front end (``state["client"]``; a
    :class:`HandshakeLauncher` in ``state["launcher"]`` for a front end without its own
    handshake) and wait until the front end is ready. Each engine is appended to ``started``
    as it starts, so a caller's clean-up finds it even when a later start fails; returns
    ``started``."""
    from enginewire.conformance.targets.contract import FrontendLaunch

    engines = started if started is not None else []
    for surface in (frontend_impl.frontend, engine_impl.engine):
        prepare = getattr(surface, "prepare", None)
        if prepare is not None:
            prepare()
    launch = FrontendLaunch(*addresses, engine_count=len(launches))
    if getattr(frontend_impl.frontend, "handshake", True) is False:
        state["launcher"] = HandshakeLauncher(*addresses, engine_count=len(launches))
    # The engines first: vLLM's launcher forks them, before this process runs the front
    # end's threads (connecting before the other end binds is fine for ZMQ).
    for engine_launch in launches:
        engines.append(engine_impl.engine.start_engine(engine_launch))
    state["client"] = frontend_impl.frontend.start_frontend(launch)
    if "launcher" in state:
        state["launcher"].serve(timeout)
    try:
        state["client"].wait_ready(timeout)
    except TimeoutError as exc:
        raise ExchangeFailure(f"the front end was not ready within {timeout:g} s: {exc}",
                              "handshake.frontend.bounded-handshake") from exc
    return engines


def engine_launch(engine_impl: Implementation, addresses: tuple[str, str, str],
                  timeout: float, **launch: Any) -> Any:
    """The launch of a cell's engine (``launch``: more :class:`EngineLaunch` fields): by the
    handshake address, or, in a release without the HELLO/READY handshake
    (history/constants.toml [[transport]]), with the input and output addresses given
    directly; where the release holds the handshake on the input socket (0.9.0), by the
    input address."""
    from enginewire.conformance.targets.contract import EngineLaunch
    from enginewire.spec.history.release_facts import handshake_gap, handshake_on_input

    handshake_address, input_address, output_address = addresses
    if engine_impl.version is not None and handshake_on_input(engine_impl.version):
        return EngineLaunch(input_address, init_timeout=timeout, **launch)
    if engine_impl.version is not None and handshake_gap(engine_impl.version) is not None:
        return EngineLaunch(None, init_timeout=timeout, input_addresses=(input_address,),
                            output_addresses=(output_address,), **launch)
    return EngineLaunch(handshake_address, init_timeout=timeout, **launch)


def run_engine_cell(frontend_impl: Implementation, engine_impl: Implementation,
                    transport: str, timeout: float = STEP_TIMEOUT) -> Cell:
    """Front end ``frontend_impl`` against engine core ``engine_impl`` over ``transport``."""

    cell = Cell("engine", frontend_impl.name, engine_impl.name, transport)
    script = _Script(cell)
    handshake_address, input_address, output_address = _addresses(transport)
    handshake = getattr(frontend_impl.frontend, "handshake", True) is not False
    state: dict[str, Any] = {}
    outputs: list[_Outputs] = []

    def start() -> None:
        started: list[Any] = []
        try:
            _start_session(
                frontend_impl, engine_impl, (handshake_address, input_address, output_address),
                [engine_launch(engine_impl, (handshake_address, input_address, output_address),
                               timeout)], state, timeout,
                started=started)
        finally:
            if started:  # the clean-up below stops it, also when the front end failed
                state["engine"] = started[0]
        outputs.append(_Outputs(state["client"]))

    def add() -> None:
        assert engine_impl.expected_tokens is not None
        client, seen = state["client"], outputs[0]
        client.add_request(_request("interop-add", ADD_PROMPT, ADD_TOKENS), 0)
        deadline = time.monotonic() + timeout
        while "interop-add" not in seen.finish:
            if time.monotonic() > deadline or not seen.read(deadline - time.monotonic()):
                raise ExchangeFailure(
                    f"no finished output for the ADD within {timeout:g} s (tokens so far "
                    f"{seen.tokens.get('interop-add', [])})", "frames.outputs-payload",
                    "engine")
        expected = engine_impl.expected_tokens(ADD_PROMPT, ADD_TOKENS)
        got = (seen.tokens.get("interop-add", []), seen.finish["interop-add"])
        if got != (expected, FINISH_LENGTH):
            raise ExchangeFailure(
                f"expected tokens {expected} and finish_reason length ({FINISH_LENGTH}), "
                f"got tokens {got[0]} and finish_reason {got[1]}", None, "engine")

    def abort() -> None:
        client, seen = state["client"], outputs[0]
        client.add_request(_request("interop-abort", ADD_PROMPT, ABORT_TOKENS), 0)
        deadline = time.monotonic() + timeout
        while not seen.tokens.get("interop-abort"):
            if "interop-abort" in seen.finish:
                break
            if time.monotonic() > deadline or not seen.read(deadline - time.monotonic()):
                raise ExchangeFailure(f"no output for the request to abort within "
                                      f"{timeout:g} s", "frames.outputs-payload", "engine")
        client.abort(["interop-abort"], 0)
        aborted_at = time.monotonic()
        deadline = aborted_at + timeout
        while "interop-abort" not in seen.finish:
            quiet = time.monotonic() - max(seen.last_seen.get("interop-abort", 0.0),
                                           aborted_at)
            if quiet >= ABORT_QUIET_S:
                return  # stopped without a final output (vLLM's engine sends none)
            if time.monotonic() > deadline:
                raise ExchangeFailure(
                    f"the aborted request still streams {timeout:g} s after the ABORT",
                    "frames.abort-payload", "engine")
            seen.read(min(ABORT_QUIET_S - quiet, deadline - time.monotonic()) + 0.01)
        reason = seen.finish["interop-abort"]
        if reason != FINISH_ABORT:
            count = len(seen.tokens.get("interop-abort", []))
            raise ExchangeFailure(
                f"expected the ABORT to end the request (finish_reason abort ({FINISH_ABORT}) "
                f"or no more output), got finish_reason {reason} after {count} of "
                f"{ABORT_TOKENS} tokens", "frames.abort-payload", "engine")

    def utility() -> None:
        result = _neutral(state["client"].call_utility("get_supported_tasks", [], 0,
                                                       timeout))
        if not isinstance(result, list | tuple) or "generate" not in result:
            raise ExchangeFailure(
                f"get_supported_tasks answered {result!r}, expected a list with 'generate'",
                "frames.utility-payload", "engine")

    def shutdown() -> None:
        _stop_session(state.pop("client"), [state.pop("engine")],
                      [input_address, output_address], timeout)

    try:
        script.step("handshake" if handshake else "ready-response", start)
        script.step("add", add)
        script.step("abort", abort)
        script.step("utility", utility)
        script.step("shutdown", shutdown)
    finally:
        _release_session(state, [handshake_address, input_address, output_address], timeout)
    classify(cell)
    return cell


def _stop_session(client: Any, engines: Sequence[Any], addresses: Sequence[str],
                  timeout: float) -> None:
    """Stop the front end, then each engine; a peer still running afterwards, or an ipc
    socket file the front end left behind (transport.ipc-files-removed), fails the exchange."""
    client.stop(timeout)
    for engine in engines:
        engine.stop(timeout)
    names = ["engine"] if len(engines) == 1 else [f"engine {rank}" for rank in range(len(engines))]
    running = [name for name, engine in zip(names, engines, strict=True) if engine.alive()]
    if client.alive():
        running.insert(0, "front end")
    if running:
        raise ExchangeFailure(f"still running after stop: {', '.join(running)}", None,
                              "engine" if running[-1].startswith("engine") else "frontend")
    left = _left_files(addresses)
    if left:
        raise ExchangeFailure(f"the front end left its ipc socket files {left}",
                              "transport.ipc-files-removed", "frontend")


def _release_session(state: dict[str, Any], addresses: Sequence[str], timeout: float) -> None:
    """Whatever a session's steps left in ``state`` (its front end, engine or engines, the
    handshake launcher) stopped, whether or not a step failed, and its ipc files removed."""
    peers = [state.pop("client", None), state.pop("engine", None), *state.pop("engines", [])]
    for peer in peers:
        if peer is not None:
            with contextlib.suppress(Exception):
                peer.stop(timeout)
    launcher = state.pop("launcher", None)
    if launcher is not None:
        launcher.close()
    _remove_files(addresses)
