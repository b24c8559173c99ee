"""Serve the ``--target-cmd`` line protocols (:mod:`enginewire.conformance.targets.external`) for an
in-process target, so any Python implementation can also be checked as an external program,
and as a worked example of the protocols::

    enginewire check --target none --version 0.9.1 --target-cmd "codec=python -m \\
        enginewire.conformance.targets.command_server --surface codec --version {version}"
    enginewire check --target none --version 0.9.1 --target-cmd "frontend=python -m \\
        enginewire.conformance.targets.command_server --surface frontend --handshake {handshake} \\
        --input {input} --output {output} --engines {engines} --version {version}"

``--version X`` builds the target for vLLM release X as ``check --version X`` does
(:func:`~enginewire.conformance.targets.resolve.load_target`: the reference codec follows X's
layouts, its front end X's handshake and sockets); ``{version}`` passes on the release the
suite checks. Without it the reference speaks the newest release, and an older release's
codec and front-end checks fail (``tests/test_command_server_releases.py``).

Each request line is handled on its own thread (the ring's collective start needs that);
answers are written whole, one per line, under a lock.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import sys
import threading
from typing import Any

from enginewire.conformance.oracle.golden import from_json, to_json
from enginewire.conformance.targets.contract import FrontendLaunch, RingHandle, TargetError
from enginewire.conformance.targets.resolve import load_target
from enginewire.spec.loader import UnknownVersionError


class _Server:
    def __init__(self, surface: Any, kind: str) -> None:
        self.surface = surface
        self.kind = kind
        self.lock = threading.Lock()
        self.ends: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.codecs: dict[Any, Any] = {None: surface}
        self.client: Any = None
        self.role: str | None = None
        self.unsupported: list[str] = []
        self.refuse_all = False

    def answer(self, seq: Any, body: dict[str, Any]) -> None:
        line = json.dumps({"seq": seq, **body}) + "\n"
        with self.lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def handle(self, request: dict[str, Any]) -> None:
        seq = request.get("seq")
        if self.refuse_all and request.get("op") in ("encode", "decode"):
            self.answer(seq, {"ok": False, "kind": "error", "error": "refused", "clause": None})
            return
        try:
            result = getattr(self, f"{self.kind}_{request['op']}")(request)
            self.answer(seq, {"ok": True, **(result or {})})
        except TimeoutError as exc:
            self.answer(seq, {"ok": False, "kind": "timeout", "error": str(exc)})
        except ConnectionError as exc:
            self.answer(seq, {"ok": False, "kind": "dead", "error": str(exc)})
        except NotImplementedError as exc:
            self.answer(seq, {"ok": False, "kind": "unsupported",
                              "error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            self.answer(seq, {"ok": False, "kind": "error",
                              "error": f"{type(exc).__name__}: {exc}",
                              "clause": getattr(exc, "clause", None)})

    # --- codec ---------------------------------------------------------------------------

    def _codec(self, threshold: Any) -> Any:
        if threshold not in self.codecs:
            self.codecs[threshold] = self.surface.with_threshold(int(threshold))
        return self.codecs[threshold]

    def codec_hello(self, request: dict[str, Any]) -> dict[str, Any]:
        """The codec's declaration: its ``role`` and ``unsupported`` operations (``--role``
        and ``--unsupported`` override the target's own)."""
        role = self.role or getattr(self.surface, "role", "both")
        unsupported = sorted({*getattr(self.surface, "unsupported", ()), *self.unsupported})
        return {"role": role, "unsupported": unsupported}

    def codec_encode(self, request: dict[str, Any]) -> dict[str, Any]:
        frames = self._codec(request.get("threshold")).encode(request["kind"],
                                                              from_json(request["value"]))
        return {"frames": [bytes(memoryview(f).cast("B")).hex() for f in frames]}

    def codec_decode(self, request: dict[str, Any]) -> dict[str, Any]:
        frames = [bytes.fromhex(f) for f in request["frames"]]
        value = self._codec(request.get("threshold")).decode(request["kind"], frames)
        return {"value": to_json(value)}

    # --- ring ----------------------------------------------------------------------------

    def ring_create_writer(self, request: dict[str, Any]) -> dict[str, Any]:
        writer = self.surface.create_writer(n_reader=request["n_reader"],
                                            max_chunk_bytes=request["max_chunk_bytes"],
                                            max_chunks=request["max_chunks"])
        end_id = next(self.ids)
        self.ends[end_id] = writer
        return {"id": end_id, "handle": writer.handle.to_builtins()}

    def ring_attach_reader(self, request: dict[str, Any]) -> dict[str, Any]:
        reader = self.surface.attach_reader(RingHandle.from_builtins(request["handle"]),
                                            request["rank"])
        end_id = next(self.ids)
        self.ends[end_id] = reader
        return {"id": end_id}

    def ring_wait_until_ready(self, request: dict[str, Any]) -> None:
        self.ends[request["id"]].wait_until_ready(request["timeout"])

    def ring_enqueue(self, request: dict[str, Any]) -> None:
        from enginewire.conformance.peers.ring_peer import unpickle_buffers

        # The in-process ring takes objects; a native program would frame the buffers as
        # they are.
        obj = unpickle_buffers([bytes.fromhex(b) for b in request["buffers"]])
        self.ends[request["id"]].enqueue(obj, timeout=request.get("timeout"))

    def ring_dequeue(self, request: dict[str, Any]) -> dict[str, Any]:
        from enginewire.conformance.peers.ring_peer import pickle_buffers

        obj = self.ends[request["id"]].dequeue(timeout=request.get("timeout"))
        return {"buffers": [b.hex() for b in pickle_buffers(obj)]}

    def ring_close(self, request: dict[str, Any]) -> None:
        end = self.ends.pop(request["id"], None)
        if end is not None:
            end.close()

    # --- frontend ------------------------------------------------------------------------

    def frontend_wait_ready(self, request: dict[str, Any]) -> None:
        self.client.wait_ready(request["timeout"])

    def frontend_add(self, request: dict[str, Any]) -> None:
        self.client.add_request(from_json(request["request"]), request.get("engine", 0))

    def frontend_abort(self, request: dict[str, Any]) -> None:
        self.client.abort(request["request_ids"], request.get("engine", 0))

    def frontend_utility(self, request: dict[str, Any]) -> dict[str, Any]:
        result = self.client.call_utility(request["method"], from_json(request["args"]),
                                          request.get("engine", 0), request["timeout"])
        return {"result": to_json(result)}

    def frontend_outputs(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"outputs": to_json(self.client.next_outputs(request["timeout"]))}

    def frontend_stop(self, request: dict[str, Any]) -> None:
        self.client.stop()

    def close(self) -> None:
        for end in self.ends.values():
            try:
                end.close()
            except Exception:  # noqa: BLE001, S110 - best effort at exit
                pass
        if self.client is not None:
            self.client.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--surface", required=True, choices=("codec", "ring", "frontend"))
    parser.add_argument("--target", default="reference")
    parser.add_argument("--handshake")
    parser.add_argument("--input")
    parser.add_argument("--output")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--version", default=None, metavar="X",
                        help="the vLLM release the target follows, as for check --version "
                             "(the reference: its layouts, handshake keys and sockets); "
                             "pass {version} in a --target-cmd. Default or empty: the spec's "
                             "reference release")
    parser.add_argument("--role", choices=("frontend", "engine", "both"), default=None,
                        help="codec: the role to declare in the hello answer (default: the "
                             "target codec's own)")
    parser.add_argument("--unsupported", action="append", default=[], metavar="OP:KIND",
                        help="codec: an operation to declare unsupported (encode:KIND, "
                             "decode:KIND, encode:*); may repeat")
    parser.add_argument("--refuse-all", action="store_true",
                        help="codec: answer every encode and decode with an error (a stub "
                             "that implements nothing; the suite must pass none of its checks)")
    args = parser.parse_args(argv)
    try:
        target = load_target(args.target, version=args.version or None)
    except (TargetError, UnknownVersionError) as exc:
        parser.error(str(exc))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = _Server(target.surface(args.surface), args.surface)
    server.role = args.role
    server.unsupported = list(args.unsupported)
    server.refuse_all = args.refuse_all
    if args.surface == "frontend":
        server.client = server.surface.start_frontend(FrontendLaunch(
            args.handshake, args.input, args.output, args.engines))
    workers = []
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            if args.surface == "frontend":
                server.handle(request)  # the reference front end is single-threaded
                continue
            worker = threading.Thread(target=server.handle, args=(request,), daemon=True)
            worker.start()
            workers.append(worker)
    finally:
        for worker in workers:
            worker.join(5.0)
        server.close()
        target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
