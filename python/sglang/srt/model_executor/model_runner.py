"""ModelRunner: owns the model, the memory pools and the attention backend of one rank.

`forward(worker_batch)` turns the scheduler's plain-list `ModelWorkerBatch` into a `ForwardBatch`,
runs the model and samples the rows that are due a token. It never sees a request object.

Pipeline parallelism: the runner of stage k holds layers [start_layer, end_layer) and a KV pool for
those layers only; `forward_stage` returns `PPProxyTensors` on every stage but the last, which
samples. Only stage 0 has an allocator (its scheduler hands out the slots every stage uses).

Context parallelism (`self.cp`, docs/context_parallel.md): the allocator, req_to_token and the
scheduler's radix cache work in a virtual slot space with page size `page_size · cp`; this rank's
KV pool holds only its physical share (virtual size / cp slots), and every ForwardBatch carries
this rank's token layout (`CPRuntime.attach`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional, Union

import torch

from sglang.srt import envs
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.registry import (
    check_attention_backend,
    check_kv_cache_dtype,
    create_attention_backend,
)
from sglang.srt.layers.cp_runtime import CPRuntime
from sglang.srt.layers.sampler import SampleOutput, Sampler
from sglang.srt.layers.sampler_cp import cp_sample
from sglang.srt.model_executor.logprobs import InputLogprobs, input_logprobs
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cp_slots import physical_kv_state, plan_virtual_pool
from sglang.srt.mem_cache.kv_dtype import apply_kv_scales, read_kv_scales, resolve_kv_cache_dtype
from sglang.srt.mem_cache.kv_warm import start_kv_warmer
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import DPForwardInfo, ForwardBatch, ForwardMode, PPProxyTensors
from sglang.srt.model_executor.memory_budget import KVPoolPlan, MemoryReading, plan_kv_pool
from sglang.srt.model_executor.step_label import step_label
from sglang.srt.layers.layernorm import use_float32_residual
from sglang.srt.layers.linear_float32_out import use_float32_logits
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.config import quant_spec_from_config
from sglang.srt.layers.quantization.online import quantize_online
from sglang.srt.platforms import get_platform
from sglang.srt.model_loader.loader import load_model_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs
from sglang.srt.server_args_compat import model_override_args

logger = logging.getLogger(__name__)


@dataclass
class ForwardResult:
    next_token_ids: list[int]  # one per sampled row, in sample_rows order
    logprobs: Optional[list[float]]
    top_logprobs: Optional[list[list[tuple[float, int]]]]
    # float32 [num sampled rows, vocab], the raw logits the sampler read (a reference, no copy: the
    # sampler never writes its input). None when no row sampled, the result crossed the pipeline
    # ring (stage 0 gets ids only) or a split CP decode sampled each rank's rows where they were.
    logits: Optional[torch.Tensor] = None
    # prompt logprobs of the step's `logprob_rows` (model_executor/logprobs.py); None: no rows
    input_logprobs: Optional[InputLogprobs] = None
    # per sampled row, the logprobs of its request's token_ids_logprob (None where not asked)
    token_ids_logprobs: Optional[list] = None


class ModelRunner:
    def __init__(self, server_args: ServerArgs, groups: ParallelGroups):
        self.server_args = server_args
        self.groups = groups
        platform = get_platform(server_args.device)
        self.device = platform.current_device()  # the rank's own device (bound at rank start-up)
        torch.set_num_threads(server_args.num_threads or max(1, os.cpu_count() or 1))
        torch.manual_seed(server_args.random_seed)
        platform.configure_process()
        free_before_load = platform.memory_info()[0]  # the KV pool formula's pre-load reading

        self.model_config = ModelConfig(
            server_args.model_path,
            load_format=server_args.load_format,
            dtype=server_args.dtype,
            context_length=server_args.context_length,
            device=server_args.device,
            trust_remote_code=server_args.trust_remote_code,
            override_args=model_override_args(server_args),
        )
        cfg = self.model_config
        self.dtype = cfg.dtype
        model_cls = ModelRegistry.resolve(cfg.architectures)
        # the attention the model's layers need, served by the chosen backend (before any weights load)
        self.attention_backend_name = server_args.resolved_attention_backend
        check_attention_backend(self.attention_backend_name, model_cls.attention_kind, cfg.architectures[0])
        check_kv_cache_dtype(self.attention_backend_name, server_args.kv_cache_dtype)
        self.kv_cache_dtype = resolve_kv_cache_dtype(server_args.kv_cache_dtype, self.dtype)
        self.cp = CPRuntime.from_server_args(server_args, groups.attn_cp, platform, model_cls.attention_kind)
        if self.cp is not None and not model_cls.supports_context_parallel:
            raise ValueError(f"--cp-size > 1 is not supported for {cfg.architectures[0]} yet")
        loaded = self._load_model(model_cls, platform)
        self.model, weight_bytes, self.float32_logits, self.float32_residual = loaded
        # Pipeline stage: this rank's layers [start_layer, end_layer); KV is stored for those only.
        self.is_first_stage, self.is_last_stage = groups.pp.is_first, groups.pp.is_last
        self.start_layer, self.end_layer = self.model.start_layer, self.model.end_layer
        # the model's layout (MHA, MLA latent, ...) in the stored dtype (1 byte for FP8 KV)
        cell_bytes = self.model.kv_cell_size_bytes(self.dtype, self.kv_cache_dtype)
        local_ranks = groups.world.size // max(1, server_args.nnodes)
        memory = MemoryReading.after_load(platform, free_before_load, local_ranks, groups.tp.size)
        plan = self._agree_on_plan(plan_kv_pool(server_args, cfg, cell_bytes, memory))
        self.max_running_requests = plan.max_running_requests
        page = server_args.page_size
        if self.cp is None:
            self.max_total_num_tokens = pool_tokens = plan.max_total_tokens
            self.kv_page_size = page  # page size of the allocator / radix cache
        else:  # virtual slot space for the scheduler, this rank's physical share for the pool
            self.max_total_num_tokens, pool_tokens = plan_virtual_pool(
                plan.max_total_tokens, self.cp.mapping, per_rank=server_args.max_total_tokens is None
            )
            self.kv_page_size = self.cp.mapping.virtual_page_size
        self.req_to_token_pool = ReqToTokenPool(
            plan.max_running_requests + 1, cfg.context_len + self.kv_page_size, device=self.device
        )
        self.token_to_kv_pool = self._make_kv_pool(pool_tokens, page, platform)
        # Slots are handed out by stage 0 only (later pipeline stages follow its numbers).
        self.allocator: Optional[TokenToKVPoolAllocator] = (
            TokenToKVPoolAllocator(self.max_total_num_tokens, self.kv_page_size, device=self.device)
            if self.is_first_stage
            else None
        )
        self.attn_backend = create_attention_backend(self.attention_backend_name, self)
        self.sampler = Sampler(seed=server_args.random_seed)
        logger.info(
            "model %s loaded: %.1f MB weights (%s%s%s); KV pool %d tokens (%.1f MB%s), max running requests %d",
            cfg.architectures[0],
            weight_bytes / 2**20,
            str(self.dtype).replace("torch.", ""),
            ", float32 logits" if self.float32_logits and self.dtype != torch.float32 else "",
            ", float32 residual stream" if self.float32_residual else "",
            self.max_total_num_tokens,
            self.token_to_kv_pool.mem_bytes() / 2**20,
            ""
            if self.cp is None
            else f", {pool_tokens} tokens stored on this rank of cp {self.cp.group.size}",
            plan.max_running_requests,
        )

    def _make_kv_pool(self, pool_tokens: int, page: int, platform):
        """The KV pool (FP8 pools with the checkpoint's scales), its first slots warmed in the
        background where the platform commits pool pages lazily (mem_cache/kv_warm.py)."""
        pool = self.model.create_kv_pool(pool_tokens, page, self.dtype, self.device, self.kv_cache_dtype)
        if getattr(pool, "is_fp8", False):  # only FP8 pools store scaled values
            apply_kv_scales(pool, read_kv_scales(self.server_args.model_path))
        # the budget is the server's on this node: shared by its ranks here
        local_ranks = self.groups.world.size // max(1, self.server_args.nnodes)
        budget_gb = envs.SGLANG_CPU_KV_PREFAULT_GB.get() / max(1, local_ranks)
        self.kv_warmer = start_kv_warmer(pool, platform.page_populator(), budget_gb)
        return pool

    def _load_model(self, model_cls, platform) -> tuple[torch.nn.Module, int, bool, bool]:
        """Build the model on this rank's device and load its weights; returns it, the bytes its
        weights and packed copies take, whether its logits are float32 and whether its residual
        stream is."""
        server_args = self.server_args
        spec = quant_spec_from_config(self.model_config.hf_config, server_args.quantization)
        platform.check_quantization(spec.method if spec is not None else server_args.quantization)
        with torch.device(self.device):
            model = model_cls(self.model_config.hf_config, self.groups, self.dtype)
        load_model_weights(
            model, server_args.model_path, server_args.load_format, self.dtype, server_args.random_seed
        )
        quantize_online(model, server_args.quantization)  # --quantization on an unquantized checkpoint
        model.eval()
        # Shard Linear (issue 18): drop the q_b / o_proj other cp ranks own
        if server_args.enable_shard_linear:
            model.enable_shard_linear()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # before prepacking: an LM head with a float32-logits packed copy opts out of the other one
        float32_logits = use_float32_logits(model, server_args, platform)
        float32_residual = use_float32_residual(model, server_args, platform)
        weight_bytes += sum(
            m.float32_packed.nbytes for m in model.modules() if getattr(m, "float32_packed", None) is not None
        )
        # packed copies only while they take at most a quarter of the memory still free
        weight_bytes += prepack_linear_weights(model, platform, max_bytes=platform.memory_info()[0] // 4)
        platform.release_freed_memory()  # what loading, quantizing and packing freed
        return model, weight_bytes, float32_logits, float32_residual

    def kv_state(self, free_slots: int) -> dict:
        """Physical KV numbers of one rank (under CP every rank reserves the same share, and the
        count of prefill tokens it ran unsplit), and the dtype / bytes the pool stores them in."""
        pool = self.token_to_kv_pool
        stored = {
            "kv_cache_storage_dtype": str(pool.dtype).replace("torch.", ""),
            "kv_pool_bytes": pool.mem_bytes(),
        }
        if self.cp is None:
            return {
                **stored,
                "cp_size": 1,
                "kv_physical_tokens_per_rank": self.max_total_num_tokens,
                "kv_physical_used_per_rank": self.max_total_num_tokens - free_slots,
            }
        state = physical_kv_state(self.cp.mapping, self.max_total_num_tokens, free_slots)
        # adaptive CP: prefill tokens this rank ran whole (prompts below --cp-min-split-tokens)
        return {**stored, **state, "cp_unsplit_prefill_tokens": self.cp.stats.unsplit_prefill_tokens}

    def _agree_on_plan(self, plan: KVPoolPlan) -> KVPoolPlan:
        """Every rank takes the smallest plan of the world (MIN all-reduce), so KV slot numbers
        and request rows mean the same on every pipeline stage and tp rank."""
        world = self.groups.world
        if world.size == 1:
            return plan
        sizes = torch.tensor(
            [plan.max_total_tokens, plan.max_running_requests], dtype=torch.int64, device=world.device
        )
        world.all_reduce(sizes, op="min")
        tokens, running = (int(v) for v in sizes.tolist())
        return KVPoolPlan(max_total_tokens=tokens, max_running_requests=running, cell_bytes=plan.cell_bytes)

    # ------------------------------------------------------------------ forward
    def build_forward_batch(self, wb: ModelWorkerBatch, dp: Optional[DPForwardInfo] = None) -> ForwardBatch:
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
            dp=dp,
        )
        if wb.logprob_rows:  # prompt logprobs: the model finishes every row (model_executor/logprobs.py)
            fb.return_all_logits = True
            fb.logprob_rows = as_long(wb.logprob_rows)
        if self.cp is not None and fb.batch_size:
            self.cp.attach(fb)  # this rank's token layout; the backend builds its metadata from it
        self.attn_backend.init_forward_metadata(fb)
        return fb

    def idle_forward_batch(self, dp: DPForwardInfo) -> ForwardBatch:
        """A batch with no tokens: this replica's part of a lockstep forward it has no work for."""
        fb = ForwardBatch.idle(
            dp, self.req_to_token_pool, self.token_to_kv_pool, self.attn_backend, self.device
        )
        self.attn_backend.init_forward_metadata(fb)
        return fb

    def forward(self, wb: ModelWorkerBatch, dp: Optional[DPForwardInfo] = None) -> ForwardResult:
        """Whole-model forward + sampling (one pipeline stage). `dp`: this step's attention-DP
        counts when the replicas run in lockstep (dp > 1)."""
        out = self.forward_stage(wb, dp=dp)
        if isinstance(out, PPProxyTensors):
            raise RuntimeError(
                "ModelRunner.forward on a pipeline stage that is not the last: use forward_stage"
            )
        return out

    @torch.inference_mode()
    def forward_idle(
        self, dp: DPForwardInfo, pp_proxy_tensors: Optional[PPProxyTensors] = None
    ) -> Optional[PPProxyTensors]:
        """This replica's IDLE part of a lockstep forward: no tokens, every collective joined
        (pp-cp.md invariant 2). Returns the (empty) activations for the next stage, if any."""
        fb = self.idle_forward_batch(dp)
        fb.pp_proxy_tensors = pp_proxy_tensors
        out = self.model(fb.input_ids, fb.positions, fb)
        return out if isinstance(out, PPProxyTensors) else None

    @torch.inference_mode()
    def forward_stage(
        self,
        wb: ModelWorkerBatch,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
        dp: Optional[DPForwardInfo] = None,
    ) -> Union[ForwardResult, PPProxyTensors]:
        """This stage's layers. Not the last stage: the activations for the next stage. The last
        stage: the sampled tokens. Stages after the first take the previous stage's activations."""
        with step_label("runner.batch_build"):
            fb = self.build_forward_batch(wb, dp)
        fb.pp_proxy_tensors = pp_proxy_tensors
        with step_label("runner.model"):
            out = self.model(fb.input_ids, fb.positions, fb)
        if isinstance(out, PPProxyTensors):
            return out
        if not wb.sample_rows:
            result = ForwardResult([], None, None)
        elif out.cp_local is not None:  # split CP decode: each rank samples its own rows
            sampled = cp_sample(self.sampler, out.cp_local, wb, self.model_config.eos_token_ids)
            result = self._result(sampled, same_on_cp_ranks=True)
        else:
            logits = out.next_token_logits
            if len(wb.sample_rows) != wb.batch_size:
                logits = logits[torch.tensor(wb.sample_rows, dtype=torch.int64, device=logits.device)]
            with step_label("runner.sample"):
                result = self.sample(logits, wb)
        if out.input_logits is not None:
            result.input_logprobs = input_logprobs(out.input_logits, wb)
        return result

    def sample(self, logits: torch.Tensor, wb: ModelWorkerBatch) -> ForwardResult:
        info = SamplingBatchInfo.from_params(
            wb.sampling_params,
            wb.output_ids,
            wb.prompt_ids,
            vocab_size=logits.shape[-1],
            device=logits.device,
            eos_token_ids=self.model_config.eos_token_ids,
            vocab_mask=wb.vocab_mask,  # the same on every rank that samples (mirrored schedulers)
        )
        raw_logits = logits.float()
        result: SampleOutput = self.sampler(
            raw_logits,
            info,
            return_logprob=wb.return_logprob,
            top_logprobs_nums=wb.top_logprobs_nums,
            token_ids_logprob=wb.token_ids_logprob,
        )
        return self._result(result, raw_logits)

    def _result(
        self, result: SampleOutput, raw_logits: Optional[torch.Tensor] = None, same_on_cp_ranks: bool = False
    ) -> ForwardResult:
        """The step's result from the sampler's output. `raw_logits`: None when no rank holds the
        whole batch's logits (a split CP decode, whose all-gather gave the cp ranks the same ids:
        `same_on_cp_ranks`)."""
        next_ids = result.next_token_ids
        agreed = self.cp.group.size if same_on_cp_ranks else 1  # ranks known to hold the same ids
        if self.groups.replica.size > agreed:
            # Every rank of the replica must append the same token: its first rank's choice wins
            # (the attn_tp ranks beside a cp rank may have drawn their own numbers)
            next_ids = self.groups.replica.broadcast(next_ids.contiguous(), src=0)
        return ForwardResult(
            next_token_ids=next_ids.tolist(),
            logprobs=None if result.next_token_logprobs is None else result.next_token_logprobs.tolist(),
            top_logprobs=result.top_logprobs,
            logits=raw_logits,
            token_ids_logprobs=result.token_ids_logprobs,
        )
