#!/usr/bin/env bash
# Run mypy over every enginewire package (configuration: pyproject.toml [tool.mypy]).
#
# The packages live in top-level folders mapped to enginewire.* by setuptools' package-dir,
# and the editable install finds them through an import hook that mypy does not follow. So
# this script lays out build/typecheck/enginewire/ as symbolic links to the real folders and
# runs mypy there: error paths read enginewire/<package>/..., i.e. the folder of that name at
# the repository root (enginewire/spec/x.py is spec/x.py).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$(command -v python)}"
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
TREE="$ROOT/build/typecheck"
rm -rf "$TREE/enginewire"
mkdir -p "$TREE/enginewire"
for file in "$ROOT"/enginewire/*.py; do
    ln -s "$file" "$TREE/enginewire/"
done
for package in spec reference conformance fuzz bench tap; do
    ln -s "$ROOT/$package" "$TREE/enginewire/$package"
done
cd "$TREE"
exec "$PYTHON" -m mypy --config-file "$ROOT/pyproject.toml" --cache-dir "$TREE/.mypy_cache" \
    -p enginewire "$@"
