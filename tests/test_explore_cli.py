"""``enginewire explore`` on the command line (registered into a parser of its own)."""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

import pytest

from enginewire.fuzz.explore.commands import register

VARIANT = textwrap.dedent('''
    from enginewire.fuzz.explore import ReferenceTarget
    from enginewire.reference.ring.protocol import RingWriter


    class FlagsAfterWrittenWriter(RingWriter):
        def commit(self):
            index, memory = self._claimed, self.memory
            row = self._rows[index]
            memory.fence()
            memory.store(row, 1)
            for reader in range(self.layout.n_reader):
                memory.store(row + 1 + reader, 0)
            memory.fence()
            self._claimed = None
            self.index = (index + 1) % self.layout.max_chunks


    flag_order = ReferenceTarget(writer_cls=FlagsAfterWrittenWriter)
''')


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="enginewire")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["explore", *argv])
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_passing_exploration_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--readers", "2", "--chunks", "2", "--messages", "2")
    assert code == 0
    assert out.strip().endswith("no violation")
    assert "every interleaving" in out


def test_a_violation_prints_a_trace_and_a_schedule_that_replays_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "explore_variant.py").write_text(VARIANT)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run(capsys, "--target", "explore_variant:flag_order")
    assert code == 1
    assert "VIOLATION clear-while-published [ring.writer.read-flags-cleared-before-written]" in out
    match = re.search(r"--replay '([^']+)'", out)
    assert match is not None
    schedule = match.group(1)
    assert schedule.startswith("explore_variant:flag_order/sc/2x2x3/")
    code, replayed, _ = run(capsys, "--replay", schedule)
    assert code == 1
    assert out.splitlines()[0] == replayed.splitlines()[0]


def test_a_violation_writes_its_trace_as_a_swimlane_page(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--html FILE``: the shrunk trace, one column per thread, every event of the printed
    trace in order; the replay writes the same trace."""
    page = tmp_path / "trace.html"
    code, out, _ = run(capsys, "--target",
                       "enginewire.fuzz.mutants:EXPLORER.marks-read-before-copy",
                       "--readers", "1", "--chunks", "1", "--messages", "2",
                       "--html", str(page))
    assert code == 1
    text = page.read_text()
    trace = out[out.index("trace ("):out.index("what each reader saw")].splitlines()[1:]
    assert "reader r0" in out and "writer" in out
    assert f"data-lanes='2' data-events='{len(trace)}'" in text
    assert ("<div class='head lane'>writer</div><div class='head lane'>reader r0</div>"
            in text)
    assert "deadlock" in text and "--replay" in text
    assert "<link" not in text and "src=" not in text  # self-contained
    schedule = re.search(r"--replay '([^']+)'", out).group(1)  # type: ignore[union-attr]
    replayed = tmp_path / "replayed.html"
    assert run(capsys, "--replay", schedule, "--html", str(replayed))[0] == 1
    assert f"data-lanes='2' data-events='{len(trace)}'" in replayed.read_text()


def test_random_sampling_under_weak(capsys: pytest.CaptureFixture[str]) -> None:
    """PCT sampling finds the missing data fence of a broken writer, and the fixed reference
    ring passes the same schedules."""
    broken = "enginewire.fuzz.mutants:EXPLORER.missing-fence"
    args = ("--memory", "weak", "--random", "50", "--seed", "3",
            "--readers", "1", "--chunks", "1", "--messages", "2")
    code, out, _ = run(capsys, "--target", broken, *args)
    assert code == 1
    assert "found by random schedule seed" in out
    assert "random (PCT) schedules" in out
    code, out, _ = run(capsys, *args)
    assert code == 0, out
    assert "no violation" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--target", "nonesuch")[0] == 2
    assert run(capsys, "--replay", "reference/sc/1x1x1/w,r7")[0] == 2
    code, _, err = run(capsys, "--readers", "0")
    assert code == 2
    assert "readers must be a positive integer" in err
    with pytest.raises(SystemExit):
        run(capsys, "--preemptions", "1", "--random", "5")


def test_a_search_cut_short_at_its_state_limit_is_inconclusive_never_a_pass(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--readers", "2", "--chunks", "2", "--messages", "2",
                       "--max-states", "50")
    assert code == 3
    assert "no violation" not in out
    assert re.search(r"inconclusive at \d+ states \(coverage reached: \d+ states, \d+ "
                     r"transitions, \d+ execution ends", out)
