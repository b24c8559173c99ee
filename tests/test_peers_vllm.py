"""vLLM's real front-end client (AsyncMPClient) against reference engines, without a model.

With ``client_addresses`` the client binds its input ROUTER and output PULL there and skips
the handshake channel entirely: it only waits for one ready-response frame per engine identity
(ranks 0..data_parallel_size-1) on the input ROUTER. So the reference engines are started with
the input/output addresses directly (no HELLO/init/READY). Nothing here needs a GPU or a model;
the client set-up is :mod:`enginewire.conformance.targets.vllm.frontend_client`'s, shared with the
``vllm`` conformance target.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from enginewire.conformance.targets.vllm.frontend_client import (
    client_config,
    make_client,
    ready_timeout,
)
from enginewire.reference import codec, structs
from enginewire.reference.addresses import ipc_address, ipc_path, remove_ipc_file
from enginewire.reference.engine import (
    EXIT_CLEAN,
    EXIT_DIED,
    EngineOptions,
    EngineProcess,
    scripted_tokens,
    spawn_engine,
)

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

TIMEOUT = 20.0


def vllm_request(request_id: str, prompt: list[int], max_tokens: int | None) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(
        request_id=request_id, prompt_token_ids=prompt, mm_features=None,
        sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
        arrival_time=time.time(), lora_request=None, cache_salt=None, data_parallel_rank=None,
    )


class Setup:
    """A vLLM client config, the client's two ipc addresses and the engines serving them."""

    def __init__(self, tmp_path: Path, dp_size: int, **engine_options: Any) -> None:
        self.config = client_config(dp_size, max_model_len=2048)
        self.input_address, self.output_address = ipc_address(), ipc_address()
        self.engines: list[EngineProcess] = []
        self.logs = []
        for rank in range(dp_size):
            log = open(tmp_path / f"engine-{rank}.log", "wb")
            self.logs.append(log)
            self.engines.append(spawn_engine(EngineOptions(
                input_addresses=[self.input_address], output_addresses=[self.output_address],
                rank=rank, dp_size=dp_size, **engine_options,
            ), stderr=log))

    def client(self) -> Any:
        return make_client(self.config, self.input_address, self.output_address)

    def close(self) -> list[str]:
        """Stop the engines and remove the ipc files the client left; returns those files."""
        for engine in self.engines:
            engine.stop(timeout=10)
        for log in self.logs:
            log.close()
        left = [a for a in (self.input_address, self.output_address)
                if os.path.exists(ipc_path(a))]
        for address in (self.input_address, self.output_address):
            remove_ipc_file(address)
        return left


@pytest.fixture
def setups(tmp_path) -> Iterator[Any]:
    made: list[Setup] = []

    def make(dp_size: int = 1, **engine_options: Any) -> Setup:
        setup = Setup(tmp_path, dp_size, **engine_options)
        made.append(setup)
        return setup

    # The client reads this module global for each ready-response wait (default 600 s).
    with ready_timeout(int(TIMEOUT)):
        yield make
    for setup in made:
        setup.close()


async def collect(client: Any, request_ids: set[str]) -> dict[str, tuple[list[int], int]]:
    tokens: dict[str, list[int]] = {r: [] for r in request_ids}
    reasons: dict[str, int] = {}
    while set(reasons) != request_ids:
        outputs = await asyncio.wait_for(client.get_output_async(), TIMEOUT)
        for output in outputs.outputs:
            tokens[output.request_id] += output.new_token_ids
            if output.finish_reason is not None:
                reasons[output.request_id] = int(output.finish_reason)
    return {r: (tokens[r], reasons[r]) for r in request_ids}


def test_vllm_client_requests_utilities_abort_and_shutdown(setups) -> None:
    setup = setups(tokens=10_000, step_delay=0.02)

    async def scenario() -> None:
        client = setup.client()
        try:
            # The ready response was applied to the client's config.
            assert setup.config.model_config.max_model_len == 2048  # min(2048, 4096)
            assert setup.config.cache_config.num_gpu_blocks == 1024
            assert setup.config.cache_config.block_size == 16

            await client.add_request_async(vllm_request("a", [7, 8], 3))
            await client.add_request_async(vllm_request("b", [9], 1))
            results = await collect(client, {"a", "b"})
            assert results == {
                "a": (scripted_tokens([7, 8], 3), int(structs.FinishReason.LENGTH)),
                "b": (scripted_tokens([9], 1), int(structs.FinishReason.LENGTH)),
            }

            echo = client.call_utility_async("echo", 1, "two", [3])
            assert await asyncio.wait_for(echo, TIMEOUT) == [1, "two", [3]]
            with pytest.raises(Exception, match="Call to nope method failed"):
                await asyncio.wait_for(client.call_utility_async("nope"), TIMEOUT)

            await client.add_request_async(vllm_request("long", [1], None))
            first = await asyncio.wait_for(client.get_output_async(), TIMEOUT)
            assert first.outputs[0].request_id == "long"
            await client.abort_requests_async(["long"])
            while True:
                outputs = await asyncio.wait_for(client.get_output_async(), TIMEOUT)
                [output] = outputs.outputs
                if output.finish_reason is not None:
                    break
            assert int(output.finish_reason) == int(structs.FinishReason.ABORT)
            assert outputs.finished_requests == {"long"}
        finally:
            client.shutdown()

    asyncio.run(scenario())
    assert all(engine.stop() == EXIT_CLEAN for engine in setup.engines)
    left = setup.close()
    # vLLM deviation (transport.ipc-files-removed): shutdown() leaves both socket files.
    assert left == [setup.input_address, setup.output_address]


def test_vllm_client_with_two_engine_identities(setups) -> None:
    setup = setups(dp_size=2, tokens=2)

    async def scenario() -> None:
        client = setup.client()
        try:
            assert client.core_engines == [b"\x00\x00", b"\x01\x00"]
            assert setup.config.cache_config.num_gpu_blocks == 2048, "summed over engines"
            results = await asyncio.wait_for(
                client.call_utility_all_async("echo", "hi"), TIMEOUT
            )
            assert results == [["hi"], ["hi"]]
            for rank, identity in enumerate(client.core_engines):
                reply = client._call_utility_async("echo", rank, engine=identity)
                assert await asyncio.wait_for(reply, TIMEOUT) == [rank]
            await client.add_request_async(vllm_request("x", [4], None))
            assert await collect(client, {"x"}) == {
                "x": (scripted_tokens([4], 2), int(structs.FinishReason.STOP))
            }
        finally:
            client.shutdown()

    asyncio.run(scenario())


def test_vllm_client_engine_core_dead(setups) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    setup = setups()

    async def scenario() -> None:
        client = setup.client()
        try:
            pending = asyncio.ensure_future(client.call_utility_async("die"))
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(client.get_output_async(), TIMEOUT)
            with pytest.raises(EngineDeadError):
                await client.add_request_async(vllm_request("late", [1], 1))
            # vLLM deviation (frames.engine-core-dead-fatal): the call that was waiting when
            # ENGINE_CORE_DEAD came is never failed; it would wait forever.
            await asyncio.sleep(0.5)
            assert not pending.done()
            pending.cancel()
        finally:
            client.shutdown()

    asyncio.run(scenario())
    assert setup.engines[0].wait(TIMEOUT) == EXIT_DIED


def test_vllm_client_stray_utility_reply_ends_output_task(setups) -> None:
    setup = setups()

    async def scenario() -> None:
        client = setup.client()
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            push.connect(setup.output_address)
            stray = structs.EngineCoreOutputs(
                engine_index=0,
                utility_output=structs.UtilityOutput(
                    call_id=12345, result=structs.UtilityResult(None, 1)
                ),
            )
            push.send_multipart(codec.encode("utility_reply", stray))
            # vLLM deviation (handshake.session.reply-known-call-id): the reply for an unknown
            # call_id raises KeyError in the output task, which ends it.
            with pytest.raises(KeyError):
                await asyncio.wait_for(client.get_output_async(), TIMEOUT)
            push.close(linger=0)
        finally:
            ctx.destroy(linger=0)
            client.shutdown()

    asyncio.run(scenario())


def test_vllm_client_against_engine_signal(setups) -> None:
    """SIGUSR1 makes the reference engine die; vLLM's client sees EngineDeadError."""
    from vllm.v1.engine.exceptions import EngineDeadError

    setup = setups()

    async def scenario() -> None:
        client = setup.client()
        try:
            setup.engines[0].kill_with(signal.SIGUSR1)
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(client.get_output_async(), TIMEOUT)
        finally:
            client.shutdown()

    asyncio.run(scenario())
    assert setup.engines[0].wait(TIMEOUT) == EXIT_DIED
