"""``poot-lower-to-cpu-kernels``: ``poot-lower-to-linalg`` with the CPU backend's matmul
strategy: a matmul reading a weight in place (``x @ transpose(W)``, W dense f32/f16/bf16 or a
dequantized Q4_0/Q4_1/Q8_0 weight) becomes the row-streaming vector kernel of
:mod:`poot.backends.cpu.gemv` (GEMV-shaped decode matmuls; prefill M in tiles of
``m-tile`` rows per decoded weight row) instead of ``linalg.matmul``; a gather of a dequantized
table decodes only the gathered rows. Everything else lowers as in ``poot-lower-to-linalg``.

Options (the CPU backend takes them from ``Target.caps``): ``cores`` (> 1: the row loop of a
kernel whose weight has at least ``parallel-min-bytes`` is an ``scf.forall``), ``m-tile``,
``dot-bits`` (8 or 16: packed weights multiply x quantized per 32-block to that many bits
with integer dot products; 0: f32 x) and ``vnni`` (1: those dot products are AVX-VNNI /
AVX512-VNNI ``vpdpbusd`` / ``vpdpwssd``; 0: AVX2's).

The CPU backend runs the same lowering itself (:func:`poot.backends.cpu.codegen.lower_graph`);
this pass is for ``poot-opt`` and the lit tests (``test/ir/poot-lower-to-cpu-kernels.mlir``, ``test/ir/poot-lower-to-cpu-kernels-integer-dot.mlir``),
registered when ``poot-opt`` imports the backends' pass modules
(:func:`poot.backends.registry.load_backend_passes`).
"""

from __future__ import annotations

from mlir import ir

from poot.backends.cpu.gemv import KERNELS
from poot.dialects.lowering import LoweringRefusal, Strategy, lower_module
from poot.passes.registry import PassFailure, register_pass


@register_pass("poot-lower-to-cpu-kernels",
               "lower poot to linalg/scf/vector with the CPU matmul kernels",
               {"cores": (int, 1, "threads a kernel's row loop may use"),
                "m-tile": (int, 2, "rows of x per decoded weight row"),
                "parallel-min-bytes": (int, 1 << 20, "smallest weight with a parallel row loop"),
                "dot-bits": (int, 0, "bits of the quantized x for packed weights (0: f32 x)"),
                "vnni": (int, 0, "1: VNNI integer dot products, 0: AVX2's"),
                "amx": (int, 0, "1: batched integer matmuls on AMX tiles (needs vnni)")})
def run(module: ir.Operation, **opts) -> None:
    strategy = Strategy(kernels=KERNELS, m_tile=opts.get("m-tile", 2), cores=opts.get("cores", 1),
                        parallel_min_bytes=opts.get("parallel-min-bytes", 1 << 20),
                        dot_bits=opts.get("dot-bits", 0), vnni=bool(opts.get("vnni", 0)),
                        amx=bool(opts.get("amx", 0)) and bool(opts.get("vnni", 0)))
    if strategy.dot_bits not in (0, 8, 16):
        raise PassFailure(f"dot-bits must be 0, 8 or 16, got {strategy.dot_bits}")
    try:
        lower_module(module, strategy)
    except LoweringRefusal as e:
        where = f"{e.location}: error: " if e.location else ""
        raise PassFailure(f"{where}{e}") from e
