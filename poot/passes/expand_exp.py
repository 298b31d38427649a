"""``poot-expand-exp``: every scalar f32 ``math.exp`` becomes straight-line arithmetic.

Why: LLVM lowers ``math.exp`` to a call of libm's ``expf``, which its loop vectorizer cannot
widen, and glibc's ``expf`` takes a slow error-reporting path (``__kernel_standard``) on
every underflow -- which SiLU's ``exp(-x)`` hits for each large activation. On the CPU
backend that made SmolLM2's gate activations and the attention softmax scalar libm calls on
the critical path of a decode step. Arithmetic vectorizes with the loop around it.

The algorithm (Cephes ``expf``, S. L. Moshier; the same range reduction as glibc's and as
MLIR's polynomial approximations):

1. ``n = roundeven(x * log2(e))``; ``r = x - n * ln2`` with ``ln2`` split in two
   (Cody-Waite: ``ln2_hi = 0.693359375`` is exact in 9 bits, so ``n * ln2_hi`` is exact),
   ``|r| <= ln2 / 2``.
2. ``e^r = 1 + r + r^2 * P(r)``, ``P`` Cephes' degree-5 minimax polynomial.
3. ``2^n`` from the float's bits (``(n + 127) << 23``), applied as two factors
   ``2^(n >> 1) * 2^(n - (n >> 1))`` so that ``n`` from -150 to 128 stays in range and
   results below ``FLT_MIN`` round gradually to subnormals as ``expf``'s do.

Edges as IEEE ``exp``: ``x > ln(FLT_MAX)`` gives +inf, ``x < ln(2^-150)`` gives +0 (so
``exp(-inf) = 0`` exactly: masked logits keep probability 0), NaN stays NaN. Accuracy over the
finite range: within 2 ulp of the correctly rounded result in the normal range
(``test/passes/test_expand_exp.py`` measures it against numpy's f64 ``exp``).

Runs on any module (the CPU backend applies it after lowering to linalg, so it sees the
``math.exp`` inside ``linalg.generic`` bodies from every rule: elementwise ``exp``, the
attention softmax, the samplers); vector and f64 ``math.exp`` are left as they are.
"""

from __future__ import annotations

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.passes.registry import register_pass

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375
LN2_LO = -2.12194440e-4
#: Cephes expf's P(r), highest degree first
POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
        1.6666665459e-1, 5.0000001201e-1)
HI = 88.72283935546875          # ln(FLT_MAX), rounded down to f32: above it, +inf
LO = -103.97208404541016        # ln(2^-150): below it the result rounds to +0


def _expand(op: ir.Operation) -> None:
    """Replace one ``math.exp %x : f32`` by the arithmetic of the module doc."""
    from mlir.dialects import arith, math as math_d

    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    x = op.operands[0]
    with ir.InsertionPoint(op), op.location:
        def c(v: float):
            return arith.constant(f32, float(v))

        def ci(v: int):
            return arith.constant(i32, int(v))

        # clamp for the reduction (NaN -> LO: the integer steps never see NaN)
        xc = arith.minnumf(arith.maxnumf(x, c(LO)), c(HI))
        n = math_d.roundeven(arith.mulf(xc, c(LOG2E)))
        # multiplies and adds as Cephes writes them (n * LN2_HI is exact, so the first
        # subtraction is too); LLVM may contract them into FMAs where the target has them
        r = arith.subf(xc, arith.mulf(n, c(LN2_HI)))
        r = arith.subf(r, arith.mulf(n, c(LN2_LO)))
        p = c(POLY[0])
        for k in POLY[1:]:
            p = arith.addf(arith.mulf(p, r), c(k))
        y = arith.addf(arith.addf(arith.mulf(arith.mulf(p, r), r), r), c(1.0))
        ni = arith.fptosi(i32, n)
        e1 = arith.shrsi(ni, ci(1))
        e2 = arith.subi(ni, e1)

        def pow2(e):
            bits = arith.shli(arith.addi(e, ci(127)), ci(23))
            return arith.bitcast(f32, bits)

        v = arith.mulf(arith.mulf(y, pow2(e1)), pow2(e2))
        v = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, c(LO)), c(0.0), v)
        v = arith.select(arith.cmpf(arith.CmpFPredicate.OGT, x, c(HI)), c(float("inf")), v)
        v = arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, v)
    op.results[0].replace_all_uses_with(v)
    op.erase()


def expand_exp(module) -> int:
    """Expand every scalar f32 ``math.exp`` under ``module``; returns how many."""
    root = module.operation if isinstance(module, ir.Module) else module
    found: list[ir.Operation] = []
    f32 = ir.F32Type.get(root.context)

    def visit(op):
        op = op.operation
        if op.name == "math.exp" and op.results[0].type == f32:
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    for op in found:
        _expand(op)
    return len(found)


@register_pass("poot-expand-exp", "scalar f32 math.exp as vectorizable polynomial arithmetic")
def run(module: ir.Operation, **_opts) -> None:
    with module.context:
        expand_exp(module)
