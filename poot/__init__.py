"""poot: an LLM inference engine built as a compiler on upstream MLIR.

Layers (a folder each): ``poot.dialects`` (the primitive dialect and each op's one semantic
definition), ``poot.passes`` (the compiler's passes), ``poot.graph`` (builder and op
compositions), ``poot.load`` (safetensors/GGUF), ``poot.text`` (tokenizers, chat templates),
``poot.cli`` (the ``poot`` command).
"""

__version__ = "0.1.0"
