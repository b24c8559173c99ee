#!/usr/bin/env python3
"""The worked example of docs/tap.md: a session through ``enginewire tap`` whose engine writes
EngineCoreOutput with one field inserted mid-struct (as an engine of another layout would).

Runs the reference front end, the tap (recording to ``--record``, default ``skewed.cap``) and a
reference engine whose ``outputs`` messages get a float inserted at position 2 of every
EngineCoreOutput; then prints the recording as ``enginewire tap --read`` shows it.
Usage: ``python scripts/tap-skew-example.py [--record FILE]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from typing import Any

import msgspec

from enginewire.reference.engine import EngineOptions, ReferenceEngine, generation_request
from enginewire.reference.errors import ProtocolTimeout
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.tap.capture import Header, Writer
from enginewire.tap.proxy import Tap, TapConfig


class SkewedEngine(ReferenceEngine):
    """Writes a float between EngineCoreOutput.new_token_ids and new_logprobs."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        send = self.connection.send

        def skewed(kind: str, value: Any = None, **options: Any) -> Any:
            frames = send(kind, value, **options)
            if kind != "outputs":
                return frames
            raw = msgspec.msgpack.decode(bytes(frames[0]))
            for output in raw[1]:
                output.insert(2, 0.25)
            return [msgspec.msgpack.encode(raw), *frames[1:]]

        self.connection.send = skewed  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", default="skewed.cap")
    args = parser.parse_args()
    with open(args.record, "wb") as handle:
        writer = Writer(handle, Header("0.33.0"))
        with ReferenceFrontend(1) as front, \
                Tap(TapConfig(upstream_handshake=front.handshake_address),
                    writer.write) as tap:
            tap.start()
            engine = SkewedEngine(EngineOptions(handshake_address=tap.handshake_address))
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
