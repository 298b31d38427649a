#!/usr/bin/env bash
# Draft-model speculative decoding on CUDA: the Llama-3.2-1B shape (random bf16 weights) with a
# SmolLM2-shape draft of its vocabulary, acceptance set by the benchmarks' hook
# (poot/engine/spec/bench_acceptance.py), measured speed-up beside the step-time model's.
#   here:  python bench/gpu_run/spec_draft_build.py        -> .cache/gpu/spec_draft
#   there: one call carrying [".cache/gpu/spec_draft"]:     bash bench/gpu_run/spec_draft.sh
# Runs bench/speculative_draft.py with the build's arguments (args.txt: batches 1 and 8, k 2 and
# 4, p 0.5/0.8/0.95) from the carried compile cache (no MLIR there) -> $OUT/spec_draft.json
# (one row per B, k, p: plain and speculative tokens/s, speedup, predicted_speedup,
# predicted_speedup_from_p, the step times, acceptance, equal), log in $OUT/logs/.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/spec_draft}"
mkdir -p "$OUT/logs"
B=.cache/gpu/spec_draft
[ -f "$B/args.txt" ] || { echo "spec_draft: carry $B (bench/gpu_run/spec_draft_build.py)" >&2; exit 2; }
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d /tmp/spec_draft_cache ] || cp -r "$B/cache" /tmp/spec_draft_cache
T0=$(date +%s)
. bench/gpu_run/step.sh
step_log spec_draft 540 python3 bench/speculative_draft.py $(cat "$B/args.txt") \
    --cache-dir /tmp/spec_draft_cache --out "$OUT/spec_draft.json"
echo "spec_draft: done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
