"""The DSA ops of `sgl_kernel_npu` in the forms the attention backends need.

`DSAKernels(prefill_impl, decode_impl)` wraps `sgl_kernel_npu.lightning_indexer` and
`sparse_flash_attention` (implementations: "reference", "cpu", "triton", "torch_npu"; "auto" =
the tensors' device decides) for:

- a batch over the paged pool (`select_paged`, `attend_paged`): queries in TND (tokens grouped by
  request), keys PA_BSND whose blocks are the pool's pages (block table from `req_to_token`),
  right-down causal (`sparse_mode` 3): every request's new tokens are the last of its
  sequence;
- context parallelism: own queries at arbitrary positions against a request's gathered rows
  (`own_query_topk`, `attend_rows`: every run of consecutive positions is one TND entry whose keys
  end right after it, so zigzag segments are two entries and the causal rule stays sparse_mode 3),
  and decode queries against this rank's key shard (`shard_topk_candidates`: sparse_mode 0 over
  the stored rows, with scores, for the exact global merge; `attend_slots`: the selected rows this
  rank stores, with LSE).

The indexer's softmax scale is folded into the head weights (relu(x * s) = s * relu(x), s > 0).
`index_score_dtype` (None: float32 on the values as stored; torch.bfloat16: query and index keys
rounded to bf16, exact products summed in float32; torch.int8: query heads and index keys quantized
per row to symmetric int8, exact integer dot products) is the indexer's scoring precision; the `dsa`
backend sets it from the index-key cache's dtype or `SGLANG_DSA_INDEX_SCORE_DTYPE`
(`backend_names.index_score_dtype`).
Which implementation runs is decided once, by the platform (`Platform.dsa_ops_impl`) or the
`--nsa-prefill-backend` / `--nsa-decode-backend` flags (see `dsa/backend_names.py`).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

import torch

from sglang.srt.layers.attention.ops import contiguous_runs

INSTALL_HINT = (
    "the DSA ops need the sgl-kernel-npu package, which is not installed (it is not on PyPI): install it "
    "from the SGLang checkout with `pip install --no-build-isolation -e ./sgl-kernel-npu` (`make setup` does)"
)


def dsa_ops(module: str = "sgl_kernel_npu") -> ModuleType:
    """sgl_kernel_npu (or one of its modules), imported when first needed: SGLang runs without it
    (merges fall back to torch), the DSA backend refuses to start without it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "sgl_kernel_npu":
            raise
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc


class DSAKernels:
    """sgl_kernel_npu ops with one implementation for prefill (extend / mixed batches) and one for decode."""

    def __init__(
        self,
        prefill_impl: str = "auto",
        decode_impl: str = "auto",
        index_score_dtype: Optional[torch.dtype] = None,
    ):
        self.ops = dsa_ops()
        for impl in (prefill_impl, decode_impl):
            if impl not in self.ops.IMPLS:
                raise ValueError(f"unknown DSA op implementation {impl!r}; choices: {self.ops.IMPLS}")
        self.prefill_impl = prefill_impl
        self.decode_impl = decode_impl
        self.index_score_dtype = index_score_dtype

    def impl(self, decode: bool) -> str:
        return self.decode_impl if decode else self.prefill_impl

    def index_keys(self, pool, layer_id: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The index-key rows [R, D] the indexer reads from `pool` (a DSA pool) and their scales:
        with int8 scoring and a pool that keeps an int8 copy (quantized when written), that copy
        and its per-row scales [R]; an FP8 index-key cache (`--kv-cache-dtype fp8_*`): its
        float8_e4m3fn codes and block scales [R, blocks] (widened in the op, read in 1 byte); else
        the model-dtype rows and None (quantized in the call when scoring int8)."""
        int8 = pool.get_index_k_int8(layer_id) if self.index_score_dtype == torch.int8 else None
        if int8 is not None:
            return int8
        fp8 = pool.get_index_k_fp8(layer_id)
        return fp8 if fp8 is not None else (pool.get_index_k_buffer(layer_id), None)

    # ------------------------------------------------------------------ paged pool (no CP)
    def select_paged(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        scale: float,
        index_k: torch.Tensor,
        table: torch.Tensor,
        cu_q: torch.Tensor,
        kv_lens: torch.Tensor,
        topk: int,
        decode: bool,
        index_k_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """q [n, H, D], weights [n, H], index_k [num_blocks, block, 1, D] (PA_BSND view of the pool;
        int8 with index_k_scale [num_blocks, block, 1]: the pool's int8 copy, int8 scoring; FP8
        with index_k_scale [num_blocks, block, 1, blocks]: an FP8 index-key cache);
        table [B, max_blocks] block ids. -> [n, topk] int32."""
        idx = self.ops.lightning_indexer(
            q,
            index_k,
            weights.float() * scale,
            cu_q,
            kv_lens,
            table,
            "TND",
            "PA_BSND",
            topk,
            3,
            impl=self.impl(decode),
            score_dtype=self.index_score_dtype,
            key_scale=index_k_scale,
        )
        return idx[:, 0]

    def attend_paged(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        v_dim: int,
        scale: float,
        positions: torch.Tensor,
        table: torch.Tensor,
        cu_q: torch.Tensor,
        kv_lens: torch.Tensor,
        decode: bool,
        kv_scale: float = 1.0,
    ) -> torch.Tensor:
        """q [n, H, L + R] absorbed queries, kv [num_blocks, block, 1, L + R] the latent pool (PA_BSND;
        FP8 rows with the layer's `kv_scale`, read in 1 byte), positions [n, K] -> [n, H, L]."""
        rows = kv
        return self.ops.sparse_flash_attention(
            q[..., :v_dim],
            rows[..., :v_dim],
            rows[..., :v_dim],
            positions.unsqueeze(1),
            scale,
            table,
            cu_q,
            kv_lens,
            q[..., v_dim:],
            rows[..., v_dim:],
            1,
            "TND",
            "PA_BSND",
            3,
            impl=self.impl(decode),
            kv_scale=kv_scale,
        )

    # ------------------------------------------------------------------ context parallelism
    def _run_layout(self, q_pos: torch.Tensor, total: int):
        pos = q_pos.tolist()
        runs = contiguous_runs(pos)
        cu = torch.tensor([e for _, e in runs], dtype=torch.int32)
        kv_lens = torch.tensor([int(pos[e - 1]) + 1 for _, e in runs], dtype=torch.int32)
        table = torch.zeros((len(runs), 1), dtype=torch.int32)  # one block holding the whole sequence
        return cu, kv_lens, table

    def _one_sequence(self, q, w, keys, scale: float, width: int, q_pos, return_value: bool):
        """lightning_indexer of queries [m, H, D] over one sequence's keys [T, D] (one block):
        causal by positions `q_pos` (ascending, relative to the first key; sparse_mode 3), or every
        key visible (`q_pos` None; sparse_mode 0)."""
        m, total = q.shape[0], keys.shape[0]
        if q_pos is None:
            cu, kv_lens = torch.tensor([m], dtype=torch.int32), torch.tensor([total], dtype=torch.int32)
            table, mode = torch.zeros((1, 1), dtype=torch.int32), 0
        else:
            (cu, kv_lens, table), mode = self._run_layout(q_pos, total), 3
        # CP passes the index-key columns of the gathered [T, L + R + D] rows: a strided view whose
        # 64-value keys lie one per 1.5 KB. The indexer re-reads every visible key once per query
        # group, and over 6x the pages it ran 10-13 % slower (TLB); one copy (T x D) costs ~ms.
        keys = keys.contiguous()
        return self.ops.lightning_indexer(
            q,
            keys.view(1, total, 1, keys.shape[1]),
            w.float() * scale,
            cu,
            kv_lens,
            table,
            "TND",
            "PA_BSND",
            width,
            mode,
            return_value=return_value,
            impl=self.prefill_impl,
            score_dtype=self.index_score_dtype,
        )

    def own_query_topk(
        self,
        q: torch.Tensor,
        w: torch.Tensor,
        q_pos: torch.Tensor,
        keys: torch.Tensor,
        topk: int,
        scale: float,
    ) -> torch.Tensor:
        """Like `cp_indexer.own_query_topk`: queries at ascending positions q_pos against keys [T, D]
        at positions 0..T-1 -> [m, min(topk, T)] int32 (what `attend_rows` takes), -1 padded."""
        m, total = q.shape[0], keys.shape[0]
        width = min(topk, total)
        if m == 0 or total == 0:
            return torch.full((m, width), -1, dtype=torch.int32, device=q.device)
        return self._one_sequence(q, w, keys, scale, width, q_pos, False)[:, 0]

    def range_topk_candidates(
        self,
        q: torch.Tensor,
        w: torch.Tensor,
        keys: torch.Tensor,
        key_start: int,
        width: int,
        scale: float,
        q_pos: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-`width` candidates of queries [m, H, D] over keys [T, D] at positions key_start ..
        key_start + T - 1, scored at `index_score_dtype` (the segmented prefix gather's rounds):
        every key visible (`q_pos` None), or causal for queries at ascending positions `q_pos` >=
        key_start. -> (values [m, w] float32, -inf padding; positions [m, w] int64, -1 padding),
        w = min(width, T), in the selection's order (higher score, then the earlier position)."""
        m, width = q.shape[0], min(width, keys.shape[0])
        if m == 0 or width == 0:
            empty = torch.full((m, width), -1, dtype=torch.int64)
            return empty.float().fill_(float("-inf")), empty
        rel = None if q_pos is None else q_pos - key_start
        idx, vals = self._one_sequence(q, w, keys, scale, width, rel, True)
        idx, vals = idx[:, 0].long(), vals[:, 0].float()
        pos = (idx + key_start).masked_fill(idx < 0, -1)
        # the selection's total order whatever order the op returns: earlier position first, then
        # a stable sort by score
        pos, by_pos = pos.masked_fill(pos < 0, torch.iinfo(torch.int64).max).sort(dim=1)
        vals, by_val = vals.gather(1, by_pos).sort(dim=1, descending=True, stable=True)
        pos = pos.gather(1, by_val)
        return vals, pos.masked_fill(torch.isinf(vals) & (vals < 0), -1)

    def attend_rows(
        self,
        q: torch.Tensor,
        seq: torch.Tensor,
        q_pos: torch.Tensor,
        positions: torch.Tensor,
        scale: float,
        v_dim: int,
    ) -> torch.Tensor:
        """q [m, H, L + R] own queries at q_pos, seq [T, L + R] the request's rows, positions [m, K]."""
        total = seq.shape[0]
        cu, kv_lens, table = self._run_layout(q_pos, total)
        rows = seq.view(1, total, 1, seq.shape[1])
        return self.ops.sparse_flash_attention(
            q[..., :v_dim],
            rows[..., :v_dim],
            rows[..., :v_dim],
            positions.to(torch.int32).unsqueeze(1),
            scale,
            table,
            cu,
            kv_lens,
            q[..., v_dim:],
            rows[..., v_dim:],
            1,
            "TND",
            "PA_BSND",
            3,
            impl=self.prefill_impl,
        )

    def shard_topk_candidates(
        self,
        q: torch.Tensor,
        w: torch.Tensor,
        index_k: torch.Tensor,
        slots: torch.Tensor,
        valid: torch.Tensor,
        key_pos: torch.Tensor,
        width: int,
        scale: float,
        index_k_scale: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode queries [n1, H, D] against the index keys this rank stores (slots [n1, L], valid a
        prefix mask, key_pos [L] their positions; index_k int8 with index_k_scale [R]: the pool's
        int8 copy; FP8 with index_k_scale [R, blocks]: an FP8 cache). -> (values [n1, width]
        float32, positions int64)."""
        n1 = q.shape[0]
        lens = valid.sum(dim=1).to(torch.int32)
        cu = torch.arange(1, n1 + 1, dtype=torch.int32)
        key = index_k.view(index_k.shape[0], 1, 1, index_k.shape[1])
        idx, vals = self.ops.lightning_indexer(
            q,
            key,
            w.float() * scale,
            cu,
            lens,
            slots.to(torch.int32),
            "TND",
            "PA_BSND",
            width,
            0,
            return_value=True,
            impl=self.decode_impl,
            score_dtype=self.index_score_dtype,
            key_scale=index_k_scale,
        )
        idx, vals = idx[:, 0].long(), vals[:, 0]
        if key_pos.numel() == 0:  # this rank stores no key of these queries (e.g. 1-token prompts)
            return vals, torch.full_like(idx, -1)
        pos = key_pos.to(idx.device)[idx.clamp(min=0)].masked_fill(idx < 0, -1)
        return vals, pos

    def attend_slots(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        slots: torch.Tensor,
        valid: torch.Tensor,
        scale: float,
        v_dim: int,
        kv_scale: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode queries [n1, H, L + R] over the rows at slots [n1, K] where valid -> (out, lse);
        kv the pool's rows (FP8 with the layer's `kv_scale`)."""
        n1, k = slots.shape
        rows = kv.view(kv.shape[0], 1, 1, kv.shape[-1])
        cu = torch.arange(1, n1 + 1, dtype=torch.int32)
        lens = torch.full((n1,), k, dtype=torch.int32)
        idx = torch.where(valid, torch.arange(k, dtype=torch.int32).unsqueeze(0), -1).to(torch.int32)
        return self.ops.sparse_flash_attention(
            q[..., :v_dim],
            rows[..., :v_dim],
            rows[..., :v_dim],
            idx.unsqueeze(1),
            scale,
            slots.to(torch.int32),
            cu,
            lens,
            q[..., v_dim:],
            rows[..., v_dim:],
            1,
            "TND",
            "PA_BSND",
            0,
            return_softmax_lse=True,
            impl=self.decode_impl,
            kv_scale=kv_scale,
        )


def make_kernels(
    prefill_impl: Optional[str], decode_impl: Optional[str], index_score_dtype: Optional[torch.dtype] = None
) -> DSAKernels:
    return DSAKernels(prefill_impl or "auto", decode_impl or "auto", index_score_dtype)
