"""vLLM 0.33.0's real front-end client (``AsyncMPClient``), run without a model or a GPU.

Given ``client_addresses``, ``AsyncMPClient`` binds its input ROUTER and output PULL at those
addresses, skips the handshake channel (engines are "managed externally") and waits, inside its
constructor, for one ready-response frame per engine identity (ranks 0 .. data_parallel_size-1)
on the input ROUTER (``vllm/v1/engine/core_client.py:647-666``, ``:743-776``). Nothing in that
path loads a model: :func:`client_config` builds a ``VllmConfig`` for the CPU with a stand-in
``model_config`` carrying the two attributes the client reads (``max_model_len`` and
``multimodal_config``, ``core_client.py:708-712`` and ``:851-872``).

- :func:`client_config`, :func:`make_client`, :func:`ready_timeout`: the set-up shared by the
  interop tests (``tests/test_peers_vllm.py``) and the ``vllm`` conformance target.
- :class:`VllmFrontends`: the ``frontend`` surface of the ``vllm`` target
  (:mod:`enginewire.conformance.targets.contract`). Its front ends skip the handshake channel
  (``handshake = False``), so checks that need it are NOT APPLICABLE; each client runs on an
  asyncio event loop of its own, on a background thread, the way an API server runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

#: Seconds the client's constructor waits for each ready response (vLLM's default: 600).
READY_TIMEOUT_S = 15


def client_config(dp_size: int = 1, max_model_len: int = 2048) -> Any:
    """A ``VllmConfig`` for a client of ``dp_size`` engines, on the CPU, without a model.

    ``VllmConfig`` validates assignment, so the stand-in ``model_config`` is set with
    ``object.__setattr__``; the client reads ``max_model_len`` (lowered by ready responses)
    and ``multimodal_config`` (None: no tensor IPC queue) from it.
    """
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig

    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(data_parallel_size=dp_size),
    )
    object.__setattr__(config, "model_config",
                       SimpleNamespace(max_model_len=max_model_len, multimodal_config=None))
    return config


def make_client(config: Any, input_address: str, output_address: str) -> Any:
    """``AsyncMPClient(config, Executor, log_stats=False, client_addresses=...)``.

    Blocks until every engine identity sent its ready response, at most the module global
    ``vllm.v1.engine.core_client.VLLM_ENGINE_READY_TIMEOUT_S`` seconds per response (see
    :func:`ready_timeout`). Called inside a running event loop, the client starts its output
    task at once.
    """
    from vllm.v1.engine.core_client import AsyncMPClient
    from vllm.v1.executor import Executor

    return AsyncMPClient(
        config, Executor, False,
        client_addresses={"input_address": input_address, "output_address": output_address},
    )


@contextlib.contextmanager
def ready_timeout(seconds: int) -> Iterator[None]:
    """Set vLLM's ready-response wait (a module global read on every wait) for a while."""
    from vllm.v1.engine import core_client

    before = core_client.VLLM_ENGINE_READY_TIMEOUT_S
    core_client.VLLM_ENGINE_READY_TIMEOUT_S = seconds
    try:
        yield
    finally:
        core_client.VLLM_ENGINE_READY_TIMEOUT_S = before


class _LoopThread:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, func: Callable[[], Any]) -> Future[Any]:
        """Run the coroutine ``func()`` on the loop; returns its concurrent future."""
        return asyncio.run_coroutine_threadsafe(func(), self.loop)

    def call(self, func: Callable[[], Any], timeout: float) -> Any:
        """Run the coroutine ``func()`` on the loop and wait at most ``timeout`` s."""
        future = self.submit(func)
        try:
            return future.result(timeout)
        except TimeoutError:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                future.cancel()
            raise

    def close(self, timeout: float) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class VllmFrontendClient:
    """One ``AsyncMPClient`` behind the suite's ``FrontendClient`` contract.

    Requests for engine 0 go through the client's public coroutines (``add_request_async``,
    ``abort_requests_async``, ``call_utility_async``); requests for engine ``i > 0`` through
    ``_send_input(..., engine=identity_i)`` and ``_call_utility_async(..., engine=...)``, the
    calls vLLM's data-parallel clients make once they have picked an engine.
    ``EngineDeadError`` becomes ``ConnectionError``, as the contract asks.
    """

    def __init__(self, launch: Any, codec: Any) -> None:
        self.launch = launch
        self.codec = codec
        self.config = client_config(launch.engine_count)
        self._loop = _LoopThread("vllm front end")
        self._built = self._loop.submit(self._build)
        self._stopped = False

    async def _build(self) -> Any:
        # Inside the running loop, so the client starts its output task at once.
        return make_client(self.config, self.launch.input_address, self.launch.output_address)

    def _ready_client(self) -> Any:
        if not self._built.done():
            raise RuntimeError("the front end is not ready yet (call wait_ready)")
        return self._built.result()

    def _identity(self, engine_index: int) -> bytes:
        return engine_index.to_bytes(2, "little")

    def _call(self, func: Callable[[], Any], timeout: float) -> Any:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            return self._loop.call(func, timeout)
        except EngineDeadError as exc:
            raise ConnectionError(f"EngineDeadError: {exc}") from exc

    # -- contract ---------------------------------------------------------------------------

    def wait_ready(self, timeout: float) -> None:
        self._built.result(timeout)

    def add_request(self, request: dict[str, Any], engine_index: int = 0) -> None:
        from vllm.v1.engine import EngineCoreRequestType

        client = self._ready_client()
        value = self.codec._build("EngineCoreRequest", request)

        async def send() -> None:
            if engine_index == 0:
                await client.add_request_async(value)
                return
            value.client_index = client.client_index
            await client._send_input(EngineCoreRequestType.ADD, value,
                                     self._identity(engine_index))
            client._ensure_output_queue_task()

        self._call(send, 10.0)

    def abort(self, request_ids: list[str], engine_index: int = 0) -> None:
        from vllm.v1.engine import EngineCoreRequestType

        client = self._ready_client()

        async def send() -> None:
            if engine_index == 0:
                await client.abort_requests_async(list(request_ids))
            else:
                await client._send_input(EngineCoreRequestType.ABORT, list(request_ids),
                                         self._identity(engine_index))

        self._call(send, 10.0)

    def call_utility(self, method: str, args: list[Any], engine_index: int = 0,
                     timeout: float = 5.0) -> Any:
        client = self._ready_client()

        async def call() -> Any:
            reply = client._call_utility_async(method, *args,
                                               engine=self._identity(engine_index))
            return await asyncio.wait_for(reply, timeout)

        return self._call(call, timeout + 1.0)

    def next_outputs(self, timeout: float) -> Any:
        client = self._ready_client()

        async def get() -> Any:
            return await asyncio.wait_for(client.get_output_async(), timeout)

        return self._call(get, timeout + 1.0)

    def zmq_sockets(self) -> list[tuple[str, Any]]:
        client = self._ready_client()
        return [("input", client.input_socket), ("output", client.resources.output_socket)]

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the client down (on its loop), stop the loop, and terminate its context.

        vLLM's ``shutdown()`` closes the sockets but leaves their ipc files
        (transport.ipc-files-removed); the suite removes its temporary directory itself.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._built.done() and self._built.exception() is None:
            client = self._built.result()

            async def shutdown() -> None:
                client.shutdown()

            with contextlib.suppress(Exception):
                self._loop.call(shutdown, timeout)
            with contextlib.suppress(Exception):
                self._loop.call(_drain, timeout)
            self._loop.close(timeout)
            client.resources.ctx.destroy(linger=0)
        elif self._built.done():
            # The constructor failed and closed its sockets itself.
            self._loop.close(timeout)
        else:
            # Still waiting for ready responses: the constructor gives up after the ready
            # timeout (READY_TIMEOUT_S) and closes its sockets itself; the loop stops then.
            self._built.cancel()
            self._loop.loop.call_soon_threadsafe(self._loop.loop.stop)

    def alive(self) -> bool:
        return not self._stopped and self._loop.thread.is_alive()


async def _drain() -> None:
    """Cancel what still runs on the loop (calls that wait for replies, the tasks
    ``shutdown()`` cancelled) and let it finish, so the loop closes with nothing pending."""
    await asyncio.sleep(0)
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1.0)


class VllmFrontends:
    """The ``frontend`` surface of the ``vllm`` target: one ``AsyncMPClient`` per launch.

    ``handshake = False``: vLLM's client with ``client_addresses`` has no handshake channel
    (``launch.handshake_address`` is ignored); the suite's engines connect to the input and
    output addresses directly and send their ready responses.
    """

    handshake = False

    def __init__(self, codec: Any) -> None:
        from vllm.v1.engine import core_client

        self.codec = codec
        self._ready_before = core_client.VLLM_ENGINE_READY_TIMEOUT_S
        core_client.VLLM_ENGINE_READY_TIMEOUT_S = READY_TIMEOUT_S

    def start_frontend(self, launch: Any) -> VllmFrontendClient:
        return VllmFrontendClient(launch, self.codec)

    def zmq_sockets(self, client: VllmFrontendClient) -> list[tuple[str, Any]]:
        return client.zmq_sockets()

    def close(self) -> None:
        from vllm.v1.engine import core_client

        core_client.VLLM_ENGINE_READY_TIMEOUT_S = self._ready_before
