"""Fuzz the chat path: arbitrary chat messages (and template variables) rendered through
real chat templates in HF's Jinja sandbox, the prompt encoded, decoded and stream-decoded,
with a byte-level BPE tokenizer that spells every byte (:func:`_harness.byte_tokenizer`).

The input is either JSON (``{"messages": [...], "kwargs": {...}, "template": i}``, the
seeds' form) or raw bytes that choose messages field by field. Contract: rendering raises
only ChatTemplateError; encoding and decoding only TokenizerError (text that is not valid
Unicode, ids outside the vocabulary). Properties: ``decode(encode(text)) == text``; the
stream decoder's deltas join to ``decode(ids)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atheris  # noqa: E402

from _harness import PropertyFailed, byte_tokenizer, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.text import ChatTemplateError, StreamDecoder, TokenizerError
    from poot.text.chat import render_chat

ALLOWED = (ChatTemplateError, TokenizerError)
TOKENIZER = byte_tokenizer()

#: the server tests' template (test/driver/chat_fixture.py), a ChatML template in the style of
#: SmolLM2's and Qwen's (string concatenation, a default system turn, tools), and one using
#: HF's extras (``tojson``, ``raise_exception``, loop controls, ``{% generation %}``)
TEMPLATES = [
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}",
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{{ bos_token }}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m.role) }}{% endif %}{% if m.skip %}{% continue %}"
    "{% endif %}{% if m.role == 'assistant' %}{% generation %}{{ m.content | tojson }}"
    "{% endgeneration %}{% else %}[{{ m.role | upper }}] {{ m.content | trim }}{% endif %}"
    "{{ eos_token }}{% endfor %}{% if enable_thinking is defined and enable_thinking %}<think>"
    "{% endif %}",
]
ROLES = ["system", "user", "assistant", "tool", "developer"]



def _value(fdp, depth: int = 0):
    """A JSON-like value of any kind (the template sees whatever the caller passes)."""
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 2 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(4)
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return _text(fdp)
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if kind == 6:
        return {"type": "text", "text": _text(fdp)}
    return {_text(fdp, 8): _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def _text(fdp, n: int = 48) -> str:
    if fdp.ConsumeProbability() < 0.1:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, n))     # may hold lone surrogates
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, n))


def _from_bytes(data: bytes) -> dict:
    fdp = atheris.FuzzedDataProvider(data)
    messages = []
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        m = {"role": ROLES[fdp.ConsumeIntInRange(0, len(ROLES) - 1)]
             if fdp.ConsumeProbability() < 0.9 else _value(fdp),
             "content": _text(fdp) if fdp.ConsumeProbability() < 0.8 else _value(fdp)}
        for _ in range(fdp.ConsumeIntInRange(0, 2)):
            m[_text(fdp, 8)] = _value(fdp)
        messages.append(m)
    kwargs = {"enable_thinking": _value(fdp)} if fdp.ConsumeBool() else {}
    return {"messages": messages, "kwargs": kwargs,
            "template": fdp.ConsumeIntInRange(0, len(TEMPLATES) - 1),
            "add_generation_prompt": fdp.ConsumeBool(),
            "ids": [fdp.ConsumeIntInRange(-1, TOKENIZER.vocab_size) for _ in
                    range(fdp.ConsumeIntInRange(0, 8))]}


def _case(data: bytes) -> dict:
    try:
        case = json.loads(data)
    except (ValueError, RecursionError):
        return _from_bytes(data)
    return case if isinstance(case, dict) else {"messages": case}


def one_input(data: bytes) -> None:
    case = _case(data)
    kwargs = case.get("kwargs")
    kwargs = {k: v for k, v in kwargs.items() if isinstance(k, str) and k.isidentifier()
              and k not in ("messages", "add_generation_prompt", "template")} \
        if isinstance(kwargs, dict) else {}
    template = TEMPLATES[case.get("template", 0) % len(TEMPLATES)] \
        if isinstance(case.get("template"), int) else TEMPLATES[0]
    try:
        text = render_chat(TOKENIZER, case.get("messages"), template=template,
                           add_generation_prompt=bool(case.get("add_generation_prompt")),
                           **kwargs)
    except ChatTemplateError:
        text = json.dumps(case.get("messages"), ensure_ascii=False)
    if not isinstance(text, str):
        raise PropertyFailed(f"render_chat returned {type(text).__name__}")
    ids = case.get("ids") if isinstance(case.get("ids"), list) else []
    try:
        TOKENIZER.decode(ids)
    except TokenizerError:
        pass
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    back = TOKENIZER.decode(ids)
    if back != text:
        raise PropertyFailed(f"decode(encode({text!r})) = {back!r}")
    sd = StreamDecoder(TOKENIZER)
    streamed = "".join(sd.push(i) for i in ids) + sd.finish()
    if streamed != back:
        raise PropertyFailed(f"stream of {ids} = {streamed!r}, decode = {back!r}")


if __name__ == "__main__":
    main(one_input, ALLOWED)
