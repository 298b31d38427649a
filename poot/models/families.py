"""Every model family, registered in :data:`~poot.models.base.REGISTRY` by importing it
here, and :func:`load_model`, which finds a checkpoint's family by its architecture.

A family module registers itself when imported (``@REGISTRY.register``); this module is the
one place that imports them all, so anything that looks an architecture up imports this.
"""

from __future__ import annotations

import os
from typing import Any

from poot.load import load_config, open_weights
from poot.models import bert  # noqa: F401  (BERT encoders: embeddings, cross-encoders)
from poot.models import deepseek  # noqa: F401  (DeepSeek-V2, DeepSeek-V3: MLA)
from poot.models import gemma  # noqa: F401  (Gemma, Gemma2)
from poot.models import llama  # noqa: F401  (registers the Llama family)
from poot.models import moe  # noqa: F401  (Mixtral, Qwen3-MoE, GLM-4.5)
from poot.models import phi3  # noqa: F401  (Phi3)
from poot.models import qwen  # noqa: F401  (Qwen2, Qwen3)
from poot.models.base import REGISTRY, LoadedModel, ModelError, Registry


def load_model(path: str | os.PathLike, registry: Registry | None = None,
               **options: Any) -> LoadedModel:
    """Open a checkpoint (``.gguf``, ``.safetensors`` or HF folder), find its family by
    architecture, build its config and bind its weights (packed tensors stay packed).
    ``options`` go to the family's ``from_config`` unchanged.

    Raises :class:`~poot.models.base.UnknownArchitecture`, :class:`ModelError` (its message
    starts with ``path``) or a :class:`~poot.load.errors.LoadError`.
    """
    store = open_weights(path)   # first: a missing path or a broken file is named precisely
    cfg = load_config(path)
    try:
        family = (registry or REGISTRY).lookup(cfg.architecture)
        model = family.from_config(cfg, store, **options)
        return LoadedModel(model, model.bind(store), store)
    except ModelError as e:      # the same error, its message led by the checkpoint's path
        where = os.fspath(path)
        if e.args and isinstance(e.args[0], str) and not e.args[0].startswith(where):
            e.args = (f"{where}: {e.args[0]}",) + e.args[1:]
        raise
