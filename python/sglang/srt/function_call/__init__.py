"""Tool-call detectors (`--tool-call-parser`), one model family's format per module behind
`core.ToolCallDetector`; `TOOL_CALL_PARSERS` maps upstream's parser names to them."""

from __future__ import annotations

from sglang.srt.function_call.core import ParseResult, PartialCall, ToolCallDetector, ToolCallItem
from sglang.srt.function_call.deepseekv3 import DeepSeekV3Detector, DeepSeekV31Detector
from sglang.srt.function_call.json_array import JsonArrayDetector
from sglang.srt.function_call.llama3 import Llama3Detector
from sglang.srt.function_call.mistral import MistralDetector
from sglang.srt.function_call.pythonic import PythonicDetector
from sglang.srt.function_call.qwen25 import Qwen25Detector

TOOL_CALL_PARSERS: dict[str, type[ToolCallDetector]] = {
    cls.name: cls
    for cls in (
        Qwen25Detector,
        Llama3Detector,
        MistralDetector,
        DeepSeekV3Detector,
        DeepSeekV31Detector,
        PythonicDetector,
    )
}


def tool_call_parser_names() -> list[str]:
    return sorted(TOOL_CALL_PARSERS)


def make_detector(name: str) -> ToolCallDetector:
    """A fresh detector (its own streaming state) for `--tool-call-parser` `name`."""
    try:
        return TOOL_CALL_PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose one of {tool_call_parser_names()}"
        ) from None


__all__ = [
    "TOOL_CALL_PARSERS",
    "JsonArrayDetector",
    "ParseResult",
    "PartialCall",
    "ToolCallDetector",
    "ToolCallItem",
    "make_detector",
    "tool_call_parser_names",
]
