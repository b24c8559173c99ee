"""The releases the spec's history is derived from, and their wheels.

``spec/data/history/releases.toml`` lists the releases (``releases = [...]``, oldest first).
Wheels live in a cache directory outside the repository (:func:`default_wheel_dir`, or the
``ENGINEWIRE_WHEEL_DIR`` environment variable); :func:`ensure_wheels` fetches the missing ones
with ``pip download --no-deps`` and never deletes a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from ..versions import format_version, parse_version

RELEASES_FILE = Path("history") / "releases.toml"
WHEEL_DIR_ENV = "ENGINEWIRE_WHEEL_DIR"


class WheelError(RuntimeError):
    """A wheel is not in the cache and could not be downloaded."""


def default_wheel_dir() -> Path:
    """``$ENGINEWIRE_WHEEL_DIR``, else ``~/.cache/enginewire/wheels``."""
    env = os.environ.get(WHEEL_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "enginewire" / "wheels"


def read_releases(data_dir: Path) -> list[str]:
    """The releases the data in ``data_dir`` was derived from, oldest first ([] if none)."""
    path = data_dir / RELEASES_FILE
    if not path.exists():
        return []
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    return sorted(raw.get("releases", []), key=parse_version)


def read_skipped(data_dir: Path) -> dict[str, str]:
    """Releases looked at and left out of the derivation, with the reason."""
    path = data_dir / RELEASES_FILE
    if not path.exists():
        return {}
    with path.open("rb") as handle:
        return dict(tomllib.load(handle).get("skipped", {}))


def write_releases(data_dir: Path, releases: list[str], skipped: dict[str, str]) -> None:
    ordered = sorted(releases, key=parse_version)
    lines = [
        "# The vLLM releases the version ranges in structs/*.toml and history/*.toml were",
        "# derived from (`enginewire spec history`), oldest first. A version outside this list",
        "# is unknown to the spec.",
        "releases = [",
        *(f'    "{v}",' for v in ordered),
        "]",
        "",
    ]
    if skipped:
        lines.append("# Releases looked at and left out, with the reason.")
        lines.append("[skipped]")
        lines.extend(f'"{v}" = "{why}"' for v, why in sorted(
            skipped.items(), key=lambda kv: parse_version(kv[0])))
        lines.append("")
    path = data_dir / RELEASES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def normal_version(text: str) -> str:
    return format_version(parse_version(text))


def find_wheel(wheel_dir: Path, version: str) -> Path | None:
    """The cached wheel of ``version`` (the exact release, not a ``.postN``)."""
    for path in sorted(wheel_dir.glob(f"vllm-{version}-*.whl")):
        return path
    return None


def ensure_wheels(versions: list[str], wheel_dir: Path, *, offline: bool = False,
                  log: Callable[[str], object] = print) -> dict[str, Path]:
    """Each version's wheel path, downloading the missing ones unless ``offline``."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for version in versions:
        path = find_wheel(wheel_dir, version)
        if path is None and not offline:
            log(f"downloading vllm=={version} into {wheel_dir}")
            command = [sys.executable, "-m", "pip", "download", "--no-deps",
                       "--only-binary=:all:", "--quiet", "-d", str(wheel_dir),
                       f"vllm=={version}"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                                    check=False)
            if result.returncode != 0:
                raise WheelError(f"pip download vllm=={version} failed: "
                                 f"{result.stderr.strip()[-500:]}")
            path = find_wheel(wheel_dir, version)
        if path is None:
            raise WheelError(f"no wheel of vllm {version} in {wheel_dir}"
                             + (" (offline)" if offline else ""))
        found[version] = path
    return found
