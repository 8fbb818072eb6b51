"""Context-parallel latent attention (MLA, and DSA with the Lightning Indexer): "sharded CP".

Per layer, on each cp rank (the model runs on this rank's tokens, `layers/context_parallel.py`):

1. Row exchange (ONE async all-gather, started by `start_row_exchange` from the backend's
   `start_mla_exchange` hook right after the kv down-projection, so it overlaps the q-LoRA
   up-projection and the absorbed query in `MLAAttention.forward`; kept in `layout.pending` under
   the layer id): every rank sends the new rows `[latent ; k_rope (; index key)]` of
   the split tokens it holds, plus the cached prefix rows it stores of the batch's PREFIX requests
   (chunked-prefill continuations, radix hits). With the replicated tokens' local rows this gives
   every multi-token request's whole sequence of rows. With `--cp-kv-gather-segment S` and more
   than S cached prefix rows in the batch, the exchange carries the new rows only and the prefix
   is gathered and attended in rounds of at most S rows, merged by LSE (`mla_cp_segments.py`).
   Counters / trace of the exchange: `CPLayout.probe` (`cp_probe.py`).
2. Sharded store: each rank writes only the new tokens it owns (virtual slot -> owner / physical
   slot, `CPSlotMapping`), latent rows and index keys alike.
3. Extends (FRESH and PREFIX requests): only this rank's queries, against the request's gathered
   rows, causal by global position. Dense MLA: `causal_attention_lse`. DSA: the indexer scores only
   these queries (`own_query_topk`: per-rank indexer work 1/cp of the total), then selected-token
   attention over the gathered rows; no [queries x keys] mask is built.
4. Decodes (one new token; split over the ranks, or replicated on every rank in the old path):
   split decodes first all-gather their queries (absorbed q, and the indexer's q / weights for
   DSA: one packed gather), so every rank has every decode query; each rank attends over the
   rows it stores. DSA:
   each rank scores the decode queries against the index keys it stores (1/cp of the pairs), keeps
   its local top-k candidates (score, position), the candidates are all-gathered and merged into
   the global top-k (`exchange_and_merge`: identical on every rank, equal to single-rank top-k),
   and each rank attends to the selected tokens it stores. The partials (out, lse) go to each
   decode's holder by one all-to-all and are merged there (`cp_merge.merge_partials`; replicated
   decodes: all-gathered and merged on every rank).

DSA: the indexer's keys are appended to the rows (`IndexerInputs.rows_with_key`) and its queries
projected only when the batch selects (some sequence longer than index_topk).

Why rows for extends and partials for decodes: a token's latent row (kv_lora_rank + rope dims)
is smaller than its absorbed queries (heads x the same dims), so for a multi-token chunk it is
cheaper to move the prefix rows than the queries and partial outputs; for a decode (one query per
request, a long sequence) moving `cp x topk` candidates and one partial per head is far cheaper
than moving the sequence's rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers.attention.dsa.cp_indexer import (
    exchange_and_merge,
    own_query_topk,
    shard_topk_candidates,
)
from sglang.srt.layers.attention.dsa.sparse_attention import sparse_latent_attention
from sglang.srt.layers.attention.cp_merge import merge_partials
from sglang.srt.layers.attention.kv_source import kv_scales, widen_kv
from sglang.srt.layers.attention.mla_cp_metadata import MLACPMetadata
from sglang.srt.layers.attention.mla_cp_segments import segmented_extends
from sglang.srt.layers.attention.ops import causal_attention_lse, sdpa_lse
from sglang.srt.layers.context_parallel import CPLayout, start_gather

if TYPE_CHECKING:
    from sglang.srt.layers.attention.dsa.indexer import Indexer, IndexerInputs
    from sglang.srt.layers.attention.dsa.kernels import DSAKernels
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.model_executor.forward_batch import ForwardBatch


def _pool_rows(fb: "ForwardBatch", layer_id: int, slots: torch.Tensor, with_index: bool) -> torch.Tensor:
    """Cached rows [n, L + R (+ index dim)] at physical `slots` of this rank's pool (latent rows
    widened to the model dtype, as exchanged)."""
    pool = fb.token_to_kv_pool
    kv = pool.get_key_buffer(layer_id)
    rows = kv.view(kv.shape[0], -1).index_select(0, slots.to(kv.device))
    rows = widen_kv(rows, getattr(pool, "compute_dtype", rows.dtype), kv_scales(pool, layer_id)[0])
    if with_index:
        rows = torch.cat((rows, pool.index_k_rows(layer_id, slots)), dim=-1)  # (FP8: widened)
    return rows


def _start(
    fb, layout: CPLayout, md: MLACPMetadata, layer_id: int, rows: torch.Tensor, with_index: bool, early: bool
) -> None:
    plan = md.plan
    send = rows.index_select(0, plan.new_local_rows.to(rows.device))
    sizes = plan.sizes
    if md.rounds is not None:  # segmented: the prefix rows come later, round by round
        sizes = layout.split_spec().sizes
    elif plan.prefix_slots.numel():
        cached = _pool_rows(fb, layer_id, plan.prefix_slots, with_index).to(rows.dtype)
        send = torch.cat((send, cached), dim=0)
    pending = layout.pending[layer_id] = start_gather(layout.group, send, sizes)
    if layout.probe is not None:
        layout.probe.started(layer_id, pending, early)
        if md.rounds is None and plan.prefix_total:
            row_bytes = send.shape[1] * send.element_size()
            layout.probe.prefix_round(plan.prefix_total, layout.cp_size * max(sizes), row_bytes)


def start_row_exchange(
    fb: "ForwardBatch",
    layout: CPLayout,
    md: MLACPMetadata,
    layer_id: int,
    rows: torch.Tensor,
    with_index: bool,
) -> None:
    """Start this layer's async row all-gather (new split rows + stored prefix rows); call it as
    soon as the new rows of this rank's tokens exist: [latent ; k_rope], with the index key
    appended when `with_index` (DSA)."""
    if layout.is_trivial or layer_id in layout.pending:
        return
    _start(fb, layout, md, layer_id, rows, with_index, True)


def _exchange(fb, layout: CPLayout, md: MLACPMetadata, layer_id: int, rows: torch.Tensor, with_index: bool):
    """(new rows of the whole batch in original order [N, W], prefix buffer [P, W]; segmented:
    no prefix buffer, None)."""
    if layout.is_trivial:
        return rows, rows.new_empty((0, rows.shape[1]))  # every token is local and in global order
    if layer_id not in layout.pending:
        _start(fb, layout, md, layer_id, rows, with_index, False)
    gathered = layout.pending.pop(layer_id).wait()
    plan, dev = md.plan, rows.device
    full = rows.new_empty((layout.num_tokens, rows.shape[1]))
    if md.rounds is not None:
        spec = layout.split_spec()
        if spec.total:
            full.index_copy_(0, spec.global_idx.to(dev), gathered)
        if md.repl_local_rows.numel():
            full.index_copy_(0, md.repl_global_idx.to(dev), rows.index_select(0, md.repl_local_rows.to(dev)))
        return full, None
    if plan.new_src.numel():
        full.index_copy_(0, plan.new_dst.to(dev), gathered.index_select(0, plan.new_src.to(dev)))
    if md.repl_local_rows.numel():
        full.index_copy_(0, md.repl_global_idx.to(dev), rows.index_select(0, md.repl_local_rows.to(dev)))
    prefix = rows.new_empty((plan.prefix_total, rows.shape[1]))
    if plan.prefix_total:
        prefix.index_copy_(0, plan.prefix_dst.to(dev), gathered.index_select(0, plan.prefix_src.to(dev)))
    return full, prefix


# ---------------------------------------------------------------------------- forward
def mla_cp_forward(
    core: "MLACore",
    q: torch.Tensor,
    kv_new: torch.Tensor,
    fb: "ForwardBatch",
    layout: CPLayout,
    md: MLACPMetadata,
    dsa: Optional["IndexerInputs"] = None,
    save_kv_cache: bool = True,
    kernels: Optional["DSAKernels"] = None,
) -> torch.Tensor:
    """CP latent attention of this rank's tokens.

    q [n, H, L + R] absorbed queries; kv_new [n, L + R] new latent rows; `dsa` the layer's
    Lightning Indexer inputs (DSA); `kernels` the DSA ops to run them with (the `dsa` backend's
    sgl_kernel_npu ops; None: the torch reference functions). Returns [n, H, L]."""
    indexer = dsa.indexer if dsa is not None else None
    rows = dsa.rows_with_key(kv_new) if dsa is not None else kv_new
    dim, v_dim = core.head_dim, core.kv_lora_rank
    full, prefix = _exchange(fb, layout, md, core.layer_id, rows, indexer is not None)
    pool = fb.token_to_kv_pool
    if save_kv_cache and md.own_global_idx.numel():
        own = full.index_select(0, md.own_global_idx.to(full.device))
        pool.set_kv_buffer(core.layer_id, md.own_slots, own[:, :dim])
        if indexer is not None:
            pool.set_index_k_buffer(core.layer_id, md.own_slots, own[:, dim:])
    full = _as_stored(pool, core.layer_id, full, dim)
    sparse = indexer is not None and md.max_seq_len > indexer.index_topk
    index_q, index_w = dsa.query() if sparse else (None, None)

    out = q.new_zeros((q.shape[0], q.shape[1], v_dim))
    if prefix is None:  # segmented prefix gather
        segmented_extends(
            core, q, full, fb, layout, md, out, indexer if sparse else None, (index_q, index_w), kernels
        )
    for it in md.extends if prefix is not None else ():
        if it.local_count == 0:
            continue
        loc = slice(it.local_start, it.local_start + it.local_count)
        seq = full[it.global_start : it.global_start + it.num_tokens]
        if it.prefix_len:
            seq = torch.cat((prefix[it.prefix_offset : it.prefix_offset + it.prefix_len], seq), dim=0)
        kv = seq[:, :dim]
        if sparse and kernels is not None:
            pos = kernels.own_query_topk(
                index_q[loc], index_w[loc], it.q_pos, seq[:, dim:], indexer.index_topk, indexer.softmax_scale
            )
            indexer.count(it.local_count, int((it.q_pos + 1).sum()))
            out[loc] = kernels.attend_rows(q[loc], kv, it.q_pos, pos, core.scaling, v_dim)
        elif sparse:
            pos = own_query_topk(
                index_q[loc], index_w[loc], it.q_pos, seq[:, dim:], indexer.index_topk, indexer.softmax_scale
            )
            indexer.count(it.local_count, int((it.q_pos + 1).sum()))
            out[loc] = sparse_latent_attention(q[loc], kv, pos.clamp(min=0), pos >= 0, core.scaling, v_dim)
        else:
            k3 = kv.unsqueeze(1)  # one shared key head; value = the same row (its first L values)
            o, _ = causal_attention_lse(q[loc], it.q_pos, k3, k3, torch.arange(kv.shape[0]), core.scaling)
            out[loc] = o[..., :v_dim]
    if md.decode_slots is not None:
        _decode_attention(
            core, q, index_q, index_w, indexer if sparse else None, fb, layout, md, out, kernels
        )
    return out


def _as_stored(pool, layer_id: int, full: torch.Tensor, dim: int) -> torch.Tensor:
    """The new rows with their latent part as the pool stores it (an FP8 cache rounds it), so that
    CP attends over the values the single-rank path reads back from the pool."""
    round_rows = getattr(pool, "round_as_stored", None)
    if round_rows is None or not pool.is_fp8:
        return full
    return round_rows(layer_id, full)  # latent part; a DSA pool's FP8 index keys (past `dim`) too


def _decode_topk(
    indexer: "Indexer", iq, iw, fb: "ForwardBatch", layout: CPLayout, md: MLACPMetadata, kernels=None
):
    """Global top-k positions [n1, topk] of the decode queries (identical on every rank)."""
    n1, max_len = md.decode_slots.shape
    if kernels is not None:  # (with int8 scoring, the pool's int8 copy of the keys)
        keys, scale = kernels.index_keys(fb.token_to_kv_pool, indexer.layer_id)
        vals, pos = kernels.shard_topk_candidates(
            iq,
            iw,
            keys,
            md.decode_slots,
            md.decode_valid,
            md.decode_pos,
            indexer.index_topk,
            indexer.softmax_scale,
            scale,
        )
    else:
        keys_all = fb.token_to_kv_pool.index_k_rows(indexer.layer_id, md.decode_slots.reshape(-1))
        keys = keys_all.view(n1, max_len, keys_all.shape[-1])
        vals, pos = shard_topk_candidates(
            iq,
            iw,
            keys,
            md.decode_pos.unsqueeze(0),
            md.decode_valid,
            indexer.index_topk,
            indexer.softmax_scale,
        )
    indexer.count(n1, int(md.decode_valid.sum()))
    return exchange_and_merge(layout.group, vals, pos, indexer.index_topk)


def _decode_attention(
    core, q, index_q, index_w, indexer, fb, layout: CPLayout, md: MLACPMetadata, out, kernels=None
) -> None:
    """Partial attention of the decode queries over this rank's rows, exchanged and merged."""
    dev = q.device
    qd, iq, iw = _decode_queries(layout, md, q, index_q if indexer is not None else None, index_w)
    n1, heads, dim = qd.shape
    v_dim = core.kv_lora_rank
    kv_cache = fb.token_to_kv_pool.get_key_buffer(core.layer_id)
    kv_cache = kv_cache.view(kv_cache.shape[0], dim)
    kv_scale = kv_scales(fb.token_to_kv_pool, core.layer_id)[0]
    if indexer is not None:
        sel = _decode_topk(indexer, iq, iw, fb, layout, md, kernels)
        safe = sel.clamp(min=0)
        mapping = layout.slot_mapping
        mine = (sel >= 0) & (mapping.position_owner(safe) == layout.cp_rank)
        table = fb.req_to_token_pool.req_to_token
        virtual = table[md.decode_req_rows.unsqueeze(1), safe.to(table.device)].to(torch.int64)
        slots = mapping.local_slot(virtual).masked_fill(~mine.to(virtual.device), 0)
        if kernels is not None:
            part_o, part_l = kernels.attend_slots(qd, kv_cache, slots, mine, core.scaling, v_dim, kv_scale)
        else:
            part_o, part_l = sparse_latent_attention(
                qd, kv_cache, slots, mine, core.scaling, v_dim, return_lse=True, kv_scale=kv_scale
            )
    else:
        max_len = md.decode_slots.shape[1]
        keys = kv_cache.index_select(0, md.decode_slots.reshape(-1)).view(n1, 1, max_len, dim)
        keys = widen_kv(keys, qd.dtype, kv_scale)
        mask = md.decode_valid[:, None, None, :]
        o, lse = sdpa_lse(qd.unsqueeze(2), keys, keys, core.scaling, attn_mask=mask)
        part_o, part_l = o.squeeze(2)[..., :v_dim], lse.squeeze(2)
    split = md.decode_split
    mine, merged = merge_partials(layout, part_o, part_l, split.holders if split else None)
    rows = md.decode_rows if mine is None else split.local_rows[mine]
    if rows.numel():
        out.index_copy_(0, rows.to(dev), merged.to(out.dtype))


def _decode_queries(layout: CPLayout, md: MLACPMetadata, q, index_q, index_w):
    """Every decode's (absorbed query, indexer query, indexer weights) in decode order; the
    indexer parts None when `index_q` is. Split decodes: one packed all-gather (in their dtype, or
    float32 when they differ: exact for any narrower one), each rank sending the queries of the
    decodes it holds."""
    split = md.decode_split
    if split is None:
        rows = md.decode_rows.to(q.device)
        pick = lambda t: None if t is None else t.index_select(0, rows)  # noqa: E731
        return pick(q), pick(index_q), pick(index_w)
    parts = [t for t in (q, index_q, index_w) if t is not None]
    local = split.spec.local_rows.to(q.device)
    dtype = parts[0].dtype if all(t.dtype == parts[0].dtype for t in parts) else torch.float32
    send = torch.cat([t.index_select(0, local).to(dtype).flatten(1) for t in parts], dim=1)
    gathered = start_gather(layout.group, send, split.spec.sizes).wait()
    full = gathered.new_empty((split.holders.numel(), gathered.shape[1]))
    full.index_copy_(0, split.gathered_idx.to(q.device), gathered)
    out, col = [], 0
    for t in parts:
        width = math.prod(t.shape[1:])
        out.append(full[:, col : col + width].reshape((-1,) + tuple(t.shape[1:])).to(t.dtype))
        col += width
    return out[0], (out[1] if index_q is not None else None), (out[2] if index_q is not None else None)
