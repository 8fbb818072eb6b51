"""Segmented KV gather for long prefixes (`--cp-kv-gather-segment`) and the early exchange's overlap,
on 2 gloo ranks vs the single-rank model, float32, hand-built batches (CPForwardHarness).

Workload: a 50-token prompt prefilled in chunks of 12 beside a fresh 9-token one (every later chunk
over a cached prefix), greedy decoding; then two radix hits (40 and 8 tokens of the first prompts)
whose rests are prefilled in chunks of 12 side by side (batches with two PREFIX requests, so a
round of the flat prefix buffer spans both), greedy decoding. Models: tiny Llama (MHA, the
torch-native CP path: the prefix shard read from the pool in rounds) and tiny DeepSeek-V3.2 (MLA +
DSA, index_topk 8: every continuation sparse; the prefix rows all-gathered in rounds, the
indexer's top-k kept exact over the rounds), the latter on the default backend and on `dsa`.

Segment 7 is smaller than every prefix and divides none: greedy tokens identical to the
unsegmented run and to cp 1, logits within 1e-4. From the probe's counters: no round gathered
more than 7 prefix rows (the unsegmented run's largest round is a whole prefix, more than 7).
Overlap: every layer's exchange was started by the early hook (none lazily, each with an async
handle) and, per layer and forward, before the q projection (MLA: q_b_proj; Llama: the attention
op, after which q is rotated) ran, and waited on after it.
Split decodes (the runtime's default) ride along: the 9-token prompt decodes, dealt to one rank,
in the same batches as the 50-token prompt's later chunks over more than 7 cached rows, so the
segmented prefix path and the split-decode path run in one forward.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.cp_probe import CPProbe
from sglang.srt.layers.context_parallel import PREFIX, REPLICATED, CPLayout, get_cp_layout
from sglang.test.cp_forward_helpers import pp_stepper
from sglang.test.cp_moe_driver import load_model, make_harness
from sglang.test.greedy_loop import chunked_greedy
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint
from sglang.test.tiny_moe_models import deepseek_v32_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
SEGMENT = 7
CHUNK = 12
NEW_TOKENS = 6
RUNS = [("llama", None), ("v32", None), ("v32", "dsa")]  # (model, attention backend)


def _hooks(model, probe: CPProbe) -> None:
    """Mark the q projection (MLA) or the attention op (MHA) of every layer in the probe's trace."""
    for mod in model.modules():
        attn = getattr(mod, "attn", None)
        if attn is None or not hasattr(attn, "layer_id"):
            continue
        layer = attn.layer_id
        q_proj = getattr(mod, "q_b_proj", None) or getattr(mod, "q_proj", None)
        target = q_proj if q_proj is not None and hasattr(mod, "kv_a_proj_with_mqa") else attn
        target.register_forward_pre_hook(lambda *_, layer=layer: probe.mark("q_proj", layer))


def _split_decode_beside_long_prefix(layout: CPLayout) -> bool:
    """A decode held by one rank in a batch whose PREFIX requests cache more than a segment."""
    kinds = list(zip(layout.kinds, layout.starts, layout.prefix_lens))
    split = any(k == REPLICATED and int(layout.holder_rank[s]) >= 0 for k, s, _ in kinds)
    prefix = sum(p for k, _, p in kinds if k == PREFIX)
    return split and prefix > SEGMENT


def generate(path: str, groups: ParallelGroups, segment: int, backend) -> dict:
    hf_config, model = load_model(path, groups)
    h = make_harness(hf_config, model, groups, "zigzag", attention_backend=backend)
    probe = CPProbe()
    _hooks(model, probe)
    build = h.build_batch
    mixed = []

    def build_with_probe(*args, **kwargs):
        fb = build(*args, **kwargs)
        layout = get_cp_layout(fb)
        if layout is not None:
            layout.kv_gather_segment, layout.probe = segment, probe
            mixed.append(_split_decode_beside_long_prefix(layout))
        return fb

    h.build_batch = build_with_probe
    step = pp_stepper(h, model, groups, [])
    gen = torch.Generator().manual_seed(5)
    vocab = hf_config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (50, 9)]
    reqs = [h.new_request() for _ in prompts]
    tokens, logits = chunked_greedy(step, reqs, prompts, NEW_TOKENS, CHUNK)
    hits = [
        h.new_request(share_prefix_of=reqs[0], prefix_len=40),
        h.new_request(share_prefix_of=reqs[1], prefix_len=8),
    ]
    rests = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (30, 25)]
    more, more_logits = chunked_greedy(step, hits, rests, NEW_TOKENS, CHUNK)
    return {
        "tokens": tokens + more,
        "logits": logits + more_logits,
        "rounds": list(probe.rounds),
        "events": [(n, layer) for n, layer, _ in probe.events],
        "lazy": probe.lazy_starts,
        "async": probe.async_starts,
        "mixed": sum(mixed),
    }


def _body(rank: int, world_size: int, paths: dict, segments: list[int]) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return {(m, b, s): generate(paths[m], groups, s, b) for m, b in RUNS for s in segments}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("cp_seg")
    v32 = str(root / "v32")
    save_random_model(deepseek_v32_config(index_topk=8), v32, seed=11)
    return {"llama": str(write_random_checkpoint(TINY_LLAMA_DIR, root / "llama", seed=7)), "v32": v32}


@pytest.fixture(scope="module")
def results(paths) -> tuple[dict, list[dict]]:
    single = ParallelGroups.single()
    ref = {(m, b): generate(paths[m], single, 0, b) for m, b in RUNS}
    return ref, run_ranks(_body, 2, args=(paths, [SEGMENT, 0]), timeout=500)


def test_segmented_matches_unsegmented_and_cp1(results):
    ref, ranks = results
    for model, backend in RUNS:
        want = ref[(model, backend)]
        assert (
            all(len(t) == NEW_TOKENS for t in want["tokens"]) and len({tuple(t) for t in want["tokens"]}) > 2
        )
        for rank, res in enumerate(ranks):
            for segment in (SEGMENT, 0):
                got = res[(model, backend, segment)]
                tag = (model, backend, segment, rank)
                assert got["tokens"] == want["tokens"], tag
                for a, b in zip(got["logits"], want["logits"]):
                    torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=lambda m: f"{tag}: {m}")


def test_prefix_rounds_bounded_by_segment(results):
    _, ranks = results
    for model, backend in RUNS:
        for res in ranks:
            seg = res[(model, backend, SEGMENT)]["rounds"]
            whole = res[(model, backend, 0)]["rounds"]
            assert seg and whole, (model, backend)
            assert max(r for r, _ in seg) <= SEGMENT, (model, backend, seg)
            assert max(r for r, _ in whole) > SEGMENT, (model, backend, whole)
            assert len(seg) > len(whole)
            if model == "v32":  # gathered rows: the received buffer too stays within one segment + padding
                assert max(b for _, b in seg) <= SEGMENT + 1, seg


def _overlaps(events: list[tuple[str, int]]) -> tuple[int, int]:
    """(exchanges waited on only after the layer's q projection ran since their start, all exchanges)."""
    good = total = 0
    state: dict[int, str] = {}
    for name, layer in events:
        if name == "gather_start":
            total += 1
            state[layer] = "started"
        elif name == "q_proj" and state.get(layer) == "started":
            state[layer] = "q_proj"
        elif name == "gather_wait":
            good += state.pop(layer, None) == "q_proj"
    return good, total


def test_exchange_in_flight_during_q_projection(results):
    _, ranks = results
    for key, res in ((k, r) for rank in ranks for k, r in rank.items()):
        good, total = _overlaps(res["events"])
        assert total > 0 and good == total, (key, good, total)
        assert res["lazy"] == 0 and res["async"] == total, key


def test_split_decodes_ride_with_segmented_prefix(results):
    """The segmented runs had batches mixing a split decode with extends over a long prefix (their
    tokens and logits are checked in test_segmented_matches_unsegmented_and_cp1)."""
    _, ranks = results
    for model, backend in RUNS:
        for rank, res in enumerate(ranks):
            got = res[(model, backend, SEGMENT)]
            assert got["mixed"] >= 2, (model, backend, rank, got["mixed"])
            assert len(got["rounds"]) > len(res[(model, backend, 0)]["rounds"])
