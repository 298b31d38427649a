"""The SPIR-V legalizations of the Vulkan code generator (which wgpu shares) on a real device:
f16 -> f32 widening without ``Float16`` and unsigned byte reads without ``Int8`` are exact for
every bit pattern; the emitted SPIR-V holds no non-finite float constant and gives every
signed-semantics op signed operand types (what naga, wgpu's front end, needs)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from poot import oracle
from poot.dialects.quant import BY_NAME
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=64, max_ops=64, max_literal_bytes=1 << 16,
                     max_owned_bytes=1 << 30)
NO_HALF = {"shaderFloat16", "storageBuffer16BitAccess", "shaderInt16"}
NO_BYTE = {"shaderInt8", "storageBuffer8BitAccess"}


def _every_f16_scale():
    """A Q8_0 table of 65536 rows, row i's scale the f16 of bits i and its 32 quants +1 and -1
    alternating: the dequantized row is (+d, -d, ...) for every f16 d (zero, subnormals,
    normals, inf, NaN), and every scale byte >= 0x80 occurs."""
    n = 1 << 16
    raw = np.zeros((n, 34), np.uint8)
    raw[:, :2] = np.arange(n, dtype=np.uint16).view(np.uint8).reshape(n, 2)
    raw[:, 2::2] = 1
    raw[:, 3::2] = 0xFF                                  # int8 -1
    b = Builder(LIMITS, name="f16_scales")
    tok = b.input("tokens", TensorType((1, n), DType.I32))
    table = b.param("table", PackedType(BY_NAME["q8_0"], (n, 32)))
    g = b.finish({"rows": b.gather(b.dequantize(table), tok)})
    with np.errstate(invalid="ignore"):             # NaN scales times +-1
        want = np.arange(n, dtype=np.uint16).view(np.float16).astype(np.float32)[:, None] * \
            np.where(np.arange(32) % 2, -1.0, 1.0).astype(np.float32)
    return g, raw.reshape(-1), np.arange(n, dtype=np.int32)[None], want


@pytest.mark.parametrize("drop", [set(), NO_HALF, NO_BYTE, NO_HALF | NO_BYTE],
                         ids=["native", "no-16-bit", "no-8-bit", "neither"])
def test_every_f16_scale_decodes_exactly(vk_device, drop):
    from poot.backends.vulkan.codegen import compile_vulkan, vulkan_target
    from test_vulkan_kernels import run_artifact

    caps = vk_device.capabilities()
    target = vulkan_target({**caps, "features": [f for f in caps["features"]
                                                 if f not in drop]})
    g, raw, tokens, want = _every_f16_scale()
    got = run_artifact(vk_device, compile_vulkan(g, target).executable, {"tokens": tokens},
                       {"table": raw})["rows"][0]
    np.testing.assert_array_equal(got, want)            # NaN == NaN here
    with np.errstate(invalid="ignore"):
        ref = oracle.evaluate(g, {"tokens": tokens}, {"table": raw})["rows"][0]
    np.testing.assert_array_equal(ref, want)             # the oracle agrees with numpy


@pytest.mark.skipif(shutil.which("spirv-dis") is None, reason="needs spirv-dis (spirv-tools)")
def test_spirv_has_finite_constants_and_signed_types_for_signed_ops(vk_device, vk_target):
    """Every kernel of the tiny Llama decode step: no OpConstant is inf/NaN (the max
    reductions start from -inf, built from its bits instead), and every signed-semantics op
    (arithmetic shift right, SMax/SMin, signed division, ...) takes and gives signed ints."""
    from model_steps import fixture_path

    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path("llama"))
    g = model.trace(StepSpec.decode(kv_capacity=16, kv_slots=1, kv_dtype=DType.F32),
                    weights.types)
    art = compile_vulkan(g, vk_target).executable
    signed_ops = ("OpShiftRightArithmetic", "OpSDiv", "OpSRem", "OpSMod", "SMax", "SMin",
                  "SAbs", "SClamp", "OpSConvert", "OpConvertSToF", "OpSLessThan",
                  "OpSGreaterThan")
    seen = 0
    for k in art.kernels:
        text = subprocess.run(["spirv-dis", "-", "--raw-id"], input=k.spirv,
                              capture_output=True, check=True).stdout.decode()
        assert not re.search(r"OpConstant %\d+ [-+]?(inf|nan|0x1p\+128)", text, re.I), k.name
        types = dict(re.findall(r"(%\d+) = (OpType\w+ ?[^\n]*)", text))
        signed = {t for t, d in types.items() if re.match(r"OpTypeInt \d+ 1", d)} | \
            {t for t, d in types.items() if re.match(r"OpTypeVector (%\d+)", d) and
             re.match(r"OpTypeInt \d+ 1", types.get(d.split()[1], ""))}
        values = dict(re.findall(r"(%\d+) = Op\w+ (%\d+)", text))     # value -> its type
        for line in text.splitlines():
            if not any(op in line for op in signed_ops) or "=" not in line:
                continue
            seen += 1
            operands = re.findall(r"%\d+", line.split("=", 1)[1])[1:]
            if "OpShiftRight" in line:
                operands = operands[:1]                    # the amount may stay unsigned
            elif "OpExtInst" in line:
                operands = operands[2:]                    # the set and nothing else
            for v in operands:
                if v in values:
                    assert values[v] in signed, f"{k.name}: {line.strip()}"
    assert seen, "the decode step should hold signed ops (gather clamps, RoPE)"
