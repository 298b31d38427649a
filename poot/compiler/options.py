"""Compile options and the finite limits one compile may construct."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompileLimits:
    """Bounds on what one compile builds. Every field is finite and positive; there is no
    unlimited setting. :data:`CompileLimits.STANDARD` is the production policy.

    Attributes:
        max_graph_ops: ops in any graph a pass produces (the input included).
        max_kernel_ops: ops in the body of one dispatch region (one kernel).
        max_artifact_bytes: bytes of one compiled artifact (lowered module text or binary).
    """

    max_graph_ops: int
    max_kernel_ops: int
    max_artifact_bytes: int

    def __post_init__(self):
        for k, v in self.__dict__.items():
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"CompileLimits.{k} must be a positive int, got {v!r}")


CompileLimits.STANDARD = CompileLimits(max_graph_ops=1_000_000, max_kernel_ops=20_000,
                                       max_artifact_bytes=512 << 20)


@dataclass(frozen=True)
class CompileOptions:
    """How to compile.

    Attributes:
        limits: the :class:`CompileLimits`.
        fuse: form dispatch regions (pointwise/reduction/matmul-epilogue fusion).
        flash_attention: rewrite attention compositions into the fused attention op.
        opt_level: LLVM optimization level for host code.
        disable: pass arguments to leave out of the pipeline (for experiments and tests).
        precision: how a backend may multiply packed weights (Q4_0, Q4_1, Q8_0) by
            activations. ``"int16"`` (default): activations quantized to int16 per
            32-element block, multiplied with integer dot products (the CPU backend's
            ``vpdpwssd`` / ``pmaddwd`` kernels); SmolLM2's logits stay within ~1e-2 of f32.
            ``"int8"``: quantized to int8 per block, llama.cpp's Q8 scheme (``vpdpbusd`` /
            ``pmaddubsw``): faster, but logits move by up to ~1, which flips greedy tokens
            whose margin is below that. ``"exact"`` keeps activations in f32, so results
            equal the oracle up to summation order. Backends without such kernels compute
            the same either way. Tolerances: ``test/e2e/test_smollm2_logits_cpu.py``.
    """

    limits: CompileLimits = CompileLimits.STANDARD
    fuse: bool = True
    flash_attention: bool = True
    opt_level: int = 2
    disable: frozenset[str] = field(default_factory=frozenset)
    precision: str = "int16"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"CompileOptions.precision must be one of {', '.join(PRECISIONS)}, "
                             f"got {self.precision!r}")


#: the values of :attr:`CompileOptions.precision`
PRECISIONS = ("int16", "int8", "exact")
