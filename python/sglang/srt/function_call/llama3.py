"""`llama3`: Llama 3.1 / 3.2 JSON tool calls, the output a JSON object per call (separated by `;`),
optionally after `<|python_tag|>`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
    {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}
"""

from __future__ import annotations

from sglang.srt.function_call.core import PartialCall, ToolCallDetector, held_back, object_sequence
from sglang.srt.function_call.json_scan import skip_ws


class Llama3Detector(ToolCallDetector):
    name = "llama3"
    start_marker = "<|python_tag|>"

    def section_start(self, text: str) -> int:
        tag = text.find(self.start_marker)
        if tag >= 0:
            return tag
        i = skip_ws(text, 0)
        # a bare JSON call: the output starts with an object whose first key is "name"
        if text[i : i + 1] == "{" and text[skip_ws(text, i + 1) :].startswith('"name"'):
            return i
        return -1

    def hold_back(self, text: str) -> int:
        i = skip_ws(text, 0)
        rest = text[i:]
        if rest == "" or (rest.startswith("{") and '"name"'.startswith(rest[1:].lstrip()[:6])):
            return len(text)  # the output may still open with a bare JSON call
        return held_back(text, self.start_marker)

    def partial_calls(self, section: str) -> list[PartialCall]:
        i = len(self.start_marker) if section.startswith(self.start_marker) else 0
        return object_sequence(section, i, ";,", ("parameters", "arguments"))
