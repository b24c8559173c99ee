"""enginewire tap: capture format, annotation, forwarding byte for byte, skew flagging,
recordings as golden vectors, replay against reference and broken engines and front ends."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from tap_peers import outputs_message, scripted_session, skew_outputs

from enginewire.conformance.oracle.golden import check_vector, load_vectors
from enginewire.reference import codec as ref_codec
from enginewire.reference import structs
from enginewire.reference.engine import EngineOptions, ReferenceEngine, generation_request
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.tap import releases
from enginewire.tap.annotate import Annotator, line, to_json
from enginewire.tap.capture import (
    CaptureError,
    Header,
    Record,
    Writer,
    encode_header,
    encode_record,
    parse,
    read,
)
from enginewire.tap.proxy import Tap, TapConfig
from enginewire.tap.replay import Addresses, replay_against_engine, replay_against_frontend
from enginewire.tap.rewrite import rewrite_init

TIMEOUT = 10.0


# --- capture format (sans-IO) ------------------------------------------------------------------


def test_capture_round_trip_and_cut_short_file() -> None:
    records = [Record(5, "input", "frontend", b"\x00\x00", (b"\x00", b"\x91\x01")),
               Record(9, "output", "engine", None, (b"\x93",))]
    data = encode_header(Header("0.33.0", 12.5)) + b"".join(encode_record(r) for r in records)
    header, got = parse(data)
    assert header.release == "0.33.0" and header.started == 12.5
    assert got == records
    # A file cut mid-record ends at the last whole record.
    assert parse(data[:-3])[1] == records[:1]


@pytest.mark.parametrize("data, match", [
    (b"", "header record"),
    (encode_header(Header("0.33.0"))[:4] + b"\x00" * 0, "header record"),
    (b"\x00\x00\x00\x01\xc1", "not msgpack"),
    (b"\x00\x00\x00\x01\x90", "format 'enginewire-tap'"),
])
def test_capture_rejects_what_is_not_a_capture(data: bytes, match: str) -> None:
    with pytest.raises(CaptureError, match=match):
        parse(data)


def test_capture_rejects_a_newer_format_version() -> None:
    body = msgspec.msgpack.encode({"format": "enginewire-tap", "format_version": 99})
    with pytest.raises(CaptureError, match="format_version <= 1, got 99"):
        parse(len(body).to_bytes(4, "big") + body)


# --- annotation (sans-IO) ----------------------------------------------------------------------


def _frames(kind: str, value: Any) -> tuple[bytes, ...]:
    return tuple(bytes(f) for f in ref_codec.encode(kind, value))


def test_annotation_of_clean_messages() -> None:
    annotator = Annotator()
    add = annotator.annotate(Record(0, "input", "frontend", b"\x01\x00",
                                    _frames("add", generation_request("r", [1, 2], 5))))
    assert (add.kind, add.rank, add.request_ids, add.tokens, add.violations) == (
        "add", 1, ["r"], 2, [])
    assert "add" in line(add) and "req=r" in line(add) and "id=1" in line(add)
    out = annotator.annotate(Record(0, "output", "engine", None,
                                    _frames("outputs", outputs_message("r", [4, 5], True))))
    assert (out.kind, out.request_ids, out.tokens, out.details["finished"]) == (
        "outputs", ["r"], 2, ["r"])
    assert json.loads(to_json(out))["violations"] == []


def test_annotation_flags_an_inserted_field_with_clause_path_and_field() -> None:
    frames = skew_outputs(list(_frames("outputs", outputs_message("r", [4], False))))
    annotation = Annotator().annotate(Record(0, "output", "engine", None, tuple(frames)))
    [violation] = annotation.violations
    assert violation.clause == "structs.array.type-checked"
    assert violation.path == "$[1][0][2]"
    assert violation.field == "EngineCoreOutput.new_logprobs (position 2)"
    # Only 0.33.0 is known here: no release explains it.
    assert violation.explained_by == ()
    shown = line(annotation)
    assert "!! [structs.array.type-checked] at $[1][0][2]" in shown
    assert json.loads(to_json(annotation))["violations"][0]["field"] == violation.field


def test_annotation_flags_a_bad_identity_and_a_bad_type_byte() -> None:
    annotator = Annotator()
    bad_identity = annotator.annotate(Record(0, "input", "frontend", b"\x00",
                                             _frames("abort", ["x"])))
    assert [v.clause for v in bad_identity.violations] == ["identity.width-two-bytes"]
    unknown = annotator.annotate(Record(0, "input", "frontend", b"\x00\x00", (b"\x09", b"")))
    assert unknown.kind is None and unknown.violations


def test_the_history_hook_names_the_release_whose_layout_decodes_the_frames(monkeypatch) -> None:
    """explain() asks every release the history knows; here a stand-in release whose codec
    accepts the skewed frames."""

    class Accepting:
        def decode_message(self, channel: str, frames: Any, sender: str | None = None) -> Any:
            return ref_codec.Message("outputs", None)

    real = releases.codec_for
    monkeypatch.setattr(releases, "known_releases", lambda: ["0.32.0", "0.33.0"])
    monkeypatch.setattr(releases, "codec_for",
                        lambda v=None: Accepting() if v == "0.32.0" else real(v))
    frames = skew_outputs(list(_frames("outputs", outputs_message("r", [4], False))))
    [violation] = Annotator().annotate(
        Record(0, "output", "engine", None, tuple(frames))).violations
    assert violation.explained_by == ("0.32.0",)


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(releases.UnknownRelease, match="no layouts for release '0.1.0'"):
        releases.codec_for("0.1.0")


def test_rewrite_init_replaces_only_the_addresses() -> None:
    metadata = structs.EngineHandshakeMetadata(
        addresses=structs.EngineZmqAddresses(inputs=["ipc://in"], outputs=["ipc://out"]),
        parallel_config={"x": 1})
    [payload] = _frames("init", metadata)
    new = rewrite_init(payload, lambda ch, a: f"{a}-{ch}-tap")
    before, after = msgspec.msgpack.decode(payload), msgspec.msgpack.decode(new)
    assert after["addresses"]["inputs"] == ["ipc://in-input-tap"]
    assert after["addresses"]["outputs"] == ["ipc://out-output-tap"]
    after["addresses"]["inputs"], after["addresses"]["outputs"] = ["ipc://in"], ["ipc://out"]
    assert msgspec.msgpack.encode(after) == payload and list(after) == list(before)
    assert rewrite_init(payload, lambda ch, a: a) == payload
    assert rewrite_init(b"\xc1", lambda ch, a: "x") == b"\xc1"


# --- forwarding ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tapped(records: list[Record] | None = None) -> Iterator[Any]:
    """A function that starts a tap in front of a handshake address (closed on exit)."""
    taps: list[Tap] = []

    def start(upstream: str) -> str:
        tap = Tap(TapConfig(upstream_handshake=upstream),
                  record=records.append if records is not None else None).start()
        taps.append(tap)
        assert tap.handshake_address is not None
        return tap.handshake_address

    try:
        yield start
    finally:
        for tap in taps:
            tap.close()
            assert tap.error is None


def _without_init_addresses(entries: list[Any]) -> list[Any]:
    out = []
    for direction, channel, frames in entries:
        if channel == "handshake" and len(frames) == 1:
            decoded = msgspec.msgpack.decode(frames[0])
            if isinstance(decoded, dict) and "addresses" in decoded:
                decoded["addresses"] = "<addresses>"
                frames = [msgspec.msgpack.encode(decoded)]
        out.append((direction, channel, frames))
    return out


def _at_router(entries: list[Any]) -> list[Any]:
    """The front end's log without the routing identity of engine 0 its ROUTERs write and
    read first (asserted to be there)."""
    out = []
    for direction, channel, frames in entries:
        if channel in ("handshake", "input"):
            assert frames[0] == b"\x00\x00", (direction, channel, frames)
            frames = frames[1:]
        out.append((direction, channel, frames))
    return out


def _by_channel(entries: list[Any], direction: str) -> dict[str, list[list[bytes]]]:
    """Frames per channel in order (ZMQ orders messages per socket, not across sockets)."""
    found: dict[str, list[list[bytes]]] = {}
    for d, channel, frames in entries:
        if d == direction:
            found.setdefault(channel, []).append(frames)
    return found


def _sent(entries: list[Any]) -> dict[str, list[list[bytes]]]:
    return _by_channel(entries, "sent")


def _received(entries: list[Any]) -> dict[str, list[list[bytes]]]:
    return _by_channel(entries, "received")


def test_frames_are_identical_at_both_ends_with_and_without_the_tap() -> None:
    direct_front, direct_engine = scripted_session()
    records: list[Record] = []
    with tapped(records) as start:
        front, engine = scripted_session(start)
    # Through the tap, each end received exactly what the other sent, byte for byte, but for
    # the addresses inside the init message.
    front_entries = _at_router(front.entries)
    assert _received(front_entries) == _sent(engine.entries)
    assert _received(_without_init_addresses(engine.entries)) == \
        _sent(_without_init_addresses(front_entries))
    assert _received(engine.entries)["handshake"][0] != _sent(front_entries)["handshake"][0]
    # And the session is the same one as without the tap (addresses aside).
    assert _without_init_addresses(front_entries) == \
        _without_init_addresses(_at_router(direct_front.entries))
    assert _without_init_addresses(engine.entries) == \
        _without_init_addresses(direct_engine.entries)
    # The tap saw every message, recorded as sent (the init as the front end wrote it).
    assert _sent(front_entries) == _sent(
        [("sent", r.channel, list(r.frames)) for r in records if r.sender == "frontend"])
    assert _sent(engine.entries) == _sent(
        [("sent", r.channel, list(r.frames)) for r in records if r.sender == "engine"])
    annotator = Annotator()
    assert all(annotator.annotate(r).ok for r in records)


def test_a_skewed_engine_is_flagged_at_the_first_message_that_shows_it() -> None:
    records: list[Record] = []

    def skew(kind: str, frames: list[bytes]) -> list[bytes]:
        return skew_outputs(frames) if kind == "outputs" else frames

    with tapped(records) as start:
        scripted_session(start, engine_rewrite=skew)
    annotator = Annotator()
    flagged = [(i, annotator.annotate(r)) for i, r in enumerate(records)]
    first = next(i for i, a in flagged if a.violations)
    first_outputs = next(i for i, r in enumerate(records)
                         if r.channel == "output" and r.frames[0][1:2] == b"\x92"
                         or (r.channel == "output" and i > 0 and flagged[i][1].kind is None))
    assert first == first_outputs
    [violation] = flagged[first][1].violations
    assert violation.field == "EngineCoreOutput.new_logprobs (position 2)"
    # Everything before it decoded cleanly.
    assert all(a.ok for _, a in flagged[:first])


def test_reference_peers_through_the_tap_with_two_engines() -> None:
    records: list[Record] = []
    with ReferenceFrontend(2) as front, \
            Tap(TapConfig(upstream_handshake=front.handshake_address),
                record=records.append) as tap:
        tap.start()
        engines = [ReferenceEngine(EngineOptions(handshake_address=tap.handshake_address,
                                                 rank=rank, tokens=3)) for rank in range(2)]
        threads = [threading.Thread(target=e.run, daemon=True) for e in engines]
        for thread in threads:
            thread.start()
        try:
            front.wait_ready(TIMEOUT)
            front.add_request(generation_request("a", [1, 2], 3), 0)
            front.add_request(generation_request("b", [4], 2), 1)
            finished: set[str] = set()
            while finished != {"a", "b"}:
                for output in front.get_output(TIMEOUT).outputs:
                    if output.finish_reason is not None:
                        finished.add(output.request_id)
            assert front.call_utility("echo", [7], 1, TIMEOUT) == [7]
        finally:
            for engine in engines:
                engine.request_stop()
            for thread in threads:
                thread.join(TIMEOUT)
    annotator = Annotator()
    annotations = [annotator.annotate(r) for r in records]
    assert all(a.ok for a in annotations), [line(a) for a in annotations if not a.ok]
    kinds = [a.kind for a in annotations]
    assert kinds.count("hello") == kinds.count("init") == kinds.count("ready") == 2
    assert kinds.count("ready_response") == 2 and kinds.count("add") == 2
    assert {a.rank for a in annotations if a.kind == "add"} == {0, 1}
    assert "utility_reply" in kinds


# --- recordings, golden vectors, replay --------------------------------------------------------


def _record_reference_session(path: Any, *, tokens: int | None = 3,
                              abort: bool = False) -> None:
    """Run the reference front end and engine through a tap that records to ``path``."""
    with open(path, "wb") as handle:
        writer = Writer(handle, Header("0.33.0"))
        with ReferenceFrontend(1) as front, \
                Tap(TapConfig(upstream_handshake=front.handshake_address),
                    record=writer.write) as tap:
            tap.start()
            engine = ReferenceEngine(EngineOptions(handshake_address=tap.handshake_address,
                                                   step_delay=0.01))
            thread = threading.Thread(target=engine.run, daemon=True)
            thread.start()
            try:
                front.wait_ready(TIMEOUT)
                front.add_request(generation_request("a", [1, 2], tokens))
                front.add_request(generation_request("b", [5], 2))
                pending = {"a", "b"}
                while pending:
                    for output in front.get_output(TIMEOUT).outputs:
                        if output.finish_reason is not None:
                            pending.discard(output.request_id)
                front.call_utility("echo", ["hi"], 0, TIMEOUT)
            finally:
                engine.request_stop()
                thread.join(TIMEOUT)


def test_a_recording_reads_back_and_converts_to_golden_vectors(tmp_path) -> None:
    path = tmp_path / "session.cap"
    _record_reference_session(path)
    header, records = read(str(path))
    assert header.release == "0.33.0" and len(records) >= 8
    from enginewire.tap.vectors import write_vectors

    annotator = Annotator()
    annotations = [annotator.annotate(r) for r in records]
    written = write_vectors(annotations, tmp_path / "golden", "session")
    assert len(written) == len(records)
    vectors = load_vectors(tmp_path / "golden", tensors="wire")
    assert {v.kind for v in vectors} >= {"hello", "init", "ready", "ready_response", "add",
                                         "outputs", "utility", "utility_reply"}
    for vector in vectors:
        assert vector.vllm_version == "0.33.0"
        # Each must decode to its value (kind and release as recorded). Encoding the value
        # back need not give the recorded bytes: a map struct's omitted defaults come back as
        # explicit values.
        decode_problems = [p for p in check_vector(vector) if p.startswith("decode")]
        assert decode_problems == [], vector.name


def test_replay_against_the_reference_engine_and_a_broken_one(tmp_path) -> None:
    path = tmp_path / "session.cap"
    _record_reference_session(path)
    _header, records = read(str(path))

    @contextlib.contextmanager
    def in_process(addresses: Addresses, rank: int, **options: Any) -> Iterator[None]:
        engine = ReferenceEngine(EngineOptions(handshake_address=addresses.handshake,
                                               rank=rank, **options))
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            yield None
        finally:
            engine.request_stop()
            thread.join(TIMEOUT)

    result = replay_against_engine(records, in_process, timeout=TIMEOUT)
    assert result.ok, (result.divergence and result.divergence.describe(), result.stopped)
    assert result.sent == sum(r.sender == "frontend" for r in records)

    class OffByOne(ReferenceEngine):
        """Generates one token more than the request's max_tokens allows."""

        def _add(self, request: Any) -> None:
            super()._add(request)
            self._running[request.request_id].count += 1

    @contextlib.contextmanager
    def broken(addresses: Addresses, rank: int) -> Iterator[None]:
        engine = OffByOne(EngineOptions(handshake_address=addresses.handshake, rank=rank))
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            yield None
        finally:
            engine.request_stop()
            thread.join(TIMEOUT)

    result = replay_against_engine(records, broken, timeout=TIMEOUT)
    assert result.divergence is not None
    assert result.divergence.key == ("request", "a")
    assert len(result.divergence.got["tokens"]) == len(result.divergence.recorded["tokens"]) + 1
    assert "first divergence at ('request', 'a')" in result.divergence.describe()


def test_replay_against_the_reference_front_end(tmp_path) -> None:
    """The recording's engine played against ``enginewire frontend`` driven the same way."""
    path = tmp_path / "cli.cap"
    front_argv = [sys.executable, "-m", "enginewire", "frontend", "--handshake", "{handshake}",
                  "--input", "{input}", "--output", "{output}", "send", "--count", "2",
                  "--max-tokens", "3"]
    with open(path, "wb") as handle:
        writer = Writer(handle, Header("0.33.0"))
        from enginewire.reference.addresses import ipc_address

        addresses = {"handshake": ipc_address(), "input": ipc_address(),
                     "output": ipc_address()}
        with Tap(TapConfig(upstream_handshake=addresses["handshake"]), record=writer.write) as tap:
            tap.start()
            front = subprocess.Popen([a.format(**addresses) for a in front_argv],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            engine = ReferenceEngine(EngineOptions(handshake_address=tap.handshake_address))
            thread = threading.Thread(target=engine.run, daemon=True)
            thread.start()
            try:
                assert front.wait(30) == 0
            finally:
                engine.request_stop()
                thread.join(TIMEOUT)
                if front.poll() is None:
                    front.kill()
                    front.wait(10)
    _header, records = read(str(path))
    from enginewire.tap.replay import command_target

    def launch(addresses: Addresses, rank: int) -> Any:
        return command_target(" ".join(front_argv[3:]).replace(
            "frontend", "enginewire frontend", 1), addresses, rank, once=True)

    result = replay_against_frontend(records, launch, timeout=TIMEOUT)
    assert result.ok, (result.divergence and result.divergence.describe(), result.stopped)
    # A front end that sends other requests diverges at the first one.
    def other(addresses: Addresses, rank: int) -> Any:
        template = " ".join(front_argv[3:]).replace("frontend", "enginewire frontend", 1)
        return command_target(template.replace("--max-tokens 3", "--max-tokens 2"),
                              addresses, rank, once=True)

    result = replay_against_frontend(records, other, timeout=TIMEOUT)
    assert result.divergence is not None and result.divergence.key == ("add", "cli-0")


# --- command line --------------------------------------------------------------------------------


def test_cli_reads_a_recording_as_lines_json_and_with_a_release(tmp_path) -> None:
    path = tmp_path / "session.cap"
    _record_reference_session(path)
    base = [sys.executable, "-m", "enginewire", "tap", "--read", str(path)]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert " add req=a " in text.stdout and "!!" not in text.stdout
    as_json = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    kinds = [json.loads(x)["kind"] for x in as_json.stdout.splitlines()]
    assert kinds[0] == "hello" and "outputs" in kinds
    unknown = subprocess.run([*base, "--version", "0.1.0"], capture_output=True, text=True,
                             timeout=60)
    assert unknown.returncode == 2 and "no layouts for release '0.1.0'" in unknown.stderr


def test_reference_peers_through_the_tap_over_tcp() -> None:
    records: list[Record] = []
    tcp = {key: "tcp://127.0.0.1:0"
           for key in ("handshake_address", "input_address", "output_address")}
    with ReferenceFrontend(1, **tcp) as front, \
            Tap(TapConfig(upstream_handshake=front.handshake_address),
                record=records.append) as tap:
        tap.start()
        assert tap.handshake_address is not None
        assert tap.handshake_address.startswith("tcp://127.0.0.1:")
        engine = ReferenceEngine(EngineOptions(handshake_address=tap.handshake_address))
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            front.wait_ready(TIMEOUT)
            front.add_request(generation_request("t", [3], 2))
            while not any(o.finish_reason is not None
                          for o in front.get_output(TIMEOUT).outputs):
                pass
            # The engine was told the tap's tcp addresses, not the front end's.
            assert all(a.startswith("tcp://127.0.0.1:") for a in tap.input_addresses)
            assert tap.input_addresses != [front.input_address]
        finally:
            engine.request_stop()
            thread.join(TIMEOUT)
    annotator = Annotator()
    assert [annotator.annotate(r).kind for r in records if r.channel != "handshake"][-1] == \
        "outputs"
    assert all(annotator.annotate(r).ok for r in records)


def test_cli_tap_records_a_live_session_and_replay_finds_no_divergence(tmp_path) -> None:
    from enginewire.reference.addresses import ipc_address, remove_ipc_file

    upstream, listen = ipc_address(), ipc_address()
    path = tmp_path / "live.cap"
    tap = subprocess.Popen(
        [sys.executable, "-m", "enginewire", "tap", "--handshake", upstream, "--listen", listen,
         "--record", str(path), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with ReferenceFrontend(1, handshake_address=upstream) as front:
            engine = ReferenceEngine(EngineOptions(handshake_address=listen))
            thread = threading.Thread(target=engine.run, daemon=True)
            thread.start()
            try:
                front.wait_ready(30)
                front.add_request(generation_request("c", [1], 2))
                while not any(o.finish_reason is not None
                              for o in front.get_output(TIMEOUT).outputs):
                    pass
            finally:
                engine.request_stop()
                thread.join(TIMEOUT)
        tap.terminate()
        out, err = tap.communicate(timeout=20)
    finally:
        if tap.poll() is None:
            tap.kill()
            tap.wait(10)
        remove_ipc_file(listen)
    assert tap.returncode == 0, err
    assert f"engines use handshake address {listen}" in err
    kinds = [json.loads(x)["kind"] for x in out.splitlines()]
    assert kinds[:2] == ["hello", "init"] and kinds.count("outputs") == 2
    _header, records = read(str(path))
    assert len(records) == len(kinds)
    replay = subprocess.run(
        [sys.executable, "-m", "enginewire", "replay", str(path), "--against", "engine",
         "--target", "reference", "--timeout", "10"],
        capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "no divergence from the recording" in replay.stdout


def test_auto_release_follows_the_ready_response(monkeypatch) -> None:
    """``--version auto`` switches to the release a ready response names when the spec knows
    it (here a stand-in list of releases), and stays on the reference release otherwise."""
    from tap_peers import ready_response

    frames = _frames("ready_response", ready_response())
    annotator = Annotator("auto")
    annotation = annotator.annotate(Record(0, "input", "engine", b"\x00\x00", frames))
    assert annotation.details["vllm_version"] == "0.33.0"
    assert annotator.release == "0.33.0" and "decoding_as" not in annotation.details

    other = ready_response()
    other.vllm_version = "0.33.1"
    monkeypatch.setattr("enginewire.tap.annotate.known_releases", lambda: ["0.33.0", "0.33.1"])
    monkeypatch.setattr("enginewire.tap.annotate.codec_for",
                        lambda v=None: releases.codec_for("0.33.0"))
    annotator = Annotator("auto")
    annotation = annotator.annotate(Record(0, "input", "engine", b"\x00\x00",
                                           _frames("ready_response", other)))
    assert annotator.release == "0.33.1" and annotation.details["decoding_as"] == "0.33.1"


def test_the_dp_coordinator_channels_flow_through_the_tap() -> None:
    """The init names a DP coordinator: the engine is told the tap's coordinator addresses,
    and subscriptions, READY, START_DP_WAVE and coordinator outputs pass unchanged."""
    import zmq

    from enginewire.reference.addresses import ipc_address
    from enginewire.reference.connection import EngineConnection, FrontendConnection
    from enginewire.reference.transport import open_socket

    codec = ref_codec.default_codec()
    records: list[Record] = []
    ctx = zmq.Context()
    opened: list[Any] = []

    def sock(channel: str, role: str, address: str, identity: bytes | None = None) -> Any:
        made = open_socket(ctx, channel, role, address, identity=identity)
        opened.append(made)
        return made

    def recv(made: Any) -> list[bytes]:
        assert made.socket.poll(int(TIMEOUT * 1000)), made.channel
        return made.socket.recv_multipart()

    try:
        front, engine = FrontendConnection([0]), EngineConnection(0)
        f_hs = sock("handshake", "frontend", ipc_address())
        c_in = sock("coordinator_input", "coordinator", ipc_address())
        c_out = sock("coordinator_output", "coordinator", ipc_address())
        with Tap(TapConfig(upstream_handshake=f_hs.address), record=records.append) as tap:
            tap.start()
            assert tap.handshake_address is not None
            e_hs = sock("handshake", "engine", tap.handshake_address, engine.identity)
            e_hs.socket.send_multipart(engine.send("hello"))
            front.receive("handshake", recv(f_hs))
            metadata = structs.EngineHandshakeMetadata(
                addresses=structs.EngineZmqAddresses(
                    inputs=[ipc_address()], outputs=[ipc_address()],
                    coordinator_input=c_in.address, coordinator_output=c_out.address),
                parallel_config={"data_parallel_size": 2})
            f_hs.socket.send_multipart(front.send("init", metadata, rank=0))
            [init] = engine.receive("handshake", recv(e_hs))
            told = init.addresses
            assert told.coordinator_input not in (None, c_in.address)
            assert told.coordinator_output not in (None, c_out.address)
            e_sub = sock("coordinator_input", "engine", told.coordinator_input,
                         engine.identity)
            e_push = sock("coordinator_output", "engine", told.coordinator_output)
            subscribe = [bytes(f) for f in codec.encode("coordinator_subscribe", None)]
            e_sub.socket.send_multipart(subscribe)
            assert recv(c_in) == subscribe
            ready = [bytes(f) for f in codec.encode("coordinator_ready", None)]
            wave = [bytes(f) for f in codec.encode("start_dp_wave", (3, 1))]
            c_in.socket.send_multipart(ready)
            c_in.socket.send_multipart(wave)
            assert recv(e_sub) == ready and recv(e_sub) == wave
            stats = [bytes(f) for f in codec.encode("coordinator_outputs",
                                                      structs.EngineCoreOutputs(
                                                          engine_index=0, wave_complete=3))]
            e_push.socket.send_multipart(stats)
            assert recv(c_out) == stats
        annotator = Annotator()
        seen = [(r.channel, r.sender, annotator.annotate(r)) for r in records
                if r.channel.startswith("coordinator")]
        assert [(c, s, a.kind) for c, s, a in seen] == [
            ("coordinator_input", "engine", "coordinator_subscribe"),
            ("coordinator_input", "coordinator", "coordinator_ready"),
            ("coordinator_input", "coordinator", "start_dp_wave"),
            ("coordinator_output", "engine", "coordinator_outputs"),
        ]
        assert all(a.ok for _, _, a in seen) and "C->E" in line(seen[1][2])
    finally:
        for made in opened:
            made.close(linger=0)
        ctx.term()


def test_an_engine_of_an_older_release_is_flagged_and_the_release_named() -> None:
    """An engine writing 0.19.1's EngineCoreOutput (14 fields) to a 0.33.0 front end: the
    first outputs message is flagged at the position where the layouts part, with the field
    0.33.0 has there and the releases whose layout the frames fit (0.19.1 among them)."""
    old = releases.codec_for("0.19.1")
    classes = old.structs.classes

    def older(kind: str, frames: list[bytes]) -> list[bytes]:
        if kind != "outputs":
            return frames
        value = ref_codec.decode("outputs", frames)
        outputs = [classes["EngineCoreOutput"](
            request_id=o.request_id, new_token_ids=list(o.new_token_ids),
            finish_reason=o.finish_reason) for o in value.outputs]
        return [bytes(f) for f in old.encode("outputs", classes["EngineCoreOutputs"](
            engine_index=0, outputs=outputs, timestamp=value.timestamp))]

    records: list[Record] = []
    with tapped(records) as start:
        scripted_session(start, engine_rewrite=older)
    annotator = Annotator()
    annotations = [annotator.annotate(r) for r in records]
    first = next(i for i, a in enumerate(annotations) if a.violations)
    assert records[first].channel == "output"
    assert all(a.ok for a in annotations[:first])
    [violation] = annotations[first].violations
    assert violation.path == "$[1][0][10]"
    assert violation.field == "EngineCoreOutput.trace_headers (position 10)"
    assert "0.19.1" in violation.explained_by and "0.33.0" not in violation.explained_by
    at = dict(zip(violation.explained_by, violation.explained_fields, strict=True))
    assert at["0.19.1"] == "EngineCoreOutput.num_cached_tokens (position 10)"
    assert "explained by release" in line(annotations[first])
    assert "0.16.0-0.19.1" in line(annotations[first])
    # Read offline as 0.19.1: the engine's outputs fit, the 0.33.0 front end's ADD does not
    # (and 0.33.0 explains it); the ready response has no 0.19.1 layout at all.
    as_old = Annotator("0.19.1")
    offline = [as_old.annotate(r) for r in records]
    assert all(a.ok for a in offline if a.record.channel == "output")
    [add] = [a for a in offline if a.record.channel == "input" and a.record.sender == "frontend"
             and a.record.frames[0] == b"\x00"][:1]
    assert add.violations and "0.33.0" in add.violations[0].explained_by
    [ready] = [a for a in offline if a.record.channel == "input" and a.record.sender == "engine"]
    assert [v.clause for v in ready.violations] == ["not-in-release"]


def test_a_stuck_decoder_neither_stalls_forwarding_nor_loses_a_recorded_frame() -> None:
    """The observer (the decoder) blocks on its first record: every message is still forwarded
    unchanged at once, the recording still gets every message in order, and the records the
    observer could not take (more than ``max_behind`` waiting) are counted, not lost."""
    import zmq

    from enginewire.reference.addresses import ipc_address, remove_ipc_file

    ctx = zmq.Context()
    front_out = ctx.socket(zmq.PULL)
    engine_out = ctx.socket(zmq.PUSH)
    upstream_in = ipc_address()
    release = threading.Event()
    observed: list[Record] = []
    recorded: list[Record] = []

    def stuck(record: Record) -> None:
        release.wait(TIMEOUT)
        observed.append(record)

    messages = [[b"out-%d" % i, b"frame-two"] for i in range(50)]
    try:
        front_out.bind(ipc_address())
        upstream_out = front_out.getsockopt_string(zmq.LAST_ENDPOINT)
        with Tap(TapConfig(upstream_inputs=[upstream_in], upstream_outputs=[upstream_out]),
                 stuck, record=recorded.append, max_behind=5) as tap:
            tap.start()
            engine_out.connect(tap.output_addresses[0])
            for frames in messages:
                engine_out.send_multipart(frames)
            got = []
            for _ in messages:
                assert front_out.poll(int(TIMEOUT * 1000)), len(got)
                got.append(front_out.recv_multipart())
            assert got == messages and not release.is_set()  # forwarded, decoder stuck
            release.set()
        assert tap.error is None
        assert [list(r.frames) for r in recorded] == messages
        assert {(r.channel, r.sender, r.identity) for r in recorded} == {
            ("output", "engine", None)}
        assert tap.forwarded == len(messages)
        assert tap.unobserved > 0 and len(observed) + tap.unobserved == len(messages)
        remaining = iter(recorded)  # observed in the recorded order, none twice
        assert all(any(o == r for r in remaining) for o in observed)
        assert tap.most_behind <= 5
    finally:
        engine_out.close(linger=0)
        front_out.close(linger=0)
        ctx.term()
        remove_ipc_file(upstream_in)
        if "upstream_out" in locals():
            remove_ipc_file(upstream_out)
