"""Fuzz the server's request handling up to the model: a request body (arbitrary bytes, or
JSON built field by field from the input) parsed and validated as FastAPI does it (JSON, then
the route's pydantic model in Python mode), the validation error turned into the 400 body's
message, and a valid generation request planned as the routes do (``chat_plan`` /
``completion_plan``: unsupported fields, the guided-decoding constraint compiled, stop
strings, the chat template, SamplingParams, the engine's own request check) against a
stand-in handle: a byte-level tokenizer with the server tests' chat template and the
engine's real ``check_request`` over a 128-token context.

The first byte picks the route's model; then the body is the rest as raw bytes or, on the
other half of the first byte's values, JSON made from it (the models' own field names with
values of any JSON type). Contract: parsing raises only ValueError (not JSON: FastAPI's
``json_invalid``) or RecursionError (nested too deeply: FastAPI's "error parsing the body"
400), validation only pydantic's ValidationError, mapping only APIError with a 4xx status.
Properties: a ValidationError has at least one error, and its 400 has a message and a code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atheris  # noqa: E402

import threading  # noqa: E402

from _harness import PropertyFailed, byte_tokenizer, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from pydantic import TypeAdapter, ValidationError

    from poot.engine.blocks import BlockManager
    from poot.engine.llm_engine import LLMEngine
    from poot.serve import errors, mapping, protocol
    from poot.serve.config import ServeConfig
    from poot.serve.errors import APIError

ALLOWED = (ValidationError, APIError, ValueError, RecursionError)
MODELS = [protocol.ChatCompletionRequest, protocol.CompletionRequest,
          protocol.TokenizeCompletionRequest, protocol.TokenizeChatRequest,
          protocol.DetokenizeRequest, protocol.EmbeddingRequest, protocol.RerankRequest,
          protocol.LoadLoraRequest, protocol.UnloadLoraRequest]
ADAPTERS = [TypeAdapter(m) for m in MODELS]
CONFIG = ServeConfig(served_model_name="tiny")
#: the server tests' template (test/driver/chat_fixture.py)
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


class _Engine:
    """The engine's request check (``LLMEngine.check_request``) without a model: vocabulary,
    sampling parameters, context (128), KV pool (8 blocks of 16), guided constraint."""

    check_request, _validate, _matcher = (LLMEngine.check_request, LLMEngine._validate,
                                          LLMEngine._matcher)

    def __init__(self, tokenizer):
        self.tokenizer, self.vocab, self.max_model_len = tokenizer, tokenizer.vocab_size, 128
        self.model_context, self.blocks = 128, BlockManager(9, 16)
        self._lock, self._guided = threading.Lock(), None


class _Handle:
    def __init__(self):
        self.tokenizer = byte_tokenizer(TEMPLATE)
        self.engine = _Engine(self.tokenizer)
        self.kv_capacity = 128


HANDLE = _Handle()
_NAMES = sorted({n for m in MODELS for n in m.model_fields} |
                {n for n in protocol.ChatMessage.model_fields} |
                {"role", "content", "type", "text", "json_schema", "schema", "include_usage"})
_ROLES = ["system", "user", "assistant", "tool", "developer", "bot"]


def _value(fdp, depth: int = 0):
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-3, 300)
    if kind == 3:
        return fdp.ConsumeInt(9)
    if kind == 4:
        return fdp.ConsumeFloat()
    if kind == 5:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 16))
    if kind == 6:
        return _ROLES[fdp.ConsumeIntInRange(0, len(_ROLES) - 1)] if fdp.ConsumeBool() else "tiny"
    if kind in (7, 8):
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return _object(fdp, depth + 1)


def _object(fdp, depth: int = 0) -> dict:
    out = {}
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        key = _NAMES[fdp.ConsumeIntInRange(0, len(_NAMES) - 1)] if fdp.ConsumeProbability() < 0.95 \
            else fdp.ConsumeUnicode(6)
        out[key] = _value(fdp, depth)
    return out


def _body(data: bytes) -> bytes:
    if not data or data[0] < 128:
        return data[1:]
    fdp = atheris.FuzzedDataProvider(data[1:])
    obj = _object(fdp)
    if fdp.ConsumeBool():
        obj.setdefault("model", "tiny")
        obj.setdefault("messages", [{"role": "user", "content": "hi"}])
    return json.dumps(obj, allow_nan=fdp.ConsumeBool()).encode("utf-8", "surrogatepass")


def one_input(data: bytes) -> None:
    model = MODELS[data[0] % len(MODELS)] if data else MODELS[0]
    obj = json.loads(_body(data))                       # FastAPI: a json_invalid 400
    try:
        req = TypeAdapter(model).validate_python(obj)
    except ValidationError as e:
        errs = e.errors()
        if not errs:
            raise PropertyFailed("a ValidationError with no errors")
        err = errs[0]
        param = None if err.get("type") == "json_invalid" else errors.field_path(err.get("loc", ()))
        message, code = errors._validation_message(err, param)
        if not isinstance(message, str) or not message or not code:
            raise PropertyFailed(f"400 message {message!r} ({code!r})")
        raise
    if isinstance(req, (protocol.ChatCompletionRequest, protocol.CompletionRequest)):
        try:
            _map(req)
        except APIError as e:
            if not 400 <= e.status < 500:
                raise PropertyFailed(f"APIError {e.status} for a request's own fault") from e
            raise


def _map(req) -> None:
    if isinstance(req, protocol.ChatCompletionRequest):
        mapping.chat_plan(HANDLE, req, CONFIG)
    else:
        mapping.completion_plan(HANDLE, req, CONFIG)

if __name__ == "__main__":
    main(one_input, ALLOWED)
