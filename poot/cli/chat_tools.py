"""``poot chat --tools FILE``: the tools file, and one user turn with tools -- the model's
reply, each call it makes shown with its arguments, the call's result typed by the user and
sent back as a ``tool`` message, until the model answers without a call."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable

from poot.cli import InputError


def load_tools(path: str) -> list[dict[str, Any]]:
    """The function tools of ``--tools`` file ``path``: a JSON list of OpenAI chat function
    tools (``{"type": "function", "function": {"name", "description", "parameters"}}``) or
    an object with such a ``tools`` list.

    Raises:
        InputError: the file cannot be read, is not JSON, or a tool is malformed (naming
            the field).
    """
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.engine.tool_calls import check_tools
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"--tools {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"--tools {path}: not a JSON file ({e})") from None
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    try:
        tools = check_tools(data)
    except InvalidRequest as e:
        raise InputError(f"--tools {path}: {e.field}: {e.reason}") from None
    if not tools:
        raise InputError(f"--tools {path}: no tools in the file")
    return tools


def show_call(call: dict[str, Any]) -> str:
    """One call as the chat shows it: ``[call <id>] name({"arg": ...})``."""
    fn = call["function"]
    return f"[call {call['id']}] {fn['name']}({fn['arguments']})"


def tool_turn(handle, driver, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              parser, params: Callable[[int], Any], max_tokens: int,
              read_line: Callable[[str], str | None]) -> Any:
    """Replies to ``messages`` (the user's message last) until one makes no call; each
    call is printed (:func:`show_call`) and its result read with ``read_line(prompt)``.
    The assistant and ``tool`` messages are appended to ``messages``. Returns the last
    reply's stats.

    Raises:
        ContextOverflow: the conversation no longer fits the context.
        EOFError: the input ended while a call's result was awaited.
    """
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.chat import chat_prompt, chat_result
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.generate import ContextOverflow

    while True:
        ids = chat_prompt(handle, messages, tools, parser)
        room = handle.kv_capacity - len(ids)
        if room < 1:
            raise ContextOverflow(len(ids), 1, handle.kv_capacity)
        sp = params(min(max_tokens, room))
        guide = parser.guide(tools, None)
        if guide is not None:              # the format constrains an "auto" reply too
            sp = dataclasses.replace(sp, guided=guide)
        done = driver.complete(ids, sp)
        reply = chat_result(done.text, done.stats.finish_reason, done.stats, parser)
        if reply.content:
            print(reply.content, flush=True)
        messages.append(reply.message())
        if not reply.tool_calls:
            return done.stats
        for call in reply.tool_calls:
            print(show_call(call), flush=True)
            result = read_line(f"result of {call['function']['name']}> ")
            if result is None:
                raise EOFError
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


def read_line(interactive: bool, prompt: str) -> str | None:
    """The next line of input (without its newline), or None at the end of input; the
    ``prompt`` is shown on a terminal."""
    if interactive:
        try:
            return input(prompt)
        except EOFError:
            print(file=sys.stderr)
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


__all__ = ["load_tools", "read_line", "show_call", "tool_turn"]
