"""Sampler and SamplingBatchInfo: greedy, filters, temperature, seeds, penalties, logprobs."""

import math

import pytest
import torch

from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo, mix_seed
from sglang.srt.sampling.sampling_params import SamplingParams


def make_info(params, vocab, output_ids=None, prompt_ids=None, **kw):
    params = [p.normalize() for p in params]
    bs = len(params)
    return SamplingBatchInfo.from_params(
        params, output_ids or [[] for _ in range(bs)], prompt_ids or [[] for _ in range(bs)], vocab, **kw
    )


def sample_many(logits_row, params, n, seed=0):
    """Sample n independent draws of one distribution in a single batch."""
    logits = torch.tensor(logits_row, dtype=torch.float32).repeat(n, 1)
    info = make_info([SamplingParams(**params) for _ in range(n)], logits.shape[1])
    return Sampler(seed=seed)(logits, info).next_token_ids


def test_greedy_is_argmax_with_bf16_and_ties():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    logits[2, 7] = logits[2, 3] = 100.0  # tie: lowest id wins
    info = make_info([SamplingParams(temperature=0.0) for _ in range(6)], 50)
    assert info.all_greedy and not info.needs_logit_processing
    out = Sampler()(logits.to(torch.bfloat16), info)
    assert out.next_token_ids.dtype == torch.int64
    assert torch.equal(out.next_token_ids, logits.to(torch.bfloat16).float().argmax(-1))
    assert out.next_token_ids[2].item() == 3
    assert out.next_token_logprobs is None and out.top_logprobs is None


def test_top_k_one_equals_greedy_in_mixed_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 30)
    params = [
        SamplingParams(top_k=1, temperature=0.8),
        SamplingParams(),
        SamplingParams(top_k=1),
        SamplingParams(top_p=0.5),
    ]
    info = make_info(params, 30)
    assert info.greedy_rows == [True, False, True, False] and not info.all_greedy
    ids = Sampler(seed=3)(logits, info).next_token_ids
    assert ids[0].item() == logits[0].argmax().item()
    assert ids[2].item() == logits[2].argmax().item()


def test_tiny_top_p_gives_argmax():
    torch.manual_seed(2)
    logits = torch.randn(64, 40)
    info = make_info([SamplingParams(top_p=1e-6, temperature=1.5) for _ in range(64)], 40)
    assert info.need_top_p and not info.need_top_k
    assert torch.equal(Sampler(seed=0)(logits, info).next_token_ids, logits.argmax(-1))


def test_top_k_restricts_support():
    ids = sample_many([3.0, 2.9, 2.8, 2.7, 0.0], {"top_k": 2}, 2000)
    assert set(ids.tolist()) == {0, 1}


def test_top_k_and_top_p_combined_renormalised():
    # probs after top_k=3: [0.5, 0.3, 0.2] of the kept mass; top_p=0.6 keeps 0 and 1.
    probs = torch.tensor([0.25, 0.15, 0.10, 0.30, 0.20])
    logits = probs.log().tolist()
    order = [3, 0, 4, 1, 2]  # descending
    ids = sample_many(logits, {"top_k": 3, "top_p": 0.6}, 3000)
    assert set(ids.tolist()) == {order[0], order[1]}
    # Same filter through the full sort path (one row without top_k forces it).
    n = 3000
    params = [SamplingParams(top_k=3, top_p=0.6) for _ in range(n)] + [SamplingParams()]
    info = make_info(params, 5)
    assert not info.all_top_k_limited
    out = Sampler(seed=1)(torch.tensor(logits).repeat(n + 1, 1), info).next_token_ids[:n]
    assert set(out.tolist()) == {order[0], order[1]}


def test_min_p_filters():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    ids = sample_many(probs.log().tolist(), {"min_p": 0.4}, 2000)  # threshold 0.2
    assert set(ids.tolist()) == {0, 1}
    ids = sample_many(probs.log().tolist(), {"min_p": 0.4, "top_k": 3}, 2000)  # sorted path
    assert set(ids.tolist()) == {0, 1}


def test_temperature_changes_distribution():
    n = 4000
    cold = sample_many([0.0, 1.0], {"temperature": 0.5}, n, seed=5).float().mean().item()
    hot = sample_many([0.0, 1.0], {"temperature": 2.0}, n, seed=6).float().mean().item()
    assert abs(cold - 1 / (1 + math.exp(-2.0))) < 0.03  # 0.881
    assert abs(hot - 1 / (1 + math.exp(-0.5))) < 0.03  # 0.622


def _seeded_sequence(seed, steps, batch_extra, sampler_seed):
    """Generate `steps` tokens for one seeded request, batched with random unseeded neighbours."""
    vocab = 1000
    out: list[int] = []
    sampler = Sampler(seed=sampler_seed)
    for _ in range(steps):
        params = [SamplingParams(seed=seed)] + [SamplingParams() for _ in range(batch_extra)]
        outputs = [list(out)] + [[] for _ in range(batch_extra)]
        info = make_info(params, vocab, output_ids=outputs)
        logits = torch.zeros(1 + batch_extra, vocab)  # uniform: every draw is pure randomness
        out.append(sampler(logits, info).next_token_ids[0].item())
    return out


def test_same_seed_same_tokens_different_seed_differs():
    a = _seeded_sequence(42, 12, batch_extra=0, sampler_seed=1)
    b = _seeded_sequence(42, 12, batch_extra=3, sampler_seed=99)  # other batch, other shared rng
    c = _seeded_sequence(43, 12, batch_extra=0, sampler_seed=1)
    assert a == b
    assert a != c
    assert len(set(a)) > 1  # the step index changes the draw


def test_step_seeds_override_and_mix_seed():
    assert mix_seed(1, 0) != mix_seed(1, 1) != mix_seed(2, 0)
    assert 0 <= mix_seed(-5, 3) < 2**63
    logits = torch.zeros(2, 500)
    p = [SamplingParams(), SamplingParams()]
    r1 = Sampler()(logits, make_info(p, 500, step_seeds=[11, 12])).next_token_ids
    r2 = Sampler()(logits, make_info(p, 500, step_seeds=[11, 12])).next_token_ids
    assert torch.equal(r1, r2)


def test_penalties_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, -2.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0),
        SamplingParams(),
    ]
    # Row 0: prompt has token 4; output has token 0 twice and token 1 once.
    info = make_info(params, 5, output_ids=[[0, 0, 1], [2]], prompt_ids=[[4], [3]])
    x = logits.clone()
    info.apply_penalties(x)
    # repetition on {0,1,4}: 2/2=1, -1*2=-2, -2*2=-4; then freq/presence on outputs {0:2, 1:1}.
    expected0 = [1.0 - 0.5 * 2 - 0.25, -2.0 - 0.5 * 1 - 0.25, 0.5, 1.0, -4.0]
    assert torch.allclose(x[0], torch.tensor(expected0))
    assert torch.equal(x[1], logits[1])  # row without penalties untouched


def test_penalty_changes_greedy_choice_and_keeps_input():
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    info = make_info([SamplingParams(temperature=0, presence_penalty=1.0)], 3, output_ids=[[0]])
    assert info.all_greedy and info.needs_logit_processing
    out = Sampler()(logits, info, return_logprob=True)
    assert out.next_token_ids.tolist() == [1]
    assert logits[0, 0].item() == 3.0  # caller's logits not modified
    # Logprob is of the RAW logits.
    assert torch.allclose(out.next_token_logprobs, torch.log_softmax(logits, -1)[:, 1])


def test_no_penalty_state_built_when_inactive():
    info = make_info([SamplingParams(), SamplingParams(top_k=5)], 10, output_ids=[[1, 2], [3]])
    assert not info.needs_logit_processing
    x = torch.randn(2, 10)
    y = x.clone()
    info.process_logits(y)
    assert torch.equal(x, y) and info._output_counts is None and info._seen_index is None


def test_min_new_tokens_and_logit_bias():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0]] * 3)
    params = [
        SamplingParams(temperature=0, min_new_tokens=2, stop_token_ids=[2]),
        SamplingParams(temperature=0, min_new_tokens=1),
        SamplingParams(temperature=0, logit_bias={"3": 10.0}),
    ]
    info = make_info(params, 4, output_ids=[[0], [0], []], eos_token_ids=[1])
    x = logits.clone()
    info.process_logits(x)
    assert x[0, 1] == float("-inf") and x[0, 2] == float("-inf")  # still below min_new_tokens
    assert torch.equal(x[1], logits[1])  # already has 1 token
    assert x[2, 3].item() == 10.0
    assert Sampler()(logits, info).next_token_ids.tolist() == [0, 1, 3]


def test_logprobs_and_top_logprobs():
    torch.manual_seed(3)
    logits = torch.randn(3, 20).to(torch.bfloat16)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0),
        SamplingParams(top_k=4, repetition_penalty=1.5),
    ]
    info = make_info(params, 20, output_ids=[[1], [], [2, 3]])
    out = Sampler(seed=0)(logits, info, return_logprob=True, top_logprobs_nums=[3, 0, 5])
    ref = torch.log_softmax(logits.float(), -1)
    assert out.next_token_logprobs.dtype == torch.float32
    assert torch.allclose(out.next_token_logprobs, ref.gather(1, out.next_token_ids.view(-1, 1)).view(-1))
    assert [len(t) for t in out.top_logprobs] == [3, 0, 5]
    for row, tops in enumerate(out.top_logprobs):
        lps = [lp for lp, _ in tops]
        assert lps == sorted(lps, reverse=True)
        for lp, tid in tops:
            assert lp == pytest.approx(ref[row, tid].item(), abs=1e-6)
    assert out.top_logprobs[2][0][1] == ref[2].argmax().item()


def test_empty_batch():
    info = make_info([], 10)
    out = Sampler()(torch.zeros(0, 10), info, return_logprob=True, top_logprobs_nums=[])
    assert out.next_token_ids.shape == (0,) and out.next_token_logprobs.shape == (0,)
    assert out.top_logprobs == []


def test_draw_frequencies_and_zero_weights():
    n = 8000
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.0, 0.4])
    logits = probs.log().tolist()  # log(0) = -inf: zero weight
    ids = sample_many(logits, {}, n, seed=7)
    freq = torch.bincount(ids, minlength=6).float() / n
    assert freq[1] == 0 and freq[4] == 0
    assert torch.allclose(freq, probs, atol=0.02)


def _kept_tokens(probs, top_p, top_k=-1, candidates=None, monkeypatch=None):
    from sglang.srt.layers import sampler as sampler_mod

    if candidates is not None:
        monkeypatch.setattr(sampler_mod, "TOP_P_CANDIDATES", candidates)
    bs, vocab = probs.shape
    info = make_info([SamplingParams(top_p=top_p, top_k=top_k) for _ in range(bs)], vocab)
    vals, idx = sampler_mod._filter_sorted(probs, info.top_ks, info.top_ps, info.min_ps, info)
    return [sorted(idx[r][vals[r] > 0].tolist()) for r in range(bs)], vals.shape[1]


def test_top_p_candidate_shortcut_is_exact(monkeypatch):
    torch.manual_seed(4)
    vocab = 3000
    peaked = torch.randn(3, vocab)
    peaked[:, :40] += 8.0  # nucleus well inside the first 1024 candidates
    probs = torch.softmax(peaked, -1)
    fast, width = _kept_tokens(probs, 0.9)
    assert width == 1024  # the shortcut was taken
    full, width_full = _kept_tokens(probs, 0.9, candidates=10**9, monkeypatch=monkeypatch)
    assert width_full == vocab and fast == full
    assert all(0 < len(k) < 1024 for k in fast)
    # A flat distribution's nucleus does not fit: falls back to the full sort.
    monkeypatch.undo()
    flat = torch.softmax(torch.randn(2, vocab) * 0.1, -1)
    kept, width = _kept_tokens(flat, 0.9)
    assert width == vocab and all(len(k) > 1024 for k in kept)
