"""One typed model configuration from HF ``config.json`` or GGUF metadata.

Sources: Hugging Face ``transformers`` configuration classes (both the 4.x layout with
top-level ``rope_theta``/``rope_scaling`` and the 5.x ``rope_parameters`` layout) and the GGUF
standardized keys (``ggml/docs/gguf.md``: ``{arch}.block_count``, ``{arch}.embedding_length``,
``{arch}.attention.head_count``, ...). A missing required field is a
:class:`~poot.load.errors.LoadError` naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from poot.load.checkpoint import open_weights
from poot.load.errors import LoadError
from poot.load.gguf import looks_like_gguf, read_gguf

RopeKind = Literal["none", "linear", "dynamic", "llama3", "yarn", "longrope"]
_ROPE_KINDS = ("none", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary position embedding frequency scaling.

    Attributes:
        kind: ``none`` (plain RoPE), ``linear`` (positions / factor), ``dynamic`` (NTK),
            ``llama3`` (per-band smoothing), ``yarn``, ``longrope`` (per-dim factors).
        factor: context extension factor (1.0 for none).
        original_max_position_embeddings: the pre-extension context length, if stated.
        low_freq_factor, high_freq_factor: llama3 band limits.
        beta_fast, beta_slow, attn_factor, mscale, mscale_all_dim: yarn parameters.
        short_factor, long_factor: longrope per-dimension factors.
    """

    kind: RopeKind = "none"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attn_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters shared by every model family.

    Attributes:
        architecture: HF ``architectures[0]`` (``"LlamaForCausalLM"``) or GGUF
            ``general.architecture`` (``"llama"``).
        model_type: HF ``model_type`` or the GGUF architecture (``"llama"``, ``"qwen2"``...).
        source: ``"hf"`` or ``"gguf"``.
        vocab_size: rows of the embedding table (GGUF: length of ``tokenizer.ggml.tokens``).
        hidden_size, intermediate_size: model width and dense FFN width (0 for all-MoE GGUF).
        num_layers, num_heads, num_kv_heads, head_dim: transformer shape (elements).
        rope_theta: RoPE base frequency; rope_scaling: :class:`RopeScaling`.
        sliding_rope_theta, sliding_rope_scaling: the RoPE of sliding-window layers where a
            config gives it apart (HF ``rope_parameters["sliding_attention"]``, or the older
            ``rope_local_base_freq``: Gemma 3), else None (every layer rotates alike).
        rms_norm_eps: RMSNorm epsilon.
        max_position_embeddings: trained context length (tokens).
        tie_word_embeddings: output projection shares the embedding table.
        sliding_window: local attention window in tokens, or None.
        bos_token_id: or None. eos_token_ids: every id that ends generation (config eos,
            generation_config eos, GGUF eos/eot/eom), in order, no duplicates.
        attn_logit_softcap, final_logit_softcap: ``cap * tanh(x / cap)`` limits, or None.
        num_experts, experts_per_token, moe_intermediate_size: MoE shape (0 / None if dense).
        extra: the raw config (HF JSON object or GGUF metadata minus tokenizer arrays), read-only.
    """

    architecture: str
    model_type: str
    source: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: RopeScaling
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int | None = None
    sliding_rope_theta: float | None = None
    sliding_rope_scaling: RopeScaling | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False,
                                     repr=False)


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The :class:`ModelConfig` of a checkpoint: a ``.gguf`` file, a HF folder, or a
    ``.safetensors`` file with ``config.json`` beside it. Raises LoadError."""
    p = os.fspath(path)

    if os.path.isfile(p) and (p.endswith(".gguf") or looks_like_gguf(p)):
        g = read_gguf(p)
        return config_from_gguf(g.metadata, set(g.tensors), p)
    folder = p if os.path.isdir(p) else os.path.dirname(p) or "."
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf")) \
            if os.path.isdir(p) else []
        if len(ggufs) == 1:
            return load_config(os.path.join(folder, ggufs[0]))
        raise LoadError(folder, "config.json", "no config.json next to the weights")
    raw = _read_json(cfg_path)
    gen_path = os.path.join(folder, "generation_config.json")
    gen = _read_json(gen_path) if os.path.isfile(gen_path) else {}
    return config_from_hf(raw, cfg_path, generation=gen, tensor_names=_tensor_names(p))


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > 16 << 20:  # configs are kilobytes; refuse before reading
                raise LoadError(path, "file", f"{size} bytes is too large for a config")
            obj = json.loads(f.read(size).decode("utf-8"))
    except OSError as e:
        raise LoadError(path, "file", e.strerror or str(e)) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise LoadError(path, "file", f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise LoadError(path, "file", "must be a JSON object")
    return obj


def _tensor_names(path: str) -> set[str] | None:
    """Tensor names from the safetensors headers (cheap), or None if there are none."""
    try:
        return set(open_weights(path))
    except LoadError:
        return None


# --- Hugging Face config.json -----------------------------------------------------------------

class _Fields:
    """Typed getters over a dict that raise LoadError naming the field."""

    def __init__(self, d: Mapping[str, Any], file: str, prefix: str = ""):
        self.d, self.file, self.prefix = d, file, prefix

    def fail(self, key: str, problem: str) -> LoadError:
        return LoadError(self.file, self.prefix + key, problem)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.d.get(key)
        return default if v is None else v

    def int(self, *keys: str, default: Any = LoadError) -> Any:
        for k in keys:
            v = self.d.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    v = _uniform_int(v)
                    if v is None:
                        raise self.fail(k, f"must be a non-negative integer, found {self.d[k]!r}")
                return int(v)
        if default is LoadError:
            raise self.fail(keys[0], "missing required field")
        return default

    def float(self, *keys: str, default: Any = LoadError) -> Any:
        for k in keys:
            v = self.d.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise self.fail(k, f"must be a number, found {v!r}")
                return float(v)
        if default is LoadError:
            raise self.fail(keys[0], "missing required field")
        return default


def _uniform_int(v: Any) -> int | None:
    """A per-layer integer array whose entries are all equal counts as that integer."""
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__len__"):
        return None
    try:
        vals = {int(x) for x in v}
    except (TypeError, ValueError):
        return None
    return vals.pop() if len(vals) == 1 and min(vals | {0}) >= 0 else None


def _ids(*vals: Any) -> tuple[int, ...]:
    out: list[int] = []
    for v in vals:
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(x, int) and not isinstance(x, bool) and x not in out:
                out.append(x)
    return tuple(out)


def config_from_hf(raw: Mapping[str, Any], file: str = "config.json", *,
                   generation: Mapping[str, Any] | None = None,
                   tensor_names: set[str] | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed HF ``config.json`` object.

    ``tensor_names`` (if known) decides tying when ``tie_word_embeddings`` is absent: tied
    means no ``lm_head.weight``. Raises LoadError naming a missing or mistyped field.
    """
    # Multimodal wrappers keep the language model under text_config.
    f = _Fields(raw["text_config"], file, "text_config.") \
        if isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw \
        else _Fields(raw, file)
    archs = raw.get("architectures")
    model_type = str(f.get("model_type", raw.get("model_type", "")))
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) \
        else model_type
    if not arch:
        raise LoadError(file, "architectures", "missing (and no model_type)")
    hidden = f.int("hidden_size", "n_embd", "d_model")
    heads = f.int("num_attention_heads", "n_head")
    num_experts = f.int("num_local_experts", "num_experts", "n_routed_experts", default=0)
    theta, scaling = _hf_rope(f)
    local_theta, local_scaling = _hf_sliding_rope(f)
    tie = raw.get("tie_word_embeddings", f.get("tie_word_embeddings"))
    if tie is None:
        tie = tensor_names is not None and "lm_head.weight" not in tensor_names
    window = f.int("sliding_window", default=None)
    if f.get("use_sliding_window") is False:
        window = None  # qwen2-style configs store a window they do not use
    gen = generation or {}
    return ModelConfig(
        architecture=arch, model_type=model_type, source="hf",
        vocab_size=f.int("vocab_size"), hidden_size=hidden,
        intermediate_size=f.int("intermediate_size", "n_inner", default=0 if num_experts
                                else LoadError),
        num_layers=f.int("num_hidden_layers", "n_layer"), num_heads=heads,
        num_kv_heads=f.int("num_key_value_heads", default=heads),
        head_dim=f.int("head_dim", default=hidden // heads if heads else 0),
        rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=f.float("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
        max_position_embeddings=f.int("max_position_embeddings", "n_positions"),
        tie_word_embeddings=bool(tie), sliding_window=window,
        bos_token_id=f.int("bos_token_id", default=gen.get("bos_token_id")),
        eos_token_ids=_ids(f.get("eos_token_id"), gen.get("eos_token_id")),
        attn_logit_softcap=f.float("attn_logit_softcapping", default=None),
        final_logit_softcap=f.float("final_logit_softcapping", default=None),
        num_experts=num_experts,
        experts_per_token=f.int("num_experts_per_tok", "num_experts_per_token", default=0),
        moe_intermediate_size=f.int("moe_intermediate_size", default=None),
        sliding_rope_theta=local_theta, sliding_rope_scaling=local_scaling,
        extra=MappingProxyType(dict(raw)),
    )


def _hf_sliding_rope(f: _Fields) -> tuple[float | None, RopeScaling | None]:
    """The sliding-window layers' own RoPE: transformers 5 keys ``rope_parameters`` by layer
    type; 4.x configs give only a base (``rope_local_base_freq``, unscaled)."""
    params = f.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        sub = _Fields(params["sliding_attention"], f.file,
                      f.prefix + "rope_parameters.sliding_attention.")
        return sub.float("rope_theta", default=10000.0), _rope_scaling(sub)
    base = f.float("rope_local_base_freq", default=None)
    return (base, RopeScaling()) if base is not None else (None, None)


def _hf_rope(f: _Fields) -> tuple[float, RopeScaling]:
    params = f.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" not in params and \
            isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]  # per-layer-type parameters (gemma3 style)
    if isinstance(params, dict):  # transformers >= 5
        sub = _Fields(params, f.file, f.prefix + "rope_parameters.")
        theta = sub.float("rope_theta", default=f.float("rope_theta", default=10000.0))
        return theta, _rope_scaling(sub)
    theta = f.float("rope_theta", default=10000.0)
    rs = f.get("rope_scaling")
    if rs is None:
        return theta, RopeScaling()
    if not isinstance(rs, dict):
        raise f.fail("rope_scaling", f"must be an object, found {rs!r}")
    return theta, _rope_scaling(_Fields(rs, f.file, f.prefix + "rope_scaling."))


def _rope_scaling(s: _Fields) -> RopeScaling:
    kind = s.get("rope_type", s.get("type", "default"))
    kind = {"default": "none", "none": "none", "su": "longrope"}.get(kind, kind)
    if kind not in _ROPE_KINDS:
        raise s.fail("rope_type", f"unsupported rope scaling {kind!r} (known: "
                                  f"{', '.join(_ROPE_KINDS)})")
    if kind == "none":
        return RopeScaling()

    def floats(k: str) -> tuple[float, ...] | None:
        v = s.get(k)
        return tuple(float(x) for x in v) if isinstance(v, list) else None

    return RopeScaling(
        kind=kind, factor=s.float("factor", default=1.0),
        original_max_position_embeddings=s.int("original_max_position_embeddings",
                                               default=None),
        low_freq_factor=s.float("low_freq_factor", default=None),
        high_freq_factor=s.float("high_freq_factor", default=None),
        beta_fast=s.float("beta_fast", default=None), beta_slow=s.float("beta_slow", default=None),
        attn_factor=s.float("attention_factor", "attn_factor", default=None),
        mscale=s.float("mscale", default=None),
        mscale_all_dim=s.float("mscale_all_dim", default=None),
        short_factor=floats("short_factor"), long_factor=floats("long_factor"))


# --- GGUF metadata ----------------------------------------------------------------------------

def config_from_gguf(meta: Mapping[str, Any], tensor_names: set[str] | None = None,
                     file: str = "model.gguf") -> ModelConfig:
    """Build a :class:`ModelConfig` from GGUF metadata (see :func:`poot.load.gguf.read_gguf`).

    Tied embeddings mean no ``output.weight`` tensor. The vocabulary size is the length of
    ``tokenizer.ggml.tokens`` (else ``{arch}.vocab_size``). Raises LoadError naming the key.
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise LoadError(file, "general.architecture", "missing required field")
    a = _Fields(meta, file)
    k = arch + "."
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else a.int(k + "vocab_size")
    hidden = a.int(k + "embedding_length")
    heads = a.int(k + "attention.head_count")
    num_experts = a.int(k + "expert_count", default=0)
    names = tensor_names or set()
    extra = {key: v for key, v in meta.items() if not key.startswith("tokenizer.ggml.")}
    return ModelConfig(
        architecture=arch, model_type=arch, source="gguf", vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=a.int(k + "feed_forward_length",
                                default=0 if num_experts else LoadError),
        num_layers=a.int(k + "block_count"), num_heads=heads,
        num_kv_heads=a.int(k + "attention.head_count_kv", default=heads),
        head_dim=a.int(k + "attention.key_length", default=hidden // heads if heads else 0),
        rope_theta=a.float(k + "rope.freq_base", default=10000.0),
        rope_scaling=_gguf_rope(a, k),
        rms_norm_eps=a.float(k + "attention.layer_norm_rms_epsilon",
                             k + "attention.layer_norm_epsilon"),
        max_position_embeddings=a.int(k + "context_length"),
        tie_word_embeddings="output.weight" not in names,
        sliding_window=a.int(k + "attention.sliding_window", default=None),
        bos_token_id=a.int("tokenizer.ggml.bos_token_id", default=None),
        eos_token_ids=_ids(*(meta.get(f"tokenizer.ggml.{t}_token_id")
                             for t in ("eos", "eot", "eom"))),
        attn_logit_softcap=a.float(k + "attn_logit_softcapping", default=None),
        final_logit_softcap=a.float(k + "final_logit_softcapping", default=None),
        num_experts=num_experts, experts_per_token=a.int(k + "expert_used_count", default=0),
        moe_intermediate_size=a.int(k + "expert_feed_forward_length", default=None),
        extra=MappingProxyType(extra),
    )


def _gguf_rope(a: _Fields, k: str) -> RopeScaling:
    """``{arch}.rope.scaling.*``. llama3-style scaling is stored by llama.cpp as a
    ``rope_freqs.weight`` tensor instead (the model family reads it); it is not a kind here."""
    kind = a.get(k + "rope.scaling.type", "none")
    if kind not in _ROPE_KINDS:
        raise a.fail(k + "rope.scaling.type", f"unsupported rope scaling {kind!r}")
    if kind == "none":
        return RopeScaling()
    return RopeScaling(
        kind=kind, factor=a.float(k + "rope.scaling.factor", default=1.0),
        original_max_position_embeddings=a.int(k + "rope.scaling.original_context_length",
                                               default=None),
        beta_fast=a.float(k + "rope.scaling.yarn_beta_fast", default=None),
        beta_slow=a.float(k + "rope.scaling.yarn_beta_slow", default=None),
        attn_factor=a.float(k + "rope.scaling.attn_factor", default=None))
