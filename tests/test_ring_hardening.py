"""Ring hardening: unpickling through the allow-list, dead peers, crash clean-up, file modes,
finite waits (clauses ring.payload.pickle-allow-list, ring.liveness.*, ring.lifecycle.file-modes).

Processes are killed with SIGKILL here on purpose; every test removes what they leave (the
session's leftover check proves it).
"""

from __future__ import annotations

import enum
import inspect
import os
import pickle
import pickletools
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from enginewire.reference.errors import RingPeerDead, UnsafePickleError
from enginewire.reference.processes import Creator, creator_of, this_process
from enginewire.reference.ring import MessageQueue, PickleCodec
from enginewire.reference.ring.clean import clean, leftovers
from enginewire.reference.ring.queue import DEFAULT_TIMEOUT_S
from enginewire.spec import load

STEP = 20.0

# --- unpickling -------------------------------------------------------------------------------


class _MakeDirs:
    """Unpickles as os.makedirs(path): what the attack payload ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return os.makedirs, (self.path,)


class Colour(enum.Enum):
    RED = 1


def _malicious(path: Path) -> bytes:
    return pickle.dumps({"step": 1, "x": _MakeDirs(str(path))}, protocol=5)


def test_a_malicious_payload_raises_and_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "made"
    with pytest.raises(UnsafePickleError) as caught:
        PickleCodec().decode(_malicious(target), [])
    assert caught.value.clause == "ring.payload.pickle-allow-list"
    assert "os.makedirs" in str(caught.value) or "posix.makedirs" in str(caught.value)
    assert not target.exists()


@pytest.mark.parametrize("stream", [
    b"cos\nsystem\n(S'true'\ntR.",                     # GLOBAL opcode, protocol 0
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x8c\x04eval\x93.",
    b"cimportlib\nimport_module\n(S'os'\ntR.",          # the guarded import refuses os
    b"cbuiltins\ngetattr\n(cbuiltins\nobject\nS'__subclasses__'\ntR.",
])
def test_refused_globals(stream: bytes) -> None:
    with pytest.raises(UnsafePickleError):
        PickleCodec().decode(stream, [])


def _has_global(stream: bytes) -> bool:
    import pickletools

    refused = {"GLOBAL", "INST", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4", "REDUCE", "BUILD",
               "OBJ", "NEWOBJ", "NEWOBJ_EX", "PERSID", "BINPERSID"}
    return any(op.name in refused for op, _, _ in pickletools.genops(stream))


def test_the_opcode_walk_passes_binary_data_and_only_plain_streams() -> None:
    import random

    from enginewire.reference.ring.payload import _names_no_global, _opcodes_no_global

    # Binary arguments full of global-opcode bytes: the byte scan refuses them, the walk that
    # skips arguments passes them, and the codec decodes them on the fast path.
    blob = bytes(range(256)) * 4
    for value in (bytearray(blob), blob, blob.decode("latin-1"), [blob, 12, -3.5, None],
                  {"k": blob}, (blob, True), 2**200, -(2**70)):
        stream = pickle.dumps(value, protocol=5)
        assert not _names_no_global(stream) or not isinstance(value, bytes | bytearray)
        assert _opcodes_no_global(stream), value
        assert PickleCodec().decode(stream, []) == value
    # Against pickletools as the oracle: the walk never passes a stream holding an opcode that
    # loads a global or calls something, whatever follows in the bytes.
    rng = random.Random(7)
    values: list[Any] = [os.makedirs, Colour.RED, _MakeDirs("x"), {1, 2}, frozenset({3}),
                         bytearray(b"c" * 40), "\x93\x82", [1.5, b"\x63"]]
    for protocol in range(0, 6):
        for value in values:
            try:
                stream = pickle.dumps(value, protocol=protocol)
            except (pickle.PicklingError, TypeError, AttributeError):
                continue
            if _opcodes_no_global(stream):
                assert not _has_global(stream), (protocol, value)
    for _ in range(3000):  # random byte strings, most of them not pickles at all
        stream = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24))) + b"."
        if _opcodes_no_global(stream):
            try:
                assert not _has_global(stream), stream
            except ValueError:
                pass  # not a pickle pickletools can read; the walk saw plain opcodes to STOP
    # What the walk gives up on: a global, a long stream, truncation.
    assert not _opcodes_no_global(_malicious(Path("/nonexistent")))
    assert not _opcodes_no_global(pickle.dumps(list(range(100)), protocol=5))
    assert not _opcodes_no_global(pickle.dumps(bytearray(blob), protocol=5)[:-1])


def test_the_leaf_shape_passes_exactly_one_bytes_or_str_object() -> None:
    """leaf_stream passes PROTO, FRAME, one bytes/bytearray/str opcode, MEMOIZE, STOP and
    nothing else: checked against pickletools on every leaf size class and on mutations."""
    import random

    from enginewire.reference.ring.payload import leaf_stream

    rng = random.Random(11)
    leaves: list[Any] = [b"", bytearray(), "", "é" * 3]
    for size in (1, 255, 256, 1024, 16 * 1024, 70_000):
        raw = rng.randbytes(size)
        leaves += [raw, bytearray(raw), raw.decode("latin-1")]
    for value in leaves:
        stream = pickle.dumps(value, protocol=5)
        names = [op.name for op, _, _ in pickletools.genops(stream)]
        framed = names[:2] == ["PROTO", "FRAME"]
        assert leaf_stream(stream) == framed, (type(value), len(value), names)
        if framed:
            assert len(names) in (4, 5) and names[-1] == "STOP"
            assert PickleCodec().decode(stream, []) == value
    blob = pickle.dumps(bytearray(rng.randbytes(1024)), protocol=5)
    for stream in (blob[:-1], blob + b".", blob[:-1] + b"R", blob[:-2] + b"..",
                   blob[:11] + b"c" + blob[12:], blob[:11] + b"\x93" + blob[12:],
                   pickle.dumps([b"x"], protocol=5), pickle.dumps(5, protocol=5),
                   pickle.dumps(bytearray(b"x" * 40), protocol=2), b"\x80\x05\x95" + bytes(9),
                   _malicious(Path("/nonexistent"))):
        assert not leaf_stream(stream), stream[:16]
    mutated_streams = []
    for _ in range(2000):  # mutated leaf streams: whatever passes holds no global opcode
        mutated = bytearray(blob[:40])
        mutated[rng.randrange(40)] = rng.randrange(256)
        stream = bytes(mutated) + b"\x94."
        mutated_streams.append(stream)
        if leaf_stream(stream):
            assert not _has_global(stream)
    # PickleCodec.decode hands exactly the streams that pass the leaf test (or the checks after
    # it) to pickle.loads, and every other one to the allow-list.
    from enginewire.reference.ring import payload

    loaded: list[bytes] = []
    loads = pickle.loads

    def recording_loads(data: bytes, **kwargs: Any) -> Any:
        loaded.append(bytes(data))
        return loads(data, **kwargs)

    codec = PickleCodec()
    for stream in [pickle.dumps(value, protocol=5) for value in leaves] + mutated_streams:
        loaded.clear()
        payload.pickle.loads = recording_loads  # type: ignore[attr-defined]
        try:
            codec.decode(stream, [])
        except Exception:  # noqa: BLE001 - a mutated stream may be refused or broken
            pass
        finally:
            payload.pickle.loads = loads  # type: ignore[attr-defined]
        fast = (leaf_stream(stream) or payload._names_no_global(stream)
                or payload._opcodes_no_global(stream))
        assert (loaded == [stream]) == fast, stream[:16]


def test_the_global_first_shortcut_marks_only_streams_that_load_a_global() -> None:
    """_loads_a_global_first sends a stream to the allow-list without the checks for streams
    that load no global: it holds only for streams that load one (pickletools as the oracle),
    never for one those checks would pass, and for what a pickler writes for an instance or
    an array."""
    import random

    import numpy as np

    from enginewire.reference.ring.payload import (
        _loads_a_global_first,
        _names_no_global,
        _opcodes_no_global,
        leaf_stream,
    )

    def fast(stream: bytes) -> bool:
        return leaf_stream(stream) or _names_no_global(stream) or _opcodes_no_global(stream)

    for value in (_MakeDirs("x"), Colour.RED, np.arange(3), {"k": np.arange(3)}):
        stream = pickle.dumps(value, protocol=5)
        assert _loads_a_global_first(stream) == (not isinstance(value, dict)), value
    assert _loads_a_global_first(PickleCodec().encode(np.arange(3))[0])
    rng = random.Random(11)
    values: list[Any] = [os.makedirs, Colour.RED, _MakeDirs("x"), {1, 2}, b"\x8c\x94\x93",
                         "\x94\x8c", [1.5, b"\x63"], bytearray(b"c" * 40), np.arange(4), None]
    streams = [pickle.dumps(value, protocol=protocol)
               for protocol in range(0, 6) for value in values]
    for _ in range(3000):  # the streams above with one byte changed
        mutated = bytearray(rng.choice(streams))
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        streams.append(bytes(mutated))
    marked = 0
    for stream in streams:
        if not _loads_a_global_first(stream):
            continue
        marked += 1
        assert not fast(stream), stream[:24]
        try:
            assert _has_global(stream), stream[:24]
        except ValueError:
            pass  # not a pickle pickletools can read past the global
    assert marked > 100


def test_plain_leaves_pickle_to_the_bytes_of_the_kept_pickler() -> None:
    """The codec's pickle.dumps shortcut for plain leaves writes what its pickler writes."""
    import io

    from enginewire.reference.ring.payload import PLAIN_LEAF_TYPES

    codec = PickleCodec()
    values: list[Any] = [b"", b"x" * 2000, bytearray(os.urandom(1 << 20)), "s" * 300, 7,
                         2**90, -1.5, True, None]
    assert {type(value) for value in values} == PLAIN_LEAF_TYPES
    for value in values:
        oob: list[Any] = []
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL,
                                 buffer_callback=oob.append)
        pickler.dump(value)
        assert codec.encode(value) == [out.getvalue()] and oob == []


def test_trusted_opt_in_resolves_anything(tmp_path: Path) -> None:
    target = tmp_path / "made"
    PickleCodec(trusted=True).decode(_malicious(target), [])
    assert target.is_dir()


def test_allowed_values_round_trip() -> None:
    import collections
    import datetime

    import numpy as np

    value = {"od": collections.OrderedDict(a=1), "s": {1, 2}, "f": frozenset({3}),
             "sl": slice(1, 5, 2), "t": datetime.datetime(2026, 1, 1), "a": np.arange(5),
             "sc": np.float32(1.5)}
    codec = PickleCodec()
    got = codec.decode(*_split(codec.encode(value)))
    assert got["od"] == value["od"] and got["s"] == {1, 2} and got["sl"] == slice(1, 5, 2)
    assert (got["a"] == value["a"]).all() and got["sc"] == value["sc"]


def _split(buffers: list[Any]) -> tuple[Any, list[Any]]:
    return buffers[0], [bytearray(b) for b in buffers[1:]]


def test_enum_members_by_name_only_for_allowed_classes() -> None:
    # Python 3.12+ pickles an enum member as getattr(cls, name): allowed for the members of an
    # allowed enum class only (this test module's class is not under the allow-list).
    stream = pickle.dumps(Colour.RED, protocol=5)
    with pytest.raises(UnsafePickleError):
        PickleCodec().decode(stream, [])


def test_the_allow_list_is_spec_data() -> None:
    entries = load().surface("ring").pickle_allowed_globals
    assert "vllm.*" in entries and "collections.OrderedDict" in entries
    assert not any(entry.startswith(("os.", "subprocess.", "posix.")) for entry in entries)


def test_a_malicious_message_through_the_queue_is_refused_and_releases_the_slot(
        tmp_path: Path) -> None:
    target = tmp_path / "made"
    with MessageQueue(1, 1, max_chunk_bytes=4096, max_chunks=2) as writer:
        with MessageQueue.create_from_handle(writer.export_handle(), 0) as reader:
            _ready(writer, reader)
            writer.enqueue_buffers([_malicious(target)], timeout=STEP)
            with pytest.raises(UnsafePickleError):
                reader.dequeue(timeout=STEP)
            writer.enqueue("after", timeout=STEP)
            assert reader.dequeue(timeout=STEP) == "after"
    assert not target.exists()


def _ready(*ends: MessageQueue) -> None:
    import threading

    errors: list[BaseException] = []

    def run(end: MessageQueue) -> None:
        try:
            end.wait_until_ready(STEP)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(end,)) for end in ends]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(STEP + 5)
    assert not errors, errors


# --- finite waits -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["enqueue", "enqueue_buffers", "dequeue", "dequeue_buffers",
                                    "dequeue_borrowed", "acquire_read", "acquire_write",
                                    "wait_until_ready"])
def test_every_wait_has_a_finite_default(method: str) -> None:
    default = inspect.signature(getattr(MessageQueue, method)).parameters["timeout"].default
    assert default == DEFAULT_TIMEOUT_S
    assert DEFAULT_TIMEOUT_S == load().surface("ring").constants["default_timeout_s"]


# --- liveness and clean-up --------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, time
    from enginewire.reference.ring import MessageQueue
    mq = MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2)
    print(mq.export_handle().buffer_handle[3], mq.export_handle().local_subscribe_addr,
          mq.export_handle().local_notify_addr, flush=True)
    import pickle
    sys.stdout.write(pickle.dumps(mq.export_handle()).hex() + "\\n")
    sys.stdout.flush()
    mq.wait_until_ready(60)
    print("ready", flush=True)
    time.sleep(600)
""")

_READER = textwrap.dedent("""
    import sys, time, pickle
    from enginewire.reference.ring import MessageQueue
    mq = MessageQueue.create_from_handle(pickle.loads(bytes.fromhex(sys.argv[1])), 0)
    mq.wait_until_ready(60)
    print("ready", flush=True)
    time.sleep(600)
""")


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(process: subprocess.Popen[str]) -> None:
    _kill_group(process)
    process.wait(STEP)
    if process.stdout is not None:
        process.stdout.close()


def test_a_reader_notices_its_writer_killed_and_clean_removes_the_leftovers() -> None:
    writer = _spawn(_WRITER)
    try:
        assert writer.stdout is not None
        segment, subscribe, notify = writer.stdout.readline().split()
        handle = pickle.loads(bytes.fromhex(writer.stdout.readline().strip()))
        assert creator_of(segment) is not None and creator_of(segment).pid == writer.pid
        with MessageQueue.create_from_handle(handle, 0) as reader:
            reader.wait_until_ready(STEP)
            assert writer.stdout.readline().strip() == "ready"
            _kill_group(writer)
            started = time.monotonic()
            with pytest.raises(RingPeerDead) as caught:
                reader.dequeue(timeout=STEP)
            assert caught.value.clause == "ring.liveness.peer-dead"
            assert caught.value.peer == "writer" and caught.value.pid == writer.pid
            assert time.monotonic() - started < STEP  # the liveness check, not the timeout
        writer.wait(STEP)
        left = {str(p) for p in (Path("/dev/shm") / segment, Path(subscribe[6:]),
                                 Path(notify[6:])) if p.exists()}
        assert left == {str(Path("/dev/shm") / segment), subscribe[6:], notify[6:]}
        removed = {str(item.path) for item in clean()}
        assert left <= removed
        assert not any(Path(p).exists() for p in left)
    finally:
        _reap(writer)


def test_a_writer_notices_a_killed_reader() -> None:
    with MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2) as writer:
        reader = _spawn(_READER, pickle.dumps(writer.export_handle()).hex())
        try:
            writer.wait_until_ready(STEP)
            assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
            _kill_group(reader)
            with pytest.raises(RingPeerDead) as caught:
                for index in range(3):  # the third needs the dead reader's chunk
                    writer.enqueue(index, timeout=STEP)
            assert caught.value.peer == "reader 0" and caught.value.pid == reader.pid
        finally:
            _reap(reader)


def test_clean_never_removes_a_live_process_resources() -> None:
    with MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2) as mine:
        segment = Path("/dev/shm") / mine.export_handle().buffer_handle[3]  # type: ignore[index]
        ipc = Path(mine.export_handle().local_subscribe_addr[6:])  # type: ignore[index]
        found = {item.path for item in leftovers()}
        assert segment not in found and ipc not in found
        clean()
        assert segment.exists() and ipc.exists()


def test_a_reused_pid_with_another_start_time_counts_as_dead() -> None:
    me = this_process()
    assert me.alive()
    assert not Creator(me.pid, me.start + 1).alive() or me.start == 0
    assert not Creator(0, 0).alive()


def test_clean_command(capsys: pytest.CaptureFixture[str]) -> None:
    from enginewire.cli import main

    dead = _spawn("import time; time.sleep(600)")
    _reap(dead)
    start = 12345
    path = Path("/dev/shm") / f"ew-{Creator(dead.pid, start).tag}-deadbeef"
    path.write_bytes(b"x")
    try:
        assert main(["ring", "clean"]) == 0
        assert str(path) in capsys.readouterr().out
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


# --- file modes -------------------------------------------------------------------------------


def test_files_are_owner_only_under_umask_000() -> None:
    old = os.umask(0)
    base = Path(tempfile.mkdtemp(prefix="m"))
    try:
        ipc_dir = base / "n" / "i"
        with MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2,
                          ipc_dir=str(ipc_dir)) as writer:
            handle = writer.export_handle()
            for address in (handle.local_subscribe_addr, handle.local_notify_addr):
                assert stat.S_IMODE(os.stat(address[6:]).st_mode) == 0o600  # type: ignore[index]
            assert stat.S_IMODE(os.stat(ipc_dir).st_mode) == 0o700
            segment = Path("/dev/shm") / handle.buffer_handle[3]  # type: ignore[index]
            assert stat.S_IMODE(segment.stat().st_mode) == 0o600
    finally:
        os.umask(old)
        for directory in (base / "n" / "i", base / "n", base):
            directory.rmdir()


def test_engine_socket_files_are_owner_only_under_umask_000() -> None:
    import zmq

    from enginewire.reference.addresses import ipc_address
    from enginewire.reference.transport import open_socket

    old = os.umask(0)
    context = zmq.Context()
    try:
        address = ipc_address()
        sock = open_socket(context, "output", "frontend", address)
        try:
            assert stat.S_IMODE(os.stat(address[6:]).st_mode) == 0o600
        finally:
            sock.close()
    finally:
        os.umask(old)
        context.term()
    assert tempfile.gettempdir()


# --- deep nesting -------------------------------------------------------------------------------


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("name", ["pickle", "msgspec"])
def test_deep_values_are_payload_errors_not_recursion_errors(name: str) -> None:
    from enginewire.reference.errors import PayloadError
    from enginewire.reference.ring.payload import MsgspecCodec

    codec = PickleCodec() if name == "pickle" else MsgspecCodec()
    with pytest.raises(PayloadError):
        codec.encode(_deep(10_000))
    if name == "msgspec":
        with pytest.raises(PayloadError):
            codec.decode(b"\x91" * 10_000 + b"\xc0", [])
    else:
        stream = b"\x80\x05" + b"]" * 10_000 + b"a" * 9_999 + b"."
        got = codec.decode(stream, [])  # the unpickler is iterative: deep lists are data
        assert isinstance(got, list)
