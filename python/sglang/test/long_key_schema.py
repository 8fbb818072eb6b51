"""A JSON schema with long fixed keys and long enum values: most of its text is forced by the
grammar, which is what jump-forward (`--enable-jump-forward`) skips decoding. Shared by the
jump-forward tests and `benchmark/structured/bench_jump_forward.py`."""

from __future__ import annotations

import json

KEYS = ("customer_full_name", "customer_account_identifier", "customer_membership_level")
LEVELS = ("bronze_member_level", "silver_member_level", "golden_member_level")
SCHEMA = {
    "type": "object",
    "properties": {
        KEYS[0]: {"type": "string", "maxLength": 12},
        KEYS[1]: {"type": "integer", "minimum": 0, "maximum": 999},
        KEYS[2]: {"enum": list(LEVELS)},
    },
    "required": list(KEYS),
    "additionalProperties": False,
}
SCHEMA_TEXT = json.dumps(SCHEMA)


def check(text: str) -> dict:
    """The parsed output; fails unless it has exactly the schema's keys, in order, and valid values."""
    obj = json.loads(text)
    assert list(obj) == list(KEYS), obj
    assert isinstance(obj[KEYS[0]], str) and len(obj[KEYS[0]]) <= 12, obj
    assert isinstance(obj[KEYS[1]], int) and 0 <= obj[KEYS[1]] <= 999, obj
    assert obj[KEYS[2]] in LEVELS, obj
    return obj
