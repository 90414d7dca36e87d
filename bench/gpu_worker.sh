#!/usr/bin/env bash
# GPU check of the worker: on a CUDA machine with the project installed with the gpu
# extra (`make install ENGINE_EXTRA=gpu`, or pip install -e '.[gpu]'), run the vLLM engine on
# the GPU and audit its rollouts with the CPU validator. One short script; prints one JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export VLLM_HOST_IP=127.0.0.1
timeout 540 "$PY" -m bench.gpu_worker
