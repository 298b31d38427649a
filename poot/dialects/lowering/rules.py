"""The table of lowering rules (op mnemonic -> rule), what a rule is given, and the refusal
it raises for an op it cannot express."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from poot.dialects.types import PootType
from poot.errors import PootError


class LoweringRefusal(PootError):
    """An op the linalg lowering cannot express.

    Attributes:
        op: the op name (``poot.dequantize``); capability: what is missing (``in-kernel
        decoding of packed format q4_k``); location: the op's location text, when known.
    """

    def __init__(self, op: str, capability: str, location: str = ""):
        self.op, self.capability, self.location = op, capability, location
        super().__init__(f"'{op}' op cannot be lowered to linalg: {capability}")


@dataclass
class OpInfo:
    """One poot op, as a rule sees it.

    Attributes:
        name: the mnemonic (``binary``); attrs: Python attribute values (by the op's slots);
        args: SSA names of the lowered operands; types: operand types; result: result type;
        location: the op's location text (for refusals).
    """

    name: str
    attrs: dict[str, Any]
    args: list[str]
    types: list[PootType]
    result: PootType
    location: str = ""
    # the OpInfo of the poot op defining each operand (None: a function argument, a weight,
    # a call result); lets a rule look through prologues (a matmul reading a dequantized,
    # transposed weight in place)
    producers: list = None  # type: ignore[assignment]
    # how this op is lowered for its target (None: the portable linalg rules only)
    strategy: "Strategy | None" = None

    def producer(self, i: int) -> "OpInfo | None":
        return self.producers[i] if self.producers else None

    def refuse(self, capability: str):
        raise LoweringRefusal(f"poot.{self.name}", capability, self.location)


class MatmulKernels(Protocol):
    """A backend's kernels for the matmuls that read a weight in place, which the contraction
    rules try before their portable lowering (the backend puts them in its
    :class:`Strategy`). Each returns the SSA name of what it emitted, or None, having
    emitted nothing, when it does not take the op."""

    def matmul(self, em: Any, op: OpInfo) -> str | None:
        """``poot.matmul`` ``x[M, K] @ transpose(W)``: the f32 ``tensor<MxN>`` accumulator."""

    def indexed_matmul(self, em: Any, op: OpInfo, weight: tuple) -> str | None:
        """``poot.indexed_matmul`` whose w reads ``weight`` = (ssa, type, producer) in place:
        its result."""

    def declarations(self, text: str) -> str:
        """Declarations of the functions the kernels in ``text`` call (MLIR text)."""


@dataclass(frozen=True)
class Strategy:
    """Target-chosen lowering strategies (the CPU backend fills it from ``Target.caps``).

    Attributes:
        kernels: the target's own kernels for matmuls that read a weight in place
            (:class:`MatmulKernels`; the CPU backend's row-streaming GEMV,
            :mod:`poot.backends.cpu.gemv`, for W dense f32/f16/bf16 or a dequantized Q4_0 /
            Q4_1 / Q8_0 block format); None: ``linalg.matmul`` and ``linalg.generic``.
        m_tile: rows of x computed together against one decoded row of W.
        parallel_min_bytes: a kernel whose weight is at least this big runs its rows as an
            ``scf.forall`` (threads); smaller ones as a sequential loop. 64 KiB, so that
            SmolLM2's 192-row K/V projections (69 KB) use both cores: in the decode step
            they otherwise run while the other core waits; alone, with hot caches, the
            fork/join neither gains nor loses at that size.
        cores: threads the kernels may use (1: never ``scf.forall``).
        dot_bits: 0 (f32 x), or packed weights (Q4_0/Q4_1/Q8_0) are multiplied by x
            quantized per 32-element block to ``dot_bits`` signed bits with integer dot
            products: 8 is llama.cpp's scheme (AVX2 ``pmaddubsw``/``pmaddwd``; results differ
            from the f32 oracle by ~1e-2 relative), 16 keeps x to 1/65534 of each block's
            largest |x| (``pmaddwd`` on weights widened to i16). 0 here;
            :func:`poot.backends.cpu.codegen.strategy_for` sets it from
            :attr:`~poot.compiler.CompileOptions.precision`.
        vnni: the integer dot products use ``vpdpbusd`` / ``vpdpwssd`` (AVX-VNNI or
            AVX512-VNNI) instead of AVX2's ``pmaddubsw`` + ``pmaddwd`` / ``pmaddwd`` + add
            (same results: no i16 step can saturate).
        amx: batched integer matmuls (M >= 2) multiply on AMX tiles
            (:mod:`poot.backends.cpu.amx`): the same exact integer block sums as ``vnni``'s,
            so the same results, bit for bit.
        n_tile: W rows one integer-kernel decode (M = 1) tile computes together, each with its own
            accumulator (their FMA chains overlap). 1: a tile reads one row, so each thread
            streams its rows as one sequential run. Rows interleaved in a tile (4) compute
            faster from cache (a 1536x576 Q4_1 GEMV: 17 vs 27 us here) but defeat the
            hardware prefetcher when the weights come from DRAM, as a decode step's do: on a
            2-core Zen 4 VM a 122 MB Q8_0 matrix streamed at 8.6 GB/s with 4-row tiles and
            33 GB/s with 1, and SmolLM2 Q4_1's decode step took 9.5-11.1 vs 6.1-6.7 ms.
    """

    kernels: "MatmulKernels | None" = None
    m_tile: int = 2
    parallel_min_bytes: int = 64 << 10
    cores: int = 1
    dot_bits: int = 0
    vnni: bool = False
    amx: bool = False
    n_tile: int = 1


Rule = Callable[..., str]
RULES: dict[str, Rule] = {}


def rule(name: str):
    """Decorator registering ``fn(em: Emitter, op: OpInfo) -> ssa name`` for ``poot.<name>``."""

    def deco(fn: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"two lowering rules for poot.{name}")
        RULES[name] = fn
        return fn

    return deco
