"""vLLM's real front-end client (AsyncMPClient) in front of the reference engine, through the
tap (engines given addresses directly, as vLLM's ``client_addresses``): the session completes,
every frame decodes with no clause broken, the frames vLLM wrote reach the engine unchanged,
and a recording of it replays against the reference engine without divergence.

And (``slow``: vLLM's engine core and worker start, 5-70 s with the machine's load) vLLM's
client in front of vLLM's own engine core through the tap, with identical frames at both
ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from enginewire.conformance.targets.vllm.frontend_client import (
    client_config,
    make_client,
    ready_timeout,
)
from enginewire.reference.addresses import ipc_address, remove_ipc_file
from enginewire.reference.engine import EngineOptions, ReferenceEngine, scripted_tokens
from enginewire.tap.annotate import Annotator, line
from enginewire.tap.capture import Record
from enginewire.tap.proxy import Tap, TapConfig
from enginewire.tap.replay import Addresses, replay_against_engine, replay_against_frontend

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

TIMEOUT = 20.0


def _request(request_id: str, prompt: list[int], max_tokens: int) -> Any:
    import time

    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(
        request_id=request_id, prompt_token_ids=prompt, mm_features=None,
        sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
        arrival_time=time.time(), lora_request=None, cache_salt=None, data_parallel_rank=None,
    )


@contextlib.contextmanager
def _engine(input_address: str, output_address: str,
            seen: list[tuple[str, str, list[bytes]]] | None = None
            ) -> Iterator[ReferenceEngine]:
    """A reference engine on a thread; with ``seen``, every message its connection received
    and sent, as ``(sender, channel, frames)``."""
    engine = ReferenceEngine(EngineOptions(input_addresses=[input_address],
                                           output_addresses=[output_address]))
    if seen is not None:
        connection = engine.connection
        receive, send = connection.receive, connection.send

        def logged_receive(channel: str, frames: Any) -> Any:
            seen.append(("frontend", channel, [bytes(f) for f in frames]))
            return receive(channel, frames)

        def logged_send(kind: str, value: Any = None, **options: Any) -> Any:
            frames = send(kind, value, **options)
            channel = "input" if kind == "ready_response" else "output"
            seen.append(("engine", channel, [bytes(f) for f in frames]))
            return frames

        connection.receive = logged_receive  # type: ignore[method-assign]
        connection.send = logged_send  # type: ignore[method-assign]
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.request_stop()
        thread.join(TIMEOUT)


async def drive(config: Any, input_address: str, output_address: str,
                results: dict[str, list[int]]) -> None:
    """The scenario vLLM's client runs: two requests to their end, then a utility call."""
    client = make_client(config, input_address, output_address)
    try:
        await client.add_request_async(_request("a", [7, 8], 3))
        await client.add_request_async(_request("b", [9], 2))
        pending = {"a", "b"}
        while pending:
            outputs = await asyncio.wait_for(client.get_output_async(), TIMEOUT)
            for output in outputs.outputs:
                results.setdefault(output.request_id, []).extend(output.new_token_ids)
                if output.finish_reason is not None:
                    pending.discard(output.request_id)
        echo = client.call_utility_async("echo", 1, "two")
        assert await asyncio.wait_for(echo, TIMEOUT) == [1, "two"]
    finally:
        client.shutdown()


def test_vllm_client_through_the_tap_against_the_reference_engine() -> None:
    config = client_config(1, max_model_len=2048)
    upstream_in, upstream_out = ipc_address(), ipc_address()
    records: list[Record] = []
    results: dict[str, list[int]] = {}
    seen: list[tuple[str, str, list[bytes]]] = []
    try:
        with ready_timeout(int(TIMEOUT)), \
                Tap(TapConfig(upstream_inputs=[upstream_in], upstream_outputs=[upstream_out]),
                    record=records.append) as tap:
            tap.start()
            with _engine(tap.input_addresses[0], tap.output_addresses[0], seen):

                asyncio.run(drive(config, upstream_in, upstream_out, results))
    finally:
        # vLLM's shutdown leaves its socket files (transport.ipc-files-removed).
        remove_ipc_file(upstream_in)
        remove_ipc_file(upstream_out)
    assert results == {"a": scripted_tokens([7, 8], 3), "b": scripted_tokens([9], 2)}
    # Byte for byte: the engine received exactly the frames vLLM's client wrote (as the tap
    # received them) and the tap forwarded exactly the frames the engine wrote, per channel.
    for sender in ("frontend", "engine"):
        for channel in ("input", "output"):
            assert [f for s, c, f in seen if (s, c) == (sender, channel)] == [
                list(r.frames) for r in records if (r.sender, r.channel) == (sender, channel)]
    annotator = Annotator()
    annotations = [annotator.annotate(r) for r in records]
    assert all(a.ok for a in annotations), [line(a) for a in annotations if not a.ok]
    kinds = [a.kind for a in annotations]
    assert kinds[0] == "ready_response"
    assert kinds.count("add") == 2 and "utility" in kinds and "utility_reply" in kinds

    # The recording (vLLM's own frames) replays against the reference engine.
    @contextlib.contextmanager
    def launch(addresses: Addresses, rank: int) -> Iterator[None]:
        with _engine(addresses.input, addresses.output):
            yield None

    result = replay_against_engine(records, launch, timeout=TIMEOUT)
    assert result.ok, (result.divergence and result.divergence.describe(), result.stopped)

    # And the recorded engine replays against vLLM's client driven through the same scenario:
    # vLLM's client, as a replay target, sends what it sent when recorded.
    replayed: dict[str, list[int]] = {}
    failures: list[BaseException] = []

    @contextlib.contextmanager
    def vllm_frontend(addresses: Addresses, rank: int) -> Iterator[None]:
        def run() -> None:
            try:
                asyncio.run(drive(client_config(1, max_model_len=2048), addresses.input,
                                  addresses.output, replayed))
            except BaseException as exc:  # reported by the test below
                failures.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield None
        finally:
            thread.join(TIMEOUT)
            assert not thread.is_alive()

    with ready_timeout(int(TIMEOUT)):
        result = replay_against_frontend(records, vllm_frontend, timeout=TIMEOUT)
    assert failures == []
    assert result.ok, (result.divergence and result.divergence.describe(), result.stopped)
    assert replayed == results


# --- vLLM's client -> tap -> vLLM's engine core ------------------------------------------------


def _masked_init(record: Record) -> tuple[str, str, bytes | None, tuple[bytes, ...]]:
    """A record as ``(sender, channel, identity, frames)``, with the addresses inside an init
    message masked (the one thing each tap rewrites)."""
    import msgspec

    frames = record.frames
    if record.channel == "handshake" and record.sender == "frontend":
        decoded = msgspec.msgpack.decode(frames[0])
        decoded["addresses"] = "<addresses>"
        frames = (msgspec.msgpack.encode(decoded), *frames[1:])
    return record.sender, record.channel, record.identity, frames


def _stream(records: list[Record], sender: str, channel: str) -> list[Any]:
    """The messages ``sender`` wrote on ``channel``, in order (ZMQ orders messages per
    socket, not across sockets), init addresses masked."""
    return [_masked_init(r) for r in records if (r.sender, r.channel) == (sender, channel)]


@pytest.mark.slow
def test_vllm_client_through_the_tap_against_vllms_engine_core() -> None:
    """vLLM's real client (``AsyncMPClient``) and vLLM's real engine core (``EngineCoreProc``,
    launched by vLLM's ``CoreEngineProcManager`` with its executor and worker process) talk
    through the tap; the handshake is the deployment's launcher's (``HandshakeLauncher``: the
    client is given its addresses, as in ``vllm serve``'s API-server processes).

    Both ends are vLLM's own, in processes and event loops whose sockets the test cannot read
    without changing vLLM, so what each end wrote and received is observed by one more tap on
    each side of the tap under test: client -> outer tap -> tap -> inner tap -> engine. Each
    tap records every message as it received it; the outer one sees what the client wrote and
    what reaches the client, the inner one what the engine wrote and what reaches the engine.
    All three record the same messages, byte for byte, per channel and in order (the init's
    addresses aside, which every tap rewrites to its own)."""
    from enginewire.conformance import interop
    from enginewire.conformance.oracle.samples import minimal_request
    from enginewire.conformance.oracle.values import neutral
    from enginewire.conformance.targets.contract import EngineLaunch, FrontendLaunch

    vllm_impl = interop.vllm_implementation()
    handshake, upstream_in, upstream_out = (ipc_address() for _ in range(3))
    outer: list[Record] = []
    middle: list[Record] = []
    inner: list[Record] = []
    taps: list[Tap] = []
    peers: list[Any] = []
    launcher = interop.HandshakeLauncher(handshake, upstream_in, upstream_out)
    tokens: dict[str, list[int]] = {}
    finished: dict[str, int] = {}
    try:
        upstream = launcher.address
        for records in (outer, middle, inner):
            tap = Tap(TapConfig(upstream_handshake=upstream), record=records.append).start()
            taps.append(tap)
            assert tap.handshake_address is not None
            upstream = tap.handshake_address
        vllm_impl.engine.prepare()
        # The engine first (vLLM forks it), then the client's threads, as the interop cells.
        peers.append(vllm_impl.engine.start_engine(EngineLaunch(upstream,
                                                                init_timeout=TIMEOUT)))
        client = vllm_impl.frontend.start_frontend(
            FrontendLaunch(handshake, upstream_in, upstream_out))
        peers.insert(0, client)
        launcher.serve(TIMEOUT)
        client.wait_ready(TIMEOUT)
        for request_id, prompt, count in (("a", [7, 8], 3), ("b", [9], 2)):
            request = minimal_request(request_id, prompt_token_ids=prompt)
            request["sampling_params"] = {**request["sampling_params"], "max_tokens": count}
            client.add_request(request, 0)
        while set(finished) != {"a", "b"}:
            for output in (neutral(client.next_outputs(TIMEOUT)) or {}).get("outputs") or []:
                tokens.setdefault(output["request_id"], []).extend(output["new_token_ids"])
                if output.get("finish_reason") is not None:
                    finished[output["request_id"]] = output["finish_reason"]
        tasks = neutral(client.call_utility("get_supported_tasks", [], 0, TIMEOUT))
    finally:
        for peer in peers:
            peer.stop(TIMEOUT)
        for tap in taps:
            tap.close()
        launcher.close()
        vllm_impl.close()
        for address in (handshake, upstream_in, upstream_out):
            remove_ipc_file(address)  # vLLM's client leaves its files (finding 021)
    assert all(tap.error is None for tap in taps), [tap.error for tap in taps]
    assert tokens == {"a": interop.standin_tokens([7, 8], 3),
                      "b": interop.standin_tokens([9], 2)}
    assert set(finished.values()) == {1}  # FinishReason.LENGTH
    assert list(tasks) == ["generate"]
    # Byte for byte: every channel in both directions, the same at the client's end, in the
    # tap under test and at the engine's end.
    for sender, channel in (("engine", "handshake"), ("frontend", "handshake"),
                            ("engine", "input"), ("frontend", "input"),
                            ("engine", "output")):
        at_client, in_tap, at_engine = (_stream(records, sender, channel)
                                        for records in (outer, middle, inner))
        assert at_client, (sender, channel)
        assert at_client == in_tap == at_engine, (sender, channel)
    # Nothing else was rewritten: the init's addresses are each tap's own.
    inits = [next(r.frames for r in records if (r.sender, r.channel) ==
                  ("frontend", "handshake")) for records in (outer, middle, inner)]
    assert len(set(inits)) == 3
    assert sum(len(records) for records in (outer, middle, inner)) == 3 * len(outer)
    # vLLM's engine and client broke no clause the tap knows.
    annotator = Annotator()
    annotations = [annotator.annotate(r) for r in middle]
    assert all(a.ok for a in annotations), [line(a) for a in annotations if not a.ok]
    kinds = [a.kind for a in annotations]
    assert kinds[:2] == ["hello", "init"] and "ready_response" in kinds and "ready" in kinds
    assert kinds.count("add") == 2 and "utility" in kinds and "utility_reply" in kinds
