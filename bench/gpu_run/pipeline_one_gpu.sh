#!/usr/bin/env bash
# The layer pipeline (pipeline parallelism) on the one-GPU machine: N pipeline stages as N CUDA contexts on
# GPU 0 (bench/gpu_run/pp_cli.py). Built here first:
#   bash bench/gpu_run/pipeline_one_gpu.sh build      -> .cache/gpu/pipeline (the CUDA compile cache)
# then one call, carry [".cache/gpu/pipeline"]:  bash bench/gpu_run/pipeline_one_gpu.sh [smollm2-135m|llama-3-8b ...]
#
# Out, per shape (random-init bf16 weights): same_tokens_{shape}.json (pipeline_tokens.py:
# greedy tokens of four prompts, one device vs two stages), bench_{shape}_pp{1,2}.json (poot bench:
# B = 1 decode tok/s) and batch_{shape}_pp{1,2}.json (poot bench --batch 64); *_shared.json:
# the two stages as two streams of one context (POOT_PP_CONTEXTS=shared).
set -u
cd "$(dirname "$0")/../.."
SHAPES="${*:-smollm2-135m llama-3-8b}"
[ "${1:-}" = build ] && SHAPES="smollm2-135m llama-3-8b"
COMMON="--random-weights --dtype bf16 --backend cuda --kv-capacity 512 --max-batch 64"
if [ "${1:-}" = build ]; then
  export POOT_CACHE_DIR="$PWD/.cache/gpu/pipeline"
  for s in $SHAPES; do
    for pp in 1 2; do
      t=$(date +%s)
      poot compile --config bench/shapes/$s.json $COMMON --pipeline-parallel $pp --quiet \
          > /dev/null || exit 1
      echo "$s pp$pp: $(( $(date +%s) - t )) s" >&2
    done
  done
  # the 2-GPU runs' model past one GPU (bench/gpu_run/pipeline_two_gpus.sh): stages only
  t=$(date +%s)
  poot compile --config bench/shapes/llama-3-70b.json $COMMON --pipeline-parallel 2 --quiet \
      > /dev/null || exit 1
  echo "llama-3-70b pp2: $(( $(date +%s) - t )) s" >&2
  du -sh .cache/gpu/pipeline
  exit 0
fi
OUT="${OUT:-/tmp/pipeline_one_gpu}"
mkdir -p "$OUT/logs"
[ -d .cache/gpu/pipeline ] || { echo "pipeline: carry .cache/gpu/pipeline" >&2; exit 2; }
[ -d /tmp/pipeline_cache ] || cp -r .cache/gpu/pipeline /tmp/pipeline_cache
export PYTHONPATH=. PYTHONUNBUFFERED=1 POOT_CACHE_DIR=/tmp/pipeline_cache
PY=python3
. bench/gpu_run/step.sh
for s in $SHAPES; do
  cfg="--config bench/shapes/$s.json $COMMON"
  step same_tokens_$s.json 300 $PY bench/gpu_run/pipeline_tokens.py bench/shapes/$s.json \
      --backend cuda --same-gpu --stages 2 --kv-capacity 512 --max-batch 64 --max-tokens 64
  head -c 300 "$OUT/same_tokens_$s.json"; echo
  for pp in 1 2 shared; do
    [ $pp = shared ] && { export POOT_PP_CONTEXTS=shared; pp=2; tag=shared; } || tag=pp$pp
    step bench_${s}_$tag.json 240 $PY bench/gpu_run/pp_cli.py bench $cfg \
        --pipeline-parallel $pp --max-tokens 128 --runs 3 --quiet
    step batch_${s}_$tag.json 300 $PY bench/gpu_run/pp_cli.py bench $cfg \
        --pipeline-parallel $pp --batch 64 --num-prompts 64 --max-tokens 64 --quiet
    unset POOT_PP_CONTEXTS
  done
done
for s in $SHAPES; do
  for ctx in own shared; do
    step profile_${s}_$ctx.json 120 $PY bench/gpu_run/pipeline_profile.py bench/shapes/$s.json \
        $([ $ctx = shared ] && echo --shared)
    cat "$OUT/profile_${s}_$ctx.json"
  done
done
echo "pipeline_one_gpu: done; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
