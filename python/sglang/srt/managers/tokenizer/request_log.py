"""`--log-requests`: a line when a request arrives and one when it finishes, at the tokenizer.

`--log-requests-level` (upstream's): 0 metadata (rid, token counts, finish reason); 1 and the
sampling parameters; 2 and the prompt and output (text and ids), each cut to 2048 characters;
3 everything, uncut.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

MAX_LOGGED_CHARS = 2048  # level 2's cut of each prompt / output field


def _cut(value: Any, limit: Optional[int]) -> str:
    text = repr(value)
    if limit is not None and len(text) > limit:
        return text[:limit] + f"... ({len(text) - limit} more characters)"
    return text


class RequestLogger:
    """Logs requests at `level` (0-3, see the module docstring)."""

    def __init__(self, level: int):
        self.level = level
        self.limit = MAX_LOGGED_CHARS if level == 2 else None

    @classmethod
    def of(cls, server_args: Any) -> Optional["RequestLogger"]:
        return cls(server_args.log_requests_level) if server_args.log_requests else None

    def received(self, req: Any) -> None:
        """A prepared request (`tokenizer_input.PreparedReq`) sent to the scheduler."""
        parts = [f"rid={req.rid!r}", f"prompt_tokens={len(req.input_ids)}", f"stream={req.stream}"]
        if self.level >= 1:
            parts.append(f"sampling_params={req.sampling_params.to_dict()}")
        if self.level >= 2:
            parts.append(f"text={_cut(req.input_text, self.limit)}")
            parts.append(f"input_ids={_cut(req.input_ids, self.limit)}")
        logger.info("Receive: %s", ", ".join(parts))

    def finished(self, rid: str, out: dict) -> None:
        """A finished request's SGLang output dict."""
        meta = out.get("meta_info", {})
        keys = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason")
        parts = [f"rid={rid!r}", *(f"{k}={meta[k]!r}" for k in keys if k in meta)]
        if self.level >= 2:
            parts.append(f"text={_cut(out.get('text'), self.limit)}")
            parts.append(f"output_ids={_cut(out.get('output_ids'), self.limit)}")
        logger.info("Finish: %s", ", ".join(parts))
