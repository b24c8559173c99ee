"""Pieces shared by ``enginewire soak`` (:mod:`enginewire.fuzz.soak`) and its engine flood
(:mod:`enginewire.fuzz.flood`): malformed cases drawn from the fuzz strategies, the attack
payloads, the valid-ADD serve check, and a process's resident memory."""

from __future__ import annotations

import random
import time
import uuid
import warnings
from typing import Any

INPUT_KINDS = ("add", "abort", "utility")
OUTPUT_KINDS = ("outputs", "utility_reply")


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def hostile_inputs() -> list[tuple[str, list[bytes]]]:
    """Inputs from the attack findings: deep nesting and a huge shape."""
    import msgspec

    deep = b"\x94" + msgspec.msgpack.encode([0, 1, "m"])[1:] + b"\x91" + b"\x91" * 10_000 + b"\xc0"
    from enginewire.reference import structs as S
    from enginewire.reference.codec import Codec
    from enginewire.reference.tensors import WireTensor

    request = S.EngineCoreRequest("soak-shape", None, None, S.SamplingParams(), None, 0.5, None,
                                  None, None, prompt_embeds=WireTensor("uint8", (8,), bytes(8)))
    codec = Codec(tensors="wire")
    frames = [bytes(memoryview(f).cast("B")) for f in codec.encode("add", request)]
    raw = msgspec.msgpack.decode(frames[1], ext_hook=msgspec.msgpack.Ext)
    raw[9][1] = [2**63 - 1] * 60_000
    return [("utility", [codec.layout("utility").prefix[0], deep]),
            ("add", [frames[0], msgspec.msgpack.encode(raw)])]


class MalformedCases:
    """Malformed cases of each kind, drawn from the fuzz strategies."""

    def __init__(self, rng: random.Random) -> None:
        from hypothesis.errors import NonInteractiveExampleWarning

        from .mutations import malformed

        self.rng = rng
        self.strategies = {kind: malformed(kind) for kind in INPUT_KINDS + OUTPUT_KINDS}
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)

    def draw(self, kinds: tuple[str, ...], count: int) -> list[tuple[str, list[bytes]]]:
        out = []
        for _ in range(count):
            kind = self.rng.choice(kinds)
            case = self.strategies[kind].example()
            out.append((kind, [bytes(f) for f in case.frames]))
        return out


def serve_check(frontend: Any, timeout: float, tag: str) -> str | None:
    from enginewire.reference.engine import generation_request
    from enginewire.reference.errors import ProtocolError, ProtocolTimeout

    request_id = f"soak-{tag}-{uuid.uuid4().hex[:8]}"
    frontend.add_request(generation_request(request_id, max_tokens=1))
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            outputs = frontend.get_output(left)
        except ProtocolTimeout:
            continue
        except ProtocolError:
            continue  # a malformed output this round sent: typed, counted when judged
        for output in outputs.outputs or ():
            if output.request_id == request_id and output.finish_reason is not None:
                return None
    return f"no output for a valid ADD within {timeout:g} s"
