"""Handshake keys, the ready response and the ring's chunk framing of one wheel, read by ``ast``.

- :func:`handshake_keys`: the msgpack maps an engine sends on the handshake channel, found as
  dict literals with a ``"status"`` key of value ``"HELLO"`` or ``"READY"`` in ``vllm/v1``'s
  engine modules, in functions that msgpack-encode (a map sent over a multiprocessing pipe is
  not on the wire); a key in the literal is ``required``, a key the same function adds later
  (``msg["key"] = ...``, in vLLM always under a condition) is ``optional``.
- :func:`ready_response`: what the engine sends on its input DEALER to say it is ready:
  ``struct`` (a msgpack ``EngineCoreReadyResponse``), ``empty`` (an empty frame,
  ``send(b"")``), ``READY`` (the literal bytes ``b"READY"``), ``handshake`` (the handshake's
  msgpack READY map itself: 0.9.0 ran the HELLO / init / READY handshake on the input socket,
  ``input_socket.send(msgspec.msgpack.encode({"status": "READY", ...}))``) or ``none``.
- :func:`init_message`: how the engine reads the front end's init message in its
  ``startup_handshake``: ``{"form": "struct", "struct": "EngineHandshakeMetadata"}`` (decoded
  with ``type=EngineHandshakeMetadata``, 0.9.1 on) or ``{"form": "map", "keys": [...]}`` (a
  plain msgpack map read with ``init_message["key"]``: 0.9.0's output_socket_address and
  parallel_config); ``{}`` where the wheel has no ``startup_handshake``.
- :func:`utility_payload`: the items of the UTILITY request's payload in order, as the
  engine's branch for ``EngineCoreRequestType.UTILITY`` unpacks ``request``: ``["call_id",
  "method", "args"]`` before the front end sent its client index (0.9.0 and earlier), then
  ``["client_index", "call_id", "method", "args"]`` (vLLM's names ``client_idx`` and
  ``method_name`` read as these).
- :func:`chunk_framing`: how ``MessageQueue.enqueue`` lays a message into a ring chunk after
  the overflow byte: ``buffers`` (a big-endian buffer count, then each buffer after a
  big-endian length; the widths are the literal byte counts of its ``to_bytes_big`` calls) or
  ``pickle`` (one pickle stream, which carries its own length).
- :func:`tensor_form`: how ``vllm/v1/serial_utils.py``'s encoder hook writes a torch tensor
  and a numpy array, read from the branch under ``isinstance(obj, torch.Tensor)`` /
  ``isinstance(obj, np.ndarray)``: ``pickle`` (an extension type wrapping a pickle stream:
  ``msgpack.Ext(CUSTOM_TYPE_TENSOR, pickle.dumps(obj.numpy()))`` for a tensor, the generic
  pickle fallback for an array the hook has no branch for), ``numpy`` (the ``[dtype, shape,
  data]`` tuple of ``obj.numpy()``, so numpy's ``dtype.str``) or ``tuple`` (the tuple with the
  torch dtype name, ``_encode_tensor``); and the inline threshold where it is a module
  constant instead of an environment variable (``obj.nbytes < MIN_NOCOPY_BUF_SIZE``).
- :func:`pickle_opt_in`: the setting a side must turn on before ``vllm/v1/serial_utils.py``
  unpickles or pickles: the ``envs.NAME`` whose truth guards the decoder's ``pickle.loads``
  (``if envs.NAME: ... pickle.loads(data)``) and the ``envs.NAME`` whose falsity makes the
  encoder refuse before its pickle fallback (``if not envs.NAME: raise ...``), each declared
  in ``vllm/envs.py``; ``{}`` where neither is guarded (vLLM 0.7.3-0.8.5 pickle and unpickle
  without asking: VLLM_ALLOW_INSECURE_SERIALIZATION came in 0.9.0).

- :func:`engine_core_dead`: the sentinel an engine sends on its output socket as its last
  message when it dies: the bytes of the class constant ``ENGINE_CORE_DEAD``
  (``b"ENGINE_CORE_DEAD"``, ``EngineCoreProc`` in ``vllm/v1/engine/core.py``: 0.8.5 on);
  ``{}`` where the wheel has none (0.7.3-0.8.4: an engine dies without a word on the wire).
- :func:`dp_coordinator`: the DP coordinator, the process that owns the coordinator_input,
  coordinator_output and stats_publish channels: the class ``DPCoordinator`` of
  ``vllm/v1/engine/coordinator.py`` (0.9.1 on); ``{}`` where the wheel has no such module.

Each returns plain data for ``history/constants.toml``; an empty result means the wheel has no
such code (the history then records ``none``).
"""

from __future__ import annotations

import ast
from typing import Any

from .extract import WheelSource

#: Folders whose modules hold the engine side of the handshake, over all releases.
HANDSHAKE_FOLDERS = ("vllm/v1/engine", "vllm/v1")
SHM_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
SERIAL_MODULE = "vllm.v1.serial_utils"
ENVS_MODULE = "vllm.envs"
STATUSES = ("HELLO", "READY")
COORDINATOR_MODULE = "vllm.v1.engine.coordinator"
COORDINATOR_CLASS = "DPCoordinator"
SENTINEL_NAME = "ENGINE_CORE_DEAD"


def _files(source: WheelSource) -> list[str]:
    return [name for folder in HANDSHAKE_FOLDERS for name in source.files_in(folder)]


def _status_of(node: ast.Dict) -> str | None:
    for key, value in zip(node.keys, node.values, strict=True):
        if (isinstance(key, ast.Constant) and key.value == "status"
                and isinstance(value, ast.Constant) and value.value in STATUSES):
            return str(value.value)
    return None


def _literal_keys(node: ast.Dict) -> list[str]:
    return [str(k.value) for k in node.keys if isinstance(k, ast.Constant)]


def handshake_keys(source: WheelSource) -> dict[str, dict[str, list[str]]]:
    """``{"HELLO": {"required": [...], "optional": [...]}, "READY": {...}}`` (keys sorted)."""
    found: dict[str, dict[str, set[str]]] = {}
    for filename in _files(source):
        if "status" not in source.text(filename):
            continue
        for function in ast.walk(source.tree(filename)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if "msgpack.encode" not in ast.unparse(function):
                continue
            bound: dict[str, str] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Dict):
                    status = _status_of(node)
                    if status is not None:
                        entry = found.setdefault(status, {"required": set(), "optional": set()})
                        entry["required"].update(_literal_keys(node))
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                        and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                    status = _status_of(node.value)
                    if status is not None:
                        bound[node.targets[0].id] = status
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                            and target.value.id in bound
                            and isinstance(target.slice, ast.Constant)):
                        status = bound[target.value.id]
                        found[status]["optional"].add(str(target.slice.value))
    out = {}
    for status in STATUSES:
        if status in found:
            entry = found[status]
            out[status] = {"required": sorted(entry["required"]),
                           "optional": sorted(entry["optional"] - entry["required"])}
    return out


def _encodes_ready_map(node: ast.expr) -> bool:
    """``node`` is ``<...>msgpack.encode({"status": "READY", ...})``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "encode" and "msgpack" in ast.unparse(node.func.value)
            and len(node.args) == 1 and isinstance(node.args[0], ast.Dict)
            and _status_of(node.args[0]) == "READY")


def ready_response(source: WheelSource) -> str:
    """``struct``, ``empty``, ``READY``, ``handshake`` or ``none`` (see the module docstring);
    the first of these the wheel has, in that order."""
    found: set[str] = set()
    for filename in _files(source):
        text = source.text(filename)
        if "EngineCoreReadyResponse(" in text:
            return "struct"
        if "send(" not in text:
            continue
        for node in ast.walk(source.tree(filename)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "send" and node.args):
                continue
            receiver = ast.unparse(node.func.value)
            sent = node.args[0]
            if isinstance(sent, ast.Constant):
                if sent.value == b"" and ("input" in receiver
                                          or filename.endswith("engine/core.py")):
                    found.add("empty")
                elif sent.value == b"READY" and receiver == "socket" \
                        and filename.endswith("engine/core.py"):
                    found.add("READY")
            elif "input" in receiver and _encodes_ready_map(sent):
                # The READY map on the input socket (the handshake socket of later releases
                # is another socket, whose maps are no ready response).
                found.add("handshake")
    return next((kind for kind in ("empty", "READY", "handshake") if kind in found), "none")


def init_message(source: WheelSource) -> dict[str, Any]:
    """``{"form": "struct", "struct": name}``, ``{"form": "map", "keys": [...]}`` (sorted)
    or ``{}`` (see the module docstring)."""
    for filename in _files(source):
        if "startup_handshake" not in source.text(filename):
            continue
        for function in ast.walk(source.tree(filename)):
            if not (isinstance(function, ast.FunctionDef)
                    and function.name == "startup_handshake"):
                continue
            decoded: set[str] = set()
            # The decode bound to ``init_message`` (the name in every release; 0.33.0 also
            # decodes an elastic-EP scale-up message in the same function, bound otherwise).
            for node in ast.walk(function):
                if not (isinstance(node, ast.Assign | ast.AnnAssign)
                        and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Attribute)
                        and node.value.func.attr == "decode"
                        and "msgpack" in ast.unparse(node.value.func.value)):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                if "init_message" not in names:
                    continue
                typed = next((k.value for k in node.value.keywords if k.arg == "type"), None)
                if typed is not None:
                    return {"form": "struct", "struct": ast.unparse(typed).rsplit(".", 1)[-1]}
                decoded.update(names)
            keys = {str(node.slice.value) for node in ast.walk(function)
                    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id in decoded and isinstance(node.slice, ast.Constant)}
            if keys:
                return {"form": "map", "keys": sorted(keys)}
    return {}


#: vLLM's names of the UTILITY payload's items -> the spec's.
UTILITY_ITEM_NAMES = {"client_idx": "client_index", "method_name": "method"}


def utility_payload(source: WheelSource) -> list[str]:
    """The UTILITY payload's items (see the module docstring); ``[]`` where the wheel
    unpacks none."""
    for filename in _files(source):
        if "EngineCoreRequestType.UTILITY" not in source.text(filename):
            continue
        for branch in ast.walk(source.tree(filename)):
            if not (isinstance(branch, ast.If)
                    and ast.unparse(branch.test).endswith("EngineCoreRequestType.UTILITY")):
                continue
            for statement in branch.body:
                if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                        and isinstance(statement.targets[0], ast.Tuple)
                        and isinstance(statement.value, ast.Name)):
                    continue
                names = [e.id for e in statement.targets[0].elts if isinstance(e, ast.Name)]
                if "call_id" in names:
                    return [UTILITY_ITEM_NAMES.get(name, name) for name in names]
    return []


def chunk_framing(source: WheelSource) -> dict[str, int | str]:
    """``{"framing": "buffers", "count_bytes": 2, "length_bytes": 4}``, ``{"framing":
    "pickle"}``, or ``{}`` when the wheel has no ``MessageQueue.enqueue``."""
    queue = source.find_class("MessageQueue", [SHM_MODULE])
    if queue is None:
        return {}
    enqueue = next((item for item in queue[1].body
                    if isinstance(item, ast.FunctionDef) and item.name == "enqueue"), None)
    if enqueue is None:
        return {}
    count = length = None
    for node in ast.walk(enqueue):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "to_bytes_big" and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, int)):
            width = node.args[1].value
            if "len(" in ast.unparse(node.args[0]):
                count = width
            else:
                length = width
    if count is not None and length is not None:
        return {"framing": "buffers", "count_bytes": count, "length_bytes": length}
    if "pickle.dumps" in ast.unparse(enqueue):
        return {"framing": "pickle"}
    return {}



def _isinstance_of(test: ast.expr, suffix: str) -> bool:
    """``test`` is (or starts with) ``isinstance(<name>, <...>.suffix)``."""
    if isinstance(test, ast.BoolOp):
        return any(_isinstance_of(value, suffix) for value in test.values)
    return (isinstance(test, ast.Call) and isinstance(test.func, ast.Name)
            and test.func.id == "isinstance" and len(test.args) == 2
            and ast.unparse(test.args[1]).endswith(suffix))


def _branch_form(body: list[ast.stmt]) -> str | None:
    """The form a hook branch returns: ``pickle`` (an ``Ext`` of a pickle stream), ``numpy``
    (``_encode_ndarray(obj.numpy())``) or ``tuple`` (``_encode_tensor`` / ``_encode_ndarray``
    of the value itself); None where the branch returns none of these."""
    for node in body:
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        text = ast.unparse(node.value)
        if "Ext(" in text and "pickle" in text:
            return "pickle"
        if "_encode_ndarray" in text and ".numpy()" in text:
            return "numpy"
        if "_encode_tensor" in text or "_encode_ndarray" in text:
            return "tuple"
    return None


def tensor_form(source: WheelSource) -> dict[str, int | str]:
    """``{"tensor": form, "ndarray": form}`` with ``fixed_threshold`` where the inline
    threshold is a module constant (see the module docstring); {} without a serial module."""
    filename = source.module_file(SERIAL_MODULE)
    if filename is None:
        return {}
    found: dict[str, int | str] = {}
    for node in ast.walk(source.tree(filename)):
        if isinstance(node, ast.If):
            for family, suffix in (("tensor", "torch.Tensor"), ("ndarray", "np.ndarray")):
                if family not in found and _isinstance_of(node.test, suffix):
                    form = _branch_form(node.body)
                    if form is not None:
                        found[family] = form
        if (isinstance(node, ast.Compare) and len(node.ops) == 1
                and isinstance(node.ops[0], ast.Lt) and ast.unparse(node.left).endswith(".nbytes")
                and isinstance(node.comparators[0], ast.Name)):
            value = source.module_constant(SERIAL_MODULE, node.comparators[0].id)
            if isinstance(value, int):
                found["fixed_threshold"] = value
    if "tensor" in found:
        # An array the hook has no branch for falls through to the pickle fallback.
        found.setdefault("ndarray", "pickle")
    return dict(sorted(found.items()))



def _env_setting(test: ast.expr) -> tuple[str, bool] | None:
    """``(NAME, True)`` for the test ``envs.NAME``, ``(NAME, False)`` for ``not envs.NAME``;
    None for any other test."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if (isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name)
            and inner.value.id == "envs"):
        return inner.attr, not negated
    return None


def _calls(nodes: list[ast.stmt], dotted: str) -> bool:
    """Whether ``nodes`` call ``dotted`` (``pickle.loads``) anywhere."""
    return any(isinstance(node, ast.Call) and ast.unparse(node.func) == dotted
               for statement in nodes for node in ast.walk(statement))


def _declared_settings(source: WheelSource) -> set[str]:
    """The string constants of ``vllm/envs.py`` (its settings' names are among them)."""
    filename = source.module_file(ENVS_MODULE)
    if filename is None:
        return set()
    return {node.value for node in ast.walk(source.tree(filename))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def pickle_opt_in(source: WheelSource) -> dict[str, Any]:
    """``{"setting": NAME, "guards": ["decoder", "encoder"]}`` (the sides the wheel guards
    with it) or ``{}`` (see the module docstring)."""
    filename = source.module_file(SERIAL_MODULE)
    if filename is None:
        return {}
    declared = _declared_settings(source)
    guards: dict[str, set[str]] = {}
    for function in ast.walk(source.tree(filename)):
        if not isinstance(function, ast.FunctionDef):
            continue
        pickles = _calls(function.body, "pickle.dumps")
        for node in ast.walk(function):
            setting = _env_setting(node.test) if isinstance(node, ast.If) else None
            if setting is None or setting[0] not in declared:
                continue
            name, required = setting
            assert isinstance(node, ast.If)
            if required and _calls(node.body, "pickle.loads"):
                guards.setdefault(name, set()).add("decoder")
            elif not required and pickles and any(isinstance(s, ast.Raise) for s in node.body):
                # ``if not envs.NAME: raise ...`` in the function that falls back to pickle.
                guards.setdefault(name, set()).add("encoder")
    if not guards:
        return {}
    name = max(sorted(guards), key=lambda n: len(guards[n]))
    return {"setting": name, "guards": sorted(guards[name])}


def engine_core_dead(source: WheelSource) -> dict[str, Any]:
    """``{"literal": "ENGINE_CORE_DEAD"}`` (the sentinel's bytes, as ASCII) or ``{}`` (see the
    module docstring): a bytes constant bound to the name ``ENGINE_CORE_DEAD`` in vLLM's
    engine modules (the class attribute ``EngineCoreProc.ENGINE_CORE_DEAD``)."""
    for filename in _files(source):
        if SENTINEL_NAME not in source.text(filename):
            continue
        for node in ast.walk(source.tree(filename)):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, bytes)):
                continue
            if any(isinstance(t, ast.Name) and t.id == SENTINEL_NAME for t in node.targets):
                return {"literal": node.value.value.decode("ascii")}
    return {}


def dp_coordinator(source: WheelSource) -> dict[str, Any]:
    """``{"class": "DPCoordinator"}`` or ``{}`` (see the module docstring)."""
    filename = source.module_file(COORDINATOR_MODULE)
    if filename is None:
        return {}
    for node in source.tree(filename).body:
        if isinstance(node, ast.ClassDef) and node.name == COORDINATOR_CLASS:
            return {"class": node.name}
    return {}
