"""The KV cache's storage option (``kv_dtype``, ``kv_dtype_k``/``kv_dtype_v``: f32, f16,
bf16, q8_0; fp8 refused): bad values are typed errors naming the option before anything
compiles; the pool's bytes follow the storage, so the same ``kv_memory`` holds about twice
the blocks and the engine admits about twice the sequences in q8_0; ``poot inspect`` and the
bench report KV bytes per token."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from poot.api import LoadOptions, ModelHandle
from poot.api.memory import kv_bytes_per_token, plan_kv
from poot.api.options import kv_dtypes_of
from poot.compiler.target import Capabilities, Target
from poot.dialects.kv_quant import Q8_0
from poot.dialects.types import DType
from poot.models.random_init import load_random_model
from poot.sampling_params import InvalidRequest, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "test" / "fixtures" / "tiny"


def _no_compile(graph):
    raise AssertionError("compiled before validating")


def _config(tmp_path: Path, fixture: str = "llama", **changes) -> Path:
    """A tiny fixture's config.json with ``changes`` (random weights of its shapes)."""
    cfg = json.loads((TINY / fixture / "config.json").read_text())
    cfg.update(changes)
    path = tmp_path / f"{fixture}.json"
    path.write_text(json.dumps(cfg))
    return path


def _load(path, **kw):
    random = {} if Path(path).is_dir() else {"random_weights": "f32"}
    return ModelHandle.load(path, "cpu", compile_fn=_no_compile, device=object(),
                            warm_up=False, **random, **kw)


GPU_LIKE = Target("vulkan", Capabilities(subgroup_size=32))


@pytest.mark.parametrize("model, kw, target, field, says", [
    ("llama32", {"kv_dtype": "q4"}, None, "kv_dtype", "must be one of f32, f16, bf16, q8_0"),
    ("llama32", {"kv_dtype_k": "int8"}, None, "kv_dtype_k", "must be one of"),
    ("llama32", {"kv_dtype": "fp8"}, None, "kv_dtype", "needs a device that converts fp8"),
    ("llama32", {"kv_dtype_v": "fp8"}, None, "kv_dtype_v", "needs a device that converts"),
    ("llama", {"kv_dtype": "q8_0"}, None, "kv_dtype", "head dim 16 is not a multiple of 32"),
    ("llama", {"kv_dtype_v": "q8_0"}, None, "kv_dtype_v", "head dim 16 is not a multiple"),
    ("llama32", {"kv_dtype": "q8_0"}, GPU_LIKE, "kv_dtype",
     "needs an attention kernel that reads it, which the vulkan target lacks"),
    ("mla", {"kv_dtype": "q8_0", "kv_dtype_v": "f16"}, None, "kv_dtype_v",
     "one latent KV pool"),
], ids=["unknown", "unknown-k", "fp8", "fp8-v", "q8_0-head-dim", "q8_0-head-dim-v",
        "q8_0-no-kernel", "mla-split"])
def test_bad_kv_storage_is_refused_before_compiling(tmp_path, model, kw, target, field, says):
    """Each bad KV storage request is an InvalidRequest naming the option, raised while
    planning the pool (a load whose compile function fails the test if called)."""
    paths = {"llama": TINY / "llama", "llama32": _config(tmp_path, head_dim=32),
             "mla": _config(tmp_path, "deepseek_v3", kv_lora_rank=32, qk_rope_head_dim=32)}
    with pytest.raises(InvalidRequest) as e:
        if target is None:
            _load(paths[model], **kw)
        else:   # a target without the kernel: the load's planning, for that target
            k, v = kv_dtypes_of(LoadOptions(**kw))
            m, w = load_random_model(paths[model], dtype="f32")
            plan_kv(m, w.types, target, 64, 2, None, k, kv_dtype_v=v)
    assert e.value.field == field and says in str(e.value), str(e.value)


def test_cli_names_the_option_in_one_line():
    """``poot generate --kv-dtype q4``: one ``poot: error:`` line naming --kv-dtype, status 2."""
    r = subprocess.run([sys.executable, "-m", "poot.cli", "generate", "--model",
                        str(TINY / "llama"), "--kv-dtype", "q4", "--prompt", "hi", "-q"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poot: error:") and "--kv-dtype=" in lines[0]


def test_pool_bytes_follow_the_storage(tmp_path):
    """A block's bytes in q8_0 are 34 per 32 values (the f16 scale included): 17/32 of f16's;
    K and V in different storage count half each."""
    path = _config(tmp_path, head_dim=32)
    f16 = _load(path, kv_dtype="f16", kv_capacity=64).runner.kv
    q8 = _load(path, kv_dtype="q8_0", kv_capacity=64).runner.kv
    mixed = _load(path, kv_dtype_k="q8_0", kv_dtype_v="f16", kv_capacity=64).runner.kv
    assert q8.kv_dtype is Q8_0 and mixed.kv_dtype_v is DType.F16
    # tiny llama, head_dim 32: (K + V) x 2 KV heads x 32 = 128 values a position and layer
    model, _ = load_random_model(path, dtype="f32")
    dims = model.dims()
    assert (f16.token_bytes(dims), q8.token_bytes(dims), mixed.token_bytes(dims)) == \
        (2 * 128, 34 * 128 // 32, (2 * 64) + 34 * 64 // 32)
    assert kv_bytes_per_token(dims) == {"f32": 1024, "f16": 512, "bf16": 512, "q8_0": 272,
                                        "fp8": 288}     # 32 + 4 bytes a head vector


def test_same_kv_memory_admits_about_twice_the_sequences(tmp_path):
    """At the same ``kv_memory``, q8_0 holds 32/17 = 1.88x the blocks of f16, and the engine's
    scheduler admits that many more one-block sequences (8 in f16, 15 in q8_0)."""
    from poot.engine.blocks import BlockManager
    from poot.engine.request import Request
    from poot.engine.scheduler import EngineConfig, Scheduler

    path = _config(tmp_path, head_dim=32)
    per_block_f16 = 2 * 32 * 128 * 2      # layers x bs x values x 2 bytes (bs = 32 on the CPU)
    memory = 9 * per_block_f16            # 8 usable blocks and the null block in f16

    class Runner:             # what the scheduler reads of a ModelRunner
        prefill_chunk, history_slots, lora = 32, 64, None

        def ragged_bucket(self, n):
            return max(32, 1 << (n - 1).bit_length())

        def table_row(self, blocks):
            row = np.zeros(2, np.int32)
            row[:len(blocks)] = blocks
            return row

    admitted = {}
    for dtype in ("f16", "q8_0"):
        kv = _load(path, kv_dtype=dtype, kv_capacity=64, kv_memory=memory).runner.kv
        sch = Scheduler(EngineConfig(max_batch=32, watermark_blocks=0),
                        BlockManager(kv.num_blocks, kv.block_size), Runner())
        sch.waiting.extend(Request(f"r{i}", [i + 1] * 10, SamplingParams(max_tokens=4), None,
                                   time.perf_counter(), None) for i in range(32))
        admitted[dtype] = len(sch.schedule().admitted)
    assert admitted == {"f16": 8, "q8_0": 15}


def test_inspect_prints_kv_bytes_per_token():
    """``poot inspect`` reports the KV bytes a position takes in every storage (SmolLM2-like
    tiny llama: q8_0 n/a, its head dim is 16)."""
    r = subprocess.run([sys.executable, "-m", "poot.cli", "inspect", str(TINY / "llama"),
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["family"]["kv_bytes_per_token"]
    # 2 layers x (K + V) x 2 KV heads x 16 = 128 values a position; fp8: 16 + 4 bytes a
    # head vector of 16
    assert got == {"f32": 512, "f16": 256, "bf16": 256, "q8_0": None, "fp8": 160}


def test_engine_serves_q8_0_with_prefix_cache_and_lora_slots(tmp_path):
    """The engine end to end over q8_0 pools (values and scales planes carried between
    steps): a second identical prompt reuses the first's full block from the prefix cache and
    generates the same tokens, with LoRA slots bound (no adapter active) as without them."""
    from poot.api import Driver

    path = _config(tmp_path, head_dim=32)
    prompt = [3 + (7 * i) % 200 for i in range(40)]     # one full 32-position block
    params = SamplingParams(temperature=0, max_tokens=6)
    runs = {}
    for loras in (0, 1):
        h = ModelHandle.load(path, "cpu", random_weights="f32", kv_dtype="q8_0",
                             kv_capacity=64, max_batch=2, max_loras=loras)
        assert h.runner.kv.kv_dtype is Q8_0
        d = Driver(h)
        first = d.complete(prompt, params).token_ids
        second = d.complete(prompt, params).token_ids
        assert h.engine.blocks.hit_blocks >= 1 and second == first
        runs[loras] = first
    assert runs[0] == runs[1] and len(runs[0]) == 6
