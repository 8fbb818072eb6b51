"""ModelRunner: owns the model, the memory pools and the attention backend of one rank.

`forward(worker_batch)` turns the scheduler's plain-list `ModelWorkerBatch` into a `ForwardBatch`,
runs the model and samples the rows that are due a token. It never sees a request object.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.registry import create_attention_backend
from sglang.srt.layers.sampler import SampleOutput, Sampler
from sglang.srt.managers.schedule_batch import ModelWorkerBatch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode
from sglang.srt.model_executor.memory_budget import plan_kv_pool
from sglang.srt.model_loader.loader import load_model_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class ForwardResult:
    next_token_ids: list[int]  # one per sampled row, in sample_rows order
    logprobs: Optional[list[float]]
    top_logprobs: Optional[list[list[tuple[float, int]]]]
    logits: Optional[torch.Tensor] = None  # float32 [num sampled rows, vocab] (kept for tests)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, groups: ParallelGroups, keep_logits: bool = False):
        self.server_args = server_args
        self.groups = groups
        self.keep_logits = keep_logits
        self.device = torch.device(server_args.device)
        torch.set_num_threads(server_args.num_threads or max(1, os.cpu_count() or 1))
        torch.manual_seed(server_args.random_seed)

        self.model_config = ModelConfig(
            server_args.model_path,
            load_format=server_args.load_format,
            dtype=server_args.dtype,
            context_length=server_args.context_length,
            device=server_args.device,
        )
        cfg = self.model_config
        self.dtype = cfg.dtype
        model_cls = ModelRegistry.resolve(cfg.architectures)
        with torch.device(self.device):
            self.model = model_cls(cfg.hf_config, groups, self.dtype)
        load_model_weights(
            self.model, server_args.model_path, server_args.load_format, self.dtype, server_args.random_seed
        )
        self.model.eval()
        weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

        plan = plan_kv_pool(server_args, cfg, self.dtype, weight_bytes)
        self.max_total_num_tokens = plan.max_total_tokens
        self.max_running_requests = plan.max_running_requests
        page = server_args.page_size
        self.req_to_token_pool = ReqToTokenPool(
            plan.max_running_requests + 1, cfg.context_len + page, device=self.device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            plan.max_total_tokens,
            page,
            self.dtype,
            cfg.get_num_kv_heads(groups.attn_tp.size),
            cfg.head_dim,
            cfg.num_hidden_layers,
            device=self.device,
        )
        self.allocator = TokenToKVPoolAllocator(plan.max_total_tokens, page, device=self.device)
        self.attn_backend = create_attention_backend(server_args.attention_backend, self)
        self.sampler = Sampler(seed=server_args.random_seed)
        logger.info(
            "model %s loaded: %.1f MB weights (%s); KV pool %d tokens (%.1f MB), max running requests %d",
            cfg.architectures[0],
            weight_bytes / 2**20,
            str(self.dtype).replace("torch.", ""),
            plan.max_total_tokens,
            self.token_to_kv_pool.mem_bytes() / 2**20,
            plan.max_running_requests,
        )

    # ------------------------------------------------------------------ forward
    def build_forward_batch(self, wb: ModelWorkerBatch) -> ForwardBatch:
        seq_lens = [p + e for p, e in zip(wb.prefix_lens, wb.extend_lens)]
        as_long = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)  # noqa: E731
        if wb.is_decode:
            mode = ForwardMode.DECODE
        elif all(p == 0 for p in wb.prefix_lens) or all(e > 1 for e in wb.extend_lens):
            mode = ForwardMode.EXTEND
        else:
            mode = ForwardMode.MIXED
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=wb.batch_size,
            input_ids=as_long(wb.input_ids),
            positions=as_long(wb.positions),
            out_cache_loc=wb.out_cache_loc.to(torch.int64),
            req_pool_indices=as_long(wb.req_pool_indices),
            seq_lens=as_long(seq_lens),
            extend_prefix_lens=as_long(wb.prefix_lens),
            extend_seq_lens=as_long(wb.extend_lens),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=list(wb.prefix_lens),
            extend_seq_lens_cpu=list(wb.extend_lens),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend,
        )
        self.attn_backend.init_forward_metadata(fb)
        return fb

    @torch.inference_mode()
    def forward(self, wb: ModelWorkerBatch) -> ForwardResult:
        fb = self.build_forward_batch(wb)
        out = self.model(fb.input_ids, fb.positions, fb)
        if not wb.sample_rows:
            return ForwardResult([], None, None)
        logits = out.next_token_logits
        if len(wb.sample_rows) != wb.batch_size:
            logits = logits[torch.tensor(wb.sample_rows, dtype=torch.int64, device=logits.device)]
        return self.sample(logits, wb)

    def sample(self, logits: torch.Tensor, wb: ModelWorkerBatch) -> ForwardResult:
        info = SamplingBatchInfo.from_params(
            wb.sampling_params,
            wb.output_ids,
            wb.prompt_ids,
            vocab_size=logits.shape[-1],
            device=logits.device,
            eos_token_ids=self.model_config.eos_token_ids,
        )
        raw_logits = logits.float()
        result: SampleOutput = self.sampler(
            raw_logits.clone() if self.keep_logits else raw_logits,
            info,
            return_logprob=wb.return_logprob,
            top_logprobs_nums=wb.top_logprobs_nums,
        )
        next_ids = result.next_token_ids
        if self.groups.tp.size > 1:
            # Every rank of the stage must append the same token: rank 0's choice wins.
            next_ids = self.groups.tp.broadcast(next_ids.contiguous(), src=0)
        return ForwardResult(
            next_token_ids=next_ids.tolist(),
            logprobs=None if result.next_token_logprobs is None else result.next_token_logprobs.tolist(),
            top_logprobs=result.top_logprobs,
            logits=raw_logits if self.keep_logits else None,
        )
