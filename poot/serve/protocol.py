"""Request bodies of the OpenAI-compatible routes, as pydantic models.

The models are strict (a number is not accepted as a string, nor a boolean as an integer, as
OpenAI's API does) and forbid unknown fields, so a parameter this server does not implement
is a 400 naming it instead of being silently ignored. Ranges that need no model are checked
here (``temperature`` in [0, 2], ``top_logprobs`` in [0, 20], ...); what needs the model
(token ids against the vocabulary, prompt + ``max_tokens`` against the context) is checked
when the request is mapped to :class:`~poot.sampling_params.SamplingParams`
(:mod:`poot.serve.mapping`).

Fields beyond OpenAI's are vLLM's "extra body" parameters: ``top_k``, ``min_p``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``return_token_ids`` (and, for chat,
``add_generation_prompt`` and ``chat_template_kwargs``). Structured output: OpenAI's
``response_format`` and vLLM's ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``, ``guided_whitespace_pattern`` and ``guided_decoding_backend`` (typed
``Any`` here; :func:`poot.serve.mapping.guided_from` checks them and names the field).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from fastapi import Body
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

MAX_TOP_LOGPROBS = 20
#: most stop strings a request may give (OpenAI allows 4; vLLM any number)
MAX_STOP_STRINGS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """An explicit ``null`` for an optional field means its default, as OpenAI's API
        (and vLLM) read it: ``"n": null`` is ``n = 1``, ``"stream": null`` no streaming."""
        if isinstance(data, dict):
            fields = cls.model_fields
            drop = [k for k, v in data.items() if v is None and k in fields
                    and not fields[k].is_required() and fields[k].default is not None]
            if drop:
                data = {k: v for k, v in data.items() if k not in drop}
        return data


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage (and
    ``"usage": null`` on every other chunk)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
    (any JSON object) or ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
    {...}, "strict": ...}}`` (output valid against the schema; always enforced)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _SamplingRequest(_Strict):
    """Fields every generation route shares (OpenAI's, then vLLM's extras)."""

    model: str = Field(max_length=256)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=-(2 ** 63), lt=2 ** 64)
    stop: str | list[str] | None = Field(None)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = Field(None, max_length=256)
    # accepted and ignored: they do not change what is generated
    metadata: dict[str, str] | None = Field(None, max_length=16)
    store: bool | None = None
    service_tier: str | None = Field(None, max_length=64)
    # vLLM's extra sampling parameters
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    ignore_eos: bool = False
    #: vLLM's: every choice (and streamed chunk) also carries its ``token_ids``, and the
    #: response (chat) or each choice's first chunk (completions) the ``prompt_token_ids``
    return_token_ids: bool = False
    # structured output (poot.serve.mapping.guided_from)
    response_format: ResponseFormat | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    # tool calling is not implemented: only "none" is served
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


class TextPart(_Strict):
    """A ``{"type": "text", "text": ...}`` part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message. ``content`` is a string, a list of text parts (joined), or null
    (an assistant turn). Other keys (``name``, ``tool_call_id``, ``refusal``...) are passed
    to the chat template as they are, as HF and vLLM do."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined with no separator)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(None, max_length=32)


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``. ``prompt``: a string, a list of strings, token ids, or a
    list of token-id lists (one choice set per prompt)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1)


class TokenizeCompletionRequest(_Strict):
    """``POST /tokenize`` with a ``prompt``."""

    model: str | None = Field(None, max_length=256)
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(_Strict):
    """``POST /tokenize`` with chat ``messages`` (rendered through the chat template)."""

    model: str | None = Field(None, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(None, max_length=32)


def _tokenize_kind(v: Any) -> str:
    return "TokenizeChatRequest" if isinstance(v, dict) and "messages" in v else \
        "TokenizeCompletionRequest"


#: ``POST /tokenize``'s body: chat ``messages`` or a ``prompt``
TokenizeBody = Annotated[Union[Annotated[TokenizeCompletionRequest,
                                         Tag("TokenizeCompletionRequest")],
                               Annotated[TokenizeChatRequest, Tag("TokenizeChatRequest")]],
                         Discriminator(_tokenize_kind), Body()]


class DetokenizeRequest(_Strict):
    """``POST /detokenize``."""

    model: str | None = Field(None, max_length=256)
    tokens: list[int]


#: most inputs one ``/v1/embeddings`` request may give (OpenAI's limit) and most documents
#: one rerank request may give
MAX_EMBED_INPUTS = 2048
MAX_RERANK_DOCUMENTS = 1024


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings`` (OpenAI's shape): ``input`` is a string, a list of strings, a
    list of token ids or a list of token-id lists (at most :data:`MAX_EMBED_INPUTS`);
    ``encoding_format`` ``float`` (lists of numbers) or ``base64`` (little-endian f32 bytes);
    ``dimensions`` keeps the first N values (re-normalized when the model normalizes), only
    for a model whose config says it was trained for that (``is_matryoshka`` /
    ``matryoshka_dimensions``, vLLM's rule)."""

    model: str = Field(max_length=256)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)


class RerankDocument(_Strict):
    """A document given as an object (Cohere's ``{"text": ...}``)."""

    text: str


class RerankRequest(_Strict):
    """``POST /v1/rerank`` and ``/rerank`` (vLLM's and Cohere's shape): ``query``, the
    ``documents`` (strings or ``{"text"}`` objects, at most :data:`MAX_RERANK_DOCUMENTS`),
    ``top_n`` (the best N results; default all) and ``return_documents`` (echo each
    result's document; default true, as vLLM)."""

    model: str | None = Field(None, max_length=256)
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True


class LoadLoraRequest(_Strict):
    """``POST /v1/load_lora_adapter`` (vLLM's shape): a PEFT folder on the server's disk."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraRequest(_Strict):
    """``POST /v1/unload_lora_adapter`` (vLLM's shape)."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None


class ErrorInfo(BaseModel):
    """The ``error`` object of an error response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape)."""

    error: ErrorInfo


__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "DetokenizeRequest",
           "EmbeddingRequest", "LoadLoraRequest", "UnloadLoraRequest", "MAX_EMBED_INPUTS",
           "MAX_RERANK_DOCUMENTS", "RerankDocument",
           "RerankRequest", "ErrorInfo", "ErrorResponse", "MAX_STOP_STRINGS", "MAX_TOP_LOGPROBS",
           "ResponseFormat", "StreamOptions", "TextPart", "TokenizeBody", "TokenizeChatRequest",
           "TokenizeCompletionRequest"]
