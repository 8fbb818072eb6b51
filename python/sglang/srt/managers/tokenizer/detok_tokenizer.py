"""The detokenizer's tokenizer without transformers or torch: the server's backend tokenizer, shipped.

The detokenizer only decodes. For an HF fast tokenizer, `decode(ids, skip_special_tokens=s)` is
the `tokenizers` backend's `decode(ids, skip_special_tokens=s)` (fast tokenizers ignore
`spaces_between_special_tokens`), followed by the clean-up of tokenization spaces when the
tokenizer has it on. So the launcher, which loads the tokenizer with transformers anyway, sends
the detokenizer process a `DetokTokenizerSpec`: the backend's own serialization (vocabulary,
added and special tokens, decoder: exactly what transformers built, from tokenizer.json or GGUF)
and the anchor ids. The detokenizer rebuilds it with `tokenizers` alone and decodes the same text,
byte for byte, without importing transformers and torch (about 4 CPU-s per server start).

Where that equivalence is not known (a tokenizer class that overrides decode, clean-up on, not a
fast tokenizer) `detok_tokenizer_spec` returns None and the detokenizer loads the tokenizer with
transformers, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sglang.srt.managers.tokenizer.incremental_detok import find_anchor_ids


@dataclass(frozen=True)
class DetokTokenizerSpec:
    """What the detokenizer process needs to decode like the server's tokenizer (launcher -> detokenizer)."""

    backend_json: str  # `tokenizers.Tokenizer.to_str()` of the HF tokenizer's backend
    anchor_ids: tuple[int, ...]  # `find_anchor_ids` of the HF tokenizer


def _decodes_like_backend(tokenizer: Any) -> bool:
    """True when `tokenizer.decode` is the backend's decode with nothing added (transformers' own
    fast-tokenizer decode, no clean-up of tokenization spaces)."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return False
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        return False
    cls = type(tokenizer)
    return (
        cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    )


def detok_tokenizer_spec(tokenizer: Optional[Any]) -> Optional[DetokTokenizerSpec]:
    """The spec of an HF fast tokenizer whose decode the backend reproduces exactly; else None."""
    if tokenizer is None or not _decodes_like_backend(tokenizer):
        return None
    return DetokTokenizerSpec(
        backend_json=tokenizer.backend_tokenizer.to_str(),
        anchor_ids=tuple(find_anchor_ids(tokenizer)),
    )


class BackendDecoder:
    """`decode` of an HF fast tokenizer, on the `tokenizers` backend alone."""

    def __init__(self, spec: DetokTokenizerSpec):
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(spec.backend_json)

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """As `PreTrainedTokenizerFast.decode` (which ignores `spaces_between_special_tokens`)."""
        del spaces_between_special_tokens
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
