"""The feature matrix: what each backend compiles, per model family and weight format.

    cells = feature_matrix(fixtures_root())            # every family x format x backend
    print(markdown(cells))

A cell compiles one step of a family's tiny random-init checkpoint (the first fixture
folder of that family under ``test/fixtures/tiny``, in name order) with every weight matrix
stored in one format, for one registered backend (:data:`poot.backends.registry.BACKENDS`),
and records what :func:`poot.compiler.compile` said:

* ``ok``: it compiled to the backend's artifact (machine code for the CPU, PTX for CUDA,
  SPIR-V for Vulkan and wgpu, HSACO for ROCm): compile-only, nothing runs, so no device is
  needed. Backends whose target comes from a device (Vulkan, wgpu) compile for the default
  device capabilities their target hook assumes (``device_caps={}``), so the table does not
  depend on the machine that made it.
* ``refused``: a typed refusal (:class:`~poot.compiler.planning.Refusal`: the op and the
  capability the target lacks) or another :class:`~poot.errors.PootError` naming what is not
  supported (a format whose blocks do not tile the fixture's rows, a backend with no code
  generator), with its message.
* ``error``: anything else (an exception that is not a poot error): a bug to fix, never a
  capability statement.

The step: decoder families compile their batch-1 decode step (KV capacity 64, logits);
encoder-only families (``encoder_only``) their pooled embeddings step (batch 1, 16 tokens,
mean pooling). The weight formats (:data:`FORMATS`): f32, bf16 and f16 store every matrix
(rank-2 weight) in that dtype; Q4_0, Q4_1, Q8_0, Q4_K and Q6_K pack every matrix in GGUF's
blocks (vectors such as norm weights stay f32), as a GGUF checkpoint of that type would.
Only the weights' types matter to compiling: the fixture's own (f32) weights are opened for
their names and shapes, and their values are never read.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from poot.errors import PootError

#: the weight formats of the matrix's columns
FORMATS = ("f32", "bf16", "f16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k")

#: the decode step's KV capacity and the pooled step's tokens (small: the tiny configs)
KV_CAPACITY, POOL_TOKENS = 64, 16


@dataclass(frozen=True)
class Cell:
    """One compile: ``family`` (the model family's name), ``fixture`` (the config folder's
    name), ``fmt`` (one of :data:`FORMATS`), ``backend``; ``status`` ``ok`` / ``refused`` /
    ``error``; ``detail`` the refusal's or error's message (empty when ok)."""

    family: str
    fixture: str
    fmt: str
    backend: str
    status: str
    detail: str = ""


class MatrixError(PootError):
    """No fixture folder to build the matrix from, or an unknown family, format or backend
    asked."""


def fixtures_root() -> Path:
    """``test/fixtures/tiny`` of this source checkout (the matrix is a developer tool: an
    installed wheel has no fixtures). Raises :class:`MatrixError` when it is missing."""
    root = Path(__file__).resolve().parents[1] / "test" / "fixtures" / "tiny"
    if not root.is_dir():
        raise MatrixError(f"no tiny fixtures at {root} (poot matrix runs from a source "
                          "checkout; pass --fixtures DIR)")
    return root


def family_fixtures(root: Path) -> dict[str, Path]:
    """Family name -> its first config folder under ``root`` (folders with a
    ``config.json``, in name order)."""
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.load.config import _read_json, config_from_hf
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.models import REGISTRY

    out: dict[str, Path] = {}
    for d in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        cfg = config_from_hf(_read_json(str(d / "config.json")), str(d / "config.json"))
        family = REGISTRY.lookup(cfg.architecture).family
        out.setdefault(family, d)
    if not out:
        raise MatrixError(f"no fixture folder with a config.json under {root}")
    return out


def weight_types(base: dict, fmt: str) -> dict:
    """``base`` (weight name -> f32 :class:`~poot.dialects.types.TensorType`) with every
    rank-2 weight stored as ``fmt``: a :class:`~poot.dialects.types.TensorType` of that dtype
    for f32/bf16/f16, else a :class:`~poot.dialects.types.PackedType` of that GGUF format."""
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.dialects.quant import Quant
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.dialects.types import DType, PackedType, TensorType

    out = {}
    for name, t in base.items():
        if not isinstance(t, TensorType) or t.rank != 2:
            out[name] = t
        elif fmt in ("f32", "bf16", "f16"):
            out[name] = TensorType(t.shape, DType(fmt))
        else:
            out[name] = PackedType(Quant[fmt.upper()].value, t.shape)
    return out


def _trace(model, types):
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.models import StepSpec
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.models.pooling import PoolSpec

    if getattr(model, "encoder_only", False):
        return model.trace_pooled(PoolSpec(1, POOL_TOKENS), types)
    return model.trace(StepSpec.decode(kv_capacity=KV_CAPACITY), types)


def _trace_as(model, base_types: dict, fmt: str):
    return _trace(model, weight_types(base_types, fmt))


def compile_cell(model, base_types: dict, fmt: str, backend: str,
                 traced: Callable[[], object] | None = None) -> tuple[str, str]:
    """``(status, detail)`` of compiling ``model``'s step with weights of ``fmt`` for
    ``backend`` (module doc). ``traced``: returns that step's graph (traced once for every
    backend of a row: :func:`compile` compiles a copy and leaves it as it was); default:
    traced here."""
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.api import target_for
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.compiler import CompileOptions, compile

    traced = traced or functools.partial(_trace_as, model, base_types, fmt)
    try:
        target = target_for(backend, device_caps={})
        compile(traced(), target, CompileOptions())
    except PootError as e:
        return "refused", " ".join(str(e).split())
    except Exception as e:  # noqa: BLE001  (reported as a bug, not a capability)
        return "error", f"{type(e).__name__}: {' '.join(str(e).split())}"
    return "ok", ""


def feature_matrix(root: Path, families: Iterable[str] | None = None,
                   formats: Iterable[str] | None = None, backends: Iterable[str] | None = None,
                   on_cell: Callable[[Cell], None] | None = None) -> list[Cell]:
    """Every (family, format, backend) cell, in that order (module doc). ``families``,
    ``formats``, ``backends``: subsets (default: all). ``on_cell`` is called with each cell as
    it is done. Raises :class:`MatrixError` for a name that is not a family, format or
    registered backend."""
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.backends.registry import BACKENDS
    # lazy: the CLI reads FORMATS at start-up without loading the compiler
    from poot.models import load_model

    fams = family_fixtures(root)
    want_f = list(families or fams)
    want_q = list(formats or FORMATS)
    want_b = list(backends or BACKENDS)
    for what, names, known in (("family", want_f, fams), ("format", want_q, FORMATS),
                               ("backend", want_b, BACKENDS)):
        bad = [n for n in names if n not in known]
        if bad:
            raise MatrixError(f"unknown {what} {', '.join(bad)} (known: {', '.join(known)})")
    cells = []
    for fam in want_f:
        lm = load_model(str(fams[fam]))
        base = dict(lm.weights.types)
        for fmt in want_q:
            traced = functools.cache(functools.partial(_trace_as, lm.model, base, fmt))
            for be in want_b:
                status, detail = compile_cell(lm.model, base, fmt, be, traced)
                cell = Cell(fam, fams[fam].name, fmt, be, status, detail)
                cells.append(cell)
                if on_cell is not None:
                    on_cell(cell)
    return cells


def to_json(cells: list[Cell]) -> str:
    """The cells as a JSON list of objects (:class:`Cell`'s fields), one per line."""
    return "[\n" + ",\n".join(json.dumps(asdict(c), sort_keys=True) for c in cells) + "\n]\n"


def from_json(text: str) -> list[Cell]:
    """Cells read back from :func:`to_json`'s text."""
    return [Cell(**d) for d in json.loads(text)]


def _summary(by: dict[str, Cell], backends: list[str]) -> str:
    ok = [b for b in backends if b in by and by[b].status == "ok"]
    bad = [b for b in backends if b in by and by[b].status == "error"]
    text = "all" if len(ok) == len(backends) else "none" if not ok else \
        ("all but " + ", ".join(b for b in backends if b not in ok)
         if len(ok) > len(backends) / 2 else ", ".join(ok))
    return text + (" (ERROR: " + ", ".join(bad) + ")" if bad else "")


def markdown(cells: list[Cell]) -> str:
    """A Markdown table: a row per family, a column per format, each cell naming the backends
    that compile it (``all``, ``all but X``, the list, or ``none``; a backend that failed with
    an error that is not a refusal is named after ``ERROR``); below it, each distinct reason
    once with the cells it covers (``family/format/backend``)."""
    backends = list(dict.fromkeys(c.backend for c in cells))
    formats = list(dict.fromkeys(c.fmt for c in cells))
    grid: dict[str, dict[str, dict[str, Cell]]] = {}
    for c in cells:
        grid.setdefault(c.family, {}).setdefault(c.fmt, {})[c.backend] = c
    lines = [f"Backends: {', '.join(backends)}.", "",
             "| family (fixture) | " + " | ".join(formats) + " |",
             "|---|" + "---|" * len(formats)]
    for fam, by_fmt in grid.items():
        fixture = next(iter(next(iter(by_fmt.values())).values())).fixture
        lines.append(f"| {fam} ({fixture}) | " + " | ".join(
            _summary(by_fmt[f], backends) if f in by_fmt else "" for f in formats) + " |")
    why: dict[str, list[str]] = {}
    for c in cells:
        if c.status != "ok":
            why.setdefault(f"{c.status}: {c.detail}", []).append(
                f"{c.family}/{c.fmt}/{c.backend}")
    if why:
        lines += ["", "Why a cell is not compiled:", ""]
        for msg, where in why.items():
            shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4
                                            else "")
            lines.append(f"- {msg} ({shown})")
    return "\n".join(lines) + "\n"


__all__ = ["Cell", "FORMATS", "MatrixError", "compile_cell", "family_fixtures",
           "feature_matrix", "fixtures_root", "from_json", "markdown", "to_json",
           "weight_types"]
