"""Building blocks the check modules share: calling a codec with evidence on failure,
reading socket options, running a blocking call on a thread."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from enginewire.conformance.framework.evidence import in_release, note_not_implemented
from enginewire.conformance.framework.registry import (
    CheckFailure,
    CheckSkip,
    NotInRelease,
    Reproduction,
)
from enginewire.conformance.oracle.samples import Sampler, minimal_outputs, minimal_request
from enginewire.conformance.oracle.strict import layout_releases, type_problems
from enginewire.conformance.oracle.values import complete, differences, neutral
from enginewire.conformance.oracle.wire import (
    THRESHOLD_DEFAULT,
    compare_wire,
    expected_wire,
    raw_decode,
)
from enginewire.conformance.targets.contract import is_rejection


def as_bytes(frames: Sequence[Any]) -> list[bytes]:
    """Frames as ``bytes`` (copies memoryviews and zmq frames)."""
    out = []
    for frame in frames:
        if isinstance(frame, bytes):
            out.append(frame)
        elif hasattr(frame, "bytes") and not isinstance(frame, bytearray | memoryview):
            out.append(frame.bytes)
        else:
            out.append(bytes(memoryview(frame).cast("B")))
    return out


def encode(codec: Any, kind: str, value: Any, **notes: Any) -> list[bytes]:
    """``codec.encode(kind, value)`` as bytes; an exception becomes a :class:`CheckFailure`."""
    try:
        frames = codec.encode(kind, value)
    except Exception as exc:  # noqa: BLE001 - the target's exception is the evidence
        raise CheckFailure(
            f"encode({kind!r}) raised {type(exc).__name__}: {exc}",
            Reproduction(received=f"{type(exc).__name__}: {exc}",
                         notes={"value": value, **notes}),
        ) from exc
    if not isinstance(frames, list | tuple) or not frames:
        raise CheckFailure(
            f"encode({kind!r}) must return a non-empty list of frames, got {type(frames).__name__}",
            Reproduction(received=frames, notes={"value": value}),
        )
    return as_bytes(frames)


def decode(codec: Any, kind: str, frames: Sequence[bytes], **notes: Any) -> Any:
    """``codec.decode(kind, frames)``; an exception becomes a :class:`CheckFailure`."""
    try:
        return codec.decode(kind, list(frames))
    except Exception as exc:  # noqa: BLE001
        clause = getattr(exc, "clause", None)
        raise CheckFailure(
            f"decode({kind!r}) rejected valid frames: {type(exc).__name__}"
            + (f" [{clause}]" if clause else "") + f": {exc}",
            Reproduction(sent=frames, received=f"{type(exc).__name__}: {exc}", notes=notes),
        ) from exc


def expect_rejection(
    codec: Any, kind: str, frames: Sequence[bytes], clause: str | Sequence[str], why: str,
    *, spec: Any = None, **notes: Any,
) -> BaseException:
    """Decoding ``frames`` must raise; an error that names a clause must name ``clause``. The
    refusal passes only when the codec decodes a valid ``kind`` (:func:`require_kind_evidence`,
    ``spec``: the run's spec, default the reference release's)."""
    accepted = (clause,) if isinstance(clause, str) else tuple(clause)
    try:
        value = codec.decode(kind, list(frames))
    except Exception as exc:  # noqa: BLE001
        require_rejection(exc, f"{why}: decode({kind!r})", sent=frames, codec=codec, kind=kind,
                          spec=spec, **notes)
        named = getattr(exc, "clause", None)
        if named is not None and named not in accepted:
            raise CheckFailure(
                f"{why}: rejected, but citing clause {named} instead of {' or '.join(accepted)}",
                Reproduction(sent=frames, received=f"{type(exc).__name__}: {exc}", notes=notes),
            ) from exc
        return exc
    raise CheckFailure(
        f"{why}: decode({kind!r}) accepted the frames",
        Reproduction(sent=frames, received=neutral(value), notes=notes),
    )


def require_rejection(exc: BaseException, what: str, *, sent: Sequence[bytes] | None = None,
                      codec: Any = None, kind: str | None = None, spec: Any = None,
                      operation: str = "decode", **notes: Any) -> None:
    """``exc`` counts as refusing invalid input only when it is the contract's rejection
    (``contract.is_rejection``) and, given ``codec`` and ``kind``, the codec demonstrably
    implements the kind (:func:`require_kind_evidence`). A ``NotImplementedError`` is
    re-raised: the runner reports the check NOT IMPLEMENTED, never passed."""
    if not is_rejection(exc):
        raise exc
    if codec is not None and kind is not None:
        require_kind_evidence(codec, kind, spec, operation, refused=what)


class NoEvidence(NotImplementedError):
    """A target refused invalid input of a kind but also refuses a valid message of that kind:
    the refusal shows nothing about its checks of the kind (a stub that refuses everything
    would pass), so the check is NOT IMPLEMENTED."""


#: A valid value of each message kind of the frames surface, written for the newest layout;
#: None for a kind of literal frames only. :func:`message_sample` lays it out as a release
#: sends it.
MESSAGE_SAMPLES: dict[str, Any] = {
    "hello": {"status": "HELLO", "local": True, "headless": False},
    "ready": {"status": "READY", "local": True, "headless": False},
    "init": {"addresses": {"inputs": ["ipc:///tmp/ew-in"], "outputs": ["ipc:///tmp/ew-out"]},
             "parallel_config": {}},
    "add": minimal_request(),
    "abort": ["req-0", "req-1"],
    "utility": [0, 7, "is_sleeping", []],
    "outputs": minimal_outputs(),
    "engine_core_dead": None,
    "utility_reply": {"engine_index": 0, "outputs": [], "timestamp": 2.5,
                      "utility_output": {"call_id": 9, "failure_message": None,
                                         "result": {"type_info": None, "value": [1, 2]}}},
    "start_dp_wave": [3, 1],
    "coordinator_outputs": {"engine_index": 1, "outputs": [], "timestamp": 3.5,
                            "wave_complete": 2},
    "stats_update": [[[1, 2, 0.5], [0, 3, 0.25]], 4, True],
    "coordinator_subscribe": None,
    "coordinator_unsubscribe": None,
    "coordinator_ready": None,
    "stats_subscribe": None,
    "stats_unsubscribe": None,
}


#: The message kinds :func:`message_sample` builds.
SAMPLED_KINDS = frozenset({*MESSAGE_SAMPLES, "ready_response"})


def message_spec(spec: Any, kind: str) -> Any:
    """The frames surface's message ``kind`` (CheckSkip where the spec has none)."""
    for message in spec.surface("frames").messages:
        if message.kind == kind:
            return message
    raise CheckSkip(f"the spec has no message kind {kind!r}")


def ready_form(spec: Any) -> str:
    """How the run's release sends the ready response (``history/constants.toml``
    ``ready_response``): ``struct`` (a msgpack EngineCoreReadyResponse), ``empty`` (one empty
    frame) or ``READY`` (the literal bytes); NOT APPLICABLE where it sends none, or only the
    handshake's READY map (``handshake``)."""
    from enginewire.spec.history.release_facts import ready_response_at

    form = ready_response_at(spec.version)
    if form == "none":
        raise NotInRelease(f"vLLM {spec.version} has no ready response (its engine sends "
                           "nothing first on an input socket)")
    if form == "handshake":
        raise NotInRelease(f"vLLM {spec.version} has no ready response of its own (its engine "
                           "holds the HELLO/READY handshake on the input socket itself)")
    return form


def require_message(spec: Any, *kinds: str) -> None:
    """NOT APPLICABLE (:class:`NotInRelease`, saying why) where ``spec``'s release lacks one
    of the message ``kinds`` (``release_facts.message_gap``: ENGINE_CORE_DEAD before 0.8.5,
    the DP coordinator's messages before 0.9.1)."""
    from enginewire.spec.history.release_facts import message_gap

    for kind in kinds:
        gap = message_gap(spec, kind)
        if gap is not None:
            raise NotInRelease(gap)


def message_sample(spec: Any, kind: str) -> Any:
    """The sample of message ``kind`` (:data:`MESSAGE_SAMPLES`) laid out as the run's release
    sends it; the ready response of a release that sends a literal frame is None (the codec
    writes the literal). NOT APPLICABLE (:class:`NotInRelease`, saying why) where the release
    has no such message: no HELLO/READY handshake, no ready response, ENGINE_CORE_DEAD or a
    DP coordinator's message before the release had them (``message_gap``), or a value the
    release has no field for."""
    from enginewire.conformance.peers.zmq_peers import READY_KEY_VALUES
    from enginewire.spec.history.release_facts import (
        engine_handshake_map,
        handshake_message_at,
    )

    require_message(spec, kind)
    if kind == "ready_response":
        if ready_form(spec) != "struct":
            return None
        return Sampler(spec).required("EngineCoreReadyResponse")
    if kind in ("hello", "ready"):
        message = handshake_message_at(spec, kind.upper())
        if message is None:
            raise NotInRelease(f"vLLM {spec.version} has no HELLO/READY handshake")
        sample = MESSAGE_SAMPLES[kind]
        return engine_handshake_map(message, local=sample["local"],
                                    headless=sample["headless"], values=READY_KEY_VALUES)
    return in_release(MESSAGE_SAMPLES[kind], kind, spec)


#: (release, kind) -> a valid sample, None (the suite has none) or the reason the release
#: has no such message (NOT APPLICABLE).
_SAMPLES: dict[tuple[str, str], tuple[Any, list[bytes]] | str | None] = {}
_SAMPLES_LOCK = threading.Lock()
#: No value built (a literal-only message's value is None).
_NO_VALUE = object()


def valid_sample(kind: str, spec: Any) -> tuple[Any, list[bytes]] | None:
    """A valid message of ``kind`` for ``spec``'s release: ``(neutral value, frames)``. A
    golden vector of the kind recorded for that release that must decode, else the message's
    sample laid out as the release sends it (:func:`message_sample`: the release's plain init
    map, a UTILITY call in the release's items, HELLO with the release's keys, a literal
    frame) or the spec's sample of the kind's struct (its required fields), as the reference
    codec of that release encodes it; None when the suite has none of these. Raises
    :class:`NotInRelease` (the check is NOT APPLICABLE, saying why) where the release has no
    such message (:func:`message_sample`)."""
    from enginewire.conformance.oracle.golden import load_vectors, payload_type

    key = (str(spec.version), kind)
    with _SAMPLES_LOCK:
        known = key in _SAMPLES
        cached = _SAMPLES.get(key)
    if isinstance(cached, str):
        raise NotInRelease(cached)
    if known:
        return cached
    found: tuple[Any, list[bytes]] | str | None = None
    golden = [v for v in load_vectors() if v.kind == kind and v.expect == "decode"
              and v.vllm_version == spec.version]
    if golden:
        vector = min(golden, key=lambda v: sum(len(f) for f in v.frames))
        found = (vector.value, list(vector.frames))
    else:
        from enginewire.spec.history.release_facts import message_gap

        messages = {m.kind for m in spec.surface("frames").messages}
        struct = kind if kind in spec.structs else (
            payload_type(kind) if kind in messages else None)
        value: Any = _NO_VALUE
        gap = message_gap(spec, kind) if kind in messages else None
        if gap is not None:
            found = gap
        elif kind in messages and kind in SAMPLED_KINDS:
            try:
                value = message_sample(spec, kind)
            except NotInRelease as exc:
                found = str(exc)
        elif struct is not None and struct in spec.structs:
            value = Sampler(spec).required(struct)
        if value is not _NO_VALUE:
            from enginewire.conformance.targets.reference import ReferenceCodec

            try:
                frames = as_bytes(ReferenceCodec(version=spec.version).encode(kind, value))
            except Exception:  # noqa: BLE001 - no sample the reference can write
                frames = None
            if frames is not None:
                found = (value, frames)
    with _SAMPLES_LOCK:
        _SAMPLES[key] = found
    if isinstance(found, str):
        raise NotInRelease(found)
    return found


def require_kind_evidence(codec: Any, kind: str, spec: Any, operation: str = "decode", *,
                          refused: str = "") -> None:
    """Evidence that ``codec`` implements ``kind``: it decodes (``operation`` ``decode``) or
    encodes (``encode``) a valid message of the kind (:func:`valid_sample`). A refusal of
    invalid input counts as a pass only with it; without it :class:`NoEvidence` (NOT
    IMPLEMENTED). Where ``spec``'s release has no such message, :class:`NotInRelease` (NOT
    APPLICABLE, saying why)."""
    if spec is None:
        spec = getattr(codec, "run_spec", None)
    if spec is None:
        from enginewire.spec import load

        spec = load()
    sample = valid_sample(kind, spec)
    where = f"{refused}: refused, but " if refused else ""
    if sample is None:
        raise NoEvidence(f"{where}the suite has no valid {kind} to show that the target "
                         f"implements {operation} of {kind}")
    value, frames = sample
    try:
        if operation == "decode":
            codec.decode(kind, list(frames))
        else:
            codec.encode(kind, value)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the target's refusal of a valid message
        raise NoEvidence(
            f"{where}{operation}({kind!r}) also refuses a valid {kind} "
            f"({type(exc).__name__}: {str(exc)[:200]}): no evidence that the target "
            f"implements {operation} of {kind}") from None


def expect_encode_refused(codec: Any, kind: str, value: Any, what: str, *,
                          spec: Any = None) -> None:
    """``codec.encode(kind, value)`` must refuse ``value`` with a contract rejection, and
    encode a valid ``kind`` (:func:`require_kind_evidence`)."""
    try:
        frames = codec.encode(kind, value)
    except Exception as exc:  # noqa: BLE001 - refusing is the expected behaviour
        require_rejection(exc, f"encode({kind!r}) of {what}", codec=codec, kind=kind,
                          spec=spec, operation="encode", value=repr(value)[:200])
        return
    raise CheckFailure(f"the encoder accepted {what}",
                       Reproduction(received=list(frames), notes={"value": repr(value)[:200]}))


def expect_wire(
    frames: Sequence[bytes], value: Any, type_text: str, spec: Any, *,
    threshold: int = THRESHOLD_DEFAULT,
    what: str = "", strict_omit: bool = False,
) -> None:
    """Frame 0 must decode to the spec's wire form of ``value`` and the out-of-band frames
    must follow it exactly."""
    form = expected_wire(value, type_text, spec, threshold=threshold)
    try:
        actual = raw_decode(frames[0])
    except Exception as exc:  # noqa: BLE001
        raise CheckFailure(
            f"{what or type_text}: frame 0 is not valid msgpack: {exc}",
            Reproduction(sent=None, received=frames),
        ) from exc
    diffs = compare_wire(form.value, actual, strict_omit=strict_omit)
    if len(frames) - 1 != len(form.oob):
        diffs.append(f"expected {len(form.oob)} out-of-band frames, got "
                           f"{len(frames) - 1}")
    else:
        for index, (want, got) in enumerate(zip(form.oob, frames[1:], strict=True), start=1):
            if bytes(want) != bytes(got):
                diffs.append(f"out-of-band frame {index}: bytes differ")
    rejected = [f"vLLM 0.33.0 rejects it: {p}" for p in type_problems(actual, type_text, spec)]
    tolerated = [f"{d} (tolerated by vLLM)" for d in diffs if _tolerated(d)]
    misread = [d for d in diffs if not _tolerated(d)]
    # Headline in the order vLLM fails: what its typed decoder rejects (missing required
    # fields, type errors, position by position), then what it reads as another value, then
    # what it tolerates.
    problems = rejected + misread + tolerated
    if problems:
        notes: dict[str, Any] = {"threshold": threshold}
        if rejected:
            notes["rejected by vLLM"] = rejected[:20]
        notes["differences"] = (misread + tolerated)[:20]
        releases = layout_releases(actual, type_text, spec)
        if releases is not None:
            notes["layout matches releases"] = releases
        raise CheckFailure(
            f"{what or type_text}: the encoding differs from the spec: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            Reproduction(received=frames, notes=notes),
        )


def _tolerated(difference: str) -> bool:
    """Whether vLLM's decoder reads past this difference unchanged: an unknown map key, a
    default written although it may be omitted, an array longer than its struct (the extra
    trailing elements are ignored)."""
    if "not expected on the wire" in difference or "holds its default" in difference:
        return True
    match = re.search(r"expected an array of (\d+), got (\d+)", difference)
    return match is not None and int(match.group(2)) > int(match.group(1))


def expect_value(
    actual: Any, expected: Any, type_text: str, spec: Any, *, what: str,
    sent: Sequence[bytes] | None = None, fields: Sequence[str] | None = None,
) -> None:
    """A decoded value must equal ``expected`` completed with the spec's defaults.

    ``fields`` limits the comparison to those fields of a struct value.
    """
    want = complete(neutral(expected), type_text, spec)
    got = neutral(actual)
    if fields is not None:
        want = {k: want.get(k) for k in fields}
        got = {k: got.get(k) for k in fields} if isinstance(got, dict) else got
    problems = differences(want, got)
    if problems:
        raise CheckFailure(
            f"{what}: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                        if len(problems) > 1 else ""),
            Reproduction(sent=sent, received=got, notes={"differences": problems[:20]}),
        )


def field_value(value: Any, name: str) -> Any:
    """Field ``name`` of a decoded struct, whether a dict or an object."""
    if isinstance(value, dict):
        return value[name]
    return getattr(value, name)


def _socket_types(sockets: list[tuple[str, Any]]) -> list[tuple[str, str, Any]]:
    import zmq

    names = {zmq.ROUTER: "ROUTER", zmq.DEALER: "DEALER", zmq.PUSH: "PUSH", zmq.PULL: "PULL"}
    return [(channel, names.get(sock.getsockopt(zmq.TYPE), "other"), sock)
            for channel, sock in sockets]


def check_high_water_marks(sockets: list[tuple[str, Any]], who: str) -> None:
    """Every ROUTER/DEALER/PUSH/PULL in ``sockets`` has the spec's high-water marks of 0."""
    import zmq

    wanted = {"ROUTER": ("SNDHWM", "RCVHWM"), "DEALER": ("SNDHWM", "RCVHWM"),
              "PUSH": ("SNDHWM",), "PULL": ("RCVHWM",)}
    seen = {}
    problems = []
    for channel, kind, sock in _socket_types(sockets):
        for option in wanted.get(kind, ()):
            value = sock.getsockopt(getattr(zmq, option))
            seen[f"{channel} {kind} {option}"] = value
            if value != 0:
                problems.append(f"the {channel} {kind} has {option} {value}")
    if not seen:
        raise CheckFailure(f"the {who} exposed no ROUTER, DEALER, PUSH or PULL socket",
                           Reproduction(notes={"sockets": [c for c, _ in sockets]}))
    if problems:
        raise CheckFailure(f"{problems[0]}, expected 0" + (
            f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            Reproduction(notes={"options": seen}))


def note_refusal(exc: BaseException, what: str) -> None:
    """A call into the target on another thread than the check's raised ``exc``: when it is
    a ``NotImplementedError`` (the target has no code for the operation), the running check
    is NOT IMPLEMENTED whatever it makes of the call's end (the runner only sees the
    exceptions that reach the check's own thread)."""
    if isinstance(exc, NotImplementedError):
        note_not_implemented(f"{what} ({type(exc).__name__}: {exc})")


#: Seconds past the check's own limit that its clean-up waits for a :class:`Background` call.
BACKGROUND_GRACE_S = 1.0


class Background:
    """Run ``func`` in a thread; :meth:`result` re-raises what it raised.

    The check's clean-up (``ctx``) joins the thread before it closes what was registered
    earlier: a ring or socket closed under a call still blocked in it on another thread can
    abort the process. ``func`` must be bounded by a timeout of its own: ``within`` seconds
    when given, else one from ``ctx.wait`` (so it ends by the check's limit). The clean-up
    waits until that bound (and ``BACKGROUND_GRACE_S``), and reports a call still running
    after that."""

    def __init__(self, func: Callable[[], Any], name: str, ctx: Any,
                 within: float | None = None) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._deadline: float = (ctx.deadline if within is None
                                 else min(ctx.deadline, time.monotonic() + within))
        self.thread = threading.Thread(target=self._run, args=(func,), name=name, daemon=True)
        self.thread.start()
        ctx.on_cleanup(self._join)

    def _join(self) -> None:
        self.thread.join(max(0.0, self._deadline - time.monotonic()) + BACKGROUND_GRACE_S)
        if self.thread.is_alive():
            raise RuntimeError(f"{self.thread.name} still ran past the check's limit")

    def _run(self, func: Callable[[], Any]) -> None:
        try:
            self._value = func()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc
            note_refusal(exc, self.thread.name)

    def done(self) -> bool:
        return not self.thread.is_alive()

    def exception(self, timeout: float, what: str) -> BaseException | None:
        """Wait for ``func``; what it raised, or None when it returned."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise CheckFailure(f"{what} did not finish within {timeout:g} s")
        return self._error

    def result(self, timeout: float, what: str) -> Any:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise CheckFailure(f"{what} did not finish within {timeout:g} s")
        if self._error is not None:
            raise CheckFailure(f"{what} raised {type(self._error).__name__}: {self._error}")
        return self._value


def require_ipv6_loopback() -> None:
    """Skip the check (CheckSkip) on a machine that cannot bind ``::1``."""
    import socket

    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as exc:
        raise CheckSkip(f"no IPv6 loopback here: {exc}") from exc


def require_struct(ctx: Any, name: str) -> None:
    """Skip a struct's check (CheckSkip) when the run's vLLM release has no such struct
    (``enginewire check --version X`` for a release before the struct existed)."""
    if name not in ctx.spec.structs:
        raise CheckSkip(f"{name} does not exist in vLLM {ctx.spec.version}")


def require_reference_version(ctx: Any) -> None:
    """Skip a golden-vector check (CheckSkip) when the run follows another release than the
    one the vectors were recorded from."""
    from enginewire.spec.loader import REFERENCE_VLLM_VERSION

    if ctx.spec.version != REFERENCE_VLLM_VERSION:
        raise CheckSkip(f"the golden vectors are vLLM {REFERENCE_VLLM_VERSION}'s; this run "
                        f"follows {ctx.spec.version}")
