"""Incremental detokenization: multi-byte characters, special tokens, stop-string trimming and hold-back.

Uses small tokenizers built in-process with `tokenizers` (byte-level BPE with almost no merges, so
CJK characters and emoji are split over several byte tokens; and a SentencePiece-style Metaspace
BPE whose decoder drops the leading space of the first token).
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sglang.srt.managers.io_struct import BatchTokenIDOut
from sglang.srt.managers.tokenizer.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.tokenizer.incremental_detok import (
    IncrementalDecoder,
    RequestDetokState,
    find_anchor_ids,
    stop_holdback,
)

CORPUS = ["hello world, the quick brown fox jumps over the lazy dog. stop here please"] * 20
MULTIBYTE = "héllo 世界 🙂 ok"


@pytest.fixture(scope="module")
def byte_tok():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def sp_tok():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(CORPUS + ["Paris is the capital"] * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _stream(state, ids, finished=None, chunk=1):
    """Feed ids `chunk` at a time; the last message carries `finished`. Returns the pieces."""
    pieces = []
    for start in range(0, len(ids), chunk):
        last = start + chunk >= len(ids)
        pieces.append(state.step(ids[start : start + chunk], finished if last else None))
    return pieces


def test_multibyte_characters_are_split_over_tokens(byte_tok):
    ids = _ids(byte_tok, MULTIBYTE)
    # The test is only meaningful if some character needs more than one token.
    assert len(ids) > len(MULTIBYTE.replace(" ", "")) // 2
    assert any("\ufffd" in byte_tok.decode(ids[:k]) for k in range(1, len(ids)))


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_incremental_text_never_has_partial_characters(byte_tok, chunk):
    ids = _ids(byte_tok, MULTIBYTE)
    state = RequestDetokState(byte_tok, anchor_ids=find_anchor_ids(byte_tok))
    pieces = _stream(state, ids, {"type": "length", "length": len(ids)}, chunk)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == MULTIBYTE


def test_partial_character_is_held_until_completed(byte_tok):
    ids = _ids(byte_tok, "世")
    assert len(ids) >= 2
    dec = IncrementalDecoder(byte_tok)
    assert [dec.append([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.append(ids[-1:]) == "世"


def test_flush_emits_incomplete_tail_at_finish(byte_tok):
    ids = _ids(byte_tok, "a世")[:-1]  # cut inside the character
    state = RequestDetokState(byte_tok)
    text = "".join(_stream(state, ids, {"type": "length", "length": len(ids)}))
    assert text.startswith("a") and text.endswith("\ufffd")


def test_skip_special_tokens(byte_tok):
    eos = byte_tok.eos_token_id
    ids = _ids(byte_tok, "hello") + [eos] + _ids(byte_tok, " world")
    done = {"type": "length", "length": len(ids)}
    skipped = "".join(_stream(RequestDetokState(byte_tok, skip_special_tokens=True), ids, done))
    kept = "".join(_stream(RequestDetokState(byte_tok, skip_special_tokens=False), ids, done))
    assert skipped == "hello world"
    assert kept == "hello</s> world"


def test_stop_string_trimmed_at_first_occurrence(byte_tok):
    ids = _ids(byte_tok, "hello world, the world")
    state = RequestDetokState(byte_tok, stop_strs=["world"])
    pieces = _stream(state, ids, {"type": "stop", "matched": "world"})
    assert "".join(pieces) == "hello "
    assert all("w" not in p for p in pieces)


def test_stop_string_hold_back_then_release(byte_tok):
    ids = _ids(byte_tok, "hello wor")
    state = RequestDetokState(byte_tok, stop_strs=["world"])
    running = _stream(state, ids)
    assert "".join(running) == "hello "  # "wor" could start "world": held back
    rest = _ids(byte_tok, "k fox")
    more = _stream(state, rest)
    assert "".join(running + more) == "hello work fox"


def test_held_back_text_released_when_finished_by_length(byte_tok):
    ids = _ids(byte_tok, "hello wor")
    state = RequestDetokState(byte_tok, stop_strs=["world"])
    text = "".join(_stream(state, ids, {"type": "length", "length": len(ids)}))
    assert text == "hello wor"


def test_no_stop_trim_keeps_stop_string(byte_tok):
    ids = _ids(byte_tok, "hello world")
    state = RequestDetokState(byte_tok, stop_strs=["world"], no_stop_trim=True)
    pieces = _stream(state, ids, {"type": "stop", "matched": "world"})
    assert "".join(pieces) == "hello world"
    assert all("world" not in p for p in pieces[:-1])  # still never streamed early


def test_matched_stop_token_id_is_trimmed(byte_tok):
    ids = _ids(byte_tok, "hello.")
    dot = ids[-1]
    state = RequestDetokState(byte_tok)
    assert "".join(_stream(state, ids, {"type": "stop", "matched": dot})) == "hello"
    state = RequestDetokState(byte_tok, no_stop_trim=True)
    assert "".join(_stream(state, ids, {"type": "stop", "matched": dot})) == "hello."


def test_stop_holdback_lengths():
    assert stop_holdback("abc wo", ["world"]) == 2
    assert stop_holdback("abc w", ["xyz", "wx"]) == 1
    assert stop_holdback("abc", ["world"]) == 0
    assert stop_holdback("aab", ["aabx", "b"]) == 3


def test_sentencepiece_leading_space_kept_with_anchor(sp_tok):
    ids = _ids(sp_tok, " Paris is")  # "▁Paris", "▁is"...
    plain = sp_tok.decode(ids)
    assert not plain.startswith(" ")  # the decoder strips the first leading space
    state = RequestDetokState(sp_tok, anchor_ids=find_anchor_ids(sp_tok))
    pieces = _stream(state, ids, {"type": "length", "length": len(ids)})
    assert "".join(pieces) == " " + plain
    assert pieces[0].startswith(" ")


def _batch(rids, new_ids, finished, stop_strs=None):
    n = len(rids)
    return BatchTokenIDOut(
        rids=rids,
        new_output_ids=new_ids,
        finished_reasons=finished,
        prompt_tokens=[3] * n,
        completion_tokens=[len(x) for x in new_ids],
        cached_tokens=[0] * n,
        skip_special_tokens=[True] * n,
        spaces_between_special_tokens=[True] * n,
        no_stop_trim=[False] * n,
        stop_strs=stop_strs or [[] for _ in range(n)],
        output_token_logprobs=[None] * n,
        output_top_logprobs=[None] * n,
    )


def test_manager_keeps_per_rid_state_and_frees_finished(byte_tok):
    mgr = DetokenizerManager(byte_tok)
    a, b = _ids(byte_tok, "hello"), _ids(byte_tok, "世界")
    out = mgr.handle_batch(_batch(["a", "b"], [a[:2], b[:1]], [None, None]))
    assert out.rids == ["a", "b"] and out.output_strs[1] == ""
    assert set(mgr.states) == {"a", "b"}
    out2 = mgr.handle_batch(_batch(["a", "b"], [a[2:], b[1:]], [{"type": "length", "length": 5}, None]))
    assert out.output_strs[0] + out2.output_strs[0] == "hello"
    assert set(mgr.states) == {"b"}
    out3 = mgr.handle_batch(_batch(["b"], [[]], [{"type": "abort", "message": "x"}]))
    assert out2.output_strs[1] + out3.output_strs[0] == "世界"
    assert mgr.states == {}
    assert out3.finished_reasons[0]["type"] == "abort"


def test_manager_without_tokenizer_passes_ids():
    mgr = DetokenizerManager(None)
    out = mgr.handle_batch(_batch(["a"], [[5, 6]], [None]))
    assert out.output_strs == [""] and out.new_output_ids == [[5, 6]]
