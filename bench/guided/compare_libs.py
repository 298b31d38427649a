"""Candidate structured-output libraries on SmolLM2's vocabulary (49152 tokens): tokenizer
setup, grammar compile, and the per-token mask along a valid output, for a JSON schema and a
regex. Prints JSON. xgrammar is measured only where it imports (it needs torch and
transformers, which poot does not depend on).

    python bench/guided/compare_libs.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]},
             "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}
TEXT = '{"name": "Ada Lovelace", "age": 36, "tags": ["a", "ccc"]}'
REGEX = r"[0-9]{3}-[0-9]{4}"
REGEX_TEXT = "555-1234"


def _ms(xs):
    return {"median_us": round(1e6 * statistics.median(xs), 1),
            "max_us": round(1e6 * max(xs), 1)}


def llguidance(tok, ids, rx_ids):
    import numpy as np
    import llguidance as L

    t0 = time.perf_counter()
    lt = L.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=tok.eos_id)
    setup = time.perf_counter() - t0
    out = {"setup_s": round(setup, 3)}
    for name, grammar, seq in (("json_schema", L.LLMatcher.grammar_from_json_schema(SCHEMA),
                                ids), ("regex", L.LLMatcher.grammar_from_regex(REGEX),
                                       rx_ids)):
        t0 = time.perf_counter()
        m = L.LLMatcher(lt, grammar)
        compile_s = time.perf_counter() - t0
        mask = np.zeros((lt.vocab_size + 31) // 32, np.int32)
        times = []
        for t in seq:
            t1 = time.perf_counter()
            m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            times.append(time.perf_counter() - t1)
            assert (mask[t // 32] >> (t % 32)) & 1, "a valid token was masked"
            assert m.consume_token(t)
        out[name] = {"compile_s": round(compile_s, 4), "tokens": len(seq), **_ms(times),
                     "accepting": m.is_accepting()}
    return out


def outlines_core(tok, ids, rx_ids):
    import outlines_core as oc

    t0 = time.perf_counter()
    vocab = oc.Vocabulary.from_pretrained if False else None
    # outlines-core builds its vocabulary from token strings -> ids
    eos = tok.eos_id
    voc = {}
    for i in range(tok.vocab_size):
        if i == eos:
            continue
        voc.setdefault(tok.backend.id_to_token(i), []).append(i)
    v = oc.Vocabulary(eos, voc)
    setup = time.perf_counter() - t0
    out = {"setup_s": round(setup, 3), "regex_only_for_json": True}
    js = oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
    for name, rx, seq in (("json_schema", js, ids), ("regex", REGEX, rx_ids)):
        t0 = time.perf_counter()
        try:
            index = oc.Index(rx, v)
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
            continue
        compile_s = time.perf_counter() - t0
        guide = oc.Guide(index)
        times = []
        for t in seq:
            t1 = time.perf_counter()
            allowed = guide.get_tokens()
            times.append(time.perf_counter() - t1)
            guide.advance(t)
        out[name] = {"compile_s": round(compile_s, 4), "tokens": len(seq), **_ms(times)}
    return out


def main() -> int:
    from poot.load.bundled import smollm2_gguf
    from poot.text import load_tokenizer

    tok = load_tokenizer(smollm2_gguf())
    ids = tok.encode(TEXT, add_special_tokens=False)
    rx_ids = tok.encode(REGEX_TEXT, add_special_tokens=False)
    res = {"vocab": tok.vocab_size}
    for name, fn in (("llguidance", llguidance), ("outlines_core", outlines_core)):
        try:
            res[name] = fn(tok, ids, rx_ids)
        except Exception as e:  # noqa: BLE001  (a library that is missing or fails here)
            res[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    try:
        import xgrammar  # noqa: F401
        res["xgrammar"] = {"note": "importable; not measured"}
    except Exception as e:  # noqa: BLE001
        res["xgrammar"] = {"error": f"not importable here: {type(e).__name__}: {e}"[:200]}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
