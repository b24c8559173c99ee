"""The version history: derivation from wheels, consistency, per-release loading, compat and
match.

The re-derivation test needs the vLLM wheels of every release in ``history/releases.toml`` in
the wheel cache (``$ENGINEWIRE_WHEEL_DIR`` or ``~/.cache/enginewire/wheels``; fill it with
``enginewire spec history``); without them it is skipped, saying so. Everything else runs on
the committed data or on small wheels the tests build.
"""

from __future__ import annotations

import filecmp
import json
import shutil
import sys
import zipfile
from pathlib import Path

import msgspec
import pytest

from enginewire.cli import main
from enginewire.spec import load
from enginewire.spec.history import consistency
from enginewire.spec.history.compat import analyse, predict
from enginewire.spec.history.derive import derive, merge_runs
from enginewire.spec.history.extract import WheelSource
from enginewire.spec.history.match import layout_source, match_module
from enginewire.spec.history.wheels import (
    default_wheel_dir,
    find_wheel,
    read_releases,
    read_skipped,
)
from enginewire.spec.loader import DATA_DIR
from enginewire.spec.versions import VersionRange, parse_version

RELEASES = read_releases(DATA_DIR)


# --- committed data ---------------------------------------------------------------------


def test_committed_history_is_consistent() -> None:
    assert consistency.problems() == []


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _edit_after(path: Path, marker: str, old: str, new: str) -> None:
    """Replace the first ``old`` after ``marker`` (a table's first row) in ``path``."""
    head, tail = path.read_text().split(marker, 1)
    assert old in tail, (path, marker, old)
    path.write_text(head + marker + tail.replace(old, new, 1))


def _move_pickle_opt_in(text: str) -> str:
    """constants.toml with the [[pickle_opt_in]] rows moving the opt-in to 0.9.1."""
    head, tail = text.split("[[pickle_opt_in]]", 1)
    moved = tail.replace('versions = "0.9.0+"', 'versions = "0.9.1+"', 1).replace(
        'versions = "0.7.3-0.8.5"', 'versions = "0.7.3-0.9.0"', 1)
    assert moved != tail
    return head + "[[pickle_opt_in]]" + moved


@pytest.fixture(scope="module")
def broken_history(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The consistency problems of one copy of the data holding every break the tests below
    look for, each in a file or row of its own (one consistency run, about 2-4 s, instead of
    one per break); each test asserts the problem its break must cause."""
    data = tmp_path_factory.mktemp("history") / "data"
    shutil.copytree(DATA_DIR, data)
    # engine_index claims an earlier start: its range no longer starts at its first release,
    # and the layout change it brings at that release is not in changes.toml
    _edit(data / "structs" / "EngineCoreOutputs.toml",
          'name = "engine_index"\ntype = "int"\nversions = "0.8.3+"',
          'name = "engine_index"\ntype = "int"\nversions = "0.8.2+"')
    # A default naming a key the older releases' PrefixCacheStats does not have.
    _edit(data / "structs" / "SchedulerStats.toml",
          'versions = "0.7.3-0.31.0"\ndefault = "{}"',
          'versions = "0.7.3-0.31.0"\ndefault = "{\\"hits_by_source\\": {}}"')
    constants = data / "history" / "constants.toml"
    # A READY key the derivation never saw.
    _edit(constants, '"parallel_config_hash"] } }', '"parallel_config_hash", "zz_new"] } }')
    # The opt-in moved to 0.9.1, and its setting renamed at the newest release.
    constants.write_text(_move_pickle_opt_in(constants.read_text()))
    _edit(constants, '"VLLM_ALLOW_INSECURE_SERIALIZATION"', '"VLLM_INSECURE"')
    # The newest release's input bound by the engine, without identity.
    _edit_after(constants, "[[transport]]", '"binds" = "frontend", "identity" = true',
                '"binds" = "engine", "identity" = false')
    # The newest UTILITY payload without client_index.
    _edit_after(constants, "[[utility_payload]]", '["client_index", "call_id", "method", "args"]',
                '["call_id", "method", "args"]')
    return consistency.problems(data)


def test_consistency_check_fails_on_an_overlap_and_an_unlisted_change(
        broken_history: list[str]) -> None:
    found = broken_history
    assert any("0.8.1 to 0.8.2" in p and "EngineCoreOutputs" in p for p in found), found


def test_history_spans_first_ipc_release_to_reference() -> None:
    assert RELEASES[0] == "0.7.3" and RELEASES[-1] == "0.33.0"
    assert "0.7.2" in read_skipped(DATA_DIR)
    for minor in {tuple(v.split(".")[:2]) for v in RELEASES}:
        assert any(tuple(v.split(".")[:2]) == minor for v in RELEASES)


def test_every_release_loads_with_its_own_layout() -> None:
    old = load("0.8.0").struct("EngineCoreRequest")
    new = load("0.33.0").struct("EngineCoreRequest")
    assert [f.name for f in old.fields][:3] == ["request_id", "prompt", "prompt_token_ids"]
    assert [f.name for f in new.fields][:3] == ["request_id", "prompt_token_ids", "mm_features"]
    assert "engine_index" not in [f.name for f in load("0.8.2").struct("EngineCoreOutputs").fields]
    assert load("0.8.3").struct("EngineCoreOutputs").fields[0].name == "engine_index"


def test_reference_classes_build_per_release() -> None:
    from enginewire.reference import structs

    old = structs.build("0.8.0")["EngineCoreRequest"]
    assert [f.name for f in msgspec.structs.fields(old)][1] == "prompt"
    assert [f.name for f in msgspec.structs.fields(structs.EngineCoreRequest)][1] == \
        "prompt_token_ids"


@pytest.mark.parametrize("version", ["0.22.5", "0.6.4", "1.0.0", "x"])
def test_unknown_release_is_a_one_line_error(version: str, capsys) -> None:
    try:
        code = main(["spec", "check", "--version", version])
    except SystemExit as exc:  # argparse's type check: a text that is no version at all
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "not a release" in err or "version" in err


def test_older_release_checks_with_its_structs(capsys) -> None:
    assert main(["spec", "check", "--version", "0.22.0"]) == 0
    out = capsys.readouterr().out
    assert "spec ok for vLLM 0.22.0" in out and " 0 structs" not in out


# --- derivation on small wheels ------------------------------------------------------------

STRUCT_FILE = '''name = "EngineCoreRequest"
encoding = "array"
versions = "0.2.0+"
source = "vllm/v1/engine/__init__.py:1"
vllm_class = "vllm.v1.engine:EngineCoreRequest"
description = "probe"

[[fields]]
name = "request_id"
type = "str"
description = "hand-written"
required = true

[[fields]]
name = "extra"
type = "int | none"
required = true

[[fields]]
name = "prompt_token_ids"
type = "list[int] | none"
required = true

[[fields]]
name = "flag"
type = "bool"
default = "false"
'''

RELEASE_1 = '''
import msgspec
from typing import List, Optional
from .kinds import Kind

class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    prompt_token_ids: List[int]
    gone: Optional["Kind"]
'''
RELEASE_2 = '''
import msgspec

class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    extra: int | None
    prompt_token_ids: list[int] | None
    flag: bool = False
'''


def _wheel(path: Path, engine: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/v1/engine/__init__.py", engine)
        archive.writestr("vllm/v1/engine/kinds.py", "class Kind(dict):\n    pass\n")
    return path


def test_derive_writes_ranges_keeps_hand_written_blocks_and_is_stable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "structs").mkdir(parents=True)
    (data / "structs" / "EngineCoreRequest.toml").write_text(STRUCT_FILE)
    wheels = {"0.1.0": _wheel(tmp_path / "vllm-0.1.0-x.whl", RELEASE_1),
              "0.2.0": _wheel(tmp_path / "vllm-0.2.0-x.whl", RELEASE_2)}
    derive(data, wheels, log=lambda _m: None, use_cache=False, changes=False)
    text = (data / "structs" / "EngineCoreRequest.toml").read_text()
    raw = __import__("tomllib").loads(text)
    assert raw["versions"] == "0.1.0+"
    entries = [(f["name"], f["type"], f.get("versions")) for f in raw["fields"]]
    assert entries == [
        ("request_id", "str", None),
        ("prompt_token_ids", "list[int]", "0.1.0"),
        ("gone", "any", "0.1.0"),
        ("extra", "int | none", "0.2.0+"),
        ("prompt_token_ids", "list[int] | none", "0.2.0+"),
        ("flag", "bool", "0.2.0+"),
    ]
    assert 'description = "hand-written"' in text
    history = (data / "history" / "structs.toml").read_text()
    assert '"gone" = { "0.1.0" = "Optional[\'Kind\']" }' in history
    derive(data, wheels, log=lambda _m: None, use_cache=False, changes=False)
    assert (data / "structs" / "EngineCoreRequest.toml").read_text() == text


def test_merge_runs_gives_each_release_its_order() -> None:
    releases = [("3", ["a", "c", "b", "d"]), ("2", ["a", "b", "c"]), ("1", ["a", "x", "b"])]
    merged = merge_runs([(v, keys, keys) for v, keys in releases])
    for version, keys in releases:
        assert [e.key for e in merged if version in e.releases] == keys
    for entry in merged:
        order = [v for v, _ in releases]
        positions = sorted(order.index(v) for v in entry.releases)
        assert positions == list(range(positions[0], positions[-1] + 1))


def test_extract_follows_reexports_and_translates(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/v1/engine/__init__.py", "from vllm.v1.other import Out\n")
        archive.writestr("vllm/v1/other.py", (
            "import enum, msgspec, torch\nfrom typing import Optional, Union, Any\n"
            "class Reason(enum.IntEnum):\n    STOP = 0\n    LENGTH = enum.auto()\n"
            "class Out(msgspec.Struct, array_like=True):\n    t: Optional[torch.Tensor]\n"
            "    r: Reason = Reason.LENGTH\n    u: Union[int, str, None] = None\n"
            "    m: dict = {}\n"))
    with WheelSource(wheel) as source:
        reason = source.describe_class("Reason", ["vllm.v1.other"], set())
        assert reason is not None and reason.members == [("STOP", 0), ("LENGTH", 1)]
        found = source.describe_class("Out", ["vllm.v1.engine"], {"Reason"},
                                      {"Reason": dict(reason.members)})
    assert found is not None and found.kind == "array" and found.module == "vllm.v1.other"
    assert [(f.name, f.type, f.default) for f in found.fields] == [
        ("t", "tensor | none", None), ("r", "Reason", "1"), ("u", "int | str | none", "null"),
        ("m", "dict[any, any]", "{}")]


# --- re-derivation from the real wheels -----------------------------------------------------


def _cached_wheels() -> dict[str, Path] | None:
    folder = default_wheel_dir()
    wanted = [*RELEASES, *read_skipped(DATA_DIR)]
    found = {v: find_wheel(folder, v) for v in wanted}
    return None if any(p is None for p in found.values()) else found  # type: ignore[return-value]


def test_committed_history_rederives_from_the_wheels(tmp_path: Path) -> None:
    wheels = _cached_wheels()
    if wheels is None:
        pytest.skip(f"RE-DERIVATION SKIPPED: the wheel cache {default_wheel_dir()} lacks some of "
                    "the releases in spec/data/history/releases.toml; run `enginewire spec "
                    "history` (downloads them) or set ENGINEWIRE_WHEEL_DIR")
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    derive(data, wheels, log=lambda _m: None)
    comparison = filecmp.dircmp(DATA_DIR, data)
    differing: list[str] = []

    def walk(cmp: filecmp.dircmp, prefix: str) -> None:
        differing.extend(prefix + n for n in cmp.diff_files + cmp.left_only + cmp.right_only
                         if n != "__pycache__")
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(comparison, "")
    assert differing == [], f"re-derived spec data differs from the committed: {differing}"


# --- compat and match -------------------------------------------------------------------------


def test_compat_inserted_field_is_predicted_and_confirmed() -> None:
    verdicts = {v.kind: v for v in analyse("0.8.2", "0.8.3")}
    outputs = verdicts["outputs"]
    assert outputs.verdict == "rejected"
    assert any(f.position == 0 and f.writer_field == "engine_index" and
               f.reader_field == "outputs" for f in outputs.findings)
    assert outputs.confirmed is True
    assert all(v.confirmed is not False for v in verdicts.values())


def test_compat_same_release_is_identical() -> None:
    assert {v.verdict for v in predict("0.20.0", "0.20.0")} == {"identical"}


def test_compat_silent_misdecode_is_reported_with_both_meanings() -> None:
    verdicts = analyse("0.9.0", "0.9.1")
    silent = [f for v in verdicts for f in v.findings if f.kind == "silent"]
    assert silent, [(v.kind, v.verdict) for v in verdicts]
    assert all(f.writer_field and f.reader_field and f.passes_type_check for f in silent
               if f.position is not None)
    assert all(v.confirmed is not False for v in verdicts)


def test_compat_cli_refuses_unknown_release(capsys) -> None:
    assert main(["compat", "0.22.5", "0.33.0"]) == 2
    assert "not a release" in capsys.readouterr().err


def test_match_names_the_release_and_the_first_difference(tmp_path: Path, monkeypatch) -> None:
    names = ["EngineCoreRequest", "EngineCoreOutputs"]
    (tmp_path / "mirror_exact.py").write_text(layout_source("0.10.2", names))
    moved = layout_source("0.10.2", names).replace(
        "    arrival_time:", "    zz_inserted: int\n    arrival_time:", 1)
    (tmp_path / "mirror_moved.py").write_text(moved)
    monkeypatch.syspath_prepend(str(tmp_path))
    exact = {r.name: r for r in match_module("mirror_exact")}
    assert "0.10.2" in exact["EngineCoreRequest"].matches
    assert "0.33.0" not in exact["EngineCoreRequest"].matches
    near = {r.name: r for r in match_module("mirror_moved")}["EngineCoreRequest"]
    assert near.matches == [] and near.nearest == "0.10.2"
    assert near.target_meaning == "zz_inserted: int"
    assert near.spec_meaning is not None and near.spec_meaning.startswith("arrival_time")
    for module in ("mirror_exact", "mirror_moved"):
        sys.modules.pop(module, None)


def test_compat_json_names_every_message(capsys) -> None:
    assert main(["compat", "0.33.0", "0.33.0", "--json", "--no-confirm"]) == 0
    kinds = {v["kind"] for v in json.loads(capsys.readouterr().out)}
    assert {"add", "outputs", "ready_response"} <= kinds


def test_append_only_check_fails_on_an_inserted_field(monkeypatch) -> None:
    import enginewire.spec as spec_package
    from enginewire.conformance.checks import codec_messages as codec
    from enginewire.conformance.framework.registry import CheckFailure

    codec._append_only(None, None)  # the committed spec: 0.33.0 only appends to 0.32.0
    real_load = spec_package.load

    def swapped(version=None, data_dir=None):
        found = real_load(version, data_dir)
        if version is not None:
            return found
        item = found.struct("UtilityOutput")
        fields = [item.fields[1], item.fields[0], *item.fields[2:]]
        structs = {**found.structs, "UtilityOutput": msgspec.structs.replace(item, fields=fields)}
        return type(found)(found.version, found.surfaces, structs, found.clauses)

    monkeypatch.setattr(spec_package, "load", swapped)
    with pytest.raises(CheckFailure, match="UtilityOutput"):
        codec._append_only(None, None)


def test_check_follows_an_older_release(capsys) -> None:
    # The struct checks follow 0.9.1's layout, and RequestError (0.33.0 only) is skipped
    assert main(["check", "--version", "0.9.1", "--no-progress", "-k",
                 "codec/struct/lora-request/*", "-k", "codec/struct/request-error/*"]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "skipped" in out
    assert main(["check", "--version", "0.9.5"]) == 2


def test_compat_renumbered_request_type_is_silent_and_confirmed() -> None:
    utility = {v.kind: v for v in analyse("0.8.2", "0.8.3")}["utility"]
    assert utility.verdict == "silent" and utility.confirmed is True
    finding = next(f for f in utility.findings if f.path == "request type UTILITY")
    assert (finding.writer_field, finding.reader_field) == ("UTILITY", "START_DP")
    assert {v.kind: v for v in analyse("0.33.0", "0.7.3")}["utility"].verdict == "rejected"


def test_consistency_check_fails_on_a_default_an_older_release_cannot_hold(
        broken_history: list[str]) -> None:
    found = broken_history
    assert any("SchedulerStats.prefix_cache_stats at 0.7.3" in p for p in found), found


# --- handshake keys, ready response and chunk framing ------------------------------------------

_CORE = '''
import msgspec
def handshake(sock, local, cfg):
    sock.send(msgspec.msgpack.encode({"status": "HELLO", "local": local}))
    ready_msg = {"status": "READY", "local": local}
    if cfg:
        ready_msg["config_hash"] = 1
    sock.send(msgspec.msgpack.encode(ready_msg))
def piped(pipe):
    pipe.send({"status": "READY", "not_on_the_wire": 1})
def serve(input_socket):
    input_socket.send(b"")
'''

_SHM = '''
import pickle
class MessageQueue:
    def enqueue(self, obj):
        {body}
'''


def _protocol_wheel(tmp_path: Path, shm_body: str) -> Path:
    wheel = tmp_path / "p.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/v1/engine/core.py", _CORE)
        archive.writestr("vllm/distributed/device_communicators/shm_broadcast.py",
                         _SHM.format(body=shm_body))
    return wheel


def test_protocol_facts_read_handshake_keys_ready_response_and_framing(tmp_path: Path) -> None:
    from enginewire.spec.history.protocol_facts import (
        chunk_framing,
        handshake_keys,
        ready_response,
    )

    buffers = ("buf[1:3] = to_bytes_big(len(all_buffers), 2)\n"
               "        buf[3:7] = to_bytes_big(buf_len, 4)")
    with WheelSource(_protocol_wheel(tmp_path, buffers)) as source:
        assert handshake_keys(source) == {
            "HELLO": {"required": ["local", "status"], "optional": []},
            "READY": {"required": ["local", "status"], "optional": ["config_hash"]}}
        assert ready_response(source) == "empty"
        assert chunk_framing(source) == {"framing": "buffers", "count_bytes": 2,
                                         "length_bytes": 4}
    (tmp_path / "p.whl").unlink()
    with WheelSource(_protocol_wheel(tmp_path, "data = pickle.dumps(obj)")) as source:
        assert chunk_framing(source) == {"framing": "pickle"}


def test_ready_response_is_the_ready_map_when_the_handshake_runs_on_the_input_socket(
        tmp_path: Path) -> None:
    """0.9.0's engine ran its handshake on the input socket: its READY map is the ready
    message there. The same map on another socket (a handshake socket) is none."""
    from enginewire.spec.history.protocol_facts import ready_response

    core = '''
import msgspec
def run(input_socket, handshake_socket, n):
    handshake_socket.send(msgspec.msgpack.encode({"status": "READY", "local": True}))
    {send}
'''
    for send, expected in (
            ('input_socket.send(msgspec.msgpack.encode({"status": "READY", "n": n}))',
             "handshake"),
            ('input_socket.send(msgspec.msgpack.encode({"status": "HELLO", "n": n}))', "none")):
        wheel = tmp_path / f"{expected}.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/v1/engine/core.py", core.replace("{send}", send))
        with WheelSource(wheel) as source:
            assert ready_response(source) == expected, send


_SERIAL_PICKLE = """
import pickle
CUSTOM_TYPE_TENSOR = 1
def custom_enc_hook(obj):
    if isinstance(obj, torch.Tensor):
        return msgpack.Ext(CUSTOM_TYPE_TENSOR, pickle.dumps(obj.numpy()))
    return msgpack.Ext(CUSTOM_TYPE_PICKLE, pickle.dumps(obj))
"""

_SERIAL_NUMPY = """
MIN_NOCOPY_BUF_SIZE = 512
class MsgpackEncoder:
    def enc_hook(self, obj):
        if isinstance(obj, torch.Tensor):
            return self._encode_ndarray(obj.numpy())
        if isinstance(obj, np.ndarray) and obj.dtype.kind not in ('O', 'V'):
            return self._encode_ndarray(obj)
    def _encode_ndarray(self, obj):
        if not obj.shape or obj.nbytes < MIN_NOCOPY_BUF_SIZE:
            return 1
"""

_SERIAL_TUPLE = """
class MsgpackEncoder:
    def enc_hook(self, obj):
        if isinstance(obj, torch.Tensor):
            return self._encode_tensor(obj)
        if isinstance(obj, np.ndarray) and obj.dtype.kind not in ('O', 'V'):
            return self._encode_ndarray(obj)
    def _encode_ndarray(self, obj):
        if not obj.shape or obj.nbytes < self.size_threshold:
            return 1
"""


@pytest.mark.parametrize(("source_text", "expected"), [
    (_SERIAL_PICKLE, {"ndarray": "pickle", "tensor": "pickle"}),
    (_SERIAL_NUMPY, {"fixed_threshold": 512, "ndarray": "tuple", "tensor": "numpy"}),
    (_SERIAL_TUPLE, {"ndarray": "tuple", "tensor": "tuple"}),
])
def test_protocol_facts_read_the_tensor_form(tmp_path: Path, source_text: str,
                                             expected: dict[str, object]) -> None:
    """The encoder hook's branch for a tensor and for an array tells the form (pickle, the
    numpy view's tuple, the torch tuple); a module constant compared with nbytes is a fixed
    threshold."""
    from enginewire.spec.history.protocol_facts import tensor_form

    wheel = tmp_path / "t.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/v1/serial_utils.py", source_text)
    with WheelSource(wheel) as source:
        assert tensor_form(source) == expected


def test_committed_handshake_keys_follow_the_handshake_spec() -> None:
    """The derived keys of the newest release are the keys handshake.toml specifies, and the
    history shows the change the wheels had (HELLO gained ``headless`` in 0.10.0)."""
    import tomllib

    with (DATA_DIR / "history" / "constants.toml").open("rb") as handle:
        rows = tomllib.load(handle)["handshake"]
    by_release = {v: next(r["values"] for r in rows
                          if parse_version(v) in VersionRange.parse(r["versions"]))
                  for v in ("0.9.2", "0.10.0")}
    assert "headless" not in by_release["0.9.2"]["HELLO"]["required"]
    assert "headless" in by_release["0.10.0"]["HELLO"]["required"]


def test_consistency_fails_when_derived_handshake_keys_leave_the_spec(
        broken_history: list[str]) -> None:
    found = broken_history
    assert any("READY optional keys" in p and "zz_new" in p for p in found), found


# --- transport: sockets, binds, identity, readiness ------------------------------------------

_OLD_UTILS = '''
def make_zmq_socket(ctx, path, type):
    socket = ctx.socket(type)
    if type == zmq.constants.PULL:
        socket.connect(path)
    elif type == zmq.constants.PUSH:
        socket.bind(path)
    return socket
'''
_NEW_UTILS = '''
def make_zmq_socket(ctx, path, socket_type, bind=None, identity=None):
    socket = ctx.socket(socket_type)
    if bind is None:
        bind = socket_type not in (zmq.PUSH, zmq.SUB)
    if bind:
        socket.bind(path)
    else:
        socket.connect(path)
    return socket
'''
_OLD_CORE = '''
def run(ready_pipe, input_path, output_path, coord_input_path):
    ready_pipe.send({"status": "READY"})
    with zmq_socket_ctx(input_path, zmq.constants.PULL) as socket:
        pass
    with zmq_socket_ctx(output_path, zmq.constants.PUSH) as socket:
        pass
    make_zmq_socket(ctx, coord_input_path, zmq.XSUB)
'''
_OLD_CLIENT = '''
def client(ctx, input_path, output_path):
    out_socket = make_zmq_socket(ctx, output_path, zmq.constants.PULL)
    input_socket = make_zmq_socket(ctx, input_path, zmq.constants.PUSH)
'''
_NEW_CORE = '''
def run(ctx, identity, input_addresses, output_path):
    inputs = [make_zmq_socket(ctx, input_address, zmq.DEALER, identity=identity, bind=False)
              for input_address in input_addresses]
    socket = inputs[0]
    socket.send(b'READY')
    make_zmq_socket(ctx, output_path, zmq.PUSH)
'''
_NEW_CLIENT = '''
def client(ctx, input_address, output_address):
    make_zmq_socket(ctx, input_address, zmq.ROUTER, bind=True)
    make_zmq_socket(ctx, output_address, zmq.PULL)
'''


def _transport_wheel(path: Path, utils: str, core: str, client: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/utils.py", utils)
        archive.writestr("vllm/v1/engine/core.py", core)
        archive.writestr("vllm/v1/engine/core_client.py", client)
    return path


def test_transport_facts_read_sockets_binds_identity_and_readiness(tmp_path: Path) -> None:
    """Socket types from the calls, binds from the call or make_zmq_socket's rule (the if/elif
    chain of old releases, the ``bind = ... not in (...)`` default of newer ones), the
    identity keyword, a loop for per-client sockets, readiness from pipe or input literal."""
    from enginewire.spec.history.protocol_facts import ready_response
    from enginewire.spec.history.transport_facts import transport

    old = _transport_wheel(tmp_path / "old.whl", _OLD_UTILS, _OLD_CORE, _OLD_CLIENT)
    with WheelSource(old) as source:
        assert transport(source, False, ready_response(source)) == {
            "input": {"frontend": "PUSH", "engine": "PULL", "binds": "frontend",
                      "identity": False},
            "output": {"frontend": "PULL", "engine": "PUSH", "binds": "engine"},
            "clients": "one", "readiness": "pipe"}
    new = _transport_wheel(tmp_path / "new.whl", _NEW_UTILS, _NEW_CORE, _NEW_CLIENT)
    with WheelSource(new) as source:
        assert ready_response(source) == "READY"
        assert transport(source, False, "READY") == {
            "input": {"frontend": "ROUTER", "engine": "DEALER", "binds": "frontend",
                      "identity": True},
            "output": {"frontend": "PULL", "engine": "PUSH", "binds": "frontend"},
            "clients": "per-client", "readiness": "input-literal"}
        assert transport(source, True, "empty")["readiness"] == "handshake"
        assert transport(source, True, "handshake")["readiness"] == "handshake-on-input"
    # The other rule for the same calls: every end binds or connects by it.
    flipped = _transport_wheel(tmp_path / "flipped.whl",
                               _OLD_UTILS.replace("connect(path)", "TMP").replace(
                                   "bind(path)", "connect(path)").replace("TMP", "bind(path)"),
                               _OLD_CORE, _OLD_CLIENT)
    with WheelSource(flipped) as source:
        found = transport(source, False, "none")
        assert found["input"]["binds"] == "engine" and found["output"]["binds"] == "frontend"


def test_committed_transport_history_says_what_the_wheels_had() -> None:
    from enginewire.spec.history.release_facts import transport_at

    old, mid, dealer, newest = (transport_at(v) for v in ("0.8.2", "0.8.3", "0.8.5", "0.33.0"))
    assert old is not None and mid is not None and dealer is not None and newest is not None
    assert (old.input.frontend, old.input.engine, old.input.binds) == ("PUSH", "PULL",
                                                                      "frontend")
    assert old.output.binds == "engine" and mid.output.binds == "frontend"
    assert mid.input.binds == "engine" and not mid.identity and mid.readiness == "pipe"
    assert dealer.identity and dealer.readiness == "input-literal" and not dealer.handshake
    assert newest.handshake and newest.clients == "per-client"


def test_consistency_fails_when_the_transport_row_leaves_the_spec(
        broken_history: list[str]) -> None:
    found = broken_history
    assert any("[[transport]] at 0.33.0" in p and "bound by engine" in p for p in found), found
    assert any("input identity False" in p for p in found), found


@pytest.mark.slow
def test_real_wheels_confirm_the_silent_break_of_0_9_1() -> None:
    """0.9.0's and 0.9.1's own classes (each in its own subprocess, the extra dependencies
    installed outside the repository on demand): an add message of a 0.9.0 front end decodes
    at a 0.9.1 engine with current_wave lost (the SILENT prediction), the outputs decode."""
    from enginewire.spec.history.compat import real_wheel_check

    folder = default_wheel_dir()
    if find_wheel(folder, "0.9.0") is None or find_wheel(folder, "0.9.1") is None:
        pytest.skip(f"REAL-WHEEL CHECK SKIPPED: no 0.9.0 / 0.9.1 wheel in {folder}")
    results = {r.struct: r for r in real_wheel_check("0.9.0", "0.9.1", echo=False)}
    request, outputs = results["EngineCoreRequest"], results["EngineCoreOutputs"]
    assert request.predicted == "silent" and request.outcome == "misdecoded", request
    assert "current_wave" in request.detail and request.agrees
    assert outputs.outcome == "decoded" and outputs.agrees, outputs


def _nested_sample(writer: str, reader: str, kind: str, name: str) -> tuple[object, frozenset]:
    from enginewire.spec.history.compat import (
        _Sampler,
        _top_level_sample,
        nested_breaks,
        predict,
        spec_for,
    )

    verdict = next(v for v in predict(*sorted((writer, reader), key=parse_version))
                   if v.kind == kind)
    wspec = spec_for(writer)
    realistic = nested_breaks(verdict)
    minimal = _Sampler(wspec, minimal=True).struct(wspec.struct(name))
    return _top_level_sample(wspec, name, minimal, realistic), realistic


def test_nested_breaks_get_realistic_nested_values_in_the_real_wheel_sample() -> None:
    """0.22.0 <-> 0.33.0: the prediction finds breaks inside LoRARequest (add) and inside
    EngineCoreOutput (outputs); the real-wheel sample carries those nested values (a minimal
    one leaves them null and decodes), and classes built from the spec for the two releases
    show the nested rejection where the prediction puts it, and the silent read of 0.33.0's
    trace_headers as 0.22.0's all-default PrefillStats."""
    import msgspec

    from enginewire.spec.classes import build

    sample, realistic = _nested_sample("0.22.0", "0.33.0", "add", "EngineCoreRequest")
    assert realistic == {"lora_request"}
    assert isinstance(sample, list) and isinstance(sample[6], list)
    assert isinstance(sample[6][4], dict) and sample[6][4], sample[6]
    writer, reader = build("0.22.0"), build("0.33.0")
    data = msgspec.msgpack.encode(msgspec.convert(sample, writer["EngineCoreRequest"]))
    with pytest.raises(msgspec.ValidationError, match=r"\$\[6\]\[4\]"):
        msgspec.msgpack.decode(data, type=reader["EngineCoreRequest"])

    from enginewire.spec.history.compat import predict

    found = {f.path.rsplit("]", 1)[0].rsplit("[", 1)[1]: f.kind
             for v in predict("0.22.0", "0.33.0") if v.kind == "outputs" for f in v.findings
             if "outputs<EngineCoreOutput>[" in f.path}
    assert found["10"] == "silent" and found["11"] == "rejected", found
    sample, realistic = _nested_sample("0.33.0", "0.22.0", "outputs", "EngineCoreOutputs")
    assert realistic == {"outputs"}
    assert isinstance(sample, list)
    output = sample[1][0]
    assert output[9] and output[10], output  # ec_transfer_params, trace_headers set
    writer, reader = build("0.33.0"), build("0.22.0")
    with pytest.raises(msgspec.ValidationError, match=r"\$\[1\]\[0\]\[11\]"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(
            msgspec.convert(sample, writer["EngineCoreOutputs"])),
            type=reader["EngineCoreOutputs"])
    # Positions 0-10 only (the rejections at 11 and 12 out of the way): 9 and 10 decode.
    wire = msgspec.to_builtins(msgspec.convert(sample, writer["EngineCoreOutputs"]))
    wire[1][0] = wire[1][0][:11]
    read = msgspec.msgpack.decode(msgspec.msgpack.encode(wire),
                                  type=reader["EngineCoreOutputs"])
    assert read.outputs[0].trace_headers == output[9]  # ec_transfer_params, silently
    assert read.outputs[0].prefill_stats == reader["PrefillStats"]()  # trace headers lost


@pytest.mark.slow
def test_real_wheels_confirm_the_nested_rejections_of_0_22_0_and_0_33_0() -> None:
    """0.22.0's and 0.33.0's own classes, each in its own subprocess: with realistic nested
    values (a LoRA request carrying a tensorizer config; an output with transfer parameters,
    trace headers and prefill stats), the add message of a 0.22.0 front end is rejected by a
    0.33.0 engine inside the LoRA request at the predicted position, and the outputs of a
    0.33.0 engine are rejected by a 0.22.0 front end inside the output at position 11
    (prefill_stats read as routed_experts); position 10 (trace_headers read as
    prefill_stats) decodes, as the prediction says (silent)."""
    from enginewire.spec.history.compat import real_wheel_check

    folder = default_wheel_dir()
    if find_wheel(folder, "0.22.0") is None or find_wheel(folder, "0.33.0") is None:
        pytest.skip(f"REAL-WHEEL CHECK SKIPPED: no 0.22.0 / 0.33.0 wheel in {folder}")
    results = {r.struct: r for r in real_wheel_check("0.22.0", "0.33.0", echo=False)}
    request, outputs = results["EngineCoreRequest"], results["EngineCoreOutputs"]
    assert request.outcome == "rejected" and request.agrees, request
    assert "realistic nested lora_request" in request.detail
    assert "$[6][4]" in request.detail, request
    assert outputs.outcome == "rejected" and outputs.agrees, outputs
    assert "realistic nested outputs" in outputs.detail
    assert "$[1][0][11]" in outputs.detail, outputs


def test_init_message_is_the_typed_decode_or_the_keys_read_from_a_plain_map(
        tmp_path: Path) -> None:
    """0.9.0 read its init message as a plain map (``init_message["key"]``); 0.9.1 on decode
    it as EngineHandshakeMetadata. Another decode in the same function (0.33.0's elastic-EP
    scale-up message) is not the init message."""
    from enginewire.spec.history.protocol_facts import init_message
    from enginewire.spec.history.release_facts import init_message_at

    plain = '''
import msgspec
def startup_handshake(sock):
    init_message = msgspec.msgpack.decode(sock.recv())
    return init_message["output_socket_address"], init_message["parallel_config"]
'''
    typed = '''
import msgspec
def startup_handshake(sock, elastic):
    if elastic:
        scale_up = msgspec.msgpack.decode(sock.recv(), type=ScaleUpMetadata)
    init_message: EngineHandshakeMetadata = msgspec.msgpack.decode(
        sock.recv(), type=EngineHandshakeMetadata)
    return init_message.addresses
'''
    expected = [{"form": "map", "keys": ["output_socket_address", "parallel_config"]},
                {"form": "struct", "struct": "EngineHandshakeMetadata"}, {}]
    for name, text, want in zip(("plain", "typed", "none"), (plain, typed, "x = 1\n"),
                                expected, strict=True):
        wheel = tmp_path / f"{name}.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/v1/engine/core.py", text)
        with WheelSource(wheel) as source:
            assert init_message(source) == want, name
    assert init_message_at("0.9.0") == expected[0]
    assert init_message_at("0.9.1") == expected[1]
    assert init_message_at("0.8.5") == {"form": "none"}


def test_utility_payload_items_are_read_from_the_engine_unpacking(tmp_path: Path) -> None:
    """Up to 0.9.0 the engine unpacks ``call_id, method_name, args = request``; from 0.9.1
    ``client_idx, call_id, method_name, args``; the history names them the spec's way."""
    from enginewire.spec.history.protocol_facts import utility_payload
    from enginewire.spec.history.release_facts import utility_payload_at

    template = '''
def _handle_client_request(self, request_type, request):
    if request_type == EngineCoreRequestType.ADD:
        self.add_request(request)
    elif request_type == EngineCoreRequestType.UTILITY:
        {names} = request
'''
    cases = {"call_id, method_name, args": ["call_id", "method", "args"],
             "client_idx, call_id, method_name, args":
                 ["client_index", "call_id", "method", "args"]}
    for names, want in cases.items():
        wheel = tmp_path / f"{len(want)}.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/v1/engine/core.py", template.format(names=names))
        with WheelSource(wheel) as source:
            assert utility_payload(source) == want, names
    assert utility_payload_at("0.9.0") == ["call_id", "method", "args"]
    assert utility_payload_at("0.7.3") == ["call_id", "method", "args"]
    assert utility_payload_at("0.9.1") == ["client_index", "call_id", "method", "args"]
    assert utility_payload_at("0.33.0") == ["client_index", "call_id", "method", "args"]


def test_consistency_fails_when_the_utility_items_leave_the_frames_spec(
        broken_history: list[str]) -> None:
    """The newest [[utility_payload]] row must type as frames.toml's utility payload; a row
    that drops client_index at 0.33.0 is reported, and the loader gives older releases their
    own payload."""
    found = broken_history
    assert any("UTILITY items ['call_id', 'method', 'args'] at 0.33.0" in p for p in found), \
        found
    old = load("0.9.0").surface("frames")
    [payload] = [f.payload for m in old.messages if m.kind == "utility"
                 for f in m.frames if f.content == "msgpack"]
    assert payload == "tuple[int, str, tuple[any, ...]]"


_SERIAL_NO_OPT_IN = '''
import pickle
class MsgpackEncoder:
    def enc_hook(self, obj):
        if isinstance(obj, FunctionType):
            return msgpack.Ext(CUSTOM_TYPE_CLOUDPICKLE, cloudpickle.dumps(obj))
        return msgpack.Ext(CUSTOM_TYPE_PICKLE, pickle.dumps(obj))
class MsgpackDecoder:
    def ext_hook(self, code, data):
        if code == CUSTOM_TYPE_PICKLE:
            return pickle.loads(data)
'''

_SERIAL_OPT_IN = '''
import pickle
from vllm import envs
class MsgpackEncoder:
    def __init__(self):
        if envs.VLLM_ALLOW_INSECURE_SERIALIZATION:
            _log_insecure_serialization_warning()
    def enc_hook(self, obj):
        if not envs.VLLM_ALLOW_INSECURE_SERIALIZATION:
            raise TypeError("Set VLLM_ALLOW_INSECURE_SERIALIZATION=1")
        return msgpack.Ext(CUSTOM_TYPE_PICKLE, pickle.dumps(obj))
class MsgpackDecoder:
    def ext_hook(self, code, data):
        if envs.VLLM_ALLOW_INSECURE_SERIALIZATION:
            if code == CUSTOM_TYPE_PICKLE:
                return pickle.loads(data)
        raise NotImplementedError(code)
'''

_ENVS = '''
environment_variables = {
    "VLLM_ALLOW_INSECURE_SERIALIZATION":
    lambda: bool(int(os.getenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0"))),
}
'''


@pytest.mark.parametrize(("serial", "envs", "expected"), [
    (_SERIAL_NO_OPT_IN, _ENVS, {}),
    (_SERIAL_OPT_IN, _ENVS, {"setting": "VLLM_ALLOW_INSECURE_SERIALIZATION",
                             "guards": ["decoder", "encoder"]}),
    # A guard naming no setting of vllm/envs.py is no opt-in a user can give.
    (_SERIAL_OPT_IN, "environment_variables = {}\n", {}),
])
def test_protocol_facts_read_the_pickle_opt_in(tmp_path: Path, serial: str, envs: str,
                                               expected: dict[str, object]) -> None:
    """The setting whose truth guards the decoder's pickle.loads and whose falsity makes
    the encoder raise before its pickle fallback, declared in vllm/envs.py, is the opt-in
    (a warning logged under the same test guards nothing)."""
    from enginewire.spec.history.protocol_facts import pickle_opt_in

    wheel = tmp_path / "t.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/v1/serial_utils.py", serial)
        archive.writestr("vllm/envs.py", envs)
    with WheelSource(wheel) as source:
        assert pickle_opt_in(source) == expected


def test_committed_pickle_opt_in_says_what_the_wheels_had() -> None:
    """0.8.5's serial_utils.py pickles and unpickles unconditionally; 0.9.0 guards both with
    VLLM_ALLOW_INSECURE_SERIALIZATION (the re-derivation test compares the whole file)."""
    from enginewire.spec.history.constants import constants_at

    assert constants_at("0.8.5", "pickle_opt_in") == {"setting": "none"}
    assert constants_at("0.7.3", "pickle_opt_in") == {"setting": "none"}
    for version in ("0.9.0", "0.33.0"):
        assert constants_at(version, "pickle_opt_in") == {
            "setting": "VLLM_ALLOW_INSECURE_SERIALIZATION", "guards": ["decoder", "encoder"]}


def test_consistency_fails_when_the_opt_in_leaves_its_clauses(
        broken_history: list[str]) -> None:
    """A [[pickle_opt_in]] row that moves the opt-in to 0.9.1 disagrees with the ranges of the
    clauses about it (they hold from 0.9.0); one that renames its setting at the newest
    release disagrees with tensors.toml."""
    found = broken_history
    assert any("[[pickle_opt_in]] at 0.9.0: no opt-in, but tensors.ext-pickle-opt-in holds"
               in p for p in found), found
    assert any("at 0.9.0: no opt-in, but tensors.pickle-without-opt-in does not hold" in p
               for p in found), found
    assert any("setting at 0.33.0 is 'VLLM_INSECURE', tensors.toml names "
               "'VLLM_ALLOW_INSECURE_SERIALIZATION'" in p for p in found), found


# --- ENGINE_CORE_DEAD and the DP coordinator per release -------------------------------------


_DEAD_CORE = '''
class EngineCoreProc(EngineCore):
    ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
'''
_COORDINATOR = '''
class DPCoordinator:
    def __init__(self, parallel_config):
        pass
'''


@pytest.mark.parametrize(("files", "dead", "coordinator"), [
    ({"vllm/v1/engine/core.py": _DEAD_CORE,
      "vllm/v1/engine/coordinator.py": _COORDINATOR},
     {"literal": "ENGINE_CORE_DEAD"}, {"class": "DPCoordinator"}),
    ({"vllm/v1/engine/core.py": _DEAD_CORE}, {"literal": "ENGINE_CORE_DEAD"}, {}),
    ({"vllm/v1/engine/core.py": "class EngineCoreProc(EngineCore):\n    pass\n",
      "vllm/v1/engine/coordinator.py": "class Other:\n    pass\n"}, {}, {}),
])
def test_protocol_facts_read_the_sentinel_and_the_coordinator(
        tmp_path: Path, files: dict[str, str], dead: dict[str, str],
        coordinator: dict[str, str]) -> None:
    """The sentinel is the bytes bound to ENGINE_CORE_DEAD; the coordinator is the class
    DPCoordinator of vllm/v1/engine/coordinator.py; a wheel without them has neither."""
    from enginewire.spec.history.protocol_facts import dp_coordinator, engine_core_dead

    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    with WheelSource(wheel) as source:
        assert engine_core_dead(source) == dead
        assert dp_coordinator(source) == coordinator


def test_committed_message_history_says_what_the_wheels_had() -> None:
    """ENGINE_CORE_DEAD came in 0.8.5 (EngineCoreProc's class constant), the DP coordinator
    (vllm/v1/engine/coordinator.py) in 0.9.1; message_gap names what a release lacks and
    nothing for the kinds it has."""
    from enginewire.spec.history.release_facts import (
        dp_coordinator_at,
        engine_core_dead_at,
        message_gap,
    )

    assert [engine_core_dead_at(v) for v in ("0.7.3", "0.8.4", "0.8.5", "0.33.0")] == [
        None, None, b"ENGINE_CORE_DEAD", b"ENGINE_CORE_DEAD"]
    assert [dp_coordinator_at(v) for v in ("0.7.3", "0.9.0", "0.9.1", "0.33.0")] == [
        None, None, "DPCoordinator", "DPCoordinator"]
    gap = message_gap(load("0.8.4"), "engine_core_dead")
    assert gap is not None and "0.8.4 has no ENGINE_CORE_DEAD" in gap and "0.8.5" in gap
    coordinated = [m.kind for m in load().surface("frames").messages
                   if m.channel in ("coordinator_input", "coordinator_output", "stats_publish")]
    assert {"coordinator_subscribe", "stats_unsubscribe", "start_dp_wave"} <= set(coordinated)
    for kind in coordinated:
        gap = message_gap(load("0.9.0"), kind)
        assert gap is not None and "0.9.0 has no DP coordinator" in gap and "0.9.1" in gap
        assert message_gap(load("0.9.1"), kind) is None
    for kind in ("abort", "add", "utility", "outputs"):
        assert message_gap(load("0.7.3"), kind) is None
    assert message_gap(load("0.8.5"), "engine_core_dead") is None


def test_consistency_fails_when_the_sentinel_or_the_coordinator_leave_the_spec(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "history" / "constants.toml"
    text = path.read_text()
    path.write_text(text.replace('"literal" = "ENGINE_CORE_DEAD"', '"literal" = "DEAD"', 1)
                    .replace('"class" = "DPCoordinator"', '"class" = "none"', 1))
    found = consistency.problems(data)
    assert any("ENGINE_CORE_DEAD at 0.33.0 is 'DEAD'" in p for p in found), found
    assert any("the DP coordinator at 0.33.0 is 'none'" in p for p in found), found
