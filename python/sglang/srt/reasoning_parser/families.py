"""One reasoning detector per model family (`--reasoning-parser` names, upstream's)."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.reasoning_parser.core import ReasoningDetector


class DeepSeekR1Detector(ReasoningDetector):
    """DeepSeek-R1: the template opens `<think>`, so the output starts in the reasoning (the model
    may repeat the opening marker)."""

    name = "deepseek-r1"
    starts_in_reasoning = True


class Qwen3Detector(ReasoningDetector):
    """Qwen3 (hybrid): the model writes `<think>...</think>` itself; `enable_thinking: false` in
    `chat_template_kwargs` makes the template close an empty section: no reasoning expected."""

    name = "qwen3"

    @classmethod
    def reasons(cls, chat_template_kwargs: Optional[dict[str, Any]]) -> bool:
        return (chat_template_kwargs or {}).get("enable_thinking") is not False


class Qwen3ThinkingDetector(ReasoningDetector):
    """Qwen3-Thinking (2507): always reasons; the template opens `<think>`."""

    name = "qwen3-thinking"
    starts_in_reasoning = True


class DeepSeekV3Detector(ReasoningDetector):
    """DeepSeek-V3.1 / V3.2: reasons only when `chat_template_kwargs.thinking` is true; the
    template then opens `<think>`, so the output starts in the reasoning."""

    name = "deepseek-v3"
    starts_in_reasoning = True

    @classmethod
    def reasons(cls, chat_template_kwargs: Optional[dict[str, Any]]) -> bool:
        return (chat_template_kwargs or {}).get("thinking") is True
