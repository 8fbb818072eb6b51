"""Incremental detokenization of one request, with stop-string trimming and hold-back.

`IncrementalDecoder` turns a growing list of token ids into append-only text. It decodes a small
window of ids twice (the already-emitted "prefix" window and the window plus the new ids) and
emits the difference, so that tokenizers whose pieces depend on their neighbours (SentencePiece
leading spaces, byte-level BPE) give the same text as one full decode. When the new text ends in
U+FFFD the last character is an incomplete multi-byte UTF-8 sequence: nothing is emitted until a
later token completes it (or the request finishes).

`RequestDetokState` adds stop strings on top: while a request runs, text that could be the start
of a stop string is held back, so a stop string never reaches a stream; when it finishes, the text
is trimmed at the first stop string (unless `no_stop_trim`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

REPLACEMENT_CHAR = "\ufffd"


def decode_ids(
    tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> str:
    """`tokenizer.decode` with SGLang's options (tolerates tokenizers without the space option)."""
    if not ids:
        return ""
    try:
        return tokenizer.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )
    except TypeError:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def find_anchor_ids(tokenizer: Any) -> list[int]:
    """Token ids of a neutral one-character text, decoded in front of the first output tokens.

    SentencePiece decoders drop the leading space of the first token of a decode; decoding the
    output after an anchor keeps it (the scheduler does not send prompt ids to the detokenizer).
    Returns [] when the tokenizer does not give a clean anchor.
    """
    try:
        ids = tokenizer.encode("a", add_special_tokens=False)
    except Exception:  # noqa: BLE001 - any tokenizer failure means "no anchor"
        return []
    ids = list(getattr(ids, "ids", ids))
    if not 1 <= len(ids) <= 4:
        return []
    text = decode_ids(tokenizer, ids, True, True)
    if not text or REPLACEMENT_CHAR in text:
        return []
    return ids


class IncrementalDecoder:
    """Append-only text of a growing token sequence; never emits a partial UTF-8 character."""

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        anchor_ids: Sequence[int] = (),
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.ids: list[int] = list(anchor_ids)
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = len(self.ids)  # ids before this have been turned into `text`
        self.text = ""  # all complete text so far

    def _decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids, self.skip_special_tokens, self.spaces_between_special_tokens)

    def _pending_text(self) -> str:
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if full_text.startswith(prefix_text):
            return full_text[len(prefix_text) :]
        # Decoders that rewrite earlier characters: fall back to the common prefix.
        common = 0
        for a, b in zip(prefix_text, full_text):
            if a != b:
                break
            common += 1
        return full_text[common:]

    def append(self, new_ids: Sequence[int]) -> str:
        """Add tokens and return the newly completed text ('' while a character is incomplete)."""
        self.ids.extend(new_ids)
        if self.read_offset == len(self.ids):
            return ""
        new_text = self._pending_text()
        if not new_text or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Emit whatever is pending, incomplete characters included (call when the request ends)."""
        if self.read_offset == len(self.ids):
            return ""
        new_text = self._pending_text()
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += new_text
        return new_text


def stop_holdback(text: str, stop_strs: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stop_strs:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def first_stop_index(text: str, stop_strs: Sequence[str], start: int = 0) -> int:
    """Index of the earliest occurrence of any stop string in `text[start:]`, or -1."""
    best = -1
    for stop in stop_strs:
        if not stop:
            continue
        idx = text.find(stop, start)
        if idx >= 0 and (best < 0 or idx < best):
            best = idx
    return best


class RequestDetokState:
    """Decode state of one running request as the DetokenizerManager keeps it."""

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop_strs: Sequence[str] = (),
        no_stop_trim: bool = False,
        anchor_ids: Sequence[int] = (),
    ):
        self.decoder = IncrementalDecoder(
            tokenizer, skip_special_tokens, spaces_between_special_tokens, anchor_ids
        )
        self.stop_strs = [s for s in stop_strs if s]
        self.no_stop_trim = no_stop_trim
        self.sent = 0  # characters of `decoder.text` already emitted

    def step(self, new_ids: Sequence[int], finished_reason: Optional[dict]) -> str:
        """Consume one message's new ids; return the text to emit now (never retracted later)."""
        if finished_reason is None:
            self.decoder.append(new_ids)
            return self._emit(self._safe_end(self.decoder.text))
        ids = list(new_ids)
        matched = finished_reason.get("matched")
        if (
            finished_reason.get("type") == "stop"
            and isinstance(matched, int)
            and not isinstance(matched, bool)
            and not self.no_stop_trim
            and ids
            and ids[-1] == matched
        ):
            ids = ids[:-1]  # SGLang drops the matched stop token from the text
        self.decoder.append(ids)
        self.decoder.flush()
        text = self.decoder.text
        if not self.no_stop_trim:
            stops = list(self.stop_strs)
            if isinstance(matched, str) and matched and matched not in stops:
                stops.append(matched)
            idx = first_stop_index(text, stops)
            if idx >= 0:
                text = text[:idx]
        return self._emit(len(text))

    def _safe_end(self, text: str) -> int:
        """How far `text` may be emitted while the request still runs."""
        if not self.stop_strs:
            return len(text)
        # Emitted text never holds a stop string start, so the search can begin at `sent`.
        idx = first_stop_index(text, self.stop_strs, start=self.sent)
        if idx >= 0:
            return idx
        return len(text) - stop_holdback(text, self.stop_strs)

    def _emit(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out = self.decoder.text[self.sent : end]
        self.sent = end
        return out
