"""How SmolLM2 outputs are compared with HF transformers' reference
(test/reference/smollm2): the near-tie margins per compile precision."""

from __future__ import annotations

#: A reference step whose top-1/top-2 logit margin is below this may legitimately flip, by
#: :attr:`poot.compiler.CompileOptions.precision`. exact (f32 activations) matches the
#: reference's logits within 1e-4, so only true ties flip. int16 (the default: int16
#: activations for the packed matmuls) stays within 0.02 of them. int8 (int8 activations for the
#: packed matmuls, llama.cpp's scheme) moves logits by up to about 1 (mean 0.1-0.26 on the
#: reference prompts); teacher-forced, it flipped 4 of the 160 reference steps, at margins
#: 0.009, 0.027, 0.092 and 0.259.
NEAR_TIE = {"exact": 0.01, "int16": 0.02, "int8": 0.3}


def agreeing_prefix(ref: dict, precision: str = "int16") -> int:
    """How many leading generated tokens must equal ``ref["generated_ids"]``: those before
    the first near-tie step (the default precision: ``int16``)."""
    return next((i for i, s in enumerate(ref["steps"])
                 if s["top1_minus_top2"] < NEAR_TIE[precision]), len(ref["steps"]))
