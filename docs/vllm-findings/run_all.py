#!/usr/bin/env python3
"""Run every runnable vLLM finding reproduction and check that each still reproduces.

Each ``NNN-short-name.py`` beside this file exits 1 while its bug reproduces, 0 once vLLM
fixed it, and 2 when the reproduction itself failed (see index.md). This runner runs each
one under a timeout and exits 0 only when every one exited 1. A reproduction that exits 0
means the installed vLLM fixed that finding: the message says to move it to "fixed in".
Anything else (2, another code, a timeout) is a broken reproduction.

Modes:

- default: each script in a fresh interpreter (``python NNN.py``), exactly as a vLLM
  developer runs it. Importing vLLM costs 10 to 30 s of CPU per script.
- ``--fork``: this process imports vLLM once, then forks one child per script, which runs
  the script as ``__main__`` (``runpy``) with its output captured; the children skip the
  import cost and nothing else is shared (no socket, thread or event loop exists before the
  fork). The environment variables the scripts set before importing vLLM are set here
  first (``VLLM_TARGET_DEVICE=cpu``; ``VLLM_ENGINE_READY_TIMEOUT_S=10``, which vLLM reads at
  import).

- ``--launched``: only the engine findings with a ``--launched`` mode (004-008, 019), each
  run with it: on vLLM's real engine core process, launched by vLLM's ``CoreEngineProcManager``
  with only the model layer stood in (``launched_engine.py``), a few seconds per engine.

Usage: ``python docs/vllm-findings/run_all.py [--fork] [--launched] [--jobs N] [--timeout S]
[--json PATH] [NNN ...]``. Exit status: 0 when every reproduction reproduced, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: What a reproduction with a ``--launched`` mode defines.
LAUNCHED_MARK = "def reproduce_launched("
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2
#: vLLM modules the reproductions import, loaded once before forking (``--fork``).
PRELOAD = (
    "torch", "numpy", "msgspec", "zmq",
    "vllm.config", "vllm.sampling_params", "vllm.multimodal.inputs", "vllm.v1.outputs",
    "vllm.v1.serial_utils", "vllm.v1.engine", "vllm.v1.engine.core", "vllm.v1.engine.utils",
    "vllm.v1.engine.core_client", "vllm.v1.executor",
    "vllm.distributed.device_communicators.shm_broadcast", "vllm.entrypoints.launchers.launcher",
)


@dataclass
class Outcome:
    """How one reproduction ended."""

    script: Path
    code: int | None  # None: it ran past the timeout and was killed
    seconds: float
    output: str

    @property
    def verdict(self) -> str:
        if self.code == EXIT_REPRODUCED:
            return "reproduces"
        if self.code == EXIT_FIXED:
            return "FIXED"
        if self.code is None:
            return "BROKEN (timed out)"
        return f"BROKEN (exit {self.code})"


def runnable_scripts(selected: list[str]) -> list[Path]:
    """The reproductions beside this file (``NNN-name.py``; not ``NNN-name.fixed.py``, the
    findings a vLLM release fixed), optionally only those whose name starts with one of
    ``selected``."""
    scripts = sorted(p for p in HERE.glob("[0-9][0-9][0-9]-*.py")
                     if not p.name.endswith(".fixed.py"))
    if selected:
        scripts = [p for p in scripts if any(p.name.startswith(s) for s in selected)]
    return scripts


def run_fresh(script: Path, timeout: float, options: tuple[str, ...] = ()) -> Outcome:
    """``python script [options]`` in a fresh interpreter, killed (its process group) after
    ``timeout``."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), *options], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    return Outcome(script, code, time.monotonic() - start, out.decode(errors="replace"))


def preload() -> None:
    """Import what the reproductions import, with the environment they set (``--fork``)."""
    import importlib

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = "10"
    for name in PRELOAD:
        importlib.import_module(name)


def run_forked(script: Path, timeout: float,
               prepare: Callable[[], None] | None = None,
               options: tuple[str, ...] = ()) -> Outcome:
    """Fork; the child runs ``script`` as ``__main__`` with stdout and stderr in a file.

    ``prepare``, if given, runs in the child first (the tests use it to patch a fix into
    vLLM and check that the script then exits 0)."""
    with tempfile.TemporaryFile() as log:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # child
            code = EXIT_BROKEN
            try:
                os.setsid()
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                import runpy

                if prepare is not None:
                    prepare()

                sys.argv = [str(script), *options]
                runpy.run_path(str(script), run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else EXIT_BROKEN
            except BaseException:  # noqa: BLE001 - the child must always reach _exit
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        code_or_none: int | None = None
        while time.monotonic() - start < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code_or_none = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.05)
        else:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        log.seek(0)
        return Outcome(script, code_or_none, time.monotonic() - start,
                       log.read().decode(errors="replace"))


def verdict_lines(output: str) -> list[str]:
    """The lines a reproduction prints about its verdict (BUG: ... / fixed: ...)."""
    return [line for line in output.splitlines() if re.match(r"(BUG|fixed):", line)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run only findings whose name starts so")
    parser.add_argument("--fork", action="store_true",
                        help="import vLLM once and fork a child per reproduction")
    parser.add_argument("--jobs", type=int, default=1, help="reproductions run at once")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per reproduction (default 300: importing vLLM is slow "
                             "on a loaded machine)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write {script name: {code, verdict, seconds, output}} there")
    parser.add_argument("--launched", action="store_true",
                        help="run the engine findings that have a --launched mode (004-008, "
                             "019) on vLLM's real engine core process, launched by vLLM")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print each reproduction's full output")
    args = parser.parse_args(argv)
    scripts = runnable_scripts(args.only)
    options: tuple[str, ...] = ()
    if args.launched:
        scripts = [p for p in scripts if LAUNCHED_MARK in p.read_text(encoding="utf-8")]
        options = ("--launched",)
    if not scripts:
        print("no reproduction matched", file=sys.stderr)
        return 2
    if args.fork:
        preload()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        if args.fork:
            outcomes = list(pool.map(
                lambda script: run_forked(script, args.timeout, options=options), scripts))
        else:
            outcomes = list(pool.map(
                lambda script: run_fresh(script, args.timeout, options), scripts))

    if args.json is not None:
        args.json.write_text(json.dumps({
            o.script.name: {"code": o.code, "verdict": o.verdict, "seconds": round(o.seconds, 1),
                            "output": o.output}
            for o in outcomes}, indent=1))
    failed = False
    for outcome in outcomes:
        print(f"{outcome.verdict:<20} {outcome.seconds:6.1f} s  {outcome.script.name}")
        shown = outcome.output.splitlines() if args.verbose else verdict_lines(outcome.output)
        for line in shown:
            print(f"    {line}")
        if outcome.code == EXIT_FIXED:
            failed = True
            stem = outcome.script.stem
            print(f"    -> {stem} no longer reproduces on the installed vLLM: record that version "
                  f"in the 'Fixed in' field of {stem}.md and in index.md, and move the finding "
                  f"out of the runnable set (rename its script to {stem}.fixed.py).")
        elif outcome.code != EXIT_REPRODUCED:
            failed = True
            if not args.verbose:
                print("    " + "\n    ".join(outcome.output.splitlines()[-15:]))
    reproduced = sum(o.code == EXIT_REPRODUCED for o in outcomes)
    print(f"{reproduced} of {len(outcomes)} reproductions reproduce")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
