"""``POST /v1/responses`` (OpenAI's Responses API, stateless): a translation layer over
``/v1/chat/completions``. The request becomes a chat completion request
(:func:`~poot.serve.responses_request.to_chat`), which the chat route checks and runs as it
runs its own; its answer -- a ``chat.completion`` or its chunk stream -- becomes the Response
object or its typed events (:class:`~poot.serve.responses_output.ResponseBuilder`). Errors
of the chat path name the Responses field that carried the value."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from poot.serve.errors import APIError
from poot.serve.generation import SSEResponse
from poot.serve.protocol import ChatCompletionRequest
from poot.serve.responses_output import ResponseBuilder, item_id, response_events
from poot.serve.responses_request import ResponsesRequest, to_chat
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.routes.generation import chat_completions
from poot.serve.state import ServerState

router = APIRouter()


@router.post("/v1/responses", dependencies=AUTHED, responses=ERRORS)
async def create_response(request: Request, body: ResponsesRequest,
                          state: ServerState = Depends(server_state)):
    """OpenAI Responses (stateless; streaming with ``stream: true``): ``input`` (a string
    or items), ``instructions``, function ``tools``, ``tool_choice``, ``text.format``,
    ``max_output_tokens``, ``temperature``, ``top_p``."""
    chat, names = to_chat(body)
    try:
        chat_req = ChatCompletionRequest.model_validate(chat)
    except ValidationError as e:
        raise names.validation_error(e) from None
    try:
        answer = await chat_completions(request, chat_req, state)
    except APIError as e:
        raise names.rename(e) from None
    rid = item_id("resp")
    request.scope.setdefault("poot.log", {})["id"] = rid
    builder = ResponseBuilder(rid, body)
    if not body.stream:
        return builder.from_completion(answer) if isinstance(answer, dict) else answer
    return SSEResponse(response_events(builder, answer.body_iterator),
                       on_close=answer.on_close, media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
