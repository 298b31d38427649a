"""Model families: config types, weight-name tables and tracers, found by architecture.

``load_model(path)`` opens a checkpoint, looks its architecture up in :data:`REGISTRY` and
returns the family instance with its weights bound; ``model.trace(StepSpec...)`` gives the
step graph. Importing this package registers every family.
"""

from poot.models.base import (REGISTRY, LoadedModel, Model, ModelError, Registry, StepDims,
                              StepSpec, UnknownArchitecture, WeightBinding, WeightName,
                              contiguous_inputs, default_kv_dtype, load_model, trace_limits)
from poot.models import llama  # noqa: F401  (registers the Llama family)
from poot.models import qwen  # noqa: F401  (Qwen2, Qwen3)
from poot.models import gemma  # noqa: F401  (Gemma, Gemma2)
from poot.models import phi3  # noqa: F401  (Phi3)
from poot.models import moe  # noqa: F401  (Mixtral, Qwen3-MoE, GLM-4.5)
from poot.models import deepseek  # noqa: F401  (DeepSeek-V2, DeepSeek-V3: MLA)
from poot.models import bert  # noqa: F401  (BERT encoders: embeddings, cross-encoders)

__all__ = ["REGISTRY", "LoadedModel", "Model", "ModelError", "Registry", "StepDims", "StepSpec",
           "UnknownArchitecture", "WeightBinding", "WeightName", "contiguous_inputs",
           "default_kv_dtype", "load_model", "trace_limits"]
