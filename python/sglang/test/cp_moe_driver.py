"""Test driver: DeepSeek-V3 / V3.2 and Qwen3-MoE on hand-built context-parallel batches (no scheduler).

`generate(path, groups, strategy)` runs one workload on this rank and returns what a parity test
compares with the single-rank run (`groups = ParallelGroups.single()`):

- 3 prompts of odd lengths (7, 19, 30) prefilled in chunks of 12 (the 30-token one over 3 chunks,
  the later chunks over a cached prefix) while the finished prompts decode, then greedy decoding
  to `new_tokens` tokens each;
- a last step with a radix-cache hit (a request reusing the first 16 tokens of the long prompt,
  rest prefilled at once) next to a fresh 13-token prompt, all logits returned.

With the tiny V3.2 config (`index_topk` 8) every step after the first chunk is sparse, and the
first chunks (12 tokens) are sparse FRESH prefills. Pipeline parallelism: stage 0 sends its token
shard to the stage-1 rank with the same cp rank, which sends the logits back.

`score_counts(path, groups)` counts the Lightning Indexer's score work on this rank: one fresh
prefill, then decode steps (`Indexer.score_rows` / `score_pairs` summed over layers).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear_prepack import pack_quantized_linears
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.registry import ModelRegistry
from sglang.test.cp_forward_helpers import CPForwardHarness, pp_stepper
from sglang.test.greedy_loop import chunked_greedy

PROMPT_LENS = (7, 19, 30)
CHUNK = 12
SHARED = 16  # radix-hit prefix: whole virtual pages for cp 2 / 4 with page 1 or 2
FRESH_LEN = 13


def load_model(path: str, groups: ParallelGroups) -> tuple[Any, CausalLM]:
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    model.load_weights(iter_safetensors_weights(path))
    pack_quantized_linears(model)  # as the model runner does: W8A8 linears and experts on the fused kernel
    return hf_config, model


def make_harness(
    hf_config: Any,
    model: CausalLM,
    groups: ParallelGroups,
    strategy: str,
    page_size: int = 1,
    interleave: int = 1,
    attention_backend: Optional[str] = None,
) -> CPForwardHarness:
    """A CP harness whose pool is the model's own (MHA, latent or DSA) pool."""
    h = CPForwardHarness(
        hf_config,
        groups.attn_cp,
        strategy,
        page_size=page_size,
        interleave=interleave,
        max_total_tokens=1024,
        attn_tp_size=groups.attn_tp.size,
        attention_backend=attention_backend,
    )
    h.token_to_kv_pool = model.create_kv_pool(
        h.mapping.physical_pool_size(h.allocator.size), page_size, torch.float32
    )
    return h


def _stored_rows(h: CPForwardHarness, model: CausalLM) -> int:
    keys = h.token_to_kv_pool.get_key_buffer(model.start_layer)
    return int((keys.reshape(keys.shape[0], -1).abs().sum(dim=1) != 0).sum())


def generate(
    path: str,
    groups: ParallelGroups,
    strategy: str = "zigzag",
    new_tokens: int = 16,
    page_size: int = 1,
    interleave: int = 1,
    attention_backend: Optional[str] = None,
    shard_linear: bool = False,
) -> dict:
    hf_config, model = load_model(path, groups)
    series = model.enable_shard_linear() if shard_linear else None
    h = make_harness(hf_config, model, groups, strategy, page_size, interleave, attention_backend)
    proxy_rows: list[tuple[int, int]] = []
    step = pp_stepper(h, model, groups, proxy_rows)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    reqs = [h.new_request() for _ in prompts]
    outputs, step_logits = chunked_greedy(step, reqs, prompts, new_tokens, CHUNK)
    hit = h.new_request(share_prefix_of=reqs[2], prefix_len=SHARED)
    fresh = h.new_request()
    fresh_prompt = torch.randint(3, hf_config.vocab_size, (FRESH_LEN,), generator=gen).tolist()
    step_logits.append(
        step([(hit, prompts[2][SHARED:] + prompts[0]), (fresh, fresh_prompt)], all_logits=True).clone()
    )
    out = {"tokens": outputs, "logits": step_logits, "rows": _stored_rows(h, model), "proxy_rows": proxy_rows}
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if series is not None:  # Shard Linear: what this rank holds for the series, and how many broadcasts ran
        out["shard_bytes"], out["shard_broadcasts"] = series.weight_bytes(), series.broadcasts
    return out


def _indexers(model: CausalLM) -> list:
    return [m.indexer for m in model.modules() if getattr(m, "indexer", None) is not None]


def score_counts(path: str, groups: ParallelGroups, prompt_len: int = 40, decode_steps: int = 3) -> dict:
    """Indexer score work on this rank: after one fresh prefill, then over `decode_steps` decodes."""
    hf_config, model = load_model(path, groups)
    h = make_harness(hf_config, model, groups, "zigzag")
    step = pp_stepper(h, model, groups, [])
    idx = _indexers(model)
    prompt = torch.randint(
        3, hf_config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(7)
    ).tolist()
    req = h.new_request()
    token = int(step([(req, prompt)])[0].argmax())
    prefill = {"rows": sum(i.score_rows for i in idx), "pairs": sum(i.score_pairs for i in idx)}
    for i in idx:
        i.reset_counters()
    tokens = [token]
    for _ in range(decode_steps):
        tokens.append(int(step([(req, [tokens[-1]])])[0].argmax()))
    decode = {"rows": sum(i.score_rows for i in idx), "pairs": sum(i.score_pairs for i in idx)}
    return {"prefill": prefill, "decode": decode, "tokens": tokens, "layers": len(idx)}
