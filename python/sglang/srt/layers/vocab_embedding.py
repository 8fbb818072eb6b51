"""Vocabulary-parallel token embedding and LM head.

The vocabulary is padded to a multiple of the tp size and split into equal contiguous ranges, one
per rank. Embedding: each rank looks up the ids in its range (zeros elsewhere) and the partial
results are all-reduced. LM head: each rank computes logits of its range; they are all-gathered
and the padding columns dropped.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear_float32_out import PackedHead, float32_out_linear
from sglang.srt.layers.linear_prepack import linear
from sglang.srt.distributed.parallel_state import GroupCoordinator


class VocabParallelEmbedding(nn.Module):
    """`weight` is this rank's [vocab_per_rank, embedding_dim] range of the (padded) vocabulary."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.tp = tp
        self.tp_rank = tp.rank if tp is not None else 0
        self.tp_size = tp.size if tp is not None else 1
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.num_embeddings_padded = self.num_embeddings_per_partition * self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.weight = nn.Parameter(
            torch.zeros(self.num_embeddings_per_partition, embedding_dim, dtype=params_dtype),
            requires_grad=False,
        )
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        """Copy rows [vocab_start, vocab_end) of the full [vocab, dim] tensor; padding rows stay zero."""
        if shard_id is not None:
            raise ValueError(f"embedding takes no shard_id, got {shard_id!r}")
        if loaded_weight.dim() != 2 or loaded_weight.shape[1] != self.embedding_dim:
            raise ValueError(
                f"embedding: expected [vocab, {self.embedding_dim}], got {tuple(loaded_weight.shape)}"
            )
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(f"embedding: expected vocab {self.num_embeddings}, got {loaded_weight.shape[0]}")
        start = min(self.vocab_start_index, self.num_embeddings)
        end = min(self.vocab_end_index, self.num_embeddings)
        param.data.zero_()
        param.data[: end - start].copy_(loaded_weight[start:end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        return self.tp.all_reduce(self.partial(input_ids))

    def partial(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's share of the lookup: the rows of ids in its vocab range, zeros elsewhere
        (summed over the tp ranks it is the embedding; `layers/cp_dense_tp.py` sums it per holder)."""
        in_range = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = torch.where(in_range, input_ids - self.vocab_start_index, 0)
        out = F.embedding(local_ids, self.weight)
        return out * in_range.unsqueeze(-1).to(out.dtype)

    def extra_repr(self) -> str:
        return f"vocab={self.num_embeddings}, per_rank={self.num_embeddings_per_partition}, dim={self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection hidden -> vocab logits, vocab sharded like the embedding.

    `tie_to(embedding)` makes the head share the embedding's weight (tied word embeddings).
    `float32_logits` (set after loading, `--enable-fp32-lm-head`): logits computed and returned in
    float32 whatever the weight dtype (layers/linear_float32_out.py).
    `quant_method` (set at load by a checkpoint holding the head quantized,
    layers/quantization/w8a8_head.py): it computes the logits, on float32 rows under `float32_logits`.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
        bias: bool = False,
    ):
        super().__init__(num_embeddings, embedding_dim, tp, params_dtype)
        if bias:
            self.bias: Optional[nn.Parameter] = nn.Parameter(
                torch.zeros(self.num_embeddings_per_partition, dtype=params_dtype), requires_grad=False
            )
            self.bias.weight_loader = self._bias_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)
        self.packed_weight = None  # set once after loading where the platform packs weights
        self.float32_logits = False
        self.float32_packed: Optional[PackedHead] = None
        self.skip_prepack = False
        self.quant_method = None

    def _bias_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        start = min(self.vocab_start_index, self.num_embeddings)
        end = min(self.vocab_end_index, self.num_embeddings)
        param.data.zero_()
        param.data[: end - start].copy_(loaded_weight[start:end])

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        if embedding.weight.shape != self.weight.shape:
            raise ValueError(
                f"cannot tie LM head {tuple(self.weight.shape)} to embedding {tuple(embedding.weight.shape)}"
            )
        self.weight = embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - guard
        raise RuntimeError("ParallelLMHead is not an embedding lookup; call compute_logits(hidden_states)")

    def set_float32_logits(self, packed: Optional[PackedHead] = None) -> None:
        """Logits in float32 from now on; `packed`: the weight packed for the CPU kernel, which
        replaces the packed bf16 GEMM copy (the same bytes)."""
        self.float32_logits = True
        self.float32_packed = packed
        # linear_prepack: the float32 kernel's copy (or a quantized head's own packing) replaces it
        self.skip_prepack = packed is not None or self.quant_method is not None
        if packed is not None:
            self.packed_weight = None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, vocab] logits in the weight dtype, or float32 with `float32_logits`
        (gathered over tp ranks)."""
        logits = self.local_logits(hidden_states)
        if self.tp_size > 1:
            logits = self.tp.all_gather(logits, dim=-1)
        if logits.shape[-1] != self.num_embeddings:
            logits = logits[..., : self.num_embeddings]
        return logits

    def local_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, vocab_per_rank]: the logits of this rank's vocab range (padding
        columns included), no gather."""
        if self.quant_method is not None:
            rows = hidden_states.float() if self.float32_logits else hidden_states
            return self.quant_method.apply(self, rows, self._parameters["bias"])
        if self.float32_logits:
            return float32_out_linear(hidden_states, self.weight, self.bias, self.float32_packed)
        return linear(hidden_states, self.weight, self.bias, self.packed_weight)
