"""The matrix driver and report: every cell of the paired implementations
(:func:`run_matrix`), its table and HTML page, and the ``enginewire interop`` command
(:func:`register`, :func:`main`)."""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from enginewire.cliargs import positive_float, writable_file
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

from .api_server_cells import (
    run_api_server_cell,
)
from .common import (
    IMPLEMENTATIONS,
    PEERS,
    STEP_TIMEOUT,
    TRANSPORTS,
    Cell,
    Implementation,
)
from .dp_cells import (
    _TOPOLOGY_CELLS,
    DP_SIZE,
    run_dp_cell,
)
from .engine_cells import (
    run_engine_cell,
)
from .ring_cells import (
    run_ring_cell,
)

# --- the matrix ------------------------------------------------------------------------------


@dataclass
class Matrix:
    cells: list[Cell]
    peers: list[str]
    unavailable: dict[str, str] = field(default_factory=dict)
    #: The vLLM release the cells ran at (None: the spec's reference release).
    version: str | None = None

    @property
    def ok(self) -> bool:
        return not self.unavailable and all(cell.ok for cell in self.cells)

    def to_builtins(self) -> dict[str, Any]:
        return {"peers": self.peers, "version": self.version or REFERENCE_VLLM_VERSION,
                "unavailable": self.unavailable, "ok": self.ok,
                "cells": [cell.to_builtins() for cell in self.cells]}


@contextlib.contextmanager
def implementations(names: Sequence[str],
                    factories: dict[str, Callable[..., Implementation]] | None = None,
                    version: str | None = None,
                    ) -> Iterator[tuple[dict[str, Implementation], dict[str, str]]]:
    """The named implementations (closed afterwards), and why any could not be loaded.
    ``version``: the vLLM release they speak (each factory is called with ``version=``
    unless it is the spec's reference release)."""
    factories = factories or IMPLEMENTATIONS
    release = {} if version in (None, REFERENCE_VLLM_VERSION) else {"version": version}
    loaded: dict[str, Implementation] = {}
    unavailable: dict[str, str] = {}
    try:
        for name in names:
            try:
                loaded[name] = factories[name](**release)
            except Exception as exc:  # noqa: BLE001 - reported as unavailable
                unavailable[name] = f"{type(exc).__name__}: {exc}"[:300]
        yield loaded, unavailable
    finally:
        for impl in loaded.values():
            impl.close()


def run_matrix(impls: dict[str, Implementation], *, transports: Sequence[str] = TRANSPORTS,
               ring: bool = True, engine: bool = True, timeout: float = STEP_TIMEOUT,
               progress: Callable[[Cell], None] | None = None, dp: bool = False,
               coordinated_dp: bool = True, api_server: bool = True) -> list[Cell]:
    """Every front end x engine core x transport, then every ring writer x readers; with
    ``dp``, also every front end x :data:`DP_SIZE` engine cores x transport and (unless
    ``coordinated_dp`` is false) the registered topology cells whose implementations are
    paired (:func:`register_topology_cell`); then (with ``api_server``, when ``vllm`` is
    among ``impls``) vLLM's API server x every engine core."""
    cells: list[Cell] = []
    names = list(impls)

    def add(kind: str, left: str, right: str, transport: str, involved: Sequence[str],
            run: Callable[[], Cell]) -> None:
        # A cell an implementation cannot hold at its release is not run (Cell.not_applicable).
        reason = next((f"{name}: {why}" for name in involved
                       if (why := impls[name].gap(kind)) is not None), None)
        cells.append(run() if reason is None
                     else Cell(kind, left, right, transport, not_applicable=reason))
        if progress:
            progress(cells[-1])

    if engine:
        for left in names:
            for right in names:
                for transport in transports:
                    add("engine", left, right, transport, [left, right],
                        partial(run_engine_cell, impls[left], impls[right], transport,
                                timeout))
    if dp:
        for left in names:
            for right in names:
                for transport in transports:
                    add("engine-dp", left, right, transport, [left, right],
                        partial(run_dp_cell, impls[left], impls[right], transport, timeout))
        for name, (needs, run) in (_TOPOLOGY_CELLS.items() if coordinated_dp else ()):
            if needs <= set(names):
                add("engine-dp-coordinated", name, "+".join(sorted(needs)), "ipc",
                    sorted(needs), partial(run, timeout))
    if ring:
        for left in names:
            for right in names:
                add("ring", left, right, "shm", [left, right],
                    partial(run_ring_cell, impls[left], impls[right], timeout))
    if api_server and "vllm" in impls:
        for right in names:
            add("api-server", "vllm", right, "ipc" if right == "vllm" else "tcp", ["vllm", right],
                partial(run_api_server_cell, impls[right], timeout))
    return cells


# --- rendering -------------------------------------------------------------------------------


def _status_text(cell: Cell) -> str:
    if cell.not_applicable is not None:
        return f"not applicable: {cell.not_applicable}"
    failure = cell.first_failure
    if failure is None:
        return "passed"
    text = f"FAILED at {failure.name}: {failure.detail}"
    if cell.deviation is not None:
        d = cell.deviation
        text = (f"deviation at {failure.name} ({failure.clause}): vLLM finding {d.finding}, "
                f"{d.title} ({d.link})")
    return text


def render_table(matrix: Matrix) -> str:
    rows = [("kind", "front end / writer", "engine / readers", "transport", "result")]
    for cell in matrix.cells:
        rows.append((cell.kind, cell.left, cell.right, cell.transport, _status_text(cell)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(value.ljust(widths[i]) if i < 4 else value
                       for i, value in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    for name, why in matrix.unavailable.items():
        lines.append(f"{name}: not run ({why})")
    counts = {s: sum(c.status == s for c in matrix.cells)
              for s in ("passed", "deviation", "failed", "not applicable")}
    lines.append(f"{counts['passed']} passed, {counts['deviation']} documented deviations, "
                 f"{counts['failed']} failed"
                 + (f", {counts['not applicable']} not applicable"
                    if counts["not applicable"] else "")
                 + (f", {len(matrix.unavailable)} unavailable" if matrix.unavailable else ""))
    return "\n".join(lines)


def render_html(matrix: Matrix) -> str:
    colours = {"passed": "#c8f7c5", "deviation": "#fff3b0", "failed": "#f7c5c5",
               "not applicable": "#e0e0e0"}
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>enginewire interop"
             "</title><style>td,th{border:1px solid #999;padding:4px 8px;vertical-align:top}"
             "table{border-collapse:collapse;margin-bottom:1em}</style></head><body>",
             "<h1>enginewire interop</h1>"]
    for kind, title, right in (
            ("engine", "Front end (rows) x engine core (columns)", "engine"),
            ("engine-dp", f"Front end (rows) x {DP_SIZE} engine cores, data parallel "
                          "(columns)", "engines"),
            ("engine-dp-coordinated", "vLLM's coordinated data parallel (front end, DP "
                                      "coordinator, engine cores)", "engines"),
            ("ring", "Ring writer (rows) x readers (columns)", "readers"),
            ("api-server", "vLLM API server (rows) x engine core (columns)", "engine")):
        cells = [c for c in matrix.cells if c.kind == kind]
        if not cells:
            continue
        columns = sorted({(c.right, c.transport) for c in cells})
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr><th></th>")
        parts += [f"<th>{html.escape(r)} {right} ({html.escape(t)})</th>" for r, t in columns]
        parts.append("</tr>")
        for left in sorted({c.left for c in cells}):
            parts.append(f"<tr><th>{html.escape(left)}</th>")
            for r, t in columns:
                cell = next((c for c in cells if (c.left, c.right, c.transport) == (left, r, t)),
                            None)
                if cell is None:
                    parts.append("<td></td>")
                    continue
                text = html.escape(_status_text(cell))
                if cell.deviation is not None:
                    text += (f" <a href='{html.escape(cell.deviation.link)}'>finding "
                             f"{cell.deviation.finding}</a>")
                parts.append(f"<td style='background:{colours[cell.status]}'>{text}</td>")
            parts.append("</tr>")
        parts.append("</table>")
    for name, why in matrix.unavailable.items():
        parts.append(f"<p>{html.escape(name)}: not run ({html.escape(why)})</p>")
    parts.append("</body></html>")
    return "".join(parts)


# --- command ---------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(IMPLEMENTATIONS)}, got {text!r}")
    return list(dict.fromkeys(names))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "interop",
        help="run every implementation against every other (the interop matrix)",
        description=(
            "Pair every front end with every engine core (over ipc and tcp), every ring "
            "writer with every implementation's readers, and vLLM's API server (vllm serve) "
            "with every engine core, one scripted exchange per pair, and print the matrix. "
            "Exit 0 when every cell passed or failed only where a "
            "documented vLLM deviation says it must, 1 otherwise."
        ),
    )
    parser.add_argument("--peers", type=_names, default=list(PEERS), metavar="A,B",
                        help=f"implementations to pair (default: {','.join(PEERS)})")
    parser.add_argument("--transport", action="append", choices=TRANSPORTS, default=[],
                        help="run engine cells over this transport only; may repeat")
    parser.add_argument("--only", choices=("engine", "dp", "ring", "api-server"), default=None,
                        help="run only the engine cells, only the data-parallel engine "
                             "cells, only the ring cells, or only the API server cells "
                             "(vLLM's `vllm serve` x each engine core)")
    parser.add_argument("--no-dp", action="store_true",
                        help="leave out the data-parallel engine cells")
    parser.add_argument("--json", metavar="PATH", type=writable_file,
                        help="write the matrix as JSON here")
    parser.add_argument("--html", metavar="PATH", type=writable_file,
                        help="write the matrix as a self-contained HTML page here")
    parser.add_argument("--timeout-scale", type=positive_float, default=1.0, metavar="X",
                        help="multiply every wait's time limit by X (slow machines)")
    parser.add_argument("--version", default=None, metavar="X",
                        help="vLLM release the reference front end and engines speak "
                             "(default: the spec's reference version); cells that need the "
                             "installed vLLM, or that release X lacks, are not applicable "
                             "with the reason")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    timeout = STEP_TIMEOUT * args.timeout_scale
    transports = args.transport or list(TRANSPORTS)
    # vLLM logs every engine start at INFO on stdout, around the table; its errors still show.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    def progress(cell: Cell) -> None:
        print(f"{cell.kind} {cell.left} x {cell.right} ({cell.transport}): "
              f"{_status_text(cell)}", file=sys.stderr, flush=True)

    version = args.version
    if version is not None:
        from enginewire.spec import load
        from enginewire.spec.loader import UnknownVersionError

        try:
            load(version)
        except UnknownVersionError as exc:
            print(f"enginewire interop: {exc}", file=sys.stderr)
            return 2
    with implementations(args.peers, version=version) as (impls, unavailable):
        cells = run_matrix(impls, transports=transports, ring=args.only in (None, "ring"),
                           engine=args.only in (None, "engine"), timeout=timeout,
                           progress=progress,
                           dp=args.only in (None, "dp") and not args.no_dp,
                           api_server=args.only in (None, "api-server"))
    matrix = Matrix(cells, args.peers, unavailable, version)
    if args.json:
        Path(args.json).write_text(json.dumps(matrix.to_builtins(), indent=2) + "\n")
    if args.html:
        Path(args.html).write_text(render_html(matrix))
    print(render_table(matrix))
    return 0 if matrix.ok else 1
