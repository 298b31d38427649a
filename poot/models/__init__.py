"""Model families: config types, weight-name tables and tracers, found by architecture.

``load_model(path)`` opens a checkpoint, looks its architecture up in :data:`REGISTRY` and
returns the family instance with its weights bound; ``model.trace(StepSpec...)`` gives the
step graph. Importing this package registers every family (:mod:`poot.models.families`).
"""

from poot.models.base import (REGISTRY, LoadedModel, Model, ModelError, Registry, StepDims,
                              StepSpec, UnknownArchitecture, WeightBinding, WeightName,
                              contiguous_inputs, default_kv_dtype, trace_limits)
from poot.models.families import load_model

__all__ = ["REGISTRY", "LoadedModel", "Model", "ModelError", "Registry", "StepDims", "StepSpec",
           "UnknownArchitecture", "WeightBinding", "WeightName", "contiguous_inputs",
           "default_kv_dtype", "load_model", "trace_limits"]
