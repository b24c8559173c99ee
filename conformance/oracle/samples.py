"""Sample neutral values of spec types, for checks derived from the spec.

:func:`sample_struct` fills every field of a struct with a value that differs from its default
and from its neighbours (so a field that lands in the wrong position shows), keeping nested
structs minimal (required fields only) so values stay small. Some structs validate their
fields when built (vLLM's ``SamplingParams`` rejects ``top_p`` above 1); :data:`OVERRIDES`
holds plausible values for those fields.
"""

from __future__ import annotations

from typing import Any

from enginewire.spec.schema import EnumSpec, StructSpec
from enginewire.spec.types import TypeExpr, TypeVisitor, kind_of, members, parse_type

#: struct name -> field name -> a valid, non-default neutral value.
OVERRIDES: dict[str, dict[str, Any]] = {
    "SamplingParams": {
        "n": 1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.5,
        "temperature": 0.75,
        "top_p": 0.875,
        "top_k": 7,
        "min_p": 0.125,
        "seed": 1234,
        "stop": ["</s>"],
        "stop_token_ids": [2],
        "_all_stop_token_ids": {2},
        "max_tokens": 9,
        "min_tokens": 1,
        "logprobs": 3,
        "prompt_logprobs": 2,
        "output_kind": 1,
        "logit_bias": {5: 0.5},
        "allowed_token_ids": [5, 6, 7],
        "bad_words": ["bad"],
        "stream_interval": 2,
    },
    "PoolingParams": {"dimensions": 8, "task": "embed", "output_kind": 2},
    "LoRARequest": {"lora_name": "adapter", "lora_int_id": 3},
    "EngineCoreEvent": {"type": 2, "timestamp": 12.5},
    "KVEventsConfig": {"publisher": "zmq"},
    "RepetitionDetectionParams": {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 3},
    "StructuredOutputsParams": {"json": None, "choice": None, "grammar": None,
                                "json_object": None, "structural_tag": None},
    "MultiModalFeatureSpec": {"data": None},
    "UtilityResult": {"type_info": None},
}

#: struct name -> fields set even in a minimal (required-only) sample, because the reference
#: classes refuse to be built without them (vLLM asserts LoRARequest.lora_path is not empty).
#: vLLM also normalizes some defaults when it builds a struct (SamplingParams turns stop=None
#: into [], EngineCoreOutputs stamps timestamp=0.0 with time.monotonic(), KVEventsConfig turns
#: publisher=None into "null"); minimal samples set those fields so that nested structs compare
#: cleanly, and the normalization itself is left to the stand-alone checks of each struct.
REQUIRED_EXTRAS: dict[str, dict[str, Any]] = {
    "LoRARequest": {"lora_path": "/tmp/adapter"},
    "SamplingParams": {"stop": [], "stop_token_ids": [], "bad_words": [],
                       "skip_reading_prefix_cache": False},
    "EngineCoreOutputs": {"timestamp": 1.5},
    "KVEventsConfig": {"publisher": "null"},
    "StructuredOutputsParams": {"regex": "a+"},
    "UtilityResult": {"type_info": None},
    "MultiModalFeatureSpec": {"data": None},
    # vLLM 0.10.1 carries elements straight in EngineCoreRequest.mm_kwargs: a known factory.
    "MultiModalFieldElem": {"field": ["batched", {}]},
}

#: Structs whose values only travel inside a context-specific encoding (vLLM's
#: MultiModalKwargsItem hooks); they get no stand-alone struct checks.
CONTEXTUAL = frozenset(
    {"MultiModalFieldElem", "MultiModalBatchedField", "MultiModalFlatField",
     "MultiModalSharedField"}
)


class Sampler(TypeVisitor[Any]):
    """Deterministic sample values; each call hands out the next distinct scalar."""

    def __init__(self, spec: Any, start: int = 1) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.counter = start

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def value(self, type_text: str | TypeExpr, depth: int = 0) -> Any:
        expr = parse_type(type_text) if isinstance(type_text, str) else type_text
        return self.visit(expr, depth)

    def visit_union(self, expr: TypeExpr, depth: int) -> Any:
        return self.value(self._pick(expr, depth), depth)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, depth: int) -> Any:
        return self.struct(item.name, depth=depth + 1, full=False)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, depth: int) -> Any:
        return item.members[-1].value

    # Every other constructor takes the next counter value first, used or not.
    def visit_int(self, expr: TypeExpr, depth: int) -> Any:
        return 100 + self._next()

    def visit_float(self, expr: TypeExpr, depth: int) -> Any:
        return self._next() + 0.25

    def visit_str(self, expr: TypeExpr, depth: int) -> Any:
        return f"v{self._next()}"

    def visit_bool(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        return True

    def visit_bytes(self, expr: TypeExpr, depth: int) -> Any:
        return bytes([self._next() % 256]) * 3

    def visit_any(self, expr: TypeExpr, depth: int) -> Any:
        return self._next()

    def visit_none(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        return None

    def visit_slice(self, expr: TypeExpr, depth: int) -> Any:
        return slice(0, self._next(), 1)

    def visit_tensor(self, expr: TypeExpr, depth: int) -> Any:
        import torch

        n = self._next()
        return torch.tensor([n, n + 1], dtype=torch.int32)

    def visit_ndarray(self, expr: TypeExpr, depth: int) -> Any:
        import numpy as np

        n = self._next()
        return np.array([n, n + 1], dtype="<i4")

    def visit_nested_tensors(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        raise ValueError(f"no sample for type {expr}")

    def visit_list(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        return [self.value(expr.args[0], depth)]

    def visit_set(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        return {self.value(expr.args[0], depth)}

    def visit_tuple(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        if expr.variadic:
            return [self.value(expr.args[0], depth)]
        return [self.value(a, depth) for a in expr.args]

    def visit_dict(self, expr: TypeExpr, depth: int) -> Any:
        self._next()
        return {self.value(expr.args[0], depth): self.value(expr.args[1], depth)}

    def _pick(self, expr: TypeExpr, depth: int) -> TypeExpr:
        candidates = members(expr)
        scalars = [a for a in candidates if kind_of(a) == "scalar"]
        if scalars:
            return scalars[0]
        simple = [a for a in candidates if not self._structural(a)]
        if expr.nullable and any(kind_of(a) == "nested_tensors" for a in simple):
            # No sample of nested tensors (visit_nested_tensors): nil where the type allows it.
            simple = [a for a in simple if kind_of(a) != "nested_tensors"]
            if not simple:
                return TypeExpr("none")
        if simple:
            return simple[0]
        if expr.nullable and depth > 0:
            return TypeExpr("none")
        return candidates[0]

    def _structural(self, expr: TypeExpr) -> bool:
        """True for struct types and containers of them (kept out of nested samples)."""
        if kind_of(expr, self.spec.structs) == "struct":
            return True
        return any(self._structural(a) for a in expr.args)

    def struct(self, name: str, *, depth: int = 0, full: bool = True) -> dict[str, Any]:
        """A sample of struct ``name``: every field when ``full``, else the required ones."""
        item = self.spec.struct(name)
        # Of each exactly-one-of group the first field is set (by the sample), the rest nil.
        extras = {other: None for rule in item.constraints if rule.kind == "exactly-one-of"
                  for other in rule.fields[1:]}
        extras.update(REQUIRED_EXTRAS.get(name, {}))
        overrides = {**OVERRIDES.get(name, {}), **extras} if full else extras
        out: dict[str, Any] = {}
        for fld in item.fields:
            if not (full or fld.required or fld.name in extras):
                continue
            if fld.name in overrides:
                out[fld.name] = overrides[fld.name]
                continue
            if fld.name.startswith("_"):
                continue
            expr = parse_type(fld.type)
            if depth > 2 and expr.nullable:
                out[fld.name] = None
                continue
            out[fld.name] = self.value(expr, depth)
        return out

    def required(self, name: str) -> dict[str, Any]:
        """Only the required fields of struct ``name`` (overrides applied)."""
        return self.struct(name, full=False)


def minimal_request(request_id: str = "req-0", **fields: Any) -> dict[str, Any]:
    """A neutral ``EngineCoreRequest`` for a short generation: the smallest valid ADD payload."""
    value: dict[str, Any] = {
        "request_id": request_id,
        "prompt_token_ids": [1, 2, 3],
        "mm_features": None,
        "sampling_params": {"max_tokens": 2, **REQUIRED_EXTRAS["SamplingParams"]},
        "pooling_params": None,
        "arrival_time": 1700000000.5,
        "lora_request": None,
        "cache_salt": None,
        "data_parallel_rank": None,
    }
    value.update(fields)
    return value


def minimal_outputs(engine_index: int = 0, **fields: Any) -> dict[str, Any]:
    """A neutral ``EngineCoreOutputs`` with one output for ``req-0``."""
    value: dict[str, Any] = {
        "engine_index": engine_index,
        "outputs": [{"request_id": "req-0", "new_token_ids": [7]}],
        "timestamp": 1.5,
    }
    value.update(fields)
    return value
