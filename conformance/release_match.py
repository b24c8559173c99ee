"""``enginewire spec match TARGET`` for a codec target: which releases the codec speaks.

A module of msgspec structs is compared by its declared layout (:mod:`enginewire.spec.history.
match`); a codec target (``reference``, ``vllm``, ``pkg.mod:attr``, ``--target-cmd``) declares
nothing, so it is probed. For every struct of the spec and every derived release X that has it,
a sample of the struct built from X's spec (every field of X, each a distinct value where the
struct allows, :class:`~enginewire.conformance.oracle.samples.Sampler`) is encoded by the target
and by the reference codec built for X; the two payloads are compared as plain msgpack trees
(extension values as their raw bytes). Equal trees: the target speaks X's layout of that struct.

For a struct that matches no release, the nearest release is the one whose sample the target
encoded with the longest common prefix of positions (then the fewest differing positions); the
report names the first differing position, X's field there and what the target put there (the
field of X's sample whose value the target wrote at that position, or the value itself when it
is none of them: a field X does not have). A sample the target refuses (an unknown field, a
missing required one) is no match; the refusal is reported when no release's sample was
encoded at all. A release whose sample the reference codec itself cannot encode is left out of
the comparison and counted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from enginewire.conformance.oracle.samples import CONTEXTUAL, Sampler
from enginewire.conformance.targets.contract import Target, TargetError
from enginewire.spec.history.compat import spec_for
from enginewire.spec.history.match import release_ranges
from enginewire.spec.history.wheels import read_releases
from enginewire.spec.loader import DATA_DIR
from enginewire.spec.schema import StructSpec


@dataclass
class CodecMatch:
    """How the target's encoding of one struct compares with every release's layout."""

    name: str
    matches: list[str] = field(default_factory=list)
    nearest: str | None = None
    position: str | None = None
    target_meaning: str | None = None
    spec_meaning: str | None = None
    refused: dict[str, str] = field(default_factory=dict)
    unprobed: list[str] = field(default_factory=list)


def _tree(frames: Sequence[Any]) -> Any:
    """The first frame as a plain msgpack tree (extensions kept as ``Ext``)."""
    return msgspec.msgpack.decode(bytes(frames[0]))


_CODECS: dict[str, Any] = {}


def _reference_codec(version: str) -> Any:
    """The reference target's codec (neutral values in) built for ``version``, kept."""
    found = _CODECS.get(version)
    if found is None:
        from enginewire.conformance.targets.reference import ReferenceCodec

        found = _CODECS[version] = ReferenceCodec(version=version)
    return found


@dataclass
class _Diff:
    prefix: int
    differences: int
    position: str
    target: str
    spec: str


def _compare(expected: Any, got: Any, item: StructSpec, sample: dict[str, Any],
             expected_tree: Any) -> _Diff | None:
    """None when ``got`` equals ``expected``; else where they first differ."""
    if got == expected:
        return None
    names = [f.name for f in item.fields]
    types = {f.name: f.type for f in item.fields}
    by_value: dict[str, list[str]] = {}
    if isinstance(expected_tree, list):
        for index, value in enumerate(expected_tree):
            if index < len(names):
                by_value.setdefault(repr(value), []).append(names[index])
    elif isinstance(expected_tree, dict):
        for key, value in expected_tree.items():
            by_value.setdefault(repr(value), []).append(str(key))

    def target_says(value: Any) -> str:
        owners = by_value.get(repr(value))
        if owners:
            return " or ".join(f"the value of {o}" for o in owners)
        return f"{_short(value)} (no field of the sample has it)"

    if isinstance(expected, list) and isinstance(got, list):
        differing = [i for i in range(max(len(expected), len(got)))
                     if i >= len(expected) or i >= len(got) or expected[i] != got[i]]
        first = differing[0]
        spec_text = (f"{names[first]}: {types[names[first]]}" if first < len(names)
                     else "(no field: the array ends)")
        target_text = target_says(got[first]) if first < len(got) else \
            "(no value: the array ends)"
        return _Diff(first, len(differing), f"position {first}", target_text, spec_text)
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = sorted(set(expected) | set(got), key=str)
        differing = [k for k in keys if expected.get(k, ...) != got.get(k, ...)]
        first_key = differing[0]
        spec_text = (f"{first_key}: {types.get(str(first_key), 'any')}" if first_key in expected
                     else "(no such key)")
        target_text = target_says(got[first_key]) if first_key in got else "(no such key)"
        return _Diff(len(keys) - len(differing), len(differing), f"key {first_key!r}",
                     target_text, spec_text)
    return _Diff(0, 1000, "the payload",
                 f"a {type(got).__name__}", f"a {type(expected).__name__} ({item.encoding})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def match_codec(codec: Any, releases: Sequence[str], names: Sequence[str] | None = None,
                ) -> list[CodecMatch]:
    """Probe ``codec`` (a codec surface) struct by struct against every release in
    ``releases``; ``names`` limits the structs (default: every struct of any release, less
    those that only travel inside a context-specific encoding)."""
    specs = {v: spec_for(v) for v in releases}
    if names is None:
        seen: dict[str, None] = {}
        for spec in specs.values():
            for name, known in spec.structs.items():
                if isinstance(known, StructSpec) and name not in CONTEXTUAL:
                    seen.setdefault(name)
        names = sorted(seen)
    results = []
    for name in names:
        result = CodecMatch(name)
        best: tuple[int, int] | None = None
        for version in releases:
            item = specs[version].structs.get(name)
            if not isinstance(item, StructSpec):
                continue
            try:
                sample = Sampler(specs[version]).struct(name)
                expected = _tree(_reference_codec(version).encode(name, sample))
            except Exception:  # noqa: BLE001 - the reference cannot encode X's sample: left out
                result.unprobed.append(version)
                continue
            try:
                got = _tree(codec.encode(name, sample))
            except Exception as exc:  # noqa: BLE001 - any refusal is "does not speak X"
                result.refused[version] = f"{type(exc).__name__}: {_short(str(exc))}"
                continue
            diff = _compare(expected, got, item, sample, expected)
            if diff is None:
                result.matches.append(version)
                continue
            key = (-diff.prefix, diff.differences)
            if best is None or key < best:
                best = key
                result.nearest, result.position = version, diff.position
                result.target_meaning, result.spec_meaning = diff.target, diff.spec
        if result.matches:
            result.nearest = result.position = result.target_meaning = None
            result.spec_meaning = None
        results.append(result)
    return results


def render(results: Sequence[CodecMatch], releases: Sequence[str]) -> list[str]:
    """One line per struct (matches, nearest with the first difference, or the refusal)."""
    lines = []
    for result in results:
        if result.matches:
            lines.append(f"{result.name}: matches {release_ranges(result.matches, list(releases))}")
        elif result.nearest is not None:
            lines.append(f"{result.name}: matches no release; nearest {result.nearest}, first "
                         f"difference at {result.position}: target has {result.target_meaning},"
                         f" {result.nearest} has {result.spec_meaning}")
        elif result.refused:
            version, reason = list(result.refused.items())[-1]
            lines.append(f"{result.name}: the target encoded no release's sample "
                         f"(e.g. {version}: {reason})")
        else:
            lines.append(f"{result.name}: not probed (the reference cannot encode a sample at "
                         f"any release that has it)")
    return lines


def run_codec_match(target_text: str, commands: Sequence[str] = (),
                    names: Sequence[str] | None = None) -> int:
    """The command: 0 when every probed struct matches some release, 1 otherwise, 2 when the
    target has no codec surface or cannot be loaded (also a codec program that cannot
    start)."""
    from enginewire.conformance.targets.resolve import load_target

    try:
        target: Target = load_target(target_text, commands)
    except TargetError as exc:
        print(f"enginewire spec match: error: {exc}", file=sys.stderr)
        return 2
    try:
        if not target.has("codec"):
            print(f"enginewire spec match: error: {target.name} has no codec surface to probe",
                  file=sys.stderr)
            return 2
        codec = target.surface("codec")
        try:
            getattr(codec, "role", None)  # a codec program starts here (its hello)
        except TargetError as exc:  # it could not start: no struct was probed
            print(f"enginewire spec match: error: {exc}", file=sys.stderr)
            return 2
        releases = read_releases(DATA_DIR)
        results = match_codec(codec, releases, names)
    finally:
        target.close()
    encoded = [r for r in results if r.matches or r.nearest or r.refused]
    for line in render(encoded, releases):
        print(line)
    skipped = len(results) - len(encoded)
    if skipped:
        print(f"({skipped} structs not probed: the reference encodes no sample of them)")
    return 0 if encoded and all(r.matches for r in encoded) else 1
