#!/usr/bin/env bash
# Same-machine A/B of two source trees on the GPU machine: `poot bench` of the SmolLM2 Q4_1
# step and the Llama-3.2-1B shape, each tree running its own compiled programs (its own
# .cache/gpu/decode/cache, built there by bench/gpu_run/cuda_decode_build.py), alternating
# A B, B A, A B, ...
# Why: two H200s (or one H200 across calls) differ by several percent on a latency-bound step,
# more than a code change may move it; alternating in one call on one GPU isolates the change.
#
# Here:   git worktree add .cache/gpu/abA <commit>      (under the ignored .cache/)
#         (cd .cache/gpu/abA && python bench/gpu_run/cuda_decode_build.py --shapes llama-3.2-1b --no-gguf)
#         python bench/gpu_run/cuda_decode_build.py --shapes llama-3.2-1b      (B: this tree)
# There:  stage the GGUF as for cuda_decode.sh (stage_gguf.sh, one call per .cache/gpu/gguf<i>),
#         then carry [".cache/gpu/decode", ".cache/gpu/abA"]:
#         OUT=$OUT bash bench/gpu_run/ab.sh .cache/gpu/abA
#
# Writes $OUT/ab.json: per variant and model, the replayed step time (us) and decode tok/s of
# every round, their medians, and B/A ratios of the medians. AB_ROUNDS (default 3) rounds.
set -u
cd "$(dirname "$0")/../.."
A=${1:?usage: ab.sh A_TREE (a source tree with its own .cache/gpu/decode/cache)}
OUT="${OUT:-/tmp/about}"
case "$OUT" in /*) ;; *) OUT="$(pwd)/$OUT" ;; esac     # the benches run from each tree
ROUNDS=${AB_ROUNDS:-3}
PY=python3
mkdir -p "$OUT"
for d in "$A" .; do
    [ -d "$d/.cache/gpu/decode/cache" ] || { echo "ab: $d/.cache/gpu/decode/cache is missing (cuda_decode_build.py there)" >&2; exit 2; }
done
GGUF=/tmp/gguf/smollm2.gguf
[ -f "$GGUF" ] || { echo "ab: stage the GGUF first (stage_gguf.sh, one call per .cache/gpu/gguf<i>)" >&2; exit 2; }
M=.cache/gpu/decode/manifest.json
SMOL_CAP=$($PY -c "import json; print(json.load(open('$M'))['smol_cap'])")
LLAMA_CAP=$($PY -c "import json; print(json.load(open('$M'))['llama_cap'])")
ROOT=$(pwd)

bench() {  # bench VARIANT TREE ROUND: both models with that tree's sources and cache
    local v=$1 tree=$2 r=$3
    rm -rf "/tmp/ab_cache_$v" && cp -r "$tree/.cache/gpu/decode/cache" "/tmp/ab_cache_$v"
    (cd "$tree" || exit 2
     export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} POOT_CACHE_DIR="/tmp/ab_cache_$v"
     timeout --kill-after=10 120 $PY -m poot.cli bench --backend cuda --model "$GGUF" \
        --kv-capacity "$SMOL_CAP" --prompt-tokens 32 --tokens 128 --runs 3 \
        --out "$OUT/${v}_smollm2_$r.json" > "$OUT/${v}_smollm2_$r.log" 2>&1
     timeout --kill-after=10 120 $PY -m poot.cli bench --backend cuda \
        --config "$ROOT/bench/shapes/llama-3.2-1b.json" --random-weights --dtype bf16 \
        --kv-capacity "$LLAMA_CAP" --prompt-tokens 32 --tokens 64 --runs 2 \
        --out "$OUT/${v}_llama1b_$r.json" > "$OUT/${v}_llama1b_$r.log" 2>&1)
}

for r in $(seq "$ROUNDS"); do      # A B, B A, A B, ...: neither always runs first
    if [ $((r % 2)) -eq 1 ]; then bench A "$A" "$r"; bench B . "$r"
    else bench B . "$r"; bench A "$A" "$r"; fi
done

$PY - "$OUT" "$ROUNDS" <<'EOF'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for v in "AB":
    for m in ("smollm2", "llama1b"):
        rows = []
        for r in range(1, rounds + 1):
            p = os.path.join(out, f"{v}_{m}_{r}.json")
            try:
                b = json.load(open(p))["poot"]
                rows.append({"replay_us": b["replay_us_per_step"],
                             "tok_s": b["decode_tokens_per_s"]})
            except (OSError, ValueError, KeyError) as e:
                rows.append({"error": f"{type(e).__name__}: {e}"})
        ok = [x for x in rows if "error" not in x]
        res.setdefault(m, {})[v] = {
            "rounds": rows,
            "median_replay_us": statistics.median(x["replay_us"] for x in ok) if ok else None,
            "median_tok_s": statistics.median(x["tok_s"] for x in ok) if ok else None}
for m, d in res.items():
    a, b = d["A"]["median_replay_us"], d["B"]["median_replay_us"]
    d["B_over_A_replay"] = round(b / a, 4) if a and b else None
failed = any("error" in x for d in res.values() for v in "AB" for x in d[v]["rounds"])
for f in os.listdir(out) if not failed else ():   # the per-round files go unless one failed
    if f.endswith(".log") or (f[:2] in ("A_", "B_") and f.endswith(".json")):
        os.remove(os.path.join(out, f))
json.dump(res, open(os.path.join(out, "ab.json"), "w"), indent=1)
print(json.dumps({m: {"A": d["A"]["median_replay_us"], "B": d["B"]["median_replay_us"],
                      "B/A": d["B_over_A_replay"]} for m, d in res.items()}))
EOF
