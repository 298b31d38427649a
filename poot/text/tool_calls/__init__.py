"""Tool calls and reasoning in a model's text output: the call formats of the model
families (:mod:`~poot.text.tool_calls.formats`), their parsers for whole and streamed text
(:mod:`~poot.text.tool_calls.stream`), and the grammars that constrain a call. Pure text: no
engine, no server."""

from poot.text.tool_calls.formats import (FORMATS, PartialCall, Scan, ToolCall, ToolFormat,
                                          call_schema, detect_format, new_call_id)
from poot.text.tool_calls.stream import (Delta, OutputParser, Parsed, StreamParser,
                                         ToolCallDelta, prompt_opens_thought, split_reasoning)


#: reasoning parser names: ``auto`` (from the chat template), ``none``, or one that splits
#: ``<think>`` blocks (vLLM's names for it)
REASONING_PARSERS = ("auto", "none", "think", "deepseek_r1", "qwen3")


def detect_reasoning(template: str | None) -> bool:
    """The chat template is a thinking model's (it writes or strips ``<think>`` blocks:
    Qwen 3, DeepSeek-R1)."""
    return bool(template) and ("<think>" in template or "</think>" in template)


__all__ = ["Delta", "FORMATS", "OutputParser", "REASONING_PARSERS", "Parsed", "PartialCall", "Scan",
           "StreamParser", "ToolCall", "ToolCallDelta", "ToolFormat", "call_schema",
           "detect_format", "detect_reasoning", "new_call_id", "prompt_opens_thought",
           "split_reasoning"]
