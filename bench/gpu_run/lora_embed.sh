#!/usr/bin/env bash
# LoRA adapters and pooled models (embeddings, rerank) on CUDA on the GPU machine. Built here first by
#   python bench/gpu_run/lora_embed_build.py   -> .cache/gpu/lora_embed (the CUDA compile cache)
# then one call, carry [".cache/gpu/lora_embed"]:  bash bench/gpu_run/lora_embed.sh
#
# Out: lora_check.json (lora_check.py: a batch of the base model and two adapters vs HF +
# PEFT's tokens and log-probs, unload under traffic, on CUDA), lora_1b.json
# (bench/lora_bench.py: decode tok/s with one rank-16 adapter vs none, B = 1 and 32, 1B
# shape, bf16), pooled_cuda.json (max abs diff of the tiny pooled fixtures' embeddings / scores vs
# their recorded sentence-transformers / HF references, on CUDA) and embed_1b.json
# (bench/embed_bench.py: 256 inputs of 128 tokens, batch 32, Llama-3.2-1B shape, bf16).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/lora_embed}"
mkdir -p "$OUT"
[ -d .cache/gpu/lora_embed ] || { echo "lora_embed: carry .cache/gpu/lora_embed" >&2; exit 2; }
export PYTHONPATH=. PYTHONUNBUFFERED=1 POOT_CACHE_DIR="$PWD/.cache/gpu/lora_embed"
timeout 240 python3 bench/gpu_run/lora_check.py "$OUT/lora_check.json" --backend cuda \
    > "$OUT/lora_check.log" 2>&1; echo "lora_check: exit $?"; tail -c 1500 "$OUT/lora_check.log"
timeout 300 python3 bench/lora_bench.py --config bench/shapes/llama-3.2-1b.json \
    --random-weights bf16 --backend cuda --batches 1,32 --rank 16 --kv-capacity 256 \
    > "$OUT/lora_1b.json" 2> "$OUT/lora_1b.log"; echo "lora_bench: exit $?"
cat "$OUT/lora_1b.json"; tail -c 600 "$OUT/lora_1b.log"
python3 - > "$OUT/pooled_cuda.json" <<'PYEOF'
import json
import numpy as np
from poot.api.pooling import PoolingModel

res = {}
for name in ("qwen3_embed", "bert_embed", "bert_cross_encoder"):
    pm = PoolingModel.load(f"test/fixtures/tiny/{name}", "cuda", max_batch=4, max_tokens=16)
    ref = np.load(f"test/fixtures/tiny/{name}/reference.npz")
    rows = [[int(x) for x in r[:n]] for r, n in zip(ref["input_ids"], ref["lengths"])]
    if pm.task == "embed":
        got, want = pm.embed_ids(rows), ref["embeddings"]
    else:
        tt = [[int(x) for x in r[:n]] for r, n in zip(ref["token_type_ids"], ref["lengths"])]
        got, want = pm.score_pairs(list(zip(rows, tt))), ref["scores"]
    res[name] = {"max_abs_diff": float(np.abs(got - want).max()), "shape": list(got.shape)}
print(json.dumps(res))
PYEOF
cat "$OUT/pooled_cuda.json"
python3 bench/embed_bench.py --config bench/shapes/llama-3.2-1b.json --random-weights bf16 \
    --backend cuda --inputs 256 --tokens 128 --max-batch 32 | tee "$OUT/embed_1b.json"
