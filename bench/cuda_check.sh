#!/usr/bin/env bash
# Device check + decode speed of the CUDA backend on a machine with a CUDA device (no MLIR
# needed): runs every bundle under bench/cuda_bundles (built here by bench/cuda_bundle.py).
#   bench/cuda_check.sh [OUT_JSON] [BENCH_STEPS]
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp}/cuda_check.json}"
n="${2:-200}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
python3 poot/backends/cuda/devcheck.py bench/cuda_bundles/*/ --bench "$n" --json "$out"
