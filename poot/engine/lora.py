"""Which LoRA adapter lives in which device slot, and who is using it.

:class:`LoraManager` owns the :class:`~poot.models.lora.LoraTable` bound beside a model's
weights (its arrays are the weights the device holds) and the names of the adapters loaded.
A request naming an adapter holds its slot (:meth:`acquire` / :meth:`release`) until it
finishes. Loading writes a free slot's arrays and uploads them (the compiled steps are not
touched); unloading removes the name at once (later requests naming it are refused) and
zeroes the slot once the last request using it has finished, so no running request ever sees
its adapter change. A slot is only written while no sequence uses it.

Each load gets a fresh prefix-cache salt (:meth:`acquire` returns it), so KV blocks computed
under one adapter are never reused by another, nor by a later adapter loaded under the same
name.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Mapping

import numpy as np

from poot.models.lora import LoraAdapter, LoraError, LoraTable


class LoraManager:
    """Adapter names -> slots over one :class:`LoraTable` (module doc).

    Args:
        table: the slots' host arrays (bound as weights).
        upload: ``(arrays, types)`` -> None: writes changed slot params to the device (the
            runner session's ``load_weights``); called from the engine thread.
    """

    def __init__(self, table: LoraTable, upload: Callable[[Mapping, Mapping], None]):
        self.table = table
        self.upload = upload
        self._lock = threading.Lock()
        self.names: dict[str, int] = {}
        self.salts: dict[str, str] = {}
        self.users: dict[int, int] = {}
        self.retired: set[int] = set()
        self._loads = itertools.count(1)

    @property
    def max_loras(self) -> int:
        return self.table.slots.max_loras

    def _push(self, changed) -> None:
        if changed:
            self.upload({n: self.table.arrays[n] for n in changed},
                        {n: self.table.types[n] for n in changed})

    def load(self, name: str, adapter: LoraAdapter) -> int:
        """Put ``adapter`` in a free slot under ``name``; returns the slot. Raises
        :class:`LoraError` naming ``lora_name`` (empty, already loaded, every slot taken) or
        what :meth:`LoraTable.load` raises (rank, targets)."""
        if not isinstance(name, str) or not name:
            raise LoraError("lora_name", "must be a non-empty string")
        with self._lock:
            if name in self.names:
                raise LoraError("lora_name", f"an adapter named {name!r} is already loaded "
                                f"(unload it first)")
            taken = set(self.names.values()) | self.retired
            free = [s for s in range(1, self.max_loras + 1) if s not in taken]
            if not free:
                raise LoraError("lora_name", f"all {self.max_loras} adapter slots are in use "
                                f"(--max-loras); unload one first")
            slot = free[0]
            changed = self.table.load(slot, adapter)
            self.names[name] = slot
            self.salts[name] = f"lora:{name}#{next(self._loads)}"
        self._push(changed)
        return slot

    def unload(self, name: str) -> None:
        """Forget ``name``; its slot is zeroed now, or when its last request finishes.
        Raises :class:`LoraError` naming ``lora_name`` when no such adapter is loaded."""
        with self._lock:
            if name not in self.names:
                raise LoraError("lora_name", f"no adapter named {name!r} is loaded")
            slot = self.names.pop(name)
            self.salts.pop(name, None)
            if self.users.get(slot, 0):
                self.retired.add(slot)
                return
            changed = self.table.unload(slot)
        self._push(changed)

    def acquire(self, name: str) -> tuple[int, str]:
        """(slot, prefix-cache salt) of adapter ``name`` for a new request, counted as a
        user. Raises :class:`LoraError` naming ``model`` for an unknown name."""
        with self._lock:
            slot = self.names.get(name)
            if slot is None:
                raise LoraError("model", f"no adapter named {name!r} is loaded (loaded: "
                                f"{', '.join(sorted(self.names)) or 'none'})")
            self.users[slot] = self.users.get(slot, 0) + 1
            return slot, self.salts[name]

    def release(self, slot: int) -> None:
        """A request using ``slot`` finished; a retired slot is zeroed after its last."""
        changed = []
        with self._lock:
            n = self.users.get(slot, 0) - 1
            self.users[slot] = max(n, 0)
            if n <= 0 and slot in self.retired:
                self.retired.discard(slot)
                changed = self.table.unload(slot)
        self._push(changed)

    def loaded(self) -> dict[str, int]:
        """Adapter name -> slot, a copy."""
        with self._lock:
            return dict(self.names)


def slot_column(slots, rows: int, bucket: int) -> np.ndarray:
    """i32 [bucket]: ``slots`` (None: all 0) for the first ``rows`` rows, 0 (the base) for
    idle rows."""
    out = np.zeros(bucket, np.int32)
    if slots is not None:
        out[:rows] = slots
    return out


__all__ = ["LoraManager", "slot_column"]
