"""``enginewire interop``: the matrix's cells on the reference, and cells that must fail.

The vLLM cells (vLLM's front-end client, engine core and MessageQueue) run in the ``slow``
test at the end.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from enginewire.cli import main as cli_main
from enginewire.conformance import interop
from enginewire.conformance.interop import (
    Cell,
    Exchange,
    Implementation,
    classify,
    reference_implementation,
    run_engine_cell,
    run_ring_cell,
)
from enginewire.conformance.targets.reference import ReferenceFrontendClient
from enginewire.reference.engine import ReferenceEngine
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.reference.ring.framing import needs_overflow
from enginewire.reference.ring.payload import PickleCodec

TIMEOUT = 20.0


@pytest.fixture
def reference() -> Implementation:
    return reference_implementation()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_reference_front_end_and_engine(reference: Implementation, transport: str) -> None:
    cell = run_engine_cell(reference, reference, transport, TIMEOUT)
    assert cell.status == "passed", cell.exchanges
    assert [e.name for e in cell.exchanges] == ["handshake", "add", "abort", "utility",
                                                 "shutdown"]


def test_reference_ring_writer_and_readers(reference: Implementation) -> None:
    cell = run_ring_cell(reference, reference, TIMEOUT)
    assert cell.status == "passed", cell.exchanges
    assert [e.name for e in cell.exchanges] == ["ready", "stream", "receive", "close"]


def test_the_ring_stream_has_an_overflow_and_an_out_of_band_message() -> None:
    codec = PickleCodec()
    encoded = {i: codec.encode(interop.ring_message(i)) for i in range(interop.RING_MESSAGES)}
    overflowing = [i for i, bufs in encoded.items()
                   if needs_overflow(bufs, interop.RING_CHUNK)]
    out_of_band = [i for i, bufs in encoded.items() if len(bufs) > 1]
    assert overflowing == [interop.OVERFLOW_INDEX]
    assert out_of_band == [interop.OUT_OF_BAND_INDEX]


class AbortDroppingEngine(ReferenceEngine):
    """A broken engine: it ignores every ABORT."""

    def _abort(self, request_ids: list[str]) -> None:
        return None


def test_engine_that_drops_aborts_fails_at_abort(reference: Implementation) -> None:
    broken = reference_implementation(AbortDroppingEngine)
    cell = run_engine_cell(reference, broken, "ipc", TIMEOUT)
    assert cell.status == "failed"
    failure = cell.first_failure
    assert failure is not None and failure.name == "abort"
    assert "got finish_reason 1" in failure.detail
    assert failure.side == "engine"
    assert [e.name for e in cell.exchanges] == ["handshake", "add", "abort"]


class WrongTokensEngine(ReferenceEngine):
    """A broken engine: it finishes every request one token early."""

    def _add(self, request: Any) -> None:
        request.sampling_params.max_tokens -= 1
        super()._add(request)


def test_engine_with_wrong_tokens_fails_at_add(reference: Implementation) -> None:
    cell = run_engine_cell(reference, reference_implementation(WrongTokensEngine), "tcp",
                           TIMEOUT)
    failure = cell.first_failure
    assert cell.status == "failed" and failure is not None and failure.name == "add"
    assert "expected tokens" in failure.detail


class _CorruptingRing:
    """The reference ring whose writer sends message 500 with another payload."""

    def __init__(self, ring: Any) -> None:
        self.ring = ring

    def create_writer(self, **options: Any) -> Any:
        writer = self.ring.create_writer(**options)
        enqueue = writer.enqueue

        def corrupting(obj: Any, timeout: float | None = None) -> None:
            if obj[0] == 500:
                obj = (500, b"not the payload")
            enqueue(obj, timeout)

        writer.enqueue = corrupting
        return writer


def test_ring_cell_names_the_first_wrong_message(reference: Implementation) -> None:
    broken = Implementation("broken", ring=_CorruptingRing(reference.ring))
    cell = run_ring_cell(broken, reference, TIMEOUT)
    failure = cell.first_failure
    assert cell.status == "failed" and failure is not None and failure.name == "receive"
    assert "message 500 differs" in failure.detail


def _cell(left: str, clause: str | None, side: str | None) -> Cell:
    cell = Cell("engine", left, "reference", "ipc", [
        Exchange("add", True, 0.1), Exchange("shutdown", False, 0.1, "files left", clause, side)])
    classify(cell)
    return cell


def test_only_a_documented_vllm_deviation_is_not_a_failure() -> None:
    documented = _cell("vllm", "transport.ipc-files-removed", "frontend")
    assert documented.status == "deviation" and documented.ok
    assert documented.deviation is not None and documented.deviation.finding == "021"
    assert Path(documented.deviation.link).exists()
    # The same failure by the reference, by the other side, or of another clause: failed.
    assert _cell("reference", "transport.ipc-files-removed", "frontend").status == "failed"
    assert _cell("vllm", "transport.ipc-files-removed", "engine").status == "failed"
    assert _cell("vllm", "frames.abort-payload", "frontend").status == "failed"


def test_deviation_links_exist() -> None:
    for deviation in interop.DEVIATIONS:
        assert Path(deviation.link).is_file(), deviation.link


def test_command_prints_and_writes_the_matrix(tmp_path: Path, capsys: Any) -> None:
    out_json, out_html = tmp_path / "m.json", tmp_path / "m.html"
    status = cli_main(["interop", "--peers", "reference", "--transport", "ipc",
                       "--json", str(out_json), "--html", str(out_html)])
    assert status == 0
    table = capsys.readouterr().out
    assert "3 passed, 0 documented deviations, 0 failed" in table
    data = json.loads(out_json.read_text())
    assert data["ok"] is True
    assert [(c["kind"], c["status"]) for c in data["cells"]] == [("engine", "passed"),
                                                                  ("engine-dp", "passed"),
                                                                  ("ring", "passed")]
    assert "<table>" in out_html.read_text()


def test_command_exits_1_on_a_failed_cell(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setitem(interop.IMPLEMENTATIONS, "reference",
                        lambda: reference_implementation(AbortDroppingEngine))
    status = cli_main(["interop", "--peers", "reference", "--transport", "ipc",
                       "--only", "engine"])
    assert status == 1
    assert "FAILED at abort" in capsys.readouterr().out


def test_unknown_peer_is_a_usage_error(capsys: Any) -> None:
    assert cli_main(["interop", "--peers", "reference,nope"]) == 2


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_reference_front_end_and_two_data_parallel_engines(reference: Implementation,
                                                           transport: str) -> None:
    cell = interop.run_dp_cell(reference, reference, transport, TIMEOUT)
    assert cell.status == "passed", cell.exchanges
    assert cell.kind == "engine-dp"
    assert [e.name for e in cell.exchanges] == ["handshake", "add-each-rank",
                                                 "utility-each-rank", "shutdown"]


class _RankZeroOutputsEngine(ReferenceEngine):
    """A broken engine: every rank's outputs say engine_index 0."""

    def _step(self) -> None:
        send = self.connection.send

        def rank_zero(kind: str, value: Any, **options: Any) -> Any:
            if kind == "outputs":
                value.engine_index = 0
            return send(kind, value, **options)

        self.connection.send = rank_zero  # type: ignore[method-assign]
        try:
            super()._step()
        finally:
            self.connection.send = send  # type: ignore[method-assign]


def test_dp_cell_fails_when_an_engine_names_another_rank(reference: Implementation) -> None:
    cell = interop.run_dp_cell(reference, reference_implementation(_RankZeroOutputsEngine),
                               "ipc", TIMEOUT)
    failure = cell.first_failure
    assert cell.status == "failed" and failure is not None and failure.name == "add-each-rank"
    assert failure.clause == "transport.output-has-no-identity", failure


def test_dp_cells_run_by_default_and_can_be_left_out(capsys: Any) -> None:
    assert cli_main(["interop", "--peers", "reference", "--transport", "tcp",
                     "--only", "dp"]) == 0
    assert "engine-dp  reference" in capsys.readouterr().out
    assert cli_main(["interop", "--peers", "reference", "--transport", "tcp", "--only",
                     "engine", "--no-dp"]) == 0
    assert "engine-dp" not in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.vllm
def test_full_matrix_with_vllm() -> None:
    pytest.importorskip("vllm")
    with interop.implementations(["reference", "vllm"]) as (impls, unavailable):
        assert not unavailable
        # The API server cells run in tests/test_vllm_serve.py.
        cells = interop.run_matrix(impls, timeout=60.0, api_server=False)
        # The data-parallel cells over ipc (tcp adds nothing DP-specific); vLLM's coordinated
        # topology runs in tests/test_vllm_dp.py, which keeps its records.
        cells += interop.run_matrix(impls, timeout=60.0, transports=["ipc"], engine=False,
                                    ring=False, dp=True, coordinated_dp=False,
                                    api_server=False)
    matrix = interop.Matrix(cells, ["reference", "vllm"])
    assert matrix.ok, interop.render_table(matrix)
    # Exactly the cells docs/interop.md publishes: vLLM's front end over ipc and vLLM's ring
    # writer leave their ipc socket files (finding 021); every other cell passes.
    statuses = {(c.kind, c.left, c.right, c.transport): c.status for c in cells}
    deviations = {key for key, status in statuses.items() if status == "deviation"}
    assert deviations == {("engine", "vllm", "reference", "ipc"),
                          ("engine", "vllm", "vllm", "ipc"),
                          ("ring", "vllm", "reference", "shm"),
                          ("ring", "vllm", "vllm", "shm"),
                          ("engine-dp", "vllm", "reference", "ipc"),
                          ("engine-dp", "vllm", "vllm", "ipc")}, interop.render_table(matrix)
    assert len(statuses) == 4 * 2 + 4 + 4
    assert {c.deviation.finding for c in cells if c.deviation} == {"021"}


class _NoHandshakeClient(ReferenceFrontendClient):
    """The reference front end without a handshake channel, as vLLM's client given
    ``client_addresses``: it only waits for the ready responses."""

    def __init__(self, launch: Any, codec: Any) -> None:
        super().__init__(launch, codec, functools.partial(ReferenceFrontend, handshake=False))


class _NoHandshakeFrontends:
    handshake = False

    def __init__(self, codec: Any) -> None:
        self.codec = codec

    def start_frontend(self, launch: Any) -> _NoHandshakeClient:
        return _NoHandshakeClient(launch, self.codec)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_front_end_without_handshake_is_paired_through_the_launcher(
        reference: Implementation, transport: str) -> None:
    no_handshake = Implementation("reference-no-handshake",
                                  frontend=_NoHandshakeFrontends(reference.frontend.codec))
    cell = run_engine_cell(no_handshake, reference, transport, TIMEOUT)
    assert cell.status == "passed", cell.exchanges
    assert cell.exchanges[0].name == "ready-response"


class _SilentEngine(ReferenceEngine):
    """A broken engine: it never says HELLO (it stops before starting)."""

    def run(self) -> int:
        return 0


def test_engine_that_never_says_hello_fails_at_start_up(reference: Implementation) -> None:
    no_handshake = Implementation("reference-no-handshake",
                                  frontend=_NoHandshakeFrontends(reference.frontend.codec))
    cell = run_engine_cell(no_handshake, reference_implementation(_SilentEngine), "ipc", 1.0)
    failure = cell.first_failure
    assert failure is not None and failure.name == "ready-response"
    assert "no HELLO/READY within 1 s" in failure.detail and failure.side == "engine"
    cell = run_engine_cell(reference, reference_implementation(_SilentEngine), "tcp", 1.0)
    failure = cell.first_failure
    assert failure is not None and failure.name == "handshake"


def test_an_implementation_that_cannot_load_fails_the_run(monkeypatch: Any,
                                                            capsys: Any) -> None:
    def broken() -> Implementation:
        raise ImportError("no such package")

    monkeypatch.setitem(interop.IMPLEMENTATIONS, "vllm", broken)
    status = cli_main(["interop", "--peers", "reference,vllm", "--only", "ring"])
    assert status == 1
    assert "vllm: not run (ImportError: no such package)" in capsys.readouterr().out


# --- --version X: the cells in release X's terms ---------------------------------------------


def test_the_matrix_at_an_older_release_runs_the_reference_cells_in_its_terms() -> None:
    """At 0.9.1 the reference front end and engine hold their cells in 0.9.1's terms; every
    cell that needs the installed vLLM, and the ring cells (0.9.1 frames a chunk as one
    pickle stream), are not applicable with the reason."""
    with interop.implementations(["reference", "vllm"], version="0.9.1") as (impls, missing):
        assert not missing
        cells = interop.run_matrix(impls, timeout=TIMEOUT, dp=True, coordinated_dp=False)
    by_key = {(c.kind, c.left, c.right, c.transport): c for c in cells}
    for kind in ("engine", "engine-dp"):
        for transport in ("ipc", "tcp"):
            cell = by_key[(kind, "reference", "reference", transport)]
            assert cell.status == "passed", cell.exchanges
    vllm_cells = [c for c in cells if "vllm" in (c.left, c.right)]
    assert vllm_cells and all(c.status == "not applicable" for c in vllm_cells)
    assert all("needs the installed vLLM 0.33.0" in (c.not_applicable or "")
               for c in vllm_cells if c.kind != "ring")
    ring = by_key[("ring", "reference", "reference", "shm")]
    assert ring.status == "not applicable" and "as pickle" in (ring.not_applicable or "")
    matrix = interop.Matrix(cells, ["reference", "vllm"], version="0.9.1")
    assert matrix.ok
    assert matrix.to_builtins()["version"] == "0.9.1"
    assert interop.render_table(matrix).endswith("not applicable")


def test_a_front_end_at_an_older_release_fails_with_an_engine_of_the_newest() -> None:
    """The cells do speak the release: a 0.9.1 front end rejects the READY of a 0.33.0 engine
    (no num_gpu_blocks), and the handshake exchange fails."""
    old = reference_implementation(version="0.9.1")
    cell = run_engine_cell(old, reference_implementation(), "ipc", 3.0)
    assert cell.status == "failed"
    assert cell.first_failure is not None and cell.first_failure.name == "handshake"


@pytest.mark.parametrize("version", ["0.7.3", "0.8.5"])
def test_engine_cells_at_a_release_without_the_handshake_run_on_its_channels(
        version: str) -> None:
    """Before 0.9.0 the engine cell's engine gets its input and output addresses directly
    and both sides open the release's sockets (0.7.3: PUSH/PULL without identity; 0.8.5: a
    DEALER that sends b"READY")."""
    with interop.implementations(["reference"], version=version) as (impls, _):
        [cell] = interop.run_matrix(impls, transports=["ipc"], ring=False, timeout=TIMEOUT)
    assert cell.status == "passed", cell.exchanges


def test_engine_cells_at_0_9_0_hold_the_handshake_on_the_input_socket() -> None:
    """At 0.9.0 the engine cell's engine is launched by the input address: HELLO, the init
    map and READY on the input socket; a 0.9.0 engine fails with a 0.9.1 front end (which
    sends an EngineHandshakeMetadata init and waits for READY on its handshake socket)."""
    with interop.implementations(["reference"], version="0.9.0") as (impls, _):
        [cell] = interop.run_matrix(impls, transports=["ipc"], ring=False, timeout=TIMEOUT)
    assert cell.status == "passed", cell.exchanges
    old = reference_implementation(version="0.9.0")
    cell = run_engine_cell(reference_implementation(version="0.9.1"), old, "ipc", 2.0)
    assert cell.status == "failed"


def test_an_engine_without_the_handshake_fails_with_a_front_end_of_the_newest() -> None:
    """A 0.8.5 engine connects its input DEALER and sends b"READY"; a 0.33.0 front end waits
    for HELLO on its handshake socket, which never comes, so the cell fails at start-up."""
    old = reference_implementation(version="0.8.5")
    cell = run_engine_cell(reference_implementation(), old, "ipc", 2.0)
    assert cell.status == "failed"
    assert cell.first_failure is not None and cell.first_failure.name == "handshake"


def test_interop_at_an_unknown_release_is_a_usage_error(capsys: Any) -> None:
    assert cli_main(["interop", "--version", "0.0.1", "--peers", "reference"]) == 2
    assert "0.0.1" in capsys.readouterr().err
