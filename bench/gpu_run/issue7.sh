#!/usr/bin/env bash
# Issue 7 numbers on the GPU machine, in two device calls (built here first by
#   python bench/gpu_run/issue7_build.py        -> .i7a/ .i7b/  (ignored folders; see README)
#
#   call 1, carry [".i7a"]:   bash bench/gpu_run/issue7.sh stage
#   call 2, carry [".i7c"]:   bash bench/gpu_run/issue7.sh stage
#   call 3, carry [".i7b"]:   bash bench/gpu_run/issue7.sh
# (one carry is at most 64 MiB including the tracked tree, ~11 MB: the 98 MB GGUF takes two)
#
# Call 1 copies the first part of the SmolLM2 GGUF to /tmp/i7 (a carried path does not survive
# into the next call; /tmp does while the machine stays held). Call 2 writes into $OUT:
#   device.json            GPU, driver, python/torch/cuda-bindings versions, whether mlir imports
#   devcheck_tiny.json     poot devcheck of the tiny fixtures (llama f32, llama Q4_1)
#   devcheck_smollm2.json  device check of the SmolLM2 decode+greedy-sampler program
#   smollm2_greedy.json    greedy tokens through the driver (on-device sampler) vs the reference
#   bench_smollm2.json     poot bench --baseline gpt-fast --profile: SmolLM2 Q4_1 (real GGUF)
#   bench_llama1b.json     the same, Llama-3.2-1B shape, random bf16 weights
#   bench_llama8b.json     the same, Llama-3-8B shape, random bf16 weights
#   issue7.json            all of the above in one object, with "failed": [steps that failed]
#   logs/*.log             stdout+stderr of every step
# Every step runs under its own time limit (the whole stays under ~9.5 minutes) and a failing
# step is recorded in issue7.json and the exit status; the steps after it still run.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/i7out}"
mkdir -p "$OUT/logs" /tmp/i7

if [ "${1:-}" = "stage" ]; then     # calls 1 and 2: one GGUF part each (.i7a, then .i7c)
    n=0
    for p in .i7a/smollm2.part0 .i7c/smollm2.part1; do
        [ -f "$p" ] && cp "$p" /tmp/i7/ && n=$((n + 1))
    done
    [ $n -gt 0 ] || { echo "issue7: no GGUF part here: carry .i7a (call 1) or .i7c (call 2)" >&2; exit 2; }
    ls -la /tmp/i7 && nvidia-smi -L
    exit $?
fi

B=.i7b
[ -f "$B/manifest.json" ] || { echo "issue7: $B/manifest.json is not here: carry .i7b (built by bench/gpu_run/issue7_build.py)" >&2; exit 2; }
for p in part0 part1; do
    [ -f /tmp/i7/smollm2.$p ] || { echo "issue7: /tmp/i7/smollm2.$p is missing: run 'issue7.sh stage' with .i7a, then with .i7c carried first, on the same held machine" >&2; exit 2; }
done

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# the carried cache, copied to a writable place (a hit writes nothing, but a stale entry may
# be rewritten); poot finds its programs there without tracing (no MLIR on this machine)
rm -rf /tmp/i7/cache && cp -r "$B/cache" /tmp/i7/cache
export POOT_CACHE_DIR=/tmp/i7/cache
PY=python3
FAILED=()
T0=$(date +%s)

step() {  # step NAME SECONDS CMD...: run with a time limit, log, record failure
    local name=$1 limit=$2; shift 2
    local t=$(date +%s)
    echo "== $name (limit ${limit}s, at $((t - T0))s)" >&2
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    tail -n 5 "$OUT/logs/$name.log" >&2
    if [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && echo "issue7: $name ran past ${limit}s" >&2
        echo "issue7: $name FAILED (exit $rc, log $OUT/logs/$name.log)" >&2
        FAILED+=("$name:$rc")
    fi
    echo "   $name: exit $rc in $(( $(date +%s) - t ))s" >&2
}

step device 30 $PY - "$OUT/device.json" <<'EOF'
import json, subprocess, sys, platform
info = {"python": platform.python_version()}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except OSError as e:
    info["nvidia_smi"] = str(e)
for m in ("torch", "numpy", "cuda.bindings", "ml_dtypes", "tokenizers", "mlir"):
    try:
        mod = __import__(m, fromlist=["_"])
        info[m] = getattr(mod, "__version__", "importable")
    except Exception as e:
        info[m] = f"not importable: {type(e).__name__}"
from poot.backends.cuda.runtime import device_available
info["cuda_device"] = device_available()
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
sys.exit(0 if info["cuda_device"][0] else 1)
EOF

step assemble 60 bash -c "cat /tmp/i7/smollm2.part0 /tmp/i7/smollm2.part1 > /tmp/i7/smollm2.gguf && \
  $PY -c \"import hashlib,json,sys; m=json.load(open('$B/manifest.json'))['smollm2']; \
h=hashlib.sha256(open('/tmp/i7/smollm2.gguf','rb').read()).hexdigest(); \
print(h); sys.exit(0 if h==m['sha256'] else 'issue7: the reassembled GGUF does not match its sha256 (parts from different builds?)')\""
GGUF=/tmp/i7/smollm2.gguf
SMOL_CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['smol_cap'])")
LLAMA_CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['llama_cap'])")

step devcheck_tiny 60 $PY -m poot.cli devcheck "$B/devcheck/llama" "$B/devcheck/llama_gguf_q4_1" \
    --json "$OUT/devcheck_tiny.json"
step devcheck_smollm2 90 $PY bench/gpu_run/smollm2_check.py devcheck "$B/devcheck/smollm2" "$GGUF" \
    "$OUT/devcheck_smollm2.json"
step greedy_smollm2 90 $PY bench/gpu_run/smollm2_check.py greedy "$GGUF" "$B/ref" \
    "$OUT/smollm2_greedy.json" --kv-capacity "$SMOL_CAP"

# The benches: poot (programs from the cache), then the gpt-fast-style baseline in the same
# process (I7_BASELINE=none leaves it out: a profiling run). Token counts shrink with the model
# so the whole fits the device time.
BASE="--baseline ${I7_BASELINE:-gpt-fast}"
[ "${I7_BASELINE:-}" = "none" ] && BASE=""
step bench_smollm2 120 $PY -m poot.cli bench --backend cuda --model "$GGUF" \
    --kv-capacity "$SMOL_CAP" --prompt-tokens 32 --tokens 128 --runs 3 \
    $BASE --profile --out "$OUT/bench_smollm2.json"
step bench_llama1b 120 $PY -m poot.cli bench --backend cuda \
    --config bench/shapes/llama-3.2-1b.json --random-weights --dtype bf16 \
    --kv-capacity "$LLAMA_CAP" --prompt-tokens 32 --tokens 64 --runs 2 \
    $BASE --profile --out "$OUT/bench_llama1b.json"
step bench_llama8b 150 $PY -m poot.cli bench --backend cuda \
    --config bench/shapes/llama-3-8b.json --random-weights --dtype bf16 \
    --kv-capacity "$LLAMA_CAP" --prompt-tokens 32 --tokens 32 --runs 1 \
    $BASE --profile --out "$OUT/bench_llama8b.json"

# The decode-GEMV tuning sweep, when its artifacts are carried (bench/gpu_run/gemv_sweep.py)
if [ -f .sweep/index.json ]; then
    step gemv_sweep 150 $PY bench/gpu_run/gemv_sweep.py --run .sweep --out "$OUT/gemv_sweep.json"
fi

FAILED_LIST="${FAILED[*]:-}"
$PY - "$OUT" "$B/manifest.json" "$FAILED_LIST" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, os, sys
out, manifest, failed, secs = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4])
res = {"failed": failed, "seconds": secs, "manifest": json.load(open(manifest))}
for name in ("device", "devcheck_tiny", "devcheck_smollm2", "smollm2_greedy", "bench_smollm2",
             "bench_llama1b", "bench_llama8b"):
    p = os.path.join(out, name + ".json")
    try:
        res[name] = json.load(open(p))
    except (OSError, ValueError) as e:
        res[name] = {"missing": f"{p}: {e}"}
summary = {}
for name in ("bench_smollm2", "bench_llama1b", "bench_llama8b"):
    b = res[name]
    if "poot" in b:
        keep = ("decode_tokens_per_s", "us_per_token", "replay_us_per_step", "dispatches_per_token",
                "bytes_per_token", "roofline_fraction")
        summary[name] = {"poot": {k: b["poot"].get(k) for k in keep},
                         "baseline": {k: b.get("baseline", {}).get(k) for k in keep},
                         "ratio": b.get("ratio")}
res["summary"] = summary
json.dump(res, open(os.path.join(out, "issue7.json"), "w"), indent=1, default=str)
print(json.dumps({"failed": failed, "seconds": secs, "summary": summary}, indent=1, default=str))
EOF
[ -z "$FAILED_LIST" ]
