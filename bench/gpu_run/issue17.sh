#!/usr/bin/env bash
# Issue 17 (guided decoding) on the GPU machine. Built here first by
#   python bench/gpu_run/issue15_build.py  (only its .i15a/.i15c: the GGUF halves)
#   python bench/gpu_run/issue17_build.py  -> .i17b/
#
#   call 1, carry [".i15a"]:  bash bench/gpu_run/issue15.sh stage
#   call 2, carry [".i15c"]:  bash bench/gpu_run/issue15.sh stage
#   call 3, carry [".i17b"]:  bash bench/gpu_run/issue17.sh
#
# guided_check.json: 46 schema-constrained SmolLM2 outputs on CUDA validated with jsonschema,
# the greedy ones compared with the CPU's tokens; bench_guided.json: decode tok/s with vs
# without a constraint at B = 1 and 32, and the host cost of the masks.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/i17out}"
mkdir -p "$OUT/logs"
B=.i17b
[ -f "$B/manifest.json" ] || { echo "issue17: carry .i17b" >&2; exit 2; }
if [ ! -f /tmp/i15/smollm2.gguf ]; then
    cat /tmp/i15/smollm2.part0 /tmp/i15/smollm2.part1 > /tmp/i15/smollm2.gguf || exit 2
fi
PY=python3
for w in $B/wheels/*.whl; do   # rpds-py comes for several Pythons: this one's installs
    $PY -m pip install -q --no-index --no-deps --target /tmp/i17site "$w" 2>/dev/null || true
done
export PYTHONPATH=.:/tmp/i17site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d /tmp/i17cache ] || cp -r "$B/cache" /tmp/i17cache
export POOT_CACHE_DIR=/tmp/i17cache
$PY -c "import llguidance, jsonschema; print('llguidance', llguidance.__version__ if hasattr(llguidance, '__version__') else '?')"
FAILED=()
step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2; shift 2
    local t=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    tail -n 6 "$OUT/logs/$name.log" >&2
    [ $rc -ne 0 ] && FAILED+=("$name:$rc")
    echo "   $name: exit $rc in $(( $(date +%s) - t ))s" >&2
}
step guided_check 150 $PY bench/gpu_run/guided_check.py "$OUT/guided_check.json" \
    --backend cuda --model /tmp/i15/smollm2.gguf --expected "$B/expected.json"
step bench_guided 200 $PY bench/guided/bench_guided.py --backend cuda \
    --model /tmp/i15/smollm2.gguf --batch 1,32 --max-tokens 128 --runs 5 \
    --out "$OUT/bench_guided.json"
echo "issue17: done; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
