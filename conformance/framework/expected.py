"""Expected-failure lists, in the manner of protobuf's conformance ``failure_list`` files.

A list names the checks a target is known to fail, one check ID per line, optionally followed
by ``# message prefix``: the start of the failure message the check must still produce.
Blank lines and lines starting with ``#`` are comments::

    # vLLM 0.33.0 decodes a negative buffer index as Python list indexing.
    codec.tensor.negative-index-rejected   # expected a rejection
    ring.reader.unknown-overflow-byte

Against a list, a run's verdicts become:

- a listed check that fails with a message starting with the prefix: *expected failure* (fine);
- a listed check that fails with another message: *changed failure* (fails the run: the
  target now fails differently, so the list must be looked at);
- a listed check that passes: *unexpected pass* (fails the run: fix the list, the target
  improved);
- an unlisted check that fails: *unexpected failure* (fails the run).

Checks that were skipped, not implemented or not run leave their entries alone. Without a
list every failure is unexpected. ``--update-expected`` rewrites the file from the run: one
line per failing check with the first line of its message as the prefix, comment lines kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enginewire.conformance.framework.outcomes import RunResult


class ExpectedFileError(ValueError):
    """A line of an expected-failure file is not ``CHECK_ID [# message prefix]``."""


@dataclass
class ExpectedFailures:
    #: check ID -> message prefix (None: any failure message is accepted).
    entries: dict[str, str | None] = field(default_factory=dict)
    #: Comment lines at the top of the file, kept by :meth:`write`.
    header: list[str] = field(default_factory=list)
    path: Path | None = None

    @classmethod
    def parse(cls, text: str, path: Path | None = None) -> ExpectedFailures:
        entries: dict[str, str | None] = {}
        header: list[str] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                if not entries:
                    header.append(raw.rstrip())
                continue
            check_id, hash_mark, prefix = line.partition("#")
            check_id = check_id.strip()
            if not check_id or " " in check_id or "\t" in check_id:
                where = f"{path}:{number}" if path else f"line {number}"
                raise ExpectedFileError(f"{where}: expected 'CHECK_ID [# message prefix]', "
                                        f"got {raw!r}")
            if "." in check_id:
                where = f"{path}:{number}" if path else f"line {number}"
                raise ExpectedFileError(
                    f"{where}: {check_id} is a clause ID or an old-style check ID; check IDs "
                    f"separate their parts with '/' ({check_id.replace('.', '/')})")
            if check_id in entries:
                where = f"{path}:{number}" if path else f"line {number}"
                raise ExpectedFileError(f"{where}: {check_id} is listed twice")
            entries[check_id] = prefix.strip() or None if hash_mark else None
        return cls(entries=entries, header=header, path=path)

    @classmethod
    def load(cls, path: str | Path) -> ExpectedFailures:
        file = Path(path)
        if not file.exists():
            return cls(path=file)
        return cls.parse(file.read_text(encoding="utf-8"), file)

    def apply(self, run: RunResult) -> None:
        """Set every result's ``expectation`` from this list (see the module docstring)."""
        from enginewire.conformance.framework.outcomes import (
            CHANGED_FAILURE,
            EXPECTED_FAILURE,
            FAILED,
            PASSED,
            UNEXPECTED_FAILURE,
            UNEXPECTED_PASS,
        )

        seen = set()
        for result in run.results:
            check_id = result.check.id
            seen.add(check_id)
            listed = check_id in self.entries
            prefix = self.entries.get(check_id)
            result.expected_message = prefix
            if result.status == FAILED:
                if not listed:
                    result.expectation = UNEXPECTED_FAILURE
                elif prefix is None or result.first_line.startswith(prefix):
                    result.expectation = EXPECTED_FAILURE
                else:
                    result.expectation = CHANGED_FAILURE
            elif result.status == PASSED and listed:
                result.expectation = UNEXPECTED_PASS
            else:
                result.expectation = ""
        run.expected_file = str(self.path) if self.path else None
        run.unknown_expected = sorted(set(self.entries) - seen)

    def updated(self, run: RunResult) -> ExpectedFailures:
        """This list rewritten from ``run``: failing checks listed with the first line of their
        message, passing checks removed, entries of checks the run did not decide kept."""
        from enginewire.conformance.framework.outcomes import FAILED, PASSED

        entries = dict(self.entries)
        for result in run.results:
            if result.status == FAILED:
                entries[result.check.id] = result.first_line or None
            elif result.status == PASSED:
                entries.pop(result.check.id, None)
        return ExpectedFailures(entries=entries, header=list(self.header), path=self.path)

    def render(self) -> str:
        lines = list(self.header)
        for check_id in sorted(self.entries):
            prefix = self.entries[check_id]
            lines.append(f"{check_id}  # {prefix}" if prefix else check_id)
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path | None = None) -> Path:
        destination = Path(path or self.path or "expected-failures.txt")
        destination.write_text(self.render(), encoding="utf-8")
        return destination
