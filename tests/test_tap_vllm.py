"""vLLM's real front-end client (AsyncMPClient) in front of the reference engine, through the
tap (engines given addresses directly, as vLLM's ``client_addresses``): the session completes,
every frame decodes with no clause broken, the frames vLLM wrote reach the engine unchanged,
and a recording of it replays against the reference engine without divergence."""

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
                    records.append) as tap:
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
