"""The fast CPU attention backend (`--attention-backend cpu`, alias `intel_amx`; the CPU default).

It is the torch-native reference (`torch_native.py`) with a faster plain-attention (MHA) path for
batches that are not context-parallel; latent attention (MLA, DSA) and context parallelism are
the reference's, inherited. Per batch (`CPUBatch.fast`, built on first use):
- single-token requests (all of a DECODE batch, the decode part of a MIXED batch): where the
  device has fused kernels (`platforms/kernel_dispatch.py`; the CPU build), ONE `decode_attention` call
  that reads each request's slots from the pool in place (no gather, no padding) and splits long
  sequences across threads; an FP8 pool (`--kv-cache-dtype fp8_*`) is widened inside the kernel,
  with the layer's k / v scales. Otherwise one batched SDPA over slot rows padded to the longest
  sequence and masked, read as planned once per forward (`kv_source.py`: a zero-copy view when a
  lone request's slots are one contiguous run, else one gather per layer into a scratch buffer
  shared by all layers), with long contiguous runs attended as views and merged by log-sum-exp
  (`cpu_decode.py`).
- multi-token requests (prefill / chunked prefill), one call each: where the CPU has AMX, the
  fused `prefill_attention` for a bf16 model with head dim 64 (fresh, or a chunk over a cached
  prefix read from the pool in place); where attention computes in float32 (float32 models, and
  bf16 ones on CPUs without AMX: `prefill_attention_dtype`), the fused `prefill_attention_vec`
  (AVX2 / AVX-512, head dim 64 or 128, same two forms; it also reads a cached prefix from an FP8
  pool, widened in the kernel); else SDPA, `is_causal` over the fresh k/v when there is no
  cached prefix, and with a cached prefix on CPU one unmasked call over the prefix plus one causal
  call over the chunk's fresh k/v, merged by their log-sum-exp (`ops.attend_prefix_and_chunk`;
  elsewhere an explicit causal mask offset by the prefix length over the whole KV).

The fast-path test (test/unit/test_attention_decode_fastpath.py) checks it against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F

from sglang.srt.platforms.kernel_dispatch import (
    decode_bf16_dot,
    kernels_for_device,
    prefill_attention_dtype,
    splits_attention,
)
from sglang.srt.layers.attention.cpu_decode import (
    DecodeSegments,
    attend_decode_segments,
    plan_decode_segments,
)
from sglang.srt.layers.attention.kv_source import (
    KVGather,
    KVSource,
    KVWorkspace,
    fetch,
    head_major_kv,
    kv_scales,
    plan_source,
    widen_kv,
)
from sglang.srt.layers.attention.ops import attend_prefix_and_chunk, causal_mask, lse_kernel_available
from sglang.srt.layers.attention.cpu_cp_fresh import fused_fresh_attention
from sglang.srt.layers.attention.cpu_kernel_fits import amx_prefill_fits, vec_prefill_kernel
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend, TorchNativeBatch
from sglang.srt.mem_cache.kv_pool import FP8_KV_DTYPES

if TYPE_CHECKING:
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch


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
class CPUMetadata:
    """How the fast MHA path reads a (non context-parallel) batch; shared by all layers."""

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
    # Fused kernels of the device (platforms/kernel_dispatch.py): decode attention reads the pool in place.
    kernels: Optional[Any] = None
    single_lens: Optional[torch.Tensor] = None  # [n1] int64 seq lens (for the fused kernel)
    prefill_kernel: bool = False  # the fused kernels run causal prefill here (CPU with AMX)
    prefill_vec: bool = False  # the fused float32 prefill kernel runs here (AVX2 / AVX-512 build)
    decode_dot: bool = False  # decode_attention scores a bf16 pool by bf16 dot products (AMD AVX512-BF16)


def _build_metadata(fb: "ForwardBatch") -> CPUMetadata:
    if fb.forward_mode.is_idle() or fb.batch_size == 0:
        return CPUMetadata(True, None, None, None, [])
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
    return CPUMetadata(
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
        prefill_vec=kernels is not None and bool(kernels.prefill_attention_vec_supported()),
        decode_dot=kernels is not None and decode_bf16_dot(device),
    )


def _prefill_kernel(md: "CPUMetadata", compute_dtype: torch.dtype, *tensors: torch.Tensor) -> Optional[Any]:
    """The fused kernel that runs causal prefill attention over these tensors (q / k / v, and the
    pool buffers for a cached prefix), or None for SDPA: the AMX one for bf16 head dim 64 where the
    CPU has AMX; the vector one (`vec_prefill_kernel`) otherwise."""
    if md.prefill_kernel and amx_prefill_fits(*tensors):
        return md.kernels.prefill_attention
    # bf16 compute on an AMX CPU stays with SDPA (oneDNN's AMX) where the AMX kernel does not fit
    if md.prefill_vec and (compute_dtype == torch.float32 or not md.prefill_kernel):
        return vec_prefill_kernel(md.kernels.prefill_attention_vec, compute_dtype, *tensors)
    return None


@dataclass
class CPUBatch(TorchNativeBatch):
    """Per-batch state of the `cpu` backend: the reference's members plus the fast MHA plan."""

    fast: Optional[CPUMetadata] = None


# ---------------------------------------------------------------------------- backend
class CPUAttnBackend(TorchNativeAttnBackend):
    """Fused kernels and zero-copy pool views for MHA; the reference for MLA and CP."""

    name = "cpu"
    batch_state_type = CPUBatch
    cp_fresh_attention = staticmethod(fused_fresh_attention)  # CP prefill on the fused kernels

    def _fast_metadata(self, forward_batch: "ForwardBatch") -> CPUMetadata:
        state = self._state(forward_batch)
        if state.fast is None:
            state.fast = _build_metadata(forward_batch)
        return state.fast

    @staticmethod
    def _save(k, v, layer: "RadixAttention", fb: "ForwardBatch", save_kv_cache: bool) -> None:
        if save_kv_cache:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)

    @staticmethod
    def _attend_single(
        q: torch.Tensor, layer: "RadixAttention", fb: "ForwardBatch", md: CPUMetadata
    ) -> torch.Tensor:
        """q [n, H, D] (one query per request) -> [n, H, Dv], in one SDPA call (plus one per long
        contiguous run when `single_segments` is planned)."""
        n, max_len = md.single_kv_indices.shape
        k_buf, v_buf = head_major_kv(fb.token_to_kv_pool, layer.layer_id)
        ks, vs = kv_scales(fb.token_to_kv_pool, layer.layer_id)
        if (
            md.kernels is not None
            and k_buf.dtype in (q.dtype, *FP8_KV_DTYPES)  # FP8 rows are widened in the kernel, * scale
            and k_buf.is_contiguous()
            and v_buf.is_contiguous()
            and q.stride(-1) == 1
        ):
            return md.kernels.decode_attention(
                q, k_buf, v_buf, md.single_kv_indices, md.single_lens, layer.scaling, ks, vs, md.decode_dot
            )
        if md.single_segments is not None and lse_kernel_available(q):
            return attend_decode_segments(
                q, k_buf, v_buf, md.single_segments, md.workspace, layer.scaling, (ks, vs)
            )
        src = md.single_source if md.single_source is not None else KVGather(md.single_kv_indices.reshape(-1))
        # [Hk, n * max_len, D] -> [n, Hk, max_len, D]: one contiguous [max_len, D] block per head
        keys = fetch(k_buf, src, md.workspace, "k").view(k_buf.shape[0], n, max_len, -1).transpose(0, 1)
        values = fetch(v_buf, src, md.workspace, "v").view(v_buf.shape[0], n, max_len, -1).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            widen_kv(keys, q.dtype, ks),
            widen_kv(values, q.dtype, vs),
            attn_mask=md.single_mask,
            scale=layer.scaling,
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return out.squeeze(2)

    def _attend_local(self, q, k, v, layer, forward_batch, save_kv_cache) -> torch.Tensor:
        """MHA of a batch that is not context-parallel (CP batches and MLA: the reference's paths)."""
        md = self._fast_metadata(forward_batch)
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
    def _attend_extends(q3, k, v, layer, fb: "ForwardBatch", md: CPUMetadata, out: torch.Tensor) -> None:
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
        cdt = prefill_attention_dtype(
            q3.device, q3.dtype
        )  # SDPA's compute dtype (float32 for bf16 without AMX)
        fresh_kernel = _prefill_kernel(md, cdt, q3, k3, v3)
        k_cache = v_cache = None
        k_scale = v_scale = 1.0  # the pool's (FP8) scales, read with the pool below
        cached_kernel = None  # the fused kernel for a chunk over a cached prefix (decided once per layer)
        for item in md.extends:
            # NOTE: SDPA takes its fast (flash) CPU kernel only for 4-D inputs: [1, H, n, D]
            if item.kv_indices is None and fresh_kernel is not None:
                s, e = item.start, item.end
                fresh_kernel(q3[s:e], k3[s:e], v3[s:e], layer.scaling, out=out[s:e])
                continue
            qi = q3[item.start : item.end].transpose(0, 1).unsqueeze(0).to(cdt)
            ki = k3[item.start : item.end].transpose(0, 1).unsqueeze(0).to(cdt)
            vi = v3[item.start : item.end].transpose(0, 1).unsqueeze(0).to(cdt)
            if item.kv_indices is None:
                oi = F.scaled_dot_product_attention(
                    qi, ki, vi, is_causal=True, scale=layer.scaling, enable_gqa=gqa
                )
                out[item.start : item.end] = oi[0].transpose(0, 1)
                continue
            if k_cache is None:
                k_cache, v_cache = head_major_kv(fb.token_to_kv_pool, layer.layer_id)
                k_scale, v_scale = kv_scales(fb.token_to_kv_pool, layer.layer_id)
                # an FP8 pool (only the vector kernel takes one) is widened in the kernel, * scale
                fp8 = dict(k_scale=k_scale, v_scale=v_scale) if k_cache.dtype in FP8_KV_DTYPES else {}
                if k_cache.is_contiguous() and v_cache.is_contiguous():
                    cached_kernel = _prefill_kernel(md, cdt, q3, k3, v3, k_cache, v_cache)
            if cached_kernel is not None:
                s, e = item.start, item.end
                prefix_slots = item.kv_indices[: item.kv_indices.shape[0] - (e - s)]
                cached_kernel(
                    q3[s:e],
                    k3[s:e],
                    v3[s:e],
                    layer.scaling,
                    k_cache,
                    v_cache,
                    prefix_slots,
                    out=out[s:e],
                    **fp8,
                )
                continue
            if item.prefix_source is not None and lse_kernel_available(qi):
                src = item.prefix_source
                kp = widen_kv(fetch(k_cache, src, md.workspace, "k").unsqueeze(0), cdt, k_scale)
                vp = widen_kv(fetch(v_cache, src, md.workspace, "v").unsqueeze(0), cdt, v_scale)
                oi = attend_prefix_and_chunk(qi, kp, vp, ki, vi, layer.scaling)
            else:
                if item.mask is None:
                    seq_len = item.kv_indices.shape[0]
                    q_len = item.end - item.start
                    item.mask = causal_mask(q_len, seq_len, seq_len - q_len, device=q3.device)
                src = item.kv_source if item.kv_source is not None else KVGather(item.kv_indices)
                ks = widen_kv(fetch(k_cache, src, md.workspace, "k").unsqueeze(0), cdt, k_scale)
                vs = widen_kv(fetch(v_cache, src, md.workspace, "v").unsqueeze(0), cdt, v_scale)
                oi = F.scaled_dot_product_attention(
                    qi,
                    ks,
                    vs,
                    attn_mask=item.mask,
                    is_causal=item.is_causal,
                    scale=layer.scaling,
                    enable_gqa=gqa,
                )
            out[item.start : item.end] = oi[0].transpose(0, 1)
