"""Malformed-input fuzzing campaigns against a target's decoders and engine.

:func:`fuzz_codec` feeds :func:`~enginewire.fuzz.mutations.malformed` cases of every kind to a
target's ``codec.decode`` (the target contract of :mod:`enginewire.conformance.targets.contract`).
Each case must either decode or raise an error that carries ``.clause`` naming a clause the case
breaks (``--strict``: it must raise). A finding is

- ``wrong-clause``: the error names another clause;
- ``untyped-error``: an exception without a ``.clause`` (IndexError, AssertionError, ...);
- ``hang``: no answer within the per-case time limit (the decode runs in a worker thread);
- ``accepted`` (strict only): the malformed frames decoded.

Cases with the same kind, mutation, problem and answer form one finding. Each finding is shrunk
with :func:`hypothesis.find` (for at most ``shrink_seconds``) and its smallest case is kept in the
example database, as JSON with the frames in hex, under a key per target and kind: the next
campaign on the same database replays those cases first and drops the ones that no longer
reproduce.

:func:`fuzz_engine` starts the target's engine against a reference front end
(:class:`~enginewire.reference.frontend.ReferenceFrontend`), sends batches of malformed input
messages on the input channel, and after each batch a valid ADD whose output must arrive. An
engine that dies, sends ENGINE_CORE_DEAD or stops answering is a finding; the batch is then
replayed one message at a time against a fresh engine to name the message that does it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import HypothesisException

from enginewire.fuzz.mutations import malformed
from enginewire.fuzz.strategies import Malformed

Status = Literal["rejected", "accepted", "wrong-clause", "untyped-error", "hang"]
PROBLEMS: tuple[Status, ...] = ("wrong-clause", "untyped-error", "hang", "accepted")

#: Where campaigns keep Hypothesis's example database unless told otherwise.
DEFAULT_DATABASE = ".hypothesis/enginewire-fuzz"
#: Seconds one decode may take before it counts as a hang.
DEFAULT_CASE_TIMEOUT = 2.0

_QUIET = list(HealthCheck)


# --- one case ---------------------------------------------------------------------------------


class CaseTimeout(Exception):
    """A call did not return within its time limit (it keeps running in its daemon thread)."""


def call_with_timeout(func: Callable[[], Any], timeout: float) -> Any:
    """``func()`` in a daemon thread; its result, its exception re-raised, or
    :class:`CaseTimeout` after ``timeout`` seconds."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=run, name="enginewire-fuzz-case", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CaseTimeout(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@dataclass(frozen=True)
class Outcome:
    """What a decoder did with one malformed case."""

    status: Status
    #: The clause the error named, or the exception's type name for an untyped error.
    got: str | None = None
    message: str | None = None

    def problem(self, strict: bool) -> bool:
        return self.status in ("wrong-clause", "untyped-error", "hang") or (
            strict and self.status == "accepted"
        )


def judge(decode: Callable[[str, list[bytes]], Any], case: Malformed,
          timeout: float = DEFAULT_CASE_TIMEOUT) -> Outcome:
    """Decode ``case`` with ``decode(kind, frames)`` and classify what happened."""
    try:
        call_with_timeout(lambda: decode(case.kind, list(case.frames)), timeout)
    except CaseTimeout as exc:
        return Outcome("hang", None, str(exc))
    except Exception as exc:  # noqa: BLE001 - every exception is evidence
        clause = getattr(exc, "clause", None)
        text = f"{type(exc).__name__}: {exc}"
        if not isinstance(clause, str):
            return Outcome("untyped-error", type(exc).__name__, text[:500])
        if clause in case.accepted:
            return Outcome("rejected", clause, text[:500])
        return Outcome("wrong-clause", clause, text[:500])
    return Outcome("accepted")


# --- findings and reports ---------------------------------------------------------------------


@dataclass
class Finding:
    """One kind of misbehaviour, with the smallest input found that shows it."""

    surface: str
    kind: str
    problem: str
    mutation: str
    expected: tuple[str, ...]
    got: str | None
    message: str | None
    frames: list[tuple[bytes, ...]]
    description: str
    hits: int = 1
    #: True when the input was shrunk, or replayed from the example database.
    minimized: bool = False
    #: The malformed case itself (codec findings).
    case: Malformed | None = None

    def signature(self) -> tuple[str, str, str, str, str]:
        return (self.surface, self.kind, self.mutation, self.problem, self.got or "")

    def render(self, number: int) -> str:
        lines = [f"FINDING {number}: [{self.surface}] {self.kind}: {self.problem} "
                 f"({self.hits} case{'s' if self.hits != 1 else ''}"
                 f"{', minimized' if self.minimized else ''})",
                 f"  mutation {self.mutation}: {self.description}",
                 f"  expected clause: {' or '.join(self.expected) or '-'}"]
        if self.got or self.message:
            lines.append(f"  got: {self.message or self.got}")
        for index, message in enumerate(self.frames):
            prefix = f"  message {index + 1}: " if len(self.frames) > 1 else "  "
            for frame_index, frame in enumerate(message):
                lines.append(f"{prefix}frame {frame_index}: {frame.hex() or '(empty)'}")
        return "\n".join(lines)


@dataclass
class Report:
    """What a campaign did: how many cases, which findings, what it could not run."""

    cases: int = 0
    findings: list[Finding] = field(default_factory=list)
    accepted: int = 0
    notes: list[str] = field(default_factory=list)

    def merge(self, other: Report) -> None:
        self.cases += other.cases
        self.findings += other.findings
        self.accepted += other.accepted
        self.notes += other.notes

    def summary(self) -> str:
        return f"{self.cases} cases, {len(self.findings)} findings"

    def render(self) -> str:
        parts = [f"note: {note}" for note in self.notes]
        parts += [f.render(i + 1) for i, f in enumerate(self.findings)]
        if self.accepted:
            parts.append(f"{self.accepted} malformed case(s) decoded without an error "
                         "(a finding only with --strict)")
        parts.append(self.summary())
        return "\n".join(parts)


def open_database(path: str | None) -> ExampleDatabase | None:
    """The example database at ``path`` (None: no database)."""
    return DirectoryBasedExampleDatabase(path) if path else None


# --- codec ------------------------------------------------------------------------------------


@dataclass
class CodecCampaign:
    """Settings of one codec campaign (see :func:`fuzz_codec`)."""

    target_name: str
    max_examples: int = 100
    seed: int | None = None
    database: ExampleDatabase | None = None
    timeout: float = DEFAULT_CASE_TIMEOUT
    strict: bool = False
    routed: bool = False
    #: Seconds spent shrinking each finding (0: report the smallest explored case).
    shrink_seconds: float = 5.0
    progress: Callable[[str], None] | None = None


def _index_key(campaign: CodecCampaign, kind: str) -> bytes:
    return f"enginewire-fuzz/codec/{campaign.target_name}/{kind}".encode()


def case_to_bytes(case: Malformed) -> bytes:
    """A malformed case as JSON (frames in hex), the form the example database keeps."""
    return json.dumps({
        "kind": case.kind, "frames": case.hex_frames(), "clause": case.clause,
        "also": list(case.also), "description": case.description,
        "mutation": case.mutation, "routed": case.routed,
    }, sort_keys=True).encode()


def case_from_bytes(data: bytes) -> Malformed:
    """The inverse of :func:`case_to_bytes`."""
    raw = json.loads(data)
    return Malformed(kind=raw["kind"], frames=tuple(bytes.fromhex(f) for f in raw["frames"]),
                     clause=raw["clause"], description=raw["description"],
                     mutation=raw["mutation"], also=tuple(raw["also"]),
                     routed=bool(raw["routed"]))


def _probe(decode: Callable[[str, list[bytes]], Any], kind: str, timeout: float) -> str | None:
    """None if the target decodes a valid message of ``kind``, else why not."""
    from enginewire.fuzz.strategies import messages
    from enginewire.reference.codec import default_codec

    # The smallest valid message (generate, then shrink). No explain phase: it only annotates
    # a failing test's report, and it cost most of a probe's time.
    value = find(messages(kind), lambda _: True,
                 settings=settings(database=None, max_examples=10, suppress_health_check=_QUIET,
                                   phases=[Phase.generate, Phase.shrink]))
    frames = [bytes(memoryview(f).cast("B")) for f in default_codec().encode(kind, value)]
    try:
        call_with_timeout(lambda: decode(kind, frames), timeout)
    except CaseTimeout:
        return f"decoding a valid {kind} message hung"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def fuzz_codec(decode: Callable[[str, list[bytes]], Any], kind_names: Iterable[str],
               campaign: CodecCampaign) -> Report:
    """Run malformed cases of every kind in ``kind_names`` through ``decode(kind, frames)``."""
    report = Report()
    for kind in kind_names:
        problem = _probe(decode, kind, campaign.timeout)
        if problem is not None:
            report.notes.append(f"{kind}: skipped, the target does not decode valid frames "
                                f"of this kind ({problem})")
            continue
        kind_report = _fuzz_kind(decode, kind, campaign)
        if campaign.progress:
            campaign.progress(f"{kind}: {kind_report.summary()}")
        report.merge(kind_report)
    return report


def _signature(case: Malformed, outcome: Outcome) -> tuple[str, str, str]:
    return (case.mutation, outcome.status, outcome.got or "")


def _fuzz_kind(decode: Callable[[str, list[bytes]], Any], kind: str,
               campaign: CodecCampaign) -> Report:
    report = Report()
    found: dict[tuple[str, str, str], Finding] = {}
    hung = threading.Event()

    def record(case: Malformed, outcome: Outcome, *, replayed: bool = False) -> None:
        report.cases += 1
        if outcome.status == "accepted":
            report.accepted += 1
        if not outcome.problem(campaign.strict):
            return
        if outcome.status == "hang":
            hung.set()
        signature = _signature(case, outcome)
        current = found.get(signature)
        if current is not None:
            current.hits += 1
            if _size(case.frames) < _size(current.frames[0]) and not current.minimized:
                _show(current, case)
            return
        found[signature] = _show(Finding(
            surface="codec", kind=kind, problem=outcome.status, mutation=case.mutation,
            expected=(case.clause, *case.also), got=outcome.got, message=outcome.message,
            frames=[case.frames], description=case.description, minimized=replayed,
        ), case)

    # Findings of earlier campaigns replay first, from the frames the database keeps; one
    # that no longer reproduces leaves the database.
    replayed: dict[tuple[str, str, str], bytes] = {}
    for raw, case in _stored_cases(campaign, kind):
        if hung.is_set():
            break
        outcome = judge(decode, case, campaign.timeout)
        if outcome.problem(campaign.strict):
            replayed.setdefault(_signature(case, outcome), raw)
            record(case, outcome, replayed=True)
        else:
            report.cases += 1
            assert campaign.database is not None
            campaign.database.delete(_index_key(campaign, kind), raw)

    strategy = malformed(kind, routed=campaign.routed)

    @settings(max_examples=campaign.max_examples, deadline=None, database=None,
              suppress_health_check=_QUIET, phases=[Phase.generate])
    @given(strategy)
    def explore(case: Malformed) -> None:
        if hung.is_set():
            return  # a hung decoder thread may hold locks: stop feeding this kind
        record(case, judge(decode, case, campaign.timeout))

    if campaign.seed is not None:
        explore = hypothesis_seed(campaign.seed)(explore)
    explore()

    for signature, finding in found.items():
        if finding.problem == "hang":
            continue  # every shrink step would wait out the time limit
        if not finding.minimized and campaign.shrink_seconds > 0:
            _shrink(decode, signature, finding, campaign, strategy)
        if campaign.database is not None and finding.case is not None:
            kept = case_to_bytes(finding.case)
            campaign.database.save(_index_key(campaign, kind), kept)
            older = replayed.get(signature)
            if older is not None and older != kept:
                campaign.database.delete(_index_key(campaign, kind), older)
    report.findings.extend(found.values())
    return report


def _size(frames: Sequence[bytes]) -> int:
    return sum(len(f) for f in frames) + len(frames)


class _ShrinkBudgetSpent(Exception):
    """Raised from the shrink condition once its time is up."""


def _shrink(decode: Callable[[str, list[bytes]], Any], signature: tuple[str, str, str],
            finding: Finding, campaign: CodecCampaign,
            strategy: st.SearchStrategy[Malformed]) -> None:
    """Replace the finding's example by the smallest case :func:`hypothesis.find` reaches with
    the same signature within ``campaign.shrink_seconds``."""
    deadline = time.monotonic() + campaign.shrink_seconds
    best: list[Malformed] = []

    def condition(case: Malformed) -> bool:
        if time.monotonic() > deadline:
            raise _ShrinkBudgetSpent
        if case.mutation != signature[0]:
            return False
        if _signature(case, judge(decode, case, campaign.timeout)) != signature:
            return False
        if not best or _size(case.frames) <= _size(best[0].frames):
            best[:] = [case]
        return True

    try:
        find(strategy, condition, settings=settings(
            database=None, max_examples=max(200, 4 * campaign.max_examples),
            suppress_health_check=_QUIET, deadline=None))
    except (_ShrinkBudgetSpent, HypothesisException, AssertionError):
        pass
    if best and _size(best[0].frames) <= _size(finding.frames[0]):
        _show(finding, best[0])
        finding.minimized = True
        finding.message = judge(decode, best[0], campaign.timeout).message or finding.message


def _show(finding: Finding, case: Malformed) -> Finding:
    """Make ``case`` the evidence of ``finding``."""
    finding.case, finding.frames, finding.description = case, [case.frames], case.description
    return finding


def _stored_cases(campaign: CodecCampaign, kind: str) -> list[tuple[bytes, Malformed]]:
    if campaign.database is None:
        return []
    out = []
    for raw in campaign.database.fetch(_index_key(campaign, kind)):
        try:
            out.append((raw, case_from_bytes(raw)))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda item: item[0])


# --- engine -----------------------------------------------------------------------------------

#: Input-channel kinds whose malformed variants the engine campaign sends.
ENGINE_INPUT_KINDS = ("add", "abort", "utility")


@dataclass
class EngineCampaign:
    """Settings of one engine campaign (see :func:`fuzz_engine`)."""

    target_name: str
    max_examples: int = 20
    seed: int | None = None
    database: ExampleDatabase | None = None
    #: Seconds to wait for the valid ADD's output after a batch.
    timeout: float = 10.0
    #: Seconds the handshake may take.
    startup_timeout: float = 30.0
    batch_size: int = 5
    progress: Callable[[str], None] | None = None


class EngineStopped(AssertionError):
    """The engine stopped serving after a batch of malformed messages."""


class _EngineUnderTest:
    """A reference front end and the target's engine, restarted on demand."""

    def __init__(self, surface: Any, campaign: EngineCampaign) -> None:
        self.surface = surface
        self.campaign = campaign
        self.frontend: Any = None
        self.peer: Any = None
        self.requests = 0

    def ensure(self) -> None:
        if self.frontend is not None and self.peer is not None and self.peer.alive() \
                and not self.frontend.dead:
            return
        self.close()
        from enginewire.conformance.targets.contract import EngineLaunch
        from enginewire.reference.frontend import ReferenceFrontend

        self.frontend = ReferenceFrontend(1)
        self.peer = self.surface.start_engine(
            EngineLaunch(handshake_address=self.frontend.handshake_address))
        self.frontend.wait_ready(self.campaign.startup_timeout)

    def serve_check(self) -> str | None:
        """Send a valid ADD and wait for its last output; None if it came, else what went
        wrong."""
        from enginewire.reference.engine import generation_request
        from enginewire.reference.errors import EngineDeadError, ProtocolTimeout

        self.requests += 1
        request_id = f"enginewire-fuzz-{uuid.uuid4().hex[:8]}-{self.requests}"
        frontend = self.frontend
        try:
            frontend.add_request(generation_request(request_id, max_tokens=1))
        except EngineDeadError:
            return "the engine had sent ENGINE_CORE_DEAD"
        deadline = time.monotonic() + self.campaign.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                alive = self.peer.alive()
                return ("no output for a valid ADD within "
                        f"{self.campaign.timeout:g} s (engine {'alive' if alive else 'gone'})")
            try:
                outputs = frontend.get_output(remaining)
            except ProtocolTimeout:
                continue
            except EngineDeadError:
                return "the engine sent ENGINE_CORE_DEAD"
            except Exception as exc:  # noqa: BLE001 - a broken output is a finding too
                return f"reading outputs failed: {type(exc).__name__}: {exc}"
            for output in outputs.outputs or ():
                if output.request_id == request_id and output.finish_reason is not None:
                    return None

    def send(self, cases: Sequence[Malformed]) -> None:
        for case in cases:
            self.frontend.send_raw(0, list(case.frames))

    def close(self) -> None:
        if self.peer is not None:
            try:
                self.peer.stop(5.0)
            finally:
                self.peer = None
        if self.frontend is not None:
            self.frontend.close()
            self.frontend = None


def fuzz_engine(surface: Any, campaign: EngineCampaign) -> Report:
    """Send batches of malformed input messages to the target's engine; after each batch a
    valid ADD must still get its output."""
    report = Report()
    engine = _EngineUnderTest(surface, campaign)
    batch = st.lists(st.one_of(*(malformed(k) for k in ENGINE_INPUT_KINDS)),
                     min_size=1, max_size=campaign.batch_size)
    failures: list[tuple[list[Malformed], str]] = []

    @settings(max_examples=campaign.max_examples, deadline=None,
              database=campaign.database, suppress_health_check=_QUIET,
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(batch)
    def explore(cases: list[Malformed]) -> None:
        try:
            engine.ensure()
        except Exception as exc:  # noqa: BLE001 - a start-up failure ends the campaign
            failures.append(([], f"the engine did not start: {type(exc).__name__}: {exc}"))
            raise EngineStopped(str(exc)) from exc
        engine.send(cases)
        report.cases += len(cases)
        problem = engine.serve_check()
        if problem is not None:
            failures.append((cases, problem))
            raise EngineStopped(problem)

    if campaign.seed is not None:
        explore = hypothesis_seed(campaign.seed)(explore)
    # One database key per target (the attribute hypothesis.find sets too): a failing batch
    # replays first on the next campaign against the same target.
    explore._hypothesis_internal_database_key = (  # type: ignore[attr-defined]
        f"enginewire-fuzz/engine/{campaign.target_name}".encode())
    try:
        try:
            explore()
        except (EngineStopped, HypothesisException):
            pass  # the failures list holds what happened (Flaky: it did not happen twice)
        if failures:
            cases, problem = failures[0]
            if cases:
                report.findings.append(_reduce(engine, cases, problem))
            else:
                report.findings.append(Finding(
                    surface="engine", kind="-", problem="did-not-start", mutation="-",
                    expected=(), got=None, message=problem, frames=[],
                    description="the engine did not complete the handshake"))
    finally:
        engine.close()
    return report


def _reduce(engine: _EngineUnderTest, cases: list[Malformed], problem: str) -> Finding:
    """The first single message of a failing batch that stops the engine by itself, else the
    whole batch."""
    for case in cases:
        engine.close()
        try:
            engine.ensure()
        except Exception:  # noqa: BLE001 - keep the whole batch as the evidence
            break
        engine.send([case])
        single = engine.serve_check()
        if single is not None:
            return Finding(surface="engine", kind=case.kind, problem="stopped-serving",
                           mutation=case.mutation, expected=tuple(sorted(case.accepted)),
                           got=None, message=single, frames=[case.frames],
                           description=case.description, minimized=True)
    first = cases[0]
    return Finding(surface="engine", kind=",".join(sorted({c.kind for c in cases})),
                   problem="stopped-serving", mutation="batch", expected=(), got=None,
                   message=problem, frames=[c.frames for c in cases],
                   description=f"{len(cases)} malformed messages, starting with "
                               f"{first.description}")

