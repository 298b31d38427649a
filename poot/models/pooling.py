"""Pooled steps: one forward over whole sequences, no KV cache, a vector (or scores) per row.

Embedding models (sentence-transformers checkpoints, Qwen3-Embedding, gte-Qwen2) and
cross-encoders (BERT ``ForSequenceClassification``) run one step per batch of whole inputs.
A family that can serve one traces :class:`PoolSpec` with ``trace_pooled(spec, types)``::

    inputs   tokens       i32 [B, T]   token ids, each row right-padded
             positions    i32 [B, T]   0..T-1 per row (absolute positions)
             token_types  i32 [B, T]   segment ids (BERT ``token_type_ids``); only families
                                       with token-type embeddings declare it
             lengths      i32 [B]      valid tokens of each row (0: an idle row)
    outputs  embeddings   f32 [B, H]   pooled final hidden states (``outputs="embeddings"``)
          or scores       f32 [B, L]   the classification head's logits (``outputs="scores"``)

Padding: key ``s`` of row ``b`` is visible only when ``s < lengths[b]`` (decoders also keep
their causal mask), so a row's result does not depend on its padding or on the other rows.

Pooling (sentence-transformers ``Pooling``, ``1_Pooling/config.json``): ``"cls"`` takes
token 0, ``"mean"`` averages the valid tokens, ``"last"`` takes token ``lengths - 1``; each
is spelled as a weighted sum of the hidden states over T with per-row weights computed from
``lengths`` in the graph. ``normalize`` divides by the L2 norm
(``torch.nn.functional.normalize``: ``x / max(||x||, 1e-12)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, Tensor, TraceLimits
from poot.models.base import ModelError, StepSpec, trace_limits

Pooling = Literal["cls", "mean", "last"]
POOLINGS = ("cls", "mean", "last")
PoolOutputs = Literal["embeddings", "scores"]


@dataclass(frozen=True)
class PoolSpec:
    """The shape of one pooled step (module doc).

    Attributes:
        batch: rows per step, B >= 1. tokens: positions per row, T >= 1.
        pooling: ``"cls"``, ``"mean"`` or ``"last"`` (ignored for ``outputs="scores"``: the
            classifier reads what its family pools).
        normalize: L2-normalize the pooled vector.
        outputs: ``"embeddings"`` or ``"scores"`` (a sequence-classification head).

    Raises :class:`ModelError` on a field out of its domain.
    """

    batch: int
    tokens: int
    pooling: Pooling = "mean"
    normalize: bool = False
    outputs: PoolOutputs = "embeddings"

    def __post_init__(self):
        for k in ("batch", "tokens"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ModelError(f"PoolSpec.{k} must be a positive int, got {v!r}")
        if self.pooling not in POOLINGS:
            raise ModelError(f"PoolSpec.pooling must be one of {', '.join(POOLINGS)}, got "
                             f"{self.pooling!r}")
        if self.outputs not in ("embeddings", "scores"):
            raise ModelError(f"PoolSpec.outputs must be 'embeddings' or 'scores', got "
                             f"{self.outputs!r}")

    @property
    def kind(self) -> str:
        return "pooled"

    @property
    def n_tokens(self) -> int:
        return self.batch * self.tokens


@dataclass
class PoolInputs:
    """The declared inputs of a pooled step (``token_types`` None when not declared)."""

    tokens: Tensor
    positions: Tensor
    token_types: Tensor | None
    lengths: Tensor


def pool_inputs(b: Builder, spec: PoolSpec, token_types: bool = False) -> PoolInputs:
    """Declare ``tokens``, ``positions``, (``token_types``,) ``lengths`` in that order."""
    bt = (spec.batch, spec.tokens)
    tokens = b.input("tokens", TensorType(bt, DType.I32))
    positions = b.input("positions", TensorType(bt, DType.I32))
    types = b.input("token_types", TensorType(bt, DType.I32)) if token_types else None
    lengths = b.input("lengths", TensorType((spec.batch,), DType.I32))
    return PoolInputs(tokens, positions, types, lengths)


def pool_limits(spec: PoolSpec, dims) -> TraceLimits:
    """:class:`~poot.graph.builder.TraceLimits` of a pooled step for a model of ``dims``
    (:class:`~poot.models.base.StepDims`): those of a prefill of the same B x T rows over a
    cache of T positions a row (a bound on the attention scores and activations; the pooled
    step holds no cache, so this over-counts)."""
    return trace_limits(StepSpec.prefill(spec.tokens, batch=spec.batch,
                                         kv_capacity=spec.tokens, kv_slots=spec.batch), dims)


def key_mask(b: Builder, lengths: Tensor, tokens: int) -> Tensor:
    """i1 [B, T, T]: ``mask[b, t, s] = s < lengths[b]`` (padded keys invisible)."""
    (bsz,) = lengths.shape
    s = b.iota([bsz, tokens, tokens], 2, DType.I32)
    n = b.broadcast_to(b.reshape(lengths, (bsz, 1, 1)), (bsz, tokens, tokens))
    return b.compare("lt", s, n)


def pool_weights(b: Builder, lengths: Tensor, tokens: int, pooling: str) -> Tensor:
    """f32 [B, T]: the weight of each token in the pooled vector (module doc)."""
    (bsz,) = lengths.shape
    t = b.iota([bsz, tokens], 1, DType.I32)
    n = b.broadcast_to(b.reshape(lengths, (bsz, 1)), (bsz, tokens))
    zero, one = b.scalar(0.0), b.scalar(1.0)
    if pooling == "cls":
        return b.select(b.compare("eq", t, b.scalar(0, DType.I32)), one, zero)
    if pooling == "last":
        return b.select(b.compare("eq", t, n - b.scalar(1, DType.I32)), one, zero)
    if pooling == "mean":
        valid = b.select(b.compare("lt", t, n), one, zero)
        count = b.binary("max", b.cast(n, DType.F32), one)
        return valid / count
    raise ModelError(f"unknown pooling {pooling!r} (known: {', '.join(POOLINGS)})")


def pool(b: Builder, hidden: Tensor, lengths: Tensor, pooling: str, normalize: bool) -> Tensor:
    """f32 [B, H]: ``hidden`` f32 [B, T, H] pooled over T (:func:`pool_weights`), then
    L2-normalized when ``normalize``."""
    bsz, t, h = hidden.shape
    w = b.reshape(pool_weights(b, lengths, t, pooling), (bsz, t, 1))
    x = b.reduce("sum", hidden * w, 1)
    if normalize:
        ss = b.reduce("sum", x * x, -1, keepdims=True)
        x = x * b.unary("rsqrt", b.binary("max", ss, b.scalar(1e-24)))
    return x


def finish_pooled(b: Builder, spec: PoolSpec, hidden: Tensor, lengths: Tensor):
    """Close an ``outputs="embeddings"`` step: ``embeddings`` = :func:`pool` of ``hidden``."""
    with b.scope("pool"):
        return b.finish({"embeddings": pool(b, hidden, lengths, spec.pooling,
                                            spec.normalize)})


# --- sentence-transformers configuration --------------------------------------------------------

@dataclass(frozen=True)
class PoolingConfig:
    """How a checkpoint pools, as its sentence-transformers files say.

    Attributes:
        pooling: ``"cls"``, ``"mean"`` or ``"last"``.
        normalize: a ``Normalize`` module follows the pooling.
        source: the file it was read from (None: not read from a file).
    """

    pooling: Pooling
    normalize: bool
    source: str | None = None


_ST_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
             "pooling_mode_lasttoken": "last"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")


def read_pooling_config(folder: str | Path) -> PoolingConfig | None:
    """The pooling of a sentence-transformers checkpoint folder, or None when it has no
    ``modules.json``.

    Format (sentence-transformers ``SentenceTransformer.save``): ``modules.json`` lists the
    modules in order, each ``{"idx", "name", "path", "type"}``; the ``Pooling`` module's
    folder (``1_Pooling/``) holds ``config.json`` with ``pooling_mode_cls_token`` /
    ``pooling_mode_mean_tokens`` / ``pooling_mode_lasttoken`` ... (exactly one true, or the
    newer ``pooling_mode`` string); a ``sentence_transformers.models.Normalize`` module
    after it means L2 normalization. Raises :class:`ModelError` naming the file and field for
    a malformed file, a pooling mode poot does not compute (max, mean-sqrt-len, weighted
    mean) or a module it cannot run (``Dense``, ...).
    """
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    mfile = folder / "modules.json"
    if not mfile.is_file():
        return None
    try:
        modules = json.loads(mfile.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{mfile}: not readable JSON ({e})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelError(f"{mfile}: must be a list of module objects")
    pooling, normalize = None, False
    for m in modules:
        kind = str(m.get("type", ""))
        short = kind.rsplit(".", 1)[-1]
        if short in ("Transformer", "Transformers"):
            continue
        if short == "Pooling":
            pfile = folder / str(m.get("path", "")) / "config.json"
            pooling = _read_st_pooling(pfile)
        elif short == "Normalize":
            normalize = True
        else:
            raise ModelError(f"{mfile}: module {m.get('name')!r} of type {kind!r} is not "
                             f"supported (supported: Transformer, Pooling, Normalize)")
    if pooling is None:
        raise ModelError(f"{mfile}: no sentence_transformers.models.Pooling module")
    return PoolingConfig(pooling, normalize, str(mfile))


def _read_st_pooling(pfile: Path) -> Pooling:
    try:
        cfg = json.loads(pfile.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{pfile}: not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{pfile}: must be a JSON object")
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        name = {"cls": "cls", "mean": "mean", "lasttoken": "last"}.get(mode)
        if name is None:
            raise ModelError(f"{pfile}: pooling_mode {mode!r} is not supported (supported: "
                             f"cls, mean, lasttoken)")
        return name  # type: ignore[return-value]
    bad = [k for k in _ST_UNSUPPORTED if cfg.get(k)]
    if bad:
        raise ModelError(f"{pfile}: {bad[0]} is not supported (supported: "
                         f"{', '.join(_ST_MODES)})")
    on = [v for k, v in _ST_MODES.items() if cfg.get(k)]
    if len(on) != 1:
        raise ModelError(f"{pfile}: exactly one of {', '.join(_ST_MODES)} must be true, "
                         f"found {len(on)}")
    return on[0]  # type: ignore[return-value]


__all__ = ["POOLINGS", "PoolInputs", "PoolSpec", "PoolingConfig", "finish_pooled", "key_mask",
           "pool", "pool_inputs", "pool_limits", "pool_weights", "read_pooling_config"]
