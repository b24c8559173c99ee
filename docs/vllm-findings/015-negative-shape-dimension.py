#!/usr/bin/env python3
"""Reproduction: a tensor shape of [-1] decodes to whatever length the data has (vLLM 0.33.0).

vLLM's MsgpackDecoder passes the shape straight to torch's view() (and numpy's reshape()),
which read one -1 entry as "infer this dimension": a shape that is not a list of
non-negative sizes is accepted, and the shape no longer checks the data's length.

This script edits an EngineCoreOutputs that vLLM's own MsgpackEncoder produced (a 16-byte
float32 tensor and, separately, a 16-byte int32 ndarray, out of band) to carry shape [-1]
(and the tensor a shape that is the int 4, not an array),
and decodes it with vLLM's MsgpackDecoder(EngineCoreOutputs), as the front end does.

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
    return {
        "tensor shape [-1]": edited(outputs_frames(), lambda t: t[0].__setitem__(1, [-1])),
        "ndarray shape [-1]": edited(outputs_frames(ndarray=True),
                                     lambda t: t[0].__setitem__(1, [-1])),
        "tensor shape 4 (an int, not an array)":
            edited(outputs_frames(), lambda t: t[0].__setitem__(1, 4)),
    }


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
    return accepted


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
