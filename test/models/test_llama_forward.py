"""Llama-family forward parity with HF transformers on tiny random configs (float32).

Guards: weight-name mapping and fused shard loading, tied embeddings, qkv bias (Qwen2), q/k norm
and a head_dim != hidden/heads (Qwen3), llama3 rope scaling, and the attention backend's three
paths (fresh prefill, extend over a cached prefix, batched decode) through a whole model.
If this fails, run test/unit/test_layers.py first: it isolates the layers.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.tiny_models import randomize_parameters

TOL = 1e-4
PROMPT_LENS = (5, 17, 33)
DECODE_STEPS = 16
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,
    "rope_theta": 10000.0,
}

CONFIGS = {
    "llama": lambda: LlamaConfig(tie_word_embeddings=False, **_COMMON),
    "llama_tied": lambda: LlamaConfig(tie_word_embeddings=True, **_COMMON),
    "llama3_rope": lambda: LlamaConfig(tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE, **_COMMON),
    "qwen2_bias": lambda: Qwen2Config(tie_word_embeddings=False, **_COMMON),
    "qwen3_qknorm": lambda: Qwen3Config(tie_word_embeddings=False, head_dim=32, **_COMMON),
}


class Pair:
    def __init__(self, name: str):
        cfg = CONFIGS[name]()
        self.hf = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
        randomize_parameters(self.hf, seed=1, std=0.2)
        self.cfg = self.hf.config
        model_cls = ModelRegistry.resolve([type(self.hf).__name__])
        self.ours = model_cls(self.cfg, None, torch.float32).eval()
        self.loaded = self.ours.load_weights(self.hf.state_dict().items())
        gen = torch.Generator().manual_seed(7)
        self.prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]

    @torch.no_grad()
    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request) -> Pair:
    return Pair(request.param)


def test_every_parameter_loaded(pair: Pair):
    assert pair.loaded == {n for n, _ in pair.ours.named_parameters()}
    if pair.cfg.tie_word_embeddings:
        assert pair.ours.lm_head.weight is pair.ours.model.embed_tokens.weight


def test_batched_prefill_matches_hf(pair: Pair):
    h = ForwardHarness(pair.cfg)
    reqs = [h.new_request() for _ in pair.prompts]
    out = h.forward(pair.ours, list(zip(reqs, pair.prompts)), return_all_logits=True)
    assert out.full_logits.dtype == torch.float32 and out.full_logits.shape == (sum(PROMPT_LENS), 256)
    start = 0
    for i, prompt in enumerate(pair.prompts):
        ref = pair.hf_logits(prompt)
        assert ref.std() > 0.5  # logits are not flat, so the comparison means something
        ours = out.full_logits[start : start + len(prompt)]
        assert (ours - ref).abs().max() <= TOL
        assert (out.next_token_logits[i] - ref[-1]).abs().max() <= TOL
        start += len(prompt)


def test_chunked_prefill_matches_hf(pair: Pair):
    """Each prompt in 2-3 chunks; requests advance together, so chunks of different lengths and
    prefixes share batches (extend over a cached prefix)."""
    h = ForwardHarness(pair.cfg)
    reqs = [h.new_request() for _ in pair.prompts]
    cuts = {0: [2, 5], 1: [6, 11, 17], 2: [10, 21, 33]}
    done = [0, 0, 0]
    last = {}
    for step in range(3):
        items = []
        for i, prompt in enumerate(pair.prompts):
            if step < len(cuts[i]):
                items.append((i, prompt[done[i] : cuts[i][step]]))
        out = h.forward(pair.ours, [(reqs[i], toks) for i, toks in items])
        if step > 0:
            assert all(reqs[i].seq_len > len(toks) for i, toks in items)  # prefixes are cached
        for row, (i, toks) in enumerate(items):
            done[i] += len(toks)
            last[i] = out.next_token_logits[row]
    for i, prompt in enumerate(pair.prompts):
        assert (last[i] - pair.hf_logits(prompt)[-1]).abs().max() <= TOL


def test_decode_batch_matches_hf_greedy_generate(pair: Pair):
    h = ForwardHarness(pair.cfg)
    reqs = [h.new_request() for _ in pair.prompts]
    out = h.forward(pair.ours, list(zip(reqs, pair.prompts)))
    steps = [out.next_token_logits]
    for _ in range(DECODE_STEPS - 1):
        nxt = steps[-1].argmax(-1).tolist()
        batch = h.build_batch([(r, [t]) for r, t in zip(reqs, nxt)])
        assert batch.forward_mode == ForwardMode.DECODE
        steps.append(h.run(pair.ours, batch).next_token_logits)
    ours_logits = torch.stack(steps, 1)  # [3, steps, vocab]
    ours_tokens = ours_logits.argmax(-1)
    for i, prompt in enumerate(pair.prompts):
        with torch.no_grad():
            gen = pair.hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=DECODE_STEPS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        hf_tokens = gen.sequences[0, len(prompt) :]
        assert hf_tokens.tolist() == ours_tokens[i].tolist()
        hf_logits = torch.stack([x[0] for x in gen.logits]).float()
        assert (hf_logits - ours_logits[i]).abs().max() <= TOL
    assert len(set(map(tuple, ours_tokens.tolist()))) > 1  # different prompts, different continuations


def test_mixed_batch_decode_and_prefill(pair: Pair):
    """Two requests decode while a third prefills, in one MIXED batch."""
    h = ForwardHarness(pair.cfg)
    a, b, c = (h.new_request() for _ in range(3))
    p0, p1, p2 = pair.prompts
    first = h.forward(pair.ours, [(a, p0), (b, p1)]).next_token_logits.argmax(-1).tolist()
    batch = h.build_batch([(a, [first[0]]), (c, p2[:9]), (b, [first[1]])])
    assert batch.forward_mode == ForwardMode.MIXED
    out = h.run(pair.ours, batch)
    for row, ids in enumerate((p0 + [first[0]], p2[:9], p1 + [first[1]])):
        assert (out.next_token_logits[row] - pair.hf_logits(ids)[-1]).abs().max() <= TOL
    for r in (a, b, c):
        h.free_request(r)
    assert h.allocator.available_size() == 4096 and h.req_to_token_pool.available_size() == 16


def test_idle_batch_gives_empty_logits(pair: Pair):
    h = ForwardHarness(pair.cfg)
    empty = torch.empty(0, dtype=torch.int64)
    batch = ForwardBatch(
        forward_mode=ForwardMode.IDLE,
        batch_size=0,
        input_ids=empty,
        positions=empty,
        out_cache_loc=empty,
        req_pool_indices=empty,
        seq_lens=empty,
        extend_prefix_lens=empty,
        extend_seq_lens=empty,
        seq_lens_cpu=[],
        extend_prefix_lens_cpu=[],
        extend_seq_lens_cpu=[],
        req_to_token_pool=h.req_to_token_pool,
        token_to_kv_pool=h.token_to_kv_pool,
        attn_backend=h.attn_backend,
    )
    assert h.run(pair.ours, batch).next_token_logits.shape == (0, 256)


def test_bfloat16_smoke():
    """Serving dtype on CPU: finite logits and argmax mostly equal to float32."""
    pair = Pair("llama_tied")
    model_bf16 = type(pair.ours)(pair.cfg, None, torch.bfloat16).eval()
    model_bf16.load_weights(pair.hf.state_dict().items())
    assert model_bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    outs, nxt = {}, None
    for dtype, model in ((torch.float32, pair.ours), (torch.bfloat16, model_bf16)):
        h = ForwardHarness(pair.cfg, dtype=dtype)
        reqs = [h.new_request() for _ in pair.prompts]
        prefill = h.forward(model, list(zip(reqs, pair.prompts)), return_all_logits=True).full_logits
        if nxt is None:  # decode the same tokens in both dtypes
            nxt = prefill[[4, 21, 54]].argmax(-1).tolist()
        decode = h.forward(model, [(r, [t]) for r, t in zip(reqs, nxt)]).next_token_logits
        outs[dtype] = torch.cat([prefill, decode])
    bf = outs[torch.bfloat16]
    assert bf.dtype == torch.float32 and torch.isfinite(bf).all()
    agree = (bf.argmax(-1) == outs[torch.float32].argmax(-1)).float().mean()
    assert agree >= 0.8, f"bf16 argmax agrees with fp32 on only {agree:.0%} of positions"


def test_last_layer_finishes_only_logit_rows(pair: Pair):
    """Without all-token logits, the model's last layer runs o_proj / MLP only on each request's
    last new token (its K / V are still cached for every token); the logits are those of the full
    computation, and the next forward (decode over that cache) still matches HF."""
    if not hasattr(pair.ours.model, "_logit_rows"):
        pytest.skip("not a LlamaModel")
    rows_seen = []
    hook = pair.ours.model.layers[-1].mlp.register_forward_hook(
        lambda m, i, o: rows_seen.append(i[0].shape[0])
    )
    try:
        h = ForwardHarness(pair.cfg)
        reqs = [h.new_request() for _ in pair.prompts]
        out = h.forward(pair.ours, list(zip(reqs, pair.prompts)))
        full = ForwardHarness(pair.cfg)
        out_all = full.forward(
            pair.ours, [(full.new_request(), p) for p in pair.prompts], return_all_logits=True
        )
    finally:
        hook.remove()
    assert rows_seen == [len(pair.prompts), sum(PROMPT_LENS)]
    assert (out.next_token_logits - out_all.next_token_logits).abs().max() <= TOL
    nxt = out.next_token_logits.argmax(-1).tolist()
    step = h.run(pair.ours, h.build_batch([(r, [t]) for r, t in zip(reqs, nxt)])).next_token_logits
    for i, prompt in enumerate(pair.prompts):
        assert (step[i] - pair.hf_logits(prompt + [nxt[i]])[-1]).abs().max() <= TOL
