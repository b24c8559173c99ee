"""A headless chromium the tests can ask questions: the DevTools protocol over a pipe.

``chromium --remote-debugging-pipe`` reads NUL-terminated JSON commands on file descriptor 3
and writes replies and events on descriptor 4; no socket, no extra package. :class:`Browser`
opens a page and evaluates JavaScript in it, waiting (bounded) for a condition to hold, which
``--dump-dom`` cannot do for a page whose content comes from a web worker (the docs site's
search). Every wait has a timeout, and the browser is ended (its process group) on close.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci_tools import chromium_segments, remove_chromium_leftovers


class BrowserError(Exception):
    """The browser did not answer as expected; the message says what it was asked."""


class Browser:
    """One headless chromium with one page (a context manager)."""

    def __init__(self, executable: str, profile: Path, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._segments_before = chromium_segments()
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's fds 3 and 4 must be these pipes: dup them there in the child (before
        # subprocess closes every descriptor not in pass_fds, so 3 and 4 are listed too).
        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, to_browser_r, from_browser_w), start_new_session=True,
            preexec_fn=_fds_3_and_4(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.session: str | None = None

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        # Killed, chromium cannot unlink what it was about to (tests/conftest.py counts it).
        remove_chromium_leftovers(self._segments_before)

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        decoded: dict[str, Any] = json.loads(message)
        return decoded

    def call(self, method: str, params: dict[str, Any] | None = None,
             page: bool = True) -> dict[str, Any]:
        """Send a command (to the page's session unless ``page`` is False); its result."""
        sent = self._send(method, params or {}, self.session if page else None)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._read(deadline)
            if message.get("id") == sent:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def open(self, url: str) -> None:
        """Open ``url`` in a new page, attach to it and wait until it has loaded."""
        target = self.call("Target.createTarget", {"url": url}, page=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 page=False)["sessionId"]
        self.wait_for(f"location.href === {json.dumps(url)} && "
                      "document.readyState === 'complete'", timeout_s=self.timeout_s)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy; its value, or BrowserError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression} stayed false for {timeout_s} s")
            time.sleep(0.2)


def _fds_3_and_4(read_end: int, write_end: int) -> Callable[[], None]:
    """The child-side step that puts the two pipe ends on descriptors 3 and 4."""

    def move() -> None:
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)
    return move
