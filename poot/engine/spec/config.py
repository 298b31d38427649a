"""The speculative-decoding settings (:class:`SpeculativeConfig`) and their typed errors.

``poot generate/serve/bench --speculative ngram[:k]`` (or ``--draft-model PATH
[--num-draft-tokens k]``) and ``poot.LLM(..., speculative="ngram:4")`` (or
``"draft:PATH[:k]"``) go through :func:`parse_speculative`; a bad value raises
:class:`SpeculativeConfigError` naming the field, before any step compiles. The draft model's
own checks (path, tokenizer, vocabulary, context) need the checkpoint opened:
:func:`poot.engine.spec.draft.check_draft`, also before any step compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.errors import PootError

#: The most tokens one sequence may propose per step (a verify step has 1 + k rows each).
MAX_SPECULATIVE_TOKENS = 15

#: Proposers this engine has (EAGLE or MTP heads would be further methods:
#: docs/speculative.md).
METHODS = ("ngram", "draft")


#: what a draft method without its checkpoint is told
NEEDS_DRAFT_PATH = ("a draft model path is needed: give --draft-model PATH or --speculative "
                    "draft:PATH[:k] (API: speculative='draft:PATH[:k]' or draft_model=PATH)")


class SpeculativeConfigError(PootError, ValueError):
    """A speculative-decoding setting is invalid. Attributes: field, value."""

    def __init__(self, field: str, value, why: str):
        self.field, self.value = field, value
        shown = "" if value is None else f" {value!r}"       # None: the setting is missing
        super().__init__(f"speculative {field}{shown}: {why}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How a sequence proposes tokens for the target to verify.

    Attributes:
        method: ``"ngram"``: prompt lookup (:mod:`poot.engine.spec.ngram`); ``"draft"``: a
            draft model's greedy tokens (:mod:`poot.engine.spec.draft`).
        num_speculative_tokens: k, the most tokens proposed per sequence and step
            (1..:data:`MAX_SPECULATIVE_TOKENS`).
        prompt_lookup_min, prompt_lookup_max: the n-gram lengths matched, longest first
            (vLLM's names), 1 <= min <= max <= 16.
        adaptive: choose k per sequence from its recent acceptance and switch speculation
            off where it costs more than it saves (:mod:`poot.engine.spec.adaptive`);
            False: always propose up to k tokens.
        row_cost: the cost-model prior of one extra token row of a step, as a fraction of a
            one-row decode step, used until the engine has timed the steps (0 < x <= 1).
        draft_model: the draft checkpoint (``method="draft"`` only): anything poot loads
            (GGUF, safetensors folder) sharing the target's tokenizer.
        draft_random_weights: ``"bf16"``/``"f16"``/``"f32"``: ``draft_model`` is a HF
            ``config.json`` and the draft's weights are random of its shapes in that dtype,
            seeded by ``draft_seed`` (benchmarks and tests of a pair of real shapes).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    adaptive: bool = True
    row_cost: float = 0.25
    draft_model: str | None = None
    draft_random_weights: str | None = None
    draft_seed: int = 0

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise :class:`SpeculativeConfigError` naming the first invalid field."""
        if self.method not in METHODS:
            raise SpeculativeConfigError("method", self.method,
                                         f"unknown proposer; one of {', '.join(METHODS)}")
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1,
                MAX_SPECULATIVE_TOKENS)
        _int_in("prompt_lookup_min", self.prompt_lookup_min, 1, 16)
        _int_in("prompt_lookup_max", self.prompt_lookup_max, 1, 16)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SpeculativeConfigError("prompt_lookup_min", self.prompt_lookup_min,
                                         f"exceeds prompt_lookup_max {self.prompt_lookup_max}")
        if isinstance(self.row_cost, bool) or not isinstance(self.row_cost, (int, float)) \
                or not 0 < self.row_cost <= 1:
            raise SpeculativeConfigError("row_cost", self.row_cost, "must be in (0, 1]")
        if self.method == "draft" and not self.draft_model:
            raise SpeculativeConfigError("draft_model", None, NEEDS_DRAFT_PATH)
        if self.method != "draft" and self.draft_model:
            raise SpeculativeConfigError("draft_model", str(self.draft_model),
                                         f"a draft model is for method 'draft', not "
                                         f"{self.method!r}")
        if self.draft_random_weights not in (None, "bf16", "f16", "f32"):
            raise SpeculativeConfigError("draft_random_weights", self.draft_random_weights,
                                         "one of bf16, f16, f32")


def _int_in(field: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpeculativeConfigError(field, value, f"must be an integer in [{lo}, {hi}]")


def parse_speculative(value) -> SpeculativeConfig | None:
    """A :class:`SpeculativeConfig` from ``value``: None or ``""``/``"off"`` (none), a
    config (as is), or text ``METHOD[:k]`` (``"ngram"``, ``"ngram:6"``) or
    ``draft:PATH[:k]`` (``"draft:/models/small.gguf:3"``; a path that itself ends in
    ``:<digits>`` is written with a trailing ``:4``). Raises
    :class:`SpeculativeConfigError`."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if not isinstance(value, str):
        raise SpeculativeConfigError("config", value, "must be 'ngram[:k]', "
                                     "'draft:PATH[:k]' or a SpeculativeConfig")
    text = value.strip()
    if text in ("", "off", "none"):
        return None
    if text.startswith("draft:"):
        return _parse_draft(text[len("draft:"):])
    method, colon, k = text.partition(":")
    if not colon:
        return SpeculativeConfig(method=method)
    if not k.strip():
        raise SpeculativeConfigError("num_speculative_tokens", k,
                                     "ngram:k needs k after the colon (or write 'ngram')")
    try:
        n = int(k)
    except ValueError:
        raise SpeculativeConfigError("num_speculative_tokens", k,
                                     "must be an integer (ngram:k)") from None
    return SpeculativeConfig(method=method, num_speculative_tokens=n)


def _parse_draft(rest: str) -> SpeculativeConfig:
    """``PATH[:k]`` of ``draft:PATH[:k]``: k is the text after the last colon when it is
    all digits (so Windows drive letters and other colons stay in the path)."""
    path, sep, k = rest.rpartition(":")
    if not sep or not k.strip().isdigit():
        path, k = rest, ""
    if not path:
        raise SpeculativeConfigError("draft_model", None, NEEDS_DRAFT_PATH)
    if not k:
        return SpeculativeConfig(method="draft", draft_model=path)
    return SpeculativeConfig(method="draft", draft_model=path,
                             num_speculative_tokens=int(k))


def draft_config(path, k: int | None = None, speculative=None,
                 random_weights: str | None = None) -> SpeculativeConfig | None:
    """The CLI's ``--draft-model PATH [--num-draft-tokens k]`` as a config (k None: the
    default; ``random_weights``: the dtype of a ``config.json`` draft's random weights,
    seeded 1); ``speculative`` (``--speculative``) must then be unset; without a path,
    ``speculative`` parsed. Raises :class:`SpeculativeConfigError` naming the option."""
    if path is None:
        if k is not None:
            raise SpeculativeConfigError("num_speculative_tokens", k,
                                         "--num-draft-tokens needs --draft-model")
        return parse_speculative(speculative)
    if speculative not in (None, "", "off", "none"):
        raise SpeculativeConfigError("method", speculative, "give --speculative or "
                                     "--draft-model, not both")
    kw = dict(method="draft", draft_model=str(path), draft_random_weights=random_weights,
              draft_seed=1)
    return SpeculativeConfig(**kw) if k is None else \
        SpeculativeConfig(**kw, num_speculative_tokens=k)


__all__ = ["MAX_SPECULATIVE_TOKENS", "METHODS", "SpeculativeConfig", "SpeculativeConfigError",
           "draft_config", "parse_speculative"]
