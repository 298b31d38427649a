#!/usr/bin/env bash
# The whole decode step with a bf16 KV pool against q8_0 and fp8 ones (issue 49's GPU target), one call:
#   here:  python bench/gpu_run/kv_step_build.py                  (-> .cache/gpu/kv_step, ~5 MB)
#   there: carrying .cache/gpu/kv_step:  bash bench/gpu_run/kv_step.sh
# Each KV storage: poot bench --backend cuda on the Llama-3.2-1B shape (random bf16 weights),
# 64 sequences of 1024-token prompts decoding 1024 tokens each at batch 64 (the steady decode
# rate over contexts ~1100..2048: every sequence's prompt is in before the first ends),
# --profile (each decode step's dispatches: us, bytes, % of bandwidth) -> $OUT/kv_<dtype>.json;
# then $OUT/summary.json: decode tok/s per storage and q8_0 / bf16.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/kv_step}"
mkdir -p "$OUT/logs"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=python3
T0=$(date +%s)
. bench/gpu_run/step.sh
E=.cache/gpu/kv_step
if [ -d "$E/cache" ] && [ ! -d /tmp/kv_step_cache ]; then cp -r "$E/cache" /tmp/kv_step_cache; fi
export POOT_CACHE_DIR=/tmp/kv_step_cache
CAP=$(python3 -c "import json;print(json.load(open('$E/manifest.json'))['cap'])")
B=$(python3 -c "import json;print(json.load(open('$E/manifest.json'))['batch'])")
A="--backend cuda --config bench/shapes/llama-3.2-1b.json --random-weights --dtype bf16
   --kv-capacity $CAP --prefill-chunk 16 --max-batch $B --batch $B --num-prompts $B --prompt-tokens $(( (CAP - 64) / 2 ))
   --max-tokens $(( (CAP - 64) / 2 )) --runs 1 --profile"
for kv in ${KV_DTYPES:-bf16 q8_0 fp8}; do
  step_log "kv_$kv" 240 $PY -m poot.cli bench $A --kv-dtype "$kv" --out "$OUT/kv_$kv.json"
done
$PY - "$OUT" <<'PY' > "$OUT/summary.json"
import json, os, sys
out = sys.argv[1]
rep = {}
for kv in ("bf16", "q8_0", "fp8"):
    p = os.path.join(out, f"kv_{kv}.json")
    if os.path.exists(p):
        rep[kv] = json.load(open(p))
def tok_s(r):
    rows = list((r.get("batches") or {}).values())
    return rows[0]["decode_tokens_per_s"] if rows else r.get("decode_tokens_per_s")
s = {kv: tok_s(r) for kv, r in rep.items()}
for kv in ("q8_0", "fp8"):
    if s.get("bf16") and s.get(kv):
        s[f"{kv}_over_bf16"] = round(s[kv] / s["bf16"], 3)
print(json.dumps(s, indent=1))
PY
cat "$OUT/summary.json"
echo "kv_step: done in $(( $(date +%s) - T0 ))s; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
