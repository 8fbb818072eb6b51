"""`tool_choice` `required` or a named function, enforced by a constraint: the JSON schema of the
array of calls the model may write (upstream's shape: each call `{"name", "parameters"}`), put into
the request's sampling params as `json_schema` for the grammar backend. `JsonArrayDetector` parses
what the model writes under it."""

from __future__ import annotations

import json
from typing import Any, Optional, Union


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [function["name"]]}, "parameters": parameters},
        "required": ["name", "parameters"],
    }


def tool_call_schema(
    tools: list[dict[str, Any]], tool_choice: Union[str, dict[str, Any]], parallel_tool_calls: Optional[bool]
) -> dict[str, Any]:
    """The JSON schema of the calls `tool_choice` allows: one or more calls to any tool ("required"),
    or exactly one call to the named function; at most one call when `parallel_tool_calls` is false."""
    functions = [tool["function"] for tool in tools]
    if isinstance(tool_choice, dict):
        wanted = tool_choice["function"]["name"]
        functions = [f for f in functions if f["name"] == wanted]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": 1}
    else:
        schema = {"type": "array", "minItems": 1}
        if parallel_tool_calls is False:
            schema["maxItems"] = 1
    calls = [_call_schema(f) for f in functions]
    schema["items"] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return schema


def tool_call_json_schema(
    tools: list[dict[str, Any]], tool_choice: Union[str, dict[str, Any]], parallel_tool_calls: Optional[bool]
) -> str:
    """`tool_call_schema` as the JSON text the `json_schema` sampling param carries."""
    return json.dumps(tool_call_schema(tools, tool_choice, parallel_tool_calls))
