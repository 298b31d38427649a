#!/usr/bin/env bash
# Issue 15 (the serving engine) on the GPU machine. Built here first by
#   python bench/gpu_run/issue15_build.py        -> .i15a/ .i15b/ .i15c/ (ignored folders)
#
#   call 1, carry [".i15a"]:  bash bench/gpu_run/issue15.sh stage
#   call 2, carry [".i15c"]:  bash bench/gpu_run/issue15.sh stage
#   call 3, carry [".i15b"]:  bash bench/gpu_run/issue15.sh smollm2
#   call 4, carry [".i15b"]:  bash bench/gpu_run/issue15.sh llama1b
#
# smollm2: engine_check.json (32 staggered prompts on CUDA equal each alone; reference tokens),
#          bench_smollm2.json (poot bench --batch 1,8,32,64,128 with the batched gpt-fast
#          baseline at each B). llama1b: bench_llama1b.json (the same, Llama-3.2-1B shape,
#          random bf16 weights). Every step has a time limit; failures are recorded.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/i15out}"
mkdir -p "$OUT/logs" /tmp/i15

if [ "${1:-}" = "stage" ]; then
    n=0
    for p in .i15a/smollm2.part0 .i15c/smollm2.part1; do
        [ -f "$p" ] && cp "$p" /tmp/i15/ && n=$((n + 1))
    done
    [ $n -gt 0 ] || { echo "issue15: no GGUF part here: carry .i15a, then .i15c" >&2; exit 2; }
    ls -la /tmp/i15 && nvidia-smi -L
    exit $?
fi

B=.i15b
[ -f "$B/manifest.json" ] || { echo "issue15: carry .i15b (bench/gpu_run/issue15_build.py)" >&2; exit 2; }
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d /tmp/i15/cache ] || cp -r "$B/cache" /tmp/i15/cache
export POOT_CACHE_DIR=/tmp/i15/cache
PY=python3
CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['cap'])")
MB=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['max_batch'])")
FAILED=()
T0=$(date +%s)
step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2; shift 2
    local t=$(date +%s)
    echo "== $name (limit ${limit}s, at $((t - T0))s)" >&2
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    tail -n 4 "$OUT/logs/$name.log" >&2
    [ $rc -ne 0 ] && FAILED+=("$name:$rc")
    echo "   $name: exit $rc in $(( $(date +%s) - t ))s" >&2
}
BATCHES="${I15_BATCHES:-1,8,32,64,128}"
BASE="--baseline gpt-fast"
[ "${I15_BASELINE:-}" = "none" ] && BASE=""

if [ "${1:-}" = "smollm2" ]; then
    if [ ! -f /tmp/i15/smollm2.gguf ]; then
        cat /tmp/i15/smollm2.part0 /tmp/i15/smollm2.part1 > /tmp/i15/smollm2.gguf
    fi
    $PY -c "import hashlib,json,sys; m=json.load(open('$B/manifest.json'))['smollm2']; \
h=hashlib.sha256(open('/tmp/i15/smollm2.gguf','rb').read()).hexdigest(); \
sys.exit(0 if h==m['sha256'] else 'issue15: the reassembled GGUF does not match')" || exit 2
    [ -n "${I15_SKIP_CHECK:-}" ] || step engine_check 150 $PY bench/gpu_run/engine_check.py "$OUT/engine_check.json" \
        --backend cuda --model /tmp/i15/smollm2.gguf --ref "$B/ref" --kv-capacity "$CAP" \
        --max-batch "$MB"
    step engine_check8 90 $PY bench/gpu_run/engine_check.py "$OUT/engine_check8.json" \
        --backend cuda --model /tmp/i15/smollm2.gguf --ref "$B/ref" --kv-capacity "$CAP" \
        --max-batch "$MB" --engine-max-batch 8
    step bench_smollm2 400 $PY -m poot.cli bench --backend cuda --model /tmp/i15/smollm2.gguf \
        --kv-capacity "$CAP" --max-batch "$MB" --batch "$BATCHES" --num-prompts 64 \
        --max-tokens 128 --prompt-tokens 32 --runs 1 $BASE --out "$OUT/bench_smollm2.json"
elif [ "${1:-}" = "llama1b" ]; then
    step bench_llama1b 500 $PY -m poot.cli bench --backend cuda --config bench/shapes/llama-3.2-1b.json \
        --random-weights --dtype bf16 --kv-capacity "$CAP" --max-batch "$MB" \
        --batch "$BATCHES" --num-prompts 64 --max-tokens 128 --prompt-tokens 32 --runs 1 $BASE \
        --out "$OUT/bench_llama1b.json"
else
    echo "usage: issue15.sh stage|smollm2|llama1b" >&2; exit 2
fi
echo "issue15: ${1} done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
