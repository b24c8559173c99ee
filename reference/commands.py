"""``enginewire serve-engine`` and ``enginewire frontend``: the reference peers from a shell;
``enginewire stubs``: the type stub of the spec-built structs (:mod:`.stubs`).

``serve-engine`` runs one scripted reference engine core (:mod:`enginewire.reference.engine`)
until SIGTERM (clean exit 0) or SIGUSR1 / a ``die`` utility call (ENGINE_CORE_DEAD, exit 1).

``frontend`` runs the reference front end (:mod:`enginewire.reference.frontend`): it binds,
waits for ``--engines`` engines to complete the handshake (``--spawn`` starts them as child
processes), then runs one action and prints JSON lines on stdout:

- ``send --count K``: K requests, round-robin over the engines; one line per request output
  ``{"engine", "request_id", "new_token_ids", "finish_reason"}``, until every request finished;
- ``utility METHOD [ARG...]``: one line ``{"engine", "method", "result"}`` per engine (each ARG
  is read as JSON, falling back to a string), or ``{"engine", "method", "error"}``;
- ``ready``: one line per engine with its ready response.

``--version X`` (both commands): the peer speaks vLLM release X (its struct layouts, handshake
keys and ready response, its input and output sockets, from the spec's history); ``frontend
--spawn --version X`` starts engines of release X. A release without the HELLO/READY handshake
(before 0.9.0) has no handshake address: ``serve-engine --version X`` takes ``--input`` and
``--output``, and ``frontend --version X`` prints the input and output addresses it opened.
``serve-engine`` reads an empty address as not given, so one command line serves every
release as a ``check --target-cmd`` engine, whose placeholders the release does not give are
empty (:mod:`enginewire.conformance.targets.external`).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from typing import Any

import msgspec

from enginewire.cliargs import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    zmq_address,
)

#: Engine ranks travel in a 2-byte identity (identity.width-two-bytes).
MAX_RANK = 0xFFFF


def engine_rank(text: str) -> int:
    value = non_negative_int(text)
    if value > MAX_RANK:
        raise argparse.ArgumentTypeError(f"{text!r} is not an engine rank (0-{MAX_RANK})")
    return value


def engine_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_RANK + 1:
        raise argparse.ArgumentTypeError(f"{text!r} engines do not fit 2-byte identities")
    return value


def prompt_tokens(text: str) -> list[int]:
    """Comma-separated non-negative token ids."""
    try:
        tokens = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of token ids") from None
    if not tokens or any(t < 0 for t in tokens):
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-empty list of token ids >= 0")
    return tokens


def vllm_release(text: str) -> str:
    """A vLLM release the spec was derived from (``enginewire spec releases``)."""
    from enginewire.spec import load
    from enginewire.spec.loader import UnknownVersionError

    try:
        load(text)
    except UnknownVersionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def engine_address(text: str) -> str | None:
    """A ZMQ address for ``serve-engine``, or None for an empty one: what ``--target-cmd``
    fills into an address placeholder the release does not give."""
    return zmq_address(text) if text else None


def flag_value(text: str) -> bool:
    """``true`` or ``false``, as ``--target-cmd`` fills ``{remote}`` and ``{headless}``."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return text.lower() == "true"


VERSION_HELP = ("vLLM release whose struct layouts, handshake keys and ready response it "
                "speaks (default: the spec's reference release)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser(
        "serve-engine", help="run the scripted reference engine core"
    )
    engine.add_argument("--handshake", metavar="ADDR", type=engine_address, default=None,
                        help="the front end's handshake ROUTER (ipc:// or tcp://; at 0.9.0 its "
                             "input ROUTER, where that release holds the handshake)")
    engine.add_argument("--input", metavar="ADDR", action="append", type=engine_address,
                        default=[],
                        help="connect directly to this input ROUTER (no handshake, instead of "
                             "--handshake; repeatable, one per front-end client, with as many "
                             "--output)")
    engine.add_argument("--output", metavar="ADDR", action="append", default=[],
                        type=engine_address,
                        help="output PULL to connect to when there is no handshake")
    engine.add_argument("--rank", type=engine_rank, default=0, help="engine index (DP rank)")
    where = engine.add_mutually_exclusive_group()
    where.add_argument("--local", dest="local", action="store_true", default=True,
                       help="report local=true in HELLO/READY (default)")
    where.add_argument("--remote", dest="remote", nargs="?", const=True, default=None,
                       type=flag_value, metavar="BOOL",
                       help="report local=false (--remote false: local=true; a --target-cmd "
                            "engine passes --remote {remote})")
    engine.add_argument("--headless", nargs="?", const=True, default=False, type=flag_value,
                        metavar="BOOL", help="report headless=true (or --headless true|false)")
    engine.add_argument("--tokens", type=positive_int, default=4,
                        help="tokens per request without max_tokens (default: %(default)s)")
    engine.add_argument("--step-delay", type=non_negative_float, default=0.0,
                        help="seconds between generation steps (default: %(default)s)")
    engine.add_argument("--handshake-timeout", type=positive_float, default=300.0,
                        help="seconds to wait for init after HELLO (default: %(default)s)")
    engine.add_argument("--max-model-len", type=positive_int, default=4096)
    engine.add_argument("--dp-size", type=engine_count, default=1)
    engine.add_argument("--parent-pid", type=positive_int, default=None,
                        help="exit when this process is no longer the parent")
    engine.add_argument("--version", type=vllm_release, default=None, metavar="X",
                        help=VERSION_HELP)
    engine.set_defaults(handler=cmd_serve_engine)

    frontend = subparsers.add_parser(
        "frontend", help="run the reference front end against reference or other engines"
    )
    frontend.add_argument("--engines", type=engine_count, default=1,
                          help="number of engines (ranks)")
    frontend.add_argument("--handshake", metavar="ADDR", default=None, type=zmq_address,
                          help="bind the handshake ROUTER here (default: a fresh ipc path)")
    frontend.add_argument("--input", metavar="ADDR", default=None, type=zmq_address)
    frontend.add_argument("--output", metavar="ADDR", default=None, type=zmq_address)
    frontend.add_argument("--spawn", action="store_true",
                          help="start the engines as child processes (reference engines)")
    frontend.add_argument("--timeout", type=positive_float, default=30.0,
                          help="seconds for the handshake and for each output (default: "
                               "%(default)s)")
    frontend.add_argument("--version", type=vllm_release, default=None, metavar="X",
                          help=VERSION_HELP + "; --spawn starts engines of the same release")
    actions = frontend.add_subparsers(dest="action", metavar="ACTION", required=True)
    send = actions.add_parser("send", help="send requests and print their outputs")
    send.add_argument("--count", type=positive_int, default=1)
    send.add_argument("--max-tokens", type=positive_int, default=None)
    send.add_argument("--prompt", type=prompt_tokens, default=[1, 2, 3],
                      help="comma-separated prompt token ids (default: 1,2,3)")
    utility = actions.add_parser("utility", help="call a utility method on every engine")
    utility.add_argument("method")
    utility.add_argument("args", nargs="*", type=utility_arg)
    actions.add_parser("ready", help="print every engine's ready response")
    frontend.set_defaults(handler=cmd_frontend)

    stubs = subparsers.add_parser(
        "stubs", help="write the type stub of the spec-built struct classes"
    )
    stubs.add_argument("--check", action="store_true",
                       help="exit 1 if the committed stub differs from a fresh rendering")
    stubs.set_defaults(handler=cmd_stubs)


def cmd_stubs(args: argparse.Namespace) -> int:
    from .stubs import run_stubs

    return run_stubs(check=args.check)


def reports_local(args: argparse.Namespace) -> bool:
    """The ``local`` a ``serve-engine`` invocation reports: true unless ``--remote`` (or
    ``--remote true``)."""
    return bool(args.local) if args.remote is None else not args.remote


def cmd_serve_engine(args: argparse.Namespace) -> int:
    from .engine import EngineOptions, main

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    inputs = [a for a in args.input if a is not None]
    outputs = [a for a in args.output if a is not None]
    if (args.handshake is None) == (not inputs):
        print("enginewire serve-engine: give --handshake ADDR or --input ADDR (with --output), "
              "one of the two (an empty ADDR counts as not given)", file=sys.stderr)
        return 2
    if len(inputs) != len(outputs):
        print("enginewire serve-engine: give one --output per --input", file=sys.stderr)
        return 2
    options = EngineOptions(
        handshake_address=args.handshake,
        input_addresses=inputs,
        output_addresses=outputs,
        rank=args.rank,
        local=reports_local(args),
        headless=args.headless,
        tokens=args.tokens,
        step_delay=args.step_delay,
        handshake_timeout=args.handshake_timeout,
        max_model_len=args.max_model_len,
        dp_size=args.dp_size,
        parent_pid=args.parent_pid,
        version=args.version,
    )
    return main(options)


def _json(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), sort_keys=True)


def utility_arg(text: str) -> Any:
    """A utility argument: JSON when it parses as JSON, the text itself otherwise; JSON that
    nests too deep to read is a usage error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
    except RecursionError:
        raise argparse.ArgumentTypeError("the JSON argument nests too deep") from None


def cmd_frontend(args: argparse.Namespace) -> int:
    import zmq

    from .engine import EngineOptions, spawn_engine
    from .errors import ProtocolError
    from .frontend import ReferenceFrontend

    engines = []
    try:
        opened = ReferenceFrontend(
            args.engines, handshake_address=args.handshake, input_address=args.input,
            output_address=args.output, version=args.version,
        )
    except (zmq.ZMQError, OSError) as error:
        print(f"enginewire frontend: cannot open the front end's sockets: {error}",
              file=sys.stderr)
        return 1
    with opened as frontend:
        try:
            direct: dict[str, Any] = {}
            if frontend.handshake_address is None:
                # A release without the handshake: engines get the input/output addresses.
                print(f"input address: {frontend.input_address}, output address: "
                      f"{frontend.output_address}", file=sys.stderr)
                direct = {"input_addresses": [frontend.input_address],
                          "output_addresses": [frontend.output_address]}
            else:
                print(f"handshake address: {frontend.handshake_address}", file=sys.stderr)
            if args.spawn:
                for rank in range(args.engines):
                    engines.append(spawn_engine(EngineOptions(
                        handshake_address=frontend.handshake_address, rank=rank,
                        dp_size=args.engines, version=args.version, **direct,
                    ), stderr=subprocess.DEVNULL))
            frontend.wait_ready(args.timeout)
            return _run_action(frontend, args)
        except ProtocolError as error:
            print(f"enginewire frontend: {error}", file=sys.stderr)
            return 1
        finally:
            for engine in engines:
                engine.stop()


def _run_action(frontend: Any, args: argparse.Namespace) -> int:
    from . import structs
    from .engine import generation_request

    if args.action == "ready":
        for rank, response in sorted(frontend.ready_responses.items()):
            print(json.dumps({"engine": rank, "ready_response": msgspec.to_builtins(response)},
                             sort_keys=True))
        return 0
    if args.action == "utility":
        from .frontend import UtilityCallError

        call_args = list(args.args)
        status = 0
        for rank in range(frontend.engine_count):
            try:
                result = frontend.call_utility(args.method, call_args, rank, args.timeout)
                print(_json({"engine": rank, "method": args.method, "result": result}))
            except UtilityCallError as error:
                print(_json({"engine": rank, "method": args.method,
                             "error": error.failure_message}))
                status = 1
        return status
    prompt = args.prompt
    pending = set()
    for index in range(args.count):
        request = generation_request(f"cli-{index}", prompt, args.max_tokens,
                                     release=frontend.structs)
        frontend.add_request(request)
        pending.add(request.request_id)
    while pending:
        outputs = frontend.get_output(args.timeout)
        for output in outputs.outputs:
            reason = output.finish_reason
            print(_json({
                "engine": outputs.engine_index,
                "request_id": output.request_id,
                "new_token_ids": output.new_token_ids,
                "finish_reason": None if reason is None else structs.FinishReason(reason).name,
            }))
            if reason is not None:
                pending.discard(output.request_id)
    return 0
