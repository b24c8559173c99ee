"""Reports of a conformance run: terminal text, JSON, JUnit XML, one self-contained HTML page.

JSON report (``--json PATH``), format ``enginewire-conformance/1``; keys are only ever added::

    {
      "format": "enginewire-conformance/1",
      "target": "reference",
      "spec_version": "0.33.0",          # the vLLM version the spec was loaded for
      "strict": false,
      "started": "2025-01-01T00:00:00+00:00",
      "duration_s": 12.3,
      "ok": true,                         # nothing unexpected: the exit status was 0
      "expected_file": null,              # the expected-failure list applied, if any
      "unknown_expected": [],             # listed IDs no selected check has
      "summary": {"passed": N, "failed": M, "skipped": S, "not_implemented": X,
                  "not_applicable": A, "spec_only": O, "not_run": R, "expected_failure": E,
                  "unexpected_failure": U, "unexpected_pass": P, "changed_failure": C},
      "surfaces": {"codec": {same keys as summary}, ...},
      "results": [
        {"id": "codec/tensor/inline-threshold-exact", "surface": "codec",
         "clauses": ["tensors.inline-below-threshold"], "level": "MUST",
         "description": "...",
         "status": "passed|failed|skipped|not_implemented|not_applicable|spec_only|not_run",
         "expectation": "|expected_failure|unexpected_failure|unexpected_pass|changed_failure",
         "message": "...", "expected_message": null,
         "reproduction": {"sent_hex": [...], "received": ..., "notes": {...}} | null,
         "traceback": null | "...", "duration_s": 0.01}
      ]
    }

JUnit XML (``--junit PATH``): one ``<testsuite>`` per surface; every check is a
``<testcase name="CHECK_ID" classname="PRIMARY_CLAUSE_ID">``. What fails the run is a
``<failure>`` (unexpected failures, changed failures, unexpected passes); expected failures,
skips, not-implemented and not-run checks are ``<skipped>`` with the reason, so a CI
dashboard agrees with the exit status.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from enginewire.conformance.framework.outcomes import (
    CHANGED_FAILURE,
    EXPECTED_FAILURE,
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    NOT_RUN,
    PASSED,
    SKIPPED,
    SPEC_ONLY,
    UNEXPECTED_PASS,
    CheckResult,
    RunResult,
)
from enginewire.conformance.framework.registry import Check

JSON_FORMAT = "enginewire-conformance/1"


# --- JSON --------------------------------------------------------------------------------


def result_to_builtins(result: CheckResult) -> dict[str, Any]:
    return {
        "id": result.check.id,
        "surface": result.check.surface,
        "clauses": list(result.check.clauses),
        "level": result.level,
        "description": result.check.description,
        "status": result.status,
        "expectation": result.expectation,
        "message": result.message,
        "expected_message": result.expected_message,
        "reproduction": result.reproduction.to_builtins() if result.reproduction else None,
        "traceback": result.traceback,
        "duration_s": round(result.duration_s, 4),
    }


def to_builtins(run: RunResult) -> dict[str, Any]:
    return {
        "format": JSON_FORMAT,
        "target": run.target,
        "spec_version": run.spec_version,
        "strict": run.strict,
        "started": run.started,
        "duration_s": round(run.duration_s, 3),
        "ok": run.ok,
        "expected_file": run.expected_file,
        "unknown_expected": run.unknown_expected,
        "summary": run.counts(),
        "surfaces": {surface: run.counts(surface) for surface in run.surfaces()},
        "results": [result_to_builtins(r) for r in run.results],
    }


def write_json(run: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_builtins(run), indent=2) + "\n", encoding="utf-8")


# --- JUnit -------------------------------------------------------------------------------


def junit_tree(run: RunResult) -> ET.Element:
    root = ET.Element("testsuites", name=f"enginewire check {run.target}")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for surface in run.surfaces():
        picked = [r for r in run.results if r.check.surface == surface]
        suite = ET.SubElement(root, "testsuite", name=surface)
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="target", value=run.target)
        ET.SubElement(props, "property", name="spec_version", value=run.spec_version)
        ET.SubElement(props, "property", name="strict", value=str(run.strict).lower())
        failures = skipped = 0
        for result in picked:
            case = ET.SubElement(
                suite,
                "testcase",
                name=result.check.id,
                classname=result.check.primary_clause,
                time=f"{result.duration_s:.4f}",
            )
            body = _failure_text(result)
            if result.unexpected:
                failures += 1
                failure = ET.SubElement(
                    case, "failure", message=_headline(result), type=result.expectation
                )
                failure.text = body
            elif result.status != PASSED:
                skipped += 1
                reason = _headline(result)
                element = ET.SubElement(case, "skipped", message=reason)
                if result.expectation == EXPECTED_FAILURE:
                    element.set("type", EXPECTED_FAILURE)
                    element.text = body
        suite.set("tests", str(len(picked)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", str(skipped))
        suite.set("time", f"{sum(r.duration_s for r in picked):.3f}")
        totals["tests"] += len(picked)
        totals["failures"] += failures
        totals["skipped"] += skipped
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("errors", "0")
    root.set("time", f"{run.duration_s:.3f}")
    return root


def write_junit(run: RunResult, path: str | Path) -> None:
    tree = ET.ElementTree(junit_tree(run))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _headline(result: CheckResult) -> str:
    if result.expectation == UNEXPECTED_PASS:
        return "unexpected pass: the check is listed as an expected failure"
    if result.expectation == CHANGED_FAILURE:
        return (f"changed failure: expected a message starting {result.expected_message!r}, "
                f"got {result.first_line!r}")
    if result.expectation == EXPECTED_FAILURE:
        return f"expected failure: {result.first_line}"
    if result.status == NOT_RUN:
        return result.message
    if result.status == NOT_IMPLEMENTED:
        return f"not implemented: {result.message}"
    if result.status == NOT_APPLICABLE:
        return f"not applicable: {result.message}"
    if result.status == SPEC_ONLY:
        return f"spec only: {result.message}"
    return result.first_line


def _failure_text(result: CheckResult) -> str:
    parts = [f"check {result.check.id} ({result.level}): {result.check.description}",
             "clauses: " + ", ".join(result.check.clauses)]
    if result.message:
        parts.append(result.message)
    if result.reproduction:
        parts.append(result.reproduction.render())
    if result.traceback:
        parts.append(result.traceback.rstrip())
    return "\n".join(parts)


# --- HTML ---------------------------------------------------------------------------------


def render_html(run: RunResult, spec_site: str | None = None) -> str:
    """The self-contained HTML page (:mod:`.html_report`); ``spec_site``: the root of the
    documentation site its clause links go to (default: the Markdown spec pages)."""
    from enginewire.conformance.framework.html_report import render_html as render

    return render(run, spec_site=spec_site)


def write_html(run: RunResult, path: str | Path, spec_site: str | None = None) -> None:
    Path(path).write_text(render_html(run, spec_site=spec_site), encoding="utf-8")


# --- Markdown ------------------------------------------------------------------------------


def _clause_verdicts(results: Sequence[CheckResult]) -> dict[str, str]:
    """Clause ID -> ``passed`` (every decided check naming it passed), ``failed`` (one
    failed), or the status of its checks when none was decided."""
    verdicts: dict[str, str] = {}
    for result in results:
        for clause_id in result.check.clauses:
            before = verdicts.get(clause_id)
            if result.status == FAILED or before == FAILED:
                verdicts[clause_id] = FAILED
            elif result.status == PASSED or before == PASSED:
                verdicts[clause_id] = PASSED
            elif before is None:
                verdicts[clause_id] = result.status
    return verdicts


def _md_code_list(items: Sequence[str]) -> str:
    return ", ".join(f"`{item}`" for item in items) if items else "none"


def render_markdown(run: RunResult, spec: Any, *, command: str = "",
                    description: str = "") -> str:
    """A Markdown page of the run for publishing: per surface, the clauses the target passes
    and every failure with its clause(s), message and reproduction, then the SHOULD/MAY
    results. Deterministic: no timings, dates or addresses, results in registry order."""
    lines = [f"# Conformance of `{run.target}` to the enginewire spec (vLLM {run.spec_version})",
             ""]
    if description:
        lines += [f"Target: {description}.", ""]
    if command:
        lines += ["Generated by", "", "```", command, "```", "",
                  "Do not edit by hand; regenerate it with that command.", ""]
    totals = run.counts()
    strict = " (strict: SHOULD and MAY checks included)" if run.strict else ""
    lines += [
        f"{len(run.results)} checks{strict}: {totals[PASSED]} passed, {totals[FAILED]} failed, "
        f"{totals[NOT_IMPLEMENTED]} not implemented, {totals[NOT_APPLICABLE]} not applicable, "
        f"{totals[SPEC_ONLY]} spec only, "
        f"{totals[SKIPPED]} skipped, {totals[NOT_RUN]} not run. A clause *passes* when every "
        "check naming it passed; NOT IMPLEMENTED and NOT APPLICABLE checks decide nothing, "
        "SPEC ONLY checks never call the target and count as nobody's pass.",
        "",
        "| surface | passed | failed | not implemented | not applicable | spec only | skipped |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for surface in run.surfaces():
        c = run.counts(surface)
        lines.append(f"| {surface} | {c[PASSED]} | {c[FAILED]} | {c[NOT_IMPLEMENTED]} | "
                     f"{c[NOT_APPLICABLE]} | {c[SPEC_ONLY]} | {c[SKIPPED]} |")
    for level_group, title in ((("MUST",), "MUST"), (("SHOULD", "MAY"), "SHOULD and MAY")):
        picked = [r for r in run.results if r.level in level_group]
        if not picked:
            continue
        lines += ["", f"## {title} clauses", ""]
        if title != "MUST" and not run.strict:
            lines += ["Not run: these checks run with `--strict`.", ""]
            continue
        for surface in run.surfaces():
            results = [r for r in picked if r.check.surface == surface]
            if not results:
                continue
            if all(r.status == NOT_IMPLEMENTED for r in results):
                count = f"{len(results)} check" + ("s" if len(results) > 1 else "")
                lines += [f"### {surface}", "",
                          f"Not implemented by the target ({count}).", ""]
                continue
            # A clause of another release (an earlier tensor form) is no clause of this one.
            other: set[str] = set(getattr(spec, "all_clause_ids", ())) - set(spec.clauses)
            verdicts = {c: v for c, v in _clause_verdicts(results).items() if c not in other}
            passed = sorted(c for c, v in verdicts.items() if v == PASSED)
            failed = sorted(c for c, v in verdicts.items() if v == FAILED)
            undecided = sorted(c for c, v in verdicts.items() if v not in (PASSED, FAILED))
            lines += [f"### {surface}", "",
                      f"Passes ({len(passed)}): {_md_code_list(passed)}.", "",
                      f"Fails ({len(failed)}): {_md_code_list(failed)}.", ""]
            if undecided:
                lines += [f"Not checked ({len(undecided)}, their checks were not implemented, "
                          "spec only, not applicable or skipped): "
                          f"{_md_code_list(undecided)}.", ""]
            spec_only = [r.check.id for r in results if r.status == SPEC_ONLY]
            if spec_only:
                lines += [f"Spec only ({len(spec_only)}, passed without consulting the target, "
                          f"never counted as its pass): {_md_code_list(spec_only)}.", ""]
            for result in results:
                if result.status != FAILED:
                    continue
                lines += _markdown_failure(result, spec)
            others = [r for r in results if r.status in (NOT_IMPLEMENTED, NOT_APPLICABLE,
                                                         SPEC_ONLY, SKIPPED)]
            if others:
                lines += ["<details><summary>Checks not decided</summary>", ""]
                lines += [f"- `{r.check.id}`: {r.status.replace('_', ' ')}: {r.message}"
                          for r in others]
                lines += ["", "</details>", ""]
    # Every block ends with a blank line and a heading block starts with one: keep one.
    lines = [line for i, line in enumerate(lines) if line or (i and lines[i - 1])]
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown_failure(result: CheckResult, spec: Any) -> list[str]:
    lines = [f"#### `{result.check.id}`", "",
             result.check.description, "",
             f"Clauses: {_md_code_list(list(result.check.clauses))} ({result.level}).", ""]
    if result.expectation == EXPECTED_FAILURE:
        lines += ["Listed as an expected failure.", ""]
    lines += ["```", result.message.rstrip(), "```", ""]
    if result.reproduction:
        lines += ["Reproduction:", "", "```", result.reproduction.render(), "```", ""]
    for clause_id in result.check.clauses:
        ref = spec.clauses.get(clause_id)
        deviation = ref.clause.vllm_deviation if ref is not None else None
        if deviation:
            lines += [f"Recorded for `{clause_id}`: {deviation}", ""]
    return lines


def write_markdown(run: RunResult, path: str | Path, spec: Any, *, command: str = "",
                   description: str = "") -> None:
    Path(path).write_text(render_markdown(run, spec, command=command, description=description),
                          encoding="utf-8")


# --- terminal ----------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.failed = 0

    def __call__(self, done: int, total: int, item: Check, result: CheckResult | None) -> None:
        if not self.enabled:
            return
        if result is not None and result.status == FAILED:
            self.failed += 1
        width = 30
        filled = int(width * done / max(total, 1))
        bar = "#" * filled + "-" * (width - filled)
        line = f"\r[{bar}] {done}/{total} {self.failed} failed  {item.id}"
        self.stream.write(line[:120].ljust(120))
        if done == total and result is not None:
            self.stream.write("\r" + " " * 120 + "\r")
        self.stream.flush()


def render_terminal(run: RunResult, *, verbose: bool = False) -> str:
    """The text summary; its last line is exactly ``N passed, M failed``."""
    lines = [
        f"enginewire check: target {run.target}, spec for vLLM {run.spec_version}, "
        f"{len(run.results)} checks{' (strict)' if run.strict else ''}",
    ]
    for surface in run.surfaces():
        c = run.counts(surface)
        extra = [f"{c[k]} {label}" for k, label in (
            (SKIPPED, "skipped"), (NOT_IMPLEMENTED, "not implemented"),
            (NOT_APPLICABLE, "not applicable"), (SPEC_ONLY, "spec only"),
            (NOT_RUN, "not run")) if c[k]]
        lines.append(f"  {surface:<9} {c[PASSED]:>4} passed, {c[FAILED]:>3} failed"
                     + (f"  ({', '.join(extra)})" if extra else ""))
    failing = [r for r in run.results if r.status == FAILED or r.unexpected]
    if failing:
        lines.append("")
        lines.append("FAILURES")
    for result in failing:
        tag = {
            EXPECTED_FAILURE: "XFAIL",
            UNEXPECTED_PASS: "XPASS",
            CHANGED_FAILURE: "CHANGED",
        }.get(result.expectation, "FAIL")
        lines.append(f"{tag} {result.check.id} [{', '.join(result.check.clauses)}] "
                     f"({result.level})")
        if result.expectation == UNEXPECTED_PASS:
            lines.append("    listed as an expected failure, but passed: remove it from "
                         f"{run.expected_file or 'the list'}")
            continue
        if result.expectation == CHANGED_FAILURE:
            lines.append(f"    expected a message starting {result.expected_message!r}")
        if result.expectation == EXPECTED_FAILURE and not verbose:
            lines.append(f"    {result.first_line}")
            continue
        for text in result.message.splitlines() or [""]:
            lines.append(f"    {text}")
        if result.reproduction:
            for text in result.reproduction.render().splitlines():
                lines.append(f"    | {text}")
        if result.traceback and verbose:
            for text in result.traceback.rstrip().splitlines():
                lines.append(f"    ! {text}")
    if verbose:
        others = [r for r in run.results
                  if r.status in (SKIPPED, NOT_IMPLEMENTED, NOT_APPLICABLE, SPEC_ONLY)]
        if others:
            lines.append("")
        for result in others:
            lines.append(f"{result.status.upper()} {result.check.id}: {result.message}")
    for check_id in run.unknown_expected:
        lines.append(f"note: {check_id} is in the expected-failure list but was not run")
    totals = run.counts()
    strict_note = ""
    should = [r for r in run.results if r.level != "MUST"]
    if should and run.strict:
        passed = sum(1 for r in should if r.status == PASSED)
        failed = sum(1 for r in should if r.status == FAILED)
        strict_note = f"SHOULD/MAY checks: {passed} passed, {failed} failed; "
    elif should:
        strict_note = f"{len(should)} SHOULD/MAY checks not run (use --strict); "
    lines.append("")
    lines.append(
        f"{strict_note}{totals[SKIPPED]} skipped, {totals[NOT_IMPLEMENTED]} not implemented, "
        f"{totals[NOT_APPLICABLE]} not applicable, {totals[SPEC_ONLY]} spec only, "
        f"{totals[EXPECTED_FAILURE]} expected failures, {totals[UNEXPECTED_PASS]} unexpected "
        f"passes, {totals[CHANGED_FAILURE]} changed failures"
    )
    lines.append(f"{totals[PASSED]} passed, {totals[FAILED]} failed")
    return "\n".join(lines)


# --- coverage ----------------------------------------------------------------------------


def coverage(spec: Any, checks: Sequence[Check]) -> dict[str, Any]:
    """Which clauses have checks: uncovered clauses by level, and check clauses unknown to
    the spec (a clause of another release, in the spec files but not in this version's spec,
    is neither)."""
    covered: dict[str, list[str]] = {}
    unknown: dict[str, list[str]] = {}
    other_releases: frozenset[str] = getattr(spec, "all_clause_ids", frozenset())
    for item in checks:
        for clause_id in item.clauses:
            if clause_id in spec.clauses:
                covered.setdefault(clause_id, []).append(item.id)
            elif clause_id in other_releases:
                continue
            else:
                unknown.setdefault(item.id, []).append(clause_id)
    uncovered: dict[str, list[str]] = {"MUST": [], "SHOULD": [], "MAY": []}
    for clause_id, ref in sorted(spec.clauses.items()):
        if clause_id not in covered:
            uncovered[ref.clause.level].append(clause_id)
    return {
        "clauses": len(spec.clauses),
        "covered": covered,
        "uncovered": uncovered,
        "unknown_clauses": unknown,
    }


def render_coverage(report: dict[str, Any], spec: Any) -> str:
    lines = []
    covered = report["covered"]
    lines.append(f"{len(covered)} of {report['clauses']} clauses have at least one check")
    for level in ("MUST", "SHOULD", "MAY"):
        missing = report["uncovered"][level]
        lines.append(f"{level} clauses without a check: {len(missing)}")
        for clause_id in missing:
            text = spec.clause(clause_id).text
            lines.append(f"  {clause_id}: {text[:100]}")
    if report["unknown_clauses"]:
        lines.append("checks naming clauses the spec does not have:")
        for check_id, clauses in sorted(report["unknown_clauses"].items()):
            lines.append(f"  {check_id}: {', '.join(clauses)}")
    return "\n".join(lines)
