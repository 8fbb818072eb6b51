"""Token layouts between the parts of a decoder layer: the ONE place where tokens change layout.

Scatter modes (what a rank holds of the batch's tokens, per hidden-state tensor):
- SCATTERED: this rank's context-parallel shard of its attention-DP group's tokens (the split
  tokens it was dealt plus every replicated token; see `layers/context_parallel.py`). The ranks of
  one attn_tp group hold the same tokens. With cp = 1 this equals TP_ATTN_FULL.
- TP_ATTN_FULL: every token of this rank's attention-DP group, in original order.
- FULL: every token of the stage's batch (all attention-DP groups). With dp = 1 this equals
  TP_ATTN_FULL.

`LayerScatterModes` says which mode a layer's input, attention, MLP and output use;
`LayerCommunicator` applies the layer norms and the layout changes between them. A dense Llama
layer under CP stays SCATTERED throughout: attention weights are whole on every cp rank (the
heads are sharded over attn_tp only), the MLP is replicated across cp ranks and TP-sharded over
attn_tp (`dense_tp_group`), and it runs on local tokens only. The model entry
(`scatter_model_input`) and exit (`gather_for_logits`) change layout between TP_ATTN_FULL and
SCATTERED. DP attention / EP plug in by adding their transitions to `change_layout`.
MoE layers under CP (`LayerScatterModes.gathered_mlp`, `GatheredMLPCommunicator`): the experts are
sharded over the whole tp group (cp ranks included), so the normed hidden states are gathered to
TP_ATTN_FULL before the MoE block (which then combines with its usual all-reduce) and each rank
keeps its own rows after it; the residual never leaves the rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers.context_parallel import get_cp_layout

if TYPE_CHECKING:
    from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups, ParallelLayout
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class ScatterMode(Enum):
    SCATTERED = auto()
    TP_ATTN_FULL = auto()
    FULL = auto()


@dataclass(frozen=True)
class LayerScatterModes:
    layer_input: ScatterMode
    attn: ScatterMode
    mlp: ScatterMode
    layer_output: ScatterMode

    @classmethod
    def dense(cls) -> "LayerScatterModes":
        """A dense decoder layer (attention + dense MLP): tokens stay in their CP shard."""
        s = ScatterMode.SCATTERED
        return cls(s, s, s, s)

    @classmethod
    def gathered_mlp(cls) -> "LayerScatterModes":
        """A layer whose MLP is sharded over the whole tp group (MoE: EP / MoE-TP over the stage's
        tp ranks, cp ranks included): attention on this rank's tokens, the MLP on every token of
        the batch (every tp rank holds all of them, so the MoE combine stays one all-reduce)."""
        s = ScatterMode.SCATTERED
        return cls(s, s, ScatterMode.TP_ATTN_FULL, s)


def dense_tp_group(groups: "ParallelGroups") -> "GroupCoordinator":
    """Group over which dense (non-attention) weights are sharded: embedding, MLP, LM head.

    Under CP the cp ranks hold different tokens, so dense layers are replicated across them and
    sharded over attn_tp only; without CP this is the stage's tp group (unchanged pure TP)."""
    return groups.attn_tp if groups.layout.attn_cp > 1 else groups.tp


def _canonical(mode: ScatterMode, attn_dp: int) -> ScatterMode:
    if mode == ScatterMode.FULL and attn_dp == 1:
        return ScatterMode.TP_ATTN_FULL
    return mode


def change_layout(
    x: Optional[torch.Tensor], src: ScatterMode, dst: ScatterMode, forward_batch: "ForwardBatch", attn_dp: int = 1
) -> Optional[torch.Tensor]:
    """Move the rows of `x` from layout `src` to layout `dst` (collectives where needed)."""
    if x is None:
        return None
    src, dst = _canonical(src, attn_dp), _canonical(dst, attn_dp)
    if src == dst:
        return x
    cp = get_cp_layout(forward_batch)
    if {src, dst} == {ScatterMode.SCATTERED, ScatterMode.TP_ATTN_FULL}:
        if cp is None:  # cp = 1: the two modes coincide
            return x
        return cp.gather_all(x) if src == ScatterMode.SCATTERED else cp.scatter(x)
    raise NotImplementedError(f"layout change {src.name} -> {dst.name} needs DP attention (attn_dp={attn_dp})")


class LayerCommunicator:
    """Norms + layout changes around the attention and MLP of one decoder layer."""

    def __init__(
        self,
        modes: LayerScatterModes,
        input_layernorm: torch.nn.Module,
        post_attention_layernorm: torch.nn.Module,
        layout: Optional["ParallelLayout"] = None,
    ):
        self.modes = modes
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm
        self.attn_dp = layout.attn_dp if layout is not None else 1

    def _move(self, x, src, dst, fb):
        return change_layout(x, src, dst, fb, self.attn_dp)

    def prepare_attn(
        self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Input norm (with the residual add of the previous layer) and move to the attention layout."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        m = self.modes
        hidden_states = self._move(hidden_states, m.layer_input, m.attn, forward_batch)
        residual = self._move(residual, m.layer_input, m.attn, forward_batch)
        return hidden_states, residual

    def prepare_mlp(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Move the attention output to the MLP layout, then residual add + post-attention norm."""
        m = self.modes
        hidden_states = self._move(hidden_states, m.attn, m.mlp, forward_batch)
        residual = self._move(residual, m.attn, m.mlp, forward_batch)
        return self.post_attention_layernorm(hidden_states, residual)

    def postprocess_layer(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.modes
        hidden_states = self._move(hidden_states, m.mlp, m.layer_output, forward_batch)
        residual = self._move(residual, m.mlp, m.layer_output, forward_batch)
        return hidden_states, residual


class GatheredMLPCommunicator(LayerCommunicator):
    """`LayerCommunicator` for `LayerScatterModes.gathered_mlp()`-like modes where the MLP sees more
    tokens than attention: the post-attention norm runs in the attention layout and only the
    normed hidden states move to the MLP layout (one all-gather under CP); the residual stays in
    the attention layout, and the MLP output moves back to it (a local row selection)."""

    def prepare_mlp(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.modes
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self._move(hidden_states, m.attn, m.mlp, forward_batch), residual

    def postprocess_layer(
        self, hidden_states: torch.Tensor, residual: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.modes
        hidden_states = self._move(hidden_states, m.mlp, m.layer_output, forward_batch)
        return hidden_states, self._move(residual, m.attn, m.layer_output, forward_batch)


def make_layer_communicator(
    mlp_over_tp_group: bool,
    input_layernorm: torch.nn.Module,
    post_attention_layernorm: torch.nn.Module,
    groups: "ParallelGroups",
) -> LayerCommunicator:
    """The communicator of a decoder layer. Dense MLPs stay on this rank's tokens (replicated over
    cp, sharded over attn_tp); an MLP sharded over the whole tp group (`mlp_over_tp_group`: MoE
    experts over moe_ep x moe_tp) gets the whole batch under CP."""
    if mlp_over_tp_group and groups.layout.attn_cp > 1:
        return GatheredMLPCommunicator(
            LayerScatterModes.gathered_mlp(), input_layernorm, post_attention_layernorm, groups.layout
        )
    return LayerCommunicator(LayerScatterModes.dense(), input_layernorm, post_attention_layernorm, groups.layout)


# ---------------------------------------------------------------------------- model entry / exit
def scatter_model_input(
    input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ids / positions (TP_ATTN_FULL) -> this rank's tokens (SCATTERED)."""
    cp = get_cp_layout(forward_batch)
    if cp is None:
        return input_ids, positions
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
    return cp.gather_rows(hidden_states, cp.last_token_idx(), spec)
