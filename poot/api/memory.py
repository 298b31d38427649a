"""The KV pool of a load: its size from the options, checked against the model's context and
the memory available before anything is allocated (every refusal an
:class:`~poot.sampling_params.InvalidRequest` naming the option)."""

from __future__ import annotations

import os

from poot.api.options import DEFAULT_KV_CAPACITY, positive
from poot.compiler.planning import kv_block_size
from poot.dialects.kv_quant import FP8, KV_FORMATS, KvQuant, kv_value_bytes
from poot.dialects.types import DType
from poot.engine import KVConfig
from poot.models import default_kv_dtype
from poot.sampling_params import InvalidRequest


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation: ``MemAvailable`` from /proc/meminfo,
    else the physical memory (``os.sysconf``); None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def kv_cache_bytes(model, kv_capacity: int, slots: int = 1, itemsize: int = 4) -> int:
    """Bytes of the KV caches of every layer for ``slots`` sequences of ``kv_capacity``
    positions: layers x slots x capacity x ``kv_token_elems`` x itemsize."""
    d = model.dims()
    return d.n_layers * slots * kv_capacity * d.kv_token_elems * itemsize


def kv_bytes_per_token(dims) -> dict[str, int | None]:
    """Bytes one position's K/V take over every layer, per KV storage name
    (:data:`~poot.dialects.kv_quant.KV_FORMATS`; fp8: ``D + 4`` bytes a head vector), for a
    model of ``dims`` (:class:`~poot.models.StepDims`); None where the model's heads cannot
    hold it (q8_0 with a head dim that is not a multiple of 32)."""
    out: dict[str, int | None] = {}
    width = dims.head_dim if dims.kv_elems_per_token is None else dims.kv_token_elems
    for name, fmt in KV_FORMATS.items():
        ok = not isinstance(fmt, KvQuant) or width % (fmt.group or width) == 0
        out[name] = int(round(dims.n_layers * dims.kv_token_elems *
                              kv_value_bytes(fmt, width))) if ok else None
    return out


def check_kv_memory(model, kv: KVConfig) -> None:
    """Refuse (:class:`InvalidRequest` naming ``kv_blocks``) a KV pool larger than the memory
    available."""
    d = model.dims()
    need, avail = kv.bytes(d), available_memory()
    if avail is not None and need > avail:
        raise InvalidRequest("kv_blocks", kv.num_blocks - 1, f"the KV pool would need "
                             f"{need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB "
                             f"of memory available (lower --max-batch, --kv-blocks or "
                             f"--kv-capacity)")


def check_kv_capacity(model, kv_capacity: int | None, ctx: int | None,
                      slots: int = 1) -> int:
    """The KV capacity to use: ``None`` is the default capped at the model's trained context
    ``ctx``; an explicit value past ``ctx`` or whose cache does not fit in memory is
    refused."""
    positive("slots", slots)
    if kv_capacity is None:
        kv_capacity = min(DEFAULT_KV_CAPACITY, ctx) if ctx else DEFAULT_KV_CAPACITY
    elif ctx and kv_capacity > ctx:
        raise InvalidRequest("kv_capacity", kv_capacity, f"more than the model's context of "
                             f"{ctx} tokens (max_position_embeddings)")
    need, avail = kv_cache_bytes(model, kv_capacity, slots, 2), available_memory()
    if avail is not None and need > avail:
        raise InvalidRequest("kv_capacity", kv_capacity, f"the KV cache would need "
                             f"{need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB "
                             f"of memory available")
    return kv_capacity


def plan_kv(model, weight_types, target, kv_capacity: int, max_batch: int,
            kv_blocks: int | None, kv_dtype, kv_memory: int | None = None,
            kv_dtype_v=None) -> KVConfig:
    """The paged KV pool for ``target``: blocks of its block size, ``kv_blocks`` usable ones
    (None: ``max_batch`` sequences of ``kv_capacity`` positions, a checked capacity) or as
    many as ``kv_memory`` bytes hold (each block's bytes follow the storage: q8_0 about half
    of f16's), plus the null block; ``kv_dtype`` (None: the model's default for its weights
    and the target's storage types) and ``kv_dtype_v`` (V's, None: K's), each checked by
    :func:`check_kv_storage`. Raises :class:`InvalidRequest` naming ``kv_memory`` when it
    holds less than two blocks, or the KV dtype option a storage is refused for."""
    bs = kv_block_size(target)
    width = -(-kv_capacity // bs)
    blocks = kv_blocks + 1 if kv_blocks is not None else max_batch * width + 1
    k = kv_dtype or default_kv_dtype(weight_types, target.caps.storage_dtypes)
    v = kv_dtype_v or k
    dims = model.dims()
    check_kv_storage(dims, target, k, "kv_dtype" if v is k else "kv_dtype_k")
    if v is not k:
        check_kv_storage(dims, target, v, "kv_dtype_v")
        if dims.kv_elems_per_token is not None:
            raise InvalidRequest("kv_dtype_v", v.value, "this model keeps one latent KV pool "
                                 "(multi-head latent attention): give kv_dtype, not K and V")
    kv = KVConfig(block_size=bs, num_blocks=blocks, max_model_len=kv_capacity,
                  kv_dtype=k, kv_dtype_v=None if v is k else v)
    if kv_memory is None:
        return kv
    per_block = kv.bytes(dims) // kv.num_blocks
    if kv_memory < 2 * per_block:       # one usable block and the null block
        raise InvalidRequest("kv_memory", kv_memory, f"less than two KV blocks "
                             f"({per_block} bytes each)")
    return KVConfig(block_size=bs, num_blocks=kv_memory // per_block,
                    max_model_len=kv_capacity, kv_dtype=kv.kv_dtype, kv_dtype_v=kv.kv_dtype_v)


def check_kv_storage(dims, target, storage, option: str) -> None:
    """Refuse (:class:`InvalidRequest` naming ``option``), before anything compiles, a KV
    ``storage`` that ``target`` cannot read in its attention kernels (one not listed in its
    ``Capabilities.kv_formats``: fp8 needs CUDA sm_89 or newer) or that the
    model's heads cannot be cut into (q8_0: a head dim, or MLA's latent width, that is a
    multiple of 32, and on a target storing no f16 an even number of scales a position;
    ``dims``: :class:`~poot.models.StepDims`)."""
    if not isinstance(storage, KvQuant):
        return
    if storage.value not in target.caps.kv_formats:
        what = ("fp8 (e4m3) KV storage needs a device that converts fp8 in hardware "
                "(CUDA sm_89 or newer)" if storage is FP8
                else f"{storage.value} KV storage needs an attention kernel that reads it")
        # the float dtypes the target stores as such (wgpu stores no 16-bit float: f32)
        floats = [d.value for d in (DType.F16, DType.BF16)
                  if d in target.caps.storage_dtypes] or [DType.F32.value]
        other = ", ".join([*floats, *sorted(target.caps.kv_formats)])
        raise InvalidRequest(option, storage.value, f"{what}, which the {target.backend} "
                             f"target lacks (use {other})")
    width = dims.head_dim if dims.kv_elems_per_token is None else dims.kv_token_elems
    if storage.group and width % storage.group:
        raise InvalidRequest(option, storage.value, f"{storage.value} keeps one scale per "
                             f"{storage.group} values of a head; this model's head dim "
                             f"{width} is not a multiple of {storage.group}")
    if not storage.group:               # fp8: one f32 scale a head vector
        return
    scales = width // storage.group * (dims.n_kv_heads if dims.kv_elems_per_token is None
                                       else 1)
    if DType.F16 not in target.caps.storage_dtypes and scales % 2:
        raise InvalidRequest(option, storage.value, f"the {target.backend} target stores "
                             f"q8_0 scales two a 32-bit word (no 16-bit storage), and a "
                             f"position's {scales} scales (kv heads x head dim / "
                             f"{storage.group}) would share a word with the next position's")


__all__ = ["available_memory", "check_kv_capacity", "check_kv_memory", "check_kv_storage",
           "kv_bytes_per_token", "kv_cache_bytes", "plan_kv"]
