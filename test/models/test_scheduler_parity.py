"""The whole scheduler path (continuous batching, chunked prefill, radix cache, paged KV,
retraction) against HF transformers on tiny random Llama and Qwen3 checkpoints, float32.

Tolerances: logits max abs diff <= 1e-4; greedy tokens identical (32 per request).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from sglang.test.scheduler_harness import SchedulerHarness, hf_greedy
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint

NEW_TOKENS = 32
LOGIT_TOL = 1e-4


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request, tmp_path_factory):
    src = TINY_LLAMA_DIR if request.param == "llama" else TINY_QWEN3_DIR
    out = write_random_checkpoint(src, tmp_path_factory.mktemp(request.param), seed=7)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return str(out), hf


@pytest.fixture(scope="module")
def reference(checkpoint):
    """HF greedy ids and logits for the prompts every test uses."""
    path, hf = checkpoint
    prompts = _prompts(hf.config.vocab_size, [5, 23, 41], seed=1)
    extended = prompts[1] + _prompts(hf.config.vocab_size, [9], seed=2)[0]  # shares a 23-token prefix
    refs = {}
    for i, p in enumerate(prompts + [extended]):
        refs[i] = (p, *hf_greedy(hf, p, NEW_TOKENS))
    return path, refs


def _check(h: SchedulerHarness, rid: str, ref_ids, ref_logits, check_logits: bool = True) -> None:
    assert h.outputs[rid] == ref_ids, f"{rid}: greedy tokens differ"
    assert h.finish[rid]["type"] == "length"
    if check_logits:
        got = h.logits[rid]
        assert len(got) == len(ref_logits)
        diff = max(float((a - b).abs().max()) for a, b in zip(got, ref_logits))
        assert diff <= LOGIT_TOL, f"{rid}: logits max abs diff {diff}"


@pytest.mark.parametrize(
    "variant",
    [
        dict(chunked_prefill_size=-1),  # whole prompts
        dict(chunked_prefill_size=16),  # the 41-token prompt runs in 3 chunks beside decodes
        dict(chunked_prefill_size=16, page_size=4),
        dict(chunked_prefill_size=8, disable_radix_cache=True, schedule_policy="lpm"),
    ],
    ids=["whole", "chunked", "chunked-page4", "chunked8-noradix-lpm"],
)
def test_batch_parity(reference, variant):
    path, refs = reference
    h = SchedulerHarness(model_path=path, max_total_tokens=2048, **variant)
    rids = [h.submit(refs[i][0], NEW_TOKENS) for i in range(3)]
    h.run()
    for i, rid in enumerate(rids):
        _check(h, rid, refs[i][1], refs[i][2])
    if variant.get("chunked_prefill_size", -1) > 0:
        chunk = variant["chunked_prefill_size"]
        assert max(tokens for _, tokens in h.batch_shapes) <= chunk + 3  # chunk + running decodes
        assert any(n > 1 and tokens > n for n, tokens in h.batch_shapes), "no mixed prefill+decode step"

    # Second wave: radix-cache hits (same prompt again; a prompt extending an earlier one).
    again = h.submit(refs[1][0], NEW_TOKENS)
    ext = h.submit(refs[3][0], NEW_TOKENS)
    h.run()
    _check(h, again, refs[1][1], refs[1][2])
    _check(h, ext, refs[3][1], refs[3][2])
    if variant.get("disable_radix_cache"):
        assert h.cached[again] == 0 and h.cached[ext] == 0
    else:
        page = variant.get("page_size", 1)
        assert h.cached[again] == (len(refs[1][0]) - 1) // page * page
        assert h.cached[ext] >= len(refs[1][0]) // page * page
    state = h.scheduler.internal_state()
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def test_retraction_under_kv_pressure(reference):
    """A pool too small for all requests at once: requests get retracted and requeued, and still
    produce exactly the reference tokens."""
    path, refs = reference
    h = SchedulerHarness(
        model_path=path, max_total_tokens=128, chunked_prefill_size=16, disable_radix_cache=True
    )
    rids = [h.submit(refs[i][0], NEW_TOKENS) for i in range(3)]
    h.run()
    for i, rid in enumerate(rids):
        _check(h, rid, refs[i][1], refs[i][2], check_logits=False)
    assert h.scheduler.num_retractions > 0, "the pool was meant to force a retraction"
    assert h.scheduler.runner.allocator.available_size() == 128


def test_abort_frees_kv(reference):
    path, refs = reference
    h = SchedulerHarness(model_path=path, max_total_tokens=1024, chunked_prefill_size=16)
    keep = h.submit(refs[0][0], NEW_TOKENS)
    victim = h.submit(refs[2][0], NEW_TOKENS)
    h.step()  # victim is mid-prefill (41 tokens, chunk 16)
    h.abort(victim)
    queued = h.submit(refs[1][0], NEW_TOKENS)
    h.abort(queued)  # still waiting
    h.run()
    assert h.finish[victim]["type"] == "abort" and h.finish[queued]["type"] == "abort"
    _check(h, keep, refs[0][1], refs[0][2])
    state = h.scheduler.internal_state()
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0


@pytest.mark.parametrize("short_first", [0, 8])
def test_short_prompt_first(reference, short_first):
    """--short-prompt-first-tokens: a short prompt that arrives while a long one is being chunked
    is prefilled in the very next step, beside a smaller chunk of the long one (the step's budget
    unchanged); off, it waits for the long prompt's chunks. Tokens match the reference either way."""
    path, refs = reference
    h = SchedulerHarness(
        model_path=path, max_total_tokens=2048, chunked_prefill_size=16, short_prompt_first_tokens=short_first
    )
    long = h.submit(refs[2][0], NEW_TOKENS)  # 41 tokens: chunks of at most 16
    h.step()
    assert h.batch_shapes[-1] == (1, 16)
    short = h.submit(refs[0][0], NEW_TOKENS)  # 5 tokens
    h.step()
    if short_first:
        assert h.batch_shapes[-1] == (2, 16), "short prompt + an 11-token chunk of the long one"
        assert len(h.outputs[short]) == 1, "the short prompt's first token came out of step 2"
    else:
        assert h.batch_shapes[-1] == (1, 16) and not h.outputs[short]
    h.run()
    _check(h, long, refs[2][1], refs[2][2])
    _check(h, short, refs[0][1], refs[0][2])
    state = h.scheduler.internal_state()
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def test_short_prompt_first_default_and_validation():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path=TINY_LLAMA_DIR).resolved_short_prompt_first_tokens == 0
    pd = ServerArgs(model_path=TINY_LLAMA_DIR, disaggregation_mode="prefill", chunked_prefill_size=1024)
    assert pd.resolved_short_prompt_first_tokens == 256
    assert (
        ServerArgs(
            model_path=TINY_LLAMA_DIR, disaggregation_mode="prefill", short_prompt_first_tokens=0
        ).resolved_short_prompt_first_tokens
        == 0
    )
    with pytest.raises(ValueError, match="short-prompt-first-tokens"):
        ServerArgs(model_path=TINY_LLAMA_DIR, short_prompt_first_tokens=-1).validate()


@pytest.mark.parametrize("pack", [0, 32])
def test_prefill_pack_tokens(reference, pack):
    """--prefill-pack-tokens: prompts that arrive together share a step only while the step's prompt
    tokens stay within it, so the first ones get their first tokens a step earlier; off, they fill the
    chunk. Tokens match the reference either way, and the KV pool ends free."""
    path, refs = reference
    h = SchedulerHarness(
        model_path=path, max_total_tokens=2048, chunked_prefill_size=64, prefill_pack_tokens=pack
    )
    rids = [h.submit(refs[i][0], NEW_TOKENS) for i in range(3)]  # 5, 23 and 41 tokens
    h.step()
    if pack:
        assert h.batch_shapes[-1] == (2, 28), "5 + 23 tokens; the 41-token prompt would pass 32"
        assert [len(h.outputs[r]) for r in rids] == [1, 1, 0]
        h.step()
        assert h.batch_shapes[-1] == (3, 43), "two decodes + the 41-token prompt, whole"
    else:
        assert h.batch_shapes[-1] == (3, 64), "5 + 23 + a 36-token chunk of the third"
        assert [len(h.outputs[r]) for r in rids] == [1, 1, 0]
    h.run()
    for i, rid in enumerate(rids):
        _check(h, rid, refs[i][1], refs[i][2])
    state = h.scheduler.internal_state()
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def test_prefill_pack_tokens_default_and_validation():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path=TINY_LLAMA_DIR).resolved_prefill_pack_tokens == 1024  # CPU: half of 2048
    assert ServerArgs(model_path=TINY_LLAMA_DIR, chunked_prefill_size=512).resolved_prefill_pack_tokens == 256
    assert ServerArgs(model_path=TINY_LLAMA_DIR, chunked_prefill_size=-1).resolved_prefill_pack_tokens == 0
    assert ServerArgs(model_path=TINY_LLAMA_DIR, prefill_pack_tokens=0).resolved_prefill_pack_tokens == 0
    assert ServerArgs(model_path=TINY_LLAMA_DIR, device="cuda").resolved_prefill_pack_tokens == 0
    with pytest.raises(ValueError, match="prefill-pack-tokens"):
        ServerArgs(model_path=TINY_LLAMA_DIR, prefill_pack_tokens=-1).validate()
