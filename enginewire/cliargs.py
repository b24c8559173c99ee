"""Argument types and checks shared by every ``enginewire`` command.

Each function here is an ``argparse`` ``type=`` (it takes the text, returns the value, raises
:class:`argparse.ArgumentTypeError` with a one-line reason), so a bad value is a usage error
(exit 2) reported before anything runs. :class:`Parser` prints every usage error as one line,
``enginewire COMMAND: error: WHAT``, and exits 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import NoReturn

#: Exit status of a usage error (argparse's), and of an internal error (BSD's EX_SOFTWARE).
EXIT_USAGE = 2
EXIT_INTERNAL = 70


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (and exit 2)."""

    def error(self, message: str) -> NoReturn:
        first = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {first} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)


def _number(text: str, kind: type[int] | type[float], low: float, strict: bool,
            what: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and value != value:  # NaN
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    if value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, 0, True, "a positive integer"))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, 0, False, "an integer >= 0"))


def positive_float(text: str) -> float:
    value = float(_number(text, float, 0.0, True, "a positive number"))
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def non_negative_float(text: str) -> float:
    value = float(_number(text, float, 0.0, False, "a number >= 0"))
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def writable_file(text: str) -> str:
    """A path a report can be written to: its directory exists and is writable, and the path
    is not a directory. Checked when the command line is read, before any long run."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"directory {parent} is not writable")
    return text


def writable_dir(text: str) -> str:
    """A directory output goes to: it exists (or its parent does and it can be created)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    if not path.exists() and not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot create directory {text}")
    return text


def text_file_problem(text: str) -> str | None:
    """Why ``text`` is not an existing UTF-8 text file (None: it is one)."""
    path = Path(text)
    if not path.exists():
        return f"{text} does not exist"
    if not path.is_file():
        return f"{text} is not a file"
    try:
        with path.open("rb") as stream:
            head = stream.read(1 << 16)
        head.decode("utf-8")
    except UnicodeDecodeError:
        return f"{text} is not UTF-8 text"
    except OSError as exc:
        return f"{text}: {exc.strerror}"
    if b"\x00" in head:
        return f"{text} is a binary file"
    return None


def text_file(text: str) -> str:
    """An existing UTF-8 text file (an argparse type)."""
    problem = text_file_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def existing_dir(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return text


def zmq_address(text: str) -> str:
    """A ZMQ endpoint enginewire can bind or connect: ``tcp://HOST:PORT`` (port 0-65535;
    ``*`` or an IP or a name for the host), ``ipc://PATH`` whose directory exists, or
    ``inproc://NAME``."""
    scheme, sep, rest = text.partition("://")
    if not sep or not rest:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address (tcp://HOST:PORT, ipc://PATH or inproc://NAME)")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host:
            raise argparse.ArgumentTypeError(f"{text!r} has no port (tcp://HOST:PORT)")
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r}: port {port!r} is not in 0-65535")
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if bare != "*":
            try:
                ipaddress.ip_address(bare)
            except ValueError:
                if not all(part.replace("-", "").isalnum() for part in bare.split(".")):
                    raise argparse.ArgumentTypeError(
                        f"{text!r}: {host!r} is not a host") from None
        return text
    if scheme == "ipc":
        directory = os.path.dirname(rest) or "."
        if not os.path.isdir(directory):
            raise argparse.ArgumentTypeError(f"{text!r}: directory {directory} does not exist")
        if len(rest.encode()) > 107:
            raise argparse.ArgumentTypeError(f"{text!r}: an ipc path holds at most 107 bytes")
        return text
    if scheme == "inproc":
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: unknown transport {scheme!r} (tcp, ipc or inproc)")
