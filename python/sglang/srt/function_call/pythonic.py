"""`pythonic`: calls as a Python list of function calls with keyword arguments (Llama 3.2 / 4
pythonic prompts), optionally between `<|python_start|>` and `<|python_end|>`:

    [get_weather(city="Paris", unit="celsius"), get_time(zone="CET")]

Arguments are Python literals (strings, numbers, True / False / None, lists, dicts), turned into
JSON. A call streams once its closing parenthesis is written (name, then all its arguments).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Optional

from sglang.srt.function_call.core import PartialCall, ToolCallDetector, held_back, text_after_calls

_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAYBE_START = re.compile(r"\[\s*([A-Za-z_][\w.]*\s*)?$")
_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"


def _call_end(text: str, i: int) -> Optional[int]:
    """End (exclusive) of the parenthesised argument list opening at `text[i]` (`(`); None if open."""
    depth = 0
    quote = None
    j = i
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _arguments_json(call_text: str) -> Optional[str]:
    """JSON of a call's keyword arguments (`name(a=1, b="x")`), None if it is not such a call."""
    try:
        node = ast.parse(call_text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            return None
        return json.dumps({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}, ensure_ascii=False)
    except (SyntaxError, ValueError, TypeError):
        return None


class PythonicDetector(ToolCallDetector):
    name = "pythonic"
    start_marker = "["

    def section_start(self, text: str) -> int:
        match = _LIST_START.search(text)
        if match is None:
            return -1
        tag = text.rfind(PYTHON_START, 0, match.start())
        if tag >= 0 and not text[tag + len(PYTHON_START) : match.start()].strip():
            return tag
        return match.start()

    def hold_back(self, text: str) -> int:
        bracket = text.rfind("[")
        cut = bracket if bracket >= 0 and _MAYBE_START.match(text, bracket) else len(text)
        tag = text.rfind(PYTHON_START, 0, cut)
        if tag >= 0 and not text[tag + len(PYTHON_START) : cut].strip():
            cut = tag
        elif cut == len(text):
            cut -= held_back(text, PYTHON_START)
        return len(text) - cut

    def _calls(self, section: str):
        """(PartialCall, end) of each call of the list opening at `section[0]`."""
        i = section.find("[") + 1
        while True:
            match = _NAME.match(section, i)
            if match is None:
                return
            paren = match.end() - 1
            end = _call_end(section, paren)
            if end is None:
                yield PartialCall(match.group(1)), None
                return
            arguments = _arguments_json(section[match.start() : end])
            if arguments is None:
                return
            yield PartialCall(match.group(1), arguments, complete=True), end
            i = end
            while i < len(section) and section[i] in " \t\r\n,":
                i += 1

    def partial_calls(self, section: str) -> list[PartialCall]:
        return [call for call, _ in self._calls(section)]

    def section_end(self, section: str) -> Optional[int]:
        """After the list's `]` (and a `<|python_end|>` right after it); None while open."""
        last = None
        for _call, end in self._calls(section):
            if end is None:
                return None
            last = end
        if last is None:
            return None
        i = last
        while i < len(section) and section[i] in " \t\r\n,":
            i += 1
        if section[i : i + 1] != "]":
            return None
        rest = section[i + 1 :]
        if rest.startswith(PYTHON_END):
            return i + 1 + len(PYTHON_END)
        return None if PYTHON_END.startswith(rest) else i + 1  # the end marker may still come

    def trailing_text(self, section: str) -> str:
        rest = text_after_calls(section, self._calls(section))
        bracket = rest.find("]")
        rest = rest[bracket + 1 :] if bracket >= 0 and not rest[:bracket].strip() else rest
        rest = rest.replace(PYTHON_END, "")
        return rest if rest.strip() else ""
