"""The engine-core channels of one wheel, read by ``ast``: socket types, binds, identity, readiness.

:func:`transport` returns, for the input and the output channel, the socket type of each end,
which end binds and (input) whether the engine's socket carries a routing identity; how many
input/output socket pairs an engine opens; and how the engine says it is ready.

How each fact is found, in every release from 0.7.3 on:

- a channel end is the ``make_zmq_socket(ctx, address, type, ...)`` or
  ``zmq_socket_ctx(address, type, ...)`` call in ``vllm/v1/engine/core.py`` (the engine) or
  ``vllm/v1/engine/core_client.py`` (the front end) whose address argument names ``input`` or
  ``output`` (``coord``-addresses belong to the DP coordinator's channels and are left out);
  its socket type is the last name of the type argument (``zmq.constants.PULL`` -> ``PULL``);
- an end binds where its call says ``bind=True``/``bind=False``; without the keyword the
  release's ``make_zmq_socket`` decides: ``bind = socket_type != zmq.PUSH`` (or ``not in
  (...)``) where it has that default, else the ``if socket_type == zmq.X: ... connect/bind``
  chain of the releases before 0.8.4;
- ``identity``: the engine's input call passes ``identity=``;
- ``clients``: ``per-client`` where the engine's input call sits in a loop or comprehension
  (one socket per front-end client), else ``one``;
- ``readiness``: ``handshake`` (the READY map of the handshake, on a handshake socket),
  ``handshake-on-input`` (the handshake ran on the input socket: 0.9.0), ``input-literal``
  (the bytes ``b"READY"`` on the input socket), ``pipe`` (``<pipe>.send({"status": "READY"})``
  to the parent process: no wire form) or ``none``. The handshake facts come from
  :mod:`.protocol_facts` and are passed in.

An end the wheel does not show is left out of the result (an empty dict for a wheel without
any); :func:`~enginewire.spec.history.derive.write_history` writes what is found.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from .extract import WheelSource

ENGINE_FILE = "vllm/v1/engine/core.py"
FRONTEND_FILE = "vllm/v1/engine/core_client.py"
#: Modules that define ``make_zmq_socket``, over all releases.
SOCKET_MODULES = ("vllm.utils.network_utils", "vllm.utils")
SOCKET_TYPES = ("PUSH", "PULL", "ROUTER", "DEALER", "PAIR", "PUB", "SUB", "XPUB", "XSUB")
CHANNELS = ("input", "output")


def _last(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _names(node: ast.expr) -> list[str]:
    """The socket type names of ``zmq.PUSH`` or ``(zmq.PUSH, zmq.SUB)``."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [_last(item) for item in items]


def _bind_rule(source: WheelSource) -> Callable[[str], bool] | None:
    """Whether ``make_zmq_socket`` binds a socket of a type when the call does not say."""
    for module in SOCKET_MODULES:
        filename = source.module_file(module)
        if filename is None or "def make_zmq_socket" not in source.text(filename):
            continue
        function = next(node for node in ast.walk(source.tree(filename))
                        if isinstance(node, ast.FunctionDef) and node.name == "make_zmq_socket")
        for node in ast.walk(function):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and _last(node.targets[0]) == "bind" and isinstance(node.value, ast.Compare)
                    and len(node.value.ops) == 1):
                names = _names(node.value.comparators[0])
                op = node.value.ops[0]
                if isinstance(op, ast.NotEq | ast.NotIn):
                    return lambda kind, names=names: kind not in names  # type: ignore[misc]
                if isinstance(op, ast.Eq | ast.In):
                    return lambda kind, names=names: kind in names  # type: ignore[misc]
        chain: dict[str, bool] = {}
        for node in ast.walk(function):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)):
                kind = _last(node.test.comparators[0])
                body = ast.unparse(ast.Module(body=node.body, type_ignores=[]))
                if ".bind(" in body:
                    chain[kind] = True
                elif ".connect(" in body:
                    chain[kind] = False
        if chain:
            return lambda kind: chain[kind]
    return None


def _socket_calls(source: WheelSource, filename: str) -> dict[str, tuple[ast.Call, bool]]:
    """channel -> (the first socket call whose address names it, whether it sits in a loop)."""
    if filename not in source.files_in(filename.rsplit("/", 1)[0]):
        return {}
    found: dict[str, tuple[ast.Call, bool]] = {}
    looped: set[int] = set()
    for node in ast.walk(source.tree(filename)):
        if isinstance(node, ast.For | ast.ListComp | ast.GeneratorExp | ast.SetComp):
            looped.update(id(inner) for inner in ast.walk(node))
    for node in ast.walk(source.tree(filename)):
        if not (isinstance(node, ast.Call) and _last(node.func) in ("make_zmq_socket",
                                                                    "zmq_socket_ctx")):
            continue
        offset = 1 if _last(node.func) == "make_zmq_socket" else 0
        if len(node.args) < offset + 2:
            continue
        address = ast.unparse(node.args[offset]).lower()
        if "coord" in address or _last(node.args[offset + 1]) not in SOCKET_TYPES:
            continue
        for channel in CHANNELS:
            if channel in address and channel not in found:
                found[channel] = (node, id(node) in looped)
    return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _binds(call: ast.Call, rule: Callable[[str], bool] | None) -> bool | None:
    given = _keyword(call, "bind")
    if isinstance(given, ast.Constant) and isinstance(given.value, bool):
        return given.value
    kind = _last(call.args[2 if _last(call.func) == "make_zmq_socket" else 1])
    try:
        return rule(kind) if rule is not None else None
    except KeyError:
        return None


def _sends_ready_over_pipe(source: WheelSource) -> bool:
    text = source.text(ENGINE_FILE) if ENGINE_FILE in source.files_in("vllm/v1/engine") else ""
    if "pipe" not in text:
        return False
    for node in ast.walk(source.tree(ENGINE_FILE)):
        if (isinstance(node, ast.Call) and _last(node.func) == "send" and node.args
                and "pipe" in ast.unparse(node.func).lower()
                and isinstance(node.args[0], ast.Dict)
                and any(isinstance(v, ast.Constant) and v.value == "READY"
                        for v in node.args[0].values)):
            return True
    return False


def readiness(source: WheelSource, has_handshake: bool, ready_response: str) -> str:
    """``handshake``, ``handshake-on-input``, ``input-literal``, ``pipe`` or ``none`` (module
    docstring); ``has_handshake`` and ``ready_response`` as :mod:`.protocol_facts` found them."""
    if has_handshake:
        return "handshake-on-input" if ready_response == "handshake" else "handshake"
    if ready_response == "READY":
        return "input-literal"
    return "pipe" if _sends_ready_over_pipe(source) else "none"


def transport(source: WheelSource, has_handshake: bool,
              ready_response: str) -> dict[str, object]:
    """``{"input": {"frontend", "engine", "binds", "identity"}, "output": {"frontend",
    "engine", "binds"}, "clients", "readiness"}`` (see the module docstring)."""
    rule = _bind_rule(source)
    engine = _socket_calls(source, ENGINE_FILE)
    frontend = _socket_calls(source, FRONTEND_FILE)
    out: dict[str, object] = {}
    for channel in CHANNELS:
        if channel not in engine or channel not in frontend:
            continue
        (ecall, _), (fcall, _) = engine[channel], frontend[channel]
        ebinds, fbinds = _binds(ecall, rule), _binds(fcall, rule)
        entry: dict[str, object] = {
            "frontend": _last(fcall.args[2 if _last(fcall.func) == "make_zmq_socket" else 1]),
            "engine": _last(ecall.args[2 if _last(ecall.func) == "make_zmq_socket" else 1]),
            "binds": ("frontend" if fbinds and ebinds is False
                      else "engine" if ebinds and fbinds is False else "unknown"),
        }
        if channel == "input":
            entry["identity"] = _keyword(ecall, "identity") is not None
        out[channel] = entry
    if "input" in engine:
        out["clients"] = "per-client" if engine["input"][1] else "one"
    out["readiness"] = readiness(source, has_handshake, ready_response)
    return out
