"""Context-parallel MHA attention of the torch-native backend (a batch that carries a CPLayout).

Per layer, on each cp rank (q/k/v are this rank's local tokens, see `layers/context_parallel.py`):
1. K/V exchange: the k/v of the split tokens are all-gathered over the cp group (started early by
   `start_kv_exchange`, async, while the model rotates q; kept in `layout.pending` under the layer
   id); with the replicated tokens' local k/v this gives the batch's new K/V in original order.
2. Sharded KV write: each rank stores only the tokens it owns (virtual slot -> owner / physical
   slot by `CPSlotMapping`).
3. FRESH requests (prefill, no cached prefix): local queries attend causally to the request's
   full new K/V (`causal_attention_lse`) — no further communication.
4. PREFIX requests (chunked prefill / radix hit) and decodes: the queries held by one rank (the
   split ones: PREFIX tokens, and decodes under `split_decodes`) are all-gathered; every rank
   computes the partial attention (out, lse) of ALL these queries over its own KV shard (prefix
   shard + owned new tokens, causal by absolute position); the partials go to each query's
   holder by one all-to-all and are merged exactly there (`cp_merge.merge_partials`). Replicated
   decodes (the old path) all-gather the partials and merge them on every rank.
   With `--cp-kv-gather-segment S` (`CPLayout.kv_gather_segment`), a PREFIX request's shard is
   read from the pool in rounds of at most S rows, each attended and merged by LSE, so the rows a
   rank materializes per layer stay bounded by S however long the prefix.
Counters / trace (tests): `CPLayout.probe` (`cp_probe.py`) sees the exchange start and wait and
the rows of each prefix round.

The per-batch metadata (`CPAttnMetadata`) is built by `build_cp_attn_metadata` and kept by the
backend in its per-batch object; the functions here take it explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from sglang.srt.layers.attention.cp_merge import merge_partials
from sglang.srt.layers.attention.kv_source import KVGather, fetch, head_major_kv, kv_scales, widen_kv
from sglang.srt.layers.attention.ops import causal_attention_lse, merge_state, sdpa_lse
from sglang.srt.layers.context_parallel import FRESH, PREFIX, CPLayout, GatherSpec, start_gather

if TYPE_CHECKING:
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class _FreshItem:
    global_start: int
    num_tokens: int
    local_start: int
    local_count: int
    q_pos: torch.Tensor  # [local_count] offsets (== positions) of the local queries


@dataclass
class _ShardItem:
    b_start: int  # first row in the B-query list
    num_tokens: int
    q_pos: torch.Tensor  # [n] absolute positions of the request's new tokens
    k_slots: torch.Tensor  # physical slots of this rank's KV shard of the request (ascending position)
    k_pos: torch.Tensor


@dataclass
class CPAttnMetadata:
    own_global_idx: torch.Tensor  # new tokens this rank stores ...
    own_slots: torch.Tensor  # ... and where (physical slots)
    fresh: list[_FreshItem]
    prefix: list[_ShardItem]  # PREFIX requests (queries gathered)
    single_rows: Optional[torch.Tensor]  # [n1] B rows of the REPLICATED requests
    single_slots: Optional[torch.Tensor]  # [n1, max_len] physical slots (0 = padding)
    single_mask: Optional[torch.Tensor]  # [n1, 1, 1, max_len] bool
    b_global_idx: torch.Tensor  # [NB] global flat index of every B query (PREFIX + REPLICATED tokens)
    b_local_rows: torch.Tensor  # local rows that are B queries ...
    b_sel: torch.Tensor  # ... and their index into the B list
    repl_local_rows: torch.Tensor  # local rows of replicated tokens ...
    repl_global_idx: torch.Tensor  # ... and their global index
    repl_b_rows: torch.Tensor  # local rows of replicated B queries (not unsplit FRESH tokens) ...
    repl_b_idx: torch.Tensor  # ... and their index into the B list
    q_spec: Optional[GatherSpec]  # gather spec of the split B queries (None: none)
    gathered_b_idx: Optional[torch.Tensor]  # index into the B list of each gathered query
    b_holders: Optional[torch.Tensor]  # [NB] rank holding each B query (None: some are replicated)


def _shard_of(layout: CPLayout, virtual_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(physical slots, positions) of the entries of a request's virtual slot row owned here."""
    owner, local = layout.slot_mapping.to_physical(virtual_row)
    mine = torch.nonzero(owner == layout.cp_rank).flatten()
    return local[mine], mine


def build_cp_attn_metadata(fb: "ForwardBatch", layout: CPLayout) -> CPAttnMetadata:
    """This rank's view of the batch for CP attention (computed from data identical on all ranks)."""
    if layout.slot_mapping is None or layout.group is None:
        raise ValueError("a CP layout used for attention needs its group and slot mapping")
    table = fb.req_to_token_pool.req_to_token
    dev = table.device
    mapping = layout.slot_mapping
    owner, local = mapping.to_physical(fb.out_cache_loc.to(torch.int64))
    if not torch.equal(owner, mapping.position_owner(fb.positions.to(owner.device))):
        raise RuntimeError("CP: KV slots are not aligned to virtual pages (slot owner != position owner)")
    own_global_idx = torch.nonzero(owner == layout.cp_rank).flatten()
    own_slots = local[own_global_idx]
    rows = fb.req_pool_indices.tolist()
    fresh, prefix, singles = [], [], []
    b_parts: list[torch.Tensor] = []
    b_start = 0
    for i, kind in enumerate(layout.kinds):
        g, n, pre = layout.starts[i], layout.ext_lens[i], layout.prefix_lens[i]
        if kind == FRESH:
            fresh.append(
                _FreshItem(g, n, layout.local_starts[i], layout.local_counts[i], layout.local_offsets[i])
            )
            continue
        b_parts.append(torch.arange(g, g + n, dtype=torch.int64))
        if kind == PREFIX:
            slots, pos = _shard_of(layout, table[rows[i], : pre + n].to(torch.int64))
            prefix.append(_ShardItem(b_start, n, torch.arange(pre, pre + n, dtype=torch.int64), slots, pos))
        else:
            singles.append((b_start, rows[i], pre + n))
        b_start += n
    b_global_idx = torch.cat(b_parts) if b_parts else torch.empty(0, dtype=torch.int64)
    single_rows = single_slots = single_mask = None
    if singles:  # vectorized: the positions a rank owns are the same for every request
        single_rows = torch.tensor([s for s, _, _ in singles], dtype=torch.int64)
        lens = [mapping.local_token_count(seq, layout.cp_rank) for _, _, seq in singles]
        max_len = max(lens)
        all_pos = torch.arange(max(seq for _, _, seq in singles), device=dev)
        owned_pos = torch.nonzero(mapping.position_owner(all_pos) == layout.cp_rank).flatten()[:max_len]
        req_rows = torch.tensor([r for _, r, _ in singles], dtype=torch.int64, device=dev)
        virtual = table.index_select(0, req_rows).index_select(1, owned_pos)
        valid = torch.arange(max_len, device=dev).unsqueeze(0) < torch.tensor(lens, device=dev).unsqueeze(1)
        single_slots = mapping.local_slot(virtual).masked_fill(~valid, 0)
        single_mask = valid[:, None, None, :]
    # where the B queries live locally
    b_pos = torch.full((layout.num_tokens,), -1, dtype=torch.int64)
    b_pos[b_global_idx] = torch.arange(b_global_idx.numel())
    local_b = b_pos[layout.local_idx]
    b_local_rows = torch.nonzero(local_b >= 0).flatten()
    repl_local_rows = torch.nonzero(layout.holder_rank[layout.local_idx] < 0).flatten()
    repl_global_idx = layout.local_idx[repl_local_rows]
    repl_b = b_pos[repl_global_idx]  # -1: a token of an unsplit FRESH request, not a B query
    repl_is_b = repl_b >= 0
    q_spec = gathered_b_idx = b_holders = None
    held_by = layout.holder_rank[b_global_idx]
    if bool((held_by >= 0).any()):
        q_spec = layout.gather_spec(b_global_idx)
        gathered_b_idx = b_pos[q_spec.global_idx]
    if b_global_idx.numel() and bool((held_by >= 0).all()):
        b_holders = held_by
    return CPAttnMetadata(
        own_global_idx,
        own_slots,
        fresh,
        prefix,
        single_rows,
        single_slots,
        single_mask,
        b_global_idx,
        b_local_rows,
        local_b[b_local_rows],
        repl_local_rows,
        repl_global_idx,
        repl_local_rows[repl_is_b],
        repl_b[repl_is_b],
        q_spec,
        gathered_b_idx,
        b_holders,
    )


# ---------------------------------------------------------------------------- K/V exchange
def start_kv_exchange(layout: CPLayout, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Start the async all-gather of this layer's split-token k/v (call as soon as k is rotated)."""
    if layout.is_trivial or layer_id in layout.pending:
        return
    _start_kv_gather(layout, layer_id, k, v, True)


def _full_kv(k3, v3, layer_id, layout, md) -> tuple[torch.Tensor, torch.Tensor]:
    """New K/V of the whole batch in original order: gathered split tokens + local replicated ones."""
    if layout.is_trivial:
        return k3, v3  # every token is local and the local order is the global one
    if layer_id not in layout.pending:
        _start_kv_gather(layout, layer_id, k3, v3, False)
    gathered = layout.pending.pop(layer_id).wait()
    kd = k3.shape[1] * k3.shape[2]
    spec = layout.split_spec()
    dev = k3.device
    k_full = k3.new_empty((layout.num_tokens,) + tuple(k3.shape[1:]))
    v_full = v3.new_empty((layout.num_tokens,) + tuple(v3.shape[1:]))
    if spec.total:
        idx = spec.global_idx.to(dev)
        k_full.index_copy_(0, idx, gathered[:, :kd].reshape((-1,) + tuple(k3.shape[1:])))
        v_full.index_copy_(0, idx, gathered[:, kd:].reshape((-1,) + tuple(v3.shape[1:])))
    if md.repl_local_rows.numel():
        ridx, lrows = md.repl_global_idx.to(dev), md.repl_local_rows.to(dev)
        k_full.index_copy_(0, ridx, k3.index_select(0, lrows))
        v_full.index_copy_(0, ridx, v3.index_select(0, lrows))
    return k_full, v_full


def _start_kv_gather(layout: CPLayout, layer_id: int, k: torch.Tensor, v: torch.Tensor, early: bool) -> None:
    spec = layout.split_spec()
    rows = spec.local_rows.to(k.device)
    # flatten(1), not reshape(n, -1): a rank may hold no tokens (n == 0)
    packed = torch.cat([k.flatten(1).index_select(0, rows), v.flatten(1).index_select(0, rows)], dim=1)
    pending = layout.pending[layer_id] = start_gather(layout.group, packed, spec.sizes)
    if layout.probe is not None:
        layout.probe.started(layer_id, pending, early)


# ---------------------------------------------------------------------------- forward
def cp_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: "RadixAttention",
    fb: "ForwardBatch",
    layout: CPLayout,
    md: CPAttnMetadata,
    save_kv_cache: bool = True,
    fresh_attention: Optional[Callable[..., Optional[torch.Tensor]]] = None,
) -> torch.Tensor:
    """CP attention of this rank's local tokens; returns [num_local, heads * v_head_dim].
    `fresh_attention` (a backend's fused kernels, `cpu_cp_fresh.py`) runs the FRESH requests'
    attention where it can (None back: the reference `causal_attention_lse`)."""
    n_local = q.shape[0]
    h, hk, d, dv = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.v_head_dim
    q3 = q.reshape(n_local, h, d)
    k3, v3 = k.reshape(n_local, hk, d), v.reshape(n_local, hk, dv)
    k_full, v_full = _full_kv(k3, v3, layer.layer_id, layout, md)

    pool = fb.token_to_kv_pool
    if save_kv_cache and md.own_global_idx.numel():
        own = md.own_global_idx.to(q.device)
        pool.set_kv_buffer(
            layer.layer_id, md.own_slots, k_full.index_select(0, own), v_full.index_select(0, own)
        )

    q_pending = None
    if md.q_spec is not None:  # split B queries: gather them while the FRESH work runs
        spec = md.q_spec
        q_pending = start_gather(layout.group, q3.index_select(0, spec.local_rows.to(q.device)), spec.sizes)

    out = q.new_empty((n_local, h, dv))
    for it in md.fresh:
        if it.local_count == 0:
            continue
        kf = k_full[it.global_start : it.global_start + it.num_tokens]
        vf = v_full[it.global_start : it.global_start + it.num_tokens]
        qs = q3[it.local_start : it.local_start + it.local_count]
        o = None if fresh_attention is None else fresh_attention(qs, it.q_pos, kf, vf, layer.scaling)
        if o is None:
            o, _ = causal_attention_lse(qs, it.q_pos, kf, vf, torch.arange(it.num_tokens), layer.scaling)
        out[it.local_start : it.local_start + it.local_count] = o

    nb = int(md.b_global_idx.numel())
    if nb:
        _shard_attention(q3, q_pending, layer, fb, layout, md, out)
    return out.reshape(n_local, h * dv)


def _b_queries(q3, q_pending, layout: CPLayout, md: CPAttnMetadata) -> torch.Tensor:
    """Every B query (PREFIX + REPLICATED tokens) in B order."""
    nb = int(md.b_global_idx.numel())
    qb = q3.new_empty((nb,) + tuple(q3.shape[1:]))
    dev = q3.device
    repl = md.repl_b_rows
    if repl.numel():
        qb.index_copy_(0, md.repl_b_idx.to(dev), q3.index_select(0, repl.to(dev)))
    if q_pending is not None:
        gathered = q_pending.wait()
        if gathered.shape[0]:
            qb.index_copy_(0, md.gathered_b_idx.to(dev), gathered)
    return qb


def _prefix_shard_attention(q, it: _ShardItem, k_cache, v_cache, layer, layout: CPLayout, scales):
    """(out, lse) of a PREFIX request's queries over this rank's KV shard of it, read from the pool
    (widened times the layer's (key, value) `scales`) in rounds of at most `layout.kv_gather_segment`
    rows (0: one round), merged by LSE."""
    total = int(it.k_slots.numel())
    segment = layout.kv_gather_segment if layout.kv_gather_segment > 0 else max(total, 1)
    acc = None
    for a in range(0, max(total, 1), segment):
        b = min(total, a + segment)
        src = KVGather(it.k_slots[a:b].to(k_cache.device))
        ks = widen_kv(fetch(k_cache, src, None, "k").transpose(0, 1), q.dtype, scales[0])  # [rows, Hk, D]
        vs = widen_kv(fetch(v_cache, src, None, "v").transpose(0, 1), q.dtype, scales[1])
        if layout.probe is not None:
            row_bytes = (ks.shape[1] * ks.shape[2] + vs.shape[1] * vs.shape[2]) * ks.element_size()
            layout.probe.prefix_round(b - a, b - a, row_bytes)
        part = causal_attention_lse(q, it.q_pos, ks, vs, it.k_pos[a:b], layer.scaling)
        acc = part if acc is None else merge_state([acc[0], part[0]], [acc[1], part[1]])
    return acc


def _shard_attention(
    q3, q_pending, layer, fb, layout: CPLayout, md: CPAttnMetadata, out: torch.Tensor
) -> None:
    """Partial attention of all B queries over this rank's KV shard, exchanged and merged."""
    qb = _b_queries(q3, q_pending, layout, md)
    nb, h, dv = qb.shape[0], qb.shape[1], layer.v_head_dim
    pool = fb.token_to_kv_pool
    k_cache, v_cache = head_major_kv(pool, layer.layer_id)  # [Hk, rows, D]
    scales = kv_scales(pool, layer.layer_id)
    part_o = qb.new_zeros((nb, h, dv))
    part_l = torch.full((nb, h), float("-inf"), dtype=torch.float32, device=qb.device)
    for it in md.prefix:
        rows = slice(it.b_start, it.b_start + it.num_tokens)
        part_o[rows], part_l[rows] = _prefix_shard_attention(
            qb[rows], it, k_cache, v_cache, layer, layout, scales
        )
    if md.single_rows is not None:
        n1, max_len = md.single_slots.shape
        src = KVGather(md.single_slots.reshape(-1).to(k_cache.device))
        hk, dk, dv_ = k_cache.shape[0], k_cache.shape[2], v_cache.shape[2]  # explicit: max_len may be 0
        ks = widen_kv(
            fetch(k_cache, src, None, "k").view(hk, n1, max_len, dk).transpose(0, 1), qb.dtype, scales[0]
        )
        vs = widen_kv(
            fetch(v_cache, src, None, "v").view(hk, n1, max_len, dv_).transpose(0, 1), qb.dtype, scales[1]
        )
        rows = md.single_rows.to(qb.device)
        o, l = sdpa_lse(
            qb.index_select(0, rows).unsqueeze(2), ks, vs, layer.scaling, attn_mask=md.single_mask
        )
        part_o.index_copy_(0, rows, o.squeeze(2))
        part_l.index_copy_(0, rows, l.squeeze(2))
    mine, merged = merge_partials(layout, part_o, part_l, md.b_holders)
    if mine is not None:  # split queries: this rank merged its own
        if mine.numel():
            rows = layout.holder_row[md.b_global_idx[mine]].to(out.device)
            out.index_copy_(0, rows, merged.to(out.dtype))
        return
    if md.b_local_rows.numel():
        mine = merged.index_select(0, md.b_sel.to(out.device)).to(out.dtype)
        out.index_copy_(0, md.b_local_rows.to(out.device), mine)
