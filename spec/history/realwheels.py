"""Confirm compat predictions with the wheels' own classes, where a wheel imports.

For a pair (front end A, engine B) and one payload struct, a message is encoded by release A's
(or B's, by direction) own ``vllm`` classes and decoded by the other release's, each release in
its own subprocess with the wheel's ``vllm`` package (extracted into a temporary folder, compiled
extensions left out) first on ``sys.path``, this environment's packages after it, and last a
folder of extra dependencies (:func:`deps_dir`, outside the repository).

Older wheels import a few packages at ``import vllm`` time that this environment does not have
and that have nothing to do with the wire (hashing, process titles, a model-file reader): the
ones in :data:`EXTRA_DEPS`. When the probe import fails on one of those, it is installed into
the extra folder with ``pip install --no-deps --target`` (once; later runs use the folder) and
the probe is tried again. One shim, also outside the wire: older wheels register model
configurations (``aimv2``, ...) with ``transformers.AutoConfig.register``, which the installed
transformers already defines and so refuses; the subprocess makes that registration
``exist_ok``. Nothing else is stubbed: the classes that encode and decode are the wheel's own,
importing as they do in vLLM. A release whose ``vllm.v1.engine`` still does not
import (another missing module, an extension it needs) is reported as skipped, with the import
error as the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

#: Module a wheel imports at ``import vllm`` time -> the PyPI package that provides it. Only
#: these are installed on demand; none of them is part of the wire (see the module docstring).
EXTRA_DEPS = {
    "blake3": "blake3",  # prefix-cache block hashing
    "setproctitle": "setproctitle",  # process titles
    "gguf": "gguf",  # GGUF model files
}

_MISSING = re.compile(r"No module named '([\w.]+)'")

_SCRIPT = r"""
import json, os, sys
sys.path.append(os.environ["ENGINEWIRE_WHEEL_DEPS"])
try:  # older vLLM registers model configs newer transformers already has (see the docstring)
    import transformers
    _register = transformers.AutoConfig.register
    transformers.AutoConfig.register = staticmethod(
        lambda name, config, exist_ok=False: _register(name, config, exist_ok=True))
except Exception:
    pass
import msgspec
mode, name = sys.argv[1], sys.argv[2]
try:
    import vllm.v1.engine as engine
    cls = getattr(engine, name)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
if mode == "encode":
    sample = msgspec.msgpack.decode(bytes.fromhex(sys.stdin.read()))
    print(msgspec.msgpack.encode(msgspec.convert(sample, cls)).hex())
else:
    obj = msgspec.msgpack.decode(bytes.fromhex(sys.stdin.read()), type=cls)
    fields = {f: msgspec.to_builtins(getattr(obj, f), enc_hook=repr)
              for f in obj.__struct_fields__}
    print(json.dumps(fields, default=repr))
"""

#: Exit status of the subprocess when the wheel's ``vllm.v1.engine`` does not import.
_IMPORT_FAILED = 3


@dataclass
class RealOutcome:
    """What the wheels' own classes did with one message."""

    outcome: str  # "decoded", "misdecoded", "rejected", "skipped"
    detail: str


def _unpack(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("vllm/") and member.endswith(".py"):
                archive.extract(member, into)


def deps_dir() -> Path:
    """Where the extra dependencies go: ``$ENGINEWIRE_WHEEL_DEPS``, else ``wheel-deps`` beside
    the default wheel cache."""
    from .wheels import default_wheel_dir

    found = os.environ.get("ENGINEWIRE_WHEEL_DEPS")
    return Path(found) if found else default_wheel_dir().parent / "wheel-deps"


def _run(root: Path, mode: str, name: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin",
           "ENGINEWIRE_WHEEL_DEPS": str(deps_dir())}
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode, name], input=stdin,
                          capture_output=True, text=True, timeout=300, cwd=root, env=env,
                          check=False)


def _install(package: str) -> str | None:
    """Install ``package`` (no dependencies) into :func:`deps_dir`; None, or why it failed."""
    folder = deps_dir()
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(folder), package], capture_output=True, text=True,
                          timeout=600, check=False)
    return None if done.returncode == 0 else _last_line(done.stderr)


def _side(root: Path, mode: str, name: str, stdin: str) -> subprocess.CompletedProcess[str]:
    """Run one side (``encode`` or ``decode``) with the wheel under ``root``, installing the
    :data:`EXTRA_DEPS` its import turns out to need (each at most once) and trying again."""
    tried: set[str] = set()
    while True:
        result = _run(root, mode, name, stdin)
        missing = (_MISSING.search(result.stderr) if result.returncode == _IMPORT_FAILED
                   else None)
        module = missing.group(1).split(".")[0] if missing else None
        if module is None or module not in EXTRA_DEPS or module in tried:
            return result
        tried.add(module)
        if _install(EXTRA_DEPS[module]) is not None:
            return result


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def try_pair(writer_wheel: Path, reader_wheel: Path, name: str, sample: object,
             fields: list[str] | None = None) -> RealOutcome:
    """Encode ``sample`` (wire-form builtins: a map, or an array whose positions are the
    writer's ``fields``) with the writer wheel's ``name``, decode with the reader wheel's.
    ``misdecoded``: the reader decoded, and a scalar field both sides have came out with
    another value than the writer was given."""
    with tempfile.TemporaryDirectory(prefix="enginewire-wheel-") as tmp:
        roots = {}
        for side, wheel in (("writer", writer_wheel), ("reader", reader_wheel)):
            roots[side] = Path(tmp) / side
            _unpack(wheel, roots[side])
        encoded = _side(roots["writer"], "encode", name, msgspec.msgpack.encode(sample).hex())
        if encoded.returncode == _IMPORT_FAILED:
            return _import_skip(writer_wheel, encoded)
        if encoded.returncode != 0:
            return RealOutcome("skipped", f"the writer's class refused the sample: "
                               f"{_last_line(encoded.stderr)}")
        decoded = _side(roots["reader"], "decode", name, _last_line(encoded.stdout))
        if decoded.returncode == _IMPORT_FAILED:
            return _import_skip(reader_wheel, decoded)
        if decoded.returncode != 0:
            return RealOutcome("rejected", _last_line(decoded.stderr))
        got = json.loads(_last_line(decoded.stdout))
        sent = (dict(zip(fields or [], sample, strict=False)) if isinstance(sample, list)
                else dict(sample) if isinstance(sample, dict) else {})
        wrong = [f"{key}: sent {value!r}, read {got[key]!r}" for key, value in sent.items()
                 if key in got and not isinstance(value, (dict, list))
                 and got[key] != value]
        if wrong:
            return RealOutcome("misdecoded", "; ".join(wrong)[:300])
        return RealOutcome("decoded", f"every scalar field both releases have read back as "
                           f"sent ({len(got)} fields)")


def _import_skip(wheel: Path, done: subprocess.CompletedProcess[str]) -> RealOutcome:
    return RealOutcome("skipped", f"{wheel.name}: vllm.v1.engine does not import without its "
                       f"other dependencies: {_last_line(done.stderr)}")
