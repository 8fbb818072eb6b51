"""`qwen25`: Hermes-style calls, one JSON object per `<tool_call>` block (Qwen2.5, Qwen3, Hermes):

<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.function_call.core import PartialCall, ToolCallDetector, object_call, text_after_calls
from sglang.srt.function_call.json_scan import skip_ws


class Qwen25Detector(ToolCallDetector):
    name = "qwen25"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"

    def _blocks(self, section: str):
        """(PartialCall, end of its block or None) for each `<tool_call>` block of the section."""
        pos = 0
        while True:
            start = section.find(self.start_marker, pos)
            if start < 0:
                return
            i = skip_ws(section, start + len(self.start_marker))
            found = object_call(section, i)
            if found is None:
                return
            call, end = found
            if end is None:
                yield call, None
                return
            close = section.find(self.end_marker, end)
            pos = close + len(self.end_marker) if close >= 0 else end
            yield call, pos

    def partial_calls(self, section: str) -> list[PartialCall]:
        return [call for call, _ in self._blocks(section)]

    def section_end(self, section: str) -> Optional[int]:
        """After the first block's `</tool_call>` (each block is a section of its own)."""
        found = object_call(section, skip_ws(section, len(self.start_marker)))
        if found is None or found[1] is None:
            return None
        close = section.find(self.end_marker, found[1])
        return close + len(self.end_marker) if close >= 0 else None

    def trailing_text(self, section: str) -> str:
        return text_after_calls(section, self._blocks(section))
