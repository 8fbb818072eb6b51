"""Embedding, LM head and o_proj sharded over the CP group (`--enable-cp-dense-tp`, seed 002's
prefill layout: "Embedding TP + AllReduce", "O_proj locally TP-sharded, AlltoAll before and
ReduceScatter after", "LM Head TP with an all-gather over the whole CP domain, tokens restored
to their original order").

With tp = cp (attention TP 1) the cp ranks hold different tokens of one batch, so by default
(`communicator.embedding_tp_group`, attention projections over attn_tp) each rank keeps the whole
embedding table, LM head and every layer's o_proj. With the flag they are split over the cp
group like plain TP (1/cp of the vocabulary rows, 1/cp of o_proj's input columns per rank) and
the rows move instead:

- embedding (`embed_to_local_rows`): every rank looks up every token of the batch in its vocab
  range (zeros elsewhere, the ids are on every rank before the CP split); the partial rows of a
  split token are summed at its holder by one all-to-all (`cp_exchange.exchange_to_holders`,
  cp× fewer bytes than an all-reduce of every row); rows every rank holds (unsplit prompts,
  replicated decodes) are all-reduced. One partial per token is non-zero, so the rows are
  bit-identical to an unsharded lookup.
- LM head under a split decode (`communicator.cp_logits_split`; `sharded_local_logits`): the
  hidden rows of the split last tokens are all-gathered (rank order), every rank computes its
  vocab slice of all of them, and one all-to-all sends each holder the slices of its rows, so it
  ends with the same full-vocabulary rows as without the flag (`CPLocalLogits`: it samples its
  own rows, `layers/sampler_cp.py`). Rows every rank holds get their slices all-gathered. Per
  decode step a rank receives its rows' (cp-1)/cp of the vocabulary instead of all rows' vocab.
  Batches that assemble the logits on every rank (all-token logits, `split_decodes=False`)
  gather the hidden rows first (`gather_for_logits`) and use the head's own vocab all-gather.
- o_proj (`head_sharded_o_proj`, called by the attention blocks: `models/llama.py`,
  `layers/attention/mla.py`): an all-to-all trades tokens for heads, each rank projects every
  split token's columns of its heads, and an all-to-all returns the partial rows to their
  holders, which sum them (a reduce-scatter onto the token layout); rows every rank holds are
  all-reduced. Summation order differs from one GEMM (float32: within 1e-6 here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from sglang.srt.layers.cp_exchange import exchange_to_holders, start_gather

if TYPE_CHECKING:
    from sglang.srt.layers.context_parallel import CPLayout
    from sglang.srt.layers.linear import RowParallelLinear
    from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding


def _check_group(module_tp_size: int, cp: "CPLayout", what: str) -> None:
    if module_tp_size != cp.cp_size:
        raise ValueError(f"{what} is sharded over {module_tp_size} ranks, the cp group has {cp.cp_size}")


def embed_to_local_rows(
    embedding: "VocabParallelEmbedding", input_ids: torch.Tensor, cp: "CPLayout"
) -> torch.Tensor:
    """Every token's ids of the batch (original order) -> this rank's rows of their embeddings
    ([cp.num_local, dim], local order), the table vocab-sharded over the cp group."""
    _check_group(embedding.tp_size, cp, "the embedding")
    part = embedding.partial(input_ids)
    dev = part.device
    out = part.new_empty((cp.num_local, part.shape[1]))
    split = cp.holder_rank >= 0
    idx = torch.nonzero(split).flatten()
    if idx.numel():  # identical on every rank (the layout is)
        mine, recv = exchange_to_holders(cp.group, part.index_select(0, idx.to(dev)), cp.holder_rank[idx])
        out.index_copy_(0, cp.holder_row[idx[mine]].to(dev), recv.sum(0))
    repl = torch.nonzero(~split).flatten()
    if repl.numel():
        rows = cp.group.all_reduce(part.index_select(0, repl.to(dev)).contiguous())
        out.index_copy_(0, cp.holder_row[repl].to(dev), rows)
    return out


def sharded_local_logits(hidden: torch.Tensor, lm_head: "ParallelLMHead", cp: "CPLayout") -> torch.Tensor:
    """`hidden`: the rows `gather_for_logits` gives under a split decode (this rank's split last
    tokens in request order, then the last tokens every rank holds) -> their full-vocabulary
    logits, the LM head vocab-sharded over the cp group (see the module docstring)."""
    _check_group(lm_head.tp_size, cp, "the LM head")
    spec = cp.last_tokens_spec()
    n_split, width = spec.sizes[cp.cp_rank], lm_head.num_embeddings_per_partition
    parts = []
    if spec.total:  # every split last token's hidden row, rank order, then this rank's vocab slice
        gathered = start_gather(cp.group, hidden[:n_split], spec.sizes).wait()
        shard = lm_head.local_logits(gathered).contiguous()
        recv = shard.new_empty((cp.cp_size * n_split, width))
        dist.all_to_all_single(
            recv, shard, [n_split] * cp.cp_size, list(spec.sizes), group=cp.group.device_group
        )
        # recv[q] = rank q's vocab slice of this rank's rows: slices side by side, rank order
        parts.append(
            recv.view(cp.cp_size, n_split, width).transpose(0, 1).reshape(n_split, cp.cp_size * width)
        )
    if hidden.shape[0] > n_split:  # rows every rank holds (the same count on every rank)
        parts.append(cp.group.all_gather(lm_head.local_logits(hidden[n_split:]).contiguous(), dim=-1))
    if not parts:
        return hidden.new_empty((0, lm_head.num_embeddings))
    logits = torch.cat(parts) if len(parts) > 1 else parts[0]
    return logits[:, : lm_head.num_embeddings]


def head_sharded_o_proj(
    x: torch.Tensor, o_proj: "RowParallelLinear", cp: Optional["CPLayout"]
) -> torch.Tensor:
    """o_proj row-parallel over the cp group (its input columns, i.e. the heads, split; seed 002:
    "O_proj locally TP-sharded, an all-to-all before and a reduce-scatter after"). `x`: this rank's
    tokens with every head [num_local, heads · head_dim]; `o_proj`: sharded over the cp ranks,
    unreduced (bias on rank 0). Returns this rank's rows of the complete projection.

    Split tokens: one all-to-all trades tokens for heads (each rank gets every split token's
    columns of its heads, rank order), the partial projection of all of them, and one all-to-all
    sends each holder the partials of its rows, summed there (a reduce-scatter onto the token
    layout). Rows every rank holds: its heads' partial, all-reduced."""
    group = o_proj.tp
    width = o_proj.input_size_per_partition
    cols = slice(o_proj.tp_rank * width, (o_proj.tp_rank + 1) * width)
    if cp is None:  # no CP layout: every rank holds every token
        return group.all_reduce(o_proj(x[:, cols].contiguous()))
    _check_group(o_proj.tp_size, cp, "o_proj")
    size, dev = cp.cp_size, x.device
    out = x.new_empty((x.shape[0], o_proj.weight.shape[0]))
    spec = cp.split_spec()
    if spec.total:  # identical on every rank (the layout is)
        n = spec.sizes[cp.cp_rank]
        rows = spec.local_rows.to(dev)
        send = x.index_select(0, rows).view(n, size, width).transpose(0, 1).contiguous()
        heads = x.new_empty((spec.total, width))
        dist.all_to_all_single(
            heads, send.view(size * n, width), list(spec.sizes), [n] * size, group=cp.group.device_group
        )
        partial = o_proj(heads).contiguous()
        back = partial.new_empty((size * n, partial.shape[1]))
        dist.all_to_all_single(back, partial, [n] * size, list(spec.sizes), group=cp.group.device_group)
        out.index_copy_(0, rows, back.view(size, n, partial.shape[1]).sum(0))
    repl = torch.nonzero(cp.holder_rank[cp.local_idx] < 0).flatten()
    if repl.numel():  # the same tokens, in the same order, on every rank
        repl = repl.to(dev)
        part = o_proj(x.index_select(0, repl)[:, cols].contiguous())
        out.index_copy_(0, repl, cp.group.all_reduce(part))
    return out
