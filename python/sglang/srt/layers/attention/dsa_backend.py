"""The DSA attention backend (`--attention-backend dsa`, alias `nsa`): DeepSeek-V3.2's Lightning
Indexer and sparse attention on the fused `sgl_kernel_npu` ops.

It is the `cpu` backend (fused MHA kernels, the torch-native reference for dense MLA) whose DSA
path runs `sgl_kernel_npu.lightning_indexer` and `sparse_flash_attention` instead of the torch
reference (`dsa/kernels.py`): with the CPU platform's fused C++ kernels the indexer never builds a
[queries x keys] score matrix and the top-k streams; sparse attention reads the selected latent
rows in place, in tiles. Which implementation runs (fused CPU, Triton, torch_npu, reference) is the
platform's choice (`Platform.dsa_ops_impl`) unless `--nsa-prefill-backend` / `--nsa-decode-backend`
name one (for extend / mixed batches and for decode batches).

- A batch that is not context-parallel: the new index keys are stored, and when some sequence is
  longer than index_topk every token selects its top-k over its request's cached index keys (TND
  queries, PA_BSND keys addressed through `req_to_token`); attention then reads those rows. Else
  (every token would select all its keys) dense MLA, as the reference does.
- Context parallelism: the reference's sharded-CP path (`mla_cp.py`: one async all-gather of the
  new rows + index keys overlapping the q up-projection, own-query (zero-redundant) indexer, decode
  candidates merged into the exact global top-k, partials merged by LSE), with these ops. Over a
  prefix longer than `--cp-kv-gather-segment` (`mla_cp_segments.py`) the rows come in rounds: the
  selection scores each round's index keys with the reference scorer (float32, exact top-k over
  the rounds; the int8 / bf16 scoring options do not apply there) and `attend_slots` attends each
  round's selected rows.

The indexer scores in the index-key cache's dtype (float32 model: float32, the reference's scores;
bf16 model: bf16 inputs, float32 sums); `SGLANG_DSA_INDEX_SCORE_DTYPE=bfloat16` rounds a float32
model's query and keys to bf16 for scoring, `=int8` quantizes query heads and keys per row to int8
(exact integer dots; the pool then also keeps an int8 copy of the index keys, quantized when
written, which the paged and CP-decode indexers read; CP prefill quantizes its gathered rows in
the call) (`dsa/backend_names.index_score_dtype`).

An FP8 KV pool (`--kv-cache-dtype fp8_e4m3|fp8_e5m2`) is read in place: the sparse attention op
gets the 1-byte latent rows and the layer's scale, the indexer the FP8 e4m3 index keys and their
per-128-value scales (DeepSeek-V3.2's format, `mla_kv_pool.quantize_index_k`), both widened inside
sgl_kernel_npu's kernels; the scoring precision options apply to the widened keys (int8: the pool's
int8 copy is quantized from them).

Selections equal the reference's up to float rounding of the scores (the kernels sum in another
order): near-equal scores at the top-k boundary may swap; test/kernels_npu compares the ops and
test/distributed/test_dsa_backend_parity.py the model's greedy tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from sglang.srt.layers.attention.cpu_backend import CPUAttnBackend, CPUBatch
from sglang.srt.layers.attention.dsa.backend_names import index_score_dtype, resolve_nsa_backend
from sglang.srt.layers.attention.dsa.kernels import DSAKernels, dsa_ops
from sglang.srt.layers.attention.kv_source import kv_scales
from sglang.srt.layers.attention.mla_cp import mla_cp_forward
from sglang.srt.layers.context_parallel import get_cp_layout

if TYPE_CHECKING:
    from sglang.srt.layers.attention.dsa.indexer import IndexerInputs
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.model_executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


@dataclass
class DSAPaged:
    """The batch in the ops' TND / PA_BSND terms: blocks are the pool's pages (block_table[b, j] =
    page of position j * page_size), or single slots when the pool's rows are not whole pages."""

    cu_q: torch.Tensor  # [B] int32 cumulative new-token counts
    kv_lens: torch.Tensor  # [B] int32 sequence lengths
    table: torch.Tensor  # [B, ceil(max_seq_len / block)] int32 block ids
    block: int  # block size: the page size, or 1
    decode: bool

    def blocks(self, buffer: torch.Tensor) -> torch.Tensor:
        """A pool buffer [rows, D] as PA_BSND [rows / block, block, 1, D]."""
        rows, dim = buffer.shape[0], buffer.shape[-1]
        return buffer.reshape(rows, dim)[: rows - rows % self.block].view(
            rows // self.block, self.block, 1, dim
        )


@dataclass
class DSABatch(CPUBatch):
    dsa: Optional[DSAPaged] = None


def _impl_for(flag_value: Optional[str], device: str) -> str:
    from sglang.srt.platforms import get_platform

    impl = resolve_nsa_backend(flag_value)
    if impl == "auto":
        impl = get_platform(device).dsa_ops_impl
    if impl == "cpu":
        if not dsa_ops("sgl_kernel_npu.cpu").available():
            logger.warning(
                "sgl_kernel_npu has no CPU kernels in this install; the DSA ops run the torch reference"
            )
            impl = "reference"
    return impl


class DSAAttnBackend(CPUAttnBackend):
    """The `cpu` backend with DeepSeek Sparse Attention on sgl_kernel_npu's ops."""

    name = "dsa"
    batch_state_type = DSABatch
    # the fused ops read an FP8 pool in place (latent rows with the layer's scale, index keys with
    # their block scales), widening in the kernels
    supports_fp8_kv = True

    def __init__(
        self,
        model_runner: Any = None,
        prefill_impl: Optional[str] = None,
        decode_impl: Optional[str] = None,
        **_: Any,
    ):
        super().__init__(model_runner)
        args = getattr(model_runner, "server_args", None)
        device = getattr(args, "device", "cpu")
        prefill = prefill_impl or getattr(args, "nsa_prefill_backend", None)
        decode = decode_impl or getattr(args, "nsa_decode_backend", None)
        self.kernels = DSAKernels(_impl_for(prefill, device), _impl_for(decode, device))

    def _dsa(self, fb: "ForwardBatch") -> DSAPaged:
        state = self._state(fb)
        if state.dsa is None:
            table_all = fb.req_to_token_pool.req_to_token
            rows = fb.req_pool_indices.to(table_all.device)
            max_len = max(fb.seq_lens_cpu) if fb.seq_lens_cpu else 0
            page = int(getattr(fb.token_to_kv_pool, "page_size", 1) or 1)
            slots = table_all[rows, :max_len]
            # pages as blocks (what NPU kernels want: blocks of 16+); slots of a page are consecutive
            block = page if page > 1 and max_len and bool((slots[:, ::page] % page == 0).all()) else 1
            state.dsa = DSAPaged(
                cu_q=torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64).cumsum(0).to(torch.int32),
                kv_lens=torch.tensor(fb.seq_lens_cpu, dtype=torch.int32),
                table=(slots[:, ::block] // block).to(torch.int32),
                block=block,
                decode=fb.forward_mode.is_decode(),
            )
        return state.dsa

    def forward_mla(
        self,
        q: torch.Tensor,
        kv_new: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        indexer: Optional["IndexerInputs"] = None,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if indexer is not None:
            self._set_score_dtype(forward_batch, indexer)
        layout = get_cp_layout(forward_batch)
        if layout is not None:
            md = self._mla_cp(forward_batch, layout)
            return mla_cp_forward(
                layer, q, kv_new, forward_batch, layout, md, indexer, save_kv_cache, self.kernels
            )
        n = q.shape[0]
        if indexer is None or forward_batch.forward_mode.is_idle() or n == 0:
            return super().forward_mla(q, kv_new, layer, forward_batch, indexer, save_kv_cache)
        pool = forward_batch.token_to_kv_pool
        selected = self._select(indexer, forward_batch)
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, kv_new)
        if selected is None:
            return self.attend_latent(q, layer, forward_batch, None)
        d = self._dsa(forward_batch)
        kv = d.blocks(pool.get_key_buffer(layer.layer_id))
        kv_scale = kv_scales(pool, layer.layer_id)[0]  # (FP8: the latent row is key and value)
        return self.kernels.attend_paged(
            q, kv, layer.kv_lora_rank, layer.scaling, selected, d.table, d.cu_q, d.kv_lens, d.decode, kv_scale
        )

    def _set_score_dtype(self, fb: "ForwardBatch", dsa: "IndexerInputs") -> None:
        """The indexer's scoring precision for this layer call: from the index-key cache's dtype."""
        cache = fb.token_to_kv_pool.get_index_k_buffer(dsa.indexer.layer_id)
        self.kernels.index_score_dtype = index_score_dtype(cache.dtype)

    def _select(self, dsa: "IndexerInputs", fb: "ForwardBatch") -> Optional[torch.Tensor]:
        """Store the batch's index keys; [n, index_topk] int32 selected positions (-1 padded), or
        None when no sequence is longer than index_topk (every token attends to all its keys)."""
        idx = dsa.indexer
        pool = fb.token_to_kv_pool
        pool.set_index_k_buffer(idx.layer_id, fb.out_cache_loc, dsa.key())
        if max(fb.seq_lens_cpu) <= idx.index_topk:
            return None
        q, weights = dsa.query()
        pairs = sum(
            e * p + e * (e + 1) // 2 for e, p in zip(fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu)
        )
        idx.count(q.shape[0], pairs)
        d = self._dsa(fb)
        keys, scale = self.kernels.index_keys(pool, idx.layer_id)
        if scale is not None:  # int8 copy: [R] per row; FP8 keys: [R, blocks]
            scale = d.blocks(scale.unsqueeze(-1))[..., 0] if scale.dim() == 1 else d.blocks(scale)
        return self.kernels.select_paged(
            q,
            weights,
            idx.softmax_scale,
            d.blocks(keys),
            d.table,
            d.cu_q,
            d.kv_lens,
            idx.index_topk,
            d.decode,
            scale,
        )
