"""Test helper: run a model on hand-built ForwardBatches over real KV pools (no scheduler).

    harness = ForwardHarness(hf_config, dtype=torch.float32)
    a, b = harness.new_request(), harness.new_request()
    out = harness.forward(model, [(a, prompt_a[:8]), (b, prompt_b)])      # prefill / chunk
    out = harness.forward(model, [(a, [tok_a]), (b, [tok_b])])            # decode step

Each call appends the given tokens to each request: it allocates KV slots, writes them into the
request's `req_to_token` row, builds the ForwardBatch (mode chosen from the shapes) and runs the
attention backend's metadata step and the model. The backend is the one the engine serves with
on CPU (the platform default) unless `attention_backend` names another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from sglang.srt.layers.attention.registry import create_attention_backend, default_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import DPForwardInfo, ForwardBatch, ForwardMode


@dataclass
class ReqHandle:
    """One request's row in req_to_token and the tokens it has stored so far."""

    row: int
    tokens: list[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.tokens)


class ForwardHarness:
    """Pools + attention backend for driving a model directly in tests (page_size 1)."""

    def __init__(
        self,
        hf_config: Any,
        dtype: torch.dtype = torch.float32,
        max_total_tokens: int = 4096,
        max_requests: int = 16,
        max_context_len: int = 1024,
        attention_backend: Optional[str] = None,
        tp_size: int = 1,
    ):
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        self.req_to_token_pool = ReqToTokenPool(max_requests, max_context_len)
        self.token_to_kv_pool = MHATokenToKVPool(
            max_total_tokens, 1, dtype, max(1, kv_heads // tp_size), head_dim, hf_config.num_hidden_layers
        )
        self.allocator = TokenToKVPoolAllocator(max_total_tokens)
        self.attn_backend = create_attention_backend(attention_backend or default_attention_backend("cpu"))

    def new_request(self) -> ReqHandle:
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            raise RuntimeError("no free request rows")
        return ReqHandle(row=rows[0])

    def free_request(self, req: ReqHandle) -> None:
        if req.seq_len:
            self.allocator.free(self.req_to_token_pool.req_to_token[req.row, : req.seq_len].clone())
        self.req_to_token_pool.free(req.row)
        req.tokens = []

    def build_batch(
        self,
        items: Sequence[tuple[ReqHandle, Sequence[int]]],
        mode: Optional[ForwardMode] = None,
        return_all_logits: bool = False,
    ) -> ForwardBatch:
        """Allocate slots for the new tokens of each request and describe them as one batch."""
        if any(len(toks) == 0 for _, toks in items):
            raise ValueError("every request in a batch needs at least one new token")
        prefix = [req.seq_len for req, _ in items]
        ext = [len(toks) for _, toks in items]
        slots = self.allocator.alloc(sum(ext))
        if slots is None:
            raise RuntimeError("KV pool exhausted")
        table = self.req_to_token_pool.req_to_token
        cursor = 0
        for (req, toks), p, n in zip(items, prefix, ext):
            table[req.row, p : p + n] = slots[cursor : cursor + n]
            req.tokens.extend(int(t) for t in toks)
            cursor += n
        if mode is None:
            is_decode = [n == 1 and p > 0 for p, n in zip(prefix, ext)]
            mode = (
                ForwardMode.DECODE
                if all(is_decode)
                else ForwardMode.MIXED
                if any(is_decode)
                else ForwardMode.EXTEND
            )
        seq = [p + n for p, n in zip(prefix, ext)]
        i64 = dict(dtype=torch.int64)
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(items),
            input_ids=torch.tensor([t for _, toks in items for t in toks], **i64),
            positions=torch.cat([torch.arange(p, p + n, **i64) for p, n in zip(prefix, ext)]),
            out_cache_loc=slots,
            req_pool_indices=torch.tensor([req.row for req, _ in items], **i64),
            seq_lens=torch.tensor(seq, **i64),
            extend_prefix_lens=torch.tensor(prefix, **i64),
            extend_seq_lens=torch.tensor(ext, **i64),
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=ext,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend,
            return_all_logits=return_all_logits,
        )

    def idle_batch(self, dp: DPForwardInfo) -> ForwardBatch:
        """This replica's IDLE part of a lockstep attention-DP forward (no tokens)."""
        return ForwardBatch.idle(dp, self.req_to_token_pool, self.token_to_kv_pool, self.attn_backend)

    def run(self, model: torch.nn.Module, batch: ForwardBatch):
        batch.attn_backend.init_forward_metadata(batch)
        with torch.inference_mode():
            return model(batch.input_ids, batch.positions, batch)

    def forward(
        self,
        model: torch.nn.Module,
        items: Sequence[tuple[ReqHandle, Sequence[int]]],
        mode: Optional[ForwardMode] = None,
        return_all_logits: bool = False,
    ):
        """build_batch + run: returns the model's LogitsProcessorOutput."""
        return self.run(model, self.build_batch(items, mode, return_all_logits))
