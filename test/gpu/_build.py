"""Compile a tiny fixture's decode step for the CUDA target (shared by the gpu tests)."""

from __future__ import annotations

import functools
import sys

from model_steps import fixture_path


@functools.cache
def tiny_program(name: str = "llama_gguf_q4_1", capacity: int = 16):
    from poot.backends.cuda.codegen import cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    cmod = sys.modules["poot.compiler.compile"]
    model, weights = load_model(fixture_path(name))
    g = model.trace(StepSpec.decode(kv_capacity=capacity), weights.types)
    saved = cmod._codegen
    cmod._codegen = lambda g_, t_, o_: None    # the artifact is made by the tests
    try:
        return compile_step(g, cuda_target()), weights
    finally:
        cmod._codegen = saved


@functools.cache
def tiny_artifact(name: str = "llama_gguf_q4_1", capacity: int = 16, strategy: str = "auto"):
    from poot.backends.cuda.codegen import compile_program

    prog, _ = tiny_program(name, capacity)
    return compile_program(prog, strategy=strategy)
