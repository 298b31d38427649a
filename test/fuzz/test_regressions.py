"""Inputs the fuzzers found that broke a contract, each replayed through its fuzzer's
``one_input`` (the fuzzer's own checks) and checked directly against the typed error."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _replay(target: str, b64: str) -> None:
    pytest.importorskip("atheris", reason="the fuzzers' input decoding uses atheris "
                                          "(pip install -e \".[test]\")")
    from _harness import check

    mod = __import__(f"fuzz_{target}")
    check(mod.one_input, mod.ALLOWED, base64.b64decode(b64))


def test_chat_template_type_error_is_a_chat_template_error():
    """A message whose content is not a string, through a template that concatenates it
    (``'...' + message['content']``, SmolLM2's and Qwen's style): Jinja's TypeError escaped
    render_template untyped."""
    from poot.text.chat import ChatTemplateError, render_template

    src = "{% for m in messages %}{{ '<|im_start|>' + m['content'] }}{% endfor %}"
    for content in (True, None, 3, ["a"]):
        with pytest.raises(ChatTemplateError, match="chat template error: TypeError"):
            render_template(src, [{"role": "user", "content": content}])
    _replay("chat", "2X7M2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ")
