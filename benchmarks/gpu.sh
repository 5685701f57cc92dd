#!/usr/bin/env bash
# The GPU benchmark on a CUDA machine, in one call, from a checkout (no ./dev, no network):
#
#   benchmarks/gpu.sh [gpu.py flags...]        e.g. benchmarks/gpu.sh --results-dir /tmp/out
#
# Wheels the machine lacks (msgspec, datasets, dill, multiprocess, trl), downloaded into .whl/
# where PyPI is reachable (docs/benchmarks.md, "On a GPU"), are installed into /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec python3 benchmarks/gpu.py "$@"
