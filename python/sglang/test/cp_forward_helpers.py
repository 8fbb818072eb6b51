"""Test helper: drive a model on hand-built context-parallel batches (no scheduler).

Like `forward_helpers.ForwardHarness`, but the memory is laid out the way the engine lays it out
under CP: the allocator and `req_to_token` work in the virtual slot space (page size
`page_size · cp`), each rank's KV pool holds only its physical share, and every batch carries a
`CPLayout` for this rank. With `group=None` (or a group of size 1) it is the plain single-rank
setup, which serves as the reference. The attention backend is the CPU platform's default (what
the engine serves with) unless `attention_backend` names another.

    h = CPForwardHarness(hf_config, groups.attn_cp, strategy="zigzag")
    a = h.new_request()
    out = h.forward(model, [(a, prompt[:8])])                 # prefill chunk
    b = h.new_request(share_prefix_of=a, prefix_len=4)          # a radix-cache hit
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from sglang.srt.layers.attention.registry import create_attention_backend, default_attention_backend
from sglang.srt.layers.context_parallel import build_cp_layout_for_batch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cp_slots import CPSlotMapping
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode, PPProxyTensors
from sglang.test.forward_helpers import ReqHandle


class CPForwardHarness:
    def __init__(
        self,
        hf_config: Any,
        group: Any = None,
        strategy: str = "zigzag",
        page_size: int = 1,
        interleave: int = 1,
        dtype: torch.dtype = torch.float32,
        max_total_tokens: int = 2048,
        max_requests: int = 16,
        max_context_len: int = 512,
        attn_tp_size: int = 1,
        attention_backend: Optional[str] = None,
    ):
        self.group = group
        cp = group.size if group is not None else 1
        self.strategy = strategy
        self.mapping = CPSlotMapping(page_size, cp, interleave)
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        self.allocator = TokenToKVPoolAllocator(max_total_tokens, self.mapping.virtual_page_size)
        physical = self.mapping.physical_pool_size(self.allocator.size)
        self.token_to_kv_pool = MHATokenToKVPool(
            physical,
            page_size,
            dtype,
            max(1, kv_heads // attn_tp_size),
            head_dim,
            hf_config.num_hidden_layers,
        )
        self.req_to_token_pool = ReqToTokenPool(max_requests, max_context_len)
        self.attn_backend = create_attention_backend(attention_backend or default_attention_backend("cpu"))

    def new_request(self, share_prefix_of: Optional[ReqHandle] = None, prefix_len: int = 0) -> ReqHandle:
        """A request row; optionally starting with `prefix_len` tokens of another request's KV
        (a radix-cache hit: the same virtual slots, `prefix_len` a multiple of the virtual page)."""
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            raise RuntimeError("no free request rows")
        req = ReqHandle(row=rows[0])
        if share_prefix_of is not None and prefix_len:
            if prefix_len % self.mapping.virtual_page_size:
                raise ValueError(
                    f"a shared prefix must be whole virtual pages ({self.mapping.virtual_page_size})"
                )
            table = self.req_to_token_pool.req_to_token
            table[req.row, :prefix_len] = table[share_prefix_of.row, :prefix_len]
            req.tokens = list(share_prefix_of.tokens[:prefix_len])
        return req

    def build_batch(
        self, items: Sequence[tuple[ReqHandle, Sequence[int]]], return_all_logits: bool = False
    ) -> ForwardBatch:
        prefix = [req.seq_len for req, _ in items]
        ext = [len(toks) for _, toks in items]
        table = self.req_to_token_pool.req_to_token
        last = [int(table[req.row, p - 1]) if p else -1 for (req, _), p in zip(items, prefix)]
        slots = self.allocator.alloc_extend(prefix, ext, last)
        if slots is None:
            raise RuntimeError("KV pool exhausted")
        cursor = 0
        for (req, toks), p, n in zip(items, prefix, ext):
            table[req.row, p : p + n] = slots[cursor : cursor + n]
            req.tokens.extend(int(t) for t in toks)
            cursor += n
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
        fb = ForwardBatch(
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
        if self.group is not None and self.group.size > 1:
            build_cp_layout_for_batch(fb, self.group, self.strategy, self.mapping)
        return fb

    def run(self, model: torch.nn.Module, batch: ForwardBatch):
        batch.attn_backend.init_forward_metadata(batch)
        with torch.inference_mode():
            return model(batch.input_ids, batch.positions, batch)

    def forward(self, model: torch.nn.Module, items, return_all_logits: bool = False):
        return self.run(model, self.build_batch(items, return_all_logits))

    def stored_rows(self, layer_id: int = 0) -> int:
        """Rows of this rank's pool holding KV (non-zero keys): what this rank stores."""
        keys = self.token_to_kv_pool.get_key_buffer(layer_id)
        return int((keys.reshape(keys.shape[0], -1).abs().sum(dim=1) != 0).sum())


def pp_stepper(h: "CPForwardHarness", model: torch.nn.Module, groups, proxy_rows: list):
    """step(items, all_logits=False) -> logits on every rank: runs this rank's shard and, with pp,
    passes proxy tensors down the stages and the logits back to stage 0; proxy_rows gets
    (rows sent to the next stage, tokens in the batch) per step on stage 0."""

    def step(items, all_logits: bool = False) -> torch.Tensor:
        fb = h.build_batch(items, return_all_logits=all_logits)
        pp = groups.pp
        if pp.size == 1:
            out = h.run(model, fb)
            return out.full_logits if all_logits else out.next_token_logits
        if not pp.is_last:  # stage 0: send this rank's token shard, get the logits back
            out = h.run(model, fb)
            proxy_rows.append((out["hidden_states"].shape[0], fb.num_tokens))
            pp.send_tensor_dict(out.tensors, dst=pp.next_rank)
            return pp.recv_tensor_dict(src=pp.size - 1)["logits"]
        fb.pp_proxy_tensors = PPProxyTensors(pp.recv_tensor_dict(src=pp.prev_rank))
        out = h.run(model, fb)
        logits = out.full_logits if all_logits else out.next_token_logits
        pp.send_tensor_dict({"logits": logits.contiguous()}, dst=0)
        return logits

    return step
