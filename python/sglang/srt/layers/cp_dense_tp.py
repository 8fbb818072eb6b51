"""Embedding and LM head vocab-sharded over the CP group (`--enable-cp-dense-tp`, seed 002's
prefill layout: "Embedding TP + AllReduce", "LM Head TP with an all-gather over the whole CP
domain, tokens restored to their original order").

With tp = cp (attention TP 1) the cp ranks hold different tokens of one batch, so by default
(`communicator.embedding_tp_group`) each rank keeps the whole embedding table and LM head. With
the flag both are split over the cp group like plain TP (1/cp of the vocabulary rows per rank)
and the rows move instead:

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from sglang.srt.layers.cp_exchange import exchange_to_holders, start_gather

if TYPE_CHECKING:
    from sglang.srt.layers.context_parallel import CPLayout
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
