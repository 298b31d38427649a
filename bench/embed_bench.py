"""Embeddings per second: N inputs of T tokens through the pooled step, on any backend.
Prints one JSON object.

    python bench/embed_bench.py --model test/fixtures/tiny/qwen3_embed          # a checkpoint
    python bench/embed_bench.py --config bench/shapes/llama-3.2-1b.json --random-weights bf16 \\
        --backend cuda                                                         # the 1B shape
    [--inputs 256] [--tokens 128] [--max-batch 32] [--pooling last] [--repeats 3]

The inputs are random token ids (seed 0), all T long, so every step runs the (max_batch, T)
bucket. The step is compiled (or loaded from the compile cache) first and run once to warm
up; ``embeddings_per_s`` is N / the best of ``--repeats`` timed passes over all N inputs
(host time, including writing the inputs and reading the embeddings back).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def random_bert(config: Path, dtype: str) -> Path:
    """A BertModel folder (``config.json`` + ``model.safetensors`` written here: header JSON
    then raw little-endian data, the safetensors format) with N(0, 0.02) weights of the
    config's shapes, under /tmp (made once per config and dtype)."""
    import tempfile

    from poot.load.config import _read_json, config_from_hf
    from poot.models.bert import BertConfig, weight_table

    raw = json.loads(config.read_text())
    mc = config_from_hf(_read_json(str(config)), str(config))
    cfg = BertConfig.from_model_config(mc, {})
    out = Path(tempfile.gettempdir()) / f"poot-bench-{config.stem}-{dtype}"
    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    h, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {"tok_embed": (cfg.vocab_size, h), "pos_embed": (cfg.max_position_embeddings, h),
              "type_embed": (cfg.type_vocab_size, h), "attn.q": (h, h), "attn.k": (h, h),
              "attn.v": (h, h), "attn.o": (h, h), "ffn.up": (f, h), "ffn.down": (h, f)}
    rng = np.random.default_rng(0)
    np_dtype = {"f32": np.float32, "f16": np.float16}.get(dtype, np.float32)
    st_dtype = {"f32": "F32", "f16": "F16"}.get(dtype, "F32")   # bf16: stored as f32
    header, blobs, off = {}, [], 0
    for role, where in weight_table(cfg).items():
        for i in (range(cfg.num_layers) if "{i}" in role else [None]):
            r = role.format(i=i) if i is not None else role
            name = where.hf.format(i=i) if i is not None else where.hf
            key = r.split(".", 2)[-1] if r.startswith("blk.") else r
            if key.endswith("_bias") or "norm" in key:
                shape = (shapes[key.removesuffix("_bias")][0],) if key.removesuffix("_bias") \
                    in shapes else (h,)
                data = (np.ones(shape) if "norm" in key and not key.endswith("_bias")
                        else np.zeros(shape))
            else:
                shape = shapes[key]
                data = rng.standard_normal(shape) * 0.02
            b = np.ascontiguousarray(data.astype(np_dtype)).tobytes()
            header[name] = {"dtype": st_dtype, "shape": list(shape),
                            "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(out / "model.safetensors", "wb") as fh:
        fh.write(len(hb).to_bytes(8, "little"))
        fh.write(hb)
        for b in blobs:
            fh.write(b)
    (out / "config.json").write_text(json.dumps(raw))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="an HF folder (an embedding model)")
    src.add_argument("--config", help="an HF config.json given random weights (a decoder "
                     "shape, or a BertModel shape such as bench/shapes/minilm-l6.json)")
    ap.add_argument("--random-weights", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--inputs", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--pooling", default=None, choices=("cls", "mean", "last"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from poot.api import DEFAULT_COMPILE_OPTIONS, compile_cached, target_for
    from poot.engine.pooling import PoolingRunner
    from poot.runtime import device_for
    from poot.compiler.cache import CompileCache

    t0 = time.perf_counter()
    if args.model:
        from poot.api.pooling import PoolingModel

        pm = PoolingModel.load(args.model, args.backend, pooling=args.pooling,
                               max_batch=args.max_batch, max_tokens=args.tokens,
                               warm_up=False)
        runner, vocab, name = pm.runner, pm.model.dims().vocab, Path(args.model).name
    elif json.loads(Path(args.config).read_text()).get("model_type") == "bert":
        from poot.api.pooling import PoolingModel

        folder = random_bert(Path(args.config), args.random_weights)
        pm = PoolingModel.load(folder, args.backend, pooling=args.pooling,
                               max_batch=args.max_batch, max_tokens=args.tokens,
                               warm_up=False)
        runner, vocab, name = pm.runner, pm.model.config.vocab_size, Path(args.config).stem
    else:
        from poot.models.random_init import load_random_model

        model, weights = load_random_model(args.config, args.random_weights)
        target = target_for(args.backend)
        cache = CompileCache()

        def compile_step(key_model, types, spec, trace):
            return compile_cached(cache, key_model, types, spec, trace, target,
                                  DEFAULT_COMPILE_OPTIONS)

        runner = PoolingRunner(model, weights, device_for(target), compile_step,
                               args.max_batch, args.tokens, args.pooling or "last", True)
        vocab, name = model.dims().vocab, Path(args.config).stem
    runner.entry(runner.bucket(min(args.max_batch, args.inputs), runner.batch_buckets),
                 runner.bucket(args.tokens, runner.tok_buckets))
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    rows = [list(map(int, rng.integers(3, vocab, args.tokens))) for _ in range(args.inputs)]
    runner.run(rows[:args.max_batch])                     # warm up (records the step)
    best = float("inf")
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = runner.run(rows)
        best = min(best, time.perf_counter() - t)
    print(json.dumps({"model": name, "backend": args.backend, "inputs": args.inputs,
                      "tokens": args.tokens, "max_batch": args.max_batch,
                      "dim": int(out.shape[1]), "load_and_compile_s": round(load_s, 2),
                      "seconds": round(best, 4),
                      "embeddings_per_s": round(args.inputs / best, 2),
                      "tokens_per_s": round(args.inputs * args.tokens / best, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
