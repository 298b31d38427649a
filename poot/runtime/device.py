"""The per-backend device protocol the :class:`~poot.runtime.session.Session` runs over.

A device is thin: it owns buffers, moves bytes, loads a compiled program as a kernel, records a
kernel's launch over a fixed list of buffers, replays a recording, and reads buffers back. It
knows nothing about models, KV caches or sampling; the engine decides what is bound where.

Queued work (pipelining, :meth:`poot.runtime.session.Session.submit`): a device runs its work in
one queue, in the order it was issued. :meth:`Device.upload_async` and
:meth:`Device.download_async` are queued like a replay, so "write the inputs, replay, read the
outputs" can be issued for step n+1 before the host waits for step n. A synchronous device
(CPU) just does them at once; :attr:`Device.overlaps` says whether issuing ahead can overlap
host work with device work at all (the driver pipelines by default only where it does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from poot.dialects.types import DType, PackedType, PootType
from poot.errors import PootError


def host_dtype(t: PootType) -> np.dtype:
    """The numpy dtype of a buffer of type ``t`` as the host holds it (a CPU buffer, a
    pipeline's host copy): packed as uint8 bytes, bf16/f16 as uint16 words, i1 as one byte
    per element (numpy bool)."""
    if isinstance(t, PackedType):
        return np.dtype(np.uint8)
    if t.dtype in (DType.BF16, DType.F16):
        return np.dtype(np.uint16)
    return np.dtype(t.dtype.numpy)


def host_shape(t: PootType) -> tuple[int, ...]:
    """The shape of a host array of type ``t`` (packed: its bytes, one dimension)."""
    if isinstance(t, PackedType):
        return (t.nbytes,)
    return tuple(t.shape)


class DeviceError(PootError):
    """A device cannot be opened (a missing runtime package, driver or device: the message
    says what to install), or a buffer or binding it cannot accept (wrong type, shape, or
    program)."""


def row_regions(src: Any, dst: Any, runs: Sequence[tuple[int, int, int]]
                ) -> list[tuple[int, int, int]]:
    """The byte regions ``(src offset, dst offset, bytes)`` of a row copy
    (:meth:`Device.copy_rows_async`): ``runs`` are ``(src row, dst row, rows)`` over the first
    axis of two buffers (anything with ``shape`` and ``dtype``) whose rows hold the same bytes.
    Runs that continue one another are merged. Raises :class:`DeviceError` for rows of
    unequal size or a run outside either buffer."""
    row_s = int(np.prod(src.shape[1:], dtype=np.int64)) * np.dtype(src.dtype).itemsize
    row_d = int(np.prod(dst.shape[1:], dtype=np.int64)) * np.dtype(dst.dtype).itemsize
    if row_s != row_d or not src.shape or not dst.shape:
        raise DeviceError(f"cannot copy rows of a {list(src.shape)} x {np.dtype(src.dtype)} "
                          f"buffer into a {list(dst.shape)} x {np.dtype(dst.dtype)} one")
    out: list[list[int]] = []
    for s, d, n in runs:
        if n <= 0:
            continue
        if s < 0 or d < 0 or s + n > src.shape[0] or d + n > dst.shape[0]:
            raise DeviceError(f"rows {s}..{s + n - 1} -> {d}..{d + n - 1} are outside a "
                              f"copy from {src.shape[0]} rows into {dst.shape[0]}")
        if out and out[-1][0] + out[-1][2] == s * row_s and out[-1][1] + out[-1][2] == d * row_s:
            out[-1][2] += n * row_s
        else:
            out.append([s * row_s, d * row_s, n * row_s])
    return [(a, b, c) for a, b, c in out]


#: Argument roles of a kernel, in the order a device reports them.
ROLES = ("input", "param", "output")


@dataclass(frozen=True)
class KernelArg:
    """One argument of a loaded kernel: its role (``input``/``param``/``output``), the
    graph-level name and its type."""

    role: str
    name: str
    type: PootType


@runtime_checkable
class Kernel(Protocol):
    """A program loaded on a device: ``args`` lists its arguments in call order."""

    args: Sequence[KernelArg]


@runtime_checkable
class Readback(Protocol):
    """A queued read of a buffer (:meth:`Device.download_async`): the buffer's value at the
    point in the queue where the read was issued."""

    def wait(self) -> np.ndarray:
        """Wait for the read and return a host copy (once; the readback is spent after)."""
        ...

    def release(self) -> None:
        """Give the read up without waiting (its value is not needed)."""
        ...


class Ready:
    """A :class:`Readback` whose value is already on the host (synchronous devices)."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value

    def wait(self) -> np.ndarray:
        return self.value

    def release(self) -> None:
        self.value = None


@runtime_checkable
class Device(Protocol):
    """What a backend provides to the engine.

    Buffers are opaque handles typed by a :class:`~poot.dialects.types.PootType`;
    :meth:`upload` rewrites one in place (its identity, and so every recording that binds it,
    stays valid). :meth:`record` fixes a kernel's arguments to buffers once; :meth:`replay`
    launches that recording again with no per-call argument work.
    """

    name: str
    #: True when :meth:`replay` (and the async transfers) return before the device finished,
    #: so issuing step n+1 before reading step n's result overlaps host and device work.
    overlaps: bool

    def alloc(self, type_: PootType) -> Any:
        """A zero-filled buffer of ``type_`` (packed weights: their stored bytes)."""
        ...

    def upload(self, buffer: Any, array: np.ndarray) -> None:
        """Write ``array`` into ``buffer`` in place (same shape and element type)."""
        ...

    def download(self, buffer: Any) -> np.ndarray:
        """A host copy of ``buffer`` (after any pending work finished)."""
        ...

    def load(self, program: Any) -> Kernel:
        """Load a compiled :class:`~poot.compiler.Program` for this device."""
        ...

    def upload_async(self, buffer: Any, array: np.ndarray) -> None:
        """Queue a write of ``array`` into ``buffer``: it lands after the work issued before
        and before the work issued after. The device takes its own copy of ``array`` (into
        staging memory it keeps alive until the queue has read it), so the caller may reuse
        ``array`` at once. A synchronous device writes at once (:meth:`upload`)."""
        ...

    def download_async(self, buffer: Any) -> Readback:
        """Queue a read of ``buffer`` after the work issued so far; ``wait()`` returns its value
        as of that point even if later queued work rewrites the buffer."""
        ...

    def record(self, kernel: Kernel, bindings: Sequence[Any],
               copies: Sequence[tuple[Any, Any]] = ()) -> Any:
        """Record one launch of ``kernel`` with ``bindings[i]`` bound to ``kernel.args[i]``,
        followed by the device-to-device ``copies`` ``(src, dst)`` in order (whole buffers of
        equal byte size; e.g. the sampled token fed back into the next step's token input).
        Every replay runs them after the kernel."""
        ...

    def replay(self, recording: Any) -> None:
        """Launch a recording again (the bound buffers' current contents are read)."""
        ...

    def copy_rows_async(self, src: Any, dst: Any, runs: Sequence[tuple[int, int, int]]
                        ) -> None:
        """Queue device-to-device copies of rows (first axis) of ``src`` into ``dst``, after the
        work issued so far: ``runs`` are ``(src row, dst row, rows)`` (:func:`row_regions`
        checks them). The engine feeds a step's token input from the rows the previous step
        sampled, in another order, with no host round trip. A synchronous device copies at
        once. Optional: on a device without it the engine reads a step before it issues one
        whose rows differ (:attr:`Session.copies_rows
        <poot.runtime.session.Session.copies_rows>`)."""
        ...

    def synchronize(self) -> None:
        """Wait for launched work (a no-op on a synchronous device)."""
        ...
