"""The base of every tool-call detector: one model family's tool-call format, parsed whole
(`detect_and_parse`) or as the output streams in (`parse_streaming_increment`).

A detector says where its tool-call section starts (`section_start`) and which calls a section
holds so far (`partial_calls`: each call's name once complete and its arguments' JSON text as far
as it goes), and where a section closes (`section_end`; text after it is normal text again, so
text between and after calls reaches the content, streamed or not). The base class turns that into results: text before the section is normal text
(content), complete calls whose name is one of the request's tools become `ToolCallItem`s. While
streaming, normal text goes out at once (a suffix that may begin the section marker is held back),
a call's name goes out once complete and its arguments as fragments that extend each other.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from sglang.srt.function_call.json_scan import object_members, skip_ws

logger = logging.getLogger(__name__)


@dataclass
class ToolCallItem:
    """One call, or one streamed piece of a call: `name` set on the first piece (arguments "") and
    None on the argument fragments that follow. `tool_index`: the call's position in the output."""

    tool_index: int
    name: Optional[str] = None
    parameters: str = ""

    def model_dump(self) -> dict[str, Any]:  # upstream's /parse_function_call shape
        return {"tool_index": self.tool_index, "name": self.name, "parameters": self.parameters}


@dataclass
class ParseResult:
    normal_text: str = ""
    calls: list[ToolCallItem] = field(default_factory=list)


@dataclass
class PartialCall:
    """A call as far as the output goes: `name` once complete, `arguments` the JSON text so far
    (only ever extended as the output grows), `complete` once the arguments are whole."""

    name: Optional[str]
    arguments: str = ""
    complete: bool = False


def tool_names(tools: Optional[list[dict[str, Any]]]) -> set[str]:
    """The function names of OpenAI-shaped tools (`{"type": "function", "function": {"name": ...}}`)."""
    names = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def normalized_arguments(arguments: str) -> Optional[str]:
    """Compact JSON of a call's arguments (an object; empty text means none), None if not an object."""
    if not arguments.strip():
        return "{}"
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


class ToolCallDetector(ABC):
    """One model family's tool-call format (see the module docstring). A detector instance holds the
    streaming state of one output; `detect_and_parse` keeps no state."""

    name: ClassVar[str]
    start_marker: ClassVar[str]  # the text that opens the tool-call section

    def __init__(self) -> None:
        self._buffer = ""
        self._in_section = False
        self._closed = False  # a section closed and no normal text followed yet
        self._base = 0  # calls streamed by the sections before the current one
        self._sent: list[tuple[str, int]] = []  # per streamed call: (name, argument characters sent)

    # ------------------------------------------------------------------ what a format defines
    def section_start(self, text: str) -> int:
        """Index where the tool-call section begins in `text`, -1 if it has not begun."""
        return text.find(self.start_marker)

    def hold_back(self, text: str) -> int:
        """How many trailing characters of `text` (no section yet) may still begin one."""
        return held_back(text, self.start_marker)

    def section_end(self, section: str) -> Optional[int]:
        """Where the section (`section` starts at its start) closes once it has, after which the
        output is normal text again (or another section); None while open, or for a format whose
        calls run to the end of the output."""
        return None

    @abstractmethod
    def partial_calls(self, section: str) -> list[PartialCall]:
        """The calls in `section` (text from the section start on), the last one possibly incomplete."""

    def trailing_text(self, section: str) -> str:
        """Normal text after the section's last call (non-streaming only); none by default."""
        return ""

    # ------------------------------------------------------------------ parsing
    def has_tool_call(self, text: str) -> bool:
        return self.section_start(text) >= 0

    def detect_and_parse(self, text: str, tools: Optional[list[dict[str, Any]]]) -> ParseResult:
        """The complete calls of a finished output and the normal text around them. Calls to a
        function that is not among `tools` are dropped; without any valid call the text is all normal."""
        names = tool_names(tools)
        normal, calls, rest, closed = [], [], text, False
        while True:
            start = self.section_start(rest)
            if start < 0:
                normal.append(_after_section(rest, closed))
                break
            normal.append(_after_section(rest[:start], closed))
            section = rest[start:]
            end = self.section_end(section)
            for call in self.partial_calls(section if end is None else section[:end]):
                self._keep_complete(call, names, calls)
            if end is None:
                normal.append(self.trailing_text(section))
                break
            rest, closed = section[end:], True
        if not calls:
            return ParseResult(normal_text=text)
        return ParseResult(normal_text="".join(normal), calls=calls)

    @staticmethod
    def _keep_complete(call: PartialCall, names: set[str], calls: list[ToolCallItem]) -> None:
        if not call.complete or call.name is None:
            return
        arguments = normalized_arguments(call.arguments)
        if call.name not in names or arguments is None:
            logger.warning("dropped a tool call to %r (not a tool, or arguments not an object)", call.name)
            return
        calls.append(ToolCallItem(len(calls), call.name, arguments))

    def parse_streaming_increment(self, new_text: str, tools: Optional[list[dict[str, Any]]]) -> ParseResult:
        """Feed the next piece of the output: the normal text and call pieces it completes. Text
        after a closed section (between calls, or after the last) is normal text again, unless it
        is blank up to the next section or the end."""
        self._buffer += new_text
        names = tool_names(tools)
        normal, calls = "", []
        while True:
            if not self._in_section:
                start = self.section_start(self._buffer)
                if start < 0:
                    keep = self.hold_back(self._buffer)
                    cut = len(self._buffer) - keep
                    if self._closed and not self._buffer[:cut].strip():
                        return ParseResult(normal_text=normal, calls=calls)  # blank so far: held
                    normal += self._buffer[:cut]
                    self._buffer, self._closed = self._buffer[cut:], False
                    return ParseResult(normal_text=normal, calls=calls)
                normal += _after_section(self._buffer[:start], self._closed)
                self._buffer, self._in_section = self._buffer[start:], True
            end = self.section_end(self._buffer)
            calls += self._new_pieces(names, self._buffer if end is None else self._buffer[:end])
            if end is None:
                return ParseResult(normal_text=normal, calls=calls)
            # the section is closed: its calls are final, what follows is parsed afresh
            self._base = len(self._sent)
            self._buffer, self._in_section, self._closed = self._buffer[end:], False, True

    def flush(self) -> str:
        """At the end of the output: the normal text still held back (none inside an open section,
        none when blank after a closed one)."""
        text = "" if self._in_section else _after_section(self._buffer, self._closed)
        self._buffer = ""
        return text

    @property
    def streamed_calls(self) -> int:
        return len(self._sent)

    def _new_pieces(self, names: set[str], section: str) -> list[ToolCallItem]:
        pieces = []
        streamed = self._base  # index among the calls this output streams
        for call in self.partial_calls(section):
            if call.name is None:
                break
            if call.name not in names:  # not a tool of the request: not streamed
                continue
            if streamed == len(self._sent):
                self._sent.append((call.name, 0))
                pieces.append(ToolCallItem(streamed, call.name, ""))
            name, sent = self._sent[streamed]
            if len(call.arguments) > sent:
                pieces.append(ToolCallItem(streamed, None, call.arguments[sent:]))
                self._sent[streamed] = (name, len(call.arguments))
            streamed += 1
        return pieces


def _after_section(text: str, closed: bool) -> str:
    """Normal text; after a closed section, blank text (the space between calls) is none."""
    return "" if closed and not text.strip() else text


def object_call(text: str, i: int, arg_keys: tuple[str, ...] = ("arguments", "parameters")):
    """The call written as a JSON object at `text[i]` (`{"name": ..., "arguments": {...}}`):
    (PartialCall, end of the object or None while open), or None if `text[i]` does not start one."""
    scan = object_members(text, i)
    if scan is None:
        return None
    name_member = scan.members.get("name")
    name = None
    if name_member is not None and name_member.end is not None:
        value = name_member.loads(text)
        name = value if isinstance(value, str) else None
    arg_member = next((scan.members[k] for k in arg_keys if k in scan.members), None)
    arguments = arg_member.raw(text) if arg_member is not None else ""
    complete = scan.end is not None
    if complete and arg_member is None:
        arguments = "{}"
    return PartialCall(name, arguments, complete), scan.end


def object_sequence(
    text: str, i: int, separators: str, arg_keys: tuple[str, ...] = ("arguments", "parameters")
) -> list[PartialCall]:
    """The calls of JSON call objects from `text[i]` on, separated by one of `separators`."""
    calls: list[PartialCall] = []
    while True:
        found = object_call(text, skip_ws(text, i), arg_keys)
        if found is None:
            return calls
        call, end = found
        calls.append(call)
        if end is None:
            return calls
        i = skip_ws(text, end)
        if text[i : i + 1] == "" or text[i] not in separators:
            return calls
        i += 1


def text_after_calls(section: str, spans) -> str:
    """The text after the last complete call of `spans` ((call, end or None) pairs); "" if blank."""
    last = 0
    for _call, end in spans:
        last = end if end is not None else last
    rest = section[last:]
    return rest if rest.strip() else ""
