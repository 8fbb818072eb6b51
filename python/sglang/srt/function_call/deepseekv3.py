"""`deepseekv3` (DeepSeek-V3 / R1) and `deepseekv31` (DeepSeek-V3.1): calls between DeepSeek's
special tokens. V3 writes the type, the name and a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 writes the name and the JSON directly:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.function_call.core import PartialCall, ToolCallDetector
from sglang.srt.function_call.json_scan import skip_ws, value_end

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
FENCE = "```json"


class DeepSeekV31Detector(ToolCallDetector):
    name = "deepseekv31"
    start_marker = CALLS_BEGIN

    def _name_and_json_start(self, section: str, begin: int) -> tuple[Optional[str], int]:
        """The call's name (None while incomplete) and where its JSON arguments start."""
        sep = section.find(SEP, begin)
        if sep < 0:
            return None, len(section)
        return section[begin:sep].strip(), sep + len(SEP)

    def section_end(self, section: str) -> Optional[int]:
        end = section.find(CALLS_END)
        return end + len(CALLS_END) if end >= 0 else None

    def partial_calls(self, section: str) -> list[PartialCall]:
        calls = []
        pos = 0
        while True:
            begin = section.find(CALL_BEGIN, pos)
            if begin < 0:
                return calls
            name, j = self._name_and_json_start(section, begin + len(CALL_BEGIN))
            if name is None:
                calls.append(PartialCall(None))
                return calls
            j = skip_ws(section, j)
            end = value_end(section, j) if j < len(section) else None
            if end is None:
                calls.append(PartialCall(name, section[j:]))
                return calls
            calls.append(PartialCall(name, section[j:end], complete=True))
            pos = end


class DeepSeekV3Detector(DeepSeekV31Detector):
    name = "deepseekv3"

    def _name_and_json_start(self, section: str, begin: int) -> tuple[Optional[str], int]:
        sep = section.find(SEP, begin)
        newline = section.find("\n", sep + len(SEP)) if sep >= 0 else -1
        if newline < 0:
            return None, len(section)
        name = section[sep + len(SEP) : newline].strip()
        fence = section.find(FENCE, newline)
        if fence < 0 or section[newline:fence].strip():
            # no fence (yet): the JSON starts after the name's line once the fence is written
            if len(section) - newline <= len(FENCE) + 1:
                return name, len(section) + 1  # hold the arguments until the fence is complete
            return name, newline + 1
        return name, fence + len(FENCE)
