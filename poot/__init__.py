"""poot: an LLM inference engine built as a compiler on upstream MLIR.

Layers, lowest first (a module imports only its own layer or lower ones; ``test/test_layers.py``
is their definition): ``poot.errors`` and the other foundations; ``poot.dialects`` (the
primitive dialect and each op's one semantic definition), ``poot.load`` (safetensors/GGUF),
``poot.text`` (tokenizers, chat templates); ``poot.graph`` (builder and op compositions),
``poot.passes`` (the compiler's passes); ``poot.models`` (model families);
``poot.sampling_params``; ``poot.compiler``; ``poot.runtime``; ``poot.backends``;
``poot.engine``; ``poot.api``; ``poot.serve``; ``poot.cli`` (the ``poot`` command) and this
package's lazy top-level names.
"""

from poot.version import __version__  # noqa: F401  (poot.__version__)


def __getattr__(name):
    """``poot.LLM`` (the offline batched API, :class:`poot.api.LLM`), ``poot.SamplingParams``
    and ``poot.Guide`` (a guided-decoding constraint), imported on first use."""
    if name == "LLM":
        from poot.api import LLM  # lazy: `import poot` loads it on first use only

        return LLM
    if name == "SamplingParams":
        # lazy: `import poot` loads it on first use only
        from poot.sampling_params import SamplingParams

        return SamplingParams
    if name == "Guide":
        from poot.sampling_params import Guide  # lazy: `import poot` loads it on first use only

        return Guide
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# MLIR's Python bindings give every operation they wrap a Python class found by importing
# ``mlir.dialects.<dialect namespace>``; a failed import is not remembered, so each wrap of a
# ``poot.*`` op retried (and failed) a full import search: about 40% of a cold SmolLM2 compile
# (60 s -> 38 s on 2 cores). An empty module under that name ends the search (the op keeps
# the generic OpView, as before). Nothing is imported here (a machine that runs cached
# programs may have no MLIR: then nothing is registered).
import importlib.util as _util
import sys as _sys
import types as _types

try:
    _have_mlir = _util.find_spec("mlir") is not None
except (ImportError, ValueError):
    _have_mlir = False
if _have_mlir:
    _sys.modules.setdefault("mlir.dialects.poot", _types.ModuleType("mlir.dialects.poot"))
