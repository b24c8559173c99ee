"""What a check gets besides its surface: time budget, scratch space, spec, clean-up."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginewire.conformance.framework.registry import CheckSkip


class CheckContext:
    """Per-check environment, made fresh for every run of a check.

    - ``deadline`` / :meth:`remaining`: the check's time limit; helpers that wait take
      ``ctx.wait(seconds)`` so no wait outlives the check, and every wait grows with the
      run's timeout scale as the limit does.
    - :attr:`tmpdir`: a private directory, removed after the check (also ipc:// socket files).
    - :meth:`on_cleanup`: callbacks run last-in-first-out after the check, also when it failed
      or timed out; that is where sockets are closed and processes killed.
    - :attr:`cancelled`: set by the runner when the check ran out of time, so loops in helper
      threads stop.
    """

    def __init__(
        self,
        *,
        spec: Any,
        target: Any,
        timeout: float,
        strict: bool = False,
        options: dict[str, Any] | None = None,
        scale: float = 1.0,
    ) -> None:
        self.spec = spec
        self.scale = scale
        self.target = target
        self.timeout = timeout
        self.strict = strict
        self.options = dict(options or {})
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.cancelled = threading.Event()
        self._cleanups: list[Callable[[], Any]] = []
        self._tmpdir: Path | None = None
        self.cleanup_errors: list[str] = []

    # --- time ------------------------------------------------------------------------------

    def remaining(self) -> float:
        """Seconds left before the check's limit (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def wait(self, seconds: float) -> float:
        """``seconds`` times the run's timeout scale (``--timeout-scale``), capped so the wait
        ends a little before the check's own limit."""
        return max(0.01, min(seconds * self.scale, self.remaining() - 0.25))

    # --- scratch space ---------------------------------------------------------------------

    @property
    def tmpdir(self) -> Path:
        if self._tmpdir is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="ewc-"))
        return self._tmpdir

    def ipc_address(self, name: str = "") -> str:
        """A fresh ``ipc://`` address inside :attr:`tmpdir` (removed with it)."""
        suffix = uuid.uuid4().hex[:8]
        return f"ipc://{self.tmpdir}/{name or 'sock'}-{suffix}"

    # --- clean-up --------------------------------------------------------------------------

    def on_cleanup(self, func: Callable[[], Any]) -> Callable[[], Any]:
        """Run ``func`` after the check, last registered first. Returns ``func``."""
        self._cleanups.append(func)
        return func

    def close(self) -> None:
        """Run the clean-up callbacks, then remove :attr:`tmpdir`; errors are collected."""
        self.cancelled.set()
        while self._cleanups:
            func = self._cleanups.pop()
            try:
                func()
            except Exception as exc:  # noqa: BLE001 - a clean-up must not hide the verdict
                self.cleanup_errors.append(f"{getattr(func, '__name__', func)!s}: {exc!r}")
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # --- optional data ---------------------------------------------------------------------

    def require(self, condition: bool, why: str) -> None:
        """Skip the check (never pass it) when ``condition`` is false."""
        if not condition:
            raise CheckSkip(why)
