#!/usr/bin/env bash
# Same-machine A/B of `poot serve --backend cuda` under load: an older tree's poot package (A)
# and this tree's (B), the Llama-3.2-1B shape at K concurrent clients, alternating A B, B A, ...
# in one call (two GPUs, or one GPU across calls, differ by more than a front-end change moves
# the served rate). Both serve from the same carried compile cache, so A's compiled steps must
# hash as this tree's do (`step_source_hash("cuda")`: engine and server changes keep it).
#
# Here:   python bench/gpu_run/serve_under_load_build.py
#         mkdir -p .cache/gpu/serve/old && git archive OLD_COMMIT poot bench/shapes \
#             bench/gpu_run/engine_check.py | tar -x -C .cache/gpu/serve/old
# There:  carry [".cache/gpu/serve"]:  OUT=$OUT bash bench/gpu_run/serve_ab.sh .cache/gpu/serve/old
#
# Out: $OUT/serve_ab.json: per variant the output tok/s, ITL p50/p99, steps and ahead steps of
# every round, the median tok/s, and B/A. SERVE_AB_ROUNDS (2), SERVE_AB_K (64), SERVE_SECONDS
# (15), SERVE_LOAD_PROCS (4), SERVE_AB_ENV_A / _B ("VAR=value ...": that variant's server
# environment; with OLD_TREE "." an A/B of a setting); serve_under_load.sh's files, with
# _A<round> / _B<round> in their names, stay in $OUT.
set -u
cd "$(dirname "$0")/../.."
A=${1:?usage: serve_ab.sh OLD_TREE (a folder holding an older poot/ and bench/shapes/, or .)}
[ -d "$A/poot" ] || { echo "serve_ab: $A/poot is missing" >&2; exit 2; }
A=$(cd "$A" && pwd)
export OUT="${OUT:-/tmp/serve_ab}" SERVE_MODELS=llama1b SERVE_KS=${SERVE_AB_K:-64}
export SERVE_SECONDS=${SERVE_SECONDS:-15}
ROUNDS=${SERVE_AB_ROUNDS:-2}
one() {  # VARIANT ROUND
    if [ "$1" = A ]; then SERVE_POOT=$A SERVE_ENV=${SERVE_AB_ENV_A:-} SERVE_TAG=_A$2 \
        bash bench/gpu_run/serve_under_load.sh
    else SERVE_POOT=. SERVE_ENV=${SERVE_AB_ENV_B:-} SERVE_TAG=_B$2 \
        bash bench/gpu_run/serve_under_load.sh; fi
}
for r in $(seq "$ROUNDS"); do       # neither variant always runs first
    if [ $((r % 2)) -eq 1 ]; then one A "$r"; one B "$r"; else one B "$r"; one A "$r"; fi
done
python3 - "$OUT" "$ROUNDS" "$SERVE_KS" <<'PYEOF'
import json, os, statistics, sys
out, rounds, k = sys.argv[1], int(sys.argv[2]), sys.argv[3]
res = {"k": int(k)}
for v in "AB":
    rows = []
    for r in range(1, rounds + 1):
        try:
            d = json.load(open(os.path.join(out, f"serve_llama1b_{v}{r}_k{k}.json")))
            rows.append({"tok_s": d["output_tokens_per_s"], "itl_p50": d["itl_s"]["p50"],
                         "itl_p99": d["itl_s"]["p99"], "errors": d["errors"],
                         "server": d.get("server")})
        except (OSError, ValueError, KeyError) as e:
            rows.append({"error": f"{type(e).__name__}: {e}"})
    ok = [x["tok_s"] for x in rows if "error" not in x]
    res[v] = {"rounds": rows, "median_tok_s": statistics.median(ok) if ok else None}
a, b = res["A"]["median_tok_s"], res["B"]["median_tok_s"]
res["B_over_A"] = round(b / a, 4) if a and b else None
json.dump(res, open(os.path.join(out, "serve_ab.json"), "w"), indent=1)
print(json.dumps({v: res[v]["median_tok_s"] for v in "AB"} | {"B_over_A": res["B_over_A"]}))
PYEOF
