"""A streamed chunk's bytes: the request's fields encoded once and reused for every token's
chunk give exactly the event ``sse`` makes of the whole object (key order, compact JSON,
non-ASCII kept, JavaScript's line terminators escaped), for chat and completions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from poot.serve.generation import GenerationRun
from poot.serve.responses import sse

TEXTS = ["", " hello", 'quote " and \\ backslash', "line\nbreak\ttab", "caf\u00e9 \u2603",
         "sep \u2028 and \u2029 and \x85", "\x00\x1f controls"]


def _run(chat: bool, model: str) -> GenerationRun:
    run = GenerationRun.__new__(GenerationRun)     # only what _chunk reads
    run.rid, run.chat, run.created, run.model = "chatcmpl-abc", chat, 1765000000, model
    run.body = SimpleNamespace(stream_options=None)
    run._chunk_head = None
    return run


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("model", ["tiny", "m\u2028odel \"x\""])
def test_token_chunks_equal_the_whole_object_encoded(chat, model):
    run = _run(chat, model)
    for i, text in enumerate(TEXTS):
        choice = ({"index": i % 2, "delta": {"content": text}, "logprobs": None,
                   "finish_reason": None} if chat else
                  {"index": i % 2, "text": text, "logprobs": None, "finish_reason": None,
                   "token_ids": [i, 7]})
        whole = {"id": run.rid, "object": "chat.completion.chunk" if chat else
                 "text_completion", "created": run.created, "model": model,
                 "system_fingerprint": None, "choices": [dict(choice)]}
        got = run._chunk(choice)
        assert got == sse(whole)
        assert "\u2028" not in got and "\n" not in got[:-2]
        assert json.loads(got[len("data: "):])["choices"][0] == choice
    assert run._chunk_head is not None      # the chunks took the encoded-once head
