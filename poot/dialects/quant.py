"""Packed (block-quantized) weight formats: one typed descriptor per format.

The same :class:`QuantFormat` objects are used by the loader (to size and slice stored
tensors), by the IR (``!poot.packed<#poot.q4_1, array<i64: rows, cols>>``) and by the planner
(to pick in-kernel dequantization). Layouts follow ggml's ``ggml-common.h`` block structs
(llama.cpp): a tensor of logical shape ``[rows, cols]`` is stored row-major as
``rows * cols / block_elems`` blocks of ``block_bytes`` bytes; ``cols`` must be a multiple of
``block_elems``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class QuantFormat:
    """A packed block format.

    Attributes:
        name: the IR mnemonic (``q4_0`` ...), also the IRDL attribute name ``#poot.<name>``.
        ggml_type: the GGML tensor type id stored in GGUF tensor infos.
        block_elems: logical elements per block.
        block_bytes: stored bytes per block.
        rows: W rows whose blocks are interleaved (:mod:`poot.dialects.quant_layout`): 1 for
            ggml's own layouts; 16 for a row-interleaved layout of ``base``.
        base: the ggml format whose blocks a row-interleaved format regroups (None for ggml's
            own formats).
    """

    name: str
    ggml_type: int
    block_elems: int
    block_bytes: int
    rows: int = 1
    base: str | None = None

    def packed_bytes(self, shape: tuple[int, ...]) -> int:
        """Stored bytes of a tensor of logical ``shape``; raises ValueError if the innermost
        dimension is not a multiple of the block size."""
        if not shape or shape[-1] % self.block_elems:
            raise ValueError(
                f"{self.name}: innermost dimension of {list(shape)} is not a multiple of "
                f"{self.block_elems}")
        n = 1
        for d in shape:
            n *= d
        return n // self.block_elems * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block_elems

    def __str__(self) -> str:
        return self.name


class Quant(enum.Enum):
    """The packed formats poot knows, by name. ``Quant.Q4_1.value`` is the descriptor."""

    Q4_0 = QuantFormat("q4_0", 2, 32, 18)
    Q4_1 = QuantFormat("q4_1", 3, 32, 20)
    Q5_0 = QuantFormat("q5_0", 6, 32, 22)
    Q5_1 = QuantFormat("q5_1", 7, 32, 24)
    Q8_0 = QuantFormat("q8_0", 8, 32, 34)
    Q4_K = QuantFormat("q4_k", 12, 256, 144)
    Q5_K = QuantFormat("q5_k", 13, 256, 176)
    Q6_K = QuantFormat("q6_k", 14, 256, 210)


#: row-interleaved layouts of ggml formats (:mod:`poot.dialects.quant_layout`): the same
#: blocks, regrouped by tiles of 16 rows at load time for the CPU's integer kernels; never
#: in a file (ggml_type -1), chosen by a target's storage rule
#: (:attr:`poot.compiler.target.Capabilities.packed_layouts`)
ROW_INTERLEAVED: tuple[QuantFormat, ...] = tuple(
    QuantFormat(f"{q.value.name}_r16", -1, 32, q.value.block_bytes, 16, q.value.name)
    for q in (Quant.Q4_0, Quant.Q4_1, Quant.Q8_0))

#: ggml's formats (what a file may hold)
FORMATS: tuple[QuantFormat, ...] = tuple(q.value for q in Quant)
#: every format the IR may name: ggml's and their row-interleaved layouts
ALL_FORMATS: tuple[QuantFormat, ...] = FORMATS + ROW_INTERLEAVED
BY_NAME: dict[str, QuantFormat] = {f.name: f for f in ALL_FORMATS}
BY_GGML_TYPE: dict[int, QuantFormat] = {f.ggml_type: f for f in FORMATS}
#: the names of ggml's formats: what a target without row-interleaved kernels decodes
GGML_NAMES: frozenset[str] = frozenset(f.name for f in FORMATS)
