"""`mistral`: Mistral's tool calls after `[TOOL_CALLS]`, in either of its forms: a JSON array of
calls (Mistral / Mixtral instruct, v3 tokenizers),

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

or, with the newer tokenizers (v11+: Mistral Small 3.2, Magistral, Devstral), one call per
`[TOOL_CALLS]`, the name and then the arguments after `[ARGS]` (a `[CALL_ID]` between them is skipped):

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.function_call.core import PartialCall, ToolCallDetector, object_sequence
from sglang.srt.function_call.json_scan import skip_ws, value_end

ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


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

    def _body(self, section: str) -> tuple[str, int]:
        """("array" / "named" / "" while undecided, where the body starts) of a section."""
        i = skip_ws(section, len(self.start_marker))
        if i >= len(section):
            return "", i
        return ("array" if section[i] == "[" else "named"), i

    def _named(self, section: str, i: int) -> tuple[PartialCall, Optional[int]]:
        """`name[ARGS]{...}` at `section[i]`: (the call so far, end of its arguments or None)."""
        args = section.find(ARGS, i)
        if args < 0:
            return PartialCall(None), None
        name = section[i:args].split(CALL_ID, 1)[0].strip()
        j = skip_ws(section, args + len(ARGS))
        end = value_end(section, j) if j < len(section) else None
        if end is None:
            return PartialCall(name, section[j:]), None
        return PartialCall(name, section[j:end], complete=True), end

    def partial_calls(self, section: str) -> list[PartialCall]:
        kind, i = self._body(section)
        if kind == "array":
            return array_calls(section, i)
        if kind == "named":
            return [self._named(section, i)[0]]
        return []

    def section_end(self, section: str) -> Optional[int]:
        kind, i = self._body(section)
        if kind == "array":
            return value_end(section, i)
        if kind == "named":
            return self._named(section, i)[1]
        return None
