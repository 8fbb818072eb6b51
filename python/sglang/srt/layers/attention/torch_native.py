"""Reference attention backend on torch's scaled_dot_product_attention (CPU and any device).

Per batch, `init_forward_metadata` gathers everything the layers share:
- single-token requests (all of a DECODE batch, the decode part of a MIXED batch) are attended in
  ONE batched SDPA call: their KV slot rows are padded to the longest sequence and masked;
- multi-token requests (prefill / chunked prefill) get one SDPA call each: `is_causal` when there
  is no cached prefix (keys are the fresh k/v, no gather); with a cached prefix, on CPU, one
  unmasked call over the prefix plus one causal call over the chunk's fresh k/v, merged by their
  log-sum-exp (elsewhere: an explicit causal mask offset by the prefix length over the whole KV).

Cached KV is read as planned once per forward (`torch_native_kv.py`): a zero-copy view of the
head-major pool when the slots are one contiguous run (one long request), else one gather per
layer into a scratch buffer shared by all layers. Batched decode requests with long contiguous
runs attend those runs as views too (`torch_native_decode.py`). Where the device has fused
kernels (`kernels/dispatch.py`; the CPU build), single-token requests instead go through one
`decode_attention` call that reads each request's slots from the pool in place (no gather, no
padding) and splits long sequences across threads; where the CPU has AMX, the prefill of a bf16
model with head dim 64 (fresh, or a chunk over a cached prefix read from the pool) runs the fused
`prefill_attention`.

`attention_with_lse` / `merge_attention_states` are the exact softmax-with-log-sum-exp building
blocks used when attention over one sequence is split across ranks (context parallelism).
A batch that carries a context-parallel layout (`layers/context_parallel.py`) is handed to
`torch_native_cp.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
import torch.nn.functional as F

from sglang.srt.kernels.dispatch import kernels_for_device, splits_attention
from sglang.srt.layers.attention.base import AttentionBackend
from sglang.srt.layers.attention.torch_native_decode import (
    DecodeSegments,
    attend_decode_segments,
    plan_decode_segments,
)
from sglang.srt.layers.attention.torch_native_kv import (
    KVGather,
    KVSource,
    KVWorkspace,
    attend_prefix_and_chunk,
    fetch,
    head_major_kv,
    lse_kernel_available,
    plan_source,
)
from sglang.srt.layers.context_parallel import CP_LAYOUT_KEY

if TYPE_CHECKING:
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch

_METADATA_KEY = "torch_native"


# ---------------------------------------------------------------------------- math helpers
def causal_mask(q_len: int, k_len: int, q_offset: int = 0, device=None) -> torch.Tensor:
    """Bool [q_len, k_len]: query j (absolute position q_offset + j) sees keys 0..q_offset + j."""
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + q_offset
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns the log-sum-exp of the scaled scores.

    q [..., Hq, Lq, D], k/v [..., Hk, Lk, D] with Hq a multiple of Hk (GQA); `attn_mask` is a bool
    mask broadcastable to [..., Hq, Lq, Lk] (True = attend); `is_causal` is top-left aligned like
    SDPA's. Returns (out [..., Hq, Lq, Dv] in q's dtype, lse [..., Hq, Lq] float32). A query that
    sees no key gets out = 0 and lse = -inf, so it drops out of `merge_attention_states`.
    """
    hq, hk = q.shape[-3], k.shape[-3]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=-3)
        v = v.repeat_interleave(hq // hk, dim=-3)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        attn_mask = mask if attn_mask is None else attn_mask & mask
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))
    out = torch.matmul(probs, v.float())
    return out.to(q.dtype), lse


def merge_attention_states(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions over disjoint key sets: out = sum_r exp(lse_r - lse) * out_r.

    outs[r] [..., L, D], lses[r] [..., L]; returns (out in outs[0]'s dtype, lse float32).
    """
    lse_all = torch.stack([x.float() for x in lses])  # [R, ..., L]
    lse = torch.logsumexp(lse_all, dim=0)
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(lse_all - safe_lse.unsqueeze(0)).unsqueeze(-1)  # [R, ..., L, 1]
    out = (weights * torch.stack([o.float() for o in outs])).sum(dim=0)
    return out.to(outs[0].dtype), lse


# ---------------------------------------------------------------------------- metadata
@dataclass
class _ExtendItem:
    """One multi-token request: its token range and how to get its keys."""

    start: int
    end: int
    kv_indices: Optional[torch.Tensor]  # [seq_len] slots; None = fresh k/v (no cached prefix)
    mask: Optional[torch.Tensor]  # [q_len, seq_len] bool for a cached prefix (built when first needed on CPU)
    is_causal: bool
    kv_source: Optional[KVSource] = None  # how to read kv_indices' rows (None: fresh k/v)
    prefix_source: Optional[KVSource] = None  # how to read the cached prefix's rows alone


@dataclass
class TorchNativeMetadata:
    """Per-batch state shared by all layers."""

    all_single: bool  # every request brings one token (no scatter needed)
    single_token_idx: Optional[torch.Tensor]  # [n1] flat token index of each single-token request
    single_kv_indices: Optional[torch.Tensor]  # [n1, max_len] slots (0 past seq_len)
    single_mask: Optional[torch.Tensor]  # [n1, 1, 1, max_len] bool; None when all lengths equal
    extends: list[_ExtendItem]
    # How to read single_kv_indices' rows: a view when n1 == 1 and its slots are one run.
    single_source: Optional[KVSource] = None
    # Else, on CPU, when some request has a long contiguous run: runs as views + the rest gathered.
    single_segments: Optional[DecodeSegments] = None
    workspace: KVWorkspace = field(default_factory=KVWorkspace)  # gathers, reused by all layers
    # Fused kernels of the device (kernels/dispatch.py): decode attention reads the pool in place.
    kernels: Optional[Any] = None
    single_lens: Optional[torch.Tensor] = None  # [n1] int64 seq lens (for the fused kernel)
    prefill_kernel: bool = False  # the fused kernels run causal prefill here (CPU with AMX)


def _build_metadata(fb: "ForwardBatch") -> TorchNativeMetadata:
    req_to_token = fb.req_to_token_pool.req_to_token
    device = req_to_token.device
    ext_lens, prefix_lens, seq_lens = fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu, fb.seq_lens_cpu
    single = [i for i, n in enumerate(ext_lens) if n == 1]
    all_single = len(single) == fb.batch_size
    single_token_idx = single_kv = single_mask = single_source = single_segments = single_lens_t = None
    kernels = kernels_for_device(device)
    if single:
        if all_single:
            rows, lens = fb.req_pool_indices, fb.seq_lens
        else:
            sel = torch.tensor(single, dtype=torch.int64, device=fb.seq_lens.device)
            rows, lens = fb.req_pool_indices[sel], fb.seq_lens[sel]
            starts = [0] * (fb.batch_size + 1)
            for i, n in enumerate(ext_lens):
                starts[i + 1] = starts[i] + n
            single_token_idx = torch.tensor([starts[i] for i in single], dtype=torch.int64, device=device)
        single_lens = [seq_lens[i] for i in single]
        max_len = max(single_lens)
        single_kv = req_to_token[rows.to(device), :max_len]
        if min(single_lens) != max_len:
            valid = torch.arange(max_len, device=device).unsqueeze(0) < lens.to(device).unsqueeze(1)
            single_kv = single_kv.masked_fill(~valid, 0)
            single_mask = valid[:, None, None, :]
        flat = single_kv.reshape(-1)
        single_source = plan_source(flat) if len(single) == 1 else KVGather(flat)
        if kernels is not None:
            single_kv = single_kv.to(torch.int64).contiguous()
            single_lens_t = torch.tensor(single_lens, dtype=torch.int64)
        elif isinstance(single_source, KVGather) and splits_attention(device):
            single_segments = plan_decode_segments(single_kv, single_lens)
    extends: list[_ExtendItem] = []
    start = 0
    for i, n in enumerate(ext_lens):
        if n > 1:
            prefix, seq_len = prefix_lens[i], seq_lens[i]
            if prefix == 0:
                extends.append(_ExtendItem(start, start + n, None, None, True))
            else:
                kv = req_to_token[fb.req_pool_indices[i : i + 1].to(device), :seq_len][0]
                # CPU splits prefix / chunk instead (no mask); a [n, seq_len] mask can be 100s of MB
                mask = None if splits_attention(device) else causal_mask(n, seq_len, prefix, device=device)
                srcs = plan_source(kv), plan_source(kv[:prefix])
                extends.append(_ExtendItem(start, start + n, kv, mask, False, *srcs))
        start += n
    return TorchNativeMetadata(
        all_single,
        single_token_idx,
        single_kv,
        single_mask,
        extends,
        single_source,
        single_segments,
        kernels=kernels,
        single_lens=single_lens_t,
        prefill_kernel=kernels is not None and bool(kernels.prefill_attention_supported()),
    )


def _amx_prefill_fits(*tensors: torch.Tensor) -> bool:
    """Whether the fused `prefill_attention` covers these tensors: bf16 with head dim 64, the
    64 values of a head contiguous ([n, heads, 64] views of q / k / v, or the rows of the
    head-major pool buffers [heads, rows, 64])."""
    return all(
        t.dtype == torch.bfloat16 and t.shape[-1] == 64 and t.stride(-1) == 1 and t.stride(-2) == 64 for t in tensors
    )


# ---------------------------------------------------------------------------- backend
class TorchNativeAttnBackend(AttentionBackend):
    """SDPA over KV gathered from the pool; the correctness reference for other backends."""

    name = "torch_native"

    def __init__(self, model_runner: object = None, **_: object):
        """Stateless: everything per batch lives in `forward_batch.attn_metadata`."""

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        from sglang.srt.layers.attention import torch_native_cp

        if forward_batch.batch_size and torch_native_cp.init_cp_metadata(forward_batch) is not None:
            return
        if forward_batch.forward_mode.is_idle() or forward_batch.batch_size == 0:
            forward_batch.attn_metadata[_METADATA_KEY] = TorchNativeMetadata(True, None, None, None, [])
            return
        forward_batch.attn_metadata[_METADATA_KEY] = _build_metadata(forward_batch)

    def _metadata(self, forward_batch: "ForwardBatch") -> TorchNativeMetadata:
        md = forward_batch.attn_metadata.get(_METADATA_KEY)
        if md is None:
            self.init_forward_metadata(forward_batch)
            md = forward_batch.attn_metadata[_METADATA_KEY]
        return md

    @staticmethod
    def _save(k, v, layer: "RadixAttention", fb: "ForwardBatch", save_kv_cache: bool) -> None:
        if save_kv_cache:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)

    @staticmethod
    def _attend_single(
        q: torch.Tensor, layer: "RadixAttention", fb: "ForwardBatch", md: TorchNativeMetadata
    ) -> torch.Tensor:
        """q [n, H, D] (one query per request) -> [n, H, Dv], in one SDPA call (plus one per long
        contiguous run when `single_segments` is planned)."""
        n, max_len = md.single_kv_indices.shape
        k_buf, v_buf = head_major_kv(fb.token_to_kv_pool, layer.layer_id)
        if (
            md.kernels is not None
            and k_buf.dtype == q.dtype
            and k_buf.is_contiguous()
            and v_buf.is_contiguous()
            and q.stride(-1) == 1
        ):
            return md.kernels.decode_attention(q, k_buf, v_buf, md.single_kv_indices, md.single_lens, layer.scaling)
        if md.single_segments is not None and lse_kernel_available(q):
            return attend_decode_segments(q, k_buf, v_buf, md.single_segments, md.workspace, layer.scaling)
        src = md.single_source if md.single_source is not None else KVGather(md.single_kv_indices.reshape(-1))
        # [Hk, n * max_len, D] -> [n, Hk, max_len, D]: one contiguous [max_len, D] block per head
        keys = fetch(k_buf, src, md.workspace, "k").view(k_buf.shape[0], n, max_len, -1).transpose(0, 1)
        values = fetch(v_buf, src, md.workspace, "v").view(v_buf.shape[0], n, max_len, -1).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            keys.to(q.dtype),
            values.to(q.dtype),
            attn_mask=md.single_mask,
            scale=layer.scaling,
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return out.squeeze(2)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def start_kv_exchange(self, k, v, layer, forward_batch) -> None:
        """Context parallelism: start the async all-gather of the layer's new k/v."""
        from sglang.srt.layers.attention import torch_native_cp

        torch_native_cp.start_kv_exchange(forward_batch, layer.layer_id, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if CP_LAYOUT_KEY in forward_batch.attn_metadata:
            from sglang.srt.layers.attention import torch_native_cp

            if torch_native_cp.get_cp_layout(forward_batch) is not None:
                return torch_native_cp.cp_attention_forward(q, k, v, layer, forward_batch, save_kv_cache)
        md = self._metadata(forward_batch)
        num_tokens = q.shape[0]
        self._save(k, v, layer, forward_batch, save_kv_cache)
        q3 = q.view(num_tokens, layer.num_heads, layer.head_dim)
        if md.all_single:
            if num_tokens == 0:
                return q.new_empty((0, layer.num_heads * layer.v_head_dim))
            return self._attend_single(q3, layer, forward_batch, md).reshape(num_tokens, -1)
        out = q.new_empty((num_tokens, layer.num_heads, layer.v_head_dim))
        if md.single_token_idx is not None:
            out[md.single_token_idx] = self._attend_single(q3[md.single_token_idx], layer, forward_batch, md)
        self._attend_extends(q3, k, v, layer, forward_batch, md, out)
        return out.view(num_tokens, -1)

    @staticmethod
    def _attend_extends(q3, k, v, layer, fb: "ForwardBatch", md: TorchNativeMetadata, out: torch.Tensor) -> None:
        """Multi-token requests, one SDPA (or two, merged) each; writes their rows of `out`.

        With a cached prefix on CPU the keys are split: the prefix (read from the pool) is attended
        without a mask and the chunk's own fresh k/v causally, merged by their log-sum-exp; this
        skips the explicit [q_len, seq_len] mask and lets the kernel skip the causal upper half.
        Elsewhere the whole sequence is read from the pool under the offset causal mask.
        """
        num_tokens = q3.shape[0]
        gqa = layer.num_heads != layer.num_kv_heads
        k3 = k.view(num_tokens, layer.num_kv_heads, layer.head_dim)
        v3 = v.view(num_tokens, layer.num_kv_heads, layer.v_head_dim)
        k_cache = v_cache = None
        caches_fit = False  # the pool buffers suit the fused prefill kernel (checked once per layer)
        for item in md.extends:
            # NOTE: SDPA takes its fast (flash) CPU kernel only for 4-D inputs: [1, H, n, D]
            qi = q3[item.start : item.end].transpose(0, 1).unsqueeze(0)
            ki = k3[item.start : item.end].transpose(0, 1).unsqueeze(0)
            vi = v3[item.start : item.end].transpose(0, 1).unsqueeze(0)
            if item.kv_indices is None:
                if md.prefill_kernel and _amx_prefill_fits(q3, k3, v3):
                    s, e = item.start, item.end
                    md.kernels.prefill_attention(q3[s:e], k3[s:e], v3[s:e], layer.scaling, out=out[s:e])
                    continue
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=layer.scaling, enable_gqa=gqa)
                out[item.start : item.end] = oi[0].transpose(0, 1)
                continue
            if k_cache is None:
                k_cache, v_cache = head_major_kv(fb.token_to_kv_pool, layer.layer_id)
                caches_fit = k_cache.is_contiguous() and v_cache.is_contiguous() and _amx_prefill_fits(k_cache, v_cache)
            if md.prefill_kernel and caches_fit and _amx_prefill_fits(q3, k3, v3):
                s, e = item.start, item.end
                prefix_slots = item.kv_indices[: item.kv_indices.shape[0] - (e - s)]
                md.kernels.prefill_attention(
                    q3[s:e], k3[s:e], v3[s:e], layer.scaling, k_cache, v_cache, prefix_slots, out=out[s:e]
                )
                continue
            if item.prefix_source is not None and lse_kernel_available(qi):
                src = item.prefix_source
                kp = fetch(k_cache, src, md.workspace, "k").unsqueeze(0).to(q3.dtype)
                vp = fetch(v_cache, src, md.workspace, "v").unsqueeze(0).to(q3.dtype)
                oi = attend_prefix_and_chunk(qi, kp, vp, ki, vi, layer.scaling)
            else:
                if item.mask is None:
                    seq_len = item.kv_indices.shape[0]
                    q_len = item.end - item.start
                    item.mask = causal_mask(q_len, seq_len, seq_len - q_len, device=q3.device)
                src = item.kv_source if item.kv_source is not None else KVGather(item.kv_indices)
                ks = fetch(k_cache, src, md.workspace, "k").unsqueeze(0).to(q3.dtype)
                vs = fetch(v_cache, src, md.workspace, "v").unsqueeze(0).to(q3.dtype)
                oi = F.scaled_dot_product_attention(
                    qi, ks, vs, attn_mask=item.mask, is_causal=item.is_causal, scale=layer.scaling, enable_gqa=gqa
                )
            out[item.start : item.end] = oi[0].transpose(0, 1)
