"""pytest plugin: the conformance checks as pytest items.

Registered through the ``pytest11`` entry point ``enginewire``. Without
``--enginewire-target`` it adds nothing (the options only), so a project's own test suite is
unaffected. With it, every check becomes an item whose node ID carries the check ID and its
primary clause (``-k`` selects on both)::

    enginewire-conformance::codec::codec/tensor/inline-threshold-exact[tensors.tensor-inline-below-threshold]

Options:

- ``--enginewire-target=T``: the target (as ``enginewire check --target``);
- ``--enginewire-target-cmd=[SURFACE=]COMMAND``: external programs (may repeat);
- ``--enginewire-version=X``: the vLLM release whose spec the checks follow (as ``enginewire
  check --version``; the spec's reference release without it). An unknown release is a usage
  error naming the known ones;
- ``--enginewire-surface=S``: only this surface's checks (may repeat);
- ``--enginewire-strict``: also SHOULD and MAY checks;
- ``--enginewire-expected-failures=FILE``: listed checks that fail as recorded are xfail; a
  listed check that passes, or fails with another message, fails;
- ``--enginewire-only``: deselect every other test of the session.

A check that fails raises with its message and reproduction; skipped, not implemented and
not-run checks are pytest skips with the reason. A target that cannot be loaded, or whose
program cannot start (``contract.TargetStartError``), ends the session at its first check with
pytest's usage-error status (4) and the message ``enginewire check`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

ROOT_NAME = "enginewire-conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("enginewire", "enginewire conformance checks")
    group.addoption("--enginewire-target", default=None, metavar="T",
                    help="run the enginewire conformance checks against target T "
                         "(reference, vllm, package.module:attr, none, or PREFIX:NAME of a "
                         "registered provider: mutant:NAME once enginewire.fuzz.mutants "
                         "is imported)")
    group.addoption("--enginewire-target-cmd", action="append", default=[],
                    metavar="[SURFACE=]COMMAND", help="an external program for one surface")
    group.addoption("--enginewire-version", default=None, metavar="X",
                    help="vLLM release whose layouts the checks and the reference target "
                         "follow (as enginewire check --version; default: the spec's "
                         "reference release; `enginewire spec releases` lists them)")
    group.addoption("--enginewire-surface", action="append", default=[], metavar="S",
                    help="only checks of this surface (codec, ring, engine, frontend)")
    group.addoption("--enginewire-strict", action="store_true", default=False,
                    help="also run checks of SHOULD and MAY clauses")
    group.addoption("--enginewire-expected-failures", default=None, metavar="FILE",
                    help="expected-failure list (one check ID per line, '# message prefix')")
    group.addoption("--enginewire-only", action="store_true", default=False,
                    help="run only the conformance checks, deselecting the session's tests")


def _enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("--enginewire-target")
                or config.getoption("--enginewire-target-cmd"))


class _State:
    """The target, spec and expected-failure list of one session, loaded on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._target: Any = None
        self._spec: Any = None
        self._expected: Any = None

    @property
    def version(self) -> str | None:
        """The release asked for with ``--enginewire-version`` (None: the reference)."""
        value = self.config.getoption("--enginewire-version")
        return str(value) if value else None

    @property
    def spec(self) -> Any:
        if self._spec is None:
            from enginewire.spec import load

            self._spec = load(self.version)
        return self._spec

    @property
    def target(self) -> Any:
        if self._target is None:
            from enginewire.conformance.targets.resolve import load_target

            text = self.config.getoption("--enginewire-target") or "none"
            self._target = load_target(text, self.config.getoption("--enginewire-target-cmd"),
                                       version=self.version)
        return self._target

    @property
    def expected(self) -> Any:
        if self._expected is None:
            from enginewire.conformance.framework.expected import ExpectedFailures

            path = self.config.getoption("--enginewire-expected-failures")
            self._expected = ExpectedFailures.load(path) if path else ExpectedFailures()
        return self._expected

    def close(self) -> None:
        if self._target is not None:
            self._target.close()


_STATE_KEY = pytest.StashKey[_State]()


class ConformanceFailure(Exception):
    """A check failed (or passed when listed as an expected failure)."""


class CheckItem(pytest.Item):
    def __init__(self, *, check: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.result: Any = None
        for clause in check.clauses:
            self.add_marker(pytest.mark.enginewire_clause(clause))
        self.user_properties.append(("clauses", ", ".join(check.clauses)))

    def runtest(self) -> None:
        from enginewire.conformance.framework.outcomes import FAILED, PASSED
        from enginewire.conformance.framework.runner import run_check
        from enginewire.conformance.targets.contract import TargetError

        state = self.config.stash[_STATE_KEY]
        try:
            result = run_check(self.check, state.target, state.spec,
                               strict=self.config.getoption("--enginewire-strict"))
        except TargetError as exc:  # cannot be loaded, or its program cannot start
            pytest.exit(f"enginewire: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        self.result = result
        entries = state.expected.entries
        listed = self.check.id in entries
        prefix = entries.get(self.check.id)
        if result.status == PASSED:
            if listed:
                raise ConformanceFailure("unexpected pass: the check is listed as an expected "
                                         "failure")
            return
        if result.status == FAILED:
            if listed and (prefix is None or result.first_line.startswith(prefix)):
                pytest.xfail(f"expected failure: {result.first_line}")
            changed = (f"changed failure (expected a message starting {prefix!r})\n"
                       if listed else "")
            raise ConformanceFailure(changed + self._failure_text(result))
        pytest.skip(f"{result.status.replace('_', ' ')}: {result.message}")

    @staticmethod
    def _failure_text(result: Any) -> str:
        lines = [result.message]
        if result.reproduction is not None:
            lines.append(result.reproduction.render())
        if result.traceback:
            lines.append(result.traceback.rstrip())
        return "\n".join(lines)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ConformanceFailure):
            header = (f"{self.check.id} [{', '.join(self.check.clauses)}]: "
                      f"{self.check.description}")
            return f"{header}\n{excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return ROOT_NAME, None, f"{self.check.id} [{self.check.primary_clause}]"


class SurfaceCollector(pytest.Collector):
    def __init__(self, *, checks: list[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checks = checks

    def collect(self) -> Iterator[CheckItem]:
        for item in self.checks:
            yield CheckItem.from_parent(self, name=f"{item.id}[{item.primary_clause}]",
                                        check=item)


class ConformanceRoot(pytest.Collector):
    def collect(self) -> Iterator[SurfaceCollector]:
        from enginewire.conformance.framework.registry import SURFACES, all_checks, select

        chosen = select(all_checks(), surfaces=self.config.getoption("--enginewire-surface"))
        for surface in SURFACES:
            picked = [c for c in chosen if c.surface == surface]
            if picked:
                yield SurfaceCollector.from_parent(self, name=surface, checks=picked)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "enginewire_clause(id): the spec clause an enginewire conformance check "
                   "enforces")
    if _enabled(config):
        from enginewire.spec.loader import UnknownVersionError

        state = _State(config)
        try:
            state.spec  # noqa: B018 - an unknown --enginewire-version fails here, before collection
        except UnknownVersionError as exc:
            raise pytest.UsageError(f"--enginewire-version: {exc}") from None
        config.stash[_STATE_KEY] = state


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if not _enabled(config):
        return
    if config.getoption("--enginewire-only"):
        config.hook.pytest_deselected(items=list(items))
        items.clear()
    root = ConformanceRoot.from_parent(session, name=ROOT_NAME, nodeid=ROOT_NAME)
    for surface in root.collect():
        items.extend(surface.collect())


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        state.close()
