#!/usr/bin/env python3
"""Reproduction: the decoder leans on a bare assert and on bool being an int (vLLM 0.33.0).

Two small holes in vLLM's MsgpackDecoder:
- a tensor IPC handle (a map in the data position) received by a decoder with no tensor
  queue is refused only by ``assert self.oob_tensor_provider``: python -O removes it, and the
  decoder then calls None;
- a multimodal nested_tensors value takes ``isinstance(obj, (int, float))`` as "a number",
  so a msgpack bool (True) passes through as a value.

This script encodes an EngineCoreOutputs and a MultiModalKwargsItem with vLLM's own
MsgpackEncoder, edits them (an IPC handle map as a tensor's data; True as a field's data), and
decodes them with vLLM's MsgpackDecoder as a front end (no tensor queue) and an engine do.

Exit 1: the handle is refused only by an assert, or the bool is accepted (reproduces).
Exit 0: both refused with real errors (fixed). Exit 2: the reproduction itself failed.
Needs only vLLM and msgspec; CPU only; a few seconds.
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
    import torch
    from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItem
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    found = False
    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(
        request_id="req-0", new_token_ids=[1], pooling_output=torch.zeros(4))])
    message = msgspec.msgpack.decode(MsgpackEncoder().encode(outputs)[0])
    tensor = message[1][0][4]  # EngineCoreOutput.pooling_output
    assert tensor[0] == "float32", tensor
    tensor[2] = {"sender_id": "x", "message_id": 0, "tensor_id": 0}
    try:
        MsgpackDecoder(EngineCoreOutputs).decode([msgspec.msgpack.encode(message)])
        print("BUG: a tensor IPC handle decoded with no tensor queue")
        found = True
    except AssertionError as exc:
        print(f"BUG: a tensor IPC handle with no tensor queue is refused only by a bare assert "
              f"(AssertionError: {exc}), which python -O removes")
        found = True
    except Exception as exc:  # noqa: BLE001 - a real error is the fix
        print(f"fixed: the IPC handle was refused ({type(exc).__name__}: {exc})")

    elems = MultiModalFieldConfig.batched("image").build_elems("pixel_values", torch.zeros(2, 4))
    item = msgspec.msgpack.decode(
        MsgpackEncoder().encode(MultiModalKwargsItem({"pixel_values": elems[0]}))[0])
    item["pixel_values"]["data"] = True
    try:
        value = MsgpackDecoder(MultiModalKwargsItem).decode([msgspec.msgpack.encode(item)])
    except Exception as exc:  # noqa: BLE001 - a real error is the fix
        print(f"fixed: a bool as nested_tensors data was refused ({type(exc).__name__}: {exc})")
    else:
        print(f"BUG: a bool as nested_tensors data decoded as {value['pixel_values'].data!r}")
        found = True
    return found


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
