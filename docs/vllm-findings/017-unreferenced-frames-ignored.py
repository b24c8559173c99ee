#!/usr/bin/env python3
"""Reproduction: frames no value refers to are silently ignored (vLLM 0.33.0).

vLLM's MsgpackDecoder decodes frame 0 and reads other frames only when a value names them:
a message carrying out-of-band frames that nothing refers to decodes as if they were not
there, so a sender that lost track of its indexes (or a message mis-assembled from two)
goes unnoticed. The engine's untyped decoder does the same for ABORT and UTILITY payloads.

This script appends a stray 16-byte frame to an EngineCoreOutputs that vLLM's own
MsgpackEncoder produced (once with its tensor inline, once with it out of band) and decodes
it with vLLM's MsgpackDecoder(EngineCoreOutputs); and appends a stray frame to an ABORT
payload and decodes it with the untyped MsgpackDecoder() the engine uses for ABORT.

Exit 1: a case was accepted (reproduces). Exit 0: every case rejected (fixed). Exit 2: the
reproduction itself failed. Needs only vLLM and msgspec; CPU only; a few seconds.
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


def cases() -> dict[str, list[bytes]]:
    """Name -> frames of an EngineCoreOutputs message vLLM should reject."""
    import torch
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackEncoder

    inline = EngineCoreOutputs(outputs=[EngineCoreOutput(
        request_id="req-0", new_token_ids=[1], pooling_output=torch.zeros(4))])
    inline_frames = [bytes(f) for f in MsgpackEncoder().encode(inline)]
    assert len(inline_frames) == 1, len(inline_frames)
    return {
        "an inline-only message followed by a stray frame": [*inline_frames, bytes(16)],
        "a message with frame 1 used and a stray frame 2": [*outputs_frames(), bytes(16)],
    }


def abort_with_stray_frame_accepted() -> bool:
    """The engine's untyped decoder (core.py:1945) on an ABORT payload plus a stray frame."""
    from vllm.v1.serial_utils import MsgpackDecoder

    frames = [msgspec.msgpack.encode(["req-0", "req-1"]), b"stray"]
    try:
        value = MsgpackDecoder().decode(frames)
    except Exception as exc:  # noqa: BLE001 - any decode error is a rejection
        print(f"fixed: an ABORT payload followed by a stray frame: rejected ({exc})")
        return False
    print(f"BUG: an ABORT payload followed by a stray frame: accepted, decoded as {value!r}")
    return True


def outputs_frames(n_outputs: int = 1, ndarray: bool = False) -> list[bytes]:
    """An EngineCoreOutputs whose outputs carry a 16-byte tensor (or ndarray) each, encoded
    by vLLM's own MsgpackEncoder with every buffer out of band (size_threshold=0)."""
    import numpy as np
    import torch
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackEncoder

    outputs = [
        EngineCoreOutput(request_id=f"req-{i}", new_token_ids=[1],
                         routed_experts=np.zeros(4, dtype=np.int32) if ndarray else None,
                         pooling_output=None if ndarray else torch.zeros(4))
        for i in range(n_outputs)
    ]
    frames = MsgpackEncoder(size_threshold=0).encode(EngineCoreOutputs(outputs=outputs))
    return [bytes(frame) for frame in frames]


def tensor_tuples(value: object) -> list[list]:
    """The [dtype, shape, data] arrays inside a decoded msgpack value, in order."""
    found: list[list] = []
    if isinstance(value, list):
        if len(value) == 3 and value[0] in ("float32", "<i4") and isinstance(value[1], list):
            return [value]
        for item in value:
            found += tensor_tuples(item)
    return found


def edited(frames: list[bytes], edit, keep: int | None = None) -> list[bytes]:
    """``frames`` with ``edit`` applied to the tensor tuples of frame 0; ``keep`` frames."""
    message = msgspec.msgpack.decode(frames[0])
    edit(tensor_tuples(message))
    return [msgspec.msgpack.encode(message), *frames[1:keep]]


def decoded_summary(value: object) -> str:
    """What the decoder handed back, in short: each output's tensor or array."""
    parts = []
    for output in value.outputs:
        for name in ("pooling_output", "routed_experts"):
            data = getattr(output, name)
            if data is not None:
                array = data.numpy() if hasattr(data, "numpy") else data
                head = array.tobytes()[:16].hex()
                parts.append(f"{output.request_id}.{name} = {data.dtype} {list(data.shape)} {head}")
    return "; ".join(parts)


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces: vLLM's output decoder accepts a case."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder

    accepted = False
    for name, frames in cases().items():
        try:
            value = MsgpackDecoder(EngineCoreOutputs).decode(frames)
        except Exception as exc:  # noqa: BLE001 - any decode error is a rejection
            print(f"fixed: {name}: rejected ({type(exc).__name__}: {exc})")
            continue
        print(f"BUG: {name}: accepted, decoded as {decoded_summary(value)}")
        accepted = True
    return abort_with_stray_frame_accepted() or accepted


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
