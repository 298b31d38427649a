"""OpenAI requests -> prompt token ids and :class:`~poot.sampling_params.SamplingParams`.

Everything a request needs checked before it reaches the engine happens here, each failure a
400 naming the field: the model name (404), parameters this server does not implement
(``suffix``, ``best_of`` other than ``n``, ``tools`` on completions), the guided-decoding
constraint (``response_format``, ``guided_*``: malformed, conflicting, or one llguidance
cannot honor), a chat request's tools (:mod:`poot.serve.tools`), the chat template,
token ids, ``n`` and the number of prompts, the prompt length, prompt + ``max_tokens``
against the context (both numbers in the message), and every sampling range
(:class:`SamplingParams` and the engine's own check).

:func:`guided_from` is the one place the request's guided-decoding constraint is made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from poot.engine import ContextOverflow, KVCapacityExceeded
from poot.sampling_params import (GUIDE_KINDS, MAX_STOP_CHARS, Guide, GuidedDecodingError,
                                  InvalidRequest, SamplingParams)
from poot.serve.config import ServeConfig
from poot.serve.errors import APIError, NOT_FOUND, bad_request
from poot.serve.protocol import (MAX_STOP_STRINGS, ChatCompletionRequest, ChatMessage,
                                 CompletionRequest)
from poot.serve.tools import (ToolRequest, allow_thought, output_parser, reasoning_on,
                              tool_guide, tool_request)
from poot.text.chat import ChatTemplateError, render_chat
from poot.text.tool_calls import OutputParser, prompt_opens_thought
from poot.text.tokenizer import TokenizerError

_SEED_MOD = 2 ** 64
#: vLLM's constraint fields (at most one per request, or ``response_format``)
_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
#: ``guided_decoding_backend`` values accepted: every one means "honor the constraint", which
#: this server does with llguidance (the output's constraint is the same whichever is named)
_GUIDED_BACKENDS = {"auto", "guidance", "llguidance", "xgrammar", "outlines",
                    "lm-format-enforcer"}
_MAX_CHOICES = 4096
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
_RESERVED_TEMPLATE_VARS = {"messages", "tools", "documents", "add_generation_prompt",
                           "special_tokens", "template"}


@dataclass
class Plan:
    """A checked generation request: per prompt its token ids, per choice its parameters
    (``params[p * n + j]`` is choice ``j`` of prompt ``p``)."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    n: int
    #: the request field that carried the guided-decoding constraint (None without one)
    guided_field: str | None = None
    #: the LoRA adapter ``model`` named (None: the base model)
    lora: str | None = None
    #: how a chat answer is split into content, reasoning and tool calls (None: the text
    #: is the content)
    output: OutputParser | None = None

    @property
    def choices(self) -> int:
        """Sequences the request runs."""
        return len(self.params)


def check_model(name: str | None, config: ServeConfig, required: bool = True,
                adapters=()) -> None:
    """404 unless ``name`` is the served model or one of the loaded LoRA ``adapters`` (None
    is accepted where not required)."""
    if name is None and not required:
        return
    if name != config.served_model_name and name not in adapters:
        raise APIError(404, f"The model `{name}` does not exist (this server serves "
                       f"`{config.served_model_name}`)", NOT_FOUND, "model",
                       "model_not_found")


def _choice_regex(choices: list[str]) -> str:
    """A regex (Rust syntax, llguidance's) matching exactly one of ``choices``: meta
    characters escaped, control characters as ``\\x{..}``."""
    def esc(c: str) -> str:
        if c in _REGEX_META:
            return "\\" + c
        return c if c.isprintable() else f"\\x{{{ord(c):x}}}"

    return "(" + "|".join("".join(esc(c) for c in choice) for choice in choices) + ")"


def _json_guide(field: str, schema: Any, whitespace: str | None):
    """A JSON-schema guide of ``schema`` (a JSON object or its text); ``whitespace``: vLLM's
    ``guided_whitespace_pattern``, llguidance's ``whitespace_pattern`` option."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise bad_request(field, f"'{field}' is not valid JSON ({e.msg} at {e.pos})") \
                from None
    if not isinstance(schema, dict):
        raise bad_request(field, f"'{field}' must be a JSON schema (an object)")
    if whitespace is not None:
        if not isinstance(schema.get("x-guidance", {}), dict):
            raise bad_request(field, "the schema's 'x-guidance' must be an object")
        schema = dict(schema)
        schema["x-guidance"] = {**schema.get("x-guidance", {}),
                                "whitespace_pattern": whitespace}
    return Guide("json_schema", schema)


def guided_from(req: ChatCompletionRequest | CompletionRequest):
    """The request's guided-decoding constraint and the field that carried it: ``(Guide,
    field)``, or ``(None, None)``. OpenAI's ``response_format`` (``json_object``;
    ``json_schema`` with ``json_schema.schema``) or one of vLLM's ``guided_json`` (a schema,
    or its JSON text), ``guided_regex``, ``guided_choice`` (a list of strings: the output is
    exactly one of them) and ``guided_grammar`` (Lark, or GBNF when it uses ``::=``).
    ``guided_whitespace_pattern`` bounds the whitespace of a JSON constraint. Every malformed
    or conflicting field is a 400 naming it; a constraint that parses but that llguidance
    cannot honor is refused later (:func:`_engine_check`), also naming the field."""
    found: list[tuple[str, Any]] = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        found.append(("response_format", rf))
    for name in _GUIDED_FIELDS:
        if getattr(req, name) is not None:
            found.append((name, getattr(req, name)))
    backend = req.guided_decoding_backend
    if backend is not None and (not isinstance(backend, str)
                                or backend not in _GUIDED_BACKENDS):
        raise bad_request("guided_decoding_backend", f"unknown guided decoding backend "
                          f"{str(backend)[:40]!r}: this server constrains with llguidance "
                          f"(accepted: {', '.join(sorted(_GUIDED_BACKENDS))})")
    ws = req.guided_whitespace_pattern
    if ws is not None and not isinstance(ws, str):
        raise bad_request("guided_whitespace_pattern", "must be a string (a regex)")
    if not found:
        if ws is not None:
            raise bad_request("guided_whitespace_pattern", "needs a JSON constraint "
                              "(response_format or guided_json)")
        return None, None
    if len(found) > 1:
        raise bad_request(found[1][0], f"one constraint per request: '{found[0][0]}' and "
                          f"'{found[1][0]}' both given")
    field, value = found[0]
    if ws is not None and field not in ("response_format", "guided_json"):
        raise bad_request("guided_whitespace_pattern", f"applies to JSON constraints, not "
                          f"'{field}'")
    try:
        if field == "response_format":
            if value.type == "json_object":
                return _json_guide(field, {"type": "object"}, ws), field
            js = value.json_schema
            if js is None or "schema" not in js:
                raise bad_request("response_format.json_schema", "a json_schema response "
                                  "format needs json_schema.schema (the JSON schema)")
            return _json_guide("response_format.json_schema.schema", js["schema"], ws), \
                "response_format.json_schema.schema"
        if field == "guided_json":
            return _json_guide(field, value, ws), field
        if field == "guided_choice":
            if not isinstance(value, list) or not value or \
                    not all(isinstance(c, str) and c for c in value):
                raise bad_request(field, "'guided_choice' must be a non-empty list of "
                                  "non-empty strings")
            if len(value) > _MAX_CHOICES:
                raise bad_request(field, f"{len(value)} choices; at most {_MAX_CHOICES}")
            return Guide.regex(_choice_regex(value)), field
        if not isinstance(value, str) or not value:
            raise bad_request(field, f"'{field}' must be a non-empty string")
        return (Guide.regex(value) if field == "guided_regex" else Guide.grammar(value)), field
    except GuidedDecodingError as e:
        raise bad_request(field, f"invalid '{field}': {e.reason}", "invalid_guided_decoding") \
            from None


def _guided_rename(field: str | None) -> dict[str, str]:
    """Error field names of a guided request's constraint -> the request ``field`` carrying
    it (none without a constraint)."""
    if field is None:
        return {}

    return {k: field for k in (*GUIDE_KINDS, "guided")}


def _unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options", "stream_options is only allowed when stream is "
                          "true")
    if isinstance(req, CompletionRequest):
        if req.tools:
            raise bad_request("tools", "tools are for /v1/chat/completions",
                              "unsupported_parameter")
        if req.tool_choice not in (None, "none"):
            raise bad_request("tool_choice", "tool_choice is for /v1/chat/completions",
                              "unsupported_parameter")
        if req.suffix:
            raise bad_request("suffix", "suffix (insertion) is not supported by this server",
                              "unsupported_parameter")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request("best_of", f"best_of must equal n ({req.n}) on this server: "
                              f"it returns every sample it generates",
                              "unsupported_parameter")


def _stops(req) -> list[str]:
    stop = req.stop
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else list(stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request("stop", f"at most {MAX_STOP_STRINGS} stop strings")
    for s in stop:
        if not s:
            raise bad_request("stop", "stop strings must not be empty")
    total = sum(len(s) for s in stop)
    if total > MAX_STOP_CHARS:
        raise bad_request("stop", f"the stop strings total {total} characters; this server "
                          f"allows at most {MAX_STOP_CHARS} in one request")
    return stop


def _base_params(req, logprobs: int | None) -> tuple[dict[str, Any], str | None]:
    """The :class:`SamplingParams` fields of a request (OpenAI's defaults where absent), and
    the request field that carried its guided-decoding constraint (:func:`guided_from`; None
    without one)."""
    kw: dict[str, Any] = dict(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None or req.top_k < 0 else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=dict(req.logit_bias or {}),
        stop=_stops(req),
        stop_token_ids=list(req.stop_token_ids or []),
        logprobs=logprobs,
        ignore_eos=req.ignore_eos,
    )
    guide, field = guided_from(req)
    if guide is not None:
        kw["guided"] = guide
    return kw, field


def _params(kw: dict[str, Any], seed: int | None, max_tokens: int, n: int,
            rename: dict[str, str]) -> list[SamplingParams]:
    """``n`` parameter sets; choice ``j`` of a seeded request draws from ``seed + j`` (so the
    samples differ and each is reproducible)."""
    out = []
    for j in range(n):
        s = None if seed is None else (seed + j) % _SEED_MOD
        try:
            out.append(SamplingParams(seed=s, max_tokens=max_tokens, **kw))
        except InvalidRequest as e:
            raise bad_request(rename.get(e.field, e.field), f"invalid value for "
                              f"'{rename.get(e.field, e.field)}' ({e.value!r}): {e.reason}") \
                from None
    return out


def _context_error(prompt: int, max_tokens: int, capacity: int, param: str,
                   what: str) -> APIError:
    return bad_request(param, f"This model's maximum context length is {capacity} tokens. "
                       f"However, you requested {prompt + max_tokens} tokens ({prompt} in "
                       f"the {what}, {max_tokens} in the completion). Please reduce the "
                       f"length of the {what} or the completion.", "context_length_exceeded")


def _check_prompt_len(ids: list[int], config: ServeConfig, capacity: int, param: str,
                      what: str) -> None:
    if not ids:
        raise bad_request(param, f"the {what} has no tokens")
    limit = config.max_prompt_tokens
    if limit is not None and len(ids) > limit:
        raise bad_request(param, f"the {what} is {len(ids)} tokens, more than this server's "
                          f"limit of {limit} prompt tokens", "prompt_too_long")
    if len(ids) >= capacity:
        raise _context_error(len(ids), 1, capacity, param, what)


def _engine_check(engine, ids: list[int], params: SamplingParams, param_prompt: str,
                  what: str, rename: dict[str, str], max_param: str) -> None:
    """The engine's own check (vocabulary, context, KV pool) as 400s."""
    try:
        engine.check_request(ids, params)
    except ContextOverflow as e:
        raise _context_error(e.prompt_tokens, e.max_tokens, e.capacity, max_param, what) \
            from None
    except KVCapacityExceeded as e:
        raise bad_request(max_param, f"the request needs {e.needed_blocks} KV blocks "
                          f"({e.tokens} tokens: prompt + max_tokens) but the KV pool holds "
                          f"{e.pool_blocks}; lower {max_param}", "kv_capacity_exceeded") \
            from None
    except InvalidRequest as e:
        field = param_prompt if e.field == "prompt" else rename.get(e.field, e.field)
        raise bad_request(field, f"invalid value for '{field}' ({e.value!r}): {e.reason}") \
            from None


def _check_n(n: int, prompts: int, config: ServeConfig) -> None:
    if n > config.max_n:
        raise bad_request("n", f"n is {n}; this server allows at most {config.max_n}")
    if prompts > config.max_n:
        raise bad_request("prompt", f"{prompts} prompts; this server allows at most "
                          f"{config.max_n} in one request")
    if n * prompts > config.max_n:
        raise bad_request("n", f"{prompts} prompts x n={n} = {n * prompts} sequences; this "
                          f"server allows at most {config.max_n} in one request")


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template sees them (content parts joined into one string)."""
    out = []
    for m in messages:
        d = m.model_dump(exclude_none=True)
        d["content"] = m.text()
        out.append(d)
    return out


def _lone_surrogate(value: Any, param: str) -> tuple[str, str] | None:
    """The first string in ``value`` (a JSON value) that is not valid Unicode -- it holds a
    lone UTF-16 surrogate, a ``"\\udXXX"`` escape without its pair -- as ``(param path,
    message)``; None when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return param, (f"'{param}' is not valid Unicode: a lone surrogate "
                           f"U+{ord(value[e.start]):04X} at character {e.start}")
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _lone_surrogate(k, param) or _lone_surrogate(v, f"{param}.{k}")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _lone_surrogate(v, f"{param}[{i}]")
            if found:
                return found
    return None


def _check_unicode(messages: list[ChatMessage]) -> None:
    """A 400 naming the first field of ``messages`` that holds a lone surrogate (text the
    tokenizer cannot encode): ``messages[1].content``, ``messages[0].content[2].text``..."""
    for i, m in enumerate(messages):
        found = _lone_surrogate(m.model_dump(exclude_none=True), f"messages[{i}]")
        if found:
            raise bad_request(found[0], found[1], "invalid_unicode")


def encode_chat(handle, messages: list[ChatMessage], add_generation_prompt: bool,
                template_kwargs: dict[str, Any] | None) -> list[int]:
    """Prompt ids of chat ``messages`` through the model's chat template (400 naming
    ``messages`` when there is no template or it refuses them)."""
    text = render_prompt(handle, messages, add_generation_prompt, template_kwargs)
    return _encode_prompt(handle, text, template_kwargs)


def _encode_prompt(handle, text: str, template_kwargs: dict[str, Any] | None) -> list[int]:
    """Ids of a rendered prompt (special tokens already in it); a 400 for text the
    tokenizer refuses (from the template's own text or ``chat_template_kwargs``)."""
    try:
        return handle.tokenizer.encode(text, add_special_tokens=False)
    except TokenizerError as e:
        raise bad_request("chat_template_kwargs" if template_kwargs else "messages", str(e),
                          "invalid_unicode") from None


def render_prompt(handle, messages: list[ChatMessage], add_generation_prompt: bool,
                  template_kwargs: dict[str, Any] | None, tools: ToolRequest | None = None) \
        -> str:
    """Prompt text of chat ``messages`` through the model's chat template; ``tools``: the
    request's tools (the template gets them as ``tools``, and earlier calls and results in
    the tool-call format's form). 400 naming ``messages`` when there is no template or it
    refuses them, ``chat_template_kwargs`` when they are bad."""
    if handle.tokenizer is None:
        raise bad_request("messages", "this model has no tokenizer: use /v1/completions with "
                          "token ids")
    kwargs = dict(template_kwargs or {})
    bad = sorted(set(kwargs) & _RESERVED_TEMPLATE_VARS)
    if bad:
        raise bad_request("chat_template_kwargs", f"'{bad[0]}' is set by the server")
    _check_unicode(messages)
    msgs = chat_messages(messages)
    if tools is not None:
        msgs = tools.messages(msgs)
        kwargs["tools"] = tools.template_tools
    try:
        return render_chat(handle.tokenizer, msgs, add_generation_prompt=add_generation_prompt,
                           **kwargs)
    except TokenizerError as e:     # the template's own text or chat_template_kwargs
        raise bad_request("chat_template_kwargs" if kwargs else "messages", str(e),
                          "invalid_unicode") from None
    except ChatTemplateError as e:
        raise bad_request("messages", str(e), "chat_template_error") from None
    except (TypeError, ValueError) as e:  # a template variable of the wrong kind
        raise bad_request("messages", f"the chat template cannot render these messages: {e}",
                          "chat_template_error") from None


def chat_plan(handle, req: ChatCompletionRequest, config: ServeConfig) -> Plan:
    """Check a chat request and make its :class:`Plan` (runs the chat template: call it
    off the event loop). ``model`` may name a loaded LoRA adapter."""
    adapters = _adapters(handle)
    check_model(req.model, config, adapters=adapters)
    _unsupported(req)
    _check_n(req.n, 1, config)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs", "top_logprobs needs logprobs set to true")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    kw, guided_field = _base_params(req, logprobs)
    ids, output, guided_field = _chat_prompt(handle, req, config, kw, guided_field)
    capacity = handle.kv_capacity
    _check_prompt_len(ids, config, capacity, "messages", "messages")
    explicit = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None \
        else "max_tokens"
    max_tokens = explicit if explicit is not None else capacity - len(ids)
    rename = {"logprobs": "top_logprobs", "max_tokens": max_param,
              **_guided_rename(guided_field)}
    params = _params(kw, req.seed, max_tokens, req.n, rename)
    _engine_check(handle.engine, ids, params[0], "messages", "messages", rename, max_param)
    return Plan([ids], params, req.n, guided_field,
                req.model if req.model in adapters else None, output)


def _chat_prompt(handle, req: ChatCompletionRequest, config: ServeConfig,
                 kw: dict[str, Any], guided_field: str | None):
    """A chat request's prompt ids, its :class:`OutputParser` (None: the text is the
    content) and the field of its constraint. The constraint its tools need goes into
    ``kw["guided"]`` (400 beside another one); with reasoning, a constraint applies to the
    answer after the thought."""
    template = handle.tokenizer.chat_template if handle.tokenizer is not None else None
    tools = tool_request(req, template, config.tool_call_parser)
    reasoning = reasoning_on(template, config.reasoning_parser)
    text = render_prompt(handle, req.messages, req.add_generation_prompt,
                         req.chat_template_kwargs, tools)
    ids = _encode_prompt(handle, text, req.chat_template_kwargs)
    in_thought = reasoning and prompt_opens_thought(text)
    field = guided_field
    try:
        guide = tool_guide(tools, handle.tokenizer)
        if guide is not None:
            if guided_field is not None:
                raise bad_request(guided_field, f"'{guided_field}' cannot be combined with "
                                  f"a tool_choice that constrains the answer")
            field = "tools"
        guide = guide or kw.get("guided")
        if guide is not None:
            kw["guided"] = allow_thought(guide, in_thought, field == "tools") \
                if reasoning else guide
    except GuidedDecodingError as e:
        raise bad_request(field, f"invalid '{field}': {e.reason}", "invalid_guided_decoding") \
            from None
    output = output_parser(tools, reasoning, in_thought)
    return ids, (output if output.active else None), field


def completion_plan(handle, req: CompletionRequest, config: ServeConfig) -> Plan:
    """Check a completions request and make its :class:`Plan` (tokenizes: call it off the
    event loop). ``model`` may name a loaded LoRA adapter."""
    adapters = _adapters(handle)
    check_model(req.model, config, adapters=adapters)
    _unsupported(req)
    p = req.prompt
    if isinstance(p, str):
        texts: list[Any] = [p]
    elif not p:
        raise bad_request("prompt", "the prompt list is empty")
    elif isinstance(p[0], int):
        texts = [p]
    else:
        texts = list(p)
    _check_n(req.n, len(texts), config)
    kw, guided_field = _base_params(req, req.logprobs)
    prompts = []
    for i, t in enumerate(texts):
        param = "prompt" if len(texts) == 1 else f"prompt[{i}]"
        if isinstance(t, str):
            if handle.tokenizer is None:
                raise bad_request(param, "this model has no tokenizer: send token ids")

            try:
                ids = handle.tokenizer.encode(t)
            except TokenizerError as e:
                raise bad_request(param, str(e)) from None
        else:
            ids = list(t)
        _check_prompt_len(ids, config, handle.kv_capacity, param, "prompt")
        prompts.append(ids)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    rename = _guided_rename(guided_field)
    params = _params(kw, req.seed, max_tokens, req.n, rename)
    for i, ids in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        _engine_check(handle.engine, ids, params[0], param, "prompt", rename, "max_tokens")
    return Plan(prompts, [sp for _ in prompts for sp in params], req.n, guided_field,
                req.model if req.model in adapters else None)


def _adapters(handle) -> dict[str, int]:
    loras = getattr(handle, "loras", None)
    return loras() if callable(loras) else {}


__all__ = ["Plan", "chat_messages", "chat_plan", "check_model", "completion_plan",
           "encode_chat", "guided_from", "render_prompt"]
