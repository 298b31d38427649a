"""Text: tokenizers (GGUF / HF folder), incremental detokenization, chat templates.

``load_tokenizer(path)`` -> :class:`Tokenizer`; :class:`StreamDecoder` turns generated ids into
text deltas; ``render_chat`` / ``encode_chat`` apply the checkpoint's chat template the HF way.
"""

from poot.text.chat import ChatTemplateError, encode_chat, render_chat, render_template
from poot.text.stream import StreamDecoder
from poot.text.tokenizer import Tokenizer, TokenizerError, from_gguf_metadata, from_hf_folder, load_tokenizer

__all__ = ["ChatTemplateError", "StreamDecoder", "Tokenizer", "TokenizerError", "encode_chat",
           "from_gguf_metadata", "from_hf_folder", "load_tokenizer", "render_chat", "render_template"]
