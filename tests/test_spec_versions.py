"""Kafka-style version ranges (``enginewire.spec.versions``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginewire.spec import VersionRange
from enginewire.spec.versions import VersionError, format_version, parse_version


def test_parse_version_pads_to_three_parts() -> None:
    assert parse_version("0.33.0") == (0, 33, 0)
    assert parse_version("1") == (1, 0, 0)
    assert parse_version("0.8") == (0, 8, 0)
    assert parse_version(" 0.8.5 ") == (0, 8, 5)


@pytest.mark.parametrize("text", ["", "v0.8.0", "0.8.0.1", "0.8.0rc1", "0..8", "0.8.", "a.b.c"])
def test_parse_version_errors(text: str) -> None:
    with pytest.raises(VersionError, match="expected a version like '0.33.0'"):
        parse_version(text)


def test_format_version() -> None:
    assert format_version((0, 33, 0)) == "0.33.0"


def test_open_range() -> None:
    versions = VersionRange.parse("0.8.0+")
    assert versions == VersionRange((0, 8, 0), None)
    assert "0.8.0" in versions
    assert "0.33.0" in versions
    assert (99, 0, 0) in versions
    assert "0.7.9" not in versions


def test_closed_range_includes_both_ends() -> None:
    versions = VersionRange.parse("0.8.0-0.32.9")
    assert versions == VersionRange((0, 8, 0), (0, 32, 9))
    assert "0.8.0" in versions
    assert "0.32.9" in versions
    assert "0.20" in versions
    assert "0.7.99" not in versions
    assert "0.33.0" not in versions


def test_exact_version() -> None:
    versions = VersionRange.parse("0.33.0")
    assert versions == VersionRange((0, 33, 0), (0, 33, 0))
    assert "0.33.0" in versions
    assert "0.33" in versions
    assert "0.33.1" not in versions
    assert "0.32.9" not in versions


def test_versions_compare_as_numbers_not_strings() -> None:
    assert "0.10.0" in VersionRange.parse("0.9.0+")
    assert "0.9.0" not in VersionRange.parse("0.10.0+")


def test_containment_of_other_things_is_false() -> None:
    versions = VersionRange.parse("0.8.0+")
    assert 33 not in versions
    assert None not in versions


def test_containment_of_a_malformed_version_raises() -> None:
    with pytest.raises(VersionError):
        _ = "latest" in VersionRange.parse("0.8.0+")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0.8.0+", "0.8.0+"),
        ("0.8+", "0.8.0+"),
        ("0.8.0-0.32.9", "0.8.0-0.32.9"),
        ("0.8 - 0.9", "0.8.0-0.9.0"),
        ("0.33.0", "0.33.0"),
        ("0.33.0-0.33.0", "0.33.0"),
        ("  1  ", "1.0.0"),
    ],
)
def test_str_is_canonical_and_round_trips(text: str, canonical: str) -> None:
    versions = VersionRange.parse(text)
    assert str(versions) == canonical
    assert VersionRange.parse(str(versions)) == versions


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a version"),
        ("+", "expected a version"),
        ("-", "expected a version"),
        ("0.8.0-", "expected a version"),
        ("-0.8.0", "expected a version"),
        ("0.8.0+-0.9.0", "expected a version"),
        ("0.8.0-0.9.0-1.0.0", "expected a version"),
        ("0.8.0++", "expected a version"),
        ("latest", "expected a version"),
        ("0.10.0-0.9.0", "ends before it starts"),
    ],
)
def test_range_errors(text: str, message: str) -> None:
    with pytest.raises(VersionError, match=message):
        VersionRange.parse(text)


def test_ranges_are_hashable_values() -> None:
    assert {VersionRange.parse("0.8+"), VersionRange.parse("0.8.0+")} == {
        VersionRange((0, 8, 0), None)
    }


_version = st.tuples(*(st.integers(0, 200) for _ in range(3)))


@given(_version, _version, st.booleans())
def test_round_trip_property(low: tuple[int, int, int], high: tuple[int, int, int],
                             open_ended: bool) -> None:
    low, high = min(low, high), max(low, high)
    versions = VersionRange(low, None if open_ended else high)
    assert VersionRange.parse(str(versions)) == versions
    assert low in versions
    assert high in versions
    assert _just_below(low) not in versions


def _just_below(version: tuple[int, int, int]) -> tuple[int, int, int]:
    """A version lower than ``version`` but above any lower one the strategy draws."""
    major, minor, patch = version
    if patch:
        return major, minor, patch - 1
    if minor:
        return major, minor - 1, 10**6
    return major - 1, 10**6, 10**6


def test_a_known_version_is_remembered_until_the_releases_file_changes(tmp_path) -> None:
    from enginewire.spec.loader import UnknownVersionError, _check_known_version

    releases = tmp_path / "history" / "releases.toml"
    releases.parent.mkdir()
    releases.write_text('releases = ["0.1.0", "0.2.0"]\n')
    _check_known_version(tmp_path, "0.2.0")
    _check_known_version(tmp_path, "0.2.0")  # remembered: no parse
    with pytest.raises(UnknownVersionError):
        _check_known_version(tmp_path, "0.3.0")
    # Rewritten (its size changes even where the modification time does not): read again.
    releases.write_text('releases = ["0.1.0"]\n')
    with pytest.raises(UnknownVersionError):
        _check_known_version(tmp_path, "0.2.0")
