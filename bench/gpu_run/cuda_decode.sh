#!/usr/bin/env bash
# Batch-1 decode on CUDA against a gpt-fast-style baseline, with the device checks, on the GPU
# machine. Built here first by
#   python bench/gpu_run/cuda_decode_build.py   -> .cache/gpu/decode, .cache/gpu/gguf0..2
#
#   calls 1-3, carry [".cache/gpu/gguf<i>"]:  bash bench/gpu_run/stage_gguf.sh
#   call 4,    carry [".cache/gpu/decode"]:   bash bench/gpu_run/cuda_decode.sh
# (one carry is at most 64 MiB including the tracked tree: the 98 MB GGUF takes three)
#
# Writes into $OUT:
#   device.json            GPU, driver, python/torch/cuda-bindings versions, whether mlir imports
#   devcheck_tiny.json     poot devcheck of the tiny fixtures (llama f32, llama Q4_1)
#   devcheck_smollm2.json  device check of the SmolLM2 decode+greedy-sampler program
#   smollm2_greedy.json    greedy tokens through the driver (on-device sampler) vs the reference
#   bench_smollm2.json     poot bench --baseline gpt-fast --profile: SmolLM2 Q4_1 (real GGUF)
#   bench_llama1b.json     the same, Llama-3.2-1B shape, random bf16 weights
#   bench_llama8b.json     the same, Llama-3-8B shape, random bf16 weights
#   cuda_decode.json       all of the above in one object, with "failed": [steps that failed]
#   logs/*.log             stdout+stderr of every step
# Every step runs under its own time limit (the whole stays under ~9.5 minutes) and a failing
# step is recorded in cuda_decode.json and the exit status; the steps after it still run.
# DECODE_BASELINE=none leaves the baseline out (a profiling run).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/cuda_decode}"
mkdir -p "$OUT/logs" /tmp/gguf

B=.cache/gpu/decode
[ -f "$B/manifest.json" ] || { echo "cuda_decode: $B/manifest.json is not here: carry $B (built by bench/gpu_run/cuda_decode_build.py)" >&2; exit 2; }
GGUF=/tmp/gguf/smollm2.gguf
[ -f "$GGUF" ] || { echo "cuda_decode: $GGUF is missing: run stage_gguf.sh with each .cache/gpu/gguf<i> carried first, on the same held machine" >&2; exit 2; }

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# the carried cache, copied to a writable place (a hit writes nothing, but a stale entry may
# be rewritten); poot finds its programs there without tracing (no MLIR on this machine)
rm -rf /tmp/cuda_decode_cache && cp -r "$B/cache" /tmp/cuda_decode_cache
export POOT_CACHE_DIR=/tmp/cuda_decode_cache
PY=python3
T0=$(date +%s)

. bench/gpu_run/step.sh

step_log device 30 $PY - "$OUT/device.json" <<'EOF'
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

SMOL_CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['smol_cap'])")
LLAMA_CAP=$($PY -c "import json; print(json.load(open('$B/manifest.json'))['llama_cap'])")

step_log devcheck_tiny 60 $PY -m poot.cli devcheck "$B/devcheck/llama" "$B/devcheck/llama_gguf_q4_1" \
    --json "$OUT/devcheck_tiny.json"
step_log devcheck_smollm2 90 $PY bench/gpu_run/smollm2_check.py devcheck "$B/devcheck/smollm2" "$GGUF" \
    "$OUT/devcheck_smollm2.json"
step_log greedy_smollm2 90 $PY bench/gpu_run/smollm2_check.py greedy "$GGUF" "$B/ref" \
    "$OUT/smollm2_greedy.json" --kv-capacity "$SMOL_CAP"

# The benches: poot (programs from the cache), then the gpt-fast-style baseline in the same
# process (DECODE_BASELINE=none leaves it out: a profiling run). Token counts shrink with the model
# so the whole fits the device time.
BASE="--baseline ${DECODE_BASELINE:-gpt-fast}"
[ "${DECODE_BASELINE:-}" = "none" ] && BASE=""
step_log bench_smollm2 120 $PY -m poot.cli bench --backend cuda --model "$GGUF" \
    --kv-capacity "$SMOL_CAP" --prompt-tokens 32 --tokens 128 --runs 3 \
    $BASE --profile --out "$OUT/bench_smollm2.json"
step_log bench_llama1b 120 $PY -m poot.cli bench --backend cuda \
    --config bench/shapes/llama-3.2-1b.json --random-weights --dtype bf16 \
    --kv-capacity "$LLAMA_CAP" --prompt-tokens 32 --tokens 64 --runs 2 \
    $BASE --profile --out "$OUT/bench_llama1b.json"
step_log bench_llama8b 150 $PY -m poot.cli bench --backend cuda \
    --config bench/shapes/llama-3-8b.json --random-weights --dtype bf16 \
    --kv-capacity "$LLAMA_CAP" --prompt-tokens 32 --tokens 32 --runs 1 \
    $BASE --profile --out "$OUT/bench_llama8b.json"

# The decode-GEMV tuning sweep, when its artifacts are carried (bench/gpu_run/gemv_sweep.py)
if [ -f .cache/gpu/sweep/index.json ]; then
    step_log gemv_sweep 150 $PY bench/gpu_run/gemv_sweep.py --run .cache/gpu/sweep --out "$OUT/gemv_sweep.json"
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
json.dump(res, open(os.path.join(out, "cuda_decode.json"), "w"), indent=1, default=str)
print(json.dumps({"failed": failed, "seconds": secs, "summary": summary}, indent=1, default=str))
EOF
[ -z "$FAILED_LIST" ]
