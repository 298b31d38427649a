"""Reading an adapter folder a client named (``POST /v1/load_lora_adapter``), confined.

A client's ``lora_path`` is taken relative to the server's ``--lora-root`` (an absolute path
must lie in it too). The folder and its two files (``adapter_config.json``,
``adapter_model.safetensors``) are resolved with every symlink followed and must stay inside
the root; anything else -- a missing path, ``..`` or a symlink leading out, an absolute path
elsewhere -- is refused with the one error :func:`not_found`, which says nothing about what
exists outside the root. Inside it, each file must be a regular file (a FIFO or a device is
refused before it is read: opened ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat``, so
nothing blocks and nothing reads without end), no larger than its limit (1 MiB for the
config, ``max_lora_bytes`` for the tensors). Errors never quote the files' contents
(:func:`poot.models.lora.peft_adapter`).
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import Mapping

from poot.load.errors import LoadError
from poot.load.safetensors import parse_safetensors
from poot.models.lora import LoraAdapter, LoraError, config_object, peft_adapter

#: the largest ``adapter_config.json`` read (bytes)
MAX_CONFIG_BYTES = 1 << 20
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
    getattr(os, "O_CLOEXEC", 0)


def not_found(lora_path: str) -> LoraError:
    """The one error of a path that is missing, leaves the root, or is not a folder."""
    shown = lora_path if len(lora_path) <= 200 else lora_path[:197] + "..."
    return LoraError("lora_path", f"no adapter folder {shown!r} under this server's LoRA "
                     f"root (paths are relative to --lora-root and may not leave it)")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve(root: str, lora_path: str) -> str:
    """The adapter folder's real path, or :func:`not_found`."""
    if not isinstance(lora_path, str) or not lora_path or "\0" in lora_path:
        raise not_found(str(lora_path))
    folder = os.path.realpath(os.path.join(root, lora_path))
    try:
        st = os.stat(folder)
    except (OSError, ValueError):
        raise not_found(lora_path) from None
    if not _inside(folder, root) or not stat.S_ISDIR(st.st_mode):
        raise not_found(lora_path)
    return folder


def _open(root: str, folder: str, name: str, limit: int, lora_path: str) -> tuple[int, int]:
    """``(fd, size)`` of regular file ``name`` of ``folder`` (its real path inside ``root``,
    at most ``limit`` bytes); :class:`LoraError` naming it otherwise."""
    path = os.path.realpath(os.path.join(folder, name))
    if not _inside(path, root):
        raise not_found(lora_path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):     # no open of a FIFO or a device
            raise LoraError(name, "is not a regular file")
        fd = os.open(path, _FLAGS)
    except OSError as e:
        raise LoraError(name, "is missing" if e.errno == errno.ENOENT else
                        f"cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):               # swapped since the stat
            raise LoraError(name, "is not a regular file")
        link = f"/proc/self/fd/{fd}"
        if os.path.islink(link) and not _inside(os.path.realpath(link), root):
            raise not_found(lora_path)                 # swapped for a link out of the root
        if st.st_size > limit:
            raise LoraError(name, f"is {st.st_size} bytes, more than this server's limit of "
                            f"{limit} bytes")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_config(fd: int, size: int) -> dict:
    chunks, left = [], size
    while left > 0:
        b = os.read(fd, min(left, 1 << 16))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return config_object(b"".join(chunks))


def _read_tensors(fd: int, size: int, label: str) -> Mapping:
    try:
        buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        return parse_safetensors(label, buf, size)[0]
    except (LoadError, OSError, ValueError):
        raise LoraError("adapter_model.safetensors", "is not a valid safetensors file") \
            from None


def read_runtime_adapter(root: str, lora_path: str, base_types: Mapping, name: str,
                         max_bytes: int) -> LoraAdapter:
    """The PEFT adapter in folder ``lora_path`` under ``root`` (module doc), checked against
    the base model's weight types. Raises :class:`~poot.models.lora.LoraError`: field
    ``lora_path`` (:func:`not_found`), or the file or config field that is wrong."""
    real_root = os.path.realpath(root)
    folder = _resolve(real_root, lora_path)
    fd, size = _open(real_root, folder, "adapter_config.json", MAX_CONFIG_BYTES, lora_path)
    try:
        cfg = _read_config(fd, size)
    finally:
        os.close(fd)
    fd, size = _open(real_root, folder, "adapter_model.safetensors", max_bytes, lora_path)
    try:
        tensors = _read_tensors(fd, size, "adapter_model.safetensors")
    finally:
        os.close(fd)                                   # the map outlives the descriptor
    return peft_adapter(cfg, tensors, base_types, name)


__all__ = ["MAX_CONFIG_BYTES", "not_found", "read_runtime_adapter"]
