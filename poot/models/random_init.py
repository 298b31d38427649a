"""Random-init weights of a config's shapes, for benchmarks: no checkpoint file needed.

    loaded = load_random_model("bench/shapes/llama-3.2-1b.json", dtype="bf16")
    model, weights = loaded            # weights.types as a checkpoint of that config would have

The family, its config and its weight binding are the ones a real checkpoint gets
(``family.from_config`` + ``model.bind``), over a store of :class:`RandomArray` tensors named
as the HF checkpoint names them. So the traced step, and its compile-cache key, are the ones a
real checkpoint of the same shapes and dtype gets.

Shapes follow the HF ``nn.Linear`` layout ``[out_features, in_features]`` of the shared
decoder roles (:func:`poot.models.components.decoder_weight_names`, ``dense_ffn_names``): an
embedding / head ``[vocab, hidden]``, q ``[heads*head_dim, hidden]``, k/v
``[kv_heads*head_dim, hidden]``, o ``[hidden, heads*head_dim]``, gate/up
``[intermediate, hidden]``, down ``[hidden, intermediate]``, fused qkv / gate_up stacked on
the rows, norms ``[hidden]`` (q/k norms ``[head_dim]``); MoE routers, stacked experts
``[E, ffn, hidden]`` and shared experts; multi-head latent attention's projections. Optional
roles (biases) are left out; a role with no rule here is refused with :class:`ModelError`,
and so are weights that would not fit in this machine's memory (checked before any is made).
The same rules (:mod:`poot.models.role_shapes`) check a real checkpoint's tensors against its
config at bind.

Values: matrices N(0, 1/fan_in) (``fan_in`` = the last dimension: each projection keeps unit
variance, so activations stay O(1) through the layers and finite in bf16); 1-D weights
(norm scales) are 1. A :class:`RandomArray` is not materialized up front: it is a recipe of
chunks copied from one shared pool of normal samples (seeded), so a device can fill its
buffer from the pool without the host ever holding the whole tensor (16 GB for an 8B model),
and ``np.asarray`` gives the same values on the host.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from poot.dialects.quant import BY_NAME
from poot.load.config import _read_json, config_from_hf
from poot.load.store import DType, StoredTensor
from poot.models import families  # noqa: F401  (registers every family in REGISTRY)
from poot.models.base import REGISTRY, LoadedModel, ModelError
from poot.models.role_shapes import role_shape

#: Elements of the shared pool of N(0, 1) samples (f32; 64 MiB) and of one copied chunk.
POOL_ELEMS = 1 << 24
CHUNK_ELEMS = 1 << 20

_POOLS: dict[int, np.ndarray] = {}


def pool(seed: int) -> np.ndarray:
    """The f32 [POOL_ELEMS] N(0, 1) pool of ``seed`` (made once per process)."""
    p = _POOLS.get(seed)
    if p is None:
        p = _POOLS[seed] = np.random.default_rng(seed).standard_normal(
            POOL_ELEMS, dtype=np.float32)
    return p


class RandomArray:
    """A weight tensor described, not stored: ``shape``/``dtype`` (numpy), ``scale`` (the
    std; 0 means every element is 1: a norm scale), the pool ``seed`` and a ``salt`` (its
    name) that picks where its chunks start in the pool.

    Element ``k`` of chunk ``c`` (``CHUNK_ELEMS`` elements each, the last one shorter) is
    ``scale * pool[start(c) + k]``, ``start(c)`` a hash of (salt, c) in
    ``[0, POOL_ELEMS - CHUNK_ELEMS]``. :meth:`chunks` lists them; ``np.asarray`` builds it.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, scale: float, seed: int = 0,
                 salt: str = ""):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.scale, self.seed, self.salt = float(scale), int(seed), salt

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def chunks(self):
        """(first element, pool offset, elements) of each chunk, in order."""
        n = self.size
        for c, first in enumerate(range(0, n, CHUNK_ELEMS)):
            h = hashlib.blake2b(f"{self.salt}/{c}".encode(), digest_size=8).digest()
            start = int.from_bytes(h, "little") % (POOL_ELEMS - CHUNK_ELEMS + 1)
            yield first, start, min(CHUNK_ELEMS, n - first)

    def scaled_pool(self) -> np.ndarray:
        """The pool times ``scale`` in this array's dtype (what chunks are copied from)."""
        return (pool(self.seed) * np.float32(self.scale)).astype(self.dtype)

    def __array__(self, dtype=None, copy=None):
        if self.scale == 0.0:
            out = np.ones(self.shape, self.dtype)
        else:
            src, flat = self.scaled_pool(), np.empty(self.size, self.dtype)
            for first, start, n in self.chunks():
                flat[first:first + n] = src[start:start + n]
            out = flat.reshape(self.shape)
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"RandomArray({list(self.shape)}, {self.dtype}, std={self.scale:g})"


_DTYPES = {"bf16": "bf16", "f16": "f16", "f32": "f32"}
#: GGUF block formats random weights may be packed in: each matrix's random floats quantized
#: by the ``gguf`` package (llama.cpp's reference quantizer); vectors (norms) stay f32
PACKED = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def _quantized(name: str, data: "RandomArray", fmt: str, source: str):
    """The StoredTensor of ``data`` quantized to ``fmt`` (rows of whole blocks)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    q = BY_NAME[fmt]
    if data.shape[-1] % q.block_elems:
        raise ModelError(f"random weights: {name} has {data.shape[-1]} columns, not a whole "
                         f"number of {fmt} blocks ({q.block_elems})")
    packed = quantize(np.asarray(data, np.float32), GGMLQuantizationType[fmt.upper()])
    return StoredTensor(name, data.shape, None, q, packed, source)


#: bytes a weight element takes when packed, by GGUF block format (block bytes / 32)
_PACKED_BYTES = {"q4_0": 18 / 32, "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32,
                 "q8_0": 34 / 32}


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_fits(model: Any, o: Any, dtype: str, itemsize: int) -> None:
    """Refuse, before anything is allocated, random weights that need more bytes than this
    machine's memory (they are materialized on the host to be bound): a ModelError giving
    both sizes."""
    total = 0.0
    for role_t, where in model.weight_table().items():
        if where.optional or where.hf is None:
            continue
        layers = o.num_layers if "{i}" in role_t else 1
        role = role_t.format(i=0) if "{i}" in role_t else role_t
        shape = role_shape(role, o)
        n = float(np.prod(shape, dtype=np.float64))
        per = _PACKED_BYTES[dtype] if dtype in PACKED and len(shape) - bool(where.stack) == 2 \
            else itemsize
        total += layers * n * per
    mem = _memory_bytes()
    if mem is not None and total > mem:
        raise ModelError(f"random weights: this config's {dtype} weights need "
                         f"{total / 2**30:,.1f} GiB, more than this machine's "
                         f"{mem / 2**30:,.1f} GiB of memory")


def load_random_model(config: str | os.PathLike, dtype: str = "bf16", seed: int = 0,
                      check_memory: bool = True) -> LoadedModel:
    """The family of the HF ``config.json`` (a file, or a folder holding one) with random
    weights of ``dtype`` (``bf16``/``f16``/``f32``, or a GGUF block format of :data:`PACKED`
    for the matrices, vectors then f32) bound as a checkpoint would bind them.
    Raises :class:`ModelError` (unsupported dtype, a role without a shape rule, weights larger
    than this machine's memory unless ``check_memory`` is False: a compile that reads only
    the weights' types) or :class:`~poot.load.errors.LoadError` (a bad config)."""
    if dtype not in _DTYPES and dtype not in PACKED:
        raise ModelError(f"random weights: dtype must be one of "
                         f"{', '.join((*_DTYPES, *PACKED))}, got {dtype!r}")
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    cfg = config_from_hf(_read_json(path), path)
    family = REGISTRY.lookup(cfg.architecture)
    model = family.from_config(cfg, None)
    o = model.options()
    st = DType(_DTYPES.get(dtype, "f32"))
    if check_memory:
        _check_fits(model, o, dtype, st.numpy.itemsize)
    store: dict[str, StoredTensor] = {}
    for role_t, where in model.weight_table().items():
        if where.optional or where.hf is None:
            continue
        for i in (range(o.num_layers) if "{i}" in role_t else [None]):
            role = role_t.format(i=i) if i is not None else role_t
            name = where.hf.format(i=i, e="{e}") if i is not None else where.hf
            shape = role_shape(role, o)
            # a stacked role is stored as its tensors (HF's per-expert ones), stacked by bind
            names = [name.format(e=e) for e in range(where.stack)] if where.stack else [name]
            shape = shape[1:] if where.stack else shape
            for nm in names:
                scale = 0.0 if len(shape) == 1 else 1.0 / float(np.sqrt(shape[-1]))
                data = RandomArray(shape, st.numpy, scale, seed, salt=nm)
                if dtype in PACKED and len(shape) == 2:
                    store[nm] = _quantized(nm, data, dtype, f"random:{seed}")
                else:
                    store[nm] = StoredTensor(nm, shape, st, None, data, f"random:{seed}")
    return LoadedModel(model, model.bind(store), store)


__all__ = ["CHUNK_ELEMS", "POOL_ELEMS", "RandomArray", "load_random_model", "pool"]
