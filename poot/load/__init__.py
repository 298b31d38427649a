"""Checkpoint loading: memory-mapped GGUF and safetensors readers, typed config.

``open_weights(path)`` -> :class:`WeightStore` of :class:`StoredTensor` views;
``load_config(path)`` -> :class:`ModelConfig`; every malformed input is a :class:`LoadError`.
"""

from poot.load.config import ModelConfig, RopeScaling, load_config
from poot.load.errors import LoadError
from poot.load.checkpoint import open_weights
from poot.load.store import (DType, StoredTensor, WeightStore, llama_rotary_permute_rows,
                             llama_rotary_unpermute_rows)

__all__ = ["DType", "LoadError", "ModelConfig", "RopeScaling", "StoredTensor", "WeightStore",
           "llama_rotary_permute_rows", "llama_rotary_unpermute_rows", "load_config",
           "open_weights"]
