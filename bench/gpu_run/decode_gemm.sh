#!/usr/bin/env bash
# The decode GEMM (poot/backends/gpu/strategies/gemm_decode.py) on the GPU machine, one call:
#   here: PYTHONPATH=. python bench/gpu_run/gemm_decode_check.py --build .cache/gpu/gemm_decode
#         python bench/gpu_run/decode_gemm_build.py                  (-> .cache/gpu/decode_gemm)
#   there: carrying .cache/gpu/gemm_decode (~33 MB):  bash bench/gpu_run/decode_gemm.sh check
#          carrying .cache/gpu/decode_gemm (~18 MB):  bash bench/gpu_run/decode_gemm.sh llama1b smollm2 shared
#   (the two folders together pass one call's 64 MiB)
# check:   gemm_decode_check.py (every format at M 3..128 against the error bound, the tiny
#          Llama's prefill against the oracle, per-shape us: decode GEMM / tiled GEMM / torch)
# llama1b, smollm2: poot bench --batch $DECODE_BATCHES --profile (random weights: bf16 / Q4_1;
#          each B's decode step per dispatch: us, bytes, % of bandwidth) -> poot_<model>.json
# shared:  ../shared/bench/batched_baseline.py (the baseline of record) for the models run
#          before it, at $SHARED_BATCHES -> shared.jsonl; then decode_gemm_summary.py ->
#          summary.json (tok/s per B, poot / shared, the matmuls' share of each profiled step)
# Results in $OUT (check.json, poot_<model>.json, shared.jsonl, summary.json, logs/). Default:
# check llama1b smollm2 shared (each step has its own time limit).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/decode_gemm}"
mkdir -p "$OUT/logs"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=python3
T0=$(date +%s)
. bench/gpu_run/step.sh
BATCHES="${DECODE_BATCHES:-1,8,32,64,128}"
# $DECODE_GEMM_DIR: another build (decode_gemm_build.py --name; built with POOT_CUDA_WGMMA=0
# it must run with POOT_CUDA_WGMMA=0 too: the setting is part of the cache keys)
E="${DECODE_GEMM_DIR:-.cache/gpu/decode_gemm}"
C=/tmp/$(basename "$E")_cache
if [ -d "$E/cache" ] && [ ! -d "$C" ]; then cp -r "$E/cache" "$C"; fi
export POOT_CACHE_DIR="$C"
[ -d "$E/pylib" ] && export PYTHONPATH="$PYTHONPATH:$PWD/$E/pylib"     # gguf (random Q4_1)
SHARED=$E/shared_bench/batched_baseline.py
[ -f "$SHARED" ] || SHARED=shared/bench/batched_baseline.py
[ -f "$SHARED" ] || SHARED=../shared/bench/batched_baseline.py
A="--kv-capacity 512 --max-batch 128 --batch $BATCHES --num-prompts 64 --max-tokens 128 --prompt-tokens 32 --runs 1 --profile"
WHAT=("$@")
[ ${#WHAT[@]} -eq 0 ] && WHAT=(check llama1b smollm2 shared)
RAN=""
for what in "${WHAT[@]}"; do
  case "$what" in
    check) step_log check 240 $PY bench/gpu_run/gemm_decode_check.py --check .cache/gpu/gemm_decode \
             --json "$OUT/check.json" ;;
    llama1b) RAN="$RAN,llama-3.2-1b"
      step_log poot_llama1b 240 $PY -m poot.cli bench --backend cuda --config bench/shapes/llama-3.2-1b.json \
        --random-weights --dtype bf16 $A --out "$OUT/poot_llama1b.json" ;;
    smollm2) RAN="$RAN,smollm2-135m"
      step_log poot_smollm2 150 $PY -m poot.cli bench --backend cuda --config bench/shapes/smollm2-135m.json \
        --random-weights --dtype q4_1 $A --out "$OUT/poot_smollm2.json" ;;
    shared) step shared.jsonl 300 $PY "$SHARED" "${RAN#,}" "${SHARED_BATCHES:-8,32,64,128}"
      $PY bench/gpu_run/decode_gemm_summary.py "$OUT" > "$OUT/summary.json"; cat "$OUT/summary.json" ;;
    *) echo "usage: decode_gemm.sh [check] [llama1b] [smollm2] [shared]" >&2; exit 2 ;;
  esac
done
echo "decode_gemm: done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
