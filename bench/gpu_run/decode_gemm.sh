#!/usr/bin/env bash
# The decode GEMM (poot/backends/gpu/strategies/gemm_decode.py) on the GPU machine, one call:
#   here: PYTHONPATH=. python bench/gpu_run/gemm_decode_check.py --build .cache/gpu/gemm_decode
#         python bench/gpu_run/decode_gemm_build.py                  (-> .cache/gpu/decode_gemm)
#   there, carrying both:  bash bench/gpu_run/decode_gemm.sh [check] [llama1b] [smollm2]
# check:   gemm_decode_check.py (every format at M 3..128 against the error bound, the tiny
#          Llama's prefill against the oracle, per-shape us: decode GEMM / tiled GEMM / torch)
# llama1b, smollm2: batched_vs_baseline.py (poot bench --batch $DECODE_BATCHES --profile, then
#          ../shared/bench/batched_baseline.py at the same B; ratios), random weights (bf16 /
#          Q4_1); with --profile each B's decode step per dispatch (us, bytes, % of bandwidth).
# Results in $OUT (check.json, bench_<model>.json, logs/).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/decode_gemm}"
mkdir -p "$OUT/logs"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=python3
T0=$(date +%s)
. bench/gpu_run/step.sh
BATCHES="${DECODE_BATCHES:-1,8,32,64,128}"
E=.cache/gpu/decode_gemm
if [ -d "$E/cache" ] && [ ! -d /tmp/decode_gemm_cache ]; then cp -r "$E/cache" /tmp/decode_gemm_cache; fi
export POOT_CACHE_DIR=/tmp/decode_gemm_cache
WHAT=("$@")
[ ${#WHAT[@]} -eq 0 ] && WHAT=(check llama1b smollm2)
for what in "${WHAT[@]}"; do
  case "$what" in
    check) step_log check 240 $PY bench/gpu_run/gemm_decode_check.py --check .cache/gpu/gemm_decode \
             --json "$OUT/check.json" ;;
    llama1b|smollm2)
      if [ "$what" = llama1b ]; then cfg=llama-3.2-1b dt=bf16; else cfg=smollm2-135m dt=q4_1; fi
      step_log "bench_$what" 560 $PY bench/gpu_run/batched_vs_baseline.py "$OUT/bench_$what.json" \
        --shape "$cfg" -- --backend cuda --config "bench/shapes/$cfg.json" --random-weights \
        --dtype "$dt" --kv-capacity 512 --max-batch 128 --batch "$BATCHES" --num-prompts 64 \
        --max-tokens 128 --prompt-tokens 32 --runs 1 --profile ;;
    *) echo "usage: decode_gemm.sh [check] [llama1b] [smollm2]" >&2; exit 2 ;;
  esac
done
echo "decode_gemm: done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
