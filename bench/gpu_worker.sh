#!/usr/bin/env bash
# GPU checks of the worker: on a CUDA machine with the project installed with the gpu
# extra (`make install ENGINE_EXTRA=gpu`, or pip install -e '.[gpu]'):
#   1. the vLLM engine on the GPU, its rollouts audited by the CPU validator (bench/gpu_worker.py);
#   2. the architecture-matrix tests (tests/integration/architectures/ and any test_*matrix*.py);
#   3. bench/model_scale.py in bf16 on CUDA: the Qwen3-0.6B-shaped model through vLLM (GPU), the HF
#      engine and the validator, audited with the kept bf16 calibrations (toploc/calibration/);
#      TOPLOC_THRESHOLDS may name a JSON of [toploc] fields to set over them.
# Each prints its own output; the JSON objects of 1 and 3 are also kept under $OUT (default gpu-results/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export VLLM_HOST_IP=127.0.0.1

timeout 540 "$PY" -m bench.gpu_worker | tee "$OUT/gpu_worker.json"

mapfile -t matrix < <(find tests -name 'test_*matrix*.py' -o -path '*/architectures/test_*.py' | sort)
if [ "${#matrix[@]}" -gt 0 ]; then
    timeout 1200 "$PY" -m pytest -q "${matrix[@]}"
else
    echo "no architecture-matrix tests found under tests/" >&2
    exit 1
fi

toploc_args=()
if [ -n "${TOPLOC_THRESHOLDS:-}" ]; then
    toploc_args=(--toploc "$TOPLOC_THRESHOLDS")
fi
timeout 1800 "$PY" -m bench.model_scale --dtype bfloat16 --device cuda "${toploc_args[@]}" >"$OUT/model_scale.json"
"$PY" -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" "$OUT/model_scale.json"
