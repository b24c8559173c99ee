"""Strict peers: what a target sends is read with vLLM 0.33.0's exact typing.

Each broken engine below sends one kind of type error vLLM's typed decoder rejects; the check
that receives it fails with the clause, the ``$``-path and the field name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.oracle.strict import type_problems
from enginewire.conformance.targets.contract import Target
from enginewire.fuzz.mutants.peer_mutants import MutantEngines
from enginewire.reference.engine import EngineOptions, ReferenceEngine
from enginewire.spec import load


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


def _rewriting(kinds: tuple[str, ...], rewrite: Callable[[Any], Any]) -> type[ReferenceEngine]:
    """A reference engine whose messages of ``kinds`` have frame 0 rewritten."""

    class Rewriting(ReferenceEngine):
        def __init__(self, options: EngineOptions) -> None:
            super().__init__(options)
            send = self.connection.send

            def rewritten(kind: str, value: Any = None, **kwargs: Any) -> list[Any]:
                frames = list(send(kind, value, **kwargs))
                if kind in kinds:
                    raw = msgspec.msgpack.decode(bytes(memoryview(frames[0]).cast("B")))
                    frames[0] = msgspec.msgpack.encode(rewrite(raw))
                return frames

            self.connection.send = rewritten  # type: ignore[method-assign]

    return Rewriting


def _int_in_routed_experts(raw: Any) -> Any:
    for output in raw[1] or []:
        while len(output) <= 12:
            output.append(None)
        output[12] = 7  # 0.33.0: routed_experts is ndarray | None
    return raw


def _str_engine_index(raw: Any) -> Any:
    raw[0] = "zero"  # engine_index is an int
    return raw


def _hello_without_headless(raw: Any) -> Any:
    raw.pop("headless", None)
    return raw


@pytest.mark.parametrize(("kinds", "rewrite", "pattern", "needle"), [
    (("outputs",), _int_in_routed_experts, "engine/serve/add-generates",
     "`$[1][0][12]` (EngineCoreOutput.routed_experts): expected `ndarray | none`, got `int`"),
    (("outputs", "utility_reply"), _str_engine_index, "engine/serve/add-generates",
     "`$[0]` (EngineCoreOutputs.engine_index): expected `int`, got `str`"),
    (("hello",), _hello_without_headless, "engine/handshake/hello-first",
     "`$.headless` (HELLO.headless): required field missing"),
])
def test_engine_sending_what_vllm_rejects_fails(spec: Any, kinds: tuple[str, ...],
                                                rewrite: Callable[[Any], Any], pattern: str,
                                                needle: str) -> None:
    checks = select(all_checks(), patterns=[pattern])
    target = Target("broken", engine=MutantEngines(_rewriting(kinds, rewrite)))
    result = run(checks, target, spec)
    [verdict] = result.results
    assert verdict.status == FAILED
    assert needle in verdict.message
    healthy = run(checks, Target("ok", engine=MutantEngines(ReferenceEngine)), spec)
    assert healthy.results[0].status == PASSED


def test_type_problems_positions(spec: Any) -> None:
    output = ["r", [1], None, None, None, None, None, None, None, None, None, None, 7]
    [problem] = type_problems([0, [output]], "EngineCoreOutputs", spec)
    assert problem.path == "$[1][0][12]"
    assert problem.field == "EngineCoreOutput.routed_experts"
    assert (problem.expected, problem.got) == ("ndarray | none", "int")
    assert type_problems([0, [["r", [1]]]], "EngineCoreOutputs", spec) == []
    missing = type_problems([0, [["r"]]], "EngineCoreOutputs", spec)
    assert [(p.path, p.kind) for p in missing] == [("$[1][0][1]", "missing")]
    assert type_problems([0.5], "EngineCoreOutputs", spec)[0].got == "float"
    assert type_problems([0, [], None, 3], "EngineCoreOutputs", spec) == []  # int as float
    assert type_problems([0, None], "EngineCoreOutputs", spec)[0].got == "null"


def _ready_response_without_required(raw: Any) -> Any:
    raw.pop("max_model_len", None)
    raw["vllm_version"] = "0.0.1"  # a value vLLM reads past
    return raw


def test_ready_response_headline_is_what_vllm_rejects(spec: Any) -> None:
    checks = select(all_checks(), patterns=["engine/handshake/ready-response-map"])
    target = Target("broken", engine=MutantEngines(
        _rewriting(("ready_response",), _ready_response_without_required)))
    [verdict] = run(checks, target, spec).results
    assert verdict.status == FAILED
    assert "`$.max_model_len` (EngineCoreReadyResponse.max_model_len): required field missing" \
        in verdict.first_line


def test_struct_diff_names_the_first_position_that_differs(spec: Any) -> None:
    from enginewire.conformance.checks._helpers import expect_wire
    from enginewire.conformance.framework.registry import CheckFailure
    from enginewire.conformance.targets.reference import ReferenceCodec

    value = {"engine_index": 0,
             "outputs": [{"request_id": "r", "new_token_ids": [1], "finish_reason": 1}]}
    frames = [bytes(f) for f in ReferenceCodec().encode("EngineCoreOutputs", value)]
    raw = msgspec.msgpack.decode(frames[0])
    del raw[1][0][4]  # a layout without pooling_output: every later field one place early
    with pytest.raises(CheckFailure) as info:
        expect_wire([msgspec.msgpack.encode(raw)], value, "EngineCoreOutputs", spec)
    message = info.value.message
    assert message.startswith(
        "EngineCoreOutputs: the encoding differs from the spec: vLLM 0.33.0 rejects it: "
        "`$[1][0][4]` (EngineCoreOutput.pooling_output): expected `tensor | none`, got `int`")
    notes = info.value.reproduction.notes
    assert any("$[1][0]: expected an array of 19, got 18" in d for d in notes["differences"])
    assert any(d.startswith("$[1][0][4]: expected None") for d in notes["differences"])
    # A longer array than the struct's is read past by vLLM: marked, and last.
    raw = msgspec.msgpack.decode(frames[0])
    raw[1][0].append(None)
    with pytest.raises(CheckFailure) as info:
        expect_wire([msgspec.msgpack.encode(raw)], value, "EngineCoreOutputs", spec)
    assert "rejects" not in info.value.message
    assert "(tolerated by vLLM)" in info.value.message


def test_frontend_sending_what_vllm_rejects_fails(spec: Any) -> None:
    from enginewire.conformance.targets.reference import ReferenceCodec, ReferenceFrontends
    from enginewire.reference.frontend import ReferenceFrontend

    class ArrivalAsText(ReferenceFrontend):
        """Sends EngineCoreRequest.arrival_time as a str (0.33.0: a float)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            send = self.connection.send

            def rewritten(kind: str, value: Any, **options: Any) -> list[Any]:
                frames = list(send(kind, value, **options))
                if kind == "add":
                    raw = msgspec.msgpack.decode(bytes(memoryview(frames[2]).cast("B")))
                    raw[ARRIVAL] = "now"
                    frames[2] = msgspec.msgpack.encode(raw)
                return frames

            self.connection.send = rewritten  # type: ignore[method-assign]

    class Frontends(ReferenceFrontends):
        def frontend_class(self) -> Any:
            return ArrivalAsText

    ARRIVAL = [f.name for f in spec.structs["EngineCoreRequest"].fields].index("arrival_time")
    checks = select(all_checks(), patterns=["frontend/requests/add-frames"])
    [verdict] = run(checks, Target("broken", frontend=Frontends(ReferenceCodec())), spec).results
    assert verdict.status == FAILED
    assert (f"`$[{ARRIVAL}]` (EngineCoreRequest.arrival_time): expected `float`, got `str`"
            in verdict.message)
