"""Golden vectors: the target must write vLLM's bytes exactly and read them back.

Every file under ``conformance/data/golden/`` (see :mod:`enginewire.conformance.oracle.golden`)
becomes two checks:

- ``codec.golden.<name>.encode``: encoding the vector's value (with the vector's threshold)
  gives the vector's frames byte for byte;
- ``codec.golden.<name>.decode``: decoding the vector's frames gives the vector's value.

A vector written with a threshold other than the spec's default needs the target's
``codec.threshold`` capability for its encode check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from enginewire.conformance.checks._helpers import (
    as_bytes,
    expect_rejection,
    require_reference_version,
)
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.registry import CheckFailure, CheckSkip, Reproduction, check
from enginewire.conformance.oracle.golden import payload_type
from enginewire.conformance.oracle.values import TensorValue, complete, differences, neutral
from enginewire.conformance.targets.contract import CodecSurface

#: The clause a vector of each kind is first about (struct kinds: their layout clause).
KIND_CLAUSES = {
    "add": "frames.type-byte-before-payload",
    "abort": "frames.abort-payload",
    "utility": "frames.utility-payload",
    "start_dp_wave": "frames.start-dp-wave-payload",
    "outputs": "frames.outputs-payload",
    "utility_reply": "frames.utility-reply",
    "engine_core_dead": "frames.engine-core-dead-literal",
    "hello": "handshake.hello-first",
    "ready": "handshake.message-keys",
    "init": "handshake.init-answers-hello",
    "ready_response": "frames.ready-response-first",
}
STRUCT_CLAUSES = {
    "array": "structs.array.field-order",
    "tuple": "structs.tuple.array",
    "map": "structs.map.keyed-by-field-name",
    "dataclass": "structs.dataclass.all-fields",
}


def _has_tensor(value: Any) -> bool:
    if isinstance(value, TensorValue):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return False


def _clauses(spec: Any, kind: str, value: Any) -> list[str]:
    if kind in KIND_CLAUSES:
        clauses = [KIND_CLAUSES[kind]]
    else:
        item = spec.structs.get(kind)
        clauses = [STRUCT_CLAUSES.get(getattr(item, "encoding", ""), "frames.payload-matches-type")]
    if _has_tensor(neutral(value)):
        clauses.append("structs.tensor-fields")
    return clauses


def _configured(codec: Any, ctx: Any, threshold: int) -> Any:
    if threshold == ctx.spec.surface("tensors").threshold_default:
        return codec
    if not ctx.target.has("codec.threshold"):
        from enginewire.conformance.framework.registry import NotImplementedSurface

        raise NotImplementedSurface(
            f"this vector was written with threshold {threshold}: needs codec.threshold"
        )
    return codec.with_threshold(threshold)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.replace("_", "-").lower()).strip("-") or "x"


def _register(vector: Any, spec: Any, prefix: str = "codec/golden") -> list[str]:
    """Register the checks of one vector under ``prefix``; their IDs."""
    base = f"{prefix}/{_slug(vector.name)}"
    if vector.expect == "reject":
        clause = vector.clause or "frames.payload-matches-type"

        @check(f"{base}/reject", clauses=[clause], surface="codec",
               description=f"vector {vector.name} (vLLM {vector.vllm_version}): "
                           f"{vector.description} (must be rejected)")
        def _reject(codec: Any, ctx: Any) -> None:
            expect_rejection(codec, vector.kind, list(vector.frames), clause,
                             f"vector {vector.name}", vector=str(vector.path or vector.name))

        return [f"{base}/reject"]
    clauses = _clauses(spec, vector.kind, vector.value)
    registered = [f"{base}/decode"]
    if vector.vllm_version == spec.version:
        registered.insert(0, f"{base}/encode")
        _register_encode(vector, base, clauses)
    _register_decode(vector, base, clauses)
    return registered


def _register_encode(vector: Any, base: str, clauses: list[str]) -> None:
    @check(f"{base}/encode", clauses=clauses, surface="codec",
           description=f"golden {vector.name}: {vector.description} (encode, byte-exact)")
    def _encode(codec: CodecSurface, ctx: CheckContext) -> None:
        require_reference_version(ctx)
        configured = _configured(codec, ctx, vector.threshold)
        try:
            frames = as_bytes(configured.encode(vector.kind, vector.value))
        except Exception as exc:  # noqa: BLE001
            raise CheckFailure(
                f"encode({vector.kind!r}) raised {type(exc).__name__}: {exc}",
                Reproduction(received=f"{type(exc).__name__}: {exc}",
                             notes={"vector": vector.name}),
            ) from exc
        problems = []
        if len(frames) != len(vector.frames):
            problems.append(f"{len(frames)} frames, vLLM wrote {len(vector.frames)}")
        for index, (mine, theirs) in enumerate(zip(frames, vector.frames, strict=False)):
            if mine != theirs:
                at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False))
                           if a != b), min(len(mine), len(theirs)))
                problems.append(f"frame {index} differs from byte {at} on")
        if problems:
            raise CheckFailure(
                f"golden {vector.name}: {problems[0]}",
                Reproduction(sent=list(vector.frames), received=frames,
                             notes={"problems": problems, "threshold": vector.threshold}),
            )



def _register_decode(vector: Any, base: str, clauses: list[str]) -> None:
    @check(f"{base}/decode", clauses=clauses, surface="codec",
           description=f"golden {vector.name}: {vector.description} (decode)")
    def _decode(codec: CodecSurface, ctx: CheckContext) -> None:
        require_reference_version(ctx)
        try:
            decoded = codec.decode(vector.kind, list(vector.frames))
        except Exception as exc:  # noqa: BLE001
            raise CheckFailure(
                f"decode({vector.kind!r}) rejected vLLM's frames: {type(exc).__name__}: {exc}",
                Reproduction(sent=list(vector.frames), received=f"{type(exc).__name__}: {exc}"),
            ) from exc
        expected = neutral(vector.value)
        payload = payload_type(vector.kind)
        if payload is not None:
            expected = complete(expected, payload, ctx.spec)
        problems = differences(_tensors(expected), _tensors(neutral(decoded)))
        if problems:
            raise CheckFailure(
                f"golden {vector.name}: {problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                Reproduction(sent=list(vector.frames), received=neutral(decoded),
                             notes={"differences": problems[:20]}),
            )


def _tensors(value: Any) -> Any:
    """Tensor-like values a decoder may return besides torch/numpy, as TensorValue."""
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "data") and \
            not isinstance(value, TensorValue):
        try:
            return TensorValue(str(value.dtype), tuple(value.shape), bytes(value.data), "tensor")
        except (TypeError, ValueError):
            return value
    return value


def _register_all() -> None:
    from enginewire.spec import load

    try:
        from enginewire.conformance.oracle.golden import load_vectors
        vectors = load_vectors()
    except (ImportError, FileNotFoundError) as exc:
        reason = f"no golden vectors: {exc}"
        vectors = []
    else:
        reason = "conformance/data/golden/ holds no vectors"
    if not vectors:

        @check("codec/golden/vectors-present", clauses=["frames.payload-msgpack-first"],
               surface="codec", description="golden vectors are installed")
        def _absent(codec: CodecSurface, ctx: CheckContext) -> None:
            raise CheckSkip(reason)

        return
    spec = load()
    for vector in vectors:
        _register(vector, spec)


_register_all()


def register_vectors(directory: str | Path) -> list[str]:
    """Add the vectors under ``directory`` (the golden format, ``expect`` and release
    included) to the golden checks, as ``codec/vectors/<directory name>/<vector>/...``;
    returns the new check IDs (``enginewire check --vectors DIR``)."""
    from enginewire.conformance.oracle.golden import load_vectors
    from enginewire.spec import load

    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"--vectors {directory}: no such directory")
    vectors = load_vectors(folder)
    if not vectors:
        raise FileNotFoundError(f"--vectors {directory}: no *.json vectors there")
    spec = load()
    ids: list[str] = []
    for vector in vectors:
        ids += _register(vector, spec, f"codec/vectors/{_slug(folder.name)}")
    return ids
