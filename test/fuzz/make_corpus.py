"""Write the fuzzers' seed corpora under ``corpus/<target>/`` (deterministic; the files are
committed, so this runs only to change them): a few small valid inputs per target.

    python test/fuzz/make_corpus.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


def _gguf(path: Path, tokenizer: bool, tensors: dict[str, tuple[np.ndarray, object]]) -> bytes:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(32)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if tokenizer:
        toks = ["<s>", "</s>", "a", "b", "\u0120", "ab", "\u0120a"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(toks)
        w.add_token_types([3, 3, 1, 1, 1, 1, 1])
        w.add_token_merges(["a b", "\u0120 a"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name, (arr, raw_dtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def gguf_seeds(tmp: Path) -> dict[str, bytes]:
    import gguf

    q8 = np.zeros((2, 34), np.uint8)          # two Q8_0 blocks: f16 scale + 32 int8
    q8[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    q8[:, 2:] = np.arange(32, dtype=np.uint8)
    return {
        "tokenizer_f32_q8.gguf": _gguf(tmp / "a.gguf", True, {
            "token_embd.weight": (np.arange(14, dtype=np.float32).reshape(7, 2), None),
            "blk.0.attn_q.weight": (q8, gguf.GGMLQuantizationType.Q8_0)}),
        "f16_only.gguf": _gguf(tmp / "b.gguf", False, {
            "output_norm.weight": (np.ones(4, np.float16), None)}),
        "empty.gguf": _gguf(tmp / "c.gguf", False, {}),
        "zero_size.gguf": _gguf(tmp / "d.gguf", False, {
            "z": (np.zeros((0, 4), np.float32), None), "o": (np.ones(8, np.float32), None)}),
    }


def safetensors_seeds() -> dict[str, bytes]:
    from safetensors.numpy import save

    return {
        "two.safetensors": save({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                 "b": np.array([1, 2], np.int64)}, metadata={"format": "pt"}),
        "empty_tensor.safetensors": save({"e": np.zeros((0, 4), np.float16),
                                          "x": np.ones(3, np.uint8)}),
        "scalar.safetensors": save({"s": np.array(1.5, np.float64)}),
        # the JSON form (fuzz_safetensors.file_bytes): header text, blank line, buffer
        "header.json": json.dumps({"a": {"dtype": "F16", "shape": [2, 2],
                                         "data_offsets": [0, 8]},
                                   "z": {"dtype": "I32", "shape": [0, 3],
                                         "data_offsets": [8, 8]},
                                   "__metadata__": {"k": "v"}}).encode() + b"\n\n" + bytes(8),
        # the structured form: a header built from these bytes
        "structured.bin": b"\x01" + bytes(range(1, 40)),
    }


def chat_seeds() -> dict[str, bytes]:
    cases = {
        "plain.json": {"messages": [{"role": "system", "content": "Be terse."},
                                    {"role": "user", "content": "Hi \u00e9\U0001f600"}],
                       "template": 1, "add_generation_prompt": True},
        "assistant_null.json": {"messages": [{"role": "user", "content": "x"},
                                             {"role": "assistant", "content": None}],
                                "template": 1},
        "kwargs.json": {"messages": [{"role": "user", "content": " <s> a\n\tb "}],
                        "template": 2, "kwargs": {"enable_thinking": True}, "ids": [0, 1, 99]},
        "bad_role.json": {"messages": [{"role": "bot", "content": "?"}], "template": 2},
    }
    return {k: json.dumps(v, ensure_ascii=False).encode() for k, v in cases.items()}


def stops_seeds() -> dict[str, bytes]:
    """Raw bytes (the fuzzer reads counts, lengths and alphabet picks from them): the first
    few of a seeded random sequence that give a text where a stop string occurs, and one
    where none does."""
    import random
    import sys

    sys.path.insert(0, str(HERE))
    from fuzz_stops import one_input, reference, _case

    rng, out = random.Random(0), {}
    while len(out) < 4:
        data = bytes(rng.randrange(256) for _ in range(48))
        try:
            stops, text, _ = _case(data)
            one_input(data)
        except ValueError:
            continue
        hit = reference(text, stops)[1] is not None
        name = f"{'stop' if hit else 'none'}{len(out)}.bin"
        if hit or not any(k.startswith("none") for k in out):
            out[name] = data
    return out


def serve_seeds() -> dict[str, bytes]:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stop": ["\n"], "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "a", "schema": {"type": "object"}}}}
    chat2 = {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text",
                                                                         "text": "x"}]}],
             "guided_choice": ["yes", "no"], "stream": True,
             "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2}
    comp = {"model": "tiny", "prompt": [1, 2, 3], "n": 2, "seed": 5, "logprobs": 2,
            "guided_regex": "[ab]+", "logit_bias": {"7": 1.5}}
    comp2 = {"model": "tiny", "prompt": ["a", "b"], "guided_grammar": 'start: "x"',
             "stop_token_ids": [2], "max_tokens": 8}
    emb = {"model": "tiny", "input": [[1, 2], [3]], "encoding_format": "base64"}
    # first byte: the route's model (MODELS index) and raw JSON (< 128)
    return {"chat.json": b"\x00" + json.dumps(chat).encode(),
            "chat2.json": b"\x00" + json.dumps(chat2).encode(),
            "completion.json": b"\x01" + json.dumps(comp).encode(),
            "completion2.json": b"\x01" + json.dumps(comp2).encode(),
            "embedding.json": b"\x05" + json.dumps(emb).encode(),
            "tokenize.json": b"\x03" + json.dumps({"messages": [{"role": "user",
                                                                 "content": "a"}]}).encode()}


def guided_seeds() -> dict[str, bytes]:
    # first byte: the kind (fuzz_guided.KINDS index)
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"enum": ["x", "y"]}},
              "required": ["a"], "additionalProperties": False}
    return {"schema.bin": b"\x00" + json.dumps(schema).encode(),
            "schema_object.bin": b"\x03" + json.dumps({"type": "array", "items":
                                                        {"type": "string",
                                                         "maxLength": 3}}).encode(),
            "regex.bin": b"\x01[ab]+c{2,3}",
            "lark.bin": b'\x02start: "x" NUM\nNUM: /[0-9]+/\n',
            "gbnf.bin": b'\x02root ::= "a" | "b" root\n',
            "json_object.bin": b"\x04"}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        seeds = {"gguf": gguf_seeds(Path(tmp)), "safetensors": safetensors_seeds(),
                 "chat": chat_seeds(), "stops": stops_seeds(), "serve": serve_seeds(),
                 "guided": guided_seeds()}
    for target, files in seeds.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        print(f"{target}: {len(files)} files, {sum(map(len, files.values()))} bytes")


if __name__ == "__main__":
    main()
