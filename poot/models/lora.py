"""LoRA adapters (PEFT format) in fixed device slots, applied per sequence inside the step.

A decoder traced with LoRA slots (:func:`lora_types` bound beside its weights) declares one
more step input, ``lora_index`` i32 [B] (each sequence's slot: 1..L an adapter, 0 the base
model), and adds to every targeted projection ``y = x W^T`` the low-rank term of every slot
at once, masked to each sequence's own::

    y += ((x A^T) * mask[b]) B        A: [L*R, in] (of lora.{group}.a)   B: lora.{role}.b [L*R, out]

with slot s's ranks at rows ``(s-1)*R .. s*R`` of both and ``mask[b, j] = (lora.column_slot[j]
== lora_index[b])``, ``lora.column_slot`` i32 [L*R] = ``j // R + 1`` bound beside them
(:func:`poot.models.components.lora_row_mask`). The A's of targets a decoder projects from one
input (:data:`SHRINK_GROUPS`: q/k/v, gate/up) are stacked in one param ``lora.blk.{i}.{t1}+
{t2}+...a`` [n*L*R, in], target k's at rows ``k*L*R ..``, so one shrink serves the group
(:func:`shrink_param`). B is stored rank-major ([L*R, out], PEFT's ``lora_B`` transposed):
a sequence's expand term at output ``n`` reads column ``n`` of B, so neighbouring outputs
(neighbouring threads of a kernel that computes the expand per element, where it is folded
into its consumer: :func:`~poot.backends.gpu.strategies.emit.small_contraction`) read
neighbouring memory at each rank. A and B are stored f32, or bf16/f16 where the
base projections are (:func:`lora_dtype`). Both terms are plain matmuls (the shrink a
projection beside its base ones, the expand a low-rank matmul; no per-row gather of adapter
weights), so one batch mixes adapters and the base model at L times one adapter's FLOPs
and bytes: size ``max_loras`` to the adapters served at once. An adapter of rank r <= R
fills the first r rows of its slot's A and B (the rest stay zero) and its
scaling is folded into B: ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``), PEFT's
``scaling``. Loading or unloading an adapter rewrites its slot's arrays only
(``Engine.load_weights`` replaces a weight in place): nothing is recompiled.

This is the dense form of multi-LoRA batching; S-LoRA / Punica (Chen et al., 2023, "Punica:
Multi-Tenant LoRA Serving") gather each row's adapter instead, which reads less when many
adapters are resident but needs an indexed-weight matmul kernel.

PEFT's format (``peft`` ``save_pretrained``): ``adapter_config.json`` (``peft_type: LORA``,
``r``, ``lora_alpha``, ``use_rslora``, ``target_modules``, ...) and
``adapter_model.safetensors`` with ``base_model.model.model.layers.{i}.{self_attn|mlp}.
{q,k,v,o,gate,up,down}_proj.lora_{A,B}.weight`` (A [r, in], B [out, r]).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from poot.dialects.types import DType, PootType, TensorType
from poot.load import open_weights
from poot.models.base import ModelError

#: PEFT module name -> the decoder role suffix it adapts
PEFT_TARGETS = {"q_proj": "attn.q", "k_proj": "attn.k", "v_proj": "attn.v", "o_proj": "attn.o",
                "gate_proj": "ffn.gate", "up_proj": "ffn.up", "down_proj": "ffn.down"}
_TENSOR = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\."
                     r"(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


#: the param naming each stacked rank's slot (i32 [L*R], ``j // R + 1``)
COLUMN_SLOT = "lora.column_slot"
#: targets a decoder projects from one input (:func:`poot.models.components.projs` traces
#: them together): their A's share one stacked param, so one shrink ``x A^T`` (one narrow
#: matmul, a launch on a GPU) serves the group
SHRINK_GROUPS = (("attn.q", "attn.k", "attn.v"), ("ffn.gate", "ffn.up"))


def shrink_param(role: str, types: Mapping[str, PootType]) -> tuple[str, int, int] | None:
    """Where ``role``'s (``blk.{i}.{target}``) stacked A lives: (param name, first row, rows
    = L*R) of the group's ``lora.blk.{i}.{t1}+{t2}+...a`` (the group's bound targets, those
    with a ``lora.{role}.b``), or None when ``role`` has no LoRA slots bound."""
    if f"lora.{role}.b" not in types:
        return None
    layer, kind, name = role.rsplit(".", 2)
    prefix, target = layer + ".", f"{kind}.{name}"
    group = next((g for g in SHRINK_GROUPS if target in g), (target,))
    bound = [t for t in group if f"lora.{prefix}{t}.b" in types]
    lr = types[f"lora.{role}.b"].shape[0]
    return f"lora.{prefix}{'+'.join(bound)}.a", bound.index(target) * lr, lr


class LoraError(ModelError):
    """An adapter that cannot be loaded; ``field`` names the config field or the tensor."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"LoRA adapter: {field}: {message}")


@dataclass(frozen=True)
class LoraSlots:
    """The fixed device slots a step is traced with.

    Attributes:
        max_loras: L, adapters held at once (slots 1..L; slot 0 is the base model, which
            holds no arrays).
        max_rank: R, the largest rank a slot holds.
        targets: role suffixes (``attn.q`` ... ``ffn.down``) that carry LoRA terms.
    """

    max_loras: int
    max_rank: int
    targets: tuple[str, ...] = tuple(PEFT_TARGETS.values())

    def __post_init__(self):
        for k in ("max_loras", "max_rank"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelError(f"LoraSlots.{k} must be a positive int, got {v!r}")
        bad = [t for t in self.targets if t not in PEFT_TARGETS.values()]
        if bad:
            raise ModelError(f"LoraSlots.targets: unknown role {bad[0]!r} (known: "
                             f"{', '.join(PEFT_TARGETS.values())})")


@dataclass
class LoraAdapter:
    """One adapter read from a PEFT folder: ``weights[role] = (A f32 [r, in], B f32 [out,
    r])`` per adapted projection role (``blk.{i}.attn.q``), ``scale`` PEFT's scaling."""

    name: str
    rank: int
    alpha: float
    rslora: bool
    scale: float
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _json_error(e: ValueError) -> str:
    """Where a JSON text broke, without quoting it."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at line {e.lineno} column {e.colno}"
    return "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "malformed"


def config_object(raw: bytes | str) -> dict:
    """An ``adapter_config.json`` text as its JSON object; :class:`LoraError` naming the
    file when it is not JSON or not an object (the text is never quoted)."""
    try:
        cfg = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise LoraError("adapter_config.json", f"not JSON ({_json_error(e)})") from None
    if not isinstance(cfg, dict):
        raise LoraError("adapter_config.json", "must be a JSON object")
    return cfg


def _config(folder: Path) -> dict:
    f = folder / "adapter_config.json"
    try:
        raw = f.read_bytes()
    except OSError as e:
        raise LoraError("adapter_config.json", f"cannot read {f} ({e.strerror})") from None
    return config_object(raw)


def read_peft_adapter(path: str | Path, base_types: Mapping[str, PootType],
                      name: str | None = None) -> LoraAdapter:
    """Read and check a PEFT LoRA folder against the base model's weight types
    (:func:`peft_adapter` checks; this reads the folder's two files by path, so it is for
    folders the operator names: a server reading folders its clients name goes through
    :mod:`poot.serve.lora_files`)."""
    folder = Path(path)
    cfg = _config(folder)
    try:
        store = open_weights(folder / "adapter_model.safetensors")
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001  (a LoadError names the file)
        raise LoraError("adapter_model.safetensors", str(e)) from None
    return peft_adapter(cfg, store, base_types, name or folder.name)


def _kind(v: Any) -> str:
    """What a config value is, without its content (errors never echo a file's text)."""
    return "null" if v is None else f"a {type(v).__name__}"


def peft_adapter(cfg: Mapping[str, Any], tensors: Mapping[str, Any],
                 base_types: Mapping[str, PootType], name: str) -> LoraAdapter:
    """Check a PEFT adapter, its ``adapter_config.json`` object ``cfg`` and its tensors
    (name -> a :class:`~poot.load.store.StoredTensor`: A [r, in], B [out, r]), against
    the base model's weight types; the :class:`LoraAdapter` (A, B as f32).

    Raises :class:`LoraError` naming the field or tensor: a ``peft_type`` other than LORA;
    DoRA, biases, ``modules_to_save``, per-module rank/alpha patterns, ``fan_in_fan_out``; a
    target module poot has no role for, or one the base lacks (a fused qkv family); a
    tensor of unexpected name or shape; an A without its B. Messages quote no string of the
    files (values are described by their type; a tensor is named only when its name is a
    PEFT LoRA tensor's).
    """
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError("peft_type", "must be LORA")
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoraError("r", f"must be a positive integer, got {r if _is_int(r) else _kind(r)}")
    alpha = cfg.get("lora_alpha", r)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoraError("lora_alpha", f"must be a number, got {_kind(alpha)}")
    for key, ok in (("use_dora", lambda v: not v), ("fan_in_fan_out", lambda v: not v),
                    ("bias", lambda v: v in (None, "none")),
                    ("modules_to_save", lambda v: not v), ("rank_pattern", lambda v: not v),
                    ("alpha_pattern", lambda v: not v), ("lora_bias", lambda v: not v)):
        if not ok(cfg.get(key)):
            raise LoraError(key, "is not supported")
    targets = cfg.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets:
        raise LoraError("target_modules", f"must be a list of module names, got "
                        f"{_kind(targets)}")
    for i, t in enumerate(targets):
        if t not in PEFT_TARGETS:
            raise LoraError("target_modules", f"entry {i} is not a projection poot adapts "
                            f"(known: {', '.join(PEFT_TARGETS)})")
    rslora = bool(cfg.get("use_rslora", False))
    scale = float(alpha) / (math.sqrt(r) if rslora else r)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for k, tname in enumerate(tensors):
        m = _TENSOR.match(tname)
        if m is None or m.group(2) not in PEFT_TARGETS:
            raise LoraError(f"tensor {k}", "is not a LoRA tensor of a projection poot adapts")
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        label = f"layers.{layer}.{module}.lora_{ab}.weight"     # the name, rebuilt
        if module not in targets:
            raise LoraError(label, f"{module} is not in target_modules")
        role = f"blk.{layer}.{PEFT_TARGETS[module]}"
        base = base_types.get(role)
        if base is None:
            raise LoraError(label, f"the base model has no separate {module} in layer "
                            f"{layer} (role {role})")
        out_f, in_f = base.shape
        want = (r, in_f) if ab == "A" else (out_f, r)
        t = tensors[tname]
        if tuple(t.shape) != want:
            raise LoraError(label, f"shape {list(t.shape)}, expected {list(want)} (r={r}, "
                            f"base {role} is [{out_f}, {in_f}])")
        pairs.setdefault(role, {})[ab] = np.asarray(t.data, dtype=np.float32)
    if not pairs:
        raise LoraError("adapter_model.safetensors", "holds no LoRA tensors")
    out = LoraAdapter(name, r, float(alpha), rslora, scale)
    for role, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise LoraError(role, "lora_A and lora_B must both be present")
        out.weights[role] = (ab["A"], ab["B"])
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def lora_dtype(base_types: Mapping[str, PootType], targets) -> DType:
    """The slots' storage dtype: the base projections' when they are dense bf16 or f16 (the
    model's compute precision on GPUs, as vLLM keeps adapters; bf16/f16 weights also take
    the tensor-core GEMM at batch sizes past the GEMV's), else f32 (f32 and packed bases)."""
    dts = {t.dtype for n, t in base_types.items()
           if isinstance(t, TensorType) and any(n.endswith("." + r) for r in targets)}
    return dts.pop() if len(dts) == 1 and dts <= {DType.BF16, DType.F16} else DType.F32


def lora_types(slots: LoraSlots, base_types: Mapping[str, PootType], n_layers: int
               ) -> dict[str, TensorType]:
    """The slot params of :func:`lora_dtype` for every targeted role the base has (L =
    max_loras, R = max_rank): ``lora.{role}.b`` [L*R, out], the A's stacked by
    :data:`SHRINK_GROUPS` (``lora.blk.{i}.{t1}+...a`` [n*L*R, in], :func:`shrink_param`),
    and ``lora.column_slot`` i32 [L*R], the slot each stacked rank belongs to."""
    lr = slots.max_loras * slots.max_rank
    dt = lora_dtype(base_types, slots.targets)
    out: dict[str, TensorType] = {COLUMN_SLOT: TensorType((lr,), DType.I32)}
    for i in range(n_layers):
        for t in slots.targets:
            base = base_types.get(f"blk.{i}.{t}")
            if base is not None:
                out[f"lora.blk.{i}.{t}.b"] = TensorType((lr, base.shape[0]), dt)
        for t in slots.targets:
            where = shrink_param(f"blk.{i}.{t}", out)
            if where is not None and where[0] not in out:
                n = len(where[0].split("+"))
                out[where[0]] = TensorType((n * lr, base_types[f"blk.{i}.{t}"].shape[1]), dt)
    return out


class LoraTable:
    """The host copy of every slot's arrays (bound as weights; a changed array is uploaded
    again with ``Engine.load_weights``). Slot s (1..L) holds rows ``(s-1)*R .. (s-1)*R + r``
    of the stacked arrays; slot 0, the base model, holds none.

    ``row_order``: the base binding's :attr:`~poot.models.base.WeightBinding.row_order`
    (role -> int64 [out], bound row r is HF row ``row_order[role][r]``). An adapter's B,
    whose rows are in HF's order, is written in the base's order (B's rows taken by it), so
    the expand adds each output to the base row it belongs to (llama's GGUF Q/K, kept in
    llama.cpp's permuted order)."""

    def __init__(self, slots: LoraSlots, base_types: Mapping[str, PootType], n_layers: int,
                 row_order: Mapping[str, np.ndarray] | None = None):
        self.slots = slots
        self.types = lora_types(slots, base_types, n_layers)
        self.row_order = dict(row_order or {})
        self.arrays = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in self.types.items()
                       if n != COLUMN_SLOT}
        self.arrays[COLUMN_SLOT] = np.repeat(np.arange(1, slots.max_loras + 1, dtype=np.int32),
                                             slots.max_rank)
        self.loaded: dict[int, str] = {}

    def load(self, slot: int, adapter: LoraAdapter) -> list[str]:
        """Write ``adapter`` into ``slot`` (1..max_loras); returns the param names changed.
        Raises :class:`LoraError`: a slot out of range, rank past the slot size (naming the
        adapter's first A tensor role), a role the slots do not target."""
        if not 1 <= slot <= self.slots.max_loras:
            raise LoraError("slot", f"{slot} is outside 1..{self.slots.max_loras}")
        if adapter.rank > self.slots.max_rank:
            first = next(iter(adapter.weights))
            raise LoraError(f"{first}.lora_A", f"rank {adapter.rank} exceeds the slots' "
                            f"max rank {self.slots.max_rank}")
        for role in adapter.weights:
            if f"lora.{role}.b" not in self.types:
                raise LoraError(role, "not among the projections the slots adapt "
                                f"({', '.join(self.slots.targets)})")
        changed = self.unload(slot)
        lo, hi = self._rows(slot, adapter.rank)
        for role, (a, b) in adapter.weights.items():
            name, row0, _ = shrink_param(role, self.types)
            self.arrays[name][row0 + lo:row0 + hi, :] = a
            if role in self.row_order:
                b = b[self.row_order[role]]
            self.arrays[f"lora.{role}.b"][lo:hi, :] = (b * np.float32(adapter.scale)).T  # rounds
            changed += [name, f"lora.{role}.b"]
        self.loaded[slot] = adapter.name
        return sorted(set(changed))

    def _rows(self, slot: int, rank: int) -> tuple[int, int]:
        lo = (slot - 1) * self.slots.max_rank
        return lo, lo + rank

    def unload(self, slot: int) -> list[str]:
        """Zero ``slot``; returns the param names changed (none if it was empty)."""
        if slot not in self.loaded:
            return []
        changed = []
        lo, hi = self._rows(slot, self.slots.max_rank)
        lr = self.slots.max_loras * self.slots.max_rank
        for n, arr in self.arrays.items():
            if n == COLUMN_SLOT:
                continue
            parts = [arr[k + lo:k + hi] for k in range(0, arr.shape[0], lr)]
            if any(p.any() for p in parts):
                for p in parts:
                    p[...] = 0.0
                changed.append(n)
        del self.loaded[slot]
        return changed


__all__ = ["COLUMN_SLOT", "SHRINK_GROUPS", "LoraAdapter", "LoraError", "LoraSlots", "LoraTable",
           "PEFT_TARGETS", "config_object", "lora_dtype", "lora_types", "peft_adapter",
           "read_peft_adapter", "shrink_param"]
