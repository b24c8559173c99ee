#!/usr/bin/env bash
# Install vLLM 0.33.0 for the CPU into the active virtual environment, for the `vllm` target,
# `enginewire spec diff --against vllm` and the interop tests.
#
# vLLM's own dependency list asks for a CUDA torch and GPU-only packages, so the wheel goes in
# with --no-deps, followed by the pinned set of pure-Python packages that its protocol modules
# (serializer, engine core client, MessageQueue) and its OpenAI-compatible API server
# (`vllm serve`) import. The pins are exact because they are the set seen working with vLLM
# 0.33.0 on a CPU-only machine; torch must already be installed (the CPU build, from the
# `test` extra).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python -c "import torch" 2>/dev/null || { echo "install torch (CPU build) first: pip install -e '.[test]'" >&2; exit 1; }
pip install --no-deps "vllm==0.33.0"
pip install --no-deps -r "$here/requirements-vllm-0.33.0-cpu.txt"
python -c "import vllm.v1.serial_utils, vllm.v1.engine.core_client, vllm.distributed.device_communicators.shm_broadcast, vllm.entrypoints.openai.api_server, vllm.entrypoints.serve.instrumentator.metrics, model_hosting_container_standards.sagemaker; print('vllm', __import__('vllm').__version__, 'importable')"
