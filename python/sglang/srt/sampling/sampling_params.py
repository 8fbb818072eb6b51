"""Per-request sampling parameters, with SGLang's field names and defaults.

Life cycle of one request's parameters:

1. `SamplingParams.from_dict(d)` turns the user's JSON object into a typed dataclass. Unknown keys
   and wrongly typed values raise `ValueError` naming the field. `None` means "use the default".
2. `verify(vocab_size)` checks value ranges and raises a `ValueError` naming the field.
3. `normalize(tokenizer)` rewrites the parameters into the form the scheduler and sampler use:
   `stop` becomes a list, `stop_token_ids` a list, a temperature below 1e-6 becomes greedy
   (`top_k = 1`, `temperature = 1.0`, as SGLang does), and `stop_str_max_len` is filled in.

Choices that differ between engines, documented here:

- `top_k = 0` is rejected (as SGLang does): use `-1` for "whole vocabulary".
- Greedy is `top_k == 1` (or a temperature below 1e-6 before `normalize`); see `is_greedy`.
- `seed` is also accepted under SGLang's newer name `sampling_seed`.
- Integral floats (`128.0`) are accepted for integer fields; `bool` is never a number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

SAMPLING_EPS = 1e-6  # temperatures below this are greedy
MAX_NEW_TOKENS_LIMIT = 1 << 20
MAX_N = 64
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values

_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
)
# Constrained decoding (constrained/): the output must match one of these; a JSON schema or a
# structural tag may be given as an object (kept as its JSON text).
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# SGLang parameters this engine does not implement: accepted only when None.
_UNSUPPORTED_FIELDS = (
    "custom_params",
    "stream_interval",
)
_ALIASES = {"sampling_seed": "seed"}


@dataclass
class SamplingParams:
    """Sampling parameters of one request (SGLang's native `sampling_params` object)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    # Regular expressions (upstream's `stop_regex`): generation stops when the decoded output
    # matches one; the matched text is trimmed like a stop string. Empty / null: unset.
    stop_regex: Optional[Union[str, list[str]]] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: Optional[int] = None
    # OpenAI style: token id (as a string or int key) -> additive bias in [-100, 100].
    logit_bias: Optional[dict[str, float]] = None
    # Constrained decoding (at most one; constrained/grammar_spec.py checks and compiles them).
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    # Filled in by `normalize`: longest stop string, in tokens (or characters without a tokenizer).
    stop_str_max_len: int = field(default=0, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "SamplingParams":
        """Build from a user's dict; `ValueError` naming the key on an unknown or bad value."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be an object, got {d!r}")
        known = {f.name for f in dataclasses.fields(cls)} - {"stop_str_max_len"}
        kwargs: dict[str, Any] = {}
        for raw_key, value in d.items():
            key = _ALIASES.get(raw_key, raw_key)
            if key in _UNSUPPORTED_FIELDS:
                if value is not None:
                    raise ValueError(f"sampling parameter '{key}' is not supported by this engine")
                continue
            if key not in known:
                raise ValueError(f"unknown sampling parameter '{raw_key}'")
            if value is None:
                continue
            if key in kwargs and kwargs[key] != _coerce(key, value):
                raise ValueError(f"'{raw_key}' conflicts with another spelling of '{key}'")
            kwargs[key] = _coerce(key, value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the user-facing fields (copies lists and dicts)."""
        out = dataclasses.asdict(self)
        out.pop("stop_str_max_len")
        return out

    # ------------------------------------------------------------------ checks
    def verify(self, vocab_size: Optional[int] = None) -> None:
        """Raise `ValueError` naming the field when a value is out of range."""
        _check_finite("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (whole vocabulary) or at least 1, got {self.top_k}")
        _check_finite("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check_finite(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_finite("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.max_new_tokens > MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max_new_tokens must be <= {MAX_NEW_TOKENS_LIMIT}, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be <= max_new_tokens ({self.max_new_tokens}), got {self.min_new_tokens}"
            )
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        for s in _as_list(self.stop):
            if s == "":
                raise ValueError("stop strings must not be empty")
        for pattern in _as_list(self.stop_regex):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None
        for tid in self.stop_token_ids or []:
            if tid < 0 or (vocab_size is not None and tid >= vocab_size):
                raise ValueError(f"stop_token_ids entry {tid} is outside the vocabulary [0, {vocab_size})")
        for key, bias in (self.logit_bias or {}).items():
            tid = int(key)
            if tid < 0 or (vocab_size is not None and tid >= vocab_size):
                raise ValueError(f"logit_bias token id {tid} is outside the vocabulary [0, {vocab_size})")
            _check_finite("logit_bias", bias)
            if abs(bias) > LOGIT_BIAS_LIMIT:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {tid}")

    # ------------------------------------------------------------------ normalisation
    def normalize(self, tokenizer: Any = None) -> "SamplingParams":
        """Rewrite into the scheduler's form (idempotent); returns self for chaining."""
        self.stop = _as_list(self.stop)
        self.stop_regex = [p for p in _as_list(self.stop_regex) if p]
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        if 0.0 <= self.temperature < SAMPLING_EPS:
            self.temperature = 1.0
            self.top_k = 1
        max_len = 0
        for s in self.stop:
            max_len = max(max_len, _token_len(tokenizer, s) if tokenizer is not None else len(s))
        self.stop_str_max_len = max_len
        return self

    @property
    def is_greedy(self) -> bool:
        """True when sampling is argmax (top_k == 1, or temperature ~ 0 before normalize)."""
        return self.top_k == 1 or self.temperature < SAMPLING_EPS

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0


# ---------------------------------------------------------------------- helpers
def _as_list(stop: Optional[Union[str, list[str]]]) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


def _token_len(tokenizer: Any, text: str) -> int:
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # tokenizers without the keyword
        ids = tokenizer.encode(text)
    if hasattr(ids, "ids"):  # a `tokenizers.Encoding`
        ids = ids.ids
    return len(ids)


def _check_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _to_int(key: str, value: Any) -> int:
    if _is_int(value):
        return int(value)
    if _is_number(value) and float(value).is_integer():
        return int(value)
    raise ValueError(f"{key} must be an integer, got {value!r}")


def _coerce(key: str, value: Any) -> Any:
    """Type-check one non-None user value and convert it to the field's type."""
    if key in _INT_FIELDS or key == "seed":
        return _to_int(key, value)
    if key in _FLOAT_FIELDS:
        if not _is_number(value):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be a boolean, got {value!r}")
        return value
    if key in ("stop", "stop_regex"):
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
            return list(value)
        raise ValueError(f"{key} must be a string or a list of strings, got {value!r}")
    if key == "stop_token_ids":
        if isinstance(value, (list, tuple, set)) and all(_is_int(t) for t in value):
            return [int(t) for t in value]
        raise ValueError(f"stop_token_ids must be a list of integers, got {value!r}")
    if key == "logit_bias":
        return _coerce_logit_bias(value)
    if key in _GRAMMAR_FIELDS:
        if isinstance(value, str):
            return value
        if key in ("json_schema", "structural_tag") and isinstance(value, (dict, bool)):
            return json.dumps(value)
        raise ValueError(f"{key} must be a string, got {value!r}")
    raise AssertionError(f"no coercion rule for {key}")  # pragma: no cover


def _coerce_logit_bias(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be an object mapping token ids to numbers, got {value!r}")
    out: dict[str, float] = {}
    for k, v in value.items():
        try:
            tid = int(k) if not isinstance(k, bool) else None
        except (TypeError, ValueError):
            tid = None
        if tid is None or (isinstance(k, float) and not k.is_integer()):
            raise ValueError(f"logit_bias keys must be token ids, got {k!r}")
        if not _is_number(v):
            raise ValueError(f"logit_bias values must be numbers, got {v!r} for token {k!r}")
        out[str(tid)] = float(v)
    return out
