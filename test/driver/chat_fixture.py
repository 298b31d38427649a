"""The tiny Q4_1 GGUF fixture with a chat template added (the fixture itself has none): what
the README's ``--chat`` examples and ``poot chat`` need. Written with gguf's own
``gguf_new_metadata`` copy, tensors and metadata unchanged."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1" / "model.gguf"

#: short on purpose: the fixture's context is 128 tokens of a 256-entry vocabulary
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


def chat_gguf(folder: Path, context: int | None = None) -> Path:
    """``folder/chat.gguf``: the tiny fixture plus :data:`TEMPLATE` (written once); with
    ``context``, its trained context (``llama.context_length``, 128) raised to that many
    positions, so the defaults of commands written for real models (512) fit."""
    import gguf
    from gguf.scripts.gguf_new_metadata import (MetadataDetails, copy_with_new_metadata,
                                                get_field_data)

    out = Path(folder) / (f"chat{context}.gguf" if context else "chat.gguf")
    if out.is_file():
        return out
    reader = gguf.GGUFReader(GGUF)
    arch = get_field_data(reader, gguf.Keys.General.ARCHITECTURE)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    new = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING,
                                                               TEMPLATE)}
    if context:
        new[f"{arch}.context_length"] = MetadataDetails(gguf.GGUFValueType.UINT32, context)
    copy_with_new_metadata(reader, writer, new, [])
    tmp.replace(out)
    return out
