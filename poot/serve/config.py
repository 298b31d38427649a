"""The server's settings and limits (every one bounded, every one configurable)."""

from __future__ import annotations

from dataclasses import dataclass

from poot.sampling_params import InvalidRequest
from poot.text.tool_calls import FORMATS, REASONING_PARSERS

#: ``--tool-call-parser`` names: ``auto`` (from the chat template) or a format's
TOOL_CALL_PARSERS = ("auto", *FORMATS)


@dataclass(frozen=True)
class ServeConfig:
    """What ``poot serve`` serves and the limits it enforces.

    Attributes:
        served_model_name: the ``model`` clients must name (``/v1/models`` lists it).
        api_key: when set, every ``/v1`` route, ``/tokenize``, ``/detokenize``,
            ``/metrics`` and the API docs (``/docs``, ``/redoc``, ``/openapi.json``) need
            ``Authorization: Bearer <key>`` (401 otherwise); ``/health`` stays open.
        max_body_bytes: request bodies larger than this get 413.
        max_prompt_tokens: prompts longer than this get 400 (None: the context only).
        max_n: the largest ``n`` (choices per prompt) and number of prompts per request.
        max_queue: sequences that may wait for a place in the engine's batch beyond the
            ``max_batch`` running ones; a request that would exceed it gets 429 with
            ``Retry-After``.
        max_pooled_rows: inputs (embeddings) or documents (rerank) that may wait for a
            pooled step; a request that would exceed it gets 429 ``queue_full`` with
            ``Retry-After`` (one request is always admitted when none wait).
        max_concurrent: HTTP requests in progress at once (streams included); past it 503
            with ``Retry-After``.
        request_timeout_s: wall time a generation request may take (queueing included);
            past it the request is aborted (504, or an error event in a stream).
        retry_after_s: the ``Retry-After`` given with 429 and 503.
        drain_timeout_s: on SIGTERM, how long running requests may take to finish before
            they are aborted.
        header_timeout_s: a request's line and headers must arrive within this many
            seconds (of the connection opening, or of the next request's first byte);
            past it 408 and the connection is closed (:mod:`poot.serve.limits`).
        body_timeout_s: a request's whole body must arrive within this many seconds of its
            headers; past it 408 and the connection is closed.
        idle_timeout_s: a kept-alive connection without a request, or a client that stops
            reading its response, is closed after this many seconds.
        poll_s: how often a waiting request checks that its client is still connected and
            the engine still runs.
        runtime_lora: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` are
            allowed (they read adapter folders on the server's disk, so they are off unless
            asked for, as vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); needs ``lora_root``.
        lora_root: the folder runtime-loaded adapters must lie in (``lora_path`` is taken
            relative to it; a path that leaves it, symlinks resolved, is refused as not
            found; :mod:`poot.serve.lora_files`).
        max_lora_bytes: the largest adapter file runtime loading reads (bytes).
        tool_call_parser: the tool-call format of chat answers (``auto``: from the chat
            template; or ``hermes``, ``llama3_json``, ``mistral``, ``generic``).
        reasoning_parser: split ``<think>`` blocks into ``reasoning_content`` (``auto``:
            when the chat template is a thinking model's; ``none``; ``think``,
            ``deepseek_r1`` or ``qwen3``: always).
    """

    served_model_name: str = "poot"
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None
    max_n: int = 16
    max_queue: int = 256
    max_pooled_rows: int = 4096
    max_concurrent: int = 512
    request_timeout_s: float = 600.0
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 30.0
    poll_s: float = 0.5
    runtime_lora: bool = False
    lora_root: str | None = None
    max_lora_bytes: int = 1 << 30
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"

    def __post_init__(self):
        for name in ("max_body_bytes", "max_n", "max_concurrent", "retry_after_s",
                     "max_pooled_rows", "max_lora_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequest(name, v, "must be an integer >= 1")
        if isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int) or \
                self.max_queue < 0:
            raise InvalidRequest("max_queue", self.max_queue, "must be an integer >= 0")
        if self.max_prompt_tokens is not None and (not isinstance(self.max_prompt_tokens, int)
                                                   or self.max_prompt_tokens < 1):
            raise InvalidRequest("max_prompt_tokens", self.max_prompt_tokens,
                                 "must be an integer >= 1")
        for name in ("request_timeout_s", "drain_timeout_s", "poll_s", "header_timeout_s",
                     "body_timeout_s", "idle_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise InvalidRequest(name, v, "must be a number > 0")
        if self.runtime_lora and not self.lora_root:
            raise InvalidRequest("lora_root", self.lora_root, "runtime LoRA loading needs "
                                 "the folder its adapters must lie in (--lora-root)")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise InvalidRequest("tool_call_parser", self.tool_call_parser,
                                 f"must be one of {', '.join(TOOL_CALL_PARSERS)}")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise InvalidRequest("reasoning_parser", self.reasoning_parser,
                                 f"must be one of {', '.join(REASONING_PARSERS)}")
        if not isinstance(self.served_model_name, str) or not self.served_model_name:
            raise InvalidRequest("served_model_name", self.served_model_name,
                                 "must be a non-empty string")


__all__ = ["REASONING_PARSERS", "ServeConfig", "TOOL_CALL_PARSERS"]
