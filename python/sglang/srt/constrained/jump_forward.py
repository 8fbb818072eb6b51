"""Jump-forward: the token ids of the text a grammar forces (`--enable-jump-forward`).

When the grammar allows exactly one continuation string (xgrammar's `find_jump_forward_string`,
e.g. the rest of a fixed JSON key), that text becomes output without sampling it token by token.
The forced text is tokenized together with the request's last sampled token, because the two may
merge into one token (`"` + `name"` -> `"name` + `"`): `retokenize` returns the ids that replace
that token. Tokens whose KV is already written are never changed: they are only the decode
context, and a result that would re-split them is refused (the plain tokens of the forced text
are appended after the sampled token instead).
"""

from __future__ import annotations

from typing import Any, Optional

REPLACEMENT = "\ufffd"  # what a token holding part of a UTF-8 character decodes to


def retokenize(tokenizer: Any, context: list[int], tail: list[int], forced: str) -> Optional[list[int]]:
    """Ids that replace `tail` (the unwritten last output tokens) so that `context + ids` decodes
    to `decode(context + tail) + forced`; None when no such ids are found (no jump)."""
    if not forced or REPLACEMENT in forced:
        return None
    base = _decode(tokenizer, context + tail)
    if REPLACEMENT in base:  # a character split across tokens: its bytes cannot be re-encoded
        return None
    text = base + forced
    ids = tokenizer.encode(text, add_special_tokens=False)
    if ids[: len(context)] == context and len(ids) > len(context) and _decode(tokenizer, ids) == text:
        return ids[len(context) :]
    plain = tail + tokenizer.encode(forced, add_special_tokens=False)
    if _decode(tokenizer, context + plain) == text:
        return plain
    return None


def _decode(tokenizer: Any, ids: list[int]) -> str:
    """The exact text of `ids` (no clean-up of spaces before punctuation: it would hide a change)."""
    return tokenizer.decode(ids, clean_up_tokenization_spaces=False)
