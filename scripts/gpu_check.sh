#!/usr/bin/env bash
# GPU readiness check (issue 16): every CUDA path of a generated benchmark in one run
# (streams, real GPU traces, --cuda-graph, --dtype, nccl, cuda:N mapping, the memory
# check, fidelity), one table, exit 1 on any FAIL, 3 without CUDA. The logic lives in
# scripts/gpu_check.py (tested by tests/test_gpu_check.py through its --dry-run).
# Usage: scripts/gpu_check.sh [WORKDIR] [--dry-run] [--big] [--only ROWS] [--budget-s S]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_check.py "$@"
