"""The compile cache's step index: a program compiled here is found again without tracing, in
a process where ``mlir`` cannot be imported (what the GPU machine is), and a miss there says
what differs instead of trying to compile. Random-init weights bind like a checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "test" / "fixtures" / "tiny"
GGUF = TINY / "llama_gguf_q4_1" / "model.gguf"

# A process in which `import mlir` fails (sitecustomize runs before the script).
NO_MLIR = "import sys\nsys.modules['mlir'] = None\n"

# Loads the model for cuda with a stand-in device that records what it is asked to load (the
# cache hit path up to the point where a real device is needed), and reports.
HIT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from types import SimpleNamespace
    from poot.backends.gpu.artifact import host_of, kernel_args

    class Device:  # the executor's Device protocol, enough to load weights and programs
        name = "cuda"
        def __init__(self):
            self.loaded = []
        def alloc(self, t):
            return np.zeros(host_of(t)[2], np.uint8)
        def upload(self, buf, array):
            pass
        def load(self, program):
            art = program.executable
            self.loaded.append(art)
            return SimpleNamespace(args=kernel_args(art.plan))

    from poot.api import ModelHandle, compile_cached
    from poot.compiler.cache import step_key
    path, cache, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dev = Device()
    try:
        h = ModelHandle.load(path, "cuda", kv_capacity=cap, cache_dir=cache, device=dev,
                             max_batch=1)
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        sys.exit(3)
    spec = h.runner.step_spec("decode", 1)
    from poot.api import target_for, DEFAULT_COMPILE_OPTIONS
    key = step_key(h.model, h.weights.types, spec, target_for("cuda"), DEFAULT_COMPILE_OPTIONS)
    try:
        import mlir  # noqa: F401
        importable = True
    except ImportError:
        importable = False
    print(json.dumps({
        "loaded": [type(a).__name__ for a in dev.loaded],
        "entries": [a.plan["entry"] for a in dev.loaded],
        "decode_outputs": [o["name"] for o in dev.loaded[2].plan["outputs"]],
        "sampler_outputs": [o["name"] for o in dev.loaded[3].plan["outputs"]],
        "hits": h.compile_cache.hits, "decode_key": key, "mlir_importable": importable,
        "mlir_modules": sorted(m for m in sys.modules
                               if m.startswith("mlir.") and sys.modules[m] is not None)}))
""")


def _env(tmp: Path, no_mlir: bool, seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    path = [str(ROOT)]
    if no_mlir:
        shim = tmp / "shim"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(NO_MLIR)
        path.insert(0, str(shim))
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    env.pop("POOT_CACHE_DIR", None)
    return env


def _run(args, tmp, no_mlir=False, seed="1"):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp,
                          env=_env(tmp, no_mlir, seed), timeout=600)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """`poot compile` of the tiny Q4_1 GGUF for cuda at KV capacity 16 (MLIR here)."""
    tmp = tmp_path_factory.mktemp("cache")
    cache = tmp / "cache"
    r = _run(["-m", "poot.cli", "compile", "--model", str(GGUF), "--backend", "cuda",
              "--kv-capacity", "16", "--max-batch", "1", "--cache-dir", str(cache)], tmp,
             seed="1")
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, cache, json.loads(r.stdout)


def test_compile_fills_index(filled):
    _, cache, out = filled
    # the greedy sampler, and batch 1's sampler serving any options (what the CLI warms up)
    assert set(out["steps"]) == {"ragged[T=16]", "decode[B=1]", "sampler[B=1]",
                                 "sampler[B=1:sample+pen+bias+topk+topp+minp]"}
    for s in out["steps"].values():
        assert (cache / "index" / f"{s['step_key']}.json").is_file()
        assert (cache / "programs" / f"{s['program']}.pkl").is_file()
    assert 0 < out["cache_bytes"] < 4 << 20


def test_hit_without_mlir_loads_programs(filled):
    tmp, cache, out = filled
    script = tmp / "hit.py"
    script.write_text(HIT)
    # another hash seed: the key must not depend on per-process string hashing
    r = _run([str(script), str(GGUF), str(cache), "16"], tmp, no_mlir=True, seed="2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert not got["mlir_importable"] and got["mlir_modules"] == []
    # the ragged step of one chunk, its sampler, the decode step, the same sampler program
    # again reading the decode step's logits: three cache hits, four loads
    assert got["loaded"] == ["CudaArtifact"] * 4 and got["hits"] == 3
    assert got["decode_key"] == out["steps"]["decode[B=1]"]["step_key"]
    assert "logits" in got["decode_outputs"]              # the decode step leaves its logits
    assert "sampling.token" in got["sampler_outputs"]     # to the sampler program


def test_miss_without_mlir_says_what_differs(filled):
    tmp, cache, _ = filled
    script = tmp / "hit.py"
    script.write_text(HIT)
    r = _run([str(script), str(GGUF), str(cache), "24"], tmp, no_mlir=True)
    assert r.returncode == 3, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["error"] == "CacheMiss"
    # the closest entry differs in the step: a ragged step of one chunk, 24 token rows
    # (capacity 24) vs 16
    assert "MLIR is not importable" in got["message"] and "batch=24" in got["message"]


def test_step_key_changes_with_the_step_and_the_sources():
    from poot.backends.cuda.artifact import cuda_target
    from poot.compiler import CompileOptions
    from poot.compiler import cache as C
    from poot.graph.sampling import GREEDY, SamplerSpec
    from poot.models import StepSpec, load_model

    model, weights = load_model(GGUF)
    t, o = cuda_target(), CompileOptions()
    k = lambda spec, **kw: C.step_key(model, weights.types, spec, t, kw.get("o", o))  # noqa
    base = k(StepSpec.decode(kv_capacity=16, sampler=GREEDY))
    assert base == k(StepSpec.decode(kv_capacity=16, sampler=GREEDY))
    assert base != k(StepSpec.decode(kv_capacity=32, sampler=GREEDY))
    assert base != k(StepSpec.decode(kv_capacity=16, sampler=SamplerSpec(logprobs=2)))
    assert base != k(StepSpec.decode(kv_capacity=16, sampler=GREEDY),
                     o=CompileOptions(disable=frozenset({"poot-cse"})))
    d = C.step_describe(model, weights.types, StepSpec.decode(kv_capacity=16), t, o)
    assert d["sources"] == C.step_source_hash("cuda") != C.step_source_hash("cpu")


def test_cuda_target_without_mlir_equals_codegen_target():
    from poot.backends.cuda.artifact import cuda_target
    from poot.backends.cuda.codegen import cuda_target as codegen_target

    assert cuda_target().key() == codegen_target().key()


@pytest.mark.parametrize("name", ["llama", "llama_llama3rope_tied", "mistral_swa4", "qwen3",
                                  "gemma"])
def test_random_weights_bind_like_the_checkpoint(name):
    """Random init of a fixture's config.json (f32) gives the types its checkpoint binds."""
    from poot.models import load_model
    from poot.models.random_init import load_random_model

    real_model, real = load_model(TINY / name)
    model, rnd = load_random_model(TINY / name / "config.json", "f32")
    assert type(model) is type(real_model) and model.config == real_model.config
    assert rnd.types == real.types


def test_random_array_values():
    from poot.models.random_init import CHUNK_ELEMS, RandomArray, pool

    a = RandomArray((3, CHUNK_ELEMS // 2 + 5), np.float32, 0.5, seed=3, salt="w")
    x = np.asarray(a)
    assert x.shape == a.shape and x.dtype == np.float32 and a.nbytes == x.nbytes
    chunks = list(a.chunks())
    assert len(chunks) == 2 and sum(n for _, _, n in chunks) == a.size
    first, start, n = chunks[1]
    np.testing.assert_array_equal(x.reshape(-1)[first:first + n], 0.5 * pool(3)[start:start + n])
    assert 0.45 < x.std() < 0.55
    ones = np.asarray(RandomArray((7,), np.float32, 0.0))
    np.testing.assert_array_equal(ones, np.ones(7, np.float32))
    assert not np.array_equal(x, np.asarray(RandomArray(a.shape, np.float32, 0.5, 3, "v")))


def test_a_runtime_edit_keeps_the_source_hash_and_a_codegen_edit_changes_it(tmp_path,
                                                                          monkeypatch):
    from poot.compiler import cache as C

    folder = tmp_path / "backends" / "vulkan"
    folder.mkdir(parents=True)
    (folder / "codegen.py").write_text("X = 1\n")
    (folder / "runtime.py").write_text("Y = 1\n")
    monkeypatch.setattr(C, "SOURCE_ROOT", tmp_path)
    before = C._source_hash(("backends/vulkan",), ())
    (folder / "runtime.py").write_text("Y = 2  # a faster replay\n")
    assert C._source_hash(("backends/vulkan",), ()) == before
    (folder / "codegen.py").write_text("X = 2\n")
    assert C._source_hash(("backends/vulkan",), ()) != before
