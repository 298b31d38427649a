"""``Session[Device]``: the one executor contract every backend runs through.

    engine = Session(CpuDevice())
    engine.load_weights(weights.arrays, weights.types)    # once per model
    entry = engine.add_entry(program)                       # once per step shape
    out = engine.step(entry, {"tokens": ..., "positions": ..., "block_table": ...,
                              "slot_mapping": ...}, read=["logits"])

Buffers are stable: each entry owns one *slot buffer* per per-step input and one buffer per
output; weights are uploaded once and shared by every entry. :meth:`Session.step` writes the
inputs it is given into their slot buffers in place (inputs not given keep their last value:
per-request settings are written once), then launches. The first step on an entry (for a given
state parity, below) *records* the launch over those buffers; every later step only *replays*
the recording.

Carried state (KV caches, the sampling history): an output that is the next step's input.
``Program.storage`` names outputs that alias an input (``Buffer.aliases``: scatters into an
input, i.e. the KV caches); ``add_entry(carry=...)`` adds more (``{"sampling.token_counts_out":
"sampling.token_counts"}``). Carried state lives in the engine, keyed by the input name, and is
shared by every entry that carries it (the prefill and the decode entries see one cache).

In-place state: a device says, per loaded program, which outputs it writes over their input's
own buffer (``device.in_place_outputs(kernel) -> set of output names``: the CPU program's
in-place KV writes, which its compile checks bufferization kept in place; the CUDA plan's), and
those states are bound to one buffer (no copy per step, one recording). Any other carried
state is **ping-ponged**: two buffers, the step reads one and writes the other, and the roles
swap after each step (at most one recording per parity). ``Session(device,
alias_carried=True)`` binds every carried input and output to one buffer. The test
``test/runtime/test_session.py::test_kv_carried_vs_reference`` catches corruption either way.

Feedback (``add_entry(feedback={"sampling.token": "tokens"})``): an output copied on the device
into one of the entry's own per-step input slots at the end of every step (the copy is part of
the recording: a CUDA graph memcpy node, a recorded Vulkan copy, an ``np.copyto`` on the CPU).
The decode step's sampled token becomes the next step's token input with no host upload. An
input written by the host (``step``/``submit`` inputs, ``write_inputs``) overrides it.

Pipelining: :meth:`Session.submit` issues a step (queued input writes, the replay, queued reads
of the requested outputs) and returns at once; :meth:`Session.collect` waits for that step's
reads. A driver issues step n+1 before collecting step n, so the device runs step n+1 while the
host handles token n. Every write and read is queued on the device in issue order, and the
device keeps its own copy of queued input arrays (``Device.upload_async``), so a host array is
never read after the caller reuses it. :attr:`Session.overlaps` says whether the device gains
from it (on a synchronous device ``submit`` is ``step`` with the reads already done).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

import numpy as np

from poot.dialects.quant_layout import to_stored
from poot.dialects.types import PootType
from poot.errors import PootError
from poot.runtime.device import Device

D = TypeVar("D", bound=Device)


class SessionError(PootError):
    """A binding the engine cannot make: unknown input, missing weight, mismatched state."""


@dataclass
class _State:
    """One carried value: its type and its buffers (two when ping-ponged)."""

    type: PootType
    buffers: list
    cur: int = 0

    @property
    def current(self):
        return self.buffers[self.cur]

    @property
    def next(self):
        return self.buffers[(self.cur + 1) % len(self.buffers)]


@dataclass
class Entry:
    """One step shape added to an engine (see :meth:`Session.add_entry`).

    Attributes:
        program: the compiled program; kernel: the device's loaded kernel.
        carry: output name -> carried input name.
        slots: per-step input name -> its stable slot buffer.
        outputs: non-carried output name -> its buffer.
        recordings: state parity -> the device recording (built on first use).
        steps: steps run on this entry.
        in_place: carried inputs whose output the program writes over the input's own
            buffer (the device says so: :meth:`Session.add_entry`); bound to one buffer.
    """

    id: int
    program: Any
    kernel: Any
    carry: dict[str, str]
    slots: dict[str, Any]
    outputs: dict[str, Any]
    recordings: dict[tuple, Any] = field(default_factory=dict)
    steps: int = 0
    in_place: frozenset = frozenset()    # carried inputs this program updates in place
    # output -> the input slot it is copied into: a name (this entry) or (entry, name)
    feedback: dict[str, Any] = field(default_factory=dict)
    feedback_buffers: dict[str, Any] = field(default_factory=dict)   # output -> that slot

    @property
    def input_names(self) -> list[str]:
        return [a.name for a in self.kernel.args if a.role == "input"]


@dataclass(frozen=True)
class RowFeed:
    """Rows of an output of a step issued earlier copied on the device into a per-step input of
    the step being issued, after its host inputs were queued and before it launches
    (:meth:`Session.submit`): the tokens sampled by the step in flight feed the next step's
    token rows in that step's order (``runs``: ``(source row, input row, rows)``, the first
    axis of each), so the host issues it before it reads them.

    Attributes:
        source: the entry whose output is read (its buffer as of the copy).
        output: that output's name.
        input: the per-step input of the step being issued that is written.
        runs: the rows copied.
    """

    source: "Entry"
    output: str
    input: str
    runs: tuple[tuple[int, int, int], ...]


@dataclass
class Submitted:
    """A step issued by :meth:`Session.submit`: its entry and the queued reads of its outputs
    (collect with :meth:`Session.collect`, or give up with :meth:`Session.discard`)."""

    entry: Entry
    reads: dict[str, Any]
    done: bool = False


class Session(Generic[D]):
    """Runs compiled step programs on one device with record-then-replay.

    ``storage_type``: maps a weight's type to the type the target stores it in (the
    compiler's :func:`~poot.compiler.planning.storage_type` for the programs' target: a bf16
    weight on a target without 16-bit storage is allocated as f32 and converted on upload; a
    Q4 weight on a CPU with the row-interleaved kernels is repacked on upload,
    :func:`~poot.dialects.quant_layout.to_stored`); None keeps every type."""

    def __init__(self, device: D, alias_carried: bool = False,
                 storage_type: Callable[[PootType], PootType] | None = None):
        self.device = device
        self.alias_carried = alias_carried
        self.storage_type = storage_type or (lambda t: t)
        self._weights: dict[str, Any] = {}
        self._weight_types: dict[str, PootType] = {}
        self._state: dict[str, _State] = {}
        self._ids = itertools.count()
        self.entries: list[Entry] = []

    # ---- weights -----------------------------------------------------------------------
    def load_weights(self, arrays: Mapping[str, np.ndarray],
                     types: Mapping[str, PootType]) -> None:
        """Upload every weight once (``arrays[name]`` of ``types[name]``, stored as
        ``storage_type`` says); entries bind them by name. Weights already loaded under a name
        are replaced in place."""
        for name, t in types.items():
            if name not in arrays:
                raise SessionError(f"weight '{name}' has a type but no array")
            buf = self._weights.get(name)
            stored = self.storage_type(t)
            if buf is None:
                buf = self.device.alloc(stored)
                self._weights[name], self._weight_types[name] = buf, stored
            self.device.upload(buf, to_stored(arrays[name], t, stored))

    # ---- entries -----------------------------------------------------------------------
    def add_entry(self, program, carry: Mapping[str, str] | None = None,
                  share: Mapping[str, tuple[Entry, str]] | None = None,
                  feedback: Mapping[str, str] | None = None) -> Entry:
        """Load ``program`` and allocate its stable buffers.

        ``carry`` (output -> input) adds carried values to the aliases ``program.storage``
        declares. ``share`` binds an input to another entry's output buffer
        (``{"logits": (prefill_entry, "logits")}``): no host round trip between entries.
        ``feedback`` (output -> per-step input of this entry, or ``(other entry, input)``; same
        element type and count, e.g. ``{"sampling.token": (decode_entry, "tokens")}``): the
        output is copied on the device into that input's slot at the end of every step
        (recorded with the step).
        """
        kernel = self.device.load(program)
        carried = {b.name: b.aliases for b in getattr(program, "storage", ())
                   if b.role == "output" and b.aliases}
        carried.update(carry or {})
        # a device whose loaded program provably updates some state in place says which
        # (CUDA: the plan writes the KV scatter into the input's buffer); binding those apart
        # would cost a whole copy of the state per step
        said = getattr(self.device, "in_place_outputs", None)
        written_in_place = set(said(kernel)) if said is not None else set()
        in_place = frozenset(inp for out, inp in carried.items()
                             if self.alias_carried or out in written_in_place)
        args = {(a.role, a.name): a for a in kernel.args}
        for out, inp in carried.items():
            if ("output", out) not in args or ("input", inp) not in args:
                raise SessionError(f"carry {out} -> {inp}: the program has no such "
                                    "output/input")
            t_in, t_out = args[("input", inp)].type, args[("output", out)].type
            if t_in != t_out:
                raise SessionError(f"carry {out} -> {inp}: types differ ({t_out} vs {t_in})")
            st = self._state.get(inp)
            n = 1 if inp in in_place else 2
            if st is None:
                self._state[inp] = _State(t_in, [self.device.alloc(t_in) for _ in range(n)])
            elif st.type != t_in:
                raise SessionError(f"carried '{inp}' is {st.type} in another entry, "
                                    f"{t_in} here")
            elif len(st.buffers) < n:       # another entry updates it in place: add a twin
                st.buffers.append(self.device.alloc(t_in))
        carried_inputs = set(carried.values())
        share = dict(share or {})
        slots, outputs = {}, {}
        for a in kernel.args:
            if a.role == "input" and a.name not in carried_inputs:
                if a.name in share:
                    src, name = share[a.name]
                    slots[a.name] = src.outputs[name]
                else:
                    slots[a.name] = self.device.alloc(a.type)
            elif a.role == "param" and a.name not in self._weights:
                raise SessionError(f"weight '{a.name}' is not loaded (load_weights first)")
            elif a.role == "output" and a.name not in carried:
                outputs[a.name] = self.device.alloc(a.type)
        feedback = dict(feedback or {})
        targets: dict[str, Any] = {}
        for out, dest in feedback.items():
            other, inp = dest if isinstance(dest, tuple) else (None, dest)
            if out not in outputs:
                raise SessionError(f"feedback {out} -> {inp}: '{out}' is not a per-step "
                                    "output of the program")
            if other is None:
                if inp not in slots or inp in share:
                    raise SessionError(f"feedback {out} -> {inp}: '{inp}' is not a per-step "
                                        "input slot of this entry")
                t_in, targets[out] = args[("input", inp)].type, slots[inp]
            else:
                if inp not in other.slots:
                    raise SessionError(f"feedback {out} -> {inp}: '{inp}' is not a per-step "
                                        "input slot of the target entry")
                t_in = next(a.type for a in other.kernel.args
                            if a.role == "input" and a.name == inp)
                targets[out] = other.slots[inp]
            t_out = args[("output", out)].type
            if t_out.dtype != t_in.dtype or _count(t_out) != _count(t_in):
                raise SessionError(f"feedback {out} -> {inp}: {t_out} does not fit {t_in}")
        entry = Entry(next(self._ids), program, kernel, dict(carried), slots, outputs,
                      in_place=in_place, feedback=feedback)
        entry.feedback_buffers = targets
        self.entries.append(entry)
        return entry

    # ---- state -------------------------------------------------------------------------
    def state_names(self) -> list[str]:
        return list(self._state)

    def read_state(self, name: str) -> np.ndarray:
        """A host copy of the current value of carried ``name``."""
        return self.device.download(self._state[name].current)

    def write_state(self, name: str, array: np.ndarray) -> None:
        """Overwrite the current value of carried ``name`` (e.g. a slot's token history)."""
        self.device.upload(self._state[name].current, array)

    def write_state_row(self, name: str, index: int, array: np.ndarray) -> None:
        """Overwrite row ``index`` (first axis) of carried ``name`` (e.g. one sequence's row
        of the token-history pool), after the queued work finished. Uses the device's
        ``upload_rows(buffer, start, array)`` when it has one, else a read-modify-write of the
        whole buffer."""
        st = self._state[name]
        self.device.synchronize()
        a = np.asarray(array)
        if not 0 <= index < st.type.shape[0] or a.shape != tuple(st.type.shape[1:]):
            raise SessionError(f"cannot write a {list(a.shape)} row at {index} of carried "
                                f"'{name}' {st.type}")
        rows = getattr(self.device, "upload_rows", None)
        if rows is not None:
            rows(st.current, index, a[None])
            return
        full = self.device.download(st.current)
        full = full.reshape(tuple(st.type.shape)) if full.ndim == 1 else full
        full[index] = a
        self.device.upload(st.current, full)

    def write_inputs(self, entry: Entry, inputs: Mapping[str, np.ndarray]) -> None:
        """Rewrite slot buffers in place (what :meth:`step` does with its ``inputs``)."""
        for name, value in inputs.items():
            buf = entry.slots.get(name)
            if buf is None:
                raise self._no_slot(entry, name)
            self.device.upload(buf, value)

    def _no_slot(self, entry: Entry, name: str) -> SessionError:
        """The error for writing ``name``, which is not one of ``entry``'s slot inputs."""
        if name in self._state and name in entry.carry.values():
            return SessionError(f"'{name}' is carried state; use write_state")
        return SessionError(f"the entry has no per-step input '{name}' "
                             f"(inputs: {', '.join(entry.slots)})")

    # ---- stepping ----------------------------------------------------------------------
    def _parity(self, entry: Entry) -> tuple:
        return tuple(self._state[i].cur for i in entry.carry.values())

    def _bindings(self, entry: Entry) -> list:
        out = []
        carried_in = set(entry.carry.values())
        for a in entry.kernel.args:
            if a.role == "input":
                out.append(self._state[a.name].current if a.name in carried_in
                           else entry.slots[a.name])
            elif a.role == "param":
                out.append(self._weights[a.name])
            elif a.name in entry.carry:
                st = self._state[entry.carry[a.name]]
                out.append(st.current if entry.carry[a.name] in entry.in_place else st.next)
            else:
                out.append(entry.outputs[a.name])
        return out

    def _launch(self, entry: Entry) -> None:
        """Record (first time for this parity) or replay the step; advance carried state."""
        key = self._parity(entry)
        rec = entry.recordings.get(key)
        if rec is None:
            copies = [(entry.outputs[o], entry.feedback_buffers[o]) for o in entry.feedback]
            bindings = self._bindings(entry)
            rec = entry.recordings[key] = (
                self.device.record(entry.kernel, bindings, copies=copies) if copies
                else self.device.record(entry.kernel, bindings))
        self.device.replay(rec)
        entry.steps += 1
        for inp in entry.carry.values():
            if inp not in entry.in_place:
                st = self._state[inp]
                st.cur = (st.cur + 1) % len(st.buffers)

    def _names(self, entry: Entry, read: Iterable[str] | None) -> list[str]:
        names = list(entry.outputs if read is None else read)
        for n in names:
            if n not in entry.outputs:
                raise SessionError(f"the entry has no per-step output '{n}' "
                                    f"(outputs: {', '.join(entry.outputs)})")
        return names

    def step(self, entry: Entry, inputs: Mapping[str, np.ndarray] | None = None,
             read: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Write ``inputs`` into the entry's slot buffers, record (first time) or replay the
        step, advance the carried state, and return host copies of the outputs in ``read``
        (default: every non-carried output)."""
        if inputs:
            self.write_inputs(entry, inputs)
        names = self._names(entry, read)
        self._launch(entry)
        self.device.synchronize()
        return {n: self.device.download(entry.outputs[n]) for n in names}

    # ---- pipelining --------------------------------------------------------------------
    @property
    def overlaps(self) -> bool:
        """Whether issuing a step before collecting the previous one overlaps host and device
        work on this engine's device (``Device.overlaps``)."""
        return bool(getattr(self.device, "overlaps", False))

    @property
    def copies_rows(self) -> bool:
        """Whether :meth:`submit` takes a :class:`RowFeed` on this device (it has
        ``Device.copy_rows_async``)."""
        return callable(getattr(self.device, "copy_rows_async", None))

    def submit(self, entry: Entry, inputs: Mapping[str, np.ndarray] | None = None,
               read: Iterable[str] | None = None, feed: RowFeed | None = None) -> Submitted:
        """Issue one step without waiting: queue ``inputs`` into the slot buffers (the device
        copies the arrays at once: the caller may reuse them), then ``feed``'s row copies
        (:class:`RowFeed`), record or replay, advance the carried state, and queue reads of
        the outputs in ``read`` (default: every non-carried output). Steps run in issue order;
        :meth:`collect` returns the reads. Raises :class:`SessionError` for an unknown input
        or output, or a feed on a device without row copies."""
        names = self._names(entry, read)
        for name, value in (inputs or {}).items():
            buf = entry.slots.get(name)
            if buf is None:
                raise self._no_slot(entry, name)
            self.device.upload_async(buf, value)
        if feed is not None:
            dst = entry.slots.get(feed.input)
            if dst is None:
                raise self._no_slot(entry, feed.input)
            src = feed.source.outputs.get(feed.output)
            if src is None:
                raise SessionError(f"the feeding entry has no per-step output '{feed.output}'")
            if not self.copies_rows:
                raise SessionError(f"{type(self.device).__name__} cannot copy rows on the "
                                   f"device (no copy_rows_async)")
            self.device.copy_rows_async(src, dst, feed.runs)
        self._launch(entry)
        return Submitted(entry, {n: self.device.download_async(entry.outputs[n])
                                 for n in names})

    def collect(self, submitted: Submitted) -> dict[str, np.ndarray]:
        """Wait for a submitted step's reads; host copies by output name."""
        if submitted.done:
            raise SessionError("this step was already collected or discarded")
        submitted.done = True
        return {n: r.wait() for n, r in submitted.reads.items()}

    def discard(self, submitted: Submitted) -> None:
        """Give up a submitted step's reads (the step itself still runs, in order)."""
        if not submitted.done:
            submitted.done = True
            for r in submitted.reads.values():
                r.release()

    def output(self, entry: Entry, name: str) -> np.ndarray:
        """A host copy of the entry's output ``name`` from its last step."""
        return self.device.download(entry.outputs[name])


def _count(t) -> int:
    return int(np.prod(getattr(t, "shape", ()), dtype=np.int64))


__all__ = ["Session", "Entry", "RowFeed", "SessionError", "Submitted"]
