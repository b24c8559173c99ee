"""The mutant catalogue: every mutant is killed, and by the check meant to kill it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ci_reports import recorded

from enginewire.cli import main
from enginewire.conformance.targets.resolve import load_target
from enginewire.fuzz.explore import replay
from enginewire.fuzz.mutants import EXPLORER, MUTANTS
from enginewire.fuzz.mutants.matrix import BOUNDED, _Baselines, run_explorer
from enginewire.spec import load

#: The mutants the issue names, by the failure they model (each must stay in the catalogue).
REQUIRED = {
    "flag-order", "missing-fence", "marks-read-before-copy", "reuses-partly-read-chunk",
    "overflow-off-by-one", "length-prefix-little-endian", "buffer-count-one-byte",
    "identity-big-endian", "type-bytes-swapped", "field-inserted-mid-struct",
    "inline-threshold-inclusive", "negative-buffer-index", "frame-buffer-reused",
    "lost-notification", "no-release-on-error", "floats-as-float32", "length-prefix-off-by-one",
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One bounded ``enginewire mutants`` run (in a subprocess, as CI runs it), or the one
    ``.ci/run`` recorded (see ci_reports.py)."""
    ran = recorded("mutants")
    if ran is not None:
        data = json.loads(ran.path("mutants.json").read_text())
        data["returncode"] = ran.returncode
        data["stdout"] = ran.output
        return data
    out = tmp_path_factory.mktemp("mutants") / "matrix.json"
    done = subprocess.run([sys.executable, "-m", "enginewire.cli", "mutants", "--bounded",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    data = json.loads(out.read_text())
    data["returncode"] = done.returncode
    data["stdout"] = done.stdout
    return data


def test_catalogue_is_complete_and_cited() -> None:
    assert len(MUTANTS) >= 15
    assert REQUIRED <= set(MUTANTS)
    for name, mutant in MUTANTS.items():
        assert mutant.name == name
        assert mutant.broken and mutant.citation, name
        assert mutant.conformance or mutant.fuzz_kinds or mutant.explorable, name
        target = mutant()
        try:
            assert target.has(mutant.surface), name
        finally:
            target.close()


def test_every_mutant_is_killed(matrix: dict[str, Any]) -> None:
    rows = {row["name"]: row for row in matrix["mutants"]}
    assert set(rows) == set(MUTANTS)
    survivors = [name for name, row in rows.items() if not row["killed"]]
    assert survivors == [], matrix["stdout"]
    assert matrix["returncode"] == 0
    for row in rows.values():
        assert any(c["kills"] for c in row["columns"].values()), row["name"]
    assert f"{len(MUTANTS)} of {len(MUTANTS)} mutants killed" in matrix["stdout"]


def test_ordering_mutants_are_killed_by_the_explorer_and_the_memory_checks_only(
        matrix: dict[str, Any]) -> None:
    """On x86 the real-memory ring checks cannot see a flag order or a fence; the explorer and
    the ring/memory checks (the order of the ring code's own accesses) do, independently."""
    rows = {row["name"]: row for row in matrix["mutants"]}
    for name, clause in (("flag-order", "ring.writer.read-flags-cleared-before-written"),
                         ("missing-fence", "ring.writer.fence-before-written")):
        columns = rows[name]["columns"]
        kills = columns["conformance"]["kills"]
        assert kills and all(k.startswith("ring/memory/") for k in kills), (name, kills)
        assert not columns["fuzz"]["ran"]
        assert columns["explorer"]["kills"], name
        assert clause in columns["explorer"]["details"][0]
        assert f"explorer kills {name}" in matrix["stdout"]


def test_every_mutant_is_killed_by_at_least_two_independent_checks(
        matrix: dict[str, Any]) -> None:
    kills = {row["name"]: row["kills"] for row in matrix["mutants"]}
    assert set(kills) == set(MUTANTS)
    thin = {name: count for name, count in kills.items() if count < 2}
    assert not thin, kills


def test_the_encoder_only_mutant_is_killed_by_the_differential_campaign(
        matrix: dict[str, Any]) -> None:
    """floats-as-float32 decodes like the reference and writes values every decoder reads the
    same: the decode fuzz campaign cannot see it; the differential encoder campaign names the
    struct, path and clause, and the float64 check is the other kill."""
    columns = {row["name"]: row["columns"] for row in matrix["mutants"]}["floats-as-float32"]
    assert not columns["fuzz"]["kills"]
    assert any("[structs.float.float64]" in k for k in columns["encoder"]["kills"])
    assert "codec/float/float64-on-wire" in columns["conformance"]["kills"]
    assert not [k for k in columns["conformance"]["kills"]
                if k != "codec/float/float64-on-wire" and not k.startswith("codec/golden/")]


def test_the_notification_and_error_mutants_have_a_second_independent_kill(
        matrix: dict[str, Any]) -> None:
    columns = {row["name"]: row["columns"] for row in matrix["mutants"]}
    lost = columns["lost-notification"]
    assert "ring/reader/finds-write-without-notification" in lost["conformance"]["kills"]
    assert any(k.startswith("lost-notification") for k in lost["explorer"]["kills"])
    untyped = columns["untyped-decode-errors"]
    assert untyped["fuzz"]["kills"]
    assert "codec/reject/names-the-clause" in untyped["conformance"]["kills"]


def test_codec_mutants_are_killed_by_the_checks_made_for_them(matrix: dict[str, Any]) -> None:
    kills = {row["name"]: row["columns"] for row in matrix["mutants"]}
    assert "codec/tensor/inline-threshold-exact" in \
        kills["inline-threshold-inclusive"]["conformance"]["kills"]
    assert {"codec/tensor/index-negative-rejected", "codec/ndarray/index-negative-rejected"} \
        <= set(kills["negative-buffer-index"]["conformance"]["kills"])
    assert any("untyped-error" in k for k in kills["untyped-decode-errors"]["fuzz"]["kills"])
    assert "engine/identity/rank-258" in kills["identity-big-endian"]["conformance"]["kills"]
    assert "engine/serve/many-requests-intact" in \
        kills["frame-buffer-reused"]["conformance"]["kills"]


def test_explorer_finds_flag_order_in_a_dozen_steps_and_replays_it() -> None:
    column = run_explorer(MUTANTS["flag-order"], _Baselines(load(), BOUNDED))
    assert column.kills
    trace = column.details[0]
    assert "clear-while-published" in trace
    steps = int(trace.split(" steps,")[0].rsplit(" ", 1)[1])
    assert steps <= 12
    schedule = trace.rsplit("--replay '", 1)[1].rstrip("'")
    again = replay(schedule)
    assert [f.violation.kind for f in again.findings] == ["clear-while-published"]


def test_reference_flag_protocol_is_not_what_the_explorer_reports() -> None:
    from enginewire.fuzz.explore import RingConfig, explore
    from enginewire.fuzz.explore.ring_targets import ReferenceTarget

    for mutant in (MUTANTS["flag-order"], MUTANTS["missing-fence"]):
        honest = explore(ReferenceTarget(), RingConfig(*mutant.explorer_config),
                         model=mutant.explorer_model, preemptions=BOUNDED.preemptions)
        broken = explore(EXPLORER.__getattr__(mutant.name), RingConfig(*mutant.explorer_config),
                         model=mutant.explorer_model, preemptions=BOUNDED.preemptions)
        assert honest.ok and not broken.ok, mutant.name


def test_check_command_fails_a_codec_mutant(capsys: Any) -> None:
    status = main(["check", "--target", "mutant:negative-buffer-index",
                   "-k", "codec/tensor/index-negative-rejected", "--no-progress"])
    assert status == 1
    assert "index-negative-rejected" in capsys.readouterr().out
    target = load_target("mutant:negative-buffer-index")
    assert target.codec is not None and target.ring is None


def test_mutants_command_usage(capsys: Any, tmp_path: Path) -> None:
    assert main(["mutants", "--only", "no-such-mutant"]) == 2
    assert "unknown mutant" in capsys.readouterr().err
    assert main(["mutants", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in MUTANTS)
