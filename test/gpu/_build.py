"""Compile a tiny fixture's decode step for the CUDA target (shared by the gpu tests)."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def tiny_program(name: str = "llama_gguf_q4_1", capacity: int = 16):
    """The fixture's decode step compiled for CUDA (skips where MLIR is not installed)."""
    pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                        "installed here: compiling the fixture needs them")
    from model_steps import fixture_path

    from poot.backends.cuda.codegen import cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path(name))
    g = model.trace(StepSpec.decode(kv_capacity=capacity), weights.types)
    return compile_step(g, cuda_target()), weights


@functools.cache
def tiny_artifact(name: str = "llama_gguf_q4_1", capacity: int = 16, strategy: str = "auto"):
    from poot.backends.cuda.codegen import compile_program

    prog, _ = tiny_program(name, capacity)
    if strategy == "auto":
        return prog.executable  # what compile() produced
    return compile_program(prog, strategy=strategy)
