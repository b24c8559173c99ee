#!/usr/bin/env bash
# Run every runnable vLLM finding reproduction (docs/vllm-findings/NNN-*.py), each in a fresh
# interpreter with a timeout, and fail if one stops reproducing or breaks. Exits 0 on vLLM
# 0.33.0. A fixed vLLM makes this fail, naming the finding to move to "fixed in"
# (docs/vllm-findings/index.md). Extra arguments go to run_all.py (--fork, --jobs N, NNN ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PYTHON" docs/vllm-findings/run_all.py "$@"
