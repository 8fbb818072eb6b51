"""Scanning JSON that may still be growing (a model's output, token by token).

`value_end(text, i)` says where the JSON value starting at `text[i]` ends, or None while it is
incomplete; `object_members(text, i)` lists the top-level members of an object that may be
incomplete, each with where its value starts and (once complete) ends. The detectors use them to
find a call's name as soon as it is complete and to stream its arguments as the raw JSON text
grows (every fragment extends the last, so the fragments reassemble to that text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

_CLOSE = {"{": "}", "[": "]"}
_SCALAR_END = set(",}] \t\r\n")


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def string_end(text: str, i: int) -> Optional[int]:
    """End (exclusive) of the JSON string whose opening quote is at `text[i]`; None if unclosed."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> Optional[int]:
    """End (exclusive) of the JSON value starting at `text[i]`, None while it is incomplete.
    A scalar (number, true, false, null) is complete only once a delimiter follows it."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c not in _CLOSE:
        j = i
        while j < len(text) and text[j] not in _SCALAR_END:
            j += 1
        return j if j < len(text) else None
    stack = [_CLOSE[c]]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == '"':
            end = string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c in "}]":
            stack.pop()
            if not stack:
                return j + 1
        j += 1
    return None


@dataclass
class Member:
    """One top-level member of a (possibly incomplete) JSON object: its value is
    `text[start:end]`, `end` None while the value is incomplete."""

    start: int
    end: Optional[int]

    def raw(self, text: str) -> str:
        return text[self.start : self.end] if self.end is not None else text[self.start :]

    def loads(self, text: str) -> Any:
        """The parsed value (None while incomplete)."""
        return json.loads(text[self.start : self.end]) if self.end is not None else None


@dataclass
class ObjectScan:
    members: dict[str, Member]
    end: Optional[int]  # end (exclusive) of the object, None while it is open


def object_members(text: str, i: int) -> Optional[ObjectScan]:
    """The members of the JSON object starting at `text[i]` (`{`) so far; None if `text[i]` is not `{`
    or the text is not JSON. Keys are listed once complete; a member's value from its first character."""
    if i >= len(text) or text[i] != "{":
        return None
    members: dict[str, Member] = {}
    j = skip_ws(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            return ObjectScan(members, j + 1)
        if text[j] != '"':
            return None
        key_end = string_end(text, j)
        if key_end is None:
            break
        key = json.loads(text[j:key_end])
        j = skip_ws(text, key_end)
        if j >= len(text):
            break
        if text[j] != ":":
            return None
        j = skip_ws(text, j + 1)
        if j >= len(text):
            break
        end = value_end(text, j)
        members[key] = Member(j, end)
        if end is None:
            break
        j = skip_ws(text, end)
        if j < len(text) and text[j] == ",":
            j = skip_ws(text, j + 1)
        elif j < len(text) and text[j] != "}":
            return None
    return ObjectScan(members, None)
