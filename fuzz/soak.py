"""``enginewire soak``: a reliability campaign against live reference peers and rings.

For ``--seconds`` (default 20), in rounds, with one random generator seeded by ``--seed``:

- *engine*: a batch of malformed input messages (:func:`enginewire.fuzz.mutations.malformed`,
  plus hostile payloads: 10,000-level nesting, a 60,000-entry shape) goes over real sockets to a
  live reference engine process, then a valid ADD that must still get its output;
- *front end*: a batch of malformed output messages goes to a live reference front end's output
  socket (from a second PUSH), then the same valid ADD must still get its output there;
- every malformed case is also decoded here: a :class:`ProtocolError` is a *typed error*, any
  other exception a *crash*;
- *ring*: a writer and a reader process share a ring; one of them is killed with SIGKILL at a
  random point, and the survivor must raise ``RingPeerDead`` (a *hang* otherwise);
  ``enginewire ring clean``'s clean-up then removes what the dead process left, at once.

The report: cases tried, typed errors, crashes, hangs, the engine's and front end's resident
memory growth, and leftovers (segments and ipc files of dead processes still there after the
clean-up). Memory growth counts from round :data:`RSS_BASELINE_ROUND`, once the engine has
imported torch for its first tensor. Exit status 1 when there is any crash, hang or leftover,
else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from enginewire.cliargs import non_negative_int, positive_float, writable_file

from .live import INPUT_KINDS, OUTPUT_KINDS, MalformedCases, hostile_inputs, rss_kib, serve_check

#: Resident memory is measured from the start of this round (0: a run shorter than that
#: reports no growth).
RSS_BASELINE_ROUND = 10


@dataclass
class SoakReport:
    seconds: float = 0.0
    rounds: int = 0
    cases: int = 0
    typed_errors: int = 0
    crashes: int = 0
    hangs: int = 0
    ring_kills: int = 0
    peer_dead_detected: int = 0
    engine_rss_growth_kib: int = 0
    frontend_rss_growth_kib: int = 0
    leftovers: int = 0
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.hangs or self.leftovers)

    def render(self) -> str:
        lines = [f"soak: {self.seconds:.0f} s, {self.rounds} rounds",
                 f"  cases tried          {self.cases}",
                 f"  typed errors         {self.typed_errors}",
                 f"  crashes              {self.crashes}",
                 f"  hangs                {self.hangs}",
                 f"  ring kills           {self.ring_kills} "
                 f"({self.peer_dead_detected} dead peers detected)",
                 f"  engine RSS growth    {self.engine_rss_growth_kib} KiB",
                 f"  front end RSS growth {self.frontend_rss_growth_kib} KiB",
                 f"  leftovers            {self.leftovers}"]
        lines += [f"  finding: {text}" for text in self.findings[:20]]
        lines.append("ok" if self.ok else "FAILED")
        return "\n".join(lines)


def _judge(codec: Any, kind: str, frames: list[bytes], report: SoakReport) -> None:
    from enginewire.reference.errors import ProtocolError

    report.cases += 1
    try:
        codec.decode(kind, frames)
    except ProtocolError:
        report.typed_errors += 1
    except Exception as exc:  # noqa: BLE001 - anything else is the finding
        report.crashes += 1
        report.findings.append(f"decoding a malformed {kind}: {type(exc).__name__}: {exc}"[:300])


_RING_WRITER = textwrap.dedent("""
    import pickle, sys, time
    from enginewire.reference.ring import MessageQueue
    mq = MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2)
    sys.stdout.write(pickle.dumps(mq.export_handle()).hex() + "\\n"); sys.stdout.flush()
    mq.wait_until_ready(30)
    i = 0
    while True:
        mq.enqueue(i, timeout=30); i += 1
""")

_RING_READER = textwrap.dedent("""
    import pickle, sys, time
    from enginewire.reference.ring import MessageQueue
    mq = MessageQueue.create_from_handle(pickle.loads(bytes.fromhex(sys.argv[1])), 0)
    mq.wait_until_ready(30)
    print("ready", flush=True)
    while True:
        mq.dequeue(timeout=30); time.sleep(0.01)
""")


def _ring_round(rng: random.Random, report: SoakReport, limit: float) -> None:
    """One writer and one reader process; kill one at a random point; the other must notice."""
    from enginewire.reference.ring import MessageQueue

    python = [sys.executable, "-c"]
    kill_writer = rng.random() < 0.5
    if kill_writer:
        other = subprocess.Popen([*python, _RING_WRITER], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            assert other.stdout is not None
            handle = pickle_loads_hex(other.stdout.readline().strip())
            with MessageQueue.create_from_handle(handle, 0) as reader:
                reader.wait_until_ready(limit)
                time.sleep(rng.uniform(0, 0.2))
                os.killpg(other.pid, signal.SIGKILL)
                report.ring_kills += 1
                _expect_dead(lambda: reader.dequeue(timeout=limit), report, "reader", limit)
        finally:
            _reap(other)
    else:
        with MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2) as writer:
            other = subprocess.Popen([*python, _RING_READER, pickle_dumps_hex(
                writer.export_handle())], stdout=subprocess.PIPE, text=True,
                start_new_session=True)
            try:
                writer.wait_until_ready(limit)
                time.sleep(rng.uniform(0, 0.2))
                os.killpg(other.pid, signal.SIGKILL)
                report.ring_kills += 1

                def fill() -> None:
                    while True:
                        writer.enqueue(0, timeout=limit)

                _expect_dead(fill, report, "writer", limit)
            finally:
                _reap(other)


def _expect_dead(wait: Any, report: SoakReport, end: str, limit: float) -> None:
    from enginewire.reference.errors import ProtocolTimeout, RingPeerDead

    try:
        while True:
            wait()
    except RingPeerDead:
        report.peer_dead_detected += 1
    except ProtocolTimeout:
        report.hangs += 1
        report.findings.append(f"the ring's {end} waited {limit:g} s for a dead peer")
    except Exception as exc:  # noqa: BLE001
        report.crashes += 1
        report.findings.append(f"the ring's {end}: {type(exc).__name__}: {exc}"[:300])


def pickle_dumps_hex(value: Any) -> str:
    import pickle

    return pickle.dumps(value).hex()


def pickle_loads_hex(text: str) -> Any:
    import pickle

    return pickle.loads(bytes.fromhex(text))


def _reap(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


def run_soak(seconds: float, seed: int, *, batch: int = 8, timeout: float = 10.0,
             ring_every: int = 3, progress: Any = None) -> SoakReport:
    """Run the campaign for about ``seconds``; see the module docstring."""
    import zmq

    from enginewire.reference.codec import Codec
    from enginewire.reference.engine import EngineOptions, spawn_engine
    from enginewire.reference.frontend import ReferenceFrontend
    from enginewire.reference.ring.clean import clean, leftovers

    rng = random.Random(seed)
    cases = MalformedCases(rng)
    codec = Codec(tensors="wire")
    hostile = hostile_inputs()
    report = SoakReport()
    context = zmq.Context()
    with ReferenceFrontend(1) as frontend:
        engine = spawn_engine(EngineOptions(handshake_address=frontend.handshake_address),
                              stderr=subprocess.DEVNULL)
        pusher = context.socket(zmq.PUSH)
        pusher.setsockopt(zmq.LINGER, 0)
        try:
            frontend.wait_ready(30.0)
            pusher.connect(frontend.output_address)
            problem = serve_check(frontend, timeout, "warm-up")
            # The campaign's time starts once the peers serve: a slow start (a busy machine)
            # must not leave it no round at all.
            started = time.monotonic()
            engine_rss0 = frontend_rss0 = 0
            while problem is None and time.monotonic() - started < seconds:
                report.rounds += 1
                if report.rounds == RSS_BASELINE_ROUND:
                    # The baseline after some rounds: imports (torch, at the first tensor a
                    # malformed case carries) and caches are in place, so growth from here is
                    # what the traffic costs.
                    engine_rss0, frontend_rss0 = rss_kib(engine.pid), rss_kib(os.getpid())
                inputs = cases.draw(INPUT_KINDS, batch)
                if report.rounds % 5 == 1:
                    inputs += hostile
                for kind, frames in inputs:
                    _judge(codec, kind, frames, report)
                    frontend.send_raw(0, frames)
                for kind, frames in cases.draw(OUTPUT_KINDS, batch):
                    _judge(codec, kind, frames, report)
                    pusher.send_multipart(frames)
                problem = serve_check(frontend, timeout, str(report.rounds))
                if problem is None and not engine.alive():
                    problem = "the engine process died"
                if report.rounds % ring_every == 0:
                    _ring_round(rng, report, timeout)
                    clean()  # what the killed process left, as a later process would
                    report.leftovers = max(report.leftovers, len(leftovers()))
                if progress is not None:
                    progress(report)
            if problem is not None:
                report.hangs += 1
                report.findings.append(problem)
            if engine_rss0:
                report.engine_rss_growth_kib = rss_kib(engine.pid) - engine_rss0
                report.frontend_rss_growth_kib = rss_kib(os.getpid()) - frontend_rss0
        finally:
            pusher.close(0)
            engine.stop(10.0)
            context.term()
    clean()
    report.leftovers = max(report.leftovers, len(leftovers()))
    report.seconds = time.monotonic() - started
    return report


def register(subparsers: argparse._SubParsersAction) -> None:
    soak = subparsers.add_parser(
        "soak", help="reliability campaign: malformed traffic at live peers, killed rings",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    soak.add_argument("--seconds", type=positive_float, default=20.0,
                      help="how long to run (default: %(default)s)")
    soak.add_argument("--seed", type=non_negative_int, default=0)
    soak.add_argument("--batch", type=non_negative_int, default=8,
                      help="malformed messages per channel per round (default: %(default)s)")
    soak.add_argument("--timeout", type=positive_float, default=10.0,
                      help="seconds a valid request or a dead-peer detection may take")
    soak.add_argument("--engine-flood", metavar="N", type=non_negative_int, default=0,
                      help="instead of the campaign: send N malformed input messages to one "
                           "live engine as fast as it takes them, sampling its RSS "
                           "(enginewire.fuzz.flood)")
    soak.add_argument("--json", metavar="PATH", type=writable_file,
                      help="write the report as JSON here")
    soak.set_defaults(handler=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    if args.engine_flood:
        from .flood import run_flood

        flood = run_flood(args.engine_flood, args.seed, timeout=max(args.timeout, 30.0),
                          progress=True)
        print(flood.render())
        if args.json:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump({**asdict(flood), "rate": flood.rate, "ok": flood.ok}, out, indent=2)
        return 0 if flood.ok else 1
    report = run_soak(args.seconds, args.seed, batch=args.batch, timeout=args.timeout)
    print(report.render())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(asdict(report), out, indent=2)
    return 0 if report.ok else 1
