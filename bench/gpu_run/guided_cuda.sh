#!/usr/bin/env bash
# Guided decoding on CUDA on the GPU machine. Built here first by
#   python bench/gpu_run/guided_cuda_build.py   -> .cache/gpu/guided, .cache/gpu/gguf0..2
#
#   calls 1-3, carry [".cache/gpu/gguf<i>"]:  bash bench/gpu_run/stage_gguf.sh
#   call 4,    carry [".cache/gpu/guided"]:   bash bench/gpu_run/guided_cuda.sh
#
# guided_check.json: 46 schema-constrained SmolLM2 outputs on CUDA validated with jsonschema,
# the greedy ones compared with the CPU's tokens; bench_guided.json: decode tok/s with vs
# without a constraint at B = 1 and 32, and the host cost of the masks.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/guided_cuda}"
mkdir -p "$OUT/logs"
B=.cache/gpu/guided
[ -f "$B/manifest.json" ] || { echo "guided_cuda: carry $B" >&2; exit 2; }
GGUF=/tmp/gguf/smollm2.gguf
[ -f "$GGUF" ] || { echo "guided_cuda: $GGUF is missing: stage_gguf.sh first" >&2; exit 2; }
PY=python3
for w in $B/wheels/*.whl; do   # rpds-py comes for several Pythons: this one's installs
    $PY -m pip install -q --no-index --no-deps --target /tmp/guided_site "$w" 2>/dev/null || true
done
export PYTHONPATH=.:/tmp/guided_site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d /tmp/guided_cache ] || cp -r "$B/cache" /tmp/guided_cache
export POOT_CACHE_DIR=/tmp/guided_cache
$PY -c "import llguidance, jsonschema; print('llguidance', llguidance.__version__ if hasattr(llguidance, '__version__') else '?')"
. bench/gpu_run/step.sh
step_log guided_check 150 $PY bench/gpu_run/guided_check.py "$OUT/guided_check.json" \
    --backend cuda --model "$GGUF" --expected "$B/expected.json"
step_log bench_guided 200 $PY bench/guided/bench_guided.py --backend cuda \
    --model "$GGUF" --batch 1,32 --max-tokens 128 --runs 5 \
    --out "$OUT/bench_guided.json"
echo "guided_cuda: done; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
