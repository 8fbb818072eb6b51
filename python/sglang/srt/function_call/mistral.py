"""`mistral`: a JSON array of calls after `[TOOL_CALLS]` (Mistral / Mixtral instruct):

[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]
"""

from __future__ import annotations

from sglang.srt.function_call.core import PartialCall, ToolCallDetector, object_sequence
from sglang.srt.function_call.json_scan import skip_ws


def array_calls(
    text: str, i: int, arg_keys: tuple[str, ...] = ("arguments", "parameters")
) -> list[PartialCall]:
    """The calls of a JSON array of call objects starting at `text[i]` (`[`), as far as it goes."""
    i = skip_ws(text, i)
    if text[i : i + 1] != "[":
        return []
    return object_sequence(text, i + 1, ",", arg_keys)


class MistralDetector(ToolCallDetector):
    name = "mistral"
    start_marker = "[TOOL_CALLS]"

    def partial_calls(self, section: str) -> list[PartialCall]:
        return array_calls(section, len(self.start_marker))
