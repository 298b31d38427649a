"""Chat templates rendered the HF transformers way, and their typed errors. No checkpoint needed."""

from __future__ import annotations

import datetime
import json

import pytest

from text_helpers import tiny_gpt2_meta

from poot.errors import PootError
from poot.text.chat import ChatTemplateError, encode_chat, render_chat, render_template
from poot.text.tokenizer import from_gguf_metadata

USER = [{"role": "user", "content": "hi"}]


def test_hf_environment_features():
    # trim_blocks + lstrip_blocks: block lines leave no newline or indentation behind.
    src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n<{{ m.content }}>\n    {% endif %}\n{% endfor %}"
    assert render_template(src, USER * 2) == "<hi>\n<hi>\n"
    # loopcontrols extension.
    src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    assert render_template(src, USER * 3) == "hi"
    # {% generation %} block (HF's assistant-mask tag) renders its body.
    assert render_template("{% generation %}x{{ messages[0].content }}{% endgeneration %}", USER) == "xhi"
    assert render_template("{{ strftime_now('%Y') }}", USER) == str(datetime.datetime.now().year)
    # Undefined names render empty (HF uses Jinja's default Undefined); tools defaults to None.
    assert render_template("[{{ nothing }}]{{ tools is none }}", USER) == "[]True"


def test_tojson_is_plain_json_dumps():
    msgs = [{"role": "user", "content": "<b>&'é"}]
    assert render_template("{{ messages[0] | tojson }}", msgs) == json.dumps(msgs[0], ensure_ascii=False)
    assert render_template("{{ messages[0] | tojson(indent=2) }}", msgs) == json.dumps(msgs[0], indent=2, ensure_ascii=False)


def test_special_token_variables_and_generation_prompt():
    tok = from_gguf_metadata(tiny_gpt2_meta(**{"tokenizer.chat_template":
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"}))
    assert render_chat(tok, USER) == "<|start|>hi<|end|>>"
    assert render_chat(tok, USER, add_generation_prompt=False) == "<|start|>hi<|end|>"
    ids = encode_chat(tok, USER)
    assert ids[0] == 1 and ids.count(1) == 1  # BOS written by the template, not added again


def test_raise_exception_surfaces_message():
    src = "{% if messages[0].role != 'system' %}{{ raise_exception('System role required!') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="System role required!") as err:
        render_template(src, USER)
    assert isinstance(err.value, PootError)


@pytest.mark.parametrize("src, messages, match", [
    ("{% for m in messages %}", USER, "syntax error at line 1"),
    ("{{ messages.append(1) }}", USER, "SecurityError"),  # immutable sandbox
    ("{{ messages[0].content.nope() }}", USER, "chat template error"),
    ("{{ messages }}", "hi", "must be a list"),
    ("{{ messages }}", [{"content": "x"}], "string 'role'"),
])
def test_template_errors_are_typed(src, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_template(src, messages)


def test_missing_template():
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(from_gguf_metadata(tiny_gpt2_meta()), USER)
