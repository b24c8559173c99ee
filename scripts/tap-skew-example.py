#!/usr/bin/env python3
"""The worked example of docs/tap.md: a session through ``enginewire tap`` whose engine writes
its outputs in an older release's layout.

Runs the reference front end (0.33.0), the tap (recording to ``--record``, default
``skewed.cap``) and a reference engine whose ``outputs`` messages are written with the struct
layouts of ``--engine-release`` (default 0.19.1: an EngineCoreOutput of 14 fields where 0.33.0
has 19); then prints the recording as ``enginewire tap --read`` shows it.
Usage: ``python scripts/tap-skew-example.py [--record FILE] [--engine-release X]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from typing import Any

from enginewire.reference.codec import Codec
from enginewire.reference.engine import EngineOptions, ReferenceEngine, generation_request
from enginewire.reference.errors import ProtocolTimeout
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.tap.capture import Header, Writer
from enginewire.tap.proxy import Tap, TapConfig


class SkewedEngine(ReferenceEngine):
    """Writes its outputs messages with ``release``'s struct layouts."""

    def __init__(self, options: EngineOptions, release: str) -> None:
        super().__init__(options)
        send = self.connection.send
        old = Codec(version=release, tensors="wire")
        classes = old.structs.classes

        def skewed(kind: str, value: Any = None, **options: Any) -> Any:
            frames = send(kind, value, **options)
            if kind != "outputs":
                return frames
            outputs = [classes["EngineCoreOutput"](
                request_id=o.request_id, new_token_ids=list(o.new_token_ids),
                finish_reason=o.finish_reason) for o in value.outputs]
            return old.encode("outputs", classes["EngineCoreOutputs"](
                engine_index=value.engine_index, outputs=outputs,
                finished_requests=value.finished_requests, timestamp=value.timestamp))

        self.connection.send = skewed  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", default="skewed.cap")
    parser.add_argument("--engine-release", default="0.19.1")
    args = parser.parse_args()
    with open(args.record, "wb") as handle:
        writer = Writer(handle, Header("0.33.0"))
        with ReferenceFrontend(1) as front, \
                Tap(TapConfig(upstream_handshake=front.handshake_address),
                    record=writer.write) as tap:
            tap.start()
            engine = SkewedEngine(EngineOptions(handshake_address=tap.handshake_address),
                                  args.engine_release)
            thread = threading.Thread(target=engine.run, daemon=True)
            thread.start()
            try:
                front.wait_ready(10)
                front.add_request(generation_request("req-0", [1, 2, 3], 2))
                try:
                    front.get_output(2)
                except Exception as error:  # the front end rejects the skewed outputs
                    print(f"front end: {error}", file=sys.stderr)
                try:
                    front.get_output(1)
                except (ProtocolTimeout, Exception):
                    pass
            finally:
                engine.request_stop()
                thread.join(10)
    return subprocess.call([sys.executable, "-m", "enginewire", "tap", "--read", args.record])


if __name__ == "__main__":
    sys.exit(main())
