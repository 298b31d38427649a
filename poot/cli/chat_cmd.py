"""``poot chat``: an interactive conversation over the model's chat template.

    poot chat [--model MODEL] [--backend B] [--kv-capacity N] [--system TEXT]
              [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--quiet]
              [--tools FILE]

Each line read from stdin is one user message; the whole conversation (system message, every
user message and reply so far) goes through the checkpoint's chat template and the reply
streams to stdout. Commands: ``/reset`` starts a new conversation (the system message
stays), ``/exit`` (or end of input, Ctrl-D) quits; Ctrl-C during a reply drops that turn.
On a terminal a ``>>>`` prompt is shown; each reply's token counts go to stderr (``--quiet``:
none). A conversation that outgrows the context (``--kv-capacity``) is said so, and the
turn is dropped: ``/reset`` and go on.

``--tools FILE`` (a JSON list of OpenAI chat function tools) gives the model tools: they go
to the chat template, each call the model makes is shown as ``[call ID] name({...})``, and
you type its result (one line), which goes back as a ``tool`` message; the model then
answers (or calls again). Replies are shown whole, not streamed.

Built on the public API only: :class:`~poot.api.ModelHandle` and
:meth:`~poot.api.Driver.generate` (``TokenEvent`` ... then ``Finished``).
"""

from __future__ import annotations

import argparse
import sys

from poot.cli import check_utf8, plain
from poot.cli.chat_tools import load_tools, read_line, tool_turn
from poot.errors import PootError

COMMANDS = "/reset clears the conversation, /exit (or Ctrl-D) quits"


def register(subparsers: argparse._SubParsersAction) -> None:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import add_model_args, add_sampling_args

    p = subparsers.add_parser("chat", help="chat with a model interactively (multi-turn)",
                              description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="a system message opening every conversation (default: none)")
    add_sampling_args(p, 256, "at most N tokens per reply, less when the context is nearly "
                      "full")
    p.add_argument("--tools", default=None, metavar="FILE",
                   help="a JSON file of OpenAI chat function tools: the model's calls are "
                   "shown and you type each result")
    p.set_defaults(func=run)


def _opening(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def _read_line(interactive: bool) -> str | None:
    """The next line of input (without its newline), or None at the end of input."""
    return read_line(interactive, ">>> ")


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import Driver, Finished
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import check_options, load_handle
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.generate import ContextOverflow
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.chat import tool_call_parser

    check_options(args, "max_tokens", "kv_capacity", "prefill_chunk")
    if args.system is not None:
        check_utf8(args.system, "--system")

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, seed=args.seed, max_tokens=max_tokens)

    params(args.max_tokens)                     # option errors before anything is loaded
    tools = load_tools(args.tools) if args.tools is not None else None
    opening = _opening(args.system)
    # the model needs a tokenizer and a chat template (and, with tools, a tool-call
    # parser): checked before anything compiles
    probe = opening + [{"role": "user", "content": "hi"}]
    parsers = []

    def check(h):
        h.check_request(probe, params(1))
        if tools is not None:
            parsers.append(tool_call_parser(h))

    handle = load_handle(args, before_compile=check)
    driver = Driver(handle)
    interactive = sys.stdin.isatty()
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    if interactive:
        say(f"poot chat: {handle.path.name} on {handle.backend}; {COMMANDS}")
    messages = list(opening)
    while True:
        line = _read_line(interactive)
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                messages = list(opening)
                say("(new conversation)")
            else:
                say(f"unknown command {text.split()[0]} ({COMMANDS})")
            continue
        check_utf8(line, "the input")
        start = len(messages)
        messages.append({"role": "user", "content": line})
        try:
            if tools is not None:
                try:
                    s = tool_turn(handle, driver, messages, tools, parsers[0], params,
                                  args.max_tokens, lambda p: read_line(interactive, p))
                except (KeyboardInterrupt, EOFError):
                    sys.stdout.write("\n")
                    say("(turn dropped)")
                    del messages[start:]
                    continue
                say(f"[{s.prompt_tokens} prompt + {s.generated_tokens} generated tokens, "
                    f"{s.finish_reason}]")
                continue
            used = len(handle.encode(messages))
            room = handle.kv_capacity - used
            if room < 1:
                raise ContextOverflow(used, 1, handle.kv_capacity)
            events = driver.generate(messages, params(min(args.max_tokens, room)))
            done = None
            try:
                for ev in events:
                    if isinstance(ev, Finished):
                        done = ev
                    elif ev.text:
                        sys.stdout.write(ev.text)
                        sys.stdout.flush()
            except KeyboardInterrupt:
                getattr(events, "close", lambda: None)()
                sys.stdout.write("\n")
                say("(reply interrupted: turn dropped)")
                del messages[start:]
                continue
            sys.stdout.write(done.final_text + "\n")
            sys.stdout.flush()
            messages.append({"role": "assistant", "content": done.text})
            s = done.stats
            say(f"[{s.prompt_tokens} prompt + {s.generated_tokens} generated tokens, "
                f"{s.finish_reason}]")
        except ContextOverflow:
            del messages[start:]
            print(f"poot: the conversation no longer fits the context of "
                  f"{handle.kv_capacity} tokens: /reset to start a new one (or run with a "
                  f"larger --kv-capacity)", file=sys.stderr)
        except PootError as e:                  # this turn cannot run; the chat goes on
            del messages[start:]
            print(f"poot: error: {e}", file=sys.stderr)
