"""Every ``POOT_*`` environment setting, in one table, and the typed readers poot reads them with.

:data:`SETTINGS` names each variable with its type, its default (as the environment spells
it; ``None`` when the default is computed or the setting is off), what it means and which
component reads it. Code reads a setting only through a reader here, so a name that is not in
the table is a bug (:class:`KeyError`), and a value of the wrong shape is a typed error naming
the variable (:class:`InvalidSetting`), never a bare ``ValueError`` from deep inside a
compile. An unset or blank variable reads as its default.

The README's table of settings is :func:`markdown_table`'s output (``python -m poot.settings``
prints it); ``test/test_settings.py`` checks that every ``POOT_*`` name in the repository's
source is declared here and listed there, and nothing else.

Layer 0: the standard library and :mod:`poot.errors` only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from poot.errors import PootError


class InvalidSetting(PootError):
    """A ``POOT_*`` environment variable holds a value of the wrong shape.

    Attributes:
        name: the variable (``"POOT_COMPILE_WORKERS"``).
        value: what it holds.
        expected: what it should hold, in words.
    """

    def __init__(self, name: str, value: str, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name}={value!r}: {expected}")


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``type`` is ``int``, ``float``, ``flag`` (``0``/``1``),
    ``choice`` (one of ``choices``), ``path`` or ``str``; ``default`` is spelled as in the
    environment (``None``: computed, or off, as ``meaning`` says); ``reader`` is the module,
    command or script that reads it."""

    name: str
    type: str
    default: str | None
    meaning: str
    reader: str
    choices: tuple[str, ...] = ()


def _s(name, type, default, meaning, reader, choices=()):
    return Setting(name, type, default, meaning, reader, tuple(choices))


#: Every ``POOT_*`` variable poot, its benchmarks and its tests read, by component.
SETTINGS: dict[str, Setting] = {s.name: s for s in [
    # compile cache and compilation
    _s("POOT_CACHE_DIR", "path", None, "compile cache folder (default ~/.cache/poot)",
       "poot.compiler.cache"),
    _s("POOT_CACHE_LOCK_TIMEOUT", "float", "900",
       "seconds to wait for a cache entry another process is compiling, then fail naming it",
       "poot.compiler.cache_lock"),
    _s("POOT_COMPILE_WORKERS", "int", None,
       "compile worker processes of a cold load, 0 none (default: cores - 1, at most 2)",
       "poot.api.compile_ahead"),
    _s("POOT_MOE", "choice", "auto",
       "how MoE blocks are traced: by shape, or always dense / sparse (to compare)",
       "poot.models.components", ("auto", "dense", "sparse")),
    # the CPU backend
    _s("POOT_CPU_THREADS", "int", None,
       "threads of the CPU kernels (default: OMP_NUM_THREADS, else the cores)",
       "poot.compiler.target"),
    _s("POOT_CPU_OPENMP", "str", "1",
       "OpenMP runtime: 1 finds one (cmeel-libomp wheel, then the system's), 0 none, "
       "else the path of a libomp", "poot.compiler.target, poot.backends.cpu.runtime"),
    _s("POOT_CPU_CODEGEN", "choice", "native",
       "native: LLVM opt/llc and ld in worker processes; jit: MLIR's ExecutionEngine",
       "poot.backends.cpu.codegen", ("native", "jit")),
    _s("POOT_CPU_CODEGEN_JOBS", "int", None,
       "processes the LLVM stages of one module run in (default: the cores)",
       "poot.backends.cpu.codegen"),
    _s("POOT_CPU_INT8", "flag", None,
       "override --precision for packed weights: 1 int8 activations, 0 f32 (experiments)",
       "poot.backends.cpu.codegen"),
    _s("POOT_CPU_AMX", "flag", "1",
       "0: no AMX tile matmuls even where the CPU and Linux allow them",
       "poot.compiler.target"),
    _s("POOT_CPU_REPACK", "flag", "1",
       "0: keep Q4_0/Q4_1/Q8_0 weights in ggml's layout on the CPU (no row-interleaved repack)",
       "poot.compiler.target"),
    _s("POOT_CPU_MALLOPT", "flag", "1",
       "keep big step buffers on glibc's heap (0 leaves malloc alone)",
       "poot.backends.cpu.codegen"),
    # the GPU backends
    _s("POOT_GPU_STRATEGIES", "str", None,
       "GPU kernel strategies to try: generic turns all off, a,b keeps only those named",
       "poot.backends.gpu.strategies"),
    _s("POOT_GPU_HORIZONTAL", "flag", "1", "fuse sibling GPU kernels into one launch",
       "poot.backends.gpu.horizontal"),
    _s("POOT_GPU_ROWSPLIT", "flag", "1", "split long GPU row reductions over blocks",
       "poot.backends.gpu.strategies.rowreduce"),
    _s("POOT_GPU_PREFETCH", "flag", "1",
       "GPU GEMVs prefetch their weights into L2 (read at import)",
       "poot.backends.gpu.strategies.matmul"),
    _s("POOT_CUDA_PDL", "flag", "1", "programmatic dependent launch on sm_90 and newer",
       "poot.backends.cuda.codegen, poot.backends.cuda.runtime"),
    _s("POOT_CUDA_GIL_CALLS", "flag", "1",
       "a CUDA step's queued driver calls keep the GIL (libcuda through ctypes.PyDLL)",
       "poot.backends.cuda.runtime"),
    _s("POOT_CUDA_WGMMA", "flag", "1",
       "the sm_90 target also names sm_90a: PTX for sm_90a, decode GEMMs on wgmma",
       "poot.backends.cuda.codegen"),
    _s("POOT_LIBDEVICE", "path", None,
       "glob of libdevice.10.bc (default: a local CUDA toolkit's)", "poot.backends.cuda.codegen"),
    _s("POOT_LD_LLD", "path", None, "the ld.lld that links AMDGPU code objects",
       "poot.backends.rocm.codegen"),
    _s("POOT_ROCM_RING", "choice", "system",
       "where the ROCm AQL queue's ring lives: system or device memory",
       "poot.backends.rocm.runtime", ("system", "device")),
    _s("POOT_ROCM_TIMEOUT_S", "float", "60", "seconds any ROCm wait may take before it fails",
       "poot.backends.rocm.runtime"),
    _s("POOT_VULKAN_DEVICE", "str", None,
       "Vulkan device: an index, or part of its name (default: discrete first)",
       "poot.backends.vulkan.runtime"),
    _s("POOT_WGPU_ADAPTER", "int", None, "index of the wgpu adapter (default: the preferred)",
       "poot.backends.wgpu.runtime"),
    # the serving engine and server
    _s("POOT_PIPELINE", "flag", None,
       "pipelined decode loop (default: where the device overlaps host and device work)",
       "poot.engine.llm_engine"),
    _s("POOT_CHAIN_LANES", "flag", "1",
       "issue rolling micro-batches chained, before the lane's step in flight is read",
       "poot.engine.llm_engine"),
    _s("POOT_API_KEY", "str", None, "bearer key poot serve requires (--api-key)",
       "poot.cli.serve_cmd"),
    _s("POOT_SERVE_SWITCH_INTERVAL", "float", "0.0001",
       "the interpreter's thread switch interval under poot serve, seconds: the longest the "
       "engine thread waits for the GIL while the HTTP front end runs", "poot.serve.server"),
    # benchmarks and tests
    _s("POOT_PP_CONTEXTS", "choice", "own",
       "pipeline stages on one GPU as own contexts or one shared context",
       "bench/gpu_run/pp_cli.py", ("own", "shared")),
    _s("POOT_FUZZ_SECONDS", "int", "6", "seconds each fuzz target runs", "test/fuzz"),
    _s("POOT_FUZZ_TIMEOUT", "int", "10", "seconds one fuzz input may take", "test/fuzz"),
    _s("POOT_FUZZ_RSS_MB", "int", "2048", "memory limit of a fuzz run, MB", "test/fuzz"),
    _s("POOT_FUZZ_SEED", "int", "1", "libFuzzer's seed (0: a random one, for campaigns)",
       "test/fuzz"),
    _s("POOT_FUZZ_KEEP", "path", None, "folder to keep the fuzz corpus in", "test/fuzz"),
    _s("POOT_FUZZ_EXAMPLES", "int", "60", "schemathesis examples per route and mode",
       "test/serve"),
    _s("POOT_LIT_OUTPUT", "path", None,
       "folder of lit's outputs (default: poot-lit in the temporary folder)", "lit.cfg.py"),
]}

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _declared(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared setting (add it to poot.settings.SETTINGS)") \
            from None


def get_str(name: str) -> str | None:
    """The value of ``name`` as set (unchanged), or its default when unset or blank.
    Raises KeyError for a name not in :data:`SETTINGS`."""
    s = _declared(name)
    raw = os.environ.get(name)
    return s.default if raw is None or not raw.strip() else raw


def get_int(name: str, minimum: int | None = None) -> int | None:
    """``name`` as an integer (its default when unset; None when that is computed).
    Raises :class:`InvalidSetting` for a value that is not an integer ``>= minimum``."""
    raw = get_str(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        raise InvalidSetting(name, raw, "must be an integer" +
                             (f" >= {minimum}" if minimum is not None else ""))
    return value


def get_float(name: str, positive: bool = False) -> float | None:
    """``name`` as a finite number (its default when unset; None when that is computed).
    Raises :class:`InvalidSetting` for anything else, or a value <= 0 when ``positive``."""
    raw = get_str(name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (positive and value <= 0):
        raise InvalidSetting(name, raw, "must be a " + ("positive " if positive else "") +
                             "finite number")
    return value


def get_flag(name: str) -> bool | None:
    """``name`` as on/off: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    (any case); its default when unset (None when the default is decided elsewhere).
    Raises :class:`InvalidSetting` for another value."""
    raw = get_str(name)
    if raw is None:
        return None
    v = raw.strip().lower()
    if v not in _TRUE + _FALSE:
        raise InvalidSetting(name, raw, "must be 1 or 0 (or true/false, yes/no, on/off)")
    return v in _TRUE


def get_choice(name: str) -> str | None:
    """``name``, one of its declared choices (its default when unset).
    Raises :class:`InvalidSetting` for another value."""
    raw = get_str(name)
    choices = SETTINGS[name].choices
    if raw is None or raw.strip() in choices:
        return None if raw is None else raw.strip()
    raise InvalidSetting(name, raw, "must be one of " + ", ".join(choices))


def markdown_table() -> str:
    """The README's table of every setting (one row each, in :data:`SETTINGS` order)."""
    rows = ["| Variable | Type | Default | Meaning | Read by |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        kind = "/".join(s.choices) if s.choices else s.type
        default = f"`{s.default}`" if s.default is not None else "-"
        readers = ", ".join(f"`{r}`" for r in s.reader.split(", "))
        rows.append(f"| `{s.name}` | {kind} | {default} | {s.meaning} | {readers} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
