"""Inputs the fuzzers found that broke a contract, each replayed through its fuzzer's
``one_input`` (the fuzzer's own checks) and checked directly against the typed error."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _replay(target: str, b64: str) -> None:
    pytest.importorskip("atheris", reason="the fuzzers' input decoding uses atheris "
                                          "(pip install -e \".[test]\")")
    from _harness import check

    mod = __import__(f"fuzz_{target}")
    check(mod.one_input, mod.ALLOWED, base64.b64decode(b64))


def test_chat_template_type_error_is_a_chat_template_error():
    """A message whose content is not a string, through a template that concatenates it
    (``'...' + message['content']``, SmolLM2's and Qwen's style): Jinja's TypeError escaped
    render_template untyped."""
    from poot.text.chat import ChatTemplateError, render_template

    src = "{% for m in messages %}{{ '<|im_start|>' + m['content'] }}{% endfor %}"
    for content in (True, None, 3, ["a"]):
        with pytest.raises(ChatTemplateError, match="chat template error: TypeError"):
            render_template(src, [{"role": "user", "content": content}])
    _replay("chat", "2X7M2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ")


@pytest.mark.parametrize("shape", [[0, 10 ** 30], [0, 2 ** 63], [0, 2 ** 40, 2 ** 40], [1] * 65])
def test_safetensors_shape_numpy_cannot_hold_is_a_load_error(tmp_path, shape):
    """A tensor of zero elements whose other dimensions (or rank) numpy cannot represent:
    numpy's ValueError escaped the reader (found by fuzz_safetensors)."""
    import json

    from poot.load.errors import LoadError
    from poot.load.safetensors import read_safetensors

    size = 0 if 0 in shape else 4
    header = json.dumps({"t": {"dtype": "F32", "shape": shape,
                               "data_offsets": [0, size]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(size))
    with pytest.raises(LoadError, match=r"t\.shape"):
        read_safetensors(path)


def test_safetensors_fuzz_input_huge_zero_size_tensor():
    _replay("safetensors", "AQECMgEAAAAAmZl6mZmZmZmZmZmZmZmZmpmZmZmQmZmZmZmZImR0eXBlImE=")


@pytest.mark.parametrize("dims", [[0, 2 ** 62, 2 ** 62], [0, 2 ** 63 - 1], [2 ** 40, 0, 2 ** 40]])
def test_gguf_zero_size_tensor_numpy_cannot_hold_is_a_load_error(tmp_path, dims):
    """A GGUF tensor of zero elements whose other dimensions multiply past what numpy can
    represent: numpy's ValueError escaped read_gguf (the same hole fuzz_safetensors found)."""
    import struct

    from poot.load.errors import LoadError
    from poot.load.gguf import read_gguf

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    info = struct.pack("<Q", 1) + b"t" + struct.pack("<I", len(dims)) + \
        b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, 0)   # F32, offset 0
    data = head + info
    data += bytes(-len(data) % 32) + bytes(32)
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    with pytest.raises(LoadError, match="tensor t dims"):
        read_gguf(path)


def test_guided_dead_end_grammar_replays_clean():
    """``start: "x" NUM`` with ``NUM: &/[9]R/`` (an empty intersection): after "x" the mask
    allowed only EOS where the grammar is incomplete, and the engine ended such a request
    with "stop" (found by fuzz_guided; the engine's side is
    test/engine/test_guided.py::test_a_constraint_that_cannot_be_completed_is_an_error_not_a_stop).
    The matcher must report the dead end the engine's error names."""
    _replay("guided", "AnN0YXJ0OiAieCIgTlVNCk5VTTogJi9bOV1SLwo=")
