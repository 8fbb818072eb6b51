"""Reference constrained greedy decoding: transformers' float32 logits of the SmolLM2 GGUF's weights
(`smollm2_reference.cached_hf_dir`), masked by the same xgrammar bitmask the server applies, argmax,
the matcher advanced by the token, until the grammar terminates or `max_new_tokens`.

Independent of the scheduler: only the grammar text conversion (`constrained/grammar_spec.py`) is
shared, so a wrong mask, a mask applied to the wrong row or a matcher advanced out of step shows as
a different token.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.constrained.grammar_spec import GrammarSpec, to_grammar


class GrammarReference:
    """One transformers model and one xgrammar compiler for a GGUF's tokenizer."""

    def __init__(self, gguf_path: str, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]):
        import xgrammar as xgr
        from transformers import AutoModelForCausalLM

        from sglang.test.smollm2_reference import cached_hf_dir

        self.model = AutoModelForCausalLM.from_pretrained(
            cached_hf_dir(gguf_path), dtype=torch.float32, local_files_only=True, attn_implementation="eager"
        ).eval()
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.vocab_size = vocab_size

    def greedy(self, input_ids: list[int], spec: GrammarSpec, max_new_tokens: int) -> list[int]:
        """The constrained greedy continuation (new ids, the grammar's stop token included)."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self.compiler.compile_grammar(to_grammar(spec)))
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread: the server under test runs beside it on few cores
        try:
            return self._loop(matcher, bitmask, list(input_ids), max_new_tokens)
        finally:
            torch.set_num_threads(threads)

    def _loop(self, matcher: Any, bitmask: torch.Tensor, step: list[int], max_new_tokens: int) -> list[int]:
        import xgrammar as xgr

        past, out = None, []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                res = self.model(torch.tensor([step]), past_key_values=past, use_cache=True)  # KV cached
                past, logits = res.past_key_values, res.logits[0, -1:].float().clone()
                matcher.fill_next_token_bitmask(bitmask, 0)
                xgr.apply_token_bitmask_inplace(logits, bitmask)
                token = int(torch.argmax(logits[0]))
                assert matcher.accept_token(token)
                step = [token]
                out.append(token)
                if matcher.is_terminated():
                    break
        return out
