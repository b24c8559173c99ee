#!/usr/bin/env python3
"""Reproduction: a NamedTuple on the wire cannot gain a field compatibly (vLLM 0.33.0).

Most wire structs are msgspec array_like Structs: a decoder silently drops trailing elements
it does not know, so a newer peer can append a field. The NamedTuples on the wire
(LogprobsLists, LogprobsTensors) are decoded by msgspec with a fixed maximum length: one
extra trailing element fails the whole EngineCoreOutputs message ("Expected `array` of
length <= 4"), and AsyncMPClient then ends its output task (finding 003). vLLM has already
appended fields to these tuples (cu_num_generated_tokens), so a front end and an engine one
version apart cannot exchange logprobs.

This script encodes an EngineCoreOutputs with new_logprobs (vLLM's own MsgpackEncoder),
appends one trailing element to the LogprobsLists array (a field a newer version added),
and decodes it with vLLM's MsgpackDecoder(EngineCoreOutputs); as a control, the same extra
element appended to the EngineCoreOutput struct itself decodes.

Exit 1: the grown NamedTuple fails to decode (reproduces). Exit 0: it decodes (fixed: e.g.
the tuple became an array_like Struct). Exit 2: the reproduction itself failed. Needs only
vLLM and msgspec; CPU only; a few seconds.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


import msgspec  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    import numpy as np
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.outputs import LogprobsLists
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    logprobs = LogprobsLists(np.zeros((1, 2), np.int32), np.zeros((1, 2), np.float32),
                             np.zeros(1, np.int32), [0, 1])
    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(
        request_id="req-0", new_token_ids=[1], new_logprobs=logprobs)])
    frames = [bytes(f) for f in MsgpackEncoder().encode(outputs)]
    decoder = MsgpackDecoder(EngineCoreOutputs)

    def grown(where: str) -> list[bytes]:
        message = msgspec.msgpack.decode(frames[0])
        output = message[1][0]  # EngineCoreOutputs.outputs[0]
        assert output[0] == "req-0", output
        target = output if where == "struct" else output[2]  # new_logprobs
        assert where == "struct" or len(target) == 4, target
        target.append(None)  # the field a newer version appended
        return [msgspec.msgpack.encode(message), *frames[1:]]

    decoder.decode(grown("struct"))  # control: an array_like Struct may grow
    try:
        decoder.decode(grown("tuple"))
    except Exception as exc:  # noqa: BLE001 - any decode error is the break
        print(f"BUG: an EngineCoreOutputs whose LogprobsLists has one extra trailing element "
              f"does not decode ({type(exc).__name__}: {exc}); the same extra element on "
              f"EngineCoreOutput itself is ignored")
        return True
    print("fixed: the grown LogprobsLists decodes")
    return False


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.v1.serial_utils  # noqa: F401 - slow; not counted in the hard stop

    # A hard stop once vLLM is imported: a wait this script does not bound ends it (exit 2).
    stop = threading.Timer(HARD_STOP_S, hard_stop)
    stop.daemon = True
    stop.start()
    tmp = tempfile.mkdtemp(prefix="vllm-finding-")
    try:
        return EXIT_REPRODUCED if reproduce(tmp) else EXIT_FIXED
    except Exception:  # noqa: BLE001 - the reproduction itself failed: neither verdict
        traceback.print_exc()
        return EXIT_BROKEN
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if "vllm-finding-rpc-" in os.environ.get("VLLM_RPC_BASE_PATH", ""):
            shutil.rmtree(os.environ["VLLM_RPC_BASE_PATH"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
