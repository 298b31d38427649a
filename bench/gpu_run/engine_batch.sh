#!/usr/bin/env bash
# The serving engine on CUDA: batched decode throughput (poot bench --batch) against the batched
# gpt-fast-style baseline, and the engine's correctness under staggered arrivals. Built here by
#   python bench/gpu_run/engine_batch_build.py   -> .cache/gpu/engine, .cache/gpu/gguf0..2
#
#   calls 1-3, carry [".cache/gpu/gguf<i>"]:  bash bench/gpu_run/stage_gguf.sh
#   call 4,    carry [".cache/gpu/engine"]:   bash bench/gpu_run/engine_batch.sh smollm2
#   call 5,    carry [".cache/gpu/engine"]:   bash bench/gpu_run/engine_batch.sh llama1b
#
# smollm2: engine_check.json (32 staggered prompts on CUDA equal each alone; reference tokens),
#          bench_smollm2.json (batched_vs_baseline.py: poot bench --batch 1,8,32,64,128 under
#          "poot", then the baseline of record, ../shared/bench/batched_baseline.py, at each B
#          under "shared", ratios under "ratio"; skipped with the reason when the shared
#          script is absent). llama1b: bench_llama1b.json (the same, Llama-3.2-1B shape,
#          random bf16 weights). Every step has a time limit; failures are recorded.
# ENGINE_BATCHES (default 1,8,32,64,128), ENGINE_SKIP_CHECK=1; ENGINE_BASELINE=both also runs
# the in-repo baseline_torch.py (poot bench --baseline gpt-fast) to compare the two baselines.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/engine_batch}"
mkdir -p "$OUT/logs"

B=.cache/gpu/engine
[ -f "$B/manifest.json" ] || { echo "engine_batch: carry $B (bench/gpu_run/engine_batch_build.py)" >&2; exit 2; }
GGUF=/tmp/gguf/smollm2.gguf
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d /tmp/engine_cache ] || cp -r "$B/cache" /tmp/engine_cache
export POOT_CACHE_DIR=/tmp/engine_cache
PY=python3
CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['cap'])")
MB=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['max_batch'])")
T0=$(date +%s)
. bench/gpu_run/step.sh
BATCHES="${ENGINE_BATCHES:-1,8,32,64,128}"
BASE=""
[ "${ENGINE_BASELINE:-}" = "both" ] && BASE="--baseline gpt-fast"
SIDE="bench/gpu_run/batched_vs_baseline.py"

if [ "${1:-}" = "smollm2" ]; then
    [ -f "$GGUF" ] || { echo "engine_batch: $GGUF is missing: stage_gguf.sh first" >&2; exit 2; }
    [ -n "${ENGINE_SKIP_CHECK:-}" ] || step_log engine_check 150 $PY bench/gpu_run/engine_check.py "$OUT/engine_check.json" \
        --backend cuda --model "$GGUF" --ref "$B/ref" --kv-capacity "$CAP" \
        --max-batch "$MB"
    step_log engine_check8 90 $PY bench/gpu_run/engine_check.py "$OUT/engine_check8.json" \
        --backend cuda --model "$GGUF" --ref "$B/ref" --kv-capacity "$CAP" \
        --max-batch "$MB" --engine-max-batch 8
    step_log bench_smollm2 590 $PY $SIDE "$OUT/bench_smollm2.json" --shape smollm2-135m -- \
        --backend cuda --model "$GGUF" \
        --kv-capacity "$CAP" --max-batch "$MB" --batch "$BATCHES" --num-prompts 64 \
        --max-tokens 128 --prompt-tokens 32 --runs 1 $BASE
elif [ "${1:-}" = "llama1b" ]; then
    step_log bench_llama1b 590 $PY $SIDE "$OUT/bench_llama1b.json" --shape llama-3.2-1b -- \
        --backend cuda --config bench/shapes/llama-3.2-1b.json \
        --random-weights --dtype bf16 --kv-capacity "$CAP" --max-batch "$MB" \
        --batch "$BATCHES" --num-prompts 64 --max-tokens 128 --prompt-tokens 32 --runs 1 $BASE
else
    echo "usage: engine_batch.sh smollm2|llama1b" >&2; exit 2
fi
echo "engine_batch: ${1} done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
