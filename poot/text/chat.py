"""Chat templates: a checkpoint's Jinja template rendered the way HF transformers does.

Source of the conventions: transformers ``utils/chat_template_utils.py``
(``_compile_jinja_template`` / ``render_jinja_template``): an
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the
``loopcontrols`` extension and a ``{% generation %}`` block tag; a ``tojson`` filter that is
plain ``json.dumps`` (no HTML escaping, ``ensure_ascii=False``, optional ``indent``,
``separators``, ``sort_keys``); globals ``raise_exception(msg)`` and ``strftime_now(fmt)``;
variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the special
token strings (``bos_token``, ``eos_token``, ...). The rendered prompt already holds its special
tokens, so it is encoded with ``add_special_tokens=False`` (as ``apply_chat_template`` does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from poot.errors import PootError
from poot.text.tokenizer import Tokenizer


class ChatTemplateError(PootError):
    """A chat template that cannot be compiled or rendered, or bad chat messages.

    ``raise_exception("...")`` inside a template surfaces here with the template's message.
    """


class _TemplateRaised(jinja2.TemplateError):
    """What ``raise_exception`` throws inside the sandbox (a TemplateError, as in HF)."""


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body unchanged (HF marks the
    assistant span with it for training masks; inference needs only the text)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF overrides Jinja's tojson, which HTML-escapes '<', '>', '&' and "'".
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile template ``source`` in HF's sandboxed environment (cached by source).

    Raises:
        ChatTemplateError: a Jinja syntax error, with its line number.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e


def _check_messages(messages: Any) -> list[Mapping[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatTemplateError(f"chat messages must be a list of {{role, content}} objects, got {type(messages).__name__}")
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"chat message {k} must be an object with a string 'role'")
    return list(messages)


def render_template(source: str, messages: Sequence[Mapping[str, Any]], *,
                    add_generation_prompt: bool = False, tools: list[dict] | None = None,
                    special_tokens: Mapping[str, str] | None = None, **kwargs: Any) -> str:
    """Render chat template ``source`` for ``messages`` with HF's variables.

    ``special_tokens`` supplies ``bos_token``, ``eos_token``, ... ; ``kwargs`` are extra
    template variables (HF's ``chat_template_kwargs``, e.g. ``enable_thinking``).

    Raises:
        ChatTemplateError: bad messages, a syntax error, ``raise_exception`` (its message), or
            any other error while rendering (a Jinja error, or e.g. a TypeError of an
            expression such as ``'x' + content`` when content is not a string).
    """
    template = compile_template(source)
    variables = {**(special_tokens or {}), **kwargs}
    try:
        return template.render(messages=_check_messages(messages), tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **variables)
    except _TemplateRaised as e:
        raise ChatTemplateError(f"chat template raised: {e.message}") from e
    except Exception as e:  # noqa: BLE001
        # The template is a program from the checkpoint run on the caller's data: whatever it
        # raises (Jinja's undefined attribute or sandbox security; Python's TypeError for
        # ``'...' + content`` when content is not a string, ValueError, ...) is its error.
        raise ChatTemplateError(f"chat template error: {type(e).__name__}: {e}") from e


def render_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, template: str | None = None, **kwargs: Any) -> str:
    """Render ``messages`` with the checkpoint's template (or ``template``) to prompt text.

    Raises:
        ChatTemplateError: the checkpoint has no chat template and none was given; see
            :func:`render_template`.
    """
    source = template if template is not None else tokenizer.chat_template
    if source is None:
        raise ChatTemplateError(f"{tokenizer.source}: the checkpoint has no chat template "
                                "(GGUF 'tokenizer.chat_template' / HF 'chat_template')")
    return render_template(source, messages, add_generation_prompt=add_generation_prompt,
                           special_tokens=tokenizer.special_tokens, **kwargs)


def encode_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
    """Prompt ids for ``messages``: rendered text encoded without adding BOS/EOS again."""
    text = render_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def stop_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids that end a generated turn (see :attr:`Tokenizer.stop_ids` for the sources)."""
    return tokenizer.stop_ids
