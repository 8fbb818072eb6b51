"""Token layouts between the parts of a decoder layer: the ONE place where tokens change layout.

Scatter modes (what a rank holds of the step's tokens, per hidden-state tensor):
- SCATTERED: this rank's context-parallel shard of its attention-DP replica's tokens (the split
  tokens it was dealt plus every replicated token; see `layers/context_parallel.py`). The ranks of
  one attn_tp group hold the same tokens. With cp = 1 this equals TP_ATTN_FULL.
- TP_ATTN_FULL: every token of this rank's replica, in original order.
- FULL: every token of every replica of the stage, replica 0's first (`ForwardBatch.dp` has the
  counts). With dp = 1 this equals TP_ATTN_FULL.

A decoder layer runs its attention in the attention layout (SCATTERED) and its MLP in the layout
of the group its weights are sharded over (`mlp_mode`): its own tokens when the MLP is replicated
across the ranks that hold different tokens (dense MLPs under CP: sharded over attn_tp; with DP
attention and `--moe-dense-tp-size 1`: replicated), every token of the replica when it is sharded
over a tp group of one replica (MoE under CP), every token of the stage when it is sharded over a
tp group that spans replicas (MoE, and dense MLPs by default, with DP attention). The attention's
o_proj leaves its sum over attn_tp to `LayerCommunicator.prepare_mlp`, which completes it by an
all-reduce over attn_tp, or, going TP_ATTN_FULL -> FULL, by the partial gather's all-reduce over
the whole tp group (`dp_attention.py`: the o_proj reduction and the gather in one collective). The
residual never leaves the attention layout; the MLP output comes back to it by a local slice.

The model entry (`scatter_model_input`) and exit (`gather_for_logits`) change layout between
TP_ATTN_FULL and SCATTERED; the logits processor moves its rows to FULL and back when the LM head
spans the replicas (`dp_gather_logit_rows`, `dp_scatter_logit_rows`). Under CP with split decodes
(`CPLayout.split_decodes`, no DP attention) the LM head runs on the last tokens this rank holds
each rank samples its own rows (`cp_logits_split`, `layers/sampler_cp.py`; `cp_gather_logits`
assembles the batch's logits where all of them are read): no rank computes another rank's logits.
With `--enable-cp-dense-tp` the embedding, LM head and o_proj are sharded over the cp group and
move rows between the ranks inside them (`layers/cp_dense_tp.py`); what goes in and comes out is
in the layouts above.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers.context_parallel import get_cp_layout, start_gather
from sglang.srt.layers.dp_attention import dp_gather, dp_scatter
from sglang.srt.layers.moe.ep_all_to_all import moe_all_to_all

if TYPE_CHECKING:
    from sglang.srt.layers.context_parallel import CPLayout
    from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class ScatterMode(Enum):
    SCATTERED = auto()
    TP_ATTN_FULL = auto()
    FULL = auto()


_WIDTH = {ScatterMode.SCATTERED: 0, ScatterMode.TP_ATTN_FULL: 1, ScatterMode.FULL: 2}


@dataclass(frozen=True)
class LayerScatterModes:
    layer_input: ScatterMode
    attn: ScatterMode
    mlp: ScatterMode
    layer_output: ScatterMode

    @classmethod
    def with_mlp(cls, mlp: ScatterMode) -> "LayerScatterModes":
        """Attention, layer input and output in this rank's tokens, the MLP in `mlp`."""
        s = ScatterMode.SCATTERED
        return cls(s, s, mlp, s)


# ---------------------------------------------------------------------------- weight groups
def embedding_tp_group(groups: "ParallelGroups") -> "GroupCoordinator":
    """Group the embedding is vocab-sharded over. The cp ranks of a replica, and the replicas,
    hold different tokens, so under CP or DP attention each attention-TP group embeds its own
    tokens (sharded over attn_tp); otherwise, and with `--enable-cp-dense-tp` (tp = cp: the cp
    group, which embeds every token of the batch, `layers/cp_dense_tp.py`), the stage's tp group."""
    lay = groups.layout
    if lay.cp_dense_tp:
        return groups.tp
    return groups.attn_tp if lay.attn_cp > 1 or lay.attn_dp > 1 else groups.tp


def lm_head_tp_group(groups: "ParallelGroups", tied: bool) -> "GroupCoordinator":
    """Group the LM head is vocab-sharded over: with DP attention the whole tp group (its rows are
    gathered across the replicas) unless `--enable-dp-lm-head` or the head is tied to the embedding
    (it must be sharded like the embedding's weight); otherwise the embedding's group."""
    lay = groups.layout
    if lay.attn_dp > 1 and not lay.dp_lm_head and not tied:
        return groups.tp
    return embedding_tp_group(groups)


def o_proj_cp_group(groups: "ParallelGroups") -> Optional["GroupCoordinator"]:
    """The cp group an attention block's o_proj is row-parallel over with `--enable-cp-dense-tp`
    (tp = cp: the stage's tp group; `layers/cp_dense_tp.head_sharded_o_proj`), else None (o_proj
    sharded over attn_tp with the other attention projections)."""
    return groups.tp if groups.layout.cp_dense_tp else None


def dense_mlp_tp_group(groups: "ParallelGroups") -> "GroupCoordinator":
    """Group a dense MLP is sharded over: with DP attention the whole tp group, or nobody
    (replicated) with `--moe-dense-tp-size 1`; under CP attn_tp (the cp ranks hold different
    tokens); otherwise the stage's tp group."""
    lay = groups.layout
    if lay.attn_dp > 1:
        return groups.local if lay.moe_dense_tp == 1 else groups.tp
    return groups.attn_tp if lay.attn_cp > 1 else groups.tp


def moe_mlp_group(groups: "ParallelGroups") -> "GroupCoordinator":
    """The group whose ranks must see the same tokens around an MoE block: the tp group (experts
    over moe_ep x moe_tp, one combine all-reduce), or this rank alone when an all-to-all dispatch
    moves each token to its experts (`ep_all_to_all.moe_all_to_all`: the MLP runs SCATTERED)."""
    return groups.local if moe_all_to_all(groups.layout) else groups.tp


def mlp_mode(mlp_group: "GroupCoordinator", groups: "ParallelGroups") -> ScatterMode:
    """The token layout an MLP sharded over `mlp_group` must see: every token that any rank of its
    group holds (the ranks of a sharded layer must run the same rows)."""
    lay = groups.layout
    if mlp_group.size == 1:
        return ScatterMode.SCATTERED
    if lay.attn_dp > 1 and mlp_group.size > groups.replica.size:
        return ScatterMode.FULL
    if lay.attn_cp > 1 and mlp_group.size > groups.attn_tp.size:
        return ScatterMode.TP_ATTN_FULL
    return ScatterMode.SCATTERED


# ---------------------------------------------------------------------------- layout changes
def _canonical(mode: ScatterMode, forward_batch: "ForwardBatch") -> ScatterMode:
    """Modes that hold the same rows in this batch are one (cp 1: SCATTERED = TP_ATTN_FULL; dp 1:
    TP_ATTN_FULL = FULL)."""
    if mode == ScatterMode.FULL and forward_batch.dp is None:
        mode = ScatterMode.TP_ATTN_FULL
    if mode == ScatterMode.TP_ATTN_FULL and get_cp_layout(forward_batch) is None:
        mode = ScatterMode.SCATTERED
    return mode


def change_layout(
    x: torch.Tensor,
    src: ScatterMode,
    dst: ScatterMode,
    forward_batch: "ForwardBatch",
    groups: "ParallelGroups",
) -> torch.Tensor:
    """Move the rows of `x` (complete values on every rank that holds them) from `src` to `dst`."""
    src, dst = _canonical(src, forward_batch), _canonical(dst, forward_batch)
    if src == dst:
        return x
    cp, dp = get_cp_layout(forward_batch), forward_batch.dp
    if _WIDTH[src] < _WIDTH[dst]:  # widen: CP gather, then DP gather
        if src == ScatterMode.SCATTERED and cp is not None:
            x = cp.gather_all(x)
        if dst == ScatterMode.FULL:
            x = dp_gather(x, dp.num_tokens, dp.replica, groups, partial=False)
        return x
    if src == ScatterMode.FULL:  # narrow: this replica's slice, then this rank's CP shard
        x = dp_scatter(x, dp.num_tokens, dp.replica)
    if dst == ScatterMode.SCATTERED and cp is not None:
        x = cp.scatter(x)
    return x


class LayerCommunicator:
    """Norms + layout changes around the attention and MLP of one decoder layer.

    `prepare_attn`: input norm (with the previous layer's residual add) in the attention layout.
    `prepare_mlp`: completes the attention output (its o_proj partial sum over attn_tp), adds the
    residual, post-attention norm, and widens the normed states to the MLP layout.
    `postprocess_layer`: the MLP output (complete: the MLP reduced over its own group) back to the
    attention layout."""

    def __init__(
        self,
        modes: LayerScatterModes,
        input_layernorm: torch.nn.Module,
        post_attention_layernorm: torch.nn.Module,
        groups: "ParallelGroups",
    ):
        if not (modes.layer_input == modes.attn == modes.layer_output == ScatterMode.SCATTERED):
            raise ValueError(
                f"layer input, attention and output run in this rank's tokens (SCATTERED), got {modes}"
            )
        self.modes = modes
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm
        self.groups = groups

    def prepare_attn(
        self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:  # the model's (or stage's) first layer starts the residual stream
            return self.input_layernorm(hidden_states), self.input_layernorm.residual_from(hidden_states)
        return self.input_layernorm(hidden_states, residual)

    def prepare_mlp(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states: this rank's attention output, a partial sum over attn_tp. Returns (the
        MLP's input in its layout, the new residual in the attention layout)."""
        mlp = _canonical(self.modes.mlp, forward_batch)
        if mlp == ScatterMode.FULL and self.groups.layout.attn_cp == 1:
            # partial gather: the o_proj reduction over attn_tp and the gather over the replicas in
            # one all-reduce; the residual is added once (by attn_tp rank 0) before it. Chosen by
            # the layout, never by the batch: every replica must bring the same kind of rows to the
            # all-reduce (an IDLE replica under CP has no CP layout but must still gather normed rows)
            # (a float32 residual stream is summed and gathered in the attention output's dtype here:
            # every replica, idle ones too, must bring one dtype to the all-reduce)
            dp = forward_batch.dp
            if self.groups.attn_tp.is_first:
                hidden_states = (hidden_states + residual).to(hidden_states.dtype)
            full = dp_gather(hidden_states, dp.num_tokens, dp.replica, self.groups, partial=True)
            residual_out = dp_scatter(full, dp.num_tokens, dp.replica).to(residual.dtype)
            return self.post_attention_layernorm(full), residual_out
        hidden_states = self.groups.attn_tp.all_reduce(hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return change_layout(hidden_states, self.modes.attn, mlp, forward_batch, self.groups), residual

    def postprocess_layer(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.modes
        return change_layout(hidden_states, m.mlp, m.layer_output, forward_batch, self.groups), residual


def make_layer_communicator(
    mlp_group: "GroupCoordinator",
    input_layernorm: torch.nn.Module,
    post_attention_layernorm: torch.nn.Module,
    groups: "ParallelGroups",
) -> LayerCommunicator:
    """The communicator of a decoder layer whose MLP is sharded over `mlp_group`
    (`dense_mlp_tp_group(groups)` for a dense MLP, `groups.tp` for MoE experts)."""
    modes = LayerScatterModes.with_mlp(mlp_mode(mlp_group, groups))
    return LayerCommunicator(modes, input_layernorm, post_attention_layernorm, groups)


# ---------------------------------------------------------------------------- model entry / exit
def scatter_model_input(
    input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ids / positions (TP_ATTN_FULL) -> this rank's tokens (SCATTERED)."""
    cp = get_cp_layout(forward_batch)
    if cp is None:
        return input_ids, positions
    cp.count("decode_rows", cp.num_local_decodes())
    return cp.scatter(input_ids), cp.scatter(positions)


def gather_for_logits(hidden_states: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
    """Final hidden states (SCATTERED) -> what the logits processor needs, in original order:
    every token when all logits are asked for, else each request's last token ([batch_size, hidden],
    which `LogitsProcessor` takes as already selected)."""
    cp = get_cp_layout(forward_batch)
    if cp is None:
        return hidden_states
    if forward_batch.return_all_logits:
        return cp.gather_all(hidden_states)
    spec = cp.last_tokens_spec()
    if cp_logits_split(forward_batch):  # this rank's last tokens only (`cp_gather_logits`)
        rows = spec.local_rows
        _, repl_rows = cp.replicated_last_tokens()
        if repl_rows.numel():  # unsplit prefills: every rank holds (and computes) their last token
            rows = torch.cat([rows, repl_rows])
        return hidden_states.index_select(0, rows.to(hidden_states.device))
    return cp.gather_rows(hidden_states, cp.last_token_idx(), spec)


def cp_logits_split(forward_batch: "ForwardBatch") -> bool:
    """True when the LM head runs only on the last tokens this rank holds (CP with split decodes,
    last-token logits, no DP attention): `gather_for_logits` returns those rows, in the order of
    `CPLayout.last_tokens_spec().local_rows`, and `cp_gather_logits` assembles the batch's logits."""
    cp = get_cp_layout(forward_batch)
    return (
        cp is not None
        and cp.split_decodes
        and not forward_batch.return_all_logits
        and forward_batch.dp is None
    )


def cp_gather_logits(logits: torch.Tensor, cp: "CPLayout") -> torch.Tensor:
    """This rank's logit rows (`cp_logits_split`: its split last tokens, then the replicated ones)
    -> [batch_size, vocab], request order, every rank (a vocab-wide all-gather: the engine samples
    each rank's rows where they are instead, `layers/sampler_cp.py`)."""
    spec = cp.last_tokens_spec()
    n_split = int(spec.local_rows.numel())
    out = logits.new_empty((cp.batch_size, logits.shape[1]))
    if spec.total:
        gathered = start_gather(cp.group, logits[:n_split], spec.sizes).wait()
        request_of = torch.full((cp.num_tokens,), -1, dtype=torch.int64)
        request_of[cp.last_token_idx()] = torch.arange(cp.batch_size)
        out.index_copy_(0, request_of[spec.global_idx].to(logits.device), gathered)
    reqs, _ = cp.replicated_last_tokens()
    if reqs.numel():
        out.index_copy_(0, reqs.to(logits.device), logits[n_split:])
    return out
