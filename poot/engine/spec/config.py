"""The speculative-decoding settings (:class:`SpeculativeConfig`) and their typed errors.

``poot generate/serve/bench --speculative ngram[:k]`` and ``poot.LLM(...,
speculative="ngram:4")`` go through :func:`parse_speculative`; a bad value raises
:class:`SpeculativeConfigError` naming the field, before any step compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.errors import PootError

#: The most tokens one sequence may propose per step (a verify step has 1 + k rows each).
MAX_SPECULATIVE_TOKENS = 15

#: Proposers this engine has (a draft model, EAGLE or MTP heads would be further methods:
#: docs/speculative.md).
METHODS = ("ngram",)


class SpeculativeConfigError(PootError, ValueError):
    """A speculative-decoding setting is invalid. Attributes: field, value."""

    def __init__(self, field: str, value, why: str):
        self.field, self.value = field, value
        super().__init__(f"speculative {field} {value!r}: {why}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How a sequence proposes tokens for the target to verify.

    Attributes:
        method: ``"ngram"``: prompt lookup (:mod:`poot.engine.spec.ngram`).
        num_speculative_tokens: k, the most tokens proposed per sequence and step
            (1..:data:`MAX_SPECULATIVE_TOKENS`).
        prompt_lookup_min, prompt_lookup_max: the n-gram lengths matched, longest first
            (vLLM's names), 1 <= min <= max <= 16.
        adaptive: choose k per sequence from its recent acceptance and switch speculation
            off where it costs more than it saves (:mod:`poot.engine.spec.adaptive`);
            False: always propose up to k tokens.
        row_cost: the cost-model prior of one extra token row of a step, as a fraction of a
            one-row decode step, used until the engine has timed the steps (0 < x <= 1).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    adaptive: bool = True
    row_cost: float = 0.25

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


def _int_in(field: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpeculativeConfigError(field, value, f"must be an integer in [{lo}, {hi}]")


def parse_speculative(value) -> SpeculativeConfig | None:
    """A :class:`SpeculativeConfig` from ``value``: None or ``""``/``"off"`` (none), a
    config (as is), or text ``METHOD[:k]`` (``"ngram"``, ``"ngram:6"``). Raises
    :class:`SpeculativeConfigError`."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if not isinstance(value, str):
        raise SpeculativeConfigError("config", value, "must be 'ngram[:k]' or a "
                                     "SpeculativeConfig")
    text = value.strip()
    if text in ("", "off", "none"):
        return None
    method, _, k = text.partition(":")
    if not k:
        return SpeculativeConfig(method=method)
    try:
        n = int(k)
    except ValueError:
        raise SpeculativeConfigError("num_speculative_tokens", k,
                                     "must be an integer (ngram:k)") from None
    return SpeculativeConfig(method=method, num_speculative_tokens=n)


__all__ = ["MAX_SPECULATIVE_TOKENS", "METHODS", "SpeculativeConfig", "SpeculativeConfigError",
           "parse_speculative"]
