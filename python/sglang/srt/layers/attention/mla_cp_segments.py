"""Context-parallel latent attention of extends over a long cached prefix, segment by segment.

With `--cp-kv-gather-segment S` a batch whose PREFIX requests hold more than S cached rows in
all does not gather its whole prefix at once (`mla_cp_metadata.PrefixRound`): each round gathers
at most S rows of the flat prefix buffer from the ranks that store them, every rank attends its
own queries of each request to the round's rows, and the partial results (out, lse) are merged
exactly (`ops.merge_state`, online softmax) before the next round; the request's new rows (the
chunk, gathered by the early exchange) are attended last, causally. Peak gathered rows per rank:
S (plus the chunk), whatever the prefix length.

DSA keeps the indexer's top-k exact: a first pass gathers the index keys round by round and keeps
each query's running top-k candidates (score, position), merged in the selection's total order
(higher score, then the earlier position: the top-k of a union is the top-k of the parts' top-ks);
the new rows' keys are scored last, causally. On the `dsa` backend the scores come from its op at
the chosen precision (`SGLANG_DSA_INDEX_SCORE_DTYPE`: float32, bfloat16 or int8; per-row
quantization, so a key's score does not depend on the round it is in), as in the unsegmented
path; otherwise from the float32 reference. A second pass gathers the latent rows round by round
and attends each query to its selected positions inside the round (`sparse_latent_attention`, or
the DSA backend's `attend_slots`), merged by LSE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

import torch

from sglang.srt.layers.attention.dsa.cp_indexer import shard_topk_candidates
from sglang.srt.layers.attention.dsa.scoring import select_topk
from sglang.srt.layers.attention.dsa.sparse_attention import sparse_latent_attention
from sglang.srt.layers.attention.kv_source import kv_scales, widen_kv
from sglang.srt.layers.attention.mla_cp_metadata import CPExtend, MLACPMetadata, PrefixRound
from sglang.srt.layers.attention.ops import causal_attention_lse, merge_state
from sglang.srt.layers.context_parallel import CPLayout, start_gather

if TYPE_CHECKING:
    from sglang.srt.layers.attention.dsa.indexer import Indexer
    from sglang.srt.layers.attention.dsa.kernels import DSAKernels
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.model_executor.forward_batch import ForwardBatch

Partial = tuple[torch.Tensor, torch.Tensor]
_NO_POS = torch.iinfo(torch.int64).max


def gather_round(
    fb: "ForwardBatch", layout: CPLayout, layer_id: int, rnd: PrefixRound, index: bool, dtype: torch.dtype
) -> torch.Tensor:
    """The round's cached rows [end - start, W] in flat prefix order: latent rows, or (`index`)
    the index keys, all-gathered from the ranks that store them."""
    pool = fb.token_to_kv_pool
    if index:  # (FP8 index keys: widened with their block scales)
        send = pool.index_k_rows(layer_id, rnd.my_slots).to(dtype)
    else:  # latent rows may be FP8 (scaled)
        kv = pool.get_key_buffer(layer_id)
        buf = kv.view(kv.shape[0], -1)
        send = widen_kv(buf.index_select(0, rnd.my_slots.to(buf.device)), dtype, kv_scales(pool, layer_id)[0])
    gathered = start_gather(layout.group, send, rnd.sizes).wait()
    if layout.probe is not None:
        row_bytes = gathered.shape[1] * gathered.element_size()
        layout.probe.prefix_round(sum(rnd.sizes), layout.cp_size * max(rnd.sizes), row_bytes)
    out = gathered.new_empty((rnd.end - rnd.start, gathered.shape[1]))
    out.index_copy_(0, rnd.dst.to(out.device), gathered)
    return out


def _in_round(rnd: PrefixRound, md: MLACPMetadata) -> Iterator[tuple[int, CPExtend, slice, int, int, int]]:
    """(extend index, extend, its local query rows, first row in the round, first prefix position,
    rows) of every extend with local queries and prefix rows in the round."""
    for j, it in enumerate(md.extends):
        lo, hi = max(rnd.start, it.prefix_offset), min(rnd.end, it.prefix_offset + it.prefix_len)
        if it.local_count and lo < hi:
            loc = slice(it.local_start, it.local_start + it.local_count)
            yield j, it, loc, lo - rnd.start, lo - it.prefix_offset, hi - lo


def _merge(acc: Optional[Partial], part: Partial) -> Partial:
    return part if acc is None else merge_state([acc[0], part[0]], [acc[1], part[1]])


def _merge_candidates(acc: Optional[Partial], part: Partial, k: int) -> Partial:
    """Running top-k (values, positions) of a union, in the selection's total order. `part` holds
    later positions than `acc` (rounds go in position order) and each is in that order already,
    so one stable sort by value of acc + part keeps ties at the earlier position."""
    if acc is None:
        return part
    vals, pos = torch.cat((acc[0], part[0]), dim=1), torch.cat((acc[1], part[1]), dim=1)
    v, idx = select_topk(vals, min(k, vals.shape[1]))
    return v, pos.gather(1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def _candidates(kernels: Optional["DSAKernels"], q, w, keys, p0: int, topk: int, scale: float, q_pos=None):
    """Top-k (values, positions) of queries over keys [n, D] at positions p0.. (all visible, or
    causal by `q_pos`): the DSA backend's op at its scoring precision (`index_score_dtype`, as
    the unsegmented path), or the float32 reference."""
    if kernels is not None:
        return kernels.range_topk_candidates(q, w, keys, p0, topk, scale, q_pos)
    kpos = torch.arange(p0, p0 + keys.shape[0], device=keys.device).unsqueeze(0)
    if q_pos is None:
        vis = torch.ones((q.shape[0], keys.shape[0]), dtype=torch.bool, device=keys.device)
    else:
        vis = kpos <= q_pos.to(keys.device).unsqueeze(1)
    return shard_topk_candidates(q, w, keys.unsqueeze(0), kpos, vis, topk, scale)


def _select(
    indexer: "Indexer", iq, iw, full, dim: int, fb, layout: CPLayout, md: MLACPMetadata, kernels=None
) -> dict:
    """Exact top-k positions [m, <= topk] of each extend's own queries (extend index -> positions,
    sorted ascending, padding past every position)."""
    topk, scale = indexer.index_topk, indexer.softmax_scale
    cand: dict[int, Partial] = {}
    for rnd in md.rounds:
        keys = gather_round(fb, layout, indexer.layer_id, rnd, True, full.dtype)
        for j, it, loc, row, p0, n in _in_round(rnd, md):
            part = _candidates(kernels, iq[loc], iw[loc], keys[row : row + n], p0, topk, scale)
            cand[j] = _merge_candidates(cand.get(j), part, topk)
        del keys
    out = {}
    for j, it in enumerate(md.extends):
        if it.local_count == 0:
            continue
        loc = slice(it.local_start, it.local_start + it.local_count)
        keys = full[it.global_start : it.global_start + it.num_tokens, dim:]
        part = _candidates(kernels, iq[loc], iw[loc], keys, it.prefix_len, topk, scale, it.q_pos)
        pos = _merge_candidates(cand.get(j), part, topk)[1]
        out[j] = pos.masked_fill(pos < 0, _NO_POS).sort(dim=1).values  # ascending, padding last
        indexer.count(it.local_count, int((it.q_pos + 1).sum()))
    return out


def _in_range(sel: torch.Tensor, p0: int, p1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected positions in [p0, p1) of each query: (columns [m, w] - p0, valid [m, w]), w the
    most any query has there. `sel` [m, K] is sorted ascending (-1 padding mapped past every position)."""
    lo = torch.searchsorted(sel, torch.full((sel.shape[0], 1), p0, device=sel.device))
    hi = torch.searchsorted(sel, torch.full((sel.shape[0], 1), p1, device=sel.device))
    count = (hi - lo).squeeze(1)
    width = int(count.max()) if count.numel() else 0
    cols = torch.arange(width, device=sel.device).unsqueeze(0)
    valid = cols < count.unsqueeze(1)
    idx = (lo + cols).clamp(max=max(sel.shape[1] - 1, 0))
    return (sel.gather(1, idx) - p0).masked_fill(~valid, 0), valid


def _attend(core: "MLACore", q, q_pos, kv, p0: int, sel, kernels: Optional["DSAKernels"]) -> Partial:
    """(out [m, H, L], lse [m, H]) of queries q over rows kv [n, L + R] at positions p0..p0+n-1:
    causal (dense MLA), or only the selected positions `sel` [m, K] (sorted) among them (DSA)."""
    v_dim = core.kv_lora_rank
    if sel is None:
        k3 = kv.unsqueeze(1)
        kpos = torch.arange(p0, p0 + kv.shape[0])
        o, lse = causal_attention_lse(q, q_pos, k3, k3, kpos, core.scaling)
        return o[..., :v_dim].contiguous(), lse
    idx, valid = _in_range(sel, p0, p0 + kv.shape[0])
    if idx.shape[1] == 0:  # no query selected a row of this range
        heads = q.shape[1]
        return q.new_zeros((q.shape[0], heads, v_dim)), q.new_full((q.shape[0], heads), float("-inf")).float()
    if kernels is not None:
        return kernels.attend_slots(q, kv.contiguous(), idx, valid, core.scaling, v_dim)
    return sparse_latent_attention(q, kv, idx, valid, core.scaling, v_dim, return_lse=True)


def segmented_extends(
    core: "MLACore",
    q: torch.Tensor,
    full: torch.Tensor,
    fb: "ForwardBatch",
    layout: CPLayout,
    md: MLACPMetadata,
    out: torch.Tensor,
    indexer: Optional["Indexer"] = None,
    index_qw: Optional[Partial] = None,
    kernels: Optional["DSAKernels"] = None,
) -> None:
    """Every extend's own queries over its prefix (gathered round by round) and its new rows
    `full` [N, W]; writes out [n, H, L]. `indexer` (with its queries `index_qw`): DSA."""
    dim = core.head_dim
    sel = _select(indexer, *index_qw, full, dim, fb, layout, md, kernels) if indexer is not None else {}
    acc: dict[int, Partial] = {}
    for rnd in md.rounds:
        rows = gather_round(fb, layout, core.layer_id, rnd, False, full.dtype)[:, :dim]
        for j, it, loc, row, p0, n in _in_round(rnd, md):
            part = _attend(core, q[loc], it.q_pos, rows[row : row + n], p0, sel.get(j), kernels)
            acc[j] = _merge(acc.get(j), part)
        del rows
    for j, it in enumerate(md.extends):
        if it.local_count == 0:
            continue
        loc = slice(it.local_start, it.local_start + it.local_count)
        kv = full[it.global_start : it.global_start + it.num_tokens, :dim]
        part = _attend(core, q[loc], it.q_pos, kv, it.prefix_len, sel.get(j), kernels)
        out[loc] = _merge(acc.pop(j, None), part)[0].to(out.dtype)
