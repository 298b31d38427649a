"""Write a Vulkan check bundle for :mod:`poot.backends.vulkan.check` (needs MLIR: compiles here,
runs anywhere with a Vulkan device).

    python -m poot.backends.vulkan.bundle OUT --fixture llama [--subgroup-size 32] [--steps 4]

``OUT/art`` (SPIR-V + plan.json, compiled for the stated device capabilities: NVIDIA is
subgroup 32 / 48 KiB shared memory, lavapipe 8 / 32 KiB), ``OUT/weights.npz`` and
``OUT/fixtures.npz``: a decode step run ``steps`` times from zeroed KV caches on the CPU oracle
(per-step inputs ``s{k}.in.*``, expected non-carried outputs ``s{k}.out.*``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from poot.models import StepSpec, contiguous_inputs, load_model


def write_bundle(out: str, fixture_dir: str, subgroup_size: int, shared: int, steps: int,
                 kv_capacity: int = 16) -> Path:
    from poot import oracle  # lazy: MLIR
    # lazy: MLIR
    from poot.backends.vulkan.codegen import DEFAULT_FEATURES, compile_vulkan, vulkan_target

    model, weights = load_model(Path(fixture_dir))
    g = model.trace(StepSpec.decode(kv_capacity=kv_capacity, kv_slots=1), weights.types)
    target = vulkan_target({"features": sorted(DEFAULT_FEATURES),
                            "subgroup_size": subgroup_size, "max_shared_bytes": shared})
    prog = compile_vulkan(g, target)
    out_p = Path(out)
    prog.executable.save(out_p / "art")
    arrays = {}
    for n, _ in prog.executable.params:
        a = np.asarray(weights[n])
        arrays[n] = a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind == "V" else a
    np.savez(out_p / "weights.npz", **arrays)
    caches = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in g.inputs if n.startswith("kv.")}
    fx = {}
    rng = np.random.default_rng(0)
    vocab = prog.executable.outputs[0][1].shape[-1]
    for k in range(steps):
        ins = contiguous_inputs(kv_capacity, [[int(rng.integers(vocab))]], [[k]], [0])
        want = oracle.evaluate(g, {**ins, **caches}, weights)
        for n, v in ins.items():
            fx[f"s{k}.in.{n}"] = v
        for n, v in want.items():
            if n.startswith("kv."):
                caches[n] = v
            else:
                fx[f"s{k}.out.{n}"] = v
    np.savez(out_p / "fixtures.npz", **fx)
    return out_p


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--fixture", default="llama", help="a folder under test/fixtures/tiny, or "
                    "a checkpoint path")
    ap.add_argument("--subgroup-size", type=int, default=32)
    ap.add_argument("--shared", type=int, default=48 * 1024)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    fx = Path(a.fixture)
    if not fx.exists():
        root = Path(__file__).resolve().parents[3] / "test" / "fixtures" / "tiny" / a.fixture
        gguf = root / "model.gguf"
        fx = gguf if gguf.exists() else root
    print(write_bundle(a.out, str(fx), a.subgroup_size, a.shared, a.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
