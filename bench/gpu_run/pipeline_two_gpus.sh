#!/usr/bin/env bash
# The layer pipeline on a machine with 2 GPUs (nvidia-h200-x2): what the one-GPU runs cannot show.
# Built here first:  bash bench/gpu_run/pipeline_one_gpu.sh build   -> .cache/gpu/pipeline
# then one call on nvidia-h200-x2, carry [".cache/gpu/pipeline"]:  bash bench/gpu_run/pipeline_two_gpus.sh
# (or two calls, each within the 10-minute call limit: ... small, then ... big)
#
# Out: same_tokens_{smollm2-135m,llama-3-8b}.json (one GPU vs stages on GPUs 0 and 1),
# bench_llama-3-8b_pp{1,2}.json (B = 1 decode tok/s; target pp2 >= 0.9x pp1),
# batch_llama-3-8b_pp{1,2}.json (--batch 64, two micro-batches; target pp2 >= 1.6x pp1),
# gen_llama-3-70b_pp2.jsonl and bench_llama-3-70b_pp2.json (141 GB of bf16 weights, more
# than one GPU holds: loads and generates on two; tok/s and roofline_fraction reported).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/pipeline_two_gpus}"
mkdir -p "$OUT/logs"
[ -d .cache/gpu/pipeline ] || { echo "pipeline: carry .cache/gpu/pipeline" >&2; exit 2; }
[ -d /tmp/pipeline_cache ] || cp -r .cache/gpu/pipeline /tmp/pipeline_cache
export PYTHONPATH=. PYTHONUNBUFFERED=1 POOT_CACHE_DIR=/tmp/pipeline_cache
export NCCL_NVLS_ENABLE=0      # nothing here uses NCCL or multicast; kept off regardless
PY=python3
nvidia-smi --query-gpu=index,name,memory.total --format=csv
. bench/gpu_run/step.sh
COMMON="--random-weights --dtype bf16 --backend cuda --kv-capacity 512 --max-batch 64"
PART="${1:-all}"
if [ "$PART" != big ]; then
for s in smollm2-135m llama-3-8b; do
  step same_tokens_$s.json 300 $PY bench/gpu_run/pipeline_tokens.py bench/shapes/$s.json \
      --backend cuda --stages 2 --kv-capacity 512 --max-batch 64 --max-tokens 64
  head -c 300 "$OUT/same_tokens_$s.json"; echo
done
for pp in 1 2; do
  step bench_llama-3-8b_pp$pp.json 240 $PY -m poot.cli bench \
      --config bench/shapes/llama-3-8b.json $COMMON --pipeline-parallel $pp \
      --max-tokens 128 --runs 3 --quiet
  step batch_llama-3-8b_pp$pp.json 300 $PY -m poot.cli bench \
      --config bench/shapes/llama-3-8b.json $COMMON --pipeline-parallel $pp \
      --batch 64 --num-prompts 128 --max-tokens 128 --quiet
done
fi
[ "$PART" != small ] && \
step bench_llama-3-70b_pp2.json 400 $PY -m poot.cli bench \
    --config bench/shapes/llama-3-70b.json $COMMON --pipeline-parallel 2 \
    --max-tokens 64 --runs 2 --quiet
echo "pipeline_two_gpus: done; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
