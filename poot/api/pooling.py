"""Embeddings and cross-encoder scores: a loaded model that serves pooled steps.

    pm = PoolingModel.load("path/to/all-MiniLM-like")          # CPU backend
    vecs = pm.embed(["a sentence", [2, 17, 42, 3]])             # f32 [2, H], as configured
    scores = PoolingModel.load("path/to/cross-encoder").score("query", ["doc 1", "doc 2"])

A checkpoint is served as one of two tasks (:attr:`PoolingModel.task`): ``"embed"`` (pooled
hidden states, :mod:`poot.models.pooling`) or ``"score"`` (a BERT-family
sequence-classification head: a cross-encoder over ``[CLS] query [SEP] document [SEP]``).
Pooling and normalization come from the checkpoint's sentence-transformers files
(``modules.json``, ``1_Pooling/config.json``) when present, else from the ``pooling`` /
``normalize`` arguments, else the family's default (decoders: last token; encoders: mean;
normalized). Every step is traced, compiled (through the compile cache) and run on the
chosen backend like the generation steps; no KV cache is allocated.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from poot.api.model import target_for, tokenizer_of
from poot.api.options import DEFAULT_COMPILE_OPTIONS, positive
from poot.api.step_cache import cached_compiler
from poot.compiler.cache import CompileCache
from poot.compiler.planning import storage_type, target_for_options
from poot.engine.pooling import PoolingRunner, PoolQueue
from poot.errors import PootError
from poot.load import load_config, open_weights
from poot.models import REGISTRY, ModelError
from poot.models.pooling import POOLINGS, read_pooling_config
from poot.progress import as_callback
from poot.runtime import device_for
from poot.sampling_params import InvalidRequest
from poot.text.tokenizer import TokenizerError, check_utf8

#: Tokens one input may hold by default (capped at the model's trained context).
DEFAULT_MAX_TOKENS = 512
#: Rows per pooled step by default.
DEFAULT_POOL_BATCH = 8
_QUEUE_LOCK = threading.Lock()


class WrongTask(PootError):
    """The request needs a task the loaded model does not serve (``embed`` vs ``score``)."""

    def __init__(self, want: str, have: str):
        self.want, self.have = want, have
        hint = "a cross-encoder scores pairs: use rerank" if have == "score" else \
            "it has no classification head: use embeddings"
        super().__init__(f"this model serves {have!r}, not {want!r} ({hint})")


@dataclass
class PoolingModel:
    """A model loaded for pooled steps (module doc).

    Attributes:
        path, backend: where it was loaded from, and the backend it runs on.
        model, weights: the family instance and its weights (no LM head).
        tokenizer: a :class:`~poot.text.tokenizer.Tokenizer`, or None (token-id input only).
        runner: the :class:`~poot.engine.pooling.PoolingRunner`.
        task: ``"embed"`` or ``"score"``.
        pooling, normalize: how embeddings are pooled; pooling_source says where that was
            decided (a file, ``"argument"`` or ``"default"``).
        max_tokens: tokens one input may hold.
        num_labels: the classifier's outputs (``score`` task), else 0.
        matryoshka: which truncated sizes the model was trained for: True (any, config
            ``is_matryoshka``), a tuple (config ``matryoshka_dimensions``) or False.
    """

    path: Path
    backend: str
    model: Any
    weights: Any
    tokenizer: Any
    runner: Any
    task: str
    pooling: str
    normalize: bool
    pooling_source: str
    max_tokens: int
    num_labels: int = 0
    matryoshka: bool | tuple[int, ...] = False
    load_s: float = 0.0
    _queue: Any = field(default=None, repr=False, compare=False)

    def queue(self, max_pending_rows: int | None = None):
        """The model's :class:`~poot.engine.pooling.PoolQueue` (its scheduler thread),
        started on first use or again after it was closed; ``max_pending_rows``, when
        given, becomes its bound. Every pooled call of this model goes through it."""
        with _QUEUE_LOCK:
            if self._queue is None or self._queue.closed:
                self._queue = PoolQueue(self.runner)
            if max_pending_rows is not None:
                self._queue.max_pending_rows = max_pending_rows
            return self._queue

    @property
    def kv_capacity(self) -> int:
        """Tokens one input may hold (the ``max_model_len`` a server reports)."""
        return self.max_tokens

    @property
    def hidden_size(self) -> int:
        return self.model.dims().hidden

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str = "cpu", *,
             pooling: str | None = None, normalize: bool | None = None,
             max_batch: int | None = None, max_tokens: int | None = None,
             cache_dir: str | None = None, use_cache: bool = True,
             compile_options: Any = None, progress: Callable | None = None,
             device: Any = None, warm_up: bool = True,
             score_tokens: Sequence[int | str] | None = None) -> "PoolingModel":
        """Load ``path`` (an HF folder) for pooled steps on ``backend``.

        ``pooling`` (``cls``/``mean``/``last``) and ``normalize`` override what the
        checkpoint's sentence-transformers files say; ``max_batch`` rows per step (default
        8), ``max_tokens`` tokens per input (default 512, at most the model's
        ``max_position_embeddings``). ``warm_up`` compiles the step of the largest batch
        bucket and the smallest token bucket now (a refusal of the backend comes here).

        Raises :class:`InvalidRequest` naming a bad option,
        :class:`~poot.models.ModelError` (a family without a pooled step, a malformed
        ``modules.json``, missing tensors), :class:`~poot.load.errors.LoadError`, or the
        compiler's :class:`~poot.compiler.Refusal`.
        """
        t0 = time.perf_counter()
        report = as_callback(progress)
        max_batch = _checked_args(pooling, normalize, max_batch, max_tokens)
        path = Path(path)
        # the weights' layouts follow the precision (planning.target_for_options)
        target = target_for_options(target_for(backend),
                                    compile_options or DEFAULT_COMPILE_OPTIONS)
        if device is None:
            device = device_for(target)
        report(f"loading {path.name}", 0, 0)
        store = open_weights(path)
        cfg = load_config(path)
        family = REGISTRY.lookup(cfg.architecture)
        model = family.from_config(cfg, store)
        if not hasattr(model, "trace_pooled"):
            raise ModelError(f"{family.family}: this family has no pooled step (embeddings)")
        weights = model.bind_headless(store)
        tokenizer = tokenizer_of(path)
        extra = cfg.extra or {}
        _bind_score_tokens(model, store, weights, tokenizer, family.family, score_tokens,
                           extra)
        num_labels = int(getattr(model.config, "num_labels", 0) or 0)
        if "score" in weights.types:
            num_labels = int(weights.types["score"].shape[0])
        task = "score" if num_labels else "embed"
        pool, norm, source = _pooling_of(path, model, pooling, normalize)
        limit = _token_limit(cfg, max_tokens)
        cache = CompileCache(cache_dir, enabled=use_cache)
        compile_step = cached_compiler(cache, target, compile_options or
                                       DEFAULT_COMPILE_OPTIONS, report)
        runner = PoolingRunner(model, weights, device, compile_step, max_batch, limit,
                               pool, norm, "scores" if task == "score" else "embeddings",
                               on_compile=lambda what: report(f"{what} step", 0, 0),
                               storage_type=functools.partial(storage_type, caps=target.caps))
        pm = cls(path, backend, model, weights, tokenizer, runner, task, pool, norm,
                 source, limit, num_labels, _matryoshka(extra))
        if warm_up:
            runner.warm_up()
        pm.load_s = time.perf_counter() - t0
        return pm

    # ---- inputs ----------------------------------------------------------------------------
    def encode_input(self, item: Any, field: str = "input") -> list[int]:
        """Token ids of one input: a string (tokenized with the checkpoint's special tokens)
        or a list of token ids. Raises :class:`InvalidRequest` naming ``field`` for an empty
        input, an id outside the vocabulary, more than :attr:`max_tokens` tokens, text
        without a tokenizer, or another type."""
        if isinstance(item, str):
            if self.tokenizer is None:
                raise InvalidRequest(field, item[:40], "this checkpoint has no tokenizer; "
                                     "pass token ids")
            try:
                ids = self.tokenizer.encode(item)
            except TokenizerError as e:
                raise InvalidRequest(field, item[:40], str(e)) from None
            # a model pads nothing: a text longer than the limit is refused, not cut
        elif isinstance(item, (list, tuple)) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in item):
            ids = list(item)
            vocab = getattr(self.model.config, "vocab_size", None) or self.model.dims().vocab
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise InvalidRequest(field, bad[0], f"token id outside the vocabulary "
                                     f"[0, {vocab})")
        else:
            raise InvalidRequest(field, type(item).__name__, "must be a string or a list "
                                 "of token ids")
        if not ids:
            raise InvalidRequest(field, "", "an input needs at least one token")
        if len(ids) > self.max_tokens:
            raise InvalidRequest(field, f"{len(ids)} tokens", f"more than the "
                                 f"{self.max_tokens} tokens an input may hold")
        return ids

    # ---- the two tasks ---------------------------------------------------------------------
    def embed_ids(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """f32 [n, H]: the pooled embedding of each row of token ids (already checked:
        :meth:`encode_input`). Raises :class:`WrongTask` on a cross-encoder."""
        if self.task != "embed":
            raise WrongTask("embed", self.task)
        return self.queue().run(rows)

    def embed(self, inputs: Sequence[Any]) -> np.ndarray:
        """f32 [n, H]: embeddings of strings or token-id lists (:meth:`encode_input`)."""
        return self.embed_ids([self.encode_input(x, f"input[{i}]")
                               for i, x in enumerate(inputs)])

    def encode_pair(self, query: str, document: str, field: str = "documents"
                    ) -> tuple[list[int], list[int]]:
        """(ids, token types) of ``[CLS] query [SEP] document [SEP]`` as the checkpoint's
        tokenizer pairs them (its post-processor), checked against :attr:`max_tokens`.
        Raises :class:`InvalidRequest` naming ``field`` (no tokenizer, too long)."""
        if self.tokenizer is None:
            raise InvalidRequest(field, document[:40], "this checkpoint has no tokenizer")
        try:
            check_utf8(query, "query")
            check_utf8(document, field)
        except PootError as e:
            raise InvalidRequest(field, document[:40], str(e)) from None
        enc = self.tokenizer.backend.encode(query, document)
        if len(enc.ids) > self.max_tokens:
            raise InvalidRequest(field, f"{len(enc.ids)} tokens", f"query and document "
                                 f"together exceed the {self.max_tokens} tokens an input "
                                 f"may hold")
        return list(enc.ids), list(enc.type_ids)

    def score_pairs(self, pairs: Sequence[tuple[list[int], list[int]]]) -> np.ndarray:
        """f32 [n, num_labels]: the classifier's logits for each (ids, token types) pair.
        Raises :class:`WrongTask` unless this is a cross-encoder."""
        if self.task != "score":
            raise WrongTask("score", self.task)
        return self.queue().run([p[0] for p in pairs], [p[1] for p in pairs])

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """f32 [n]: relevance of each document to ``query``: ``sigmoid(logit)`` for a
        one-label cross-encoder (sentence-transformers' ``CrossEncoder`` and vLLM's
        default), else the softmax probability of the last label."""
        logits = self.score_pairs([self.encode_pair(query, d, f"documents[{i}]")
                                   for i, d in enumerate(documents)])
        return relevance(logits)


def _checked_args(pooling, normalize, max_batch, max_tokens) -> int:
    """The rows per step (``max_batch``, default :data:`DEFAULT_POOL_BATCH`), once every
    option is checked (:class:`InvalidRequest` naming the first bad one)."""
    if pooling is not None and pooling not in POOLINGS:
        raise InvalidRequest("pooling", pooling, f"must be one of {', '.join(POOLINGS)}")
    if normalize is not None and not isinstance(normalize, bool):
        raise InvalidRequest("normalize", normalize, "must be true or false")
    max_batch = DEFAULT_POOL_BATCH if max_batch is None else positive("max_batch", max_batch)
    if max_tokens is not None:
        positive("max_tokens", max_tokens)
    return max_batch


def _bind_score_tokens(model, store, weights, tokenizer, family: str, score_tokens,
                       extra: dict) -> None:
    """Score with the LM head's logits of ``score_tokens`` (or the config's
    ``classifier_from_token``) when given: a decoder as a cross-encoder."""
    if score_tokens is None and isinstance(extra.get("classifier_from_token"), list):
        score_tokens = tuple(extra["classifier_from_token"])
    if score_tokens is None:
        return
    if not hasattr(model, "bind_token_classifier"):
        raise InvalidRequest("score_tokens", score_tokens, f"{family} has no "
                             f"LM head to score tokens with")
    model.bind_token_classifier(store, weights, _token_ids(score_tokens, tokenizer))


def _pooling_of(path: Path, model, pooling: str | None, normalize: bool | None
                ) -> tuple[str, bool, str]:
    """(pooling, normalize, where that was decided): the arguments, else the checkpoint's
    sentence-transformers files, else the family's default (encoders: mean; decoders:
    last token; normalized)."""
    st = read_pooling_config(path)
    source = st.source if st is not None else "default"
    encoder = bool(getattr(model, "encoder_only", False))
    pool = st.pooling if st is not None else ("mean" if encoder else "last")
    norm = st.normalize if st is not None else True
    if pooling is not None:
        pool, source = pooling, "argument"
    if normalize is not None:
        norm, source = normalize, "argument"
    return pool, norm, source


def _token_limit(cfg, max_tokens: int | None) -> int:
    """Tokens one input may hold: ``max_tokens`` (default :data:`DEFAULT_MAX_TOKENS`) capped
    at the model's trained context; an explicit value past it is refused."""
    ctx = int(cfg.max_position_embeddings or 0) or None
    limit = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
    if ctx is not None:
        if max_tokens is not None and max_tokens > ctx:
            raise InvalidRequest("max_tokens", max_tokens, f"more than the model's "
                                 f"context of {ctx} tokens (max_position_embeddings)")
        limit = min(limit, ctx)
    return limit


def _matryoshka(extra: dict) -> bool | tuple[int, ...]:
    """The truncated sizes the model was trained for (config ``matryoshka_dimensions``, or
    any with ``is_matryoshka``), else False."""
    dims = extra.get("matryoshka_dimensions")
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims) and dims:
        return tuple(dims)
    return bool(extra.get("is_matryoshka", False))


def _token_ids(tokens: Sequence[int | str], tokenizer) -> list[int]:
    out = []
    for t in tokens:
        if isinstance(t, int) and not isinstance(t, bool):
            out.append(t)
            continue
        tid = tokenizer.token_to_id(t) if tokenizer is not None and isinstance(t, str) \
            else None
        if tid is None:
            raise InvalidRequest("score_tokens", t, "not a token id nor a token of the "
                                 "checkpoint's tokenizer")
        out.append(tid)
    return out


def pooled_task(path: str | os.PathLike) -> str | None:
    """``"embed"`` or ``"score"`` when the checkpoint at ``path`` is served by pooled steps,
    None for a generating model: a ``...ForSequenceClassification`` architecture or a config
    with ``classifier_from_token`` scores; a
    folder with sentence-transformers' ``modules.json``, an encoder-only family (BERT) or a
    bare ``...Model`` architecture (a checkpoint with no LM head) embeds. Reads
    ``config.json`` only (a GGUF file or an unreadable config: None)."""
    p = Path(path)
    if not p.is_dir():
        return None
    try:
        cfg = load_config(p)
    except PootError:
        return None
    arch = cfg.architecture
    if arch.endswith("ForSequenceClassification") or \
            isinstance((cfg.extra or {}).get("classifier_from_token"), list):
        return "score"
    if (p / "modules.json").is_file() or arch.endswith("Model"):
        return "embed"
    if arch in REGISTRY and getattr(REGISTRY.lookup(arch), "encoder_only", False):
        return "embed"
    return None


def relevance(logits: np.ndarray) -> np.ndarray:
    """f32 [n]: scores from classifier logits [n, L]: ``sigmoid`` of the one logit when
    L = 1, else the softmax probability of label L-1."""
    logits = np.asarray(logits, np.float64)
    if logits.shape[1] == 1:
        return (1.0 / (1.0 + np.exp(-logits[:, 0]))).astype(np.float32)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e[:, -1] / e.sum(axis=1)).astype(np.float32)


__all__ = ["DEFAULT_MAX_TOKENS", "PoolingModel", "WrongTask", "pooled_task", "relevance"]
