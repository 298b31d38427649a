#!/usr/bin/env bash
# Model families and MoE experts read in place, on CUDA on the GPU machine. Built here first:
#   bash bench/gpu_run/moe_fixtures.sh build      -> .cache/gpu/moe (the CUDA compile cache)
# then one call, carry [".cache/gpu/moe"]:  bash bench/gpu_run/moe_fixtures.sh
#
# Out: fixtures_cuda.json (the gemma3, glm4_moe, mixtral, deepseek_v3, deepseek_v2_lite and
# deepseek_v2_lite_gguf fixtures' greedy tokens through the engine on CUDA vs HF's recorded
# ones; their decode steps at B = 1 take the sparse MoE spelling) and moe_bf16.json (bench/moe_bench.py: decode tok/s of a Mixtral-shaped model,
# 8 experts top-2, bf16, experts read in place vs the dense all-experts graph).
set -u
cd "$(dirname "$0")/../.."
FIXTURES="gemma3 glm4_moe mixtral deepseek_v3 deepseek_v2_lite deepseek_v2_lite_gguf"
# the checkpoint of a fixture: its model.gguf when it has one, else the HF folder
ckpt() { local d="test/fixtures/tiny/$1"; [ -f "$d/model.gguf" ] && echo "$d/model.gguf" || echo "$d"; }
if [ "${1:-}" = build ]; then
  export POOT_CACHE_DIR="$PWD/.cache/gpu/moe"
  for f in $FIXTURES; do
    poot compile --model "$(ckpt "$f")" --backend cuda --kv-capacity 32 \
        --max-batch 1 --quiet > /dev/null || exit 1
  done
  for s in sparse dense; do
    POOT_MOE=$s poot compile --config bench/shapes/mixtral-mini.json --random-weights \
        --dtype bf16 --backend cuda --kv-capacity 128 --max-batch 1 --quiet > /dev/null || exit 1
  done
  du -sh .cache/gpu/moe
  exit 0
fi
OUT="${OUT:-/tmp/moe_fixtures}"
mkdir -p "$OUT"
[ -d .cache/gpu/moe ] || { echo "moe_fixtures: carry .cache/gpu/moe" >&2; exit 2; }
export PYTHONPATH=. PYTHONUNBUFFERED=1 POOT_CACHE_DIR="$PWD/.cache/gpu/moe"
FIXTURES="$FIXTURES" timeout 300 python3 - > "$OUT/fixtures_cuda.json" 2> "$OUT/fixtures_cuda.log" <<'PYEOF'
import json
import os
from pathlib import Path

import numpy as np
from poot.api import Driver, ModelHandle
from poot.sampling_params import SamplingParams

res = {}
for name in os.environ["FIXTURES"].split():
    d = Path(f"test/fixtures/tiny/{name}")
    ref = np.load(d / "reference.npz")
    ck = d / "model.gguf" if (d / "model.gguf").exists() else d
    h = ModelHandle.load(str(ck), backend="cuda", kv_capacity=32, max_batch=1)
    done = Driver(h).complete([int(i) for i in ref["prompt_ids"]],
                              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    want = [int(t) for t in ref["greedy_ids"]]
    res[name] = {"tokens": done.token_ids, "hf": want, "equal": done.token_ids == want}
print(json.dumps(res))
PYEOF
echo "fixtures: exit $?"; cat "$OUT/fixtures_cuda.json"; tail -c 1500 "$OUT/fixtures_cuda.log"
timeout 400 python3 bench/moe_bench.py --config bench/shapes/mixtral-mini.json --dtype bf16 \
    --backend cuda --kv-capacity 128 --tokens 64 --no-logprobs \
    > "$OUT/moe_bf16.json" 2> "$OUT/moe_bf16.log"; echo "moe_bench: exit $?"
cat "$OUT/moe_bf16.json"; tail -c 1500 "$OUT/moe_bf16.log"
