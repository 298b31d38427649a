"""``POST /tokenize`` and ``POST /detokenize``: the served model's tokenizer."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from poot.serve.errors import bad_request
from poot.serve.mapping import check_model, encode_chat
from poot.serve.protocol import DetokenizeRequest, TokenizeBody, TokenizeChatRequest
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.state import ServerState
from poot.text.tokenizer import TokenizerError

router = APIRouter()


def _with_tokenizer(state: ServerState, model: str | None, field: str):
    """The served model when ``model`` names it (or is absent) and it has a tokenizer;
    400 naming ``field`` when it has none."""
    h = state.require_model()
    check_model(model, state.config, required=False)
    if h.tokenizer is None:
        raise bad_request(field, "this model has no tokenizer")
    return h


@router.post("/tokenize", dependencies=AUTHED, responses=ERRORS)
async def tokenize(body: TokenizeBody, state: ServerState = Depends(server_state)):
    """Token ids of a ``prompt`` or of chat ``messages`` (through the chat template)."""
    h = _with_tokenizer(state, body.model, "prompt")

    def run():
        if isinstance(body, TokenizeChatRequest):
            return encode_chat(h, body.messages, body.add_generation_prompt,
                               body.chat_template_kwargs)
        try:
            return h.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        except TokenizerError as e:
            raise bad_request("prompt", str(e)) from None

    ids = await run_in_threadpool(run)
    return {"count": len(ids), "max_model_len": h.kv_capacity, "tokens": ids}


@router.post("/detokenize", dependencies=AUTHED, responses=ERRORS)
async def detokenize(body: DetokenizeRequest, state: ServerState = Depends(server_state)):
    """The text of token ids."""
    h = _with_tokenizer(state, body.model, "tokens")
    vocab = h.tokenizer.vocab_size
    bad = [i for i in body.tokens if not 0 <= i < vocab]
    if bad:
        raise bad_request("tokens", f"token id {bad[0]} is outside the vocabulary "
                          f"[0, {vocab})")
    return {"prompt": await run_in_threadpool(h.tokenizer.decode, body.tokens)}
