#!/usr/bin/env bash
# Device check + decode speed of the CUDA backend on a machine with a CUDA device (no MLIR
# needed): runs every bundle under $BUNDLES (default .cache/cuda_bundles: generated here by
# `python bench/cuda_bundle.py`, then carried to the machine; never committed).
#   bench/cuda_check.sh [OUT_JSON] [BENCH_STEPS]
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp}/cuda_check.json}"
n="${2:-200}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
bundles="${BUNDLES:-.cache/cuda_bundles}"
[ -d "$bundles" ] || { echo "cuda_check: no $bundles: run python bench/cuda_bundle.py first" >&2; exit 2; }
python3 poot/backends/cuda/devcheck.py "$bundles"/*/ --bench "$n" --json "$out"
