"""Expert-parallel all-to-all dispatch (`--moe-a2a-backend all_to_all`): each rank keeps its own
tokens, sends every (token, chosen expert) pair to the rank that holds that expert, and gets the
weighted expert outputs back; no rank sees tokens its experts do not need.

Versus the all-gather scheme (`ep_dispatch.py`: every rank routes every token of the group and
the partials are all-reduced), the bytes moved per MoE layer are ~2 · n · top_k · H (each pair
goes out and comes back once) instead of ~3 · N · H over the whole group, and each rank computes
only the pairs of its experts. It needs whole experts per rank (moe_tp = 1, i.e. ep = tp) and
works on the tokens a rank holds in the attention layout (the SCATTERED MLP mode of
`layers/communicator.py`); ranks of one attention-TP group hold the same tokens and each dispatches
its copy (correct, duplicated work when attn_tp > 1).

Two `all_to_all_single` calls over the group (gloo, nccl and hccl implement it) after one exchange
of the per-destination pair counts. The outbound exchange (tokens and their routing) is
asynchronous: `overlap` (the shared experts on this rank's tokens) runs while it is in flight
(`overlapped` counts the calls whose `overlap` ran before the wait). Exact: no capacity factor, every pair is computed
once; the outputs are summed per token in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import GroupCoordinator

if TYPE_CHECKING:
    from sglang.srt.distributed.parallel_layout import ParallelLayout


def moe_all_to_all(layout: "ParallelLayout") -> bool:
    """Whether MoE blocks route this rank's own tokens first and send each (token, expert) pair to
    its expert's rank by this all-to-all: with `--moe-a2a-backend all_to_all`, and under CP
    without DP attention whenever experts are whole per rank (ep = tp > 1), instead of
    all-gathering the MoE input of the replica before the router. `SparseMoeBlock` and the layer
    communicator (`moe_mlp_group`: the MLP runs on this rank's tokens) both ask this."""
    if layout.moe_a2a:
        return True
    return layout.attn_cp > 1 and layout.attn_dp == 1 and layout.moe_ep > 1 and layout.moe_tp == 1


class AllToAllDispatcher:
    def __init__(self, group: GroupCoordinator, num_experts: int):
        if num_experts % group.size:
            raise ValueError(
                f"number of experts ({num_experts}) must be divisible by the ep size ({group.size})"
            )
        self.group = group
        self.experts_per_rank = num_experts // group.size
        self.overlapped = 0  # calls whose `overlap` ran while the outbound exchange was pending

    def _exchange(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], async_op: bool = False
    ):
        """(received rows, the pending work when `async_op`)."""
        out = x.new_empty((sum(recv_counts),) + tuple(x.shape[1:]))
        work = dist.all_to_all_single(
            out, x.contiguous(), recv_counts, send_counts, group=self.group.device_group, async_op=async_op
        )
        return (out, work) if async_op else out

    def run(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts,
        overlap: Optional[Callable[[], torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x [n, H] this rank's tokens, weights / ids [n, k] their routing -> ([n, H] the weighted
        sum of their experts' outputs, `overlap()`'s result or None): `experts(x, w, ids)` computes
        the pairs of this rank's experts; `overlap` runs while the tokens are in flight."""
        n, k = ids.shape
        size = self.group.size
        if size == 1:
            return experts(x, weights, ids), (overlap() if overlap is not None else None)
        flat_ids = ids.reshape(-1)
        dest = torch.div(flat_ids, self.experts_per_rank, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=size).cpu()
        recv_counts_t = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts_t, send_counts, group=self.group.cpu_group)
        send, recv = send_counts.tolist(), recv_counts_t.tolist()
        token_of_pair = torch.div(order, k, rounding_mode="floor")
        # ids and weights travel as one float32 tensor [pairs, 2] (expert ids are far below 2^24)
        meta = torch.stack((flat_ids[order].float(), weights.reshape(-1)[order].float()), dim=1)
        recv_x, work_x = self._exchange(x[token_of_pair], send, recv, async_op=True)
        recv_meta, work_meta = self._exchange(meta, send, recv, async_op=True)
        shared = None
        if overlap is not None:
            shared = overlap()
            self.overlapped += 1  # ran between the exchange's start and its wait
        work_x.wait()
        work_meta.wait()
        out_pairs = experts(recv_x, recv_meta[:, 1:2].to(weights.dtype), recv_meta[:, 0:1].long())
        back = self._exchange(out_pairs, recv, send)
        out = torch.zeros((n, x.shape[1]), dtype=torch.float32, device=x.device)
        out.index_add_(0, token_of_pair, back.float())
        return out.to(x.dtype), shared
