#!/usr/bin/env python3
"""Reproduction: the multimodal decoder calls any method named on the wire (vLLM 0.33.0).

MsgpackDecoder._decode_mm_field_elem looks the field's factory up with
getattr(MultiModalFieldConfig, name) and calls whatever it finds with the received keyword
arguments: besides the three factories the encoder writes (batched, flat, shared), every
attribute of MultiModalFieldConfig is reachable from the wire (flat_from_sizes, build_elems,
dunder methods), with arguments the peer chooses.

This script encodes a MultiModalKwargsItem with vLLM's own MsgpackEncoder (a batched field),
renames the factory to "flat_from_sizes", and decodes it with vLLM's
MsgpackDecoder(MultiModalKwargsItem). It checks whether the decoder ran flat_from_sizes
(a frame of that function in the error's traceback, or a successful decode).

Exit 1: the decoder called flat_from_sizes (reproduces). Exit 0: it refused the name first
(fixed). Exit 2: the reproduction itself failed. Needs only vLLM and msgspec; CPU only.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import traceback
import traceback as tb_module

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


import msgspec  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    import torch
    from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    elems = MultiModalFieldConfig.batched("image").build_elems("pixel_values", torch.zeros(2, 4))
    item = MultiModalKwargsItem({"pixel_values": elems[0]})
    frames = [bytes(f) for f in MsgpackEncoder().encode(item)]
    message = msgspec.msgpack.decode(frames[0])
    assert message["pixel_values"]["field"][0] == "batched", message
    message["pixel_values"]["field"] = ["flat_from_sizes", {"size_per_item": [4], "dim": 0}]
    frames[0] = msgspec.msgpack.encode(message)
    try:
        value = MsgpackDecoder(MultiModalKwargsItem).decode(frames)
    except Exception as exc:  # noqa: BLE001 - where it failed is what matters
        called = [frame.name for frame in tb_module.extract_tb(exc.__traceback__)
                  if frame.name == "flat_from_sizes"]
        if called:
            print(f"BUG: the factory name 'flat_from_sizes' from the wire was called with the "
                  f"wire's kwargs (it failed inside: {type(exc).__name__}: {exc})")
            return True
        print(f"fixed: rejected before calling it ({type(exc).__name__}: {exc})")
        return False
    print(f"BUG: the factory name 'flat_from_sizes' was accepted: {value!r}")
    return True


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
