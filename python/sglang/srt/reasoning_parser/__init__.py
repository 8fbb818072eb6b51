"""Reasoning detectors (`--reasoning-parser`): one class per model family behind
`core.ReasoningDetector`; `REASONING_PARSERS` maps upstream's names to them."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.reasoning_parser.core import ReasoningDetector, ReasoningResult
from sglang.srt.reasoning_parser.families import (
    DeepSeekR1Detector,
    DeepSeekV3Detector,
    Qwen3Detector,
    Qwen3ThinkingDetector,
)

REASONING_PARSERS: dict[str, type[ReasoningDetector]] = {
    cls.name: cls for cls in (DeepSeekR1Detector, DeepSeekV3Detector, Qwen3Detector, Qwen3ThinkingDetector)
}


def reasoning_parser_names() -> list[str]:
    return sorted(REASONING_PARSERS)


def reasoning_detector_class(name: str) -> type[ReasoningDetector]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {reasoning_parser_names()}"
        ) from None


def make_reasoning_detector(
    name: str, stream_reasoning: bool = True, chat_template_kwargs: Optional[dict[str, Any]] = None
) -> Optional[ReasoningDetector]:
    """A fresh detector for one output, or None when the request does not reason (its switches)."""
    cls = reasoning_detector_class(name)
    return cls(stream_reasoning) if cls.reasons(chat_template_kwargs) else None


__all__ = [
    "REASONING_PARSERS",
    "ReasoningDetector",
    "ReasoningResult",
    "make_reasoning_detector",
    "reasoning_detector_class",
    "reasoning_parser_names",
]
