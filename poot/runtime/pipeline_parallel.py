"""The layer pipeline's coordinator: one executor :class:`~poot.runtime.device.Device` over
N devices, each running one stage of a
:class:`~poot.compiler.pipeline_parallel.PipelineProgram`.

The engine (:class:`~poot.runtime.session.Session`) and everything above it see one device
with the step's own interface; :class:`PipelineDevice` places the work:

* a :class:`PipelineProgram` (a step cut by :func:`poot.compiler.pipeline_parallel.partition`) runs
  stage ``s`` on device ``s``; a plain program (a sampler: no weights) runs on the last
  device, where the logits are.
* an engine buffer is a :class:`PipelineBuffer`: one real buffer on each device whose stage
  binds it, made when a recording first binds it there. A weight lives on the devices of the
  stages that read it (its host array is held until then); a KV pool only on its layer's
  device; a step input on every device that reads it.
* coherence: each buffer knows which of its copies hold the current value. A stage's
  outputs are current on its device only; before a stage runs, every input it reads that is
  stale on its device is copied from a device where it is current (the sampled token fed
  back into the first stage's token input). Boundary values (``pipeline.v*``) go from the
  sender's buffer to the receiver's, both made once per loaded kernel.
* ordering: a copy from device ``a`` to device ``b`` is queued on ``b`` after
  ``b.wait_for(a.signal())``, and ``b`` signals again right after it; before a stage writes
  on ``a`` again, ``a`` waits for those markers (no copy reads a buffer the next step
  already overwrites), and only for them: not for ``b``'s compute after the copy, so stage
  0 runs micro-batch k + 1 while stage 1 runs micro-batch k.
  Devices without these operations (the CPU, or any synchronous device) copy through the
  host: ``dst.upload(src.download())``.

Replay issues each stage's own recording (a CUDA graph per stage on its device), the peer
copies and the event waits; it creates no device objects. The CUDA device provides
``signal``/``wait_for``/``copy_from`` (``cuEventRecord``, ``cuStreamWaitEvent``,
``cuMemcpyPeerAsync``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from poot.backends.registry import BACKENDS, hook
from poot.compiler.pipeline_parallel import BOUNDARY_PREFIX, PipelineProgram
from poot.errors import PootError
from poot.runtime.device import DeviceError, KernelArg, Ready, host_dtype, host_shape


class PipelineError(PootError):
    """A pipeline the devices cannot hold or run (stage count, memory, bindings)."""


class PipelineBuffer:
    """An engine buffer of a :class:`PipelineDevice`: ``copies[d]`` the real buffer on device
    ``d`` (made on first binding), ``valid`` the devices whose copy is current, ``host`` an
    array written before any copy existed (a weight, until a stage binds it), ``written``
    (device, marker) recorded right after the replay that last wrote it there (None: not
    written by a replay, or the device has no markers)."""

    __slots__ = ("type", "copies", "valid", "host", "written")

    def __init__(self, type_):
        self.type = type_
        self.copies: dict[int, Any] = {}
        self.valid: set[int] = set()
        self.host = None
        self.written: tuple | None = None


@dataclass
class _StageRun:
    device: int
    kernel: Any
    args: list            # (role, name) of the stage kernel's args
    receives: list        # (boundary name, sending device)
    recording: Any = None


@dataclass
class PipelineKernel:
    """A program loaded across the devices: ``args`` (the step's interface), one
    :class:`_StageRun` per stage, the boundary buffers (name -> {device: buffer})."""

    args: list[KernelArg]
    stages: list[_StageRun]
    boundary: dict[str, dict[int, Any]]
    program: Any


@dataclass
class PipelineRecording:
    """A recorded pipeline launch: per stage (its run, the device's own recording, the
    engine buffers it reads, those it writes), and the recorded copies' destinations with
    the device they are written on."""

    kernel: PipelineKernel
    stages: list                     # per stage: (device recording, inputs, outputs)
    feedback: list                   # (src PipelineBuffer, dst PipelineBuffer, device)


class PipelineDevice:
    """N devices as one executor device (module doc). ``devices[s]`` runs stage ``s``."""

    overlaps = False

    def __init__(self, devices: Sequence[Any]):
        if len(devices) < 1:
            raise PipelineError("a pipeline needs at least one device")
        self.devices = list(devices)
        self.name = "pipeline[" + ",".join(getattr(d, "name", "?") for d in self.devices) + "]"
        self.overlaps = any(getattr(d, "overlaps", False) for d in self.devices)
        #: device -> {reader device: the reader's marker right after its last copy from it}
        #: for the copies queued since the device last ran a stage
        self._readers: dict[int, dict[int, Any]] = {i: {} for i in range(len(self.devices))}
        self.peer_copies = 0

    @property
    def stages(self) -> int:
        """Pipeline stages (devices): the serving engine's default micro-batch count."""
        return len(self.devices)

    # ---- buffers -----------------------------------------------------------------------
    def alloc(self, type_) -> PipelineBuffer:
        """A buffer of ``type_`` with no device copy yet (made where a stage binds it)."""
        return PipelineBuffer(type_)

    def _on(self, buf: PipelineBuffer, d: int):
        """``buf``'s copy on device ``d`` (made now, and written if the host holds its value
        or it is current elsewhere)."""
        c = buf.copies.get(d)
        if c is not None:
            return c
        dev = self.devices[d]
        c = buf.copies[d] = dev.alloc(buf.type)
        if buf.host is not None:
            dev.upload(c, buf.host)
            buf.valid.add(d)
            if all(t in buf.copies for t in range(len(self.devices))):
                buf.host = None
        elif not buf.valid:
            buf.valid.add(d)                 # zero-filled everywhere: every copy is current
        return c

    def upload(self, buf: PipelineBuffer, array) -> None:
        """Write ``array`` into every device copy (all current after), or hold it on the
        host until a stage binds the buffer (a weight: only its stages' devices get it)."""
        if not buf.copies:
            buf.host = array
            return
        for d, c in buf.copies.items():
            self.devices[d].upload(c, array)
        buf.valid = set(buf.copies)
        if buf.host is not None:
            buf.host = array

    def upload_async(self, buf: PipelineBuffer, array) -> None:
        """:meth:`upload` queued on each device (the host copy taken now when none exists)."""
        if not buf.copies:
            buf.host = np.array(array, copy=True)
            return
        for d, c in buf.copies.items():
            self.devices[d].upload_async(c, array)
        buf.valid = set(buf.copies)
        if buf.host is not None:
            buf.host = np.array(array, copy=True)

    def upload_rows(self, buf: PipelineBuffer, start: int, array) -> None:
        """Write rows ``start..`` of ``buf`` on every device that holds it (current copies
        first brought up to date from the device where it is current)."""
        for d in list(buf.copies):
            self._refresh(buf, d)
        for d, c in buf.copies.items():
            dev = self.devices[d]
            rows = getattr(dev, "upload_rows", None)
            if rows is not None:
                rows(c, start, array)
            else:
                full = np.array(dev.download(c))
                a = np.asarray(array)
                full.reshape((-1,) + a.shape[1:])[start:start + a.shape[0]] = a
                dev.upload(c, full)
        if not buf.copies:                  # no stage bound it yet: keep the value on the host
            h = self.download(buf).reshape(_host_zeros(buf.type).shape)
            a = np.asarray(array)
            h[start:start + a.shape[0]] = a
            buf.host = h

    def _current(self, buf: PipelineBuffer) -> int | None:
        return min(buf.valid) if buf.valid else None

    def download(self, buf: PipelineBuffer) -> np.ndarray:
        """A host copy from a device where ``buf`` is current (the held host value, or
        zeros, when no device has it)."""
        d = self._current(buf)
        if d is None:
            if buf.host is not None:
                return np.array(buf.host)
            return _host_zeros(buf.type)
        return self.devices[d].download(buf.copies[d])

    def download_async(self, buf: PipelineBuffer):
        """A queued read on a device where ``buf`` is current."""
        d = self._current(buf)
        if d is None:
            return Ready(self.download(buf))
        return self.devices[d].download_async(buf.copies[d])

    def synchronize(self) -> None:
        """Wait for every device's queued work."""
        for dev in self.devices:
            dev.synchronize()

    # ---- copies between devices ---------------------------------------------------------
    def _copy(self, src: int, a, dst: int, b, after=None) -> None:
        """Queue ``a`` (on device ``src``) -> ``b`` (on device ``dst``), ordered after the
        work queued on ``src`` (or only after the marker ``after`` of ``src``: the replay that
        wrote ``a``); ``src`` learns that ``dst`` reads from it."""
        s, t = self.devices[src], self.devices[dst]
        if hasattr(t, "copy_from") and hasattr(s, "signal"):
            t.wait_for(after if after is not None else s.signal())
            t.copy_from(s, a, b)
            self._readers[src][dst] = t.signal()      # this copy done: src may write again
        else:
            t.upload(b, s.download(a))
        self.peer_copies += 1

    def _refresh(self, buf: PipelineBuffer, d: int) -> None:
        """Make ``buf``'s copy on ``d`` current (copied from a device where it is, after the
        replay that wrote it there: not after work queued behind it, such as another
        micro-batch's stage, which the copy does not need)."""
        if d in buf.valid:
            return
        src = self._current(buf)
        if src is None:
            buf.valid.add(d)
            return
        after = buf.written[1] if buf.written is not None and buf.written[0] == src else None
        self._copy(src, buf.copies[src], d, buf.copies[d], after)
        buf.valid.add(d)

    def _before_writes(self, d: int) -> None:
        """Device ``d`` is about to write: wait for the copies other devices read from it."""
        dev = self.devices[d]
        for mark in self._readers[d].values():
            dev.wait_for(mark)
        self._readers[d].clear()

    # ---- programs ----------------------------------------------------------------------
    def load(self, program) -> PipelineKernel:
        """Load a :class:`PipelineProgram` (stage ``s`` on device ``s``; as many stages as
        devices, else :class:`PipelineError`) or a plain program (on the last device)."""
        if isinstance(program, PipelineProgram):
            if len(program.stages) != len(self.devices):
                raise PipelineError(f"a program of {len(program.stages)} pipeline stages "
                                    f"cannot run on {len(self.devices)} devices")
            placed = list(enumerate(program.stages))
            bnd = program.boundaries
        else:
            placed, bnd = [(len(self.devices) - 1, program)], {}
        self._check_memory(placed, getattr(program, "weight_bytes", None))
        stages, boundary = [], {}
        args: dict[tuple[str, str], KernelArg] = {}
        for d, prog in placed:
            k = self.devices[d].load(prog)
            names = []
            for a in k.args:
                names.append((a.role, a.name))
                if a.name.startswith(BOUNDARY_PREFIX):
                    src, _ = bnd[a.name]
                    boundary.setdefault(a.name, {})[d] = self.devices[d].alloc(a.type)
                    continue
                key = (a.role, a.name)
                if key not in args:
                    args[key] = KernelArg(a.role, a.name, a.type)
            receives = [(a.name, bnd[a.name][0]) for a in k.args
                        if a.role == "input" and a.name.startswith(BOUNDARY_PREFIX)]
            stages.append(_StageRun(d, k, names, receives))
        order = {"input": 0, "param": 1, "output": 2}
        kargs = sorted(args.values(), key=lambda a: order[a.role])
        return PipelineKernel(kargs, stages, boundary, program)

    def _check_memory(self, placed, weight_bytes) -> None:
        """Refuse a stage whose weights alone exceed its device's free memory (devices that
        report it: ``memory_info() -> (free, total)``)."""
        if not weight_bytes:
            return
        for (d, _), need in zip(placed, weight_bytes):
            info = getattr(self.devices[d], "memory_info", None)
            if info is None:
                continue
            free, total = info()
            if need > free:
                raise PipelineError(f"pipeline stage {d} needs {need / 2**30:.1f} GiB of "
                                    f"weights but device {d} has {free / 2**30:.1f} GiB free "
                                    f"of {total / 2**30:.1f} GiB (use more stages)")

    def in_place_outputs(self, kernel: PipelineKernel) -> set[str]:
        """The outputs some stage writes over its input's own buffer (its device says)."""
        out: set[str] = set()
        for st in kernel.stages:
            said = getattr(self.devices[st.device], "in_place_outputs", None)
            if said is not None:
                out |= {n for n in said(st.kernel) if not n.startswith(BOUNDARY_PREFIX)}
        return out

    def record(self, kernel: PipelineKernel, bindings: Sequence[PipelineBuffer],
               copies: Sequence[tuple[PipelineBuffer, PipelineBuffer]] = ()):
        """Record every stage over its device's copies of ``bindings`` (made now where
        missing); ``copies`` (src, dst) run on the device of the stage that writes src."""
        if len(bindings) != len(kernel.args):
            raise PipelineError(f"{len(bindings)} buffers bound to {len(kernel.args)} "
                                "arguments")
        by = {(a.role, a.name): b for a, b in zip(kernel.args, bindings)}
        runs, writer = [], {}
        for st in kernel.stages:
            d = st.device
            inputs, outputs, binds = [], [], []
            for role, name in st.args:
                if name.startswith(BOUNDARY_PREFIX):
                    binds.append(kernel.boundary[name][d])
                    continue
                buf = by[(role, name)]
                binds.append(self._on(buf, d))
                if role == "input":
                    inputs.append(buf)
                elif role == "output":
                    outputs.append(buf)
                    writer[id(buf)] = d
            runs.append([st, binds, inputs, outputs, []])
        feedback = []
        for src, dst in copies:
            d = writer.get(id(src))
            if d is None:
                raise PipelineError("a recorded copy's source is not written by the program")
            run = next(r for r in runs if r[0].device == d)
            run[4].append((src.copies[d], self._on(dst, d)))
            feedback.append((dst, d))
        stages = []
        for st, binds, inputs, outputs, post in runs:
            dev = self.devices[st.device]
            rec = dev.record(st.kernel, binds, copies=post) if post else \
                dev.record(st.kernel, binds)
            stages.append((st, rec, inputs, outputs))
        return PipelineRecording(kernel, stages, feedback)

    def replay(self, rec: PipelineRecording) -> None:
        """Run the stages in order: stale inputs and boundary values copied in, each stage's
        recording replayed on its device, its outputs marked current there."""
        kernel = rec.kernel
        marks = {}
        for st, drec, inputs, outputs in rec.stages:
            d = st.device
            for buf in inputs:
                self._refresh(buf, d)
            for name, src in st.receives:
                b = kernel.boundary[name]
                self._copy(src, b[src], d, b[d])
            self._before_writes(d)
            dev = self.devices[d]
            dev.replay(drec)
            mark = marks[d] = dev.signal() if hasattr(dev, "signal") else None
            for buf in outputs:
                buf.valid = {d}
                buf.written = (d, mark) if mark is not None else None
        for dst, d in rec.feedback:
            dst.valid = {d}
            dst.written = (d, marks[d]) if marks.get(d) is not None else None


def _host_zeros(t) -> np.ndarray:
    """Zeros of a buffer type as the host sees it: a poot type (:func:`host_dtype`) or a
    device's own buffer type (``dtype`` a numpy dtype name and ``shape``: CUDA's BufType)."""
    if isinstance(getattr(t, "dtype", None), str):
        return np.zeros(tuple(t.shape), np.dtype(t.dtype))
    return np.zeros(host_shape(t), host_dtype(t))


def open_pipeline_devices(backend: str, n: int) -> list:
    """``n`` executor devices of ``backend`` for a pipeline: device ordinals 0..n-1 where the
    backend's ``open_device`` hook takes an ``ordinal`` (CUDA), else ``n`` instances of its
    device. Raises :class:`PipelineError` when ``n`` < 1 or a device cannot be opened (fewer
    GPUs than stages), naming which."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PipelineError(f"pipeline_parallel must be a positive integer, got {n!r}")
    reg = BACKENDS[backend]
    if reg.open_device is None:
        raise PipelineError(f"no executor device for backend '{backend}' in this build")
    fn = hook(reg.open_device)
    ordinals = "ordinal" in inspect.signature(fn).parameters
    out = []
    for i in range(n):
        try:
            out.append(fn(ordinal=i) if ordinals else fn())
        except DeviceError as e:
            raise PipelineError(f"a pipeline of {n} stages needs {n} {backend} devices; "
                                f"device {i} cannot be opened ({e})") from None
    return out


__all__ = ["PipelineBuffer", "PipelineDevice", "PipelineError", "PipelineKernel",
           "open_pipeline_devices"]
