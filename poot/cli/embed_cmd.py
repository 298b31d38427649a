"""``poot embed``: embeddings of texts (or token ids), or cross-encoder scores, as JSON.

    poot embed --model MODEL [--backend B] [--pooling cls|mean|last]
               [--normalize | --no-normalize] [--max-batch N] [--max-tokens N]
               [--dimensions N] [--ids] (TEXT... | --input-file FILE)
    poot embed --model CROSS_ENCODER --query QUERY DOCUMENT...
    poot embed --model DECODER --score-tokens no,yes --query QUERY DOCUMENT...   # yes/no reranker

Prints one JSON object: ``{"model", "pooling", "normalize", "dim", "embeddings": [[...]],
"usage": {"prompt_tokens"}}``, or with ``--query`` (a cross-encoder)
``{"model", "results": [{"index", "relevance_score", "document"}], ...}`` sorted best first.
``--ids``: each TEXT is whitespace- or comma-separated token ids. ``--input-file``: one input
a line (``-`` reads stdin). Pooling and normalization come from the checkpoint's
sentence-transformers files unless given. Errors are one line ``poot: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from poot.backends.registry import BACKENDS
from poot.cli import check_utf8, read_stdin_text
from poot.sampling_params import InvalidRequest


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("embed", help="embed texts (or score documents) with an "
                              "embedding model or a cross-encoder",
                              description="Embeddings of TEXT... (pooled hidden states, JSON on "
                              "stdout), or with --query the relevance of each DOCUMENT by a "
                              "cross-encoder.")
    p.add_argument("--model", required=True, help="an HF folder (BERT / decoder embedding "
                   "model, or a BertForSequenceClassification cross-encoder)")
    p.add_argument("--backend", default="cpu", choices=tuple(BACKENDS),
                   help="where to run (default: cpu)")
    p.add_argument("--pooling", default=None, choices=("cls", "mean", "last"),
                   help="override the checkpoint's pooling (default: its 1_Pooling/config.json,"
                        " else last token for decoders, mean for encoders)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None,
                      help="L2-normalize (default: as the checkpoint's modules.json says, "
                           "else yes)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="inputs per step (default: 8)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="tokens one input may hold (default: 512, at most the model's context)")
    p.add_argument("--dimensions", type=int, default=None, metavar="N",
                   help="keep the first N values of each embedding (re-normalized)")
    p.add_argument("--ids", action="store_true", help="each input is token ids, not text")
    p.add_argument("--query", default=None, help="score each input against QUERY "
                   "(a cross-encoder)")
    p.add_argument("--score-tokens", default=None, metavar="NO,YES",
                   help="score with a decoder's LM head: sigmoid(logit(YES) - logit(NO)) of "
                        "the last token (a Qwen3-Reranker-style yes/no reranker; token ids or "
                        "token strings)")
    p.add_argument("--input-file", default=None, metavar="FILE",
                   help="one input a line ('-': stdin)")
    p.add_argument("--no-cache", action="store_true", help="do not use the compile cache")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.add_argument("inputs", nargs="*", metavar="TEXT", help="the inputs")
    p.set_defaults(func=run)


def _inputs(args) -> list:
    if args.input_file is not None and args.inputs:
        raise InvalidRequest("--input-file", args.input_file, "give inputs or --input-file, "
                             "not both")
    if args.input_file is not None:
        if args.input_file == "-":
            text = read_stdin_text("the inputs on stdin")
        else:
            try:
                with open(args.input_file, "rb") as f:
                    data = f.read()
                text = data.decode("utf-8")
            except OSError as e:
                raise InvalidRequest("--input-file", args.input_file, e.strerror) from None
            except UnicodeDecodeError as e:
                raise InvalidRequest("--input-file", args.input_file, f"not UTF-8 at byte "
                                     f"{e.start}") from None
        items = [line for line in text.splitlines() if line.strip()]
    else:
        items = list(args.inputs)
        for i, t in enumerate(items):
            check_utf8(t, f"TEXT {i + 1}")
    if not items:
        raise InvalidRequest("TEXT", "", "give at least one input (or --input-file)")
    if not args.ids:
        return items
    out = []
    for i, t in enumerate(items):
        parts = [x for x in re.split(r"[\s,]+", t.strip()) if x]
        if not parts or not all(re.fullmatch(r"\d+", x) for x in parts):
            raise InvalidRequest(f"input {i + 1}", t[:40], "--ids needs token ids (integers "
                                 "separated by spaces or commas)")
        out.append([int(x) for x in parts])
    return out


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import check_options
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.progress_display import Reporter, history_file
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.pooling import PoolingModel, relevance

    check_options(args, "max_batch", "max_tokens", "dimensions")
    if args.query is not None:
        check_utf8(args.query, "--query")
    items = _inputs(args)
    score_tokens = None
    if args.score_tokens is not None:
        parts = [x.strip() for x in args.score_tokens.split(",")]
        if len(parts) != 2 or not all(parts):
            raise InvalidRequest("--score-tokens", args.score_tokens, "must be NO,YES (two "
                                 "tokens or token ids)")
        score_tokens = [int(x) if x.isdigit() else x for x in parts]
    reporter = Reporter(quiet=args.quiet, history=history_file())
    try:
        pm = PoolingModel.load(args.model, args.backend, pooling=args.pooling,
                               normalize=args.normalize, max_batch=args.max_batch,
                               max_tokens=args.max_tokens, use_cache=not args.no_cache,
                               progress=reporter, score_tokens=score_tokens)
    finally:
        reporter.close()
    if args.query is not None:
        if pm.task != "score":
            raise InvalidRequest("--query", args.query, "this model embeds; --query needs a "
                                 "cross-encoder (a ...ForSequenceClassification checkpoint)")
        if args.ids:
            raise InvalidRequest("--ids", True, "--query scores texts")
        pairs = [pm.encode_pair(args.query, d, f"document {i + 1}") for i, d in enumerate(items)]
        scores = relevance(pm.score_pairs(pairs))
        order = sorted(range(len(items)), key=lambda i: (-float(scores[i]), i))
        out = {"model": str(args.model), "query": args.query,
               "results": [{"index": i, "relevance_score": float(scores[i]),
                            "document": items[i]} for i in order],
               "usage": {"total_tokens": sum(len(p[0]) for p in pairs)}}
    else:
        if pm.task != "embed":
            raise InvalidRequest("--model", args.model, "this model is a cross-encoder: give "
                                 "--query QUERY and the documents")
        rows = [pm.encode_input(x, f"input {i + 1}") for i, x in enumerate(items)]
        vecs = pm.embed_ids(rows)
        if args.dimensions is not None:
            if args.dimensions > vecs.shape[1]:
                raise InvalidRequest("--dimensions", args.dimensions, f"more than the model's "
                                     f"{vecs.shape[1]}")
            import numpy as np

            vecs = vecs[:, :args.dimensions]
            if pm.normalize:
                vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        out = {"model": str(args.model), "pooling": pm.pooling, "normalize": pm.normalize,
               "dim": int(vecs.shape[1]), "embeddings": [[float(x) for x in v] for v in vecs],
               "usage": {"prompt_tokens": sum(map(len, rows))}}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0
