"""Every decoder error of the reference names its ``$``-path and ``Struct.field``, tensor
errors included, in the form the conformance reports use."""

from __future__ import annotations

import msgspec
import pytest

from enginewire.reference.codec import Codec
from enginewire.reference.errors import FramingError, PayloadError, TensorError

_EMPTY = [None] * 10


@pytest.mark.parametrize(("output", "error", "lead"), [
    (["r", [1], *_EMPTY, 0], TensorError,
     "`$[1][0][12]` (EngineCoreOutput.routed_experts): a tensor travels as the array"),
    (["r", [1], None, None, ["float32", [2], 5]], FramingError,
     "`$[1][0][4]` (EngineCoreOutput.pooling_output): "),
    (["r", "tokens"], PayloadError,
     "outputs: `$[1][0][1]` (EngineCoreOutput.new_token_ids): Expected `array`"),
])
def test_decoder_errors_name_path_and_field(output: list, error: type, lead: str) -> None:
    payload = msgspec.msgpack.encode([0, [output]])
    with pytest.raises(error) as info:
        Codec().decode("outputs", [payload])
    assert lead in info.value.message
    assert info.value.clause


def test_top_level_field_error() -> None:
    with pytest.raises(PayloadError) as info:
        Codec().decode("outputs", [msgspec.msgpack.encode(["x", []])])
    assert "`$[0]` (EngineCoreOutputs.engine_index): Expected `int`, got `str`" in str(info.value)
