"""Confirm compat predictions with the wheels' own classes, where a wheel imports.

For a pair (front end A, engine B) and one payload struct, a message is encoded by release A's
(or B's, by direction) own ``vllm`` classes and decoded by the other release's, each release in
its own subprocess with the wheel's ``vllm`` package (extracted into a temporary folder, compiled
extensions left out) first on ``sys.path`` and this environment's packages after it. A release
whose ``vllm.v1.engine`` does not import that way (a dependency it needs is not installed, an
extension it needs is missing) is reported as skipped, with the import error as the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = r"""
import json, sys
import msgspec
mode, name = sys.argv[1], sys.argv[2]
import vllm.v1.engine as engine
cls = getattr(engine, name)
if mode == "probe":
    print(json.dumps({"file": engine.__file__}))
elif mode == "encode":
    sample = json.loads(sys.stdin.read())
    print(msgspec.msgpack.encode(msgspec.convert(sample, cls)).hex())
else:
    obj = msgspec.msgpack.decode(bytes.fromhex(sys.stdin.read()), type=cls)
    print(json.dumps(msgspec.to_builtins(obj, enc_hook=repr)))
"""


@dataclass
class RealOutcome:
    """What the wheels' own classes did with one message."""

    outcome: str  # "decoded", "rejected", "skipped"
    detail: str


def _unpack(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("vllm/") and member.endswith(".py"):
                archive.extract(member, into)


def _run(root: Path, mode: str, name: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode, name], input=stdin,
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, check=False)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def try_pair(writer_wheel: Path, reader_wheel: Path, name: str, sample: object) -> RealOutcome:
    """Encode ``sample`` (wire-form builtins) with the writer wheel's ``name``, decode with the
    reader wheel's."""
    with tempfile.TemporaryDirectory(prefix="enginewire-wheel-") as tmp:
        roots = {}
        for side, wheel in (("writer", writer_wheel), ("reader", reader_wheel)):
            root = Path(tmp) / side
            _unpack(wheel, root)
            probe = _run(root, "probe", name)
            if probe.returncode != 0:
                return RealOutcome("skipped", f"{wheel.name}: vllm.v1.engine does not import "
                                   f"without its other dependencies: {_last_line(probe.stderr)}")
            roots[side] = root
        encoded = _run(roots["writer"], "encode", name, json.dumps(sample))
        if encoded.returncode != 0:
            return RealOutcome("skipped", f"the writer's class refused the sample: "
                               f"{_last_line(encoded.stderr)}")
        decoded = _run(roots["reader"], "decode", name, encoded.stdout.strip())
        if decoded.returncode != 0:
            return RealOutcome("rejected", _last_line(decoded.stderr))
        return RealOutcome("decoded", decoded.stdout.strip()[:300])
