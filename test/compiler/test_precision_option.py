"""CompileOptions.precision: its values, what each asks of the CPU backend's matmul kernels
(bits of the quantized activations), and that it is part of the compile-cache key."""

from __future__ import annotations

import dataclasses

import pytest

from poot.compiler import CompileOptions
from poot.compiler.options import PRECISIONS


def test_default_is_int16():
    assert CompileOptions().precision == "int16"


@pytest.mark.parametrize("bad", ["fast", "f32", ""])
def test_unknown_precision_is_a_typed_error(bad):
    with pytest.raises(ValueError, match="precision must be one of int16, int8, exact"):
        CompileOptions(precision=bad)


@pytest.mark.parametrize("features,want", [
    ({"avx2", "fma", "f16c"}, {"int16": 16, "int8": 8, "exact": 0}),
    ({"fma", "f16c"}, {"int16": 0, "int8": 0, "exact": 0}),  # no AVX2: f32 activations
])
def test_cpu_strategy_bits(monkeypatch, features, want):
    """int16 / int8 turn on the integer dot-product kernels at that many bits where the
    target has AVX2; exact, or a target without AVX2, keeps activations f32."""
    from poot.backends.cpu.codegen import strategy_for
    from poot.compiler.target import host_cpu

    monkeypatch.delenv("POOT_CPU_INT8", raising=False)
    host = host_cpu()
    target = dataclasses.replace(host, caps=dataclasses.replace(
        host.caps, features=frozenset(features)))
    got = {p: strategy_for(target, threads=1, precision=p).dot_bits for p in PRECISIONS}
    assert got == want


def test_precision_is_part_of_the_cache_key():
    from poot.compiler.target import host_cpu
    from poot.compiler.cache import cache_key

    keys = {cache_key("graph", host_cpu(), CompileOptions(precision=p)) for p in PRECISIONS}
    assert len(keys) == len(PRECISIONS)
