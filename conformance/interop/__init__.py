"""``enginewire interop``: every implementation against every other, one scripted exchange each.

As the QUIC interop runner pairs every client with every server, this pairs, for each
implementation (a conformance target: ``reference``, ``vllm``, ...):

- every **front end** with every **engine core**, over ``ipc`` and over ``tcp``. One cell runs
  the exchange ``handshake`` (``ready-response`` for a front end without a handshake channel),
  ``add`` (a request that must finish with ``finish_reason`` length and exactly the engine's
  expected tokens), ``abort`` (a second, long request aborted after its first token: it must
  finish with abort or stop streaming, never run to length), ``utility`` (the call
  ``get_supported_tasks``, which must answer ``generate``) and ``shutdown`` (both ends stop, no
  process left running, no ipc socket file left).
- every **ring writer** with every implementation's **readers** (two of them): ``ready`` (the
  collective start), ``stream`` (:data:`RING_MESSAGES` messages, one larger than the chunk,
  so carried by the overflow socket, one with an out-of-band buffer), ``receive`` (every reader
  got every message, equal and in order) and ``close`` (segment and ipc files removed).
- vLLM's real **API server** (``vllm serve``, when ``vllm`` is paired) with every **engine
  core** behind it (:func:`run_api_server_cell`): vLLM's own engine core as ``vllm serve``
  launches it, and every other implementation's engine as a remote, headless engine doing the
  handshake with the server (the use case of an engine that sits behind vLLM's front end).
  The exchange: ``start`` (``GET /health``), ``completion`` (``POST /v1/completions`` with
  :data:`API_TOKENS` tokens: exactly the engine's expected tokens, finish ``length``) and
  ``shutdown``.

A front end without a handshake channel (surface attribute ``handshake = False``, vLLM's
``AsyncMPClient`` given ``client_addresses``) is paired as vLLM deploys it: a launcher (here
:class:`HandshakeLauncher`, the reference's handshake) answers the engine's HELLO with the
front end's input and output addresses, and the engine then sends its ready response to the
front end directly.

Each cell is **passed**, **failed** (with the first exchange that failed and why) or a
**deviation**: it failed only where a documented vLLM deviation says it must (the failing
exchange names the clause, the side responsible is vLLM's, and :data:`DEVIATIONS` links the
finding). Every wait is bounded; processes, ipc files and segments are cleaned up whether the
cell passes or not. Exit status of the command: 0 when every cell passed or is a documented
deviation, 1 otherwise, 2 for a usage error.

The package is split by cell kind: :mod:`.common` (constants, results, step runner,
addresses, handshake launcher, implementations), :mod:`.engine_cells` (engine cells and the
session helpers), :mod:`.api_server_cells`, :mod:`.dp_cells` (data-parallel and topology
cells), :mod:`.ring_cells` and :mod:`.driver` (the matrix, its reports and the command). Every
public name is importable from here; ``_Script`` too, for the topology cells of layers above
(``enginewire.tap.vllm_dp``).

This package may import ``enginewire.spec``, ``enginewire.reference``, the rest of
``enginewire.conformance`` and ``enginewire.cliargs`` (its command's argument types); never
fuzz, bench or tap: those add cells of whole topologies through
:func:`register_topology_cell`.
"""

from __future__ import annotations

from .api_server_cells import (
    API_PROMPT,
    API_READY_TIMEOUT,
    API_TOKENS,
    check_completion,
    run_api_server_cell,
)
from .common import (
    ABORT_QUIET_S,
    ABORT_TOKENS,
    ADD_PROMPT,
    ADD_TOKENS,
    DEVIATIONS,
    FINISH_ABORT,
    FINISH_LENGTH,
    IMPLEMENTATIONS,
    OUT_OF_BAND_INDEX,
    OVERFLOW_INDEX,
    PEERS,
    REFERENCE_STEP_DELAY,
    RING_CHUNK,
    RING_CHUNKS,
    RING_MESSAGES,
    RING_READERS,
    STEP_TIMEOUT,
    TRANSPORTS,
    Cell,
    Deviation,
    Exchange,
    ExchangeFailure,
    HandshakeLauncher,
    Implementation,
    classify,
    free_tcp_address,
    reference_implementation,
    reference_tokens,
    standin_tokens,
    vllm_implementation,
)
from .common import _Script as _Script  # the topology cells of enginewire.tap.vllm_dp
from .dp_cells import (
    DP_SIZE,
    register_topology_cell,
    run_dp_cell,
    topology_cells,
)
from .driver import (
    Matrix,
    implementations,
    main,
    register,
    render_html,
    render_table,
    run_matrix,
)
from .engine_cells import (
    run_engine_cell,
)
from .ring_cells import (
    ring_message,
    run_ring_cell,
)

__all__ = [
    "ABORT_QUIET_S",
    "ABORT_TOKENS",
    "ADD_PROMPT",
    "ADD_TOKENS",
    "API_PROMPT",
    "API_READY_TIMEOUT",
    "API_TOKENS",
    "Cell",
    "DEVIATIONS",
    "DP_SIZE",
    "Deviation",
    "Exchange",
    "ExchangeFailure",
    "FINISH_ABORT",
    "FINISH_LENGTH",
    "HandshakeLauncher",
    "IMPLEMENTATIONS",
    "Implementation",
    "Matrix",
    "OUT_OF_BAND_INDEX",
    "OVERFLOW_INDEX",
    "PEERS",
    "REFERENCE_STEP_DELAY",
    "RING_CHUNK",
    "RING_CHUNKS",
    "RING_MESSAGES",
    "RING_READERS",
    "STEP_TIMEOUT",
    "TRANSPORTS",
    "check_completion",
    "classify",
    "free_tcp_address",
    "implementations",
    "main",
    "reference_implementation",
    "reference_tokens",
    "register",
    "register_topology_cell",
    "render_html",
    "render_table",
    "ring_message",
    "run_api_server_cell",
    "run_dp_cell",
    "run_engine_cell",
    "run_matrix",
    "run_ring_cell",
    "standin_tokens",
    "topology_cells",
    "vllm_implementation",
]
