"""The xgrammar backend: a spec compiled against the model's vocabulary, cached by (kind, text), and
one matcher per request.

`XGrammarBackend.compile(spec)` is what the compile threads run (it never touches the cache, so a
thread's timing can never change a scheduling decision); the scheduler thread stores the result
(`store`) and looks it up (`cached`). A `GrammarState` is one request's matcher: `fill(bitmask,
row)` writes the next token's allowed set, `accept(token)` advances it, `terminated` is True once
the grammar accepted its stop token; `forced()` / `replace(old, new)` / `rollback(n)` serve
jump-forward (`jump_forward.py`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch

from sglang.srt.constrained.grammar_spec import GrammarError, GrammarSpec, to_grammar

logger = logging.getLogger(__name__)

CACHE_ENTRIES = 512  # compiled grammars kept (least recently used dropped first)


class GrammarState:
    """One request's matcher over a compiled grammar."""

    def __init__(self, compiled: Any):
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by one token; False when the grammar does not allow it (the matcher is unchanged)."""
        return bool(self._matcher.accept_token(int(token)))

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def forced(self) -> str:
        """The text the grammar forces next (xgrammar's jump-forward string; "" when none)."""
        return self._matcher.find_jump_forward_string()

    def rollback(self, n: int) -> None:
        if n > 0:
            self._matcher.rollback(n)

    def replace(self, old: list[int], new: list[int]) -> bool:
        """Make the last accepted tokens `old` into `new`: roll back past their common prefix and
        accept the rest of `new`. False (the matcher as before) when the grammar refuses `new`."""
        k = 0
        while k < min(len(old), len(new)) and old[k] == new[k]:
            k += 1
        self.rollback(len(old) - k)
        for i, token in enumerate(new[k:]):
            if not self.accept(token):
                self.rollback(i)
                for t in old[k:]:
                    self.accept(t)
                return False
        return True


class XGrammarBackend:
    """Compiles specs for one tokenizer / vocabulary (`vocab_size`: the logits' width)."""

    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        max_threads: int = 2,
        any_whitespace: bool = True,
    ):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace  # False: JSON with fixed separators, no free whitespace
        self.tokenizer = tokenizer  # jump-forward retokenizes the forced text with it
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(set(stop_token_ids)) or None
        )
        # our own cache below: xgrammar's would be filled from the compile threads
        self._compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of `spec` (GrammarError naming the problem). Thread-safe."""
        grammar = to_grammar(spec, self.any_whitespace)
        try:
            return self._compiler.compile_grammar(grammar)
        except Exception as e:
            raise GrammarError(f"invalid {spec.kind}: {e}") from None

    def cached(self, spec: GrammarSpec) -> Optional[Any]:
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is None:
                self.misses += 1
                return None
            self._cache.move_to_end(spec)
            self.hits += 1
            return compiled

    def store(self, spec: GrammarSpec, compiled: Any) -> None:
        with self._lock:
            self._cache[spec] = compiled
            self._cache.move_to_end(spec)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)

    def new_state(self, compiled: Any) -> GrammarState:
        return GrammarState(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """[rows, ceil(vocab / 32)] int32, every token allowed (-1: all bits set)."""
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
