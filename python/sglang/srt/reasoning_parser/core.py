"""The base of every reasoning detector: a model family's reasoning section (`<think>...</think>`)
split from the answer, whole (`detect_and_parse`) or as the output streams in.

A family says its markers, whether its output starts inside the reasoning (the chat template
already wrote the opening marker: DeepSeek-R1, Qwen3-Thinking) and whether a request reasons at all
(`reasons`: Qwen3's `enable_thinking`, DeepSeek-V3.1's `thinking` chat-template switches). A
reasoning section that never ends (the output was cut) is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

START, REASONING, NORMAL = "start", "reasoning", "normal"


@dataclass
class ReasoningResult:
    reasoning_text: str = ""
    normal_text: str = ""


def _held_back(text: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ReasoningDetector:
    """One family's reasoning format; an instance holds one output's streaming state.
    `stream_reasoning` False: the reasoning goes out in one piece once the section ends."""

    name: ClassVar[str]
    think_start: ClassVar[str] = "<think>"
    think_end: ClassVar[str] = "</think>"
    starts_in_reasoning: ClassVar[bool] = False

    def __init__(self, stream_reasoning: bool = True):
        self.stream_reasoning = stream_reasoning
        self._state = START
        self._buffer = ""
        self._pending = ""  # reasoning held while stream_reasoning is off
        self._after_end = False  # whitespace right after the end marker is dropped

    @classmethod
    def reasons(cls, chat_template_kwargs: Optional[dict[str, Any]]) -> bool:
        """Whether a request with these chat-template kwargs has a reasoning section (default yes)."""
        return True

    # ------------------------------------------------------------------ parsing
    def detect_and_parse(self, text: str) -> ReasoningResult:
        """(reasoning, answer) of a finished output, each stripped of surrounding whitespace."""
        detector = type(self)(stream_reasoning=True)
        first = detector.parse_streaming_increment(text)
        last = detector.flush()
        return ReasoningResult(
            (first.reasoning_text + last.reasoning_text).strip(),
            (first.normal_text + last.normal_text).strip(),
        )

    def parse_streaming_increment(self, new_text: str) -> ReasoningResult:
        self._buffer += new_text
        out = ReasoningResult()
        while self._buffer:
            if self._state == START and not self._open():
                break
            if self._state == REASONING and not self._reason(out):
                break
            if self._state == NORMAL:
                self._answer(out)
                break
        return self._release(out)

    def flush(self) -> ReasoningResult:
        """At the end of the output: what is still held back."""
        out = ReasoningResult()
        if self._state == NORMAL or (self._state == START and not self.starts_in_reasoning):
            out.normal_text = self._buffer
        else:
            out.reasoning_text = self._buffer
        self._buffer = ""
        out.reasoning_text = self._pending + out.reasoning_text
        self._pending = ""
        return out

    # ------------------------------------------------------------------ the states
    def _open(self) -> bool:
        """START: an opening marker (leading whitespace allowed) enters the reasoning; False while
        the text may still become one."""
        stripped = self._buffer.lstrip()
        if stripped.startswith(self.think_start):
            self._buffer = stripped[len(self.think_start) :]
            self._state = REASONING
            return True
        if self.think_start.startswith(stripped):
            return False
        self._state = REASONING if self.starts_in_reasoning else NORMAL
        return True

    def _reason(self, out: ReasoningResult) -> bool:
        end = self._buffer.find(self.think_end)
        if end >= 0:
            out.reasoning_text += self._buffer[:end]
            self._buffer = self._buffer[end + len(self.think_end) :]
            self._state = NORMAL
            self._after_end = True
            return True
        cut = len(self._buffer) - _held_back(self._buffer, self.think_end)
        out.reasoning_text += self._buffer[:cut]
        self._buffer = self._buffer[cut:]
        return False

    def _answer(self, out: ReasoningResult) -> None:
        if self._after_end:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return
            self._after_end = False
        out.normal_text += self._buffer
        self._buffer = ""

    def _release(self, out: ReasoningResult) -> ReasoningResult:
        if self.stream_reasoning:
            return out
        self._pending += out.reasoning_text
        out.reasoning_text = ""
        if self._state == NORMAL and self._pending:
            out.reasoning_text, self._pending = self._pending, ""
        return out
