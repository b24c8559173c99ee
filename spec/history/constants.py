"""The tables of ``spec/data/history/constants.toml`` (request types, extension codes, tensor
threshold and form, ring constants, handshake keys, ready response) as they stand at one
release: :func:`constants_at`; :func:`constant_rows` gives a table's rows.

Imports nothing of the spec but :mod:`..versions`, so that the loader reads the tables
(a release's tensors surface) without an import cycle.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..versions import VersionRange

#: The package's spec data directory (``enginewire.spec.loader.DATA_DIR``).
_DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def constant_rows(table: str, data_dir: Path | None = None
                  ) -> list[tuple[VersionRange, dict[str, Any]]]:
    """Every row of one table of ``history/constants.toml``, newest range first: its range
    and its values (a fresh dict per call); [] where the file or the table is missing."""
    path = (data_dir or _DATA_DIR) / "history" / "constants.toml"
    try:
        status = path.stat()
    except OSError:
        return []
    tables = _parsed(str(path), status.st_mtime_ns, status.st_size)
    return [(rng, dict(values)) for rng, values in tables.get(table, ())]


@lru_cache(maxsize=8)
def _parsed(path: str, _mtime_ns: int, _size: int
            ) -> dict[str, tuple[tuple[VersionRange, dict[str, Any]], ...]]:
    """The tables of the constants file at ``path``, parsed once per modification time and
    size (loading every release reads them hundreds of times)."""
    with open(path, "rb") as handle:
        raw = tomllib.load(handle)
    return {name: tuple((VersionRange.parse(r["versions"]), dict(r["values"])) for r in rows)
            for name, rows in raw.items() if isinstance(rows, list)}


def constants_at(version: str, table: str, data_dir: Path | None = None) -> dict[str, Any]:
    """One table of ``history/constants.toml`` (``request_types``, ``ext_codes``, ...) as it
    stands at ``version``; {} where the file or the table is missing."""
    return next((values for versions, values in constant_rows(table, data_dir)
                 if version in versions), {})
