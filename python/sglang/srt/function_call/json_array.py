"""The output of a request whose `tool_choice` is `required` or a named function: the constraint
(`constraint.tool_call_schema`) makes the model write a JSON array of calls,

    [{"name": "get_weather", "parameters": {"city": "Paris"}}]

whatever the model's own tool-call format. Not a `--tool-call-parser` choice: the server picks it
for those requests.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.function_call.core import PartialCall, ToolCallDetector
from sglang.srt.function_call.json_scan import skip_ws, value_end
from sglang.srt.function_call.mistral import array_calls


class JsonArrayDetector(ToolCallDetector):
    name = "json_array"
    start_marker = "["

    def partial_calls(self, section: str) -> list[PartialCall]:
        return array_calls(section, 0, ("parameters", "arguments"))

    def section_end(self, section: str) -> Optional[int]:
        return value_end(section, skip_ws(section, 0))
